// attention_gqa.cuh: causal self-attention kernels with grouped-query heads (R = NH/KV query heads share each kv
// head), on CUDA cores for any head size and on tensor cores for head sizes 64 and 128 in 16-bit storage. The
// multi-head kernels (attention_mha.cuh) keep KV == NH but for head size 128 on tensor cores, so GPT-2 runs on
// them alone; these take that case and every KV < NH (attention.cuh chooses).
// The backward has one owner per output, as the multi-head one: a query-major pass for dq, a key-major pass
// for dk, dv in which a kv head's block sums over its R query heads in increasing order (no atomics, the
// same bits on every run).
// Documents (kernels.h): every kernel here has a twin taking doc (B,T), the `_doc` kernels, made from the same
// body with DOC true: query i attends keys doc[i] .. i. They skip what the mask covers whole: a query-major
// block starts at the key tile of its first query's document, a warp skips key tiles (chunks) before its
// first row's document, and a key-major block stops at the query tile where its last key's document ends
// (its warps skip chunks of later documents). The kernels without doc are the bodies with DOC false.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/attention_common.cuh"

// Rows of qkv hold [q: NH heads | k: KV heads | v: KV heads] of D each; out and dout rows NH heads of D.
struct GqaShape {
    int T, NH, KV, D;
    __host__ __device__ int R() const { return NH / KV; }
    __host__ __device__ int ld() const { return (NH + 2 * KV) * D; }
    __host__ __device__ int kcol(int kh) const { return (NH + kh) * D; }
    __host__ __device__ int vcol(int kh) const { return (NH + KV + kh) * D; }
};

// ---------------------------------------------------------------------------------------------------
// CUDA-core kernels: any head size the multi-head ones take (G lanes of 16 dims per row), any storage type.

// Query-major CUDA-core kernels: grid (ceil(R*T/QB), B*KV), block ATT_THREADS. A block serves the R query
// heads of one kv head, so each k/v tile it loads serves R rows per query: lane group p owns row i = p / R
// (>= T past the last row) of query head kh*R + p % R, dims [d0, d0+16); last_q is the block's last row.
struct GqaRow { int b, kh, h, i, d0, last_q; };
template <int G> __device__ __forceinline__ GqaRow gqa_row(const GqaShape& sh) {
    constexpr int QB = ATT_THREADS / G;
    const int R = sh.R(), p0 = blockIdx.x * QB, p = p0 + threadIdx.x / G, kh = blockIdx.y % sh.KV;
    return GqaRow{(int)blockIdx.y / sh.KV, kh, kh * R + p % R, p / R, (int)(threadIdx.x % G) * 16,
                  min(sh.T - 1, (p0 + QB - 1) / R)};
}
// Row t's document start in batch row b (DOC), else 0.
template <bool DOC> __device__ __forceinline__ int gqa_doc(const int* doc, int b, int T_, int t) {
    return DOC ? doc[(size_t)b * T_ + t] : 0;
}
// The end of the document holding key `key` (< T) of batch row b: the first query past it whose document starts
// later, else T. doc is non-decreasing along a row, so a binary search finds it.
__device__ __forceinline__ int gqa_doc_end(const int* doc, int b, int T_, int key) {
    const int* row = doc + (size_t)b * T_;
    int lo = key + 1, hi = T_;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (row[mid] > key) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// Key/value rows [t0, t0+ATT_TILE) of kv head kh into the block's tiles, once every thread is done with the last.
template <typename T, int HSP>
__device__ __forceinline__ void gqa_load_kv(float (*ks)[HSP], float (*vs)[HSP], const T* base, const GqaShape& sh, int kh,
                                            int t0) {
    __syncthreads();
    load_tile<T, HSP>(ks, base, sh.ld(), sh.kcol(kh), t0, sh.T, sh.D);
    load_tile<T, HSP>(vs, base, sh.ld(), sh.vcol(kh), t0, sh.T, sh.D);
    __syncthreads();
}

// The first key tile of a query-major CUDA-core block: that of its first row's document (DOC), else 0.
template <int G, bool DOC> __device__ __forceinline__ int gqa_first_key_tile(const int* doc, int b, const GqaShape& sh) {
    return gqa_doc<DOC>(doc, b, sh.T, (int)blockIdx.x * (ATT_THREADS / G) / sh.R()) / ATT_TILE * ATT_TILE;
}

// out and lse by an online softmax over the block's k/v tiles (the tiles are the kernel's shared arrays).
template <typename T, int G, bool DOC>
__device__ __forceinline__ void gqa_forward_body(float (*ks)[16 * G], float (*vs)[16 * G], T* out, float* lse,
                                                 const T* qkv, const int* doc, const GqaShape& sh) {
    constexpr int HSP = 16 * G;
    const GqaRow w = gqa_row<G>(sh);
    const int T_ = sh.T, D = sh.D, i = w.i, h = w.h, d0 = w.d0;
    const T* base = qkv + (size_t)w.b * T_ * sh.ld();
    const float scale = 1.0f / sqrtf((float)D);
    float q[16], o[16];
    if (i < T_) load_row16(base, sh.ld(), i, h * D, d0, D, q);
    else
        for (int k = 0; k < 16; k++) q[k] = 0.0f;
    for (int k = 0; k < 16; k++) o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int first = i < T_ ? gqa_doc<DOC>(doc, w.b, T_, i) : 0;
    for (int t0 = gqa_first_key_tile<G, DOC>(doc, w.b, sh); t0 <= w.last_q; t0 += ATT_TILE) {
        gqa_load_kv<T, HSP>(ks, vs, base, sh, w.kh, t0);
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += q[k] * ks[jj][d0 + k];
            s = group_sum<G>(s) * scale;
            if (t0 + jj > i || i >= T_) continue;   // causal mask (after the shuffle: all lanes took part)
            if (DOC && t0 + jj < first) continue;   // another document's key
            if (s > m) {   // a new maximum rescales what was summed so far
                const float corr = expf(m - s);
                l *= corr;
                for (int k = 0; k < 16; k++) o[k] *= corr;
                m = s;
            }
            const float e = expf(s - m);
            l += e;
            for (int k = 0; k < 16; k++) o[k] += e * vs[jj][d0 + k];
        }
    }
    if (i >= T_) return;
    const float inv = 1.0f / l;
    for (int k = 0; k < 16; k++) o[k] *= inv;
    T* orow = out + ((size_t)w.b * T_ + i) * sh.NH * D + h * D;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < D) store8(orow + d0 + u * 8, o + u * 8);
    if (d0 == 0) lse[((size_t)w.b * sh.NH + h) * T_ + i] = m + logf(l);
}

