// pipeline.h: the pipeline executor. Walks this stage's action list (schedule.h: 1f1b, interleaved or zb)
// for one training step: forwards and backwards through the stage's blocks (walk.h; with interleaving, one
// Model per model chunk), activations sent to the next stage and gradients to the previous one over the
// grid's pp group (grid.h). Without a pipeline (one stage) the 1F1B list is F0 B0 F1 B1 ..., so the same
// code runs gradient accumulation on a single rank.
//
// The sends and receives between two computes go out as one exchange (comm_exchange: rendezvous sends, as
// NCCL's; schedule.h shows why the lists cannot deadlock so). Micro-batch i of chunk c uses activation set
// i % K, K = the schedule's peak for the chunk: the
// micro-batches in flight in a chunk are consecutive and never more than K, so their sets never collide;
// zb's deferred weight gradients use stash slot i % D, D = peak_deferred, by the same argument.
#pragma once
#include "core/data/dataloader.h"
#include "core/model/walk.h"
#include "core/comm/grid.h"
#include "core/util/phase_timer.h"
#include "core/pipeline/schedule.h"

// The pipeline's shape, decided once at set-up from the flags and used by everything that depends on it:
// the stage layouts, the activation sets model_create allocates, the schedule's check, --estimate and the
// start-up line. One stage (no -pp) is the same plan with P = 1.
typedef struct {
    int stages;                  // P
    int tp;                      // -tp: ranks sharing each stage's blocks (grid.h)
    int cp;                      // -cp: ranks sharing each sequence (grid.h); the replicas are ranks / (P * tp * cp)
    int cp_ring;                 // -cpm ring (context_parallel.h); 0: Ulysses
    int micro;                   // m = -ga micro-batches per step
    ScheduleKind schedule;       // -ps
    int chunks;                  // -vp: model chunks per stage (1 but with interleaving)
    int first[MAX_LAYERS];       // virtual stage v = c P + s (chunk c of stage s; v = s without interleaving)
    int count[MAX_LAYERS];       //   runs blocks first[v] .. first[v] + count[v] - 1 (pipeline_split over P V
                                 //   virtual stages: balanced with the LM head's cost)
    int sets[MAX_LAYERS][MAX_CHUNKS];   // activation sets chunk c of stage s needs: its micro-batches in flight
    int stash[MAX_LAYERS];       // zb: stage s's deferred weight gradients at once (0 for the other schedules)
    double bubble;               // the schedule's idle over useful time, per stage (schedule_bubble)
} PipelinePlan;

// Checks -pp, -ps, -vp, -tp and -cp against the model (a block per stage at least, heads divisible), against
// `ranks` (the launched world, or --estimate's -w) and against m = micro, one-line errors, then splits the
// blocks at sequence length T and sizes each stage's activation sets and stash from its schedule.
void pipeline_plan(PipelinePlan* plan, const ModelShape* s, int stages, ScheduleKind schedule, int chunks, int tp, int cp,
                   int cp_ring, int ranks, int T, int micro);
// ZeRO's data-parallel group of `ranks` under the plan: the replicas times their context ranks (grid.h).
static inline int plan_replicas(const PipelinePlan* plan, int ranks) { return ranks / (plan->stages * plan->tp); }

typedef struct {
    const Grid* grid;
    StageSchedule sched;   // this stage's actions for m = ga micro-batches
    int stash;             // zb's stash slots (the plan's)
} Pipeline;

// Stage `stage` of the plan: its blocks (tensor rank tp_rank's shard of each; one range per chunk), the
// embeddings on the first stage, the final LayerNorm and the head's mirror of the embeddings on the last;
// units padded for a data-parallel group of `dp`; the plan's context ranks size attention's exchange
// buffers (layout_context_ranks). One stage: the whole model.
void pipeline_stage_layout(ParamLayout* lay, const PipelinePlan* plan, const ModelShape* s, int dp, int stage, int tp_rank);
// Builds this stage's schedule; checks that it holds no more micro-batches at once than the plan's
// activation sets and stash, and that the stage with the LM head runs each backward before the next forward
// (its logits are one buffer).
void pipeline_create(Pipeline* p, const Grid* grid, const PipelinePlan* plan);
void pipeline_destroy(Pipeline* p);

// One step's forwards and backwards over `ga` micro-batches of step `step` (gradients accumulate through
// zero.h; reducing them is the caller's). `chunks`: one Model per model chunk of this stage (layout_chunk_view
// of the stage's layout; one without interleaving). Returns the sum of the token losses on the stage with
// the head, 0 elsewhere (a target of -1 adds 0); the losses are read once, at the end (model_take_losses).
// batch: host scratch of B*T ints each (pos and doc too when the data has documents: then every stage reads
// the data, since every block's attention and positions read them). logits_dump: see model_forward (micro-batch 0). pt: on breakdown steps, each action's
// time goes to data, forward, backward or pipeline_wait (blocked in an exchange: the bubble as this stage
// saw it, plus any imbalance between stages); zb's W's count as backward.
double pipeline_train_step(Pipeline* p, Model* chunks, Backend* be, DataLoader* data, int step, Batch* batch, float dloss,
                           float* logits_dump, PhaseTimer* pt);
// A forward through every (virtual) stage without backward (validation, sampling): the first stage embeds
// tokens, the last one computes logits and, with targets, returns the sum of token losses (0 elsewhere).
double pipeline_forward(Pipeline* p, Model* chunks, Backend* be, const MicroBatch* mb);
// The same forward, keeping each token's loss (the scores of a multiple-choice evaluation): on the stage
// with the head, losses (B*T floats, row order) receives them and 1 is returned; elsewhere 0.
int pipeline_forward_token_losses(Pipeline* p, Model* chunks, Backend* be, const int* tokens, const int* targets, float* losses);
// A batch as the model reads it: pos and doc only when the data has documents.
static inline MicroBatch pipeline_micro_batch(const Batch* b, const DataLoader* data) {
    int docs = dataloader_has_documents(data);
    MicroBatch mb = {b->tokens, b->targets, docs ? b->pos : NULL, docs ? b->doc : NULL};
    return mb;
}
// The chunk that holds the LM head on the last stage (its logits after pipeline_forward).
static inline Model* pipeline_head_chunk(const Pipeline* p, Model* chunks) { return &chunks[p->sched.num_chunks - 1]; }
