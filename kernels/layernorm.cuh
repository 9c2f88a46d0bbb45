// layernorm.cuh: LayerNorm over the last dimension, forward and backward.
// dw/db are column sums over all N rows: each block sums a fixed slice of rows into per-block partials
// in scratch, and a second kernel adds the partials in a fixed order (deterministic, no float atomics).
// The backward is the kernel table's layernorm_backward: the norm_one_pass variant forms dinp and those
// partials in one kernel (kernels/variants/norm_one_pass.cuh).
#pragma once
#include "kernels/cuda_backend.cuh"

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

extern "C" void layernorm_forward(Backend* be, DType dt, void* out, float* mean, float* rstd, const void* inp,
                                  const void* w, const void* b, int N, int C) {
    if (C % 8 != 0) fail("layernorm_forward: C=%d must be a multiple of 8", C);
    DISPATCH_DTYPE(dt, X, {
        const int block = 256, rows_per_block = block / 32;
        layernorm_forward_kernel<X><<<ceil_div(N, rows_per_block), block, 0, be_stream(be)>>>(
            (X*)out, mean, rstd, (const X*)inp, (const X*)w, (const X*)b, N, C);
        LAUNCH_CHECK();
    });
}

// The table's layernorm_backward by default (norm_one_pass replaces it).
static void layernorm_backward_default(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                                       const void* inp, const void* w, const float* mean, const float* rstd, int N,
                                       int C) {
    // The row-slice count depends only on N, so the summation order (and the bits) never change.
    int RB = ceil_div(N, LN_ROWS_PER_PASS * 16);
    if (RB > 128) RB = 128;
    float* partial = (float*)be_scratch(be, (size_t)2 * RB * C * sizeof(float), "layernorm_backward");
    DISPATCH_DTYPE(dt, X, {
        const int block = 256, rows_per_block = block / 32;
        layernorm_backward_dinp_kernel<X><<<ceil_div(N, rows_per_block), block, 0, be_stream(be)>>>(
            (X*)dinp, (const X*)dout, (const X*)inp, (const X*)w, mean, rstd, N, C);
        LAUNCH_CHECK();
        layernorm_backward_dwdb_partial_kernel<X><<<dim3(ceil_div(C, 32), RB), dim3(32, LN_ROWS_PER_PASS), 0,
                                                    be_stream(be)>>>(partial, (const X*)dout, (const X*)inp, mean,
                                                                     rstd, N, C);
        LAUNCH_CHECK();
        layernorm_backward_dwdb_final_kernel<X><<<ceil_div(C, 256), 256, 0, be_stream(be)>>>((X*)dw, (X*)db, partial,
                                                                                            RB, C);
        LAUNCH_CHECK();
    });
}

extern "C" void layernorm_backward(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                                   const void* inp, const void* w, const float* mean, const float* rstd, int N, int C) {
    if (C % 8 != 0) fail("layernorm_backward: C=%d must be a multiple of 8", C);
    be_kernels(be)->layernorm_backward(be, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