template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_forward_kernel(T* out, float* lse, const T* qkv, GqaShape sh) {
    __shared__ float ks[ATT_TILE][16 * G], vs[ATT_TILE][16 * G];
    gqa_forward_body<T, G, false>(ks, vs, out, lse, qkv, nullptr, sh);
}
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_forward_doc_kernel(T* out, float* lse, const T* qkv, const int* doc,
                                                                      GqaShape sh) {
    __shared__ float ks[ATT_TILE][16 * G], vs[ATT_TILE][16 * G];
    gqa_forward_body<T, G, true>(ks, vs, out, lse, qkv, doc, sh);
}

// dq (in dqkv's q part), rows owned as in the forward: dq_i = scale * sum_j dS_ij k_j.
template <typename T, int G, bool DOC>
__device__ __forceinline__ void gqa_backward_dq_body(float (*ks)[16 * G], float (*vs)[16 * G], T* dqkv, const T* qkv,
                                                     const T* dout, const float* lse, const float* Dsum, const int* doc,
                                                     const GqaShape& sh) {
    constexpr int HSP = 16 * G;
    const GqaRow w = gqa_row<G>(sh);
    const int T_ = sh.T, D = sh.D, i = w.i, h = w.h, d0 = w.d0;
    const T* base = qkv + (size_t)w.b * T_ * sh.ld();
    const float scale = 1.0f / sqrtf((float)D);
    float q[16], dov[16], dq[16];
    float lse_i = 0.0f, D_i = 0.0f;
    if (i < T_) {
        load_row16(base, sh.ld(), i, h * D, d0, D, q);
        load_row16(dout + (size_t)w.b * T_ * sh.NH * D, sh.NH * D, i, h * D, d0, D, dov);
        lse_i = lse[((size_t)w.b * sh.NH + h) * T_ + i];
        D_i = Dsum[((size_t)w.b * sh.NH + h) * T_ + i];
    } else {
        for (int k = 0; k < 16; k++) q[k] = dov[k] = 0.0f;
    }
    for (int k = 0; k < 16; k++) dq[k] = 0.0f;
    const int first = i < T_ ? gqa_doc<DOC>(doc, w.b, T_, i) : 0;
    for (int t0 = gqa_first_key_tile<G, DOC>(doc, w.b, sh); t0 <= w.last_q; t0 += ATT_TILE) {
        gqa_load_kv<T, HSP>(ks, vs, base, sh, w.kh, t0);
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float s = 0.0f, dp = 0.0f;
            for (int k = 0; k < 16; k++) {
                s += q[k] * ks[jj][d0 + k];
                dp += dov[k] * vs[jj][d0 + k];
            }
            s = group_sum<G>(s) * scale;
            dp = group_sum<G>(dp);
            if (t0 + jj > i || i >= T_) continue;
            if (DOC && t0 + jj < first) continue;
            const float ds = expf(s - lse_i) * (dp - D_i);
            for (int k = 0; k < 16; k++) dq[k] += ds * ks[jj][d0 + k];
        }
    }
    if (i >= T_) return;
    for (int k = 0; k < 16; k++) dq[k] *= scale;
    T* row = dqkv + ((size_t)w.b * T_ + i) * sh.ld() + h * D;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < D) store8(row + d0 + u * 8, dq + u * 8);
}

template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_backward_dq_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                      const float* lse, const float* Dsum, GqaShape sh) {
    __shared__ float ks[ATT_TILE][16 * G], vs[ATT_TILE][16 * G];
    gqa_backward_dq_body<T, G, false>(ks, vs, dqkv, qkv, dout, lse, Dsum, nullptr, sh);
}
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_backward_dq_doc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                          const float* lse, const float* Dsum,
                                                                          const int* doc, GqaShape sh) {
    __shared__ float ks[ATT_TILE][16 * G], vs[ATT_TILE][16 * G];
    gqa_backward_dq_body<T, G, true>(ks, vs, dqkv, qkv, dout, lse, Dsum, doc, sh);
}

// dk, dv (in dqkv's k and v parts): key-major, grid (ceil(T/KB), B*KV). A lane group owns key j of kv head kh
// and sums over the group's query heads in increasing order, each over its queries i >= j:
// dv_j = sum P_ij dout_i, dk_j = scale * sum dS_ij q_i.
// With documents a block's query tiles end with its last key's document: later queries see none of its keys.
template <typename T, int G, bool DOC>
__device__ __forceinline__ void gqa_backward_dkdv_body(float (*qs)[16 * G], float (*dos)[16 * G], float* lses, float* Ds,
                                                       T* dqkv, const T* qkv, const T* dout, const float* lse,
                                                       const float* Dsum, const int* doc, const GqaShape& sh) {
    constexpr int HSP = 16 * G, KB = ATT_THREADS / G;
    const int R = sh.R(), T_ = sh.T, D = sh.D, ld = sh.ld(), b = blockIdx.y / sh.KV, kh = blockIdx.y % sh.KV;
    const int g = threadIdx.x % G, j = blockIdx.x * KB + threadIdx.x / G, d0 = g * 16;
    const T* base = qkv + (size_t)b * T_ * ld;
    const T* dbase = dout + (size_t)b * T_ * sh.NH * D;
    const float scale = 1.0f / sqrtf((float)D);
    float kr[16], vr[16], dk[16], dv[16];
    if (j < T_) {
        load_row16(base, ld, j, sh.kcol(kh), d0, D, kr);
        load_row16(base, ld, j, sh.vcol(kh), d0, D, vr);
    } else {
        for (int k = 0; k < 16; k++) kr[k] = vr[k] = 0.0f;
    }
    for (int k = 0; k < 16; k++) dk[k] = dv[k] = 0.0f;
    const int q_end = DOC ? gqa_doc_end(doc, b, T_, min(T_ - 1, ((int)blockIdx.x + 1) * KB - 1)) : T_;
    for (int h = kh * R; h < (kh + 1) * R; h++) {
        const float* lrow = lse + ((size_t)b * sh.NH + h) * T_;
        const float* drow = Dsum + ((size_t)b * sh.NH + h) * T_;
        // Queries before the block's first key see none of its keys.
        for (int t0 = (int)blockIdx.x * KB / ATT_TILE * ATT_TILE; t0 < q_end; t0 += ATT_TILE) {
            __syncthreads();
            load_tile<T, HSP>(qs, base, ld, h * D, t0, T_, D);
            load_tile<T, HSP>(dos, dbase, sh.NH * D, h * D, t0, T_, D);
            for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
                lses[r] = t0 + r < T_ ? lrow[t0 + r] : 0.0f;
                Ds[r] = t0 + r < T_ ? drow[t0 + r] : 0.0f;
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
                if (DOC && gqa_doc<DOC>(doc, b, T_, i) > j) continue;   // a later document's query
                const float pr = expf(s - lses[ii]), ds = pr * (dp - Ds[ii]);
                for (int k = 0; k < 16; k++) {
                    dv[k] += pr * dos[ii][d0 + k];
                    dk[k] += ds * qs[ii][d0 + k];
                }
            }
        }
    }
    if (j >= T_) return;
    for (int k = 0; k < 16; k++) dk[k] *= scale;
    T* row = dqkv + ((size_t)b * T_ + j) * ld;
    for (int u = 0; u < 2; u++)
        if (d0 + u * 8 < D) {
            store8(row + sh.kcol(kh) + d0 + u * 8, dk + u * 8);
            store8(row + sh.vcol(kh) + d0 + u * 8, dv + u * 8);
        }
}

