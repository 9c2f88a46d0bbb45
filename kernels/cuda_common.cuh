// cuda_common.cuh: error checks, storage-type load/store, 16-byte packs and block reductions shared by the CUDA
// kernels, which include it through kernels/cuda_backend.cuh (all of them in backend_cuda.cu, the one CUDA
// translation unit).
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <string.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"

// Every runtime / cuBLASLt call goes through these: a failure is one line naming the call and the place.
#define CUDA_CHECK(call)                                                                                 \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess)                                                                           \
            fail("CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__, cudaGetErrorString(e_), #call);     \
    } while (0)
#define CUBLAS_CHECK(call)                                                                               \
    do {                                                                                                 \
        cublasStatus_t s_ = (call);                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                 \
            fail("cuBLASLt error at %s:%d: %s (%s)", __FILE__, __LINE__, cublasLtGetStatusString(s_), #call); \
    } while (0)
// After every kernel launch: catches bad launch configurations at the launch, not at the next sync.
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

static inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// ---------------------------------------------------------------------------------------------------
// fp32 <-> storage type. The intrinsics round to nearest even, with fp16 subnormals and overflow to inf,
// so they store the same bits as dtype.h's bf16_from_f32 / fp16_from_f32 for every non-NaN value.
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

// The value a store would keep, as fp32 (so a fused kernel can use what the unfused pair would reread).
template <typename T> __device__ __forceinline__ float round_f(float x) { return to_f(from_f<T>(x)); }

// ---------------------------------------------------------------------------------------------------
// 16 bytes of T: 4 floats or 8 halves. Loads/stores go through int4 so they compile to one 128-bit access;
// callers guarantee 16-byte alignment.
template <typename T> struct alignas(16) Pack128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
    __device__ __forceinline__ float get(int i) const { return to_f(v[i]); }
    __device__ __forceinline__ void set(int i, float x) { v[i] = from_f<T>(x); }
};

template <typename T> __device__ __forceinline__ Pack128<T> load128(const T* p) {
    int4 raw = *reinterpret_cast<const int4*>(p);
    Pack128<T> r;
    memcpy(&r, &raw, 16);
    return r;
}
// Streaming load: data read once should not evict what is reused from L2.
template <typename T> __device__ __forceinline__ Pack128<T> load128cs(const T* p) {
    int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
    Pack128<T> r;
    memcpy(&r, &raw, 16);
    return r;
}
template <typename T> __device__ __forceinline__ void store128(T* p, const Pack128<T>& x) {
    int4 raw;
    memcpy(&raw, &x, 16);
    *reinterpret_cast<int4*>(p) = raw;
}

// P consecutive elements to or from fp32: one 16-byte access when P is the pack size (p then 16-byte aligned),
// else P scalar ones. Lets one kernel body serve aligned rows (P = pack) and any other shape (P = 1).
template <int P, typename T> __device__ __forceinline__ void load_f(float (&f)[P], const T* p) {
    if constexpr (P == Pack128<T>::size) {
        const Pack128<T> v = load128(p);
        for (int k = 0; k < P; k++) f[k] = v.get(k);
    } else {
        for (int k = 0; k < P; k++) f[k] = to_f(p[k]);
    }
}
template <int P, typename T> __device__ __forceinline__ void store_f(T* p, const float (&f)[P]) {
    if constexpr (P == Pack128<T>::size) {
        Pack128<T> v;
        for (int k = 0; k < P; k++) v.set(k, f[k]);
        store128(p, v);
    } else {
        for (int k = 0; k < P; k++) p[k] = from_f<T>(f[k]);
    }
}

static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

// ---------------------------------------------------------------------------------------------------
// Warp / block reductions in a fixed order (butterfly), so a sum has the same bits on every run.
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
// All threads of the block get the sum. `shared` holds >= 32 floats; blockDim.x a multiple of 32.
__device__ __forceinline__ float block_sum(float x, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_sum(x);
    __syncthreads();   // `shared` may still be read by a previous call
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < nwarps ? shared[lane] : -INFINITY;
    return warp_max(x);
}

// ---------------------------------------------------------------------------------------------------
// Run `body` with T bound to the C++ storage type of a DType.
#define DISPATCH_DTYPE(dt, T, ...)                                                                       \
    do {                                                                                                 \
        switch (dt) {                                                                                    \
        case DT_FP32: { typedef float T; __VA_ARGS__; } break;                                           \
        case DT_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                                   \
        case DT_FP16: { typedef __half T; __VA_ARGS__; } break;                                          \
        default: fail("unknown dtype %d at %s:%d", (int)(dt), __FILE__, __LINE__);                      \
        }                                                                                                \
    } while (0)

#define GELU_SCALING_FACTOR 0.7978845608028654f   // sqrt(2/pi)
__device__ __forceinline__ float gelu_f(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
    float cube = 0.044715f * x * x * x;
    float t = tanhf(GELU_SCALING_FACTOR * (x + cube));
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}
