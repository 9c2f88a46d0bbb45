// attention.cuh: fused causal self-attention (flash-attention style), forward and backward.
// Nothing of size (T,T) ever exists: the forward streams key/value tiles through shared memory with an
// online softmax and saves only lse = log-sum-exp of each query's scaled scores; the backward recomputes
// the probabilities from lse (FA2): P = exp(s - lse), dS = P (dP - D), D = rowsum(dout * out).
// The backward is two kernels so every output has one owner: a query-major pass for dq and a key-major
// pass for dk, dv (no atomics, deterministic).
//
// Work split: a query (or key) row is owned by a group of G consecutive lanes, each holding 16 of its
// head dimensions in registers (G = 1,2,4,8 covers hs up to 16,32,64,128; dims past hs are zero). Dot
// products are 16 FMAs per lane plus a log2(G) butterfly over the group.
// These CUDA-core kernels are correct for every hs % 8 == 0 up to 128; for hs = 64 in bf16/fp16 the forward
// and backward take the tensor-core kernels further down (GPT_CUDA_ATTENTION_SCALAR=1 forces these).
#pragma once
#include <mma.h>

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
// Tensor-core forward for hs = 64 and 16-bit storage (WMMA 16x16x16, fp32 accumulation).
// Block: 4 warps, a tile of 64 queries (16 per warp); key/value tiles of 64 in shared memory.
// Per key tile, each warp computes S = Q K^T (16x64) into shared memory; two lanes per query row apply
// the mask and the online softmax, keep the running max / sum and their half of the output row (32 fp32
// registers), and write P (rounded to T) for the second product; P V (16x64) goes through shared memory
// back to those lanes, which rescale and accumulate. Going through shared memory avoids relying on the
// accumulator fragment's (unspecified) element-to-row mapping.
#define TC_HS 64
#define TC_BR 64                // queries per block
#define TC_BC 64                // keys per tile
#define TC_LDH (TC_HS + 8)      // padded row of 16-bit tiles (a multiple of 8, as WMMA requires)
#define TC_LDF (TC_BC + 4)      // padded row of fp32 tiles (a multiple of 4)
#define TC_SMEM_BYTES (3 * TC_BR * TC_LDH * 2 + 4 * 16 * TC_LDF * 4 + 4 * 16 * TC_LDH * 2)

// (rows [t0, t0+64) of one 64-wide head slice) -> smem tile with leading dimension TC_LDH; zeros past T.
template <typename T>
__device__ __forceinline__ void tc_load_tile(T* tile, const T* base, int ld, int col0, int t0, int T_) {
    for (int u = threadIdx.x; u < 64 * (TC_HS / 8); u += blockDim.x) {
        const int r = u / (TC_HS / 8), d = (u % (TC_HS / 8)) * 8, t = t0 + r;
        int4 v = make_int4(0, 0, 0, 0);
        if (t < T_) v = *reinterpret_cast<const int4*>(base + (size_t)t * ld + col0 + d);
        *reinterpret_cast<int4*>(tile + r * TC_LDH + d) = v;
    }
}