template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_backward_dkdv_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                        const float* lse, const float* Dsum,
                                                                        GqaShape sh) {
    __shared__ float qs[ATT_TILE][16 * G], dos[ATT_TILE][16 * G];
    __shared__ float lses[ATT_TILE], Ds[ATT_TILE];
    gqa_backward_dkdv_body<T, G, false>(qs, dos, lses, Ds, dqkv, qkv, dout, lse, Dsum, nullptr, sh);
}
template <typename T, int G>
__global__ void __launch_bounds__(ATT_THREADS) gqa_backward_dkdv_doc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                            const float* lse, const float* Dsum,
                                                                            const int* doc, GqaShape sh) {
    __shared__ float qs[ATT_TILE][16 * G], dos[ATT_TILE][16 * G];
    __shared__ float lses[ATT_TILE], Ds[ATT_TILE];
    gqa_backward_dkdv_body<T, G, true>(qs, dos, lses, Ds, dqkv, qkv, dout, lse, Dsum, doc, sh);
}

template <typename X>
static void gqa_forward_cuda_core(Backend* be, X* out, float* lse, const X* qkv, const int* doc, int B, GqaShape sh,
                                  int G) {
    ATT_DISPATCH_G(G, {
        const dim3 grid(ceil_div((long long)sh.R() * sh.T, ATT_THREADS / GG), B * sh.KV);
        if (doc) gqa_forward_doc_kernel<X, GG><<<grid, ATT_THREADS, 0, be_stream(be)>>>(out, lse, qkv, doc, sh);
        else gqa_forward_kernel<X, GG><<<grid, ATT_THREADS, 0, be_stream(be)>>>(out, lse, qkv, sh);
        LAUNCH_CHECK();
    });
}

template <typename X>
static void gqa_backward_cuda_core(Backend* be, X* dqkv, float* Dsum, const X* dout, const X* qkv, const X* out,
                                   const float* lse, const int* doc, int B, GqaShape sh, int G) {
    const int C = sh.NH * sh.D;   // out and dout are multi-head shaped: the multi-head D kernel serves them
    attention_backward_d_kernel<X><<<ceil_div((size_t)B * sh.T * sh.NH, 256), 256, 0, be_stream(be)>>>(
        Dsum, dout, out, B, sh.T, C, sh.NH);
    LAUNCH_CHECK();
    ATT_DISPATCH_G(G, {
        const dim3 qgrid(ceil_div((long long)sh.R() * sh.T, ATT_THREADS / GG), B * sh.KV);
        const dim3 kgrid(ceil_div(sh.T, ATT_THREADS / GG), B * sh.KV);
        if (doc) {
            gqa_backward_dq_doc_kernel<X, GG><<<qgrid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, Dsum, doc,
                                                                                        sh);
            LAUNCH_CHECK();
            gqa_backward_dkdv_doc_kernel<X, GG><<<kgrid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, Dsum,
                                                                                          doc, sh);
            LAUNCH_CHECK();
        } else {
            gqa_backward_dq_kernel<X, GG><<<qgrid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, Dsum, sh);
            LAUNCH_CHECK();
            gqa_backward_dkdv_kernel<X, GG><<<kgrid, ATT_THREADS, 0, be_stream(be)>>>(dqkv, qkv, dout, lse, Dsum, sh);
            LAUNCH_CHECK();
        }
    });
}

// ---------------------------------------------------------------------------------------------------
// Tensor-core kernels for head size HS = 64 or 128 in 16-bit storage: the multi-head FA2 kernels' scheme
// (16 rows per warp, 64-row tiles double-buffered through shared memory with cp.async, ldmatrix, mma.sync
// m16n8k16 with fp32 accumulation, P and dS rounded to T as A operands) with shared-memory rows of HS + 8
// elements (conflict-free ldmatrix for both sizes) and the grouped layout. The dk/dv kernel reads its K and V
// fragments from shared memory at each use instead of holding them, which leaves the registers to the
// 2 x HS/8 accumulator tiles.

template <int HS> struct GqaTile {
    static constexpr int LD = HS + 8;   // shared-memory row, elements
    static constexpr int KS = HS / 16;  // mma k-steps across the head dims
    static constexpr int NT = HS / 8;   // mma n-tiles across the head dims
    static constexpr int U = HS / 8;    // 16-byte units per row
};

