// adamw_host.h: the AdamW step over one span in host memory and the sum of squares the gradient norm adds,
// the one definition of their arithmetic on the host. The CPU twins adamw_update and sum_squares
// (kernels/adamw.c) are these functions; the optimizer calls them directly for state and gradients kept in
// host memory (-offload, core/zero/optimizer.c), so both give the same bits by construction. The CUDA kernels
// (adamw.cuh) compute the same AdamW expression per element; their sum of squares adds in another order.
#pragma once
#include <math.h>
#include <stdlib.h>

#include "base/common.h"

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

#define SUM_SQUARES_CHUNK 65536   // fixed partition: the partial sums and their order do not depend on threads

// The sum of x[i]^2 over n elements of host memory, in double: per fixed chunk, then the chunks in order.
static inline double sum_squares_host(DType dt, const void* x, size_t n) {
    size_t nchunks = (n + SUM_SQUARES_CHUNK - 1) / SUM_SQUARES_CHUNK;
    double* part = (double*)xmalloc(sizeof(double) * (nchunks ? nchunks : 1));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i1 = (k + 1) * SUM_SQUARES_CHUNK < n ? (k + 1) * SUM_SQUARES_CHUNK : n;
        double s = 0.0;
        for (size_t i = k * SUM_SQUARES_CHUNK; i < i1; i++) {
            double e = ld(x, i, dt);
            s += e * e;
        }
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nchunks; k++) total += part[k];
    free(part);
    return total;
}
