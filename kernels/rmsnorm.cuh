// rmsnorm.cuh: RMSNorm over the last dimension, and the per-head RMSNorm of q and k in packed qkv (qk_norm).
// Both normalize "rows" (as rmsnorm.c): spans of D channels at a fixed stride, one warp per row. dw is a column
// sum over all rows: each block sums a fixed slice of rows into per-block partials in scratch, and a second
// kernel adds the partials in a fixed order (deterministic, no float atomics), as layernorm.cuh does; that
// kernel is matmul.cuh's bias-gradient one, so this file is included after matmul.cuh. Under
// VARIANT_NORM_ONE_PASS the backward takes layernorm.cuh's one-pass scheme (norm1_*), included before this.
#pragma once

// Rows (n, h), n < N, h < H: channels [n*W + (h0 + h)*D, + D) of the tensor, rstd at n*S + h0 + h.
struct RmsRows {
    int N, H, D, h0, S;
    size_t W;
    __device__ __forceinline__ size_t off(long long k) const { return (size_t)(k / H) * W + (size_t)(h0 + k % H) * D; }
    __device__ __forceinline__ size_t stat(long long k) const { return (size_t)(k / H) * S + h0 + k % H; }
};

template <typename T, int P>
__global__ void rms_forward_kernel(T* out, float* rstd, const T* inp, const T* w, RmsRows r, float eps) {
    const int lane = threadIdx.x % 32;
    const long long k = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (k >= (long long)r.N * r.H) return;
    const size_t o = r.off(k);
    float ss = 0.0f;
    for (int c = lane * P; c < r.D; c += 32 * P) {
        float x[P];
        load_f<P>(x, inp + o + c);
        for (int i = 0; i < P; i++) ss += x[i] * x[i];
    }
    const float rs = 1.0f / sqrtf(warp_sum(ss) / r.D + eps);
    for (int c = lane * P; c < r.D; c += 32 * P) {
        float x[P], wv[P];
        load_f<P>(x, inp + o + c);
        load_f<P>(wv, w + c);
        for (int i = 0; i < P; i++) x[i] = x[i] * rs * wv[i];
        store_f<P>(out + o + c, x);
    }
    if (lane == 0) rstd[r.stat(k)] = rs;
}

// dinp = (dn - xhat * mean(dn * xhat)) * rstd, dn = dout * w, xhat = inp * rstd; added (RMSNorm: the residual)
// or stored (qk_norm).
template <typename T, int P>
__global__ void rms_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* rstd, RmsRows r,
                                         bool accumulate) {
    const int lane = threadIdx.x % 32;
    const long long k = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (k >= (long long)r.N * r.H) return;
    const size_t o = r.off(k);
    const float rs = rstd[r.stat(k)];
    float dot = 0.0f;
    for (int c = lane * P; c < r.D; c += 32 * P) {
        float d[P], x[P], wv[P];
        load_f<P>(d, dout + o + c);
        load_f<P>(x, inp + o + c);
        load_f<P>(wv, w + c);
        for (int i = 0; i < P; i++) dot += d[i] * wv[i] * x[i] * rs;
    }
    dot = warp_sum(dot) / r.D;
    for (int c = lane * P; c < r.D; c += 32 * P) {
        float d[P], x[P], wv[P], g[P] = {};
        load_f<P>(d, dout + o + c);
        load_f<P>(x, inp + o + c);
        load_f<P>(wv, w + c);
        if (accumulate) load_f<P>(g, dinp + o + c);
        for (int i = 0; i < P; i++) {
            const float v = (d[i] * wv[i] - x[i] * rs * dot) * rs;
            g[i] = accumulate ? g[i] + v : v;
        }
        store_f<P>(dinp + o + c, g);
    }
}

