// lora_dropout.cuh: LoRA's dropout on the adapters' input (kernels.h). One element per thread: the mask is a
// hash per element, so a thread's work is its hash, one load and one store.
#pragma once
#include "kernels/cuda_backend.cuh"

template <typename T>
__global__ void lora_dropout_kernel(T* out, const T* inp, int N, int C, int col0, int width, uint32_t key, float p,
                                    float scale) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    const size_t n = i / (size_t)C, c = i % (size_t)C;
    const uint64_t index = (uint64_t)n * (uint64_t)width + (uint64_t)col0 + c;
    out[i] = from_f<T>(dropout_keeps(key, index, p) ? to_f(inp[i]) * scale : 0.0f);
}

extern "C" void lora_dropout(Backend* be, DType dt, void* out, const void* inp, int N, int C, int col0, int width,
                             uint32_t key, float p) {
    const size_t n = (size_t)N * C;
    if (n == 0) return;
    const float scale = 1.0f / (1.0f - p);   // on the host, as the CPU twin computes it
    const int block = 256;
    DISPATCH_DTYPE(dt, X, lora_dropout_kernel<X><<<ceil_div((long long)n, block), block, 0, be_stream(be)>>>(
                              (X*)out, (const X*)inp, N, C, col0, width, key, p, scale));
    LAUNCH_CHECK();
}
