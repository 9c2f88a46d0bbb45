// attention_mha.cuh: multi-head (KV == NH) causal self-attention kernels, flash-attention style.
// Nothing of size (T,T) ever exists: the forward streams key/value tiles through shared memory with an
// online softmax and saves only lse = log-sum-exp of each query's scaled scores; the backward recomputes
// the probabilities from lse (FA2): P = exp(s - lse), dS = P (dP - D), D = rowsum(dout * out).
// The backward is two kernels so every output has one owner: a query-major pass for dq and a key-major
// pass for dk, dv (no atomics, deterministic).
//
// Work split: a query (or key) row is owned by a group of G consecutive lanes, each holding 16 of its
// head dimensions in registers (G = 1,2,4,8 covers hs up to 16,32,64,128; dims past hs are zero). Dot
// products are 16 FMAs per lane plus a log2(G) butterfly over the group.
// These CUDA-core kernels are correct for every hs % 8 == 0 up to 128; the tensor-core (mma.sync,
// FlashAttention-2) kernels further down take hs = 64 in bf16/fp16. Which runs is attention.cuh's choice.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/attention_common.cuh"

// grid (ceil(T/QB), B*NH), block ATT_THREADS; QB = ATT_THREADS/G queries per block.
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) attention_forward_kernel(T* out, float* lse, const T* qkv, int B, int T_,
                                                                        int C, int NH) {
    constexpr int HSP = 16 * G, QB = ATT_THREADS / G;
    __shared__ float ks[ATT_TILE][HSP], vs[ATT_TILE][HSP];
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int g = threadIdx.x % G, i = blockIdx.x * QB + threadIdx.x / G;
    const int d0 = g * 16;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    float q[16], o[16];
    if (i < T_) load_row16(base, 3 * C, i, h * hs, d0, hs, q);
    else
        for (int k = 0; k < 16; k++) q[k] = 0.0f;
    for (int k = 0; k < 16; k++) o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int last_q = min(T_ - 1, blockIdx.x * QB + QB - 1);
    for (int t0 = 0; t0 <= last_q; t0 += ATT_TILE) {
        __syncthreads();   // the previous tile is no longer read
        load_tile<T, HSP>(ks, base, 3 * C, C + h * hs, t0, T_, hs);
        load_tile<T, HSP>(vs, base, 3 * C, 2 * C + h * hs, t0, T_, hs);
        __syncthreads();
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += q[k] * ks[jj][d0 + k];
            s = group_sum<G>(s) * scale;
            if (t0 + jj > i || i >= T_) continue;   // causal mask (after the shuffle: all lanes took part)
            if (s > m) {
                const float corr = expf(m - s);
                l *= corr;
                for (int k = 0; k < 16; k++) o[k] *= corr;
                m = s;
            }
            const float p = expf(s - m);
            l += p;
            for (int k = 0; k < 16; k++) o[k] += p * vs[jj][d0 + k];
        }
    }
    if (i >= T_) return;
    const float inv = 1.0f / l;
    for (int k = 0; k < 16; k++) o[k] *= inv;
    T* orow = out + ((size_t)b * T_ + i) * C + h * hs;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < hs) store8(orow + d0 + u * 8, o + u * 8);
    if (g == 0) lse[(size_t)bh * T_ + i] = m + logf(l);
}

