// qkv_copy.cuh: the v part of packed qkv rows copied unchanged, for the launchers that transform only q and k
// (rmsnorm.cuh's qk_norm, rope.cuh).
#pragma once
#include "kernels/cuda_backend.cuh"

// The v part (the last KV*D channels) of every one of N rows of packed qkv, from src to dst.
static inline void qkv_copy_v(Backend* be, DType dt, void* dst, const void* src, int N, int NH, int KV, int D) {
    if (N == 0 || KV == 0 || D == 0) return;
    const size_t es = dtype_size(dt), pitch = (size_t)(NH + 2 * KV) * D * es, v0 = (size_t)(NH + KV) * D * es;
    CUDA_CHECK(cudaMemcpy2DAsync((char*)dst + v0, pitch, (const char*)src + v0, pitch, (size_t)KV * D * es, (size_t)N,
                                 cudaMemcpyDeviceToDevice, be_stream(be)));
}