template <typename T>
__global__ void __launch_bounds__(128) attention_forward_tc_kernel(T* out, float* lse, const T* qkv, int B, int T_,
                                                                   int C, int NH) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    T* Qs = reinterpret_cast<T*>(tc_smem);
    T* Ks = Qs + TC_BR * TC_LDH;
    T* Vs = Ks + TC_BC * TC_LDH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* Sw = reinterpret_cast<float*>(Vs + TC_BC * TC_LDH) + warp * 16 * TC_LDF;
    T* Pw = reinterpret_cast<T*>(reinterpret_cast<float*>(Vs + TC_BC * TC_LDH) + 4 * 16 * TC_LDF) + warp * 16 * TC_LDH;

    const int qt = gridDim.x - 1 - blockIdx.x;   // the longest rows first: better tail balance
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * TC_BR;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const float scale = 1.0f / sqrtf((float)TC_HS);

    tc_load_tile(Qs, base, 3 * C, h * TC_HS, q0, T_);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[TC_HS / 16];
    for (int k = 0; k < TC_HS / 16; k++) wmma::load_matrix_sync(qf[k], Qs + warp * 16 * TC_LDH + k * 16, TC_LDH);

    const int r = lane / 2, half = lane % 2;
    const int q = q0 + warp * 16 + r;   // this lane's query
    float o[32];
    for (int k = 0; k < 32; k++) o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TC_BC;
        __syncthreads();   // every warp is done with the previous K/V tile
        tc_load_tile(Ks, base, 3 * C, C + h * TC_HS, k0, T_);
        tc_load_tile(Vs, base, 3 * C, 2 * C + h * TC_HS, k0, T_);
        __syncthreads();

        // S (16 x 64) = Q_w K^T: K stored [key][dim] is K^T in column-major order.
        for (int n = 0; n < TC_BC / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < TC_HS / 16; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * TC_LDH + k * 16, TC_LDH);
                wmma::mma_sync(acc, qf[k], kf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, TC_LDF, wmma::mem_row_major);
        }
        __syncwarp();
        float p[32];
        float tmax = -INFINITY;
        for (int c = 0; c < 32; c++) {
            const int key = k0 + half * 32 + c;
            const float sv = key <= q ? Sw[r * TC_LDF + half * 32 + c] * scale : -INFINITY;
            p[c] = sv;
            tmax = fmaxf(tmax, sv);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        const float m_new = fmaxf(m, tmax);   // finite: key 0 <= q for every row
        const float corr = expf(m - m_new);
        float psum = 0.0f;
        for (int c = 0; c < 32; c++) {
            p[c] = expf(p[c] - m_new);
            psum += p[c];
            Pw[r * TC_LDH + half * 32 + c] = from_f<T>(p[c]);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * corr + psum;
        m = m_new;
        for (int k = 0; k < 32; k++) o[k] *= corr;
        __syncwarp();

        // P V (16 x 64) into Sw (S is dead: every lane has read its part).
        for (int n = 0; n < TC_HS / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < TC_BC / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
                wmma::load_matrix_sync(pf, Pw + k * 16, TC_LDH);
                wmma::load_matrix_sync(vf, Vs + k * 16 * TC_LDH + n * 16, TC_LDH);
                wmma::mma_sync(acc, pf, vf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, TC_LDF, wmma::mem_row_major);
        }
        __syncwarp();
        for (int k = 0; k < 32; k++) o[k] += Sw[r * TC_LDF + half * 32 + k];
        __syncwarp();   // Sw and Pw are rewritten by the next tile
    }
    if (q >= T_) return;
    const float inv = 1.0f / l;
    for (int k = 0; k < 32; k++) o[k] *= inv;
    T* orow = out + ((size_t)b * T_ + q) * C + h * TC_HS + half * 32;
    for (int u = 0; u < 4; u++) store8(orow + u * 8, o + u * 8);
    if (half == 0) lse[(size_t)bh * T_ + q] = m + logf(l);
}

// Tensor-core path: hs = 64, 16-bit storage, rows 16-byte aligned. Returns 0 when it does not apply.
template <typename T>
static int attention_forward_tc(Backend* be, T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
    if (sizeof(T) != 2 || C / NH != TC_HS || ((size_t)3 * C * sizeof(T)) % 16 != 0 || !aligned16(qkv) ||
        !aligned16(out))
        return 0;
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_tc_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    TC_SMEM_BYTES));
    const dim3 grid(ceil_div(T_, TC_BR), B * NH);
    attention_forward_tc_kernel<T><<<grid, 128, TC_SMEM_BYTES, be->stream>>>(out, lse, qkv, B, T_, C, NH);
    LAUNCH_CHECK();
    return 1;
}


