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
// This is the CUDA-core version; it is correct for every hs % 8 == 0 up to 128.
#pragma once

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
    DISPATCH_DTYPE(dt, X, {
        attention_backward_d_kernel<X><<<ceil_div((size_t)B * T * NH, 256), 256, 0, be->stream>>>(
            D, (const X*)dout, (const X*)out, B, T, C, NH);
        LAUNCH_CHECK();
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
