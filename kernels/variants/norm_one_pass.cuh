// norm_one_pass.cuh: the norm_one_pass kernel variant (base/gpu_variants.h): the LayerNorm, RMSNorm and q-k-norm
// backwards in one pass. The defaults (layernorm.cuh, rmsnorm.cuh) read dout and inp from memory twice, once by
// rows for dinp and once by columns for the weight gradients; these read them once. Block b of G owns the rows
// [b*rows/G, (b+1)*rows/G); within it warp w takes rows w, w + NORM1_WARPS, ... and computes each one's dinp as
// the default's warp-per-row kernel does, adding the row's dw (db) terms to per-lane registers for the columns
// that lane reads. The block then sums its warps in warp order into one partial row in scratch, and
// norm1_final_kernel sums the G partial rows in a fixed order. G comes from the shape alone (norm1_blocks), so
// every sum's order, and the bits, depend only on the shape. It replaces the kernel table's layernorm_backward,
// rmsnorm_backward and qk_norm_backward; rows wider than its accumulators hold, or (RMSNorm) not whole 16-byte
// packs, go to the defaults.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/rmsnorm.cuh"

#define NORM1_WARPS 8
#define NORM1_THREADS (NORM1_WARPS * 32)
#define NORM1_MIN_ROWS 16       // rows per block at least: a block per SM from ~2k rows, the partials small
#define NORM1_FINAL_SPLIT 32    // partial rows summed in parallel per column by norm1_final_kernel

// Columns per lane that hold accumulators: the smallest of 8, 16, ..., max whose 32 lanes cover C, or 0
// when none does (the caller then takes the default path).
static int norm1_lane_cols(int C, int max) {
    for (int L = 8; L <= max; L *= 2)
        if (32 * L >= C) return L;
    return 0;
}

// One block per NORM1_MIN_ROWS rows, capped to keep the partials small. `accs` (accumulators per thread)
// bounds the registers: the fewer, the more blocks stay resident per SM, and the higher the cap.
static int norm1_blocks(long long rows, int accs) {
    const long long cap = accs <= 16 ? 1024 : accs <= 32 ? 512 : 256;
    const long long g = (rows + NORM1_MIN_ROWS - 1) / NORM1_MIN_ROWS;
    return (int)(g < cap ? g : cap);
}

// out[c] (C) = the block's warps' acc for column c, added in warp order. Lane l of a warp holds column
// (j*32 + l)*P + k in acc[j][k]; `stage` holds NORM1_WARPS*32*P floats. Every thread of the block calls it.
template <int P, int J>
__device__ __forceinline__ void norm1_block_partial(float* out, const float (&acc)[J][P], int C, float* stage) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c0 = j * 32 * P;   // this round: columns [c0, c0 + 32*P)
        if (c0 >= C) break;          // the same for the whole block, so no thread skips a barrier
#pragma unroll
        for (int k = 0; k < P; k++) stage[(warp * 32 + lane) * P + k] = acc[j][k];
        __syncthreads();
        for (int t = threadIdx.x; t < 32 * P && c0 + t < C; t += NORM1_THREADS) {
            float s = 0.0f;
            for (int v = 0; v < NORM1_WARPS; v++) s += stage[v * 32 * P + t];
            out[c0 + t] = s;
        }
        __syncthreads();   // `stage` is rewritten next round
    }
}

// dw[c] += the column sum of partial rows [0, G), and db[c] (unless db is NULL) that of rows [G, 2G), both
// in one thread as layernorm_backward_dwdb_final_kernel does. Block (32, NORM1_FINAL_SPLIT): thread y sums
// rows y, y + SPLIT, ... in order, then y = 0 adds those sums in y order.
template <typename T>
__global__ void norm1_final_kernel(T* dw, T* db, const float* partial, int G, int C) {
    __shared__ float sums[2][NORM1_FINAL_SPLIT][32];
    const int x = threadIdx.x, y = threadIdx.y, c = blockIdx.x * 32 + x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int g = y; g < G; g += NORM1_FINAL_SPLIT) {
            sw += partial[(size_t)g * C + c];
            if (db) sb += partial[(size_t)(G + g) * C + c];
        }
    sums[0][y][x] = sw;
    sums[1][y][x] = sb;
    __syncthreads();
    if (y != 0 || c >= C) return;
    for (int i = 1; i < NORM1_FINAL_SPLIT; i++) {
        sw += sums[0][i][x];
        sb += sums[1][i][x];
    }
    dw[c] = from_f<T>(to_f(dw[c]) + sw);
    if (db) db[c] = from_f<T>(to_f(db[c]) + sb);
}