// ---------------------------------------------------------------------------------------------------
// Tensor-core backward for hs = 64, 16-bit storage (FA2 recomputation, WMMA). Two kernels, one owner per
// output: dq (query tiles of 64, 4 warps x 16 queries, loop over key tiles) and dk/dv (key tiles of 64,
// 4 warps x 16 keys, loop over query tiles). S / dP go through per-warp fp32 shared tiles where two lanes
// per row form P and dS (rounded to T for the next products); dq, dk, dv stay in accumulator fragments.
#define TC_DQ_SMEM_BYTES (4 * 64 * TC_LDH * 2 + 4 * 2 * 16 * TC_LDF * 4 + 4 * 16 * TC_LDH * 2)
#define TC_DKV_SMEM_BYTES (2 * 64 * TC_LDH * 2 + 4 * 2 * 16 * TC_LDF * 4 + 4 * 2 * 16 * TC_LDH * 2 + 2 * 64 * 4)

// Write a warp's 16x64 fp32 accumulators (times `mul`) as T rows of `dst` (row stride ld), rows < nvalid.
template <typename T>
__device__ __forceinline__ void tc_store_rows(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>* acc,
                                              float* Sw, T* dst, size_t ld, int nvalid, float mul) {
    using namespace nvcuda;
    const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    for (int n = 0; n < TC_HS / 16; n++) wmma::store_matrix_sync(Sw + n * 16, acc[n], TC_LDF, wmma::mem_row_major);
    __syncwarp();
    if (r < nvalid) {
        float v[32];
        for (int k = 0; k < 32; k++) v[k] = Sw[r * TC_LDF + half * 32 + k] * mul;
        for (int u = 0; u < 4; u++) store8(dst + (size_t)r * ld + half * 32 + u * 8, v + u * 8);
    }
    __syncwarp();
}

template <typename T>
__global__ void __launch_bounds__(128) attention_backward_dq_tc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                       const float* lse, const float* D, int B, int T_,
                                                                       int C, int NH) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    T* Qs = reinterpret_cast<T*>(tc_smem);
    T* dOs = Qs + 64 * TC_LDH;
    T* Ks = dOs + 64 * TC_LDH;
    T* Vs = Ks + 64 * TC_LDH;
    float* Sw = reinterpret_cast<float*>(Vs + 64 * TC_LDH) + warp * 2 * 16 * TC_LDF;
    float* dPw = Sw + 16 * TC_LDF;
    T* dSw = reinterpret_cast<T*>(reinterpret_cast<float*>(Vs + 64 * TC_LDH) + 4 * 2 * 16 * TC_LDF) + warp * 16 * TC_LDH;

    const int qt = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * 64;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const float scale = 1.0f / sqrtf((float)TC_HS);
    tc_load_tile(Qs, base, 3 * C, h * TC_HS, q0, T_);
    tc_load_tile(dOs, dout + (size_t)b * T_ * C, C, h * TC_HS, q0, T_);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[4], df[4];
    for (int k = 0; k < 4; k++) {
        wmma::load_matrix_sync(qf[k], Qs + warp * 16 * TC_LDH + k * 16, TC_LDH);
        wmma::load_matrix_sync(df[k], dOs + warp * 16 * TC_LDH + k * 16, TC_LDH);
    }
    const int r = lane / 2, half = lane % 2;
    const int q = q0 + warp * 16 + r;
    const float lse_q = q < T_ ? lse[(size_t)bh * T_ + q] : 0.0f;
    const float D_q = q < T_ ? D[(size_t)bh * T_ + q] : 0.0f;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[4];
    for (int n = 0; n < 4; n++) wmma::fill_fragment(dq[n], 0.0f);

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * 64;
        __syncthreads();
        tc_load_tile(Ks, base, 3 * C, C + h * TC_HS, k0, T_);
        tc_load_tile(Vs, base, 3 * C, 2 * C + h * TC_HS, k0, T_);
        __syncthreads();
        for (int n = 0; n < 4; n++) {   // S = Q K^T, dP = dO V^T (16 x 64 keys)
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s, dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
            for (int k = 0; k < 4; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf, vf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * TC_LDH + k * 16, TC_LDH);
                wmma::load_matrix_sync(vf, Vs + n * 16 * TC_LDH + k * 16, TC_LDH);
                wmma::mma_sync(s, qf[k], kf, s);
                wmma::mma_sync(dp, df[k], vf, dp);
            }
            wmma::store_matrix_sync(Sw + n * 16, s, TC_LDF, wmma::mem_row_major);
            wmma::store_matrix_sync(dPw + n * 16, dp, TC_LDF, wmma::mem_row_major);
        }
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            const int col = half * 32 + c, key = k0 + col;
            const float p = key <= q ? expf(Sw[r * TC_LDF + col] * scale - lse_q) : 0.0f;
            dSw[r * TC_LDH + col] = from_f<T>(p * (dPw[r * TC_LDF + col] - D_q));
        }
        __syncwarp();
        for (int n = 0; n < 4; n++)   // dq += dS K  (keys x dims)
            for (int k = 0; k < 4; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> kb;
                wmma::load_matrix_sync(a, dSw + k * 16, TC_LDH);
                wmma::load_matrix_sync(kb, Ks + k * 16 * TC_LDH + n * 16, TC_LDH);
                wmma::mma_sync(dq[n], a, kb, dq[n]);
            }
    }
    const int row0 = q0 + warp * 16;
    tc_store_rows(dq, Sw, dqkv + ((size_t)b * T_ + row0) * 3 * C + h * TC_HS, (size_t)3 * C, T_ - row0, scale);
}

