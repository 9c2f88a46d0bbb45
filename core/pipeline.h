// pipeline.h: the 1F1B executor. Walks this stage's action list (schedule.h) for one training step:
// forwards and backwards through the stage's blocks (gpt.h), activations sent to the next stage and
// gradients to the previous one over the grid's pp group (grid.h). Without a pipeline (one stage) the
// list is F0 B0 F1 B1 ..., so the same code runs gradient accumulation on a single rank.
//
// Sends are buffered (comm.h), which is what makes the list's order deadlock-free (schedule.h explains
// why). Micro-batch i uses activation set i % K, K = min(P - s, m): the micro-batches in flight on stage s
// are consecutive and never more than K, so their sets never collide.
#pragma once
#include "dataloader.h"
#include "gpt.h"
#include "grid.h"
#include "phase_timer.h"
#include "schedule.h"

// The pipeline's shape, decided once at set-up from the flags and used by everything that depends on it:
// the stage layouts, the activation sets gpt_create allocates, the schedule's check, --estimate and the
// start-up line. One stage (no -pp) is the same plan with P = 1.
typedef struct {
    int stages;                  // P
    int tp;                      // -tp: ranks sharing each stage's blocks (grid.h); the replicas are ranks / (P * tp)
    int micro;                   // m = -ga micro-batches per step
    int first[MAX_LAYERS];       // stage s runs blocks first[s] .. first[s] + count[s] - 1
    int count[MAX_LAYERS];       //   (pipeline_split: balanced with the LM head's cost)
    int sets[MAX_LAYERS];        // activation sets stage s needs: min(P - s, m), 1F1B's micro-batches in flight
    double bubble;               // (P - 1) / m: idle over useful time, per stage
} PipelinePlan;

// Checks -pp and -tp against the model (a block per stage at least, heads divisible) and against `ranks`
// (the launched world, or --estimate's -w), one-line errors, then splits the blocks at sequence length T.
void pipeline_plan(PipelinePlan* plan, const GPTShape* s, int stages, int tp, int ranks, int T, int micro);
// The data-parallel replicas of `ranks` under the plan.
static inline int plan_replicas(const PipelinePlan* plan, int ranks) { return ranks / (plan->stages * plan->tp); }

typedef struct {
    const Grid* grid;
    StageSchedule sched;   // this stage's actions for m = ga micro-batches
} Pipeline;

// Stage `stage` of the plan: its blocks (tensor rank tp_rank's shard of each), the embeddings on the first
// stage, the final LayerNorm and the head's mirror of the embeddings on the last; units padded for `dp`
// replicas. One stage: the whole model.
void pipeline_stage_layout(ParamLayout* lay, const PipelinePlan* plan, const GPTShape* s, int dp, int stage, int tp_rank);
// Checks that the 1F1B schedule holds no more micro-batches at once than the plan's activation sets.
void pipeline_create(Pipeline* p, const Grid* grid, const PipelinePlan* plan);
void pipeline_destroy(Pipeline* p);

// One step's forwards and backwards over `ga` micro-batches of step `step` (gradients accumulate through
// zero.h; reducing them is the caller's). Returns the sum of the token losses on the stage with the head,
// 0 elsewhere. inputs/targets: host scratch of B*T ints. logits_dump: see gpt_forward (micro-batch 0).
// pt: on breakdown steps, each action's time goes to data, forward, backward or pipeline_wait (blocked
// in a receive: the bubble as this stage saw it, plus any imbalance between stages).
double pipeline_train_step(Pipeline* p, GPT* g, Backend* be, DataLoader* data, int step, int* inputs, int* targets,
                           float dloss, float* logits_dump, PhaseTimer* pt);
// A forward through every stage without backward (validation, sampling): the first stage embeds tokens,
// the last one computes logits and, with targets, returns the sum of token losses (0 elsewhere).
double pipeline_forward(Pipeline* p, GPT* g, Backend* be, const int* tokens, const int* targets);