// Rows [t0, t0+ROWS) of one head (row stride ld elements) -> shared tile, asynchronously; zeros past T.
template <typename T, int HS, int ROWS, int W>
__device__ __forceinline__ void gqa_load_tile(T* s, const T* base, size_t ld, int t0, int T_) {
    constexpr int U = GqaTile<HS>::U, LD = GqaTile<HS>::LD;
    for (int u = threadIdx.x; u < ROWS * U; u += W * 32) {
        const int r = u / U, c = (u % U) * 8, t = t0 + r;
        const bool ok = t < T_;
        cp_async16(s + r * LD + c, base + (size_t)(ok ? t : 0) * ld + c, ok);
    }
}
// A fragment of k-step kk (16 rows x 16 dims) of rows [row0, row0+16) of a shared tile.
template <int HS> __device__ __forceinline__ void gqa_load_a1(uint32_t* a, const void* tile, int row0, int kk) {
    const int lane = threadIdx.x % 32;
    const unsigned short* s = (const unsigned short*)tile;
    ldsm_x4(a, s + (row0 + (lane & 15)) * GqaTile<HS>::LD + kk * 16 + (lane >> 4) * 8);
}
template <int HS> __device__ __forceinline__ void gqa_load_a(uint32_t (*a)[4], const void* tile, int row0) {
    for (int kk = 0; kk < GqaTile<HS>::KS; kk++) gqa_load_a1<HS>(a[kk], tile, row0, kk);
}
// acc (16 x NT*8) += A (16 x HS, k-step kk's fragment a) * tile[n][kk*16 .. kk*16+16)^T for tile rows [n0, n0+NT*8).
template <typename T, int HS, int NT>
__device__ __forceinline__ void gqa_mma_abt_step(float (*acc)[4], const uint32_t* a, const T* tile, int n0, int kk) {
    const int lane = threadIdx.x % 32;
    for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4(b, tile + (n0 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * GqaTile<HS>::LD + kk * 16 + ((lane >> 3) & 1) * 8);
        mma16816<T>(acc[2 * np], a, b[0], b[1]);
        mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
}
// acc (16 x NT*8) += A (16 x HS, registers) * tile[n][dims]^T.
template <typename T, int HS, int NT>
__device__ __forceinline__ void gqa_mma_abt(float (*acc)[4], const uint32_t (*a)[4], const T* tile, int n0) {
    for (int kk = 0; kk < GqaTile<HS>::KS; kk++) gqa_mma_abt_step<T, HS, NT>(acc, a[kk], tile, n0, kk);
}
// The same with A read from rows [row0, row0+16) of shared tile `at`, one k-step at a time.
template <typename T, int HS, int NT>
__device__ __forceinline__ void gqa_mma_abt_smem(float (*acc)[4], const T* at, int row0, const T* tile, int n0) {
    for (int kk = 0; kk < GqaTile<HS>::KS; kk++) {
        uint32_t a[4];
        gqa_load_a1<HS>(a, at, row0, kk);
        gqa_mma_abt_step<T, HS, NT>(acc, a, tile, n0, kk);
    }
}
// acc (16 x HS) += A (16 x KS*16, registers) * tile[k0 + k][dims] (rows k of the tile are the k index).
template <typename T, int HS, int KS>
__device__ __forceinline__ void gqa_mma_ab(float (*acc)[4], const uint32_t (*a)[4], const T* tile, int k0) {
    const int lane = threadIdx.x % 32;
    for (int kk = 0; kk < KS; kk++)
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_t(b, tile + (k0 + kk * 16 + (lane & 15)) * GqaTile<HS>::LD + dp * 16 + (lane >> 4) * 8);
            mma16816<T>(acc[2 * dp], a[kk], b[0], b[1]);
            mma16816<T>(acc[2 * dp + 1], a[kk], b[2], b[3]);
        }
}
// Accumulators acc (16 rows x HS, times mul) -> T rows [row0, row0+16) of `stage` (the warp's own rows of a
// shared tile) -> global rows (16-byte stores), rows < T_ only.
template <typename T, int HS>
__device__ __forceinline__ void gqa_store_rows(const float (*acc)[4], float mul, T* stage, int row0, T* dst, size_t ld,
                                               int t0, int T_) {
    constexpr int LD = GqaTile<HS>::LD, U = GqaTile<HS>::U;
    const int lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    uint32_t* s32 = (uint32_t*)stage;
    for (int n = 0; n < GqaTile<HS>::NT; n++) {
        s32[((row0 + g) * LD + n * 8 + 2 * tq) / 2] = pack2<T>(acc[n][0] * mul, acc[n][1] * mul);
        s32[((row0 + g + 8) * LD + n * 8 + 2 * tq) / 2] = pack2<T>(acc[n][2] * mul, acc[n][3] * mul);
    }
    __syncwarp();
    for (int u = lane; u < 16 * U; u += 32) {
        const int r = u / U, c = (u % U) * 8, t = t0 + r;
        if (t < T_) *reinterpret_cast<int4*>(dst + (size_t)t * ld + c) = *reinterpret_cast<const int4*>(stage + (row0 + r) * LD + c);
    }
}
// Two accumulator tiles (rows g, g+8 of n-tiles 2kk, 2kk+1) as the A fragment of k-step kk, rounded to T.
template <typename T> __device__ __forceinline__ void gqa_pack_a(uint32_t* a, const float* even, const float* odd) {
    a[0] = pack2<T>(even[0], even[1]);
    a[1] = pack2<T>(even[2], even[3]);
    a[2] = pack2<T>(odd[0], odd[1]);
    a[3] = pack2<T>(odd[2], odd[3]);
}