template <typename T>
__global__ void __launch_bounds__(128) attention_backward_dkdv_tc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                         const float* lse, const float* D, int B,
                                                                         int T_, int C, int NH) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    T* Qs = reinterpret_cast<T*>(tc_smem);
    T* dOs = Qs + 64 * TC_LDH;
    float* fbase = reinterpret_cast<float*>(dOs + 64 * TC_LDH);
    float* Sw = fbase + warp * 2 * 16 * TC_LDF;
    float* dPw = Sw + 16 * TC_LDF;
    T* Pw = reinterpret_cast<T*>(fbase + 4 * 2 * 16 * TC_LDF) + warp * 2 * 16 * TC_LDH;
    T* dSw = Pw + 16 * TC_LDH;
    float* lses = reinterpret_cast<float*>(reinterpret_cast<T*>(fbase + 4 * 2 * 16 * TC_LDF) + 4 * 2 * 16 * TC_LDH);
    float* Ds = lses + 64;

    const int kb = blockIdx.x;   // the first key blocks see the most queries: scheduled first
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = kb * 64;
    const T* base = qkv + (size_t)b * T_ * 3 * C;
    const T* dbase = dout + (size_t)b * T_ * C;
    const float scale = 1.0f / sqrtf((float)TC_HS);
    // Stage this block's K and V through the Q / dO tiles to get the warps' A fragments.
    tc_load_tile(Qs, base, 3 * C, C + h * TC_HS, k0, T_);
    tc_load_tile(dOs, base, 3 * C, 2 * C + h * TC_HS, k0, T_);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> kf[4], vf[4];
    for (int k = 0; k < 4; k++) {
        wmma::load_matrix_sync(kf[k], Qs + warp * 16 * TC_LDH + k * 16, TC_LDH);
        wmma::load_matrix_sync(vf[k], dOs + warp * 16 * TC_LDH + k * 16, TC_LDH);
    }
    const int r = lane / 2, half = lane % 2;
    const int key = k0 + warp * 16 + r;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[4], dv[4];
    for (int n = 0; n < 4; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    const int nqt = (T_ + 63) / 64;
    for (int qt = kb; qt < nqt; qt++) {
        const int q0 = qt * 64;
        __syncthreads();   // fragments / previous tiles are read
        tc_load_tile(Qs, base, 3 * C, h * TC_HS, q0, T_);
        tc_load_tile(dOs, dbase, C, h * TC_HS, q0, T_);
        if (threadIdx.x < 64) {
            const int t = q0 + threadIdx.x;
            lses[threadIdx.x] = t < T_ ? lse[(size_t)bh * T_ + t] : 0.0f;
            Ds[threadIdx.x] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
        }
        __syncthreads();
        for (int n = 0; n < 4; n++) {   // S^T = K Q^T, dP^T = V dO^T (16 keys x 64 queries)
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s, dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
            for (int k = 0; k < 4; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> qb, db;
                wmma::load_matrix_sync(qb, Qs + n * 16 * TC_LDH + k * 16, TC_LDH);
                wmma::load_matrix_sync(db, dOs + n * 16 * TC_LDH + k * 16, TC_LDH);
                wmma::mma_sync(s, kf[k], qb, s);
                wmma::mma_sync(dp, vf[k], db, dp);
            }
            wmma::store_matrix_sync(Sw + n * 16, s, TC_LDF, wmma::mem_row_major);
            wmma::store_matrix_sync(dPw + n * 16, dp, TC_LDF, wmma::mem_row_major);
        }
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            const int col = half * 32 + c, qi = q0 + col;
            const float p = (key <= qi && qi < T_) ? expf(Sw[r * TC_LDF + col] * scale - lses[col]) : 0.0f;
            Pw[r * TC_LDH + col] = from_f<T>(p);
            dSw[r * TC_LDH + col] = from_f<T>(p * (dPw[r * TC_LDF + col] - Ds[col]));
        }
        __syncwarp();
        for (int n = 0; n < 4; n++)   // dv += P^T dO, dk += dS^T Q  (queries x dims)
            for (int k = 0; k < 4; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa, sa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> ob, qb;
                wmma::load_matrix_sync(pa, Pw + k * 16, TC_LDH);
                wmma::load_matrix_sync(sa, dSw + k * 16, TC_LDH);
                wmma::load_matrix_sync(ob, dOs + k * 16 * TC_LDH + n * 16, TC_LDH);
                wmma::load_matrix_sync(qb, Qs + k * 16 * TC_LDH + n * 16, TC_LDH);
                wmma::mma_sync(dv[n], pa, ob, dv[n]);
                wmma::mma_sync(dk[n], sa, qb, dk[n]);
            }
        __syncwarp();
    }
    const int row0 = k0 + warp * 16;
    T* rowp = dqkv + ((size_t)b * T_ + row0) * 3 * C + h * TC_HS;
    tc_store_rows(dk, Sw, rowp + C, (size_t)3 * C, T_ - row0, scale);
    tc_store_rows(dv, Sw, rowp + 2 * C, (size_t)3 * C, T_ - row0, 1.0f);
}

