// adamw_host.h: the AdamW step over one span in host memory, the one definition of its arithmetic on the
// host. The CPU twin adamw_update (kernels/adamw.c) is this function; the optimizer calls it directly for
// state kept in host memory (-offload, core/optimizer.c), so both give the same bits by construction.
// The CUDA kernel (adamw.cuh) computes the same expression per element.
#pragma once
#include <math.h>

#include "kernels/host_elem.h"

// One element's step: returns the new master weight and updates *m, *v. The one expression of AdamW on the
// host; every loop below calls it, so they differ only in how they store the result.
static inline float adamw_elem(float g, float* m, float* v, float w, float b1, float b2, float corr1, float corr2,
                               const AdamWArgs* a) {
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    float mhat = mi / corr1, vhat = vi / corr2;
    *m = mi;
    *v = vi;
    return w - a->lr * (mhat / (sqrtf(vhat) + a->eps) + a->weight_decay * w);
}

// The contract of adamw_update in kernels.h, with every pointer host memory. OpenMP over elements; each
// element's result depends only on its inputs and (seed, offset + i), so any thread count and any split of a
// span into pieces give the same bits. One loop per working dtype (and a fast one for fp32 gradients), with
// no branch or call inside, so the compiler vectorizes them: the step is bound by memory bandwidth
// (bench/bench_adamw.c measures it against the floor).
static inline void adamw_host(void* params, DType param_dt, float* master, const void* grads, DType grad_dt, float* m,
                              float* v, size_t n, size_t offset, const AdamWArgs* a) {
    float b1 = a->beta1, b2 = a->beta2, gs = a->grad_scale;
    float corr1 = 1.0f - powf(b1, (float)a->step), corr2 = 1.0f - powf(b2, (float)a->step);
    const float* g32 = grad_dt == DT_FP32 ? (const float*)grads : NULL;
    if (param_dt == DT_FP32 && g32) {   // params may alias master
        float* p = (float*)params;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float w = adamw_elem(g32[i] * gs, &m[i], &v[i], master[i], b1, b2, corr1, corr2, a);
            master[i] = w;
            p[i] = w;
        }
    } else if (param_dt == DT_BF16 && g32) {   // stochastic: the noise depends only on (seed, canonical offset)
        uint16_t* p = (uint16_t*)params;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float w = adamw_elem(g32[i] * gs, &m[i], &v[i], master[i], b1, b2, corr1, corr2, a);
            master[i] = w;
            p[i] = bf16_from_f32_stochastic(w, element_noise(a->seed, offset + i) & 0xffffu);
        }
    } else {   // 16-bit gradients, fp16 parameters
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            float w = adamw_elem(ld(grads, i, grad_dt) * gs, &m[i], &v[i], master[i], b1, b2, corr1, corr2, a);
            master[i] = w;
            if (param_dt == DT_BF16) ((uint16_t*)params)[i] = bf16_from_f32_stochastic(w, element_noise(a->seed, offset + i) & 0xffffu);
            else st(params, i, w, param_dt);
        }
    }
}