// Key/value tile j of a query-major kernel is in stage j & 1 for every thread, tile j+1 on its way into the
// other stage (whose last readers passed the barrier ending iteration j-1).
template <typename T, int HS, int W>
__device__ __forceinline__ void gqa_kv_tile_ready(T* Ks, T* Vs, const T* kbase, const T* vbase, size_t ld, int j,
                                                  int ntiles, int T_) {
    constexpr int LD = GqaTile<HS>::LD;
    if (j + 1 < ntiles) {
        const int st = (j + 1) & 1;
        gqa_load_tile<T, HS, FA_BT, W>(Ks + st * FA_BT * LD, kbase, ld, (j + 1) * FA_BT, T_);
        gqa_load_tile<T, HS, FA_BT, W>(Vs + st * FA_BT * LD, vbase, ld, (j + 1) * FA_BT, T_);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

template <int HS, int W> constexpr int gqa_fwd_smem() { return (W * 16 + 4 * FA_BT) * GqaTile<HS>::LD * 2; }
// grid (ceil(T/BR), B*NH): one query head per block; the R blocks of a kv head read the same k/v rows (L2).
// At least 1 block per SM: no register cap for occupancy, which would spill the accumulators.
// The documents of rows r0 + g and r0 + g + 8 (the rows a lane holds in the mma layout; rows past T take the
// last row's), and of row r0, the warp's earliest (DOC; else 0).
struct GqaRowDocs { int g, g8, first; };
template <bool DOC> __device__ __forceinline__ GqaRowDocs gqa_row_docs(const int* doc, int b, int T_, int r0) {
    const int g = (threadIdx.x % 32) >> 2;
    return GqaRowDocs{gqa_doc<DOC>(doc, b, T_, min(r0 + g, T_ - 1)), gqa_doc<DOC>(doc, b, T_, min(r0 + g + 8, T_ - 1)),
                      gqa_doc<DOC>(doc, b, T_, min(r0, T_ - 1))};
}

template <typename T, int HS, int W, bool DOC>
__device__ __forceinline__ void gqa_forward_tc_body(unsigned char* gqa_smem, T* out, float* lse, const T* qkv,
                                                    const int* doc, const GqaShape& sh) {
    constexpr int BR = W * 16, LD = GqaTile<HS>::LD, NT = GqaTile<HS>::NT;
    T* Qs = reinterpret_cast<T*>(gqa_smem);   // BR rows
    T* Ks = Qs + BR * LD;                     // 2 stages
    T* Vs = Ks + 2 * FA_BT * LD;              // 2 stages
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;   // the longest rows first: better tail balance
    const int T_ = sh.T, bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH, kh = h / sh.R();
    const int q0 = qt * BR, r0 = q0 + warp * 16;   // block's and warp's first query
    const size_t ld = sh.ld();
    const T* rows = qkv + (size_t)b * T_ * ld;
    const T* kbase = rows + sh.kcol(kh);
    const T* vbase = rows + sh.vcol(kh);
    const int ntiles = (min(T_, q0 + BR) - 1) / FA_BT + 1;
    const float sl2 = FA_LOG2E / sqrtf((float)HS);   // scores in log2 units
    const GqaRowDocs rd = gqa_row_docs<DOC>(doc, b, T_, r0);
    const int j0 = gqa_doc<DOC>(doc, b, T_, q0) / FA_BT;   // the block's first row's document's first key tile

    gqa_load_tile<T, HS, BR, W>(Qs, rows + h * HS, ld, q0, T_);
    gqa_load_tile<T, HS, FA_BT, W>(Ks + (j0 & 1) * FA_BT * LD, kbase, ld, j0 * FA_BT, T_);
    gqa_load_tile<T, HS, FA_BT, W>(Vs + (j0 & 1) * FA_BT * LD, vbase, ld, j0 * FA_BT, T_);
    cp_async_commit();

    uint32_t qf[GqaTile<HS>::KS][4];
    float o[NT][4];
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // rows g, g+8: running max (log2 units), partial sum

    for (int j = j0; j < ntiles; j++) {
        gqa_kv_tile_ready<T, HS, W>(Ks, Vs, kbase, vbase, ld, j, ntiles, T_);
        if (j == j0) gqa_load_a<HS>(qf, Qs, warp * 16);
        const int k0 = j * FA_BT;
        // Tiles start at multiples of 16, so a tile the warp does not skip holds key k0 <= r0 <= every row:
        // each row has a finite maximum. With documents a row may have none in a tile (its document starts
        // later): its maximum stays -inf, and the subtractions below use 0 in its place.
        if (k0 <= r0 + 15 && !(DOC && k0 + FA_BT <= rd.first)) {
            const T* Kt = Ks + (j & 1) * FA_BT * LD;
            const T* Vt = Vs + (j & 1) * FA_BT * LD;
            float s[8][4];
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            gqa_mma_abt<T, HS, 8>(s, qf, Kt, 0);
            if (k0 + FA_BT - 1 > r0) {   // the tile crosses the warp's diagonal (keys past T are past it too)
                for (int n = 0; n < 8; n++)
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * tq + (e & 1) > r0 + g + (e >> 1) * 8) s[n][e] = -INFINITY;
            }
            if (DOC)   // keys before the row's document
                for (int n = 0; n < 8; n++)
                    for (int e = 0; e < 4; e++)
                        if (k0 + n * 8 + 2 * tq + (e & 1) < (e >> 1 ? rd.g8 : rd.g)) s[n][e] = -INFINITY;
            float corr[2], mu[2];
            for (int i = 0; i < 2; i++) {
                float mx = -INFINITY;
                for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[i], mx * sl2);
                mu[i] = DOC && mnew == -INFINITY ? 0.0f : mnew;
                corr[i] = exp2f(m[i] - mu[i]);
                m[i] = mnew;
                l[i] *= corr[i];
            }
            for (int n = 0; n < NT; n++) {
                o[n][0] *= corr[0], o[n][1] *= corr[0];
                o[n][2] *= corr[1], o[n][3] *= corr[1];
            }
            uint32_t pa[4][4];   // P as A fragments: key k-step n/2, halves by n parity
            for (int n = 0; n < 8; n++) {
                const float p0 = exp2f(fmaf(s[n][0], sl2, -mu[0])), p1 = exp2f(fmaf(s[n][1], sl2, -mu[0]));
                const float p2 = exp2f(fmaf(s[n][2], sl2, -mu[1])), p3 = exp2f(fmaf(s[n][3], sl2, -mu[1]));
                l[0] += p0 + p1;
                l[1] += p2 + p3;
                pa[n / 2][(n & 1) * 2 + 0] = pack2<T>(p0, p1);
                pa[n / 2][(n & 1) * 2 + 1] = pack2<T>(p2, p3);
            }
            gqa_mma_ab<T, HS, 4>(o, pa, Vt, 0);
        }
        __syncthreads();   // the stage read here is refilled next iteration
    }
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const float inv0 = 1.0f / l[0], inv1 = 1.0f / l[1];
    for (int n = 0; n < NT; n++) {
        o[n][0] *= inv0, o[n][1] *= inv0;
        o[n][2] *= inv1, o[n][3] *= inv1;
    }
    // The warp's own Q rows are free (only this warp read them): stage the output there.
    const size_t ow = (size_t)sh.NH * HS;
    gqa_store_rows<T, HS>(o, 1.0f, Qs, warp * 16, out + (size_t)b * T_ * ow + h * HS, ow, r0, T_);
    if (tq == 0) {
        if (r0 + g < T_) lse[(size_t)bh * T_ + r0 + g] = (m[0] + log2f(l[0])) * FA_LN2;
        if (r0 + g + 8 < T_) lse[(size_t)bh * T_ + r0 + g + 8] = (m[1] + log2f(l[1])) * FA_LN2;
    }
}

template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32, 1) gqa_forward_tc_kernel(T* out, float* lse, const T* qkv, GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_forward_tc_body<T, HS, W, false>(gqa_smem, out, lse, qkv, nullptr, sh);
}
template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32, 1) gqa_forward_tc_doc_kernel(T* out, float* lse, const T* qkv, const int* doc,
                                                                       GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_forward_tc_body<T, HS, W, true>(gqa_smem, out, lse, qkv, doc, sh);
}

