// layernorm.cuh: LayerNorm over the last dimension, forward and backward.
// dw/db are column sums over all N rows: each block sums a fixed slice of rows into per-block partials
// in scratch, and a second kernel adds the partials in a fixed order (deterministic, no float atomics).
// Under VARIANT_NORM_ONE_PASS the backward forms dinp and those partials in one kernel (norm1_*, below),
// which rmsnorm.cuh shares.
#pragma once

#define LN_EPS 1e-5f

// One warp per row; the row is read twice (mean, then centred variance) and once more to write.
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                                         int N, int C) {
    constexpr int P = Pack128<T>::size;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const T* x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane * P; c < C; c += 32 * P) {
        const Pack128<T> v = load128(x + c);
        for (int k = 0; k < P; k++) s += v.get(k);
    }
    const float m = warp_sum(s) / C;
    float ss = 0.0f;
    for (int c = lane * P; c < C; c += 32 * P) {
        const Pack128<T> v = load128(x + c);
        for (int k = 0; k < P; k++) {
            const float d = v.get(k) - m;
            ss += d * d;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / C + LN_EPS);
    for (int c = lane * P; c < C; c += 32 * P) {
        const Pack128<T> v = load128(x + c), wv = load128(w + c), bv = load128(b + c);
        Pack128<T> o;
        for (int k = 0; k < P; k++) o.set(k, (v.get(k) - m) * r * wv.get(k) + bv.get(k));
        store128(out + (size_t)row * C + c, o);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dinp (N,C) += (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd, dnorm = dout * w. One warp per row.
template <typename T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* mean,
                                               const float* rstd, int N, int C) {
    constexpr int P = Pack128<T>::size;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const float m = mean[row], r = rstd[row];
    float sum_dn = 0.0f, sum_dn_xh = 0.0f;
    for (int c = lane * P; c < C; c += 32 * P) {
        const Pack128<T> d = load128(dout + off + c), x = load128(inp + off + c), wv = load128(w + c);
        for (int k = 0; k < P; k++) {
            const float dn = d.get(k) * wv.get(k);
            sum_dn += dn;
            sum_dn_xh += dn * (x.get(k) - m) * r;
        }
    }
    const float dn_mean = warp_sum(sum_dn) / C, dn_xh_mean = warp_sum(sum_dn_xh) / C;
    for (int c = lane * P; c < C; c += 32 * P) {
        const Pack128<T> d = load128(dout + off + c), x = load128(inp + off + c), wv = load128(w + c);
        Pack128<T> g = load128(dinp + off + c);
        for (int k = 0; k < P; k++) {
            const float xh = (x.get(k) - m) * r;
            const float dn = d.get(k) * wv.get(k);
            g.set(k, g.get(k) + (dn - dn_mean - xh * dn_xh_mean) * r);
        }
        store128(dinp + off + c, g);
    }
}

// Block (32, LN_ROWS_PER_PASS): column c = blockIdx.x*32 + tx, rows strided over blockIdx.y's slice.
// partial[blockIdx.y][c] and partial[RB + blockIdx.y][c] get this slice's dw and db sums.
#define LN_ROWS_PER_PASS 8
template <typename T>
__global__ void layernorm_backward_dwdb_partial_kernel(float* partial, const T* dout, const T* inp, const float* mean,
                                                       const float* rstd, int N, int C) {
    __shared__ float sdw[LN_ROWS_PER_PASS][33], sdb[LN_ROWS_PER_PASS][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int RB = gridDim.y;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int n = blockIdx.y * LN_ROWS_PER_PASS + threadIdx.y; n < N; n += RB * LN_ROWS_PER_PASS) {
            const float d = to_f(dout[(size_t)n * C + c]);
            const float xh = (to_f(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
            dw += d * xh;
            db += d;
        }
    }
    sdw[threadIdx.y][threadIdx.x] = dw;
    sdb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < LN_ROWS_PER_PASS; y++) {
            dw += sdw[y][threadIdx.x];
            db += sdb[y][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * C + c] = dw;
        partial[(size_t)(RB + blockIdx.y) * C + c] = db;
    }
}

// Column sums of `partial` (2*RB rows of C) in row order, added to dw and db.
template <typename T>
__global__ void layernorm_backward_dwdb_final_kernel(T* dw, T* db, const float* partial, int RB, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int r = 0; r < RB; r++) {
        sw += partial[(size_t)r * C + c];
        sb += partial[(size_t)(RB + r) * C + c];
    }
    dw[c] = from_f<T>(to_f(dw[c]) + sw);
    db[c] = from_f<T>(to_f(db[c]) + sb);
}

// ---------------------------------------------------------------------------------------------------
// One-pass backward (VARIANT_NORM_ONE_PASS), also used by rmsnorm.cuh. The default reads dout and inp from
// memory twice, once by rows for dinp and once by columns for the weight gradients; this reads them once.
// Block b of G owns the rows [b*rows/G, (b+1)*rows/G); within it warp w takes rows w, w + NORM1_WARPS, ...
// and computes each one's dinp as the default's warp-per-row kernel does, adding the row's dw (db) terms to
// per-lane registers for the columns that lane reads. The block then sums its warps in warp order into one
// partial row in scratch, and norm1_final_kernel sums the G partial rows in a fixed order. G comes from the
// shape alone (norm1_blocks), so every sum's order, and the bits, depend only on the shape.
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
    norm1_final_kernel<T><<<ceil_div(C, 32), dim3(32, NORM1_FINAL_SPLIT), 0, be->stream>>>(dw, db, partial, G, C);
    LAUNCH_CHECK();
}

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
    layernorm_backward_one_pass_kernel<T, Lv><<<G, NORM1_THREADS, 0, be->stream>>>(dinp, partial, dout, inp, w, \
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

// VARIANT_NORM_ONE_PASS for C <= 32*LN1_MAX_LANE_COLS (the caller checks): one pass, then the partials' sums.
static void layernorm_backward_one_pass(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
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

extern "C" void layernorm_forward(Backend* be, DType dt, void* out, float* mean, float* rstd, const void* inp,
                                  const void* w, const void* b, int N, int C) {
    if (C % 8 != 0) fail("layernorm_forward: C=%d must be a multiple of 8", C);
    DISPATCH_DTYPE(dt, X, {
        const int block = 256, rows_per_block = block / 32;
        layernorm_forward_kernel<X><<<ceil_div(N, rows_per_block), block, 0, be->stream>>>(
            (X*)out, mean, rstd, (const X*)inp, (const X*)w, (const X*)b, N, C);
        LAUNCH_CHECK();
    });
}

extern "C" void layernorm_backward(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                                   const void* inp, const void* w, const float* mean, const float* rstd, int N, int C) {
    if (C % 8 != 0) fail("layernorm_backward: C=%d must be a multiple of 8", C);
    // A wider C would need more accumulators per lane than the one-pass kernel holds: the default path.
    if (variant_on(be, VARIANT_NORM_ONE_PASS) && norm1_lane_cols(C, LN1_MAX_LANE_COLS) != 0) {
        layernorm_backward_one_pass(be, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        return;
    }
    // The row-slice count depends only on N, so the summation order (and the bits) never change.
    int RB = ceil_div(N, LN_ROWS_PER_PASS * 16);
    if (RB > 128) RB = 128;
    float* partial = (float*)be_scratch(be, (size_t)2 * RB * C * sizeof(float), "layernorm_backward");
    DISPATCH_DTYPE(dt, X, {
        const int block = 256, rows_per_block = block / 32;
        layernorm_backward_dinp_kernel<X><<<ceil_div(N, rows_per_block), block, 0, be->stream>>>(
            (X*)dinp, (const X*)dout, (const X*)inp, (const X*)w, mean, rstd, N, C);
        LAUNCH_CHECK();
        layernorm_backward_dwdb_partial_kernel<X><<<dim3(ceil_div(C, 32), RB), dim3(32, LN_ROWS_PER_PASS), 0,
                                                    be->stream>>>(partial, (const X*)dout, (const X*)inp, mean,
                                                                  rstd, N, C);
        LAUNCH_CHECK();
        layernorm_backward_dwdb_final_kernel<X><<<ceil_div(C, 256), 256, 0, be->stream>>>((X*)dw, (X*)db, partial,
                                                                                         RB, C);
        LAUNCH_CHECK();
    });
}