// dq (in dqkv's q part): query-major, like the forward. dq_i = scale * sum_j dS_ij k_j.
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) attention_backward_dq_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                            const float* lse, const float* D, int B,
                                                                            int T_, int C, int NH) {
    constexpr int HSP = 16 * G, QB = ATT_THREADS / G;
    __shared__ float ks[ATT_TILE][HSP], vs[ATT_TILE][HSP];
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int g = threadIdx.x % G, i = blockIdx.x * QB + threadIdx.x / G;
    const int d0 = g * 16;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    float q[16], dov[16], dq[16];
    float lse_i = 0.0f, D_i = 0.0f;
    if (i < T_) {
        load_row16(base, 3 * C, i, h * hs, d0, hs, q);
        load_row16(dout + (size_t)b * T_ * C, C, i, h * hs, d0, hs, dov);
        lse_i = lse[(size_t)bh * T_ + i];
        D_i = D[(size_t)bh * T_ + i];
    } else {
        for (int k = 0; k < 16; k++) q[k] = dov[k] = 0.0f;
    }
    for (int k = 0; k < 16; k++) dq[k] = 0.0f;
    const int last_q = min(T_ - 1, blockIdx.x * QB + QB - 1);
    for (int t0 = 0; t0 <= last_q; t0 += ATT_TILE) {
        __syncthreads();
        load_tile<T, HSP>(ks, base, 3 * C, C + h * hs, t0, T_, hs);
        load_tile<T, HSP>(vs, base, 3 * C, 2 * C + h * hs, t0, T_, hs);
        __syncthreads();
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float s = 0.0f, dp = 0.0f;
            for (int k = 0; k < 16; k++) {
                s += q[k] * ks[jj][d0 + k];
                dp += dov[k] * vs[jj][d0 + k];
            }
            s = group_sum<G>(s) * scale;
            dp = group_sum<G>(dp);
            if (t0 + jj > i || i >= T_) continue;
            const float ds = expf(s - lse_i) * (dp - D_i);
            for (int k = 0; k < 16; k++) dq[k] += ds * ks[jj][d0 + k];
        }
    }
    if (i >= T_) return;
    for (int k = 0; k < 16; k++) dq[k] *= scale;
    T* row = dqkv + ((size_t)b * T_ + i) * 3 * C + h * hs;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < hs) store8(row + d0 + u * 8, dq + u * 8);
}

// dk, dv (in dqkv's k and v parts): key-major. dv_j = sum_i P_ij dout_i, dk_j = scale * sum_i dS_ij q_i.
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) attention_backward_dkdv_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                              const float* lse, const float* D, int B,
                                                                              int T_, int C, int NH) {
    constexpr int HSP = 16 * G, KB = ATT_THREADS / G;
    __shared__ float qs[ATT_TILE][HSP], dos[ATT_TILE][HSP];
    __shared__ float lses[ATT_TILE], Ds[ATT_TILE];
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int g = threadIdx.x % G, j = blockIdx.x * KB + threadIdx.x / G;
    const int d0 = g * 16;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const T* dbase = dout + (size_t)b * T_ * C;
    const float scale = 1.0f / sqrtf((float)hs);
    float kr[16], vr[16], dk[16], dv[16];
    if (j < T_) {
        load_row16(base, 3 * C, j, C + h * hs, d0, hs, kr);
        load_row16(base, 3 * C, j, 2 * C + h * hs, d0, hs, vr);
    } else {
        for (int k = 0; k < 16; k++) kr[k] = vr[k] = 0.0f;
    }
    for (int k = 0; k < 16; k++) dk[k] = dv[k] = 0.0f;
    const int first_j = blockIdx.x * KB;
    // Queries before the block's first key see none of its keys.
    for (int t0 = first_j / ATT_TILE * ATT_TILE; t0 < T_; t0 += ATT_TILE) {
        __syncthreads();
        load_tile<T, HSP>(qs, base, 3 * C, h * hs, t0, T_, hs);
        load_tile<T, HSP>(dos, dbase, C, h * hs, t0, T_, hs);
        for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
            const int t = t0 + r;
            lses[r] = t < T_ ? lse[(size_t)bh * T_ + t] : 0.0f;
            Ds[r] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
        }
        __syncthreads();
        for (int ii = 0; ii < ATT_TILE; ii++) {
            float s = 0.0f, dp = 0.0f;
            for (int k = 0; k < 16; k++) {
                s += qs[ii][d0 + k] * kr[k];
                dp += dos[ii][d0 + k] * vr[k];
            }
            s = group_sum<G>(s) * scale;
            dp = group_sum<G>(dp);
            const int i = t0 + ii;
            if (i < j || i >= T_ || j >= T_) continue;
            const float p = expf(s - lses[ii]);
            const float ds = p * (dp - Ds[ii]);
            for (int k = 0; k < 16; k++) {
                dv[k] += p * dos[ii][d0 + k];
                dk[k] += ds * qs[ii][d0 + k];
            }
        }
    }
    if (j >= T_) return;
    for (int k = 0; k < 16; k++) dk[k] *= scale;
    T* row = dqkv + ((size_t)b * T_ + j) * 3 * C + h * hs;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < hs) {
            store8(row + C + d0 + u * 8, dk + u * 8);
            store8(row + 2 * C + d0 + u * 8, dv + u * 8);
        }
}

