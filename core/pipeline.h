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
#include "report.h"
#include "schedule.h"

typedef struct {
    const Grid* grid;
    StageSchedule sched;   // this stage's actions for m = ga micro-batches
} Pipeline;

// Stage `stage` of `stages`: its blocks (pipeline_split, balanced with the LM head's cost at sequence length
// T), the embeddings on the first stage, the final LayerNorm and the head's mirror of them on the last;
// units padded for `dp` replicas. With one stage, the whole model.
void pipeline_stage_layout(ParamLayout* lay, const GPTShape* s, int dp, int stages, int stage, int T);
// The number of activation sets stage `stage` of `stages` needs for `micro` micro-batches: min(P - s, m).
int pipeline_activation_sets(int stages, int stage, int micro);
void pipeline_create(Pipeline* p, const Grid* grid, int micro);
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
