// quantize.cuh: block quantization and its inverse (kernels.h: quantize_blocks). One thread block per quantized
// block: its absmax is a max (exact in any order), then each thread writes whole bytes (two nibbles at 4 bits),
// so no two threads share a byte and the bits are the CPU twin's (quantize_common.h holds the arithmetic).
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/quantize_common.h"

#define QUANT_THREADS 256

template <typename T>
__global__ void quantize_kernel(uint8_t* q, float* scales, const T* x, size_t n, int block, int bits) {
    __shared__ float shared[32];
    const size_t lo = (size_t)blockIdx.x * block, hi = lo + block < n ? lo + block : n;
    float absmax = 0.0f, nonfinite = 0.0f;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float a = fabsf(to_f(x[i]));
        if (!isfinite(a)) nonfinite = 1.0f;
        else absmax = fmaxf(absmax, a);
    }
    absmax = block_max(absmax, shared);
    nonfinite = block_sum(nonfinite, shared);
    const float s = quant_scale(absmax, nonfinite > 0.0f, bits);
    if (threadIdx.x == 0) scales[blockIdx.x] = s;
    if (bits == 8) {
        for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) ((int8_t*)q)[i] = (int8_t)quant_level(to_f(x[i]), s, bits);
        return;
    }
    for (size_t i = lo + 2 * threadIdx.x; i < hi; i += 2 * blockDim.x) {
        const uint8_t low = quant_nibble(quant_level(to_f(x[i]), s, bits));
        const uint8_t high = i + 1 < hi ? quant_nibble(quant_level(to_f(x[i + 1]), s, bits)) : 0;
        q[i / 2] = (uint8_t)(low | high << 4);
    }
}

template <typename T>
__global__ void dequantize_kernel(T* out, const uint8_t* q, const float* scales, size_t n, int block, int bits, int add) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int v = bits == 8 ? (int)((const int8_t*)q)[i] : quant_from_nibble((uint8_t)(q[i / 2] >> (4 * (i % 2))));
    const float y = (float)v * scales[i / (size_t)block];
    out[i] = from_f<T>(add ? to_f(out[i]) + y : y);
}

static void quantize_check_args(const char* what, int block, int bits) {
    if (bits != 4 && bits != 8) fail("%s: %d bits (4 or 8)", what, bits);
    if (block < 2 || (bits == 4 && block % 2)) fail("%s: blocks of %d elements (at least 2; even for 4 bits)", what, block);
}

extern "C" size_t quantized_bytes(size_t n, int bits) { return quant_bytes(n, bits); }
extern "C" size_t quantized_blocks(size_t n, int block) { return (n + (size_t)block - 1) / (size_t)block; }

extern "C" void quantize_blocks(Backend* be, DType dt, void* q, float* scales, const void* x, size_t n, int block, int bits) {
    quantize_check_args("quantize_blocks", block, bits);
    const size_t nb = quantized_blocks(n, block);
    if (nb == 0) return;
    DISPATCH_DTYPE(dt, X, quantize_kernel<X><<<(unsigned)nb, QUANT_THREADS, 0, be_stream(be)>>>((uint8_t*)q, scales, (const X*)x, n, block, bits));
    LAUNCH_CHECK();
}

extern "C" void dequantize_blocks(Backend* be, DType dt, void* out, const void* q, const float* scales, size_t n, int block,
                                  int bits, int add) {
    quantize_check_args("dequantize_blocks", block, bits);
    if (n == 0) return;
    DISPATCH_DTYPE(dt, X, dequantize_kernel<X><<<ceil_div((long long)n, QUANT_THREADS), QUANT_THREADS, 0, be_stream(be)>>>(
                              (X*)out, (const uint8_t*)q, scales, n, block, bits, add));
    LAUNCH_CHECK();
}