// ---------------------------------------------------------------------------------------------------
// Tensor-core path for hs = 64 and 16-bit storage: FlashAttention-2 on register-level mma.sync
// (m16n8k16, fp32 accumulation). Each warp owns 16 rows (queries, or keys in the dk/dv kernel); its
// A operands stay in registers for the whole kernel; the streamed tiles (64 rows x 64 dims) are
// double-buffered through shared memory with cp.async (rows past T are zero-filled) and read with
// ldmatrix (rows padded to 72 elements: conflict-free). A product's fp32 accumulators are re-packed in
// registers as the next product's A operand (P, dS), rounded to T as the CUDA-core path's products are.
// Causal tiles above a warp's diagonal are skipped; only tiles crossing it (or T) are masked.
// Backward (FA2, deterministic, no atomics): a query-major kernel computes D = rowsum(dout * out) for its
// rows (into `scratch`) and dq; then a key-major kernel accumulates dk, dv per key block in registers.
#define FA_HS 64
#define FA_LD 72          // padded shared-memory row (elements): 144 bytes, ldmatrix without bank conflicts

// Rows [t0, t0+ROWS) of a 64-wide head slice (row stride ld elements) -> shared tile, asynchronously.
template <typename T, int ROWS, int W>
__device__ __forceinline__ void fa_load_tile(T* s, const T* base, size_t ld, int t0, int T_) {
    for (int u = threadIdx.x; u < ROWS * 8; u += W * 32) {
        const int r = u >> 3, c = (u & 7) * 8, t = t0 + r;
        const bool ok = t < T_;
        cp_async16(s + r * FA_LD + c, base + (size_t)(ok ? t : 0) * ld + c, ok);
    }
}
// A fragments (16 rows x 64 dims, 4 k-steps) of the rows [row0, row0+16) of a shared tile.
__device__ __forceinline__ void fa_load_a(uint32_t (*a)[4], const void* tile, int row0) {
    const int lane = threadIdx.x % 32;
    const unsigned short* s = (const unsigned short*)tile;
    for (int kk = 0; kk < 4; kk++) ldsm_x4(a[kk], s + (row0 + (lane & 15)) * FA_LD + kk * 16 + (lane >> 4) * 8);
}
// acc (16 x NT*8) += A (16 x 64 dims, registers) * tile[n][dims]^T for tile rows [n0, n0+NT*8).
template <typename T, int NT>
__device__ __forceinline__ void fa_mma_abt(float (*acc)[4], const uint32_t (*a)[4], const T* tile, int n0) {
    const int lane = threadIdx.x % 32;
    for (int np = 0; np < NT / 2; np++)
        for (int kk = 0; kk < 4; kk++) {
            uint32_t b[4];
            ldsm_x4(b, tile + (n0 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma16816<T>(acc[2 * np], a[kk], b[0], b[1]);
            mma16816<T>(acc[2 * np + 1], a[kk], b[2], b[3]);
        }
}
// acc (16 x 64 dims) += A (16 x KS*16, registers) * tile[k0 + k][dims] (rows k of the tile are the k index).
template <typename T, int KS>
__device__ __forceinline__ void fa_mma_ab(float (*acc)[4], const uint32_t (*a)[4], const T* tile, int k0) {
    const int lane = threadIdx.x % 32;
    for (int kk = 0; kk < KS; kk++)
        for (int dp = 0; dp < 4; dp++) {
            uint32_t b[4];
            ldsm_x4_t(b, tile + (k0 + kk * 16 + (lane & 15)) * FA_LD + dp * 16 + (lane >> 4) * 8);
            mma16816<T>(acc[2 * dp], a[kk], b[0], b[1]);
            mma16816<T>(acc[2 * dp + 1], a[kk], b[2], b[3]);
        }
}
// Accumulators acc (16 rows x 64 dims, times mul) -> T rows [row0, row0+16) of `stage` (the warp's own
// rows of a shared tile) -> global rows (coalesced 16-byte stores), rows < T_ only.
template <typename T>
__device__ __forceinline__ void fa_store_rows(const float (*acc)[4], float mul, T* stage, int row0, T* dst, size_t ld,
                                              int t0, int T_) {
    const int lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    uint32_t* s32 = (uint32_t*)stage;
    for (int n = 0; n < 8; n++) {
        s32[((row0 + g) * FA_LD + n * 8 + 2 * tq) / 2] = pack2<T>(acc[n][0] * mul, acc[n][1] * mul);
        s32[((row0 + g + 8) * FA_LD + n * 8 + 2 * tq) / 2] = pack2<T>(acc[n][2] * mul, acc[n][3] * mul);
    }
    __syncwarp();
    for (int u = lane; u < 128; u += 32) {
        const int r = u >> 3, c = (u & 7) * 8, t = t0 + r;
        if (t < T_) *reinterpret_cast<int4*>(dst + (size_t)t * ld + c) = *reinterpret_cast<const int4*>(stage + (row0 + r) * FA_LD + c);
    }
}

template <int W> constexpr int fa_fwd_smem() { return (W * 16 + 4 * FA_BT) * FA_LD * 2; }
template <typename T, int W>
__global__ void __launch_bounds__(W * 32) attention_forward_fa_kernel(T* out, float* lse, const T* qkv, int T_,
                                                                             int C, int NH) {
    constexpr int BR = W * 16;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* Qs = reinterpret_cast<T*>(fa_smem);   // BR rows
    T* Ks = Qs + BR * FA_LD;                 // 2 stages
    T* Vs = Ks + 2 * FA_BT * FA_LD;          // 2 stages
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;   // the longest rows first: better tail balance
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * BR, r0 = q0 + warp * 16;   // block's and warp's first query
    const size_t ld = (size_t)3 * C;
    const T* qbase = qkv + (size_t)b * T_ * ld + h * FA_HS;
    const T* kbase = qbase + C;
    const T* vbase = qbase + 2 * C;
    const int ntiles = (min(T_, q0 + BR) - 1) / FA_BT + 1;
    const float sl2 = FA_LOG2E / sqrtf((float)FA_HS);   // scores in log2 units

    fa_load_tile<T, BR, W>(Qs, qbase, ld, q0, T_);
    fa_load_tile<T, FA_BT, W>(Ks, kbase, ld, 0, T_);
    fa_load_tile<T, FA_BT, W>(Vs, vbase, ld, 0, T_);
    cp_async_commit();

    uint32_t qf[4][4];
    float o[8][4];
    for (int n = 0; n < 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // rows g, g+8: running max (log2 units), partial sum

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {
            const int st = (j + 1) & 1;
            fa_load_tile<T, FA_BT, W>(Ks + st * FA_BT * FA_LD, kbase, ld, (j + 1) * FA_BT, T_);
            fa_load_tile<T, FA_BT, W>(Vs + st * FA_BT * FA_LD, vbase, ld, (j + 1) * FA_BT, T_);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) fa_load_a(qf, Qs, warp * 16);
        const int k0 = j * FA_BT;
        // Tiles start at multiples of 16, so a tile the warp does not skip holds key k0 <= r0 <= every row:
        // each row has a finite maximum.
        if (k0 <= r0 + 15) {
            const T* Kt = Ks + (j & 1) * FA_BT * FA_LD;
            const T* Vt = Vs + (j & 1) * FA_BT * FA_LD;
            float s[8][4];
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            fa_mma_abt<T, 8>(s, qf, Kt, 0);
            if (k0 + FA_BT - 1 > r0) {   // the tile crosses the warp's diagonal (keys past T are past it too)
                for (int n = 0; n < 8; n++)
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * tq + (e & 1) > r0 + g + (e >> 1) * 8) s[n][e] = -INFINITY;
            }
            float corr[2];
            for (int i = 0; i < 2; i++) {
                float mx = -INFINITY;
                for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[i], mx * sl2);
                corr[i] = exp2f(m[i] - mnew);
                m[i] = mnew;
                l[i] *= corr[i];
            }
            for (int n = 0; n < 8; n++) {
                o[n][0] *= corr[0], o[n][1] *= corr[0];
                o[n][2] *= corr[1], o[n][3] *= corr[1];
            }
            uint32_t pa[4][4];   // P as A fragments: key k-step n/2, halves by n parity
            for (int n = 0; n < 8; n++) {
                const float p0 = exp2f(fmaf(s[n][0], sl2, -m[0])), p1 = exp2f(fmaf(s[n][1], sl2, -m[0]));
                const float p2 = exp2f(fmaf(s[n][2], sl2, -m[1])), p3 = exp2f(fmaf(s[n][3], sl2, -m[1]));
                l[0] += p0 + p1;
                l[1] += p2 + p3;
                pa[n / 2][(n & 1) * 2 + 0] = pack2<T>(p0, p1);
                pa[n / 2][(n & 1) * 2 + 1] = pack2<T>(p2, p3);
            }
            fa_mma_ab<T, 4>(o, pa, Vt, 0);
        }
        __syncthreads();   // the stage read here is refilled next iteration
    }
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const float inv0 = 1.0f / l[0], inv1 = 1.0f / l[1];
    for (int n = 0; n < 8; n++) {
        o[n][0] *= inv0, o[n][1] *= inv0;
        o[n][2] *= inv1, o[n][3] *= inv1;
    }
    // The warp's own Q rows are free (only this warp read them): stage the output there.
    fa_store_rows<T>(o, 1.0f, Qs, warp * 16, out + (size_t)b * T_ * C + h * FA_HS, (size_t)C, r0, T_);
    if (tq == 0) {
        if (r0 + g < T_) lse[(size_t)bh * T_ + r0 + g] = (m[0] + log2f(l[0])) * FA_LN2;
        if (r0 + g + 8 < T_) lse[(size_t)bh * T_ + r0 + g + 8] = (m[1] + log2f(l[1])) * FA_LN2;
    }
}