// D = rowsum(dout * out) of rows [r0, r0+16) of head h, written for rows < T; returns rows g and g+8 of the
// mma layout. Two lanes per row, HS/2 dims each, straight from global memory.
template <typename T, int HS>
__device__ __forceinline__ void gqa_rows_d(float* Dsum, const T* dout, const T* out, int b, int h, int r0, GqaShape sh,
                                           float* d0, float* d1) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = r0 + (lane >> 1), T_ = sh.T;
    float acc = 0.0f;
    if (t < T_) {
        const size_t off = ((size_t)b * T_ + t) * sh.NH * HS + h * HS + (lane & 1) * (HS / 2);
        for (int u = 0; u < HS / 16; u++) {
            float x[8], y[8];
            load8(dout + off + u * 8, x);
            load8(out + off + u * 8, y);
            for (int k = 0; k < 8; k++) acc += x[k] * y[k];
        }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (t < T_ && (lane & 1) == 0) Dsum[((size_t)b * sh.NH + h) * T_ + t] = acc;
    *d0 = __shfl_sync(0xffffffffu, acc, 2 * g);
    *d1 = __shfl_sync(0xffffffffu, acc, 2 * g + 16);
}

// dq = scale * sum_j dS_ij k_j, query-major like the forward; also D for its rows. 32 keys at a time.
template <int HS, int W> constexpr int gqa_dq_smem() { return (2 * W * 16 + 4 * FA_BT) * GqaTile<HS>::LD * 2; }
template <typename T, int HS, int W, bool DOC>
__device__ __forceinline__ void gqa_backward_dq_tc_body(unsigned char* gqa_smem, T* dqkv, float* Dsum, const T* qkv,
                                                        const T* dout, const T* out, const float* lse, const int* doc,
                                                        const GqaShape& sh) {
    constexpr int BR = W * 16, LD = GqaTile<HS>::LD, NT = GqaTile<HS>::NT, KS = GqaTile<HS>::KS;
    T* Qs = reinterpret_cast<T*>(gqa_smem);   // BR rows
    T* dOs = Qs + BR * LD;                    // BR rows
    T* Ks = dOs + BR * LD;                    // 2 stages
    T* Vs = Ks + 2 * FA_BT * LD;              // 2 stages
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x;
    const int T_ = sh.T, bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH, kh = h / sh.R();
    const int q0 = qt * BR, r0 = q0 + warp * 16;
    const size_t ld = sh.ld(), ow = (size_t)sh.NH * HS;
    const T* rows = qkv + (size_t)b * T_ * ld;
    const T* kbase = rows + sh.kcol(kh);
    const T* vbase = rows + sh.vcol(kh);
    const int ntiles = (min(T_, q0 + BR) - 1) / FA_BT + 1;
    const float scale = 1.0f / sqrtf((float)HS), sl2 = scale * FA_LOG2E;
    const GqaRowDocs rd = gqa_row_docs<DOC>(doc, b, T_, r0);
    const int j0 = gqa_doc<DOC>(doc, b, T_, q0) / FA_BT;   // as in the forward

    gqa_load_tile<T, HS, BR, W>(Qs, rows + h * HS, ld, q0, T_);
    gqa_load_tile<T, HS, BR, W>(dOs, dout + (size_t)b * T_ * ow + h * HS, ow, q0, T_);
    gqa_load_tile<T, HS, FA_BT, W>(Ks + (j0 & 1) * FA_BT * LD, kbase, ld, j0 * FA_BT, T_);
    gqa_load_tile<T, HS, FA_BT, W>(Vs + (j0 & 1) * FA_BT * LD, vbase, ld, j0 * FA_BT, T_);
    cp_async_commit();

    float D0, D1;
    gqa_rows_d<T, HS>(Dsum, dout, out, b, h, r0, sh, &D0, &D1);
    const float lse0 = r0 + g < T_ ? lse[(size_t)bh * T_ + r0 + g] * FA_LOG2E : 0.0f;
    const float lse1 = r0 + g + 8 < T_ ? lse[(size_t)bh * T_ + r0 + g + 8] * FA_LOG2E : 0.0f;

    uint32_t qf[KS][4], df[KS][4];
    float dq[NT][4];
    for (int n = 0; n < NT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int j = j0; j < ntiles; j++) {
        gqa_kv_tile_ready<T, HS, W>(Ks, Vs, kbase, vbase, ld, j, ntiles, T_);
        if (j == j0) {
            gqa_load_a<HS>(qf, Qs, warp * 16);
            gqa_load_a<HS>(df, dOs, warp * 16);
        }
        const T* Kt = Ks + (j & 1) * FA_BT * LD;
        const T* Vt = Vs + (j & 1) * FA_BT * LD;
        for (int hc = 0; hc < 2; hc++) {
            const int k0 = j * FA_BT + hc * 32;
            if (k0 > r0 + 15) continue;   // every key of the chunk is past every row of the warp
            if (DOC && k0 + 31 < rd.first) continue;   // or before every row's document
            float s[4][4], dp[4][4];
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            gqa_mma_abt<T, HS, 4>(s, qf, Kt, hc * 32);
            gqa_mma_abt<T, HS, 4>(dp, df, Vt, hc * 32);
            const bool mask = k0 + 31 > r0;
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + g + (e >> 1) * 8, key = k0 + n * 8 + 2 * tq + (e & 1);
                    const bool out_of_doc = DOC && key < (e >> 1 ? rd.g8 : rd.g);
                    const float p = (mask && key > row) || out_of_doc ? 0.0f
                                                                      : exp2f(fmaf(s[n][e], sl2, -(e >> 1 ? lse1 : lse0)));
                    s[n][e] = p * (dp[n][e] - (e >> 1 ? D1 : D0));   // dS
                }
            uint32_t dsa[2][4];
            for (int kk = 0; kk < 2; kk++) gqa_pack_a<T>(dsa[kk], s[2 * kk], s[2 * kk + 1]);
            gqa_mma_ab<T, HS, 2>(dq, dsa, Kt, hc * 32);
        }
        __syncthreads();
    }
    gqa_store_rows<T, HS>(dq, scale, Qs, warp * 16, dqkv + (size_t)b * T_ * ld + h * HS, ld, r0, T_);
}

