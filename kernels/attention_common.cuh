// attention_common.cuh: what the causal-attention kernels share (attention_mha.cuh, attention_gqa.cuh): the
// CUDA-core kernels' row and tile loads and lane-group sums, the backward's D = rowsum(dout * out) kernel, the
// tensor-core kernels' PTX wrappers (cp.async, ldmatrix, mma.sync), and the shape checks of attention.cuh.
#pragma once
#include "kernels/cuda_backend.cuh"

#define ATT_THREADS 128
#define ATT_TILE 32   // keys (forward, dq) or queries (dk/dv) per shared-memory tile

template <typename T> __device__ __forceinline__ void load8(const T* p, float* dst) {
    constexpr int P = Pack128<T>::size;
    for (int h = 0; h < 8 / P; h++) {
        const Pack128<T> v = load128(p + h * P);
        for (int k = 0; k < P; k++) dst[h * P + k] = v.get(k);
    }
}
template <typename T> __device__ __forceinline__ void store8(T* p, const float* src) {
    constexpr int P = Pack128<T>::size;
    for (int h = 0; h < 8 / P; h++) {
        Pack128<T> v;
        for (int k = 0; k < P; k++) v.set(k, src[h * P + k]);
        store128(p + h * P, v);
    }
}

// Sum over the G lanes of a group (they are consecutive and G divides 32): every lane gets the sum.
template <int G> __device__ __forceinline__ float group_sum(float x) {
    for (int o = G / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// 16 dims of row (b, t) of tensor `part` (0 = q, 1 = k, 2 = v) of head h from qkv (B,T,3C), or of
// out/dout (B,T,C) when part < 0; zeros past hs.
template <typename T>
__device__ __forceinline__ void load_row16(const T* base, int ld, int t, int col0, int d0, int hs, float* dst) {
    for (int u = 0; u < 2; u++) {
        const int d = d0 + u * 8;
        if (d < hs) load8(base + (size_t)t * ld + col0 + d, dst + u * 8);
        else
            for (int k = 0; k < 8; k++) dst[u * 8 + k] = 0.0f;
    }
}

// Cooperative load of rows [t0, t0+ATT_TILE) (zeros past T or hs) into a (ATT_TILE, HSP) fp32 tile.
template <typename T, int HSP>
__device__ __forceinline__ void load_tile(float (*tile)[HSP], const T* base, int ld, int col0, int t0, int T_, int hs) {
    constexpr int UNITS = HSP / 8;
    for (int u = threadIdx.x; u < ATT_TILE * UNITS; u += blockDim.x) {
        const int r = u / UNITS, d = (u % UNITS) * 8, t = t0 + r;
        float tmp[8];
        if (t < T_ && d < hs) load8(base + (size_t)t * ld + col0 + d, tmp);
        else
            for (int k = 0; k < 8; k++) tmp[k] = 0.0f;
        for (int k = 0; k < 8; k++) tile[r][d + k] = tmp[k];
    }
}

// D (B,NH,T) = rowsum(dout * out) per head: one thread per (b, t, h).
template <typename T>
__global__ void attention_backward_d_kernel(float* D, const T* dout, const T* out, int B, int T_, int C, int NH) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T_ * NH) return;
    const int h = idx % NH, bt = idx / NH, b = bt / T_, t = bt % T_;
    const int hs = C / NH;
    const size_t off = (size_t)bt * C + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d += 8) {
        float a[8], c[8];
        load8(dout + off + d, a);
        load8(out + off + d, c);
        for (int k = 0; k < 8; k++) s += a[k] * c[k];
    }
    D[((size_t)b * NH + h) * T_ + t] = s;
}

// ---------------------------------------------------------------------------------------------------
// The tensor-core kernels' primitives.
#define FA_BT 64          // rows per streamed tile
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
// Warps per block (16 owned rows each); reports/perf_notes.md compares other counts.
#define FA_WARPS 4

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes global -> shared, asynchronous; zero-fills when !valid (gmem must still be a valid address).
// Under the kernel emulator (tests/emu, -DGPT_EMU) each PTX wrapper calls the emulator's instruction instead.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#ifdef GPT_EMU
    emu_ptx_cp_async_cg16(smem_u32(smem), gmem, valid ? 16 : 0);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef GPT_EMU
    emu_ptx_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef GPT_EMU
    emu_ptx_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
#ifdef GPT_EMU
    emu_ptx_ldmatrix_x4(r, smem_u32(p), false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const void* p) {
#ifdef GPT_EMU
    emu_ptx_ldmatrix_x4(r, smem_u32(p), true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
#endif
}

// c (16x8 fp32) += a (16x16, row) * b (16x8, col).
template <typename T> __device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#ifdef GPT_EMU
    emu_ptx_mma_m16n8k16_bf16(c, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <> __device__ __forceinline__ void mma16816<__half>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#ifdef GPT_EMU
    emu_ptx_mma_m16n8k16_f16(c, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// Two floats rounded to T, `lo` in the low half (the lower column of an mma fragment pair).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    T v[2] = {from_f<T>(lo), from_f<T>(hi)};
    uint32_t r;
    memcpy(&r, v, 4);
    return r;
}

// ---------------------------------------------------------------------------------------------------
// Shapes.

// Fails, naming the problem, on a shape no attention kernel of this backend takes.
static inline void attention_check_shape(int NH, int KV, int hs, const char* who) {
    if (NH <= 0 || KV <= 0 || NH % KV != 0) fail("%s: NH=%d query heads do not share KV=%d kv heads evenly", who, NH, KV);
    if (hs <= 0 || hs % 8 != 0 || hs > 128) fail("%s: head size %d must be a multiple of 8 and at most 128", who, hs);
}

// G, the lanes that own a row in the CUDA-core kernels (16 head dims each).
static inline int attention_lane_group(int hs) { return hs <= 16 ? 1 : hs <= 32 ? 2 : hs <= 64 ? 4 : 8; }

// Run `body` with the constant GG = G, the lane group of attention_lane_group.
#define ATT_DISPATCH_G(G, ...)                                                                           \
    do {                                                                                                 \
        switch (G) {                                                                                     \
        case 1: { constexpr int GG = 1; __VA_ARGS__; } break;                                            \
        case 2: { constexpr int GG = 2; __VA_ARGS__; } break;                                            \
        case 4: { constexpr int GG = 4; __VA_ARGS__; } break;                                            \
        default: { constexpr int GG = 8; __VA_ARGS__; } break;                                           \
        }                                                                                                \
    } while (0)