// Block (32, RMS_ROWS_PER_PASS): channel c = blockIdx.x*32 + tx, rows strided over blockIdx.y's slice;
// partial[blockIdx.y][c] gets this slice's sum of dout * xhat.
#define RMS_ROWS_PER_PASS 8
template <typename T>
__global__ void rms_backward_dw_partial_kernel(float* partial, const T* dout, const T* inp, const float* rstd, RmsRows r) {
    __shared__ float sdw[RMS_ROWS_PER_PASS][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const long long rows = (long long)r.N * r.H;
    float dw = 0.0f;
    if (c < r.D) {
        for (long long k = blockIdx.y * RMS_ROWS_PER_PASS + threadIdx.y; k < rows; k += gridDim.y * RMS_ROWS_PER_PASS) {
            const size_t o = r.off(k) + c;
            dw += to_f(dout[o]) * to_f(inp[o]) * rstd[r.stat(k)];
        }
    }
    sdw[threadIdx.y][threadIdx.x] = dw;
    __syncthreads();
    if (threadIdx.y == 0 && c < r.D) {
        for (int y = 1; y < RMS_ROWS_PER_PASS; y++) dw += sdw[y][threadIdx.x];
        partial[(size_t)blockIdx.y * r.D + c] = dw;
    }
}

// One warp per row, 16-byte packs when every row start is 16-byte aligned (D a whole number of packs).
#define RMS_LAUNCH(kernel, T, vec, r, ...)                                                               \
    do {                                                                                                 \
        const int block_ = 256, grid_ = ceil_div((long long)(r).N * (r).H, block_ / 32);                 \
        if (vec) kernel<T, Pack128<T>::size><<<grid_, block_, 0, be->stream>>>(__VA_ARGS__);             \
        else kernel<T, 1><<<grid_, block_, 0, be->stream>>>(__VA_ARGS__);                                \
        LAUNCH_CHECK();                                                                                  \
    } while (0)

static void rms_forward_rows(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* w, RmsRows r,
                             float eps) {
    if ((long long)r.N * r.H == 0) return;
    const bool vec = r.D % (16 / (int)dtype_size(dt)) == 0 && aligned16(out) && aligned16(inp) && aligned16(w);
    DISPATCH_DTYPE(dt, X, RMS_LAUNCH(rms_forward_kernel, X, vec, r, (X*)out, rstd, (const X*)inp, (const X*)w, r, eps));
}

static void rms_backward_dinp_rows(Backend* be, DType dt, void* dinp, const void* dout, const void* inp, const void* w,
                                   const float* rstd, RmsRows r, bool accumulate) {
    if ((long long)r.N * r.H == 0) return;
    const bool vec = r.D % (16 / (int)dtype_size(dt)) == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                     aligned16(w);
    DISPATCH_DTYPE(dt, X, RMS_LAUNCH(rms_backward_dinp_kernel, X, vec, r, (X*)dinp, (const X*)dout, (const X*)inp,
                                     (const X*)w, rstd, r, accumulate));
}

static void rms_backward_dw_rows(Backend* be, DType dt, void* dw, const void* dout, const void* inp, const float* rstd,
                                 RmsRows r, const char* who) {
    // The row-slice count depends only on the row count, so the summation order (and the bits) never change.
    const long long rows = (long long)r.N * r.H;
    if (rows == 0 || r.D == 0) return;
    int RB = ceil_div(rows, RMS_ROWS_PER_PASS * 16);
    if (RB > 128) RB = 128;
    float* partial = (float*)be_scratch(be, (size_t)RB * r.D * sizeof(float), who);
    DISPATCH_DTYPE(dt, X, {
        rms_backward_dw_partial_kernel<X><<<dim3(ceil_div(r.D, 32), RB), dim3(32, RMS_ROWS_PER_PASS), 0, be->stream>>>(
            partial, (const X*)dout, (const X*)inp, rstd, r);
        LAUNCH_CHECK();
        // matmul.cuh's column sums of the partials in row order, added to dw.
        bias_grad_final_kernel<X><<<ceil_div(r.D, 256), 256, 0, be->stream>>>((X*)dw, partial, RB, r.D);
        LAUNCH_CHECK();
    });
}

// ---------------------------------------------------------------------------------------------------
// One-pass backward (VARIANT_NORM_ONE_PASS): layernorm.cuh's scheme (why, and how the order is fixed, are
// there) over RmsRows. Rows whose channels are not whole 16-byte packs take the default path (rms1_fits).

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
    rms_backward_one_pass_kernel<T, Lv><<<G, NORM1_THREADS, 0, be->stream>>>(dinp, partial, dout, inp, w, rstd, r, \
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

extern "C" void rmsnorm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* w, int N, int C,
                                float eps) {
    rms_forward_rows(be, dt, out, rstd, inp, w, RmsRows{N, 1, C, 0, 1, (size_t)C}, eps);
}

extern "C" void rmsnorm_backward(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp,
                                 const void* w, const float* rstd, int N, int C) {
    const RmsRows r{N, 1, C, 0, 1, (size_t)C};
    if (variant_on(be, VARIANT_NORM_ONE_PASS) && rms1_fits(dt, dinp, dout, inp, w, r)) {
        rms1_backward_rows(be, dt, dinp, dw, dout, inp, w, rstd, r, true, "rmsnorm_backward");
        return;
    }
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, w, rstd, r, true);
    rms_backward_dw_rows(be, dt, dw, dout, inp, rstd, r, "rmsnorm_backward");
}