template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32) gqa_backward_dq_tc_kernel(T* dqkv, float* Dsum, const T* qkv, const T* dout,
                                                                    const T* out, const float* lse, GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_backward_dq_tc_body<T, HS, W, false>(gqa_smem, dqkv, Dsum, qkv, dout, out, lse, nullptr, sh);
}
template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32) gqa_backward_dq_tc_doc_kernel(T* dqkv, float* Dsum, const T* qkv,
                                                                        const T* dout, const T* out, const float* lse,
                                                                        const int* doc, GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_backward_dq_tc_body<T, HS, W, true>(gqa_smem, dqkv, Dsum, qkv, dout, out, lse, doc, sh);
}

// dk, dv: key-major. The block owns 64 keys of kv head kh (K, V rows in shared memory) and streams query
// tiles (Q, dO, lse, D) of each of the R query heads in turn, from its first key on: S^T = K Q^T,
// dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - D); dv += P^T dO, dk += dS^T Q, 32 queries at a time.
template <int HS, int W> constexpr int gqa_dkv_smem() {
    return (2 * W * 16 + 4 * FA_BT) * GqaTile<HS>::LD * 2 + 4 * FA_BT * 4;
}
template <typename T, int HS, int W, bool DOC>
__device__ __forceinline__ void gqa_backward_dkdv_tc_body(unsigned char* gqa_smem, T* dqkv, const T* qkv, const T* dout,
                                                          const float* lse, const float* Dsum, const int* doc,
                                                          const GqaShape& sh) {
    constexpr int BK = W * 16, LD = GqaTile<HS>::LD, NT = GqaTile<HS>::NT;
    T* Kb = reinterpret_cast<T*>(gqa_smem);   // BK rows
    T* Vb = Kb + BK * LD;                     // BK rows
    T* Qs = Vb + BK * LD;                     // 2 stages
    T* dOs = Qs + 2 * FA_BT * LD;             // 2 stages
    float* Ls = reinterpret_cast<float*>(dOs + 2 * FA_BT * LD);   // 2 stages of lse * log2(e)
    float* Ds = Ls + 2 * FA_BT;                                   // 2 stages of D
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const int T_ = sh.T, R = sh.R(), b = blockIdx.y / sh.KV, kh = blockIdx.y % sh.KV;
    const int k0 = blockIdx.x * BK, kw = k0 + warp * 16;   // block's and warp's first key
    const size_t ld = sh.ld(), ow = (size_t)sh.NH * HS;
    const T* rows = qkv + (size_t)b * T_ * ld;
    const T* dorows = dout + (size_t)b * T_ * ow;
    // With documents the query tiles end with the block's last key's document.
    const int q_end = DOC ? gqa_doc_end(doc, b, T_, min(T_ - 1, k0 + BK - 1)) : T_;
    const int jt0 = k0 / FA_BT, nt = (q_end - 1) / FA_BT + 1 - jt0, iters = R * nt;
    const float scale = 1.0f / sqrtf((float)HS), sl2 = scale * FA_LOG2E;

    gqa_load_tile<T, HS, BK, W>(Kb, rows + sh.kcol(kh), ld, k0, T_);
    gqa_load_tile<T, HS, BK, W>(Vb, rows + sh.vcol(kh), ld, k0, T_);
    cp_async_commit();
    // Iteration it: query head kh*R + it / nt, query tile jt0 + it % nt.
    auto load_q = [&](int it, int st) {
        const int h = kh * R + it / nt, j = jt0 + it % nt;
        gqa_load_tile<T, HS, FA_BT, W>(Qs + st * FA_BT * LD, rows + h * HS, ld, j * FA_BT, T_);
        gqa_load_tile<T, HS, FA_BT, W>(dOs + st * FA_BT * LD, dorows + h * HS, ow, j * FA_BT, T_);
        const float* lrow = lse + ((size_t)b * sh.NH + h) * T_;
        const float* drow = Dsum + ((size_t)b * sh.NH + h) * T_;
        for (int r = threadIdx.x; r < FA_BT; r += W * 32) {   // plain loads: visible after the barrier
            const int t = j * FA_BT + r;
            Ls[st * FA_BT + r] = t < T_ ? lrow[t] * FA_LOG2E : 0.0f;
            Ds[st * FA_BT + r] = t < T_ ? drow[t] : 0.0f;
        }
        cp_async_commit();
    };
    load_q(0, 0);

    float dk[NT][4], dv[NT][4];
    for (int n = 0; n < NT; n++)
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int it = 0; it < iters; it++) {
        const int st = it & 1, j = jt0 + it % nt;
        if (it + 1 < iters) {
            load_q(it + 1, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T* Qt = Qs + st * FA_BT * LD;
        const T* dOt = dOs + st * FA_BT * LD;
        const float* Lt = Ls + st * FA_BT;
        const float* Dt = Ds + st * FA_BT;
        for (int hc = 0; hc < 2; hc++) {
            const int c0 = j * FA_BT + hc * 32;   // first query of the chunk
            if (c0 + 31 < kw) continue;          // every query of the chunk is before every key of the warp
            // or (documents) past T, or in documents after every key of the warp's
            if (DOC && (c0 >= T_ || gqa_doc<DOC>(doc, b, T_, c0) > kw + 15)) continue;
            float s[4][4], dp[4][4];
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            gqa_mma_abt_smem<T, HS, 4>(s, Kb, warp * 16, Qt, hc * 32);
            gqa_mma_abt_smem<T, HS, 4>(dp, Vb, warp * 16, dOt, hc * 32);
            const bool mask = c0 < kw + 15 || c0 + 31 >= T_;
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) {
                    const int col = hc * 32 + n * 8 + 2 * tq + (e & 1), key = kw + g + (e >> 1) * 8, q = j * FA_BT + col;
                    const bool out_of_doc = DOC && q < T_ && gqa_doc<DOC>(doc, b, T_, q) > key;
                    const float p = (mask && (q < key || q >= T_)) || out_of_doc ? 0.0f
                                                                                 : exp2f(fmaf(s[n][e], sl2, -Lt[col]));
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Dt[col]);   // dS
                }
            uint32_t pa[2][4], dsa[2][4];
            for (int kk = 0; kk < 2; kk++) {
                gqa_pack_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
                gqa_pack_a<T>(dsa[kk], dp[2 * kk], dp[2 * kk + 1]);
            }
            gqa_mma_ab<T, HS, 2>(dv, pa, dOt, hc * 32);
            gqa_mma_ab<T, HS, 2>(dk, dsa, Qt, hc * 32);
        }
        __syncthreads();
    }
    // The warp's own rows of Kb / Vb are free (only this warp read them): stage dk, dv there.
    T* dst = dqkv + (size_t)b * T_ * ld;
    gqa_store_rows<T, HS>(dk, scale, Kb, warp * 16, dst + sh.kcol(kh), ld, kw, T_);
    gqa_store_rows<T, HS>(dv, 1.0f, Vb, warp * 16, dst + sh.vcol(kh), ld, kw, T_);
}

