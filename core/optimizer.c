// optimizer.c: see optimizer.h.
#include "optimizer.h"

#include <math.h>

#include "rng.h"

double grad_global_norm(GPT* g, Backend* be, float* acc) {
    const ParamLayout* lay = g->layout;
    be_memset0(be, acc, sizeof(float));
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        sum_squares(be, g->dt, acc, tensor_ptr(g->grads, t, g->dt), t->size);
    }
    float sum;
    be_download(be, &sum, acc, sizeof(float));
    return sqrt((double)sum);
}

float grad_clip_scale(double norm, float clip) {
    return (clip > 0.0f && norm > clip) ? (float)(clip / norm) : 1.0f;
}

void adamw_step(GPT* g, Backend* be, const OptimizerStep* o, float grad_scale) {
    const ParamLayout* lay = g->layout;
    Rng r = rng_seeded(o->seed, 0x5eed0000ull + (uint64_t)o->step);
    AdamWArgs a = {o->lr, o->beta1, o->beta2, o->eps, 0.0f, grad_scale, o->step + 1, (uint32_t)rng_next_u64(&r)};
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        a.weight_decay = t->decay ? o->weight_decay : 0.0f;
        adamw_update(be, tensor_ptr(g->params, t, g->dt), g->dt, g->master + t->offset, tensor_ptr(g->grads, t, g->dt),
                     g->dt, g->adam_m + t->offset, g->adam_v + t->offset, t->size, t->canonical, &a);
    }
}