template <typename T, int W> static void fa_forward(Backend* be, T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_fa_kernel<T, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    fa_fwd_smem<W>()));
    const dim3 grid(ceil_div(T_, W * 16), B * NH);
    attention_forward_fa_kernel<T, W><<<grid, W * 32, fa_fwd_smem<W>(), be_stream(be)>>>(out, lse, qkv, T_, C, NH);
    LAUNCH_CHECK();
}

// dq = scale * sum_j dS_ij k_j, query-major like the forward; also D = rowsum(dout * out) for its rows.
// S and dP are formed 32 keys at a time (fewer live registers).
template <int W> constexpr int fa_dq_smem() { return (2 * W * 16 + 4 * FA_BT) * FA_LD * 2; }
template <typename T, int W>
__global__ void __launch_bounds__(W * 32) attention_backward_dq_fa_kernel(T* dqkv, float* D, const T* qkv,
                                                                                 const T* dout, const T* out,
                                                                                 const float* lse, int T_, int C, int NH) {
    constexpr int BR = W * 16;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* Qs = reinterpret_cast<T*>(fa_smem);   // BR rows
    T* dOs = Qs + BR * FA_LD;                // BR rows
    T* Ks = dOs + BR * FA_LD;                // 2 stages
    T* Vs = Ks + 2 * FA_BT * FA_LD;          // 2 stages
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * BR, r0 = q0 + warp * 16;
    const size_t ld = (size_t)3 * C;
    const T* qbase = qkv + (size_t)b * T_ * ld + h * FA_HS;
    const T* kbase = qbase + C;
    const T* vbase = qbase + 2 * C;
    const T* dobase = dout + (size_t)b * T_ * C + h * FA_HS;
    const int ntiles = (min(T_, q0 + BR) - 1) / FA_BT + 1;
    const float scale = 1.0f / sqrtf((float)FA_HS), sl2 = scale * FA_LOG2E;

    fa_load_tile<T, BR, W>(Qs, qbase, ld, q0, T_);
    fa_load_tile<T, BR, W>(dOs, dobase, (size_t)C, q0, T_);
    fa_load_tile<T, FA_BT, W>(Ks, kbase, ld, 0, T_);
    fa_load_tile<T, FA_BT, W>(Vs, vbase, ld, 0, T_);
    cp_async_commit();

    // D for the warp's 16 rows: two lanes per row, 32 dims each, straight from global memory.
    float Dv;
    {
        const int t = r0 + (lane >> 1), d0 = (lane & 1) * 32;
        float acc = 0.0f;
        if (t < T_) {
            const size_t off = ((size_t)b * T_ + t) * C + h * FA_HS + d0;
            for (int u = 0; u < 4; u++) {
                float a[8], c[8];
                load8(dout + off + u * 8, a);
                load8(out + off + u * 8, c);
                for (int k = 0; k < 8; k++) acc += a[k] * c[k];
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (t < T_ && (lane & 1) == 0) D[(size_t)bh * T_ + t] = acc;
        Dv = acc;
    }
    const float D0 = __shfl_sync(0xffffffffu, Dv, 2 * g), D1 = __shfl_sync(0xffffffffu, Dv, 2 * g + 16);
    const float lse0 = r0 + g < T_ ? lse[(size_t)bh * T_ + r0 + g] * FA_LOG2E : 0.0f;
    const float lse1 = r0 + g + 8 < T_ ? lse[(size_t)bh * T_ + r0 + g + 8] * FA_LOG2E : 0.0f;

    uint32_t qf[4][4], df[4][4];
    float dq[8][4];
    for (int n = 0; n < 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {
            const int st = (j + 1) & 1;
            fa_load_tile<T, FA_BT, W>(Ks + st * FA_BT * FA_LD, kbase, ld, (j + 1) * FA_BT, T_);
            fa_load_tile<T, FA_BT, W>(Vs + st * FA_BT * FA_LD, vbase, ld, (j + 1) * FA_BT, T_);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
            fa_load_a(qf, Qs, warp * 16);
            fa_load_a(df, dOs, warp * 16);
        }
        const T* Kt = Ks + (j & 1) * FA_BT * FA_LD;
        const T* Vt = Vs + (j & 1) * FA_BT * FA_LD;
        for (int hc = 0; hc < 2; hc++) {
            const int k0 = j * FA_BT + hc * 32;
            if (k0 > r0 + 15) continue;   // every key of the chunk is past every row of the warp
            float s[4][4], dp[4][4];
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            fa_mma_abt<T, 4>(s, qf, Kt, hc * 32);
            fa_mma_abt<T, 4>(dp, df, Vt, hc * 32);
            const bool mask = k0 + 31 > r0;
            uint32_t dsa[2][4];
            for (int n = 0; n < 4; n++) {
                float ds[4];
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + g + (e >> 1) * 8, key = k0 + n * 8 + 2 * tq + (e & 1);
                    const float p = (mask && key > row) ? 0.0f : exp2f(fmaf(s[n][e], sl2, -(e >> 1 ? lse1 : lse0)));
                    ds[e] = p * (dp[n][e] - (e >> 1 ? D1 : D0));
                }
                dsa[n / 2][(n & 1) * 2 + 0] = pack2<T>(ds[0], ds[1]);
                dsa[n / 2][(n & 1) * 2 + 1] = pack2<T>(ds[2], ds[3]);
            }
            fa_mma_ab<T, 2>(dq, dsa, Kt, hc * 32);
        }
        __syncthreads();
    }
    fa_store_rows<T>(dq, scale, Qs, warp * 16, dqkv + (size_t)b * T_ * ld + h * FA_HS, ld, r0, T_);
}

// dk, dv: key-major. The block owns 64 keys (16 per warp, K and V rows as A fragments in registers) and
// streams query tiles (Q, dO, lse, D) from its first key on: S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T -
// lse), dS^T = P^T (dP^T - D); dv += P^T dO, dk += dS^T Q. 32 queries at a time.
template <int W> constexpr int fa_dkv_smem() { return (2 * W * 16 + 4 * FA_BT) * FA_LD * 2 + 4 * FA_BT * 4; }
template <typename T, int W>
__global__ void __launch_bounds__(W * 32) attention_backward_dkdv_fa_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                                   const float* lse, const float* D,
                                                                                   int T_, int C, int NH) {
    constexpr int BK = W * 16;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* Kb = reinterpret_cast<T*>(fa_smem);   // BK rows
    T* Vb = Kb + BK * FA_LD;                 // BK rows
    T* Qs = Vb + BK * FA_LD;                 // 2 stages
    T* dOs = Qs + 2 * FA_BT * FA_LD;         // 2 stages
    float* Ls = reinterpret_cast<float*>(dOs + 2 * FA_BT * FA_LD);   // 2 stages of lse * log2(e)
    float* Ds = Ls + 2 * FA_BT;                                       // 2 stages of D
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int kb = blockIdx.x;   // the first key blocks see the most queries: scheduled first
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = kb * BK, kw = k0 + warp * 16;   // block's and warp's first key
    const size_t ld = (size_t)3 * C;
    const T* qbase = qkv + (size_t)b * T_ * ld + h * FA_HS;
    const T* dobase = dout + (size_t)b * T_ * C + h * FA_HS;
    const float* lrow = lse + (size_t)bh * T_;
    const float* drow = D + (size_t)bh * T_;
    const int jt0 = k0 / FA_BT, ntiles = (T_ - 1) / FA_BT + 1;
    const float scale = 1.0f / sqrtf((float)FA_HS), sl2 = scale * FA_LOG2E;

    fa_load_tile<T, BK, W>(Kb, qbase + C, ld, k0, T_);
    fa_load_tile<T, BK, W>(Vb, qbase + 2 * C, ld, k0, T_);
    cp_async_commit();
    auto load_q = [&](int j, int st) {
        fa_load_tile<T, FA_BT, W>(Qs + st * FA_BT * FA_LD, qbase, ld, j * FA_BT, T_);
        fa_load_tile<T, FA_BT, W>(dOs + st * FA_BT * FA_LD, dobase, (size_t)C, j * FA_BT, T_);
        for (int r = threadIdx.x; r < FA_BT; r += W * 32) {   // plain loads: visible after the barrier
            const int t = j * FA_BT + r;
            Ls[st * FA_BT + r] = t < T_ ? lrow[t] * FA_LOG2E : 0.0f;
            Ds[st * FA_BT + r] = t < T_ ? drow[t] : 0.0f;
        }
        cp_async_commit();
    };
    load_q(jt0, 0);

    uint32_t kf[4][4], vf[4][4];
    float dk[8][4], dv[8][4];
    for (int n = 0; n < 8; n++)
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int j = jt0; j < ntiles; j++) {
        const int st = (j - jt0) & 1;
        if (j + 1 < ntiles) {
            load_q(j + 1, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == jt0) {
            fa_load_a(kf, Kb, warp * 16);
            fa_load_a(vf, Vb, warp * 16);
        }
        const T* Qt = Qs + st * FA_BT * FA_LD;
        const T* dOt = dOs + st * FA_BT * FA_LD;
        const float* Lt = Ls + st * FA_BT;
        const float* Dt = Ds + st * FA_BT;
        for (int hc = 0; hc < 2; hc++) {
            const int c0 = j * FA_BT + hc * 32;   // first query of the chunk
            if (c0 + 31 < kw) continue;          // every query of the chunk is before every key of the warp
            float s[4][4], dp[4][4];
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            fa_mma_abt<T, 4>(s, kf, Qt, hc * 32);
            fa_mma_abt<T, 4>(dp, vf, dOt, hc * 32);
            const bool mask = c0 < kw + 15 || c0 + 31 >= T_;
            uint32_t pa[2][4], dsa[2][4];
            for (int n = 0; n < 4; n++) {
                float p[4], ds[4];
                for (int e = 0; e < 4; e++) {
                    const int col = hc * 32 + n * 8 + 2 * tq + (e & 1), key = kw + g + (e >> 1) * 8, q = j * FA_BT + col;
                    p[e] = (mask && (q < key || q >= T_)) ? 0.0f : exp2f(fmaf(s[n][e], sl2, -Lt[col]));
                    ds[e] = p[e] * (dp[n][e] - Dt[col]);
                }
                pa[n / 2][(n & 1) * 2 + 0] = pack2<T>(p[0], p[1]);
                pa[n / 2][(n & 1) * 2 + 1] = pack2<T>(p[2], p[3]);
                dsa[n / 2][(n & 1) * 2 + 0] = pack2<T>(ds[0], ds[1]);
                dsa[n / 2][(n & 1) * 2 + 1] = pack2<T>(ds[2], ds[3]);
            }
            fa_mma_ab<T, 2>(dv, pa, dOt, hc * 32);
            fa_mma_ab<T, 2>(dk, dsa, Qt, hc * 32);
        }
        __syncthreads();
    }
    // The warp's own rows of Kb / Vb are free (only this warp read them): stage dk, dv there.
    T* dst = dqkv + (size_t)b * T_ * ld + h * FA_HS;
    fa_store_rows<T>(dk, scale, Kb, warp * 16, dst + C, ld, kw, T_);
    fa_store_rows<T>(dv, 1.0f, Vb, warp * 16, dst + 2 * C, ld, kw, T_);
}

