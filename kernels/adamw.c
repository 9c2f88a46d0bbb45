// adamw.c: the AdamW step over one parameter span, and the deterministic sum of squares (CPU twins).
#include <stdlib.h>

#include "kernels/adamw_host.h"
#include "kernels/cpu_common.h"

// The arithmetic is adamw_host's, shared with the optimizer's update of offloaded state.
void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                  float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    BACKEND_ENTRY(be, params, master, grads, m, v);
    adamw_host(params, param_dt, master, grads, grad_dt, m, v, n, offset, a);
}

// The sum is sum_squares_host's, shared with the gradient norm of gradients kept on the host.
void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    BACKEND_ENTRY(be, acc, x);
    *acc += (float)sum_squares_host(dt, x, n);
}

// The lists are the per-span calls; the CPU has no launches to save.
void adamw_update_spans(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                        const AdamWArgs* a) {
    for (int i = 0; i < count; i++) {
        const AdamWSpan* s = &spans[i];
        AdamWArgs si = *a;
        si.weight_decay = s->weight_decay;
        adamw_update(be, s->params, param_dt, s->master, s->grads, grad_dt, s->m, s->v, s->n, s->offset, &si);
    }
}

void sum_squares_spans(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n, int count) {
    for (int i = 0; i < count; i++) sum_squares(be, dt, acc, x[i], n[i]);
}
