// adamw.cuh: the AdamW update over one span of parameters, and the deterministic sum of squares used
// for the global gradient norm.
#pragma once

// bf16 params are rounded stochastically with exactly the CPU twin's noise (dtype.h), so a parameter gets
// the same bits on every rank and in both builds.
template <typename TP, typename TG>
__global__ void adamw_kernel(TP* params, float* master, const TG* grads, float* m, float* v, size_t n, size_t offset,
                             float lr, float beta1, float beta2, float eps, float wd, float grad_scale, float bc1,
                             float bc2, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = to_f(grads[i]) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        const float mhat = mi / bc1, vhat = vi / bc2;
        const float w = master[i];
        const float nw = w - lr * (mhat / (sqrtf(vhat) + eps) + wd * w);
        m[i] = mi;
        v[i] = vi;
        master[i] = nw;
        if constexpr (std::is_same<TP, __nv_bfloat16>::value) {
            const uint16_t bits = bf16_from_f32_stochastic(nw, element_noise(seed, (uint64_t)(offset + i)) & 0xffffu);
            params[i] = __ushort_as_bfloat16(bits);
        } else {
            params[i] = from_f<TP>(nw);
        }
    }
}

extern "C" void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                             float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    if (n == 0) return;
    // Bias corrections once on the host, in the same float arithmetic as the CPU twin.
    const float bc1 = 1.0f - powf(a->beta1, (float)a->step);
    const float bc2 = 1.0f - powf(a->beta2, (float)a->step);
    const int block = 256;
    const size_t want = (n + block - 1) / block;
    const int grid = (int)(want < 65536 ? want : 65536);
    DISPATCH_DTYPE(param_dt, TP, DISPATCH_DTYPE(grad_dt, TG, {
        adamw_kernel<TP, TG><<<grid, block, 0, be->stream>>>((TP*)params, master, (const TG*)grads, m, v, n, offset,
                                                             a->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                                                             a->grad_scale, bc1, bc2, a->seed);
        LAUNCH_CHECK();
    }));
}

// ---------------------------------------------------------------------------------------------------
// sum_squares: a grid fixed by n alone (so the order never depends on the device), each block's partial
// written to scratch, then one block adds the partials in a fixed tree order into *acc.
#define SS_BLOCK 512
#define SS_MAX_BLOCKS 1024

template <typename T>
__global__ void __launch_bounds__(SS_BLOCK) sum_squares_partial_kernel(float* partial, const T* x, size_t n) {
    __shared__ float red[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = to_f(x[i]);
        s += v * v;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(SS_BLOCK) sum_squares_final_kernel(float* acc, const float* partial, int nparts) {
    __shared__ float red[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
    s = block_sum(s, red);
    if (threadIdx.x == 0) *acc += s;
}

extern "C" void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    if (n == 0) return;
    const size_t want = (n + (size_t)SS_BLOCK * 8 - 1) / ((size_t)SS_BLOCK * 8);
    const int grid = (int)(want < SS_MAX_BLOCKS ? (want ? want : 1) : SS_MAX_BLOCKS);
    float* partial = (float*)be_scratch(be, (size_t)grid * sizeof(float), "sum_squares");
    DISPATCH_DTYPE(dt, X, {
        sum_squares_partial_kernel<X><<<grid, SS_BLOCK, 0, be->stream>>>(partial, (const X*)x, n);
        LAUNCH_CHECK();
    });
    sum_squares_final_kernel<<<1, SS_BLOCK, 0, be->stream>>>(acc, partial, grid);
    LAUNCH_CHECK();
}
