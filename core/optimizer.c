// optimizer.c: see optimizer.h.
#include "optimizer.h"

#include <math.h>

#include "kernels/adamw_host.h"
#include "rng.h"

typedef struct {
    Backend* be;
    float* acc;        // backend scratch
    float host_acc;    // gradients on the host: the same fp32 additions, made here
    int on_host;
} NormCtx;

static void add_squares(const StateSpan* s, void* ctx) {
    NormCtx* c = (NormCtx*)ctx;
    if (c->on_host) c->host_acc += (float)sum_squares_host(s->grad_dt, s->grad, s->n);
    else sum_squares(c->be, s->grad_dt, c->acc, s->grad, s->n);
}

double grad_global_norm(const ModelState* ms, Backend* be, Comm* tp, Comm* pp) {
    NormCtx c = {be, ms->scratch, 0.0f, ms->grads_on_host};
    if (!c.on_host) be_memset0(be, c.acc, sizeof(float));
    ms->for_each_span(ms->ctx, STATE_NORM, add_squares, &c);
    float local = c.host_acc;
    if (!c.on_host) be_download(be, &local, c.acc, sizeof(float));
    double sum = local;
    if (ms->parts) comm_allreduce_host_sum(ms->parts, &sum, 1);   // the other parts of this stage's units
    if (tp) comm_allreduce_host_sum(tp, &sum, 1);   // the other shards of this stage's blocks
    if (pp) comm_allreduce_host_sum(pp, &sum, 1);   // the other stages' layers
    return sqrt(sum);
}

float grad_clip_scale(double norm, float clip) {
    return (clip > 0.0f && norm > clip) ? (float)(clip / norm) : 1.0f;
}

typedef struct {
    Backend* be;
    const ModelState* ms;
    AdamWArgs args;
} UpdateCtx;

// State on the host (-offload): the span goes through the staging buffer a chunk at a time: its reduced
// gradient down (unless it is on the host already), AdamW on the host over master, m, v (adamw_host: the
// CPU twin's own code, so the same bits, and a chunk's noise still keyed by its canonical offsets), the new
// working copy up (unless the working copy lives on the host: then it is written in place).
static void update_span_on_host(const ModelState* ms, Backend* be, const StateSpan* s, size_t offset, const AdamWArgs* a) {
    size_t gx = dtype_size(s->grad_dt), x = dtype_size(ms->dt);
    size_t chunk = ms->host_stage ? ms->host_stage_elems : s->n;   // nothing staged: the span at once
    void* stage_grad = ms->host_stage;
    void* stage_params = (char*)ms->host_stage + (ms->grads_on_host ? 0 : chunk * 4);
    for (size_t i = 0; i < s->n; i += chunk) {
        size_t k = s->n - i < chunk ? s->n - i : chunk;
        const void* grad = (const char*)s->grad + i * gx;
        void* params = ms->params_on_host ? (char*)s->params + i * x : stage_params;
        if (!ms->grads_on_host) be_download(be, stage_grad, grad, k * gx);
        adamw_host(params, ms->dt, s->master + i, ms->grads_on_host ? grad : stage_grad, s->grad_dt, s->m + i, s->v + i, k,
                   offset + i, a);
        if (!ms->params_on_host) be_upload(be, (char*)s->params + i * x, params, k * x);
    }
}

AdamWArgs adamw_span_args(const AdamWArgs* a, const StateSpan* s) {
    AdamWArgs out = *a;
    if (!s->t->decay) out.weight_decay = 0.0f;
    return out;
}

size_t adamw_span_offset(const StateSpan* s) { return tensor_canonical(s->t, s->flat - s->t->offset); }

static void update_span(const StateSpan* s, void* ctx) {
    UpdateCtx* c = (UpdateCtx*)ctx;
    AdamWArgs a = adamw_span_args(&c->args, s);
    size_t offset = adamw_span_offset(s);
    if (c->ms->state_on_host) update_span_on_host(c->ms, c->be, s, offset, &a);
    else adamw_update(c->be, s->params, c->ms->dt, s->master, s->grad, s->grad_dt, s->m, s->v, s->n, offset, &a);
}

AdamWArgs adamw_args(const OptimizerStep* o, float grad_scale) {
    Rng r = rng_seeded(o->seed, 0x5eed0000ull + (uint64_t)o->step);
    AdamWArgs a = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, grad_scale, o->step + 1, (uint32_t)rng_next_u64(&r)};
    return a;
}

void adamw_step(const ModelState* ms, Backend* be, const OptimizerStep* o, float grad_scale) {
    UpdateCtx c = {be, ms, adamw_args(o, grad_scale)};
    ms->for_each_span(ms->ctx, STATE_UPDATE, update_span, &c);
}