template <typename T, int W>
static void fa_backward(Backend* be, T* dqkv, float* D, const T* dout, const T* qkv, const T* out, const float* lse,
                        int B, int T_, int C, int NH) {
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_fa_kernel<T, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    fa_dq_smem<W>()));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkdv_fa_kernel<T, W>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, fa_dkv_smem<W>()));
    const dim3 grid(ceil_div(T_, W * 16), B * NH);
    // dq first: it writes D, which the dk/dv kernel reads.
    attention_backward_dq_fa_kernel<T, W><<<grid, W * 32, fa_dq_smem<W>(), be_stream(be)>>>(dqkv, D, qkv, dout, out, lse,
                                                                                          T_, C, NH);
    LAUNCH_CHECK();
    attention_backward_dkdv_fa_kernel<T, W><<<grid, W * 32, fa_dkv_smem<W>(), be_stream(be)>>>(dqkv, qkv, dout, lse, D,
                                                                                             T_, C, NH);
    LAUNCH_CHECK();
}

template <typename X>
static void mha_forward_cuda_core(Backend* be, X* out, float* lse, const X* qkv, int B, int T, int C, int NH, int G) {
    ATT_DISPATCH_G(G, {
        const dim3 grid(ceil_div(T, ATT_THREADS / GG), B * NH);
        attention_forward_kernel<X, GG><<<grid, ATT_THREADS, 0, be_stream(be)>>>(out, lse, qkv, B, T, C, NH);
        LAUNCH_CHECK();
    });
}

template <typename X>
static void mha_backward_cuda_core(Backend* be, X* dqkv, float* D, const X* dout, const X* qkv, const X* out,
                                   const float* lse, int B, int T, int C, int NH, int G) {
    attention_backward_d_kernel<X><<<ceil_div((size_t)B * T * NH, 256), 256, 0, be_stream(be)>>>(D, dout, out, B, T,
                                                                                                 C, NH);
    LAUNCH_CHECK();
    ATT_DISPATCH_G(G, {
        const dim3 grid(ceil_div(T, ATT_THREADS / GG), B * NH);
        attention_backward_dq_kernel<X, GG><<<grid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, D, B, T,
                                                                                     C, NH);
        LAUNCH_CHECK();
        attention_backward_dkdv_kernel<X, GG><<<grid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, D, B, T,
                                                                                       C, NH);
        LAUNCH_CHECK();
    });
}
