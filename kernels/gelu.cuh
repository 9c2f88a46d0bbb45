// gelu.cuh: elementwise residual add, GELU forward and backward.
// One 16-byte pack per thread when every pointer is 16-byte aligned (the launcher checks); the last
// n % pack elements, or everything for misaligned pointers, go element by element.
#pragma once
#include "kernels/cuda_backend.cuh"

template <typename T, bool VEC>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t n) {
    constexpr int P = VEC ? Pack128<T>::size : 1;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (VEC && i + P <= n) {
        const Pack128<T> x = load128(a + i), y = load128(b + i);
        Pack128<T> o;
        for (int k = 0; k < Pack128<T>::size; k++) o.set(k, x.get(k) + y.get(k));
        store128(out + i, o);
    } else {
        for (size_t j = i; j < i + P && j < n; j++) out[j] = from_f<T>(to_f(a[j]) + to_f(b[j]));
    }
}

template <typename T, bool VEC>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
    constexpr int P = VEC ? Pack128<T>::size : 1;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (VEC && i + P <= n) {
        const Pack128<T> x = load128(inp + i);
        Pack128<T> o;
        for (int k = 0; k < Pack128<T>::size; k++) o.set(k, gelu_f(x.get(k)));
        store128(out + i, o);
    } else {
        for (size_t j = i; j < i + P && j < n; j++) out[j] = from_f<T>(gelu_f(to_f(inp[j])));
    }
}

template <typename T, bool VEC>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
    constexpr int P = VEC ? Pack128<T>::size : 1;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (VEC && i + P <= n) {
        const Pack128<T> x = load128(inp + i), d = load128(dout + i);
        Pack128<T> o;
        for (int k = 0; k < Pack128<T>::size; k++) o.set(k, d.get(k) * gelu_grad_f(x.get(k)));
        store128(dinp + i, o);
    } else {
        for (size_t j = i; j < i + P && j < n; j++) dinp[j] = from_f<T>(to_f(dout[j]) * gelu_grad_f(to_f(inp[j])));
    }
}

// Launch `kernel<T, VEC>` over n elements with one pack (VEC) or one element per thread.
#define ELEMENTWISE_LAUNCH(kernel, T, vec, n, ...)                                                       \
    do {                                                                                                 \
        const int block_ = 256;                                                                          \
        if (vec) {                                                                                       \
            const size_t threads_ = ((n) + Pack128<T>::size - 1) / Pack128<T>::size;                     \
            kernel<T, true><<<ceil_div(threads_, block_), block_, 0, be_stream(be)>>>(__VA_ARGS__);      \
        } else {                                                                                         \
            kernel<T, false><<<ceil_div((n), block_), block_, 0, be_stream(be)>>>(__VA_ARGS__);          \
        }                                                                                                \
        LAUNCH_CHECK();                                                                                  \
    } while (0)

extern "C" void residual_forward(Backend* be, DType dt, void* out, const void* a, const void* b, size_t n) {
    if (n == 0) return;
    const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
    DISPATCH_DTYPE(dt, X, ELEMENTWISE_LAUNCH(residual_forward_kernel, X, vec, n, (X*)out, (const X*)a, (const X*)b, n));
}

extern "C" void gelu_forward(Backend* be, DType dt, void* out, const void* inp, size_t n) {
    if (n == 0) return;
    const bool vec = aligned16(out) && aligned16(inp);
    DISPATCH_DTYPE(dt, X, ELEMENTWISE_LAUNCH(gelu_forward_kernel, X, vec, n, (X*)out, (const X*)inp, n));
}

extern "C" void gelu_backward(Backend* be, DType dt, void* dinp, const void* inp, const void* dout, size_t n) {
    if (n == 0) return;
    const bool vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
    DISPATCH_DTYPE(dt, X, ELEMENTWISE_LAUNCH(gelu_backward_kernel, X, vec, n, (X*)dinp, (const X*)inp,
                                             (const X*)dout, n));
}
