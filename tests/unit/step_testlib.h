// step_testlib.h: one training step of a layout on the CPU backend, for tests that compare the gradients of
// two ways of computing them (a fused and a split backward, recompute levels, a frozen base, adapters).
#pragma once
#include <stdint.h>

#include "core/model/walk.h"
#include "zero.h"

#define STEP_BATCH 2
#define STEP_SEQ 16

// Uniform in [-1, 1) from a 64-bit LCG state: the same values on every machine.
static inline float step_unif(uint64_t* s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

typedef enum { RUN_FUSED, RUN_SPLIT } BackwardRun;

// One forward and backward of a fixed (STEP_BATCH, STEP_SEQ) batch from the values `init` (flat, the
// layout's) at recompute level r, the backward fused or split into its input and weight halves; the
// gradients (fp32, flat) into grads; returns the loss.
static inline double run_step(const ParamLayout* lay, const float* init, int r, BackwardRun how, float* grads) {
    enum { N = STEP_BATCH * STEP_SEQ };
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    Zero* z = zero_create(be, &mem, lay, zero_caps(0), NULL, NULL, NULL, DT_FP32, NULL);
    zero_set_from_host(z, be, init);
    Model g;
    model_create(&g, be, &mem, lay, zero_param_store(z), NULL, NULL, NULL, 0, DT_FP32, STEP_BATCH, STEP_SEQ, r, 0, 1, how == RUN_SPLIT, 1);
    int tokens[N], targets[N];
    for (int i = 0; i < N; i++) tokens[i] = (i * 37 + 5) % lay->shape.V, targets[i] = (i * 53 + 11) % lay->shape.V;
    MicroBatch mb = {tokens, targets, NULL, NULL};
    zero_begin_step(z, be);
    model_forward(&g, be, 0, &mb, 1.0f / N, NULL);
    double loss = model_take_losses(&g, be);
    if (how == RUN_FUSED) {
        model_backward(&g, be, 0);
    } else {
        model_backward_input(&g, be, 0, 0);
        model_backward_weight(&g, be, 0, 0);
    }
    zero_reduce_grads(z, be);
    zero_grads_to_host(z, be, grads);
    model_destroy(&g, be);
    zero_destroy(z, be);
    backend_destroy(be);
    return loss;
}