template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32) gqa_backward_dkdv_tc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                      const float* lse, const float* Dsum, GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_backward_dkdv_tc_body<T, HS, W, false>(gqa_smem, dqkv, qkv, dout, lse, Dsum, nullptr, sh);
}
template <typename T, int HS, int W>
__global__ void __launch_bounds__(W * 32) gqa_backward_dkdv_tc_doc_kernel(T* dqkv, const T* qkv, const T* dout,
                                                                          const float* lse, const float* Dsum,
                                                                          const int* doc, GqaShape sh) {
    extern __shared__ __align__(128) unsigned char gqa_smem[];
    gqa_backward_dkdv_tc_body<T, HS, W, true>(gqa_smem, dqkv, qkv, dout, lse, Dsum, doc, sh);
}

template <typename T, int HS>
static void gqa_forward_tc(Backend* be, T* out, float* lse, const T* qkv, const int* doc, int B, GqaShape sh) {
    constexpr int W = FA_WARPS;
    const dim3 grid(ceil_div(sh.T, W * 16), B * sh.NH);
    if (doc) {
        CUDA_CHECK(cudaFuncSetAttribute(gqa_forward_tc_doc_kernel<T, HS, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        gqa_fwd_smem<HS, W>()));
        gqa_forward_tc_doc_kernel<T, HS, W><<<grid, W * 32, gqa_fwd_smem<HS, W>(), be_stream(be)>>>(out, lse, qkv, doc, sh);
        LAUNCH_CHECK();
        return;
    }
    CUDA_CHECK(cudaFuncSetAttribute(gqa_forward_tc_kernel<T, HS, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    gqa_fwd_smem<HS, W>()));
    gqa_forward_tc_kernel<T, HS, W><<<grid, W * 32, gqa_fwd_smem<HS, W>(), be_stream(be)>>>(out, lse, qkv, sh);
    LAUNCH_CHECK();
}

template <typename T, int HS>
static void gqa_backward_tc_doc(Backend* be, T* dqkv, float* Dsum, const T* dout, const T* qkv, const T* out,
                                const float* lse, const int* doc, int B, GqaShape sh) {
    constexpr int W = FA_WARPS;
    CUDA_CHECK(cudaFuncSetAttribute(gqa_backward_dq_tc_doc_kernel<T, HS, W>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, gqa_dq_smem<HS, W>()));
    CUDA_CHECK(cudaFuncSetAttribute(gqa_backward_dkdv_tc_doc_kernel<T, HS, W>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, gqa_dkv_smem<HS, W>()));
    const dim3 qgrid(ceil_div(sh.T, W * 16), B * sh.NH), kgrid(ceil_div(sh.T, W * 16), B * sh.KV);
    gqa_backward_dq_tc_doc_kernel<T, HS, W><<<qgrid, W * 32, gqa_dq_smem<HS, W>(), be_stream(be)>>>(
        dqkv, Dsum, qkv, dout, out, lse, doc, sh);
    LAUNCH_CHECK();
    gqa_backward_dkdv_tc_doc_kernel<T, HS, W><<<kgrid, W * 32, gqa_dkv_smem<HS, W>(), be_stream(be)>>>(
        dqkv, qkv, dout, lse, Dsum, doc, sh);
    LAUNCH_CHECK();
}

template <typename T, int HS>
static void gqa_backward_tc(Backend* be, T* dqkv, float* Dsum, const T* dout, const T* qkv, const T* out,
                            const float* lse, const int* doc, int B, GqaShape sh) {
    if (doc) {
        gqa_backward_tc_doc<T, HS>(be, dqkv, Dsum, dout, qkv, out, lse, doc, B, sh);
        return;
    }
    constexpr int W = FA_WARPS;
    CUDA_CHECK(cudaFuncSetAttribute(gqa_backward_dq_tc_kernel<T, HS, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    gqa_dq_smem<HS, W>()));
    CUDA_CHECK(cudaFuncSetAttribute(gqa_backward_dkdv_tc_kernel<T, HS, W>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, gqa_dkv_smem<HS, W>()));
    // dq first: it writes D, which the dk/dv kernel reads.
    const dim3 qgrid(ceil_div(sh.T, W * 16), B * sh.NH), kgrid(ceil_div(sh.T, W * 16), B * sh.KV);
    gqa_backward_dq_tc_kernel<T, HS, W><<<qgrid, W * 32, gqa_dq_smem<HS, W>(), be_stream(be)>>>(dqkv, Dsum, qkv, dout,
                                                                                              out, lse, sh);
    LAUNCH_CHECK();
    gqa_backward_dkdv_tc_kernel<T, HS, W><<<kgrid, W * 32, gqa_dkv_smem<HS, W>(), be_stream(be)>>>(dqkv, qkv, dout, lse,
                                                                                                 Dsum, sh);
    LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------
// Launchers by head size (64 or 128) for attention.cuh.

template <typename T>
static void gqa_forward_tc_hd(Backend* be, void* out, float* lse, const void* qkv, const int* doc, int B, GqaShape sh) {
    if (sh.D == 64) gqa_forward_tc<T, 64>(be, (T*)out, lse, (const T*)qkv, doc, B, sh);
    else gqa_forward_tc<T, 128>(be, (T*)out, lse, (const T*)qkv, doc, B, sh);
}
template <typename T>
static void gqa_backward_tc_hd(Backend* be, void* dqkv, float* Dsum, const void* dout, const void* qkv, const void* out,
                               const float* lse, const int* doc, int B, GqaShape sh) {
    if (sh.D == 64) gqa_backward_tc<T, 64>(be, (T*)dqkv, Dsum, (const T*)dout, (const T*)qkv, (const T*)out, lse, doc, B, sh);
    else gqa_backward_tc<T, 128>(be, (T*)dqkv, Dsum, (const T*)dout, (const T*)qkv, (const T*)out, lse, doc, B, sh);
}