template <typename T>
static int attention_backward_tc(Backend* be, T* dqkv, const float* D, const T* dout, const T* qkv, const float* lse,
                                 int B, int T_, int C, int NH) {
    if (sizeof(T) != 2 || C / NH != TC_HS || ((size_t)C * sizeof(T)) % 16 != 0 || !aligned16(qkv) ||
        !aligned16(dqkv) || !aligned16(dout))
        return 0;
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dq_tc_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    TC_DQ_SMEM_BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_dkdv_tc_kernel<T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, TC_DKV_SMEM_BYTES));
    const dim3 grid(ceil_div(T_, 64), B * NH);
    attention_backward_dq_tc_kernel<T><<<grid, 128, TC_DQ_SMEM_BYTES, be->stream>>>(dqkv, qkv, dout, lse, D, B, T_,
                                                                                    C, NH);
    LAUNCH_CHECK();
    attention_backward_dkdv_tc_kernel<T><<<grid, 128, TC_DKV_SMEM_BYTES, be->stream>>>(dqkv, qkv, dout, lse, D, B,
                                                                                       T_, C, NH);
    LAUNCH_CHECK();
    return 1;
}

static int attention_group(int C, int NH, const char* who) {
    if (NH <= 0 || C % NH != 0) fail("%s: C=%d is not a multiple of NH=%d", who, C, NH);
    const int hs = C / NH;
    if (hs % 8 != 0 || hs > 128) fail("%s: head size %d must be a multiple of 8 and at most 128", who, hs);
    return hs <= 16 ? 1 : hs <= 32 ? 2 : hs <= 64 ? 4 : 8;
}

