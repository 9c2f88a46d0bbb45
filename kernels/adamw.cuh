// adamw.cuh: the AdamW update over one span of parameters, and the deterministic sum of squares used
// for the global gradient norm; and their lists (adamw_update_spans, sum_squares_spans), the kernel table's
// entries: by default each is its per-span calls, and the adamw_multi variant covers many spans per launch with
// the per-span calls' bits (kernels/variants/adamw_multi.cuh).
#pragma once
#include "kernels/cuda_backend.cuh"

// The per-call constants of one AdamW step (bias corrections bc1, bc2 computed on the host).
struct AdamWConsts {
    float lr, beta1, beta2, eps, grad_scale, bc1, bc2;
    uint32_t seed;
};

// Element i of a span: the one AdamW expression of the per-span launcher and adamw_multi's, so the variant's bits
// are the default's.
// bf16 params are rounded stochastically with exactly the CPU twin's noise (dtype.h), so a parameter gets
// the same bits on every rank and in both builds.
template <typename TP, typename TG>
__device__ __forceinline__ void adamw_element(TP* params, float* master, const TG* grads, float* m, float* v, size_t i,
                                              size_t offset, float wd, const AdamWConsts& k) {
    const float g = to_f(grads[i]) * k.grad_scale;
    const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    const float mhat = mi / k.bc1, vhat = vi / k.bc2;
    const float w = master[i];
    const float nw = w - k.lr * (mhat / (sqrtf(vhat) + k.eps) + wd * w);
    m[i] = mi;
    v[i] = vi;
    master[i] = nw;
    if constexpr (std::is_same<TP, __nv_bfloat16>::value) {
        const uint16_t bits = bf16_from_f32_stochastic(nw, element_noise(k.seed, (uint64_t)(offset + i)) & 0xffffu);
        params[i] = __ushort_as_bfloat16(bits);
    } else {
        params[i] = from_f<TP>(nw);
    }
}

template <typename TP, typename TG>
__global__ void adamw_kernel(TP* params, float* master, const TG* grads, float* m, float* v, size_t n, size_t offset,
                             float lr, float beta1, float beta2, float eps, float wd, float grad_scale, float bc1,
                             float bc2, uint32_t seed) {
    const AdamWConsts k = {lr, beta1, beta2, eps, grad_scale, bc1, bc2, seed};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(params, master, grads, m, v, i, offset, wd, k);
}

#define ADAMW_BLOCK 256
#define ADAMW_MAX_BLOCKS 65536

// A span's grid: fixed by n alone, the same in both launchers.
static int adamw_blocks(size_t n) {
    const size_t want = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
    return (int)(want < ADAMW_MAX_BLOCKS ? want : ADAMW_MAX_BLOCKS);
}

// Bias corrections once on the host, in the same float arithmetic as the CPU twin.
static AdamWConsts adamw_consts(const AdamWArgs* a) {
    const AdamWConsts k = {a->lr, a->beta1, a->beta2, a->eps, a->grad_scale, 1.0f - powf(a->beta1, (float)a->step),
                           1.0f - powf(a->beta2, (float)a->step), a->seed};
    return k;
}

extern "C" void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                             float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    if (n == 0) return;
    const AdamWConsts k = adamw_consts(a);
    const int grid = adamw_blocks(n);
    DISPATCH_DTYPE(param_dt, TP, DISPATCH_DTYPE(grad_dt, TG, {
        adamw_kernel<TP, TG><<<grid, ADAMW_BLOCK, 0, be_stream(be)>>>((TP*)params, master, (const TG*)grads, m, v, n,
                                                                      offset, k.lr, k.beta1, k.beta2, k.eps,
                                                                      a->weight_decay, k.grad_scale, k.bc1, k.bc2, k.seed);
        LAUNCH_CHECK();
    }));
}

// ---------------------------------------------------------------------------------------------------
// sum_squares: a grid fixed by n alone (so the order never depends on the device), each block's partial
// written to scratch, then one block adds the partials in a fixed tree order into *acc.
#define SS_BLOCK 512
#define SS_MAX_BLOCKS 1024

static int sum_squares_blocks(size_t n) {
    const size_t want = (n + (size_t)SS_BLOCK * 8 - 1) / ((size_t)SS_BLOCK * 8);
    return (int)(want < SS_MAX_BLOCKS ? (want ? want : 1) : SS_MAX_BLOCKS);
}

// Block b of a span's nb: its threads' strided sums, then the block's tree; both launchers call it.
template <typename T>
__device__ __forceinline__ float sum_squares_block(const T* x, size_t n, unsigned b, unsigned nb, float* red) {
    float s = 0.0f;
    for (size_t i = b * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)nb * blockDim.x) {
        const float v = to_f(x[i]);
        s += v * v;
    }
    return block_sum(s, red);
}

// One span's partials in a fixed order; both launchers' final kernels call it.
__device__ __forceinline__ float sum_partials(const float* partial, int nparts, float* red) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
    return block_sum(s, red);
}

template <typename T>
__global__ void __launch_bounds__(SS_BLOCK) sum_squares_partial_kernel(float* partial, const T* x, size_t n) {
    __shared__ float red[32];
    const float s = sum_squares_block(x, n, blockIdx.x, gridDim.x, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(SS_BLOCK) sum_squares_final_kernel(float* acc, const float* partial, int nparts) {
    __shared__ float red[32];
    const float s = sum_partials(partial, nparts, red);
    if (threadIdx.x == 0) *acc += s;
}

extern "C" void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    if (n == 0) return;
    const int grid = sum_squares_blocks(n);
    float* partial = (float*)be_scratch(be, (size_t)grid * sizeof(float), "sum_squares");
    DISPATCH_DTYPE(dt, X, {
        sum_squares_partial_kernel<X><<<grid, SS_BLOCK, 0, be_stream(be)>>>(partial, (const X*)x, n);
        LAUNCH_CHECK();
    });
    sum_squares_final_kernel<<<1, SS_BLOCK, 0, be_stream(be)>>>(acc, partial, grid);
    LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------
// The lists: the table's entries by default are their per-span calls (the same launches as without the list).

static void adamw_update_spans_default(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                                       const AdamWArgs* a) {
    for (int i = 0; i < count; i++) {
        const AdamWSpan* s = &spans[i];
        AdamWArgs si = *a;
        si.weight_decay = s->weight_decay;
        adamw_update(be, s->params, param_dt, s->master, s->grads, grad_dt, s->m, s->v, s->n, s->offset, &si);
    }
}

extern "C" void adamw_update_spans(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                                   const AdamWArgs* a) {
    be_kernels(be)->adamw_update_spans(be, param_dt, grad_dt, spans, count, a);
}

static void sum_squares_spans_default(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n,
                                      int count) {
    for (int i = 0; i < count; i++) sum_squares(be, dt, acc, x[i], n[i]);
}

extern "C" void sum_squares_spans(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n, int count) {
    be_kernels(be)->sum_squares_spans(be, dt, acc, x, n, count);
}