template <typename T>
static void norm1_final(Backend* be, T* dw, T* db, const float* partial, int G, int C) {
    norm1_final_kernel<T><<<ceil_div(C, 32), dim3(32, NORM1_FINAL_SPLIT), 0, be_stream(be)>>>(dw, db, partial, G, C);
    LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------
// LayerNorm.

// One row's first pass: its sums of dn and dn * xhat (this lane's share; the same terms in the same order as
// layernorm_backward_dinp_kernel), with the row's dw and db terms added to the lane's accumulators.
template <typename T, int J>
__device__ __forceinline__ float2 ln1_row_sums(float (&dw)[J][Pack128<T>::size], float (&db)[J][Pack128<T>::size],
                                               const T* dout, const T* inp, const T* w, float m, float r, int C) {
    constexpr int P = Pack128<T>::size;
    const int lane = threadIdx.x % 32;
    float sum_dn = 0.0f, sum_dn_xh = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = (j * 32 + lane) * P;
        if (c >= C) break;
        const Pack128<T> d = load128(dout + c), x = load128(inp + c), wv = load128(w + c);
#pragma unroll
        for (int k = 0; k < P; k++) {
            const float dn = d.get(k) * wv.get(k);
            sum_dn += dn;
            sum_dn_xh += dn * (x.get(k) - m) * r;
            const float xh = (x.get(k) - m) * r;
            dw[j][k] += d.get(k) * xh;
            db[j][k] += d.get(k);
        }
    }
    return make_float2(sum_dn, sum_dn_xh);
}

// One row's dinp (C) += (dn - dn_mean - xhat * dn_xh_mean) * rstd: layernorm_backward_dinp_kernel's second loop.
template <typename T>
__device__ __forceinline__ void ln1_row_dinp(T* dinp, const T* dout, const T* inp, const T* w, float m, float r,
                                             float dn_mean, float dn_xh_mean, int C) {
    constexpr int P = Pack128<T>::size;
    for (int c = (threadIdx.x % 32) * P; c < C; c += 32 * P) {
        const Pack128<T> d = load128(dout + c), x = load128(inp + c), wv = load128(w + c);
        Pack128<T> g = load128(dinp + c);
        for (int k = 0; k < P; k++) {
            const float xh = (x.get(k) - m) * r;
            const float dn = d.get(k) * wv.get(k);
            g.set(k, g.get(k) + (dn - dn_mean - xh * dn_xh_mean) * r);
        }
        store128(dinp + c, g);
    }
}

// dinp (N,C) += as layernorm_backward_dinp_kernel; partial rows b and G + b get block b's dw and db sums.
// L columns per lane (L/P packs), C <= 32*L. Grid G = gridDim.x, block NORM1_THREADS.
template <typename T, int L>
__global__ void __launch_bounds__(NORM1_THREADS)
    layernorm_backward_one_pass_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* w,
                                       const float* mean, const float* rstd, int N, int C) {
    constexpr int P = Pack128<T>::size, J = L / P;
    __shared__ float stage[NORM1_WARPS * 32 * P];
    const int r0 = (int)((long long)blockIdx.x * N / gridDim.x);
    const int r1 = (int)((long long)(blockIdx.x + 1) * N / gridDim.x);
    float dw[J][P] = {}, db[J][P] = {};
    for (int row = r0 + threadIdx.x / 32; row < r1; row += NORM1_WARPS) {
        const size_t off = (size_t)row * C;
        const float m = mean[row], r = rstd[row];
        const float2 s = ln1_row_sums<T, J>(dw, db, dout + off, inp + off, w, m, r, C);
        ln1_row_dinp<T>(dinp + off, dout + off, inp + off, w, m, r, warp_sum(s.x) / C, warp_sum(s.y) / C, C);
    }
    norm1_block_partial<P, J>(partial + (size_t)blockIdx.x * C, dw, C, stage);
    norm1_block_partial<P, J>(partial + (size_t)(gridDim.x + blockIdx.x) * C, db, C, stage);
}

// The most columns per lane layernorm_backward_one_pass_kernel takes (C <= 2048): two accumulators each.
#define LN1_MAX_LANE_COLS 64

