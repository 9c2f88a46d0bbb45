// adamw.c: the AdamW step over one parameter span, and the deterministic sum of squares (CPU twins).
#include <stdlib.h>

#include "kernels/cpu_common.h"

void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                  float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    (void)be;
    float b1 = a->beta1, b2 = a->beta2;
    float corr1 = 1.0f - powf(b1, (float)a->step), corr2 = 1.0f - powf(b2, (float)a->step);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = ld(grads, i, grad_dt) * a->grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        float mhat = mi / corr1, vhat = vi / corr2;
        float w = master[i];
        w -= a->lr * (mhat / (sqrtf(vhat) + a->eps) + a->weight_decay * w);
        m[i] = mi;
        v[i] = vi;
        master[i] = w;
        if (param_dt == DT_BF16)   // stochastic: the noise depends only on (seed, canonical offset)
            ((uint16_t*)params)[i] = bf16_from_f32_stochastic(w, element_noise(a->seed, offset + i) & 0xffffu);
        else
            st(params, i, w, param_dt);   // fp32 (also when params aliases master) or fp16 RNE
    }
}

#define SQ_CHUNK 65536   // fixed partition: the partial sums and their order do not depend on threads

void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    (void)be;
    size_t nchunks = (n + SQ_CHUNK - 1) / SQ_CHUNK;
    double* part = xmalloc(sizeof(double) * (nchunks ? nchunks : 1));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i1 = (k + 1) * SQ_CHUNK < n ? (k + 1) * SQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = k * SQ_CHUNK; i < i1; i++) {
            double e = ld(x, i, dt);
            s += e * e;
        }
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nchunks; k++) total += part[k];
    free(part);
    *acc += (float)total;
}