// The q heads' rows and the k heads' rows of packed qkv; rstd (N, NH+KV) holds q's then k's.
static RmsRows q_rows(int N, int NH, int KV, int D) { return RmsRows{N, NH, D, 0, NH + KV, (size_t)(NH + 2 * KV) * D}; }
static RmsRows k_rows(int N, int NH, int KV, int D) { return RmsRows{N, KV, D, NH, NH + KV, (size_t)(NH + 2 * KV) * D}; }

// The v part (the last KV*D channels) of every row of packed qkv, copied unchanged. Shared with rope.cuh.
static void qkv_copy_v(Backend* be, DType dt, void* dst, const void* src, int N, int NH, int KV, int D) {
    if (N == 0 || KV == 0 || D == 0) return;
    const size_t es = dtype_size(dt), pitch = (size_t)(NH + 2 * KV) * D * es, v0 = (size_t)(NH + KV) * D * es;
    CUDA_CHECK(cudaMemcpy2DAsync((char*)dst + v0, pitch, (const char*)src + v0, pitch, (size_t)KV * D * es, (size_t)N,
                                 cudaMemcpyDeviceToDevice, be->stream));
}

extern "C" void qk_norm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* qw,
                                const void* kw, int N, int NH, int KV, int D, float eps) {
    rms_forward_rows(be, dt, out, rstd, inp, qw, q_rows(N, NH, KV, D), eps);
    rms_forward_rows(be, dt, out, rstd, inp, kw, k_rows(N, NH, KV, D), eps);
    qkv_copy_v(be, dt, out, inp, N, NH, KV, D);
}

extern "C" void qk_norm_backward(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout,
                                 const void* inp, const void* qw, const void* kw, const float* rstd, int N, int NH,
                                 int KV, int D) {
    const RmsRows q = q_rows(N, NH, KV, D), k = k_rows(N, NH, KV, D);
    if (variant_on(be, VARIANT_NORM_ONE_PASS) && rms1_fits(dt, dinp, dout, inp, qw, q) &&
        rms1_fits(dt, dinp, dout, inp, kw, k)) {
        rms1_backward_rows(be, dt, dinp, dqw, dout, inp, qw, rstd, q, false, "qk_norm_backward");
        rms1_backward_rows(be, dt, dinp, dkw, dout, inp, kw, rstd, k, false, "qk_norm_backward");
        qkv_copy_v(be, dt, dinp, dout, N, NH, KV, D);
        return;
    }
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, qw, rstd, q, false);
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, kw, rstd, k, false);
    qkv_copy_v(be, dt, dinp, dout, N, NH, KV, D);
    rms_backward_dw_rows(be, dt, dqw, dout, inp, rstd, q, "qk_norm_backward");
    rms_backward_dw_rows(be, dt, dkw, dout, inp, rstd, k, "qk_norm_backward");
}