template <typename T>
static void ln1_launch(Backend* be, int L, int G, float* partial, T* dinp, const T* dout, const T* inp, const T* w,
                       const float* mean, const float* rstd, int N, int C) {
#define LN1(Lv)                                                                                            \
    layernorm_backward_one_pass_kernel<T, Lv><<<G, NORM1_THREADS, 0, be_stream(be)>>>(dinp, partial, dout, inp, w, \
                                                                                      mean, rstd, N, C)
    switch (L) {
    case 8: LN1(8); break;
    case 16: LN1(16); break;
    case 32: LN1(32); break;
    case 64: LN1(64); break;
    default: fail("layernorm_backward: no one-pass kernel for %d columns per lane", L);
    }
#undef LN1
    LAUNCH_CHECK();
}

// C <= 32*LN1_MAX_LANE_COLS (the caller checks): one pass, then the partials' sums.
static void layernorm_backward_one_pass_rows(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                                        const void* inp, const void* w, const float* mean, const float* rstd, int N,
                                        int C) {
    if (N == 0) return;
    const int L = norm1_lane_cols(C, LN1_MAX_LANE_COLS), G = norm1_blocks(N, 2 * L);
    float* partial = (float*)be_scratch(be, (size_t)2 * G * C * sizeof(float), "layernorm_backward");
    DISPATCH_DTYPE(dt, X, {
        ln1_launch<X>(be, L, G, partial, (X*)dinp, (const X*)dout, (const X*)inp, (const X*)w, mean, rstd, N, C);
        norm1_final<X>(be, (X*)dw, (X*)db, partial, G, C);
    });
}

// ---------------------------------------------------------------------------------------------------
// RMSNorm and qk_norm: the scheme over RmsRows. Rows whose channels are not whole 16-byte packs take the default
// path (rms1_fits).

// One row's dinp (D) += or = (dn - xhat * dot) * rstd: rms_backward_dinp_kernel's second loop.
template <typename T, int P>
__device__ __forceinline__ void rms1_row_dinp(T* dinp, const T* dout, const T* inp, const T* w, float rs, float dot,
                                              int D, bool accumulate) {
    for (int c = (threadIdx.x % 32) * P; c < D; c += 32 * P) {
        float d[P], x[P], wv[P], g[P] = {};
        load_f<P>(d, dout + c);
        load_f<P>(x, inp + c);
        load_f<P>(wv, w + c);
        if (accumulate) load_f<P>(g, dinp + c);
        for (int i = 0; i < P; i++) {
            const float v = (d[i] * wv[i] - x[i] * rs * dot) * rs;
            g[i] = accumulate ? g[i] + v : v;
        }
        store_f<P>(dinp + c, g);
    }
}

// dinp as rms_backward_dinp_kernel; partial row b gets block b's dw sums. The rows (n, h) are numbered
// k = n*H + h as there. L columns per lane (L/P packs), D <= 32*L. Grid G = gridDim.x, block NORM1_THREADS.
template <typename T, int L>
__global__ void __launch_bounds__(NORM1_THREADS)
    rms_backward_one_pass_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* w, const float* rstd,
                                 RmsRows r, bool accumulate) {
    constexpr int P = Pack128<T>::size, J = L / P;
    __shared__ float stage[NORM1_WARPS * 32 * P];
    const int lane = threadIdx.x % 32;
    const long long rows = (long long)r.N * r.H;
    const long long k0 = (long long)blockIdx.x * rows / gridDim.x;
    const long long k1 = (long long)(blockIdx.x + 1) * rows / gridDim.x;
    float dw[J][P] = {};
    for (long long k = k0 + threadIdx.x / 32; k < k1; k += NORM1_WARPS) {
        const size_t o = r.off(k);
        const float rs = rstd[r.stat(k)];
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c = (j * 32 + lane) * P;
            if (c >= r.D) break;
            float d[P], x[P], wv[P];
            load_f<P>(d, dout + o + c);
            load_f<P>(x, inp + o + c);
            load_f<P>(wv, w + c);
#pragma unroll
            for (int i = 0; i < P; i++) {
                dot += d[i] * wv[i] * x[i] * rs;
                dw[j][i] += d[i] * x[i] * rs;
            }
        }
        rms1_row_dinp<T, P>(dinp + o, dout + o, inp + o, w, rs, warp_sum(dot) / r.D, r.D, accumulate);
    }
    norm1_block_partial<P, J>(partial + (size_t)blockIdx.x * r.D, dw, r.D, stage);
}

// The most columns per lane rms_backward_one_pass_kernel takes (D <= 4096): one accumulator each.
#define RMS1_MAX_LANE_COLS 128

