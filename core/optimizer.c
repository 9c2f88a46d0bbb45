// optimizer.c: see optimizer.h.
#include "optimizer.h"

#include <math.h>

#include "rng.h"

static void add_squares(Zero* z, const ParamTensor* t, size_t flat, size_t si, size_t n, void* ctx) {
    DType gdt;
    const void* g = zero_grad_source(z, flat, si, &gdt);
    sum_squares((Backend*)ctx, gdt, z->norm_acc, g, n);
}

double grad_global_norm(Zero* z, Backend* be, Comm* pp) {
    be_memset0(be, z->norm_acc, sizeof(float));
    zero_for_each_span(z, ZERO_NORM, add_squares, be);
    float local;
    be_download(be, &local, z->norm_acc, sizeof(float));
    double sum = local;
    // Stage 0: every rank holds the whole all-reduced gradient already; from stage 1 each holds a piece.
    if (z->stage > 0 && z->size > 1) comm_allreduce_host_sum(z->dp, &sum, 1);
    if (pp) comm_allreduce_host_sum(pp, &sum, 1);   // the other stages' layers
    return sqrt(sum);
}

float grad_clip_scale(double norm, float clip) {
    return (clip > 0.0f && norm > clip) ? (float)(clip / norm) : 1.0f;
}

typedef struct {
    Backend* be;
    AdamWArgs args;
} UpdateCtx;

static void update_span(Zero* z, const ParamTensor* t, size_t flat, size_t si, size_t n, void* ctx) {
    UpdateCtx* c = (UpdateCtx*)ctx;
    AdamWArgs a = c->args;
    if (!t->decay) a.weight_decay = 0.0f;
    DType gdt;
    const void* g = zero_grad_source(z, flat, si, &gdt);
    adamw_update(c->be, zero_param_dest(z, flat, si), z->dt, z->master + si, g, gdt, z->adam_m + si, z->adam_v + si, n,
                 t->canonical + (flat - t->offset), &a);
}

void adamw_step(Zero* z, Backend* be, const OptimizerStep* o, float grad_scale) {
    Rng r = rng_seeded(o->seed, 0x5eed0000ull + (uint64_t)o->step);
    UpdateCtx c = {be, {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, grad_scale, o->step + 1, (uint32_t)rng_next_u64(&r)}};
    zero_for_each_span(z, ZERO_UPDATE, update_span, &c);
}