#define ATT_DISPATCH_G(G, ...)                                                                           \
    do {                                                                                                 \
        switch (G) {                                                                                     \
        case 1: { constexpr int GG = 1; __VA_ARGS__; } break;                                            \
        case 2: { constexpr int GG = 2; __VA_ARGS__; } break;                                            \
        case 4: { constexpr int GG = 4; __VA_ARGS__; } break;                                            \
        default: { constexpr int GG = 8; __VA_ARGS__; } break;                                           \
        }                                                                                                \
    } while (0)

extern "C" void attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, int B, int T, int C,
                                  int NH) {
    const int G = attention_group(C, NH, "attention_forward");
    // GPT_CUDA_ATTENTION_SCALAR=1 forces the CUDA-core kernels (the tests compare both paths).
    const char* force_scalar = getenv("GPT_CUDA_ATTENTION_SCALAR");
    if (!(force_scalar && force_scalar[0] == '1')) {
        if (dt == DT_BF16 && attention_forward_tc(be, (__nv_bfloat16*)out, lse, (const __nv_bfloat16*)qkv, B, T, C, NH))
            return;
        if (dt == DT_FP16 && attention_forward_tc(be, (__half*)out, lse, (const __half*)qkv, B, T, C, NH)) return;
    }
    DISPATCH_DTYPE(dt, X, ATT_DISPATCH_G(G, {
        const dim3 grid(ceil_div(T, ATT_THREADS / GG), B * NH);
        attention_forward_kernel<X, GG><<<grid, ATT_THREADS, 0, be->stream>>>((X*)out, lse, (const X*)qkv, B, T, C, NH);
        LAUNCH_CHECK();
    }));
}

extern "C" void attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                                   const void* out, const float* lse, int B, int T, int C, int NH) {
    const int G = attention_group(C, NH, "attention_backward");
    float* D = scratch;   // (B,NH,T)
    const char* force_scalar = getenv("GPT_CUDA_ATTENTION_SCALAR");
    const bool scalar = force_scalar && force_scalar[0] == '1';
    DISPATCH_DTYPE(dt, X, {
        attention_backward_d_kernel<X><<<ceil_div((size_t)B * T * NH, 256), 256, 0, be->stream>>>(
            D, (const X*)dout, (const X*)out, B, T, C, NH);
        LAUNCH_CHECK();
        if constexpr (sizeof(X) == 2) {
            if (!scalar && attention_backward_tc(be, (X*)dqkv, D, (const X*)dout, (const X*)qkv, lse, B, T, C, NH))
                return;
        }
        ATT_DISPATCH_G(G, {
            const dim3 grid(ceil_div(T, ATT_THREADS / GG), B * NH);
            attention_backward_dq_kernel<X, GG><<<grid, ATT_THREADS, 0, be->stream>>>(
                (X*)dqkv, (const X*)qkv, (const X*)dout, lse, D, B, T, C, NH);
            LAUNCH_CHECK();
            attention_backward_dkdv_kernel<X, GG><<<grid, ATT_THREADS, 0, be->stream>>>(
                (X*)dqkv, (const X*)qkv, (const X*)dout, lse, D, B, T, C, NH);
            LAUNCH_CHECK();
        });
    });
}
