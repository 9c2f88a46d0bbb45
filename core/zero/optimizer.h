// optimizer.h: the step after the gradients are reduced: global norm, clipping, then each updated span of
// the model states this rank holds (model_state.h: all of them, or its pieces where ZeRO shards the state)
// by its tensor's optimizer (optimizer_kind.h: AdamW; a frozen tensor has no span to update).
#pragma once
#include "core/zero/model_state.h"

// One step as the trainer builds it: the schedule's learning rate, the hyperparameters of the optimizers
// the kinds carry (AdamW's beta1, beta2, eps and weight decay), the step and the run's seed.
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int step;          // 0-based step being taken
    uint64_t seed;     // run seed; the rounding noise of step s is seeded from (seed, s)
    int freeze;        // -opt adam1bit's -freeze S (0: AdamW throughout): from step S on, 1-bit Adam's update
    float loss_scale;  // the scale the gradients (1-bit Adam: the exchanged momentum) carry
} OptimizerStep;

// What each optimizer's update takes for one step, drawn once from an OptimizerStep (optimizer_args): the
// same for every span and every place the update runs, so the host and the backend give the same bits.
// 1-bit Adam after the freeze (core/zero/onebit_adam.h): the reduced gradient holds the exchanged momentum.
typedef struct {
    int active;        // the step is past the freeze: onebit_adam.h's update in place of AdamW's
    float loss_scale;  // the momentum arrives multiplied by it
    float corr2;       // AdamW's bias correction of v at the freeze, 1 - beta2^S
} OnebitArgs;

typedef struct {
    AdamWArgs adamw;
    OnebitArgs onebit;
} StepArgs;

// Global L2 norm of the reduced gradients: each rank sums the squares of what it holds (the tied
// embedding and a tensor group's whole tensors once: their copies are skipped; frozen tensors not at all),
// the ranks holding other parts add, then the tensor group's shards (tp), then the pipeline's stages (pp;
// each NULL without).
double grad_global_norm(const ModelState* ms, Backend* be, Comm* tp, Comm* pp);
// Scale applied to the gradients: clip / norm when the norm exceeds the clip (clip > 0), else 1.
float grad_clip_scale(double norm, float clip);
// Every updated span by its optimizer (AdamW: weight decay on 2-D tensors), gradients multiplied by
// grad_scale; a frozen tensor's parameters stay as they are.
void optimizer_step(const ModelState* ms, Backend* be, const OptimizerStep* o, float grad_scale);
// The pieces of that step, for whoever runs it elsewhere (delayed_update.h): its arguments (the rounding
// seed drawn from (seed, step)), AdamW's for a span (no decay off 2-D tensors), and the canonical offset of
// a span's first element, which keys its rounding noise.
StepArgs optimizer_args(const OptimizerStep* o, float grad_scale);
AdamWArgs adamw_span_args(const AdamWArgs* a, const StateSpan* s);
size_t span_canonical_offset(const StateSpan* s);
// The spans of `which` in for_each_span's order, as an array the caller frees; *n is their count.
StateSpan* state_spans(const ModelState* ms, StateParts which, int* n);
// The update on the host over spans[0 .. n) (in for_each_span's order), with the master and the state where
// ms says: host memory, or the disk through a pass; each span's gradient and working copy as ms's places
// say (be may be NULL where neither is backend memory).
void optimizer_host_spans(const ModelState* ms, Backend* be, const StateSpan* spans, int n, const StepArgs* step);
