// swiglu.cuh: SwiGLU, silu(gate) * up, from the packed [gate | up] rows one matmul makes.
// P consecutive elements of a row per thread: a 16-byte pack when F is a whole number of packs and the
// pointers are 16-byte aligned (then no pack straddles a row), else one element.
#pragma once
#include "kernels/cuda_backend.cuh"

// As cpu_common.h's: at large |x| exp overflows to inf and both give the limits.
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

template <typename X, int P>
__global__ void swiglu_forward_kernel(X* out, const X* gu, size_t n, int F) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= n) return;
    const X* g = gu + (i / F) * 2 * F + i % F;
    float a[P], b[P];
    load_f<P>(a, g);
    load_f<P>(b, g + F);
    for (int k = 0; k < P; k++) a[k] = silu_f(a[k]) * b[k];
    store_f<P>(out + i, a);
}

// d gate = dout * up * silu'(gate), d up = dout * silu(gate).
template <typename X, int P>
__global__ void swiglu_backward_kernel(X* dgu, const X* dout, const X* gu, size_t n, int F) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= n) return;
    const size_t o = (i / F) * 2 * F + i % F;
    float a[P], b[P], d[P], da[P];
    load_f<P>(a, gu + o);
    load_f<P>(b, gu + o + F);
    load_f<P>(d, dout + i);
    for (int k = 0; k < P; k++) {
        da[k] = d[k] * b[k] * silu_grad_f(a[k]);
        b[k] = d[k] * silu_f(a[k]);
    }
    store_f<P>(dgu + o, da);
    store_f<P>(dgu + o + F, b);
}

#define SWIGLU_LAUNCH(kernel, X, vec, n, ...)                                                            \
    do {                                                                                                 \
        const int block_ = 256;                                                                          \
        if (vec) kernel<X, Pack128<X>::size><<<ceil_div((n) / Pack128<X>::size, block_), block_, 0,      \
                                               be_stream(be)>>>(__VA_ARGS__);                            \
        else kernel<X, 1><<<ceil_div((n), block_), block_, 0, be_stream(be)>>>(__VA_ARGS__);             \
        LAUNCH_CHECK();                                                                                  \
    } while (0)

extern "C" void swiglu_forward(Backend* be, DType dt, void* out, const void* gu, int N, int F) {
    const size_t n = (size_t)N * F;
    if (n == 0) return;
    const bool vec = F % (16 / (int)dtype_size(dt)) == 0 && aligned16(out) && aligned16(gu);
    DISPATCH_DTYPE(dt, X, SWIGLU_LAUNCH(swiglu_forward_kernel, X, vec, n, (X*)out, (const X*)gu, n, F));
}

extern "C" void swiglu_backward(Backend* be, DType dt, void* dgu, const void* dout, const void* gu, int N, int F) {
    const size_t n = (size_t)N * F;
    if (n == 0) return;
    const bool vec = F % (16 / (int)dtype_size(dt)) == 0 && aligned16(dgu) && aligned16(dout) && aligned16(gu);
    DISPATCH_DTYPE(dt, X, SWIGLU_LAUNCH(swiglu_backward_kernel, X, vec, n, (X*)dgu, (const X*)dout, (const X*)gu, n, F));
}