// The one-pass kernel reads whole 16-byte packs (the default's vec case) and holds at most
// RMS1_MAX_LANE_COLS columns per lane; any other rows take the default path.
static bool rms1_fits(DType dt, const void* dinp, const void* dout, const void* inp, const void* w, RmsRows r) {
    return r.D % (16 / (int)dtype_size(dt)) == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
           aligned16(w) && norm1_lane_cols(r.D, RMS1_MAX_LANE_COLS) != 0;
}

template <typename T>
static void rms1_launch(Backend* be, int L, int G, float* partial, T* dinp, const T* dout, const T* inp, const T* w,
                        const float* rstd, RmsRows r, bool accumulate) {
#define RMS1(Lv)                                                                                           \
    rms_backward_one_pass_kernel<T, Lv><<<G, NORM1_THREADS, 0, be_stream(be)>>>(dinp, partial, dout, inp, w, rstd, r, \
                                                                                accumulate)
    switch (L) {
    case 8: RMS1(8); break;
    case 16: RMS1(16); break;
    case 32: RMS1(32); break;
    case 64: RMS1(64); break;
    case 128: RMS1(128); break;
    default: fail("rms backward: no one-pass kernel for %d columns per lane", L);
    }
#undef RMS1
    LAUNCH_CHECK();
}

// dinp and dw of the rows r in one pass, then the partials' sums into dw; the caller checked rms1_fits.
static void rms1_backward_rows(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp,
                               const void* w, const float* rstd, RmsRows r, bool accumulate, const char* who) {
    const long long rows = (long long)r.N * r.H;
    if (rows == 0 || r.D == 0) return;
    const int L = norm1_lane_cols(r.D, RMS1_MAX_LANE_COLS), G = norm1_blocks(rows, L);
    float* partial = (float*)be_scratch(be, (size_t)G * r.D * sizeof(float), who);
    DISPATCH_DTYPE(dt, X, {
        rms1_launch<X>(be, L, G, partial, (X*)dinp, (const X*)dout, (const X*)inp, (const X*)w, rstd, r, accumulate);
        norm1_final<X>(be, (X*)dw, (X*)NULL, partial, G, r.D);
    });
}

// ---------------------------------------------------------------------------------------------------
// The table's entries.

static void layernorm_backward_one_pass(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                                        const void* inp, const void* w, const float* mean, const float* rstd, int N,
                                        int C) {
    // A wider C would need more accumulators per lane than the one-pass kernel holds: the default path.
    if (norm1_lane_cols(C, LN1_MAX_LANE_COLS) == 0) {
        layernorm_backward_default(be, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        return;
    }
    layernorm_backward_one_pass_rows(be, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void rmsnorm_backward_one_pass(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp,
                                      const void* w, const float* rstd, int N, int C) {
    const RmsRows r{N, 1, C, 0, 1, (size_t)C};
    if (!rms1_fits(dt, dinp, dout, inp, w, r)) {
        rmsnorm_backward_default(be, dt, dinp, dw, dout, inp, w, rstd, N, C);
        return;
    }
    rms1_backward_rows(be, dt, dinp, dw, dout, inp, w, rstd, r, true, "rmsnorm_backward");
}

static void qk_norm_backward_one_pass(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout,
                                      const void* inp, const void* qw, const void* kw, const float* rstd, int N, int NH,
                                      int KV, int D) {
    const RmsRows q = q_rows(N, NH, KV, D), k = k_rows(N, NH, KV, D);
    if (!rms1_fits(dt, dinp, dout, inp, qw, q) || !rms1_fits(dt, dinp, dout, inp, kw, k)) {
        qk_norm_backward_default(be, dt, dinp, dqw, dkw, dout, inp, qw, kw, rstd, N, NH, KV, D);
        return;
    }
    rms1_backward_rows(be, dt, dinp, dqw, dout, inp, qw, rstd, q, false, "qk_norm_backward");
    rms1_backward_rows(be, dt, dinp, dkw, dout, inp, kw, rstd, k, false, "qk_norm_backward");
    qkv_copy_v(be, dt, dinp, dout, N, NH, KV, D);
}

static void norm_one_pass_register(Backend* be, KernelTable* t) {
    t->layernorm_backward = layernorm_backward_one_pass;
    t->rmsnorm_backward = rmsnorm_backward_one_pass;
    t->qk_norm_backward = qk_norm_backward_one_pass;
}
