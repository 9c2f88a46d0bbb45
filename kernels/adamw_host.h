// adamw_host.h: the AdamW step over one span in host memory, the one definition of its arithmetic on the
// host. The CPU twin adamw_update (kernels/adamw.c) is this function; the optimizer calls it directly for
// state kept in host memory (-offload, core/optimizer.c), so both give the same bits by construction.
// The CUDA kernel (adamw.cuh) computes the same expression per element.
#pragma once
#include <math.h>

#include "kernels/host_elem.h"

// The contract of adamw_update in kernels.h, with every pointer host memory. OpenMP over elements; each
// element's result depends only on its inputs and (seed, offset + i), so any thread count and any split of a
// span into pieces give the same bits.
static inline void adamw_host(void* params, DType param_dt, float* master, const void* grads, DType grad_dt, float* m,
                              float* v, size_t n, size_t offset, const AdamWArgs* a) {
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
