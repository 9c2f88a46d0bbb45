// rmsnorm.cuh: RMSNorm over the last dimension, and the per-head RMSNorm of q and k in packed qkv (qk_norm).
// Both normalize "rows" (as rmsnorm.c): spans of D channels at a fixed stride, one warp per row. dw is a column
// sum over all rows: each block sums a fixed slice of rows into per-block partials in scratch, and a second
// kernel adds the partials in a fixed order (deterministic, no float atomics), as layernorm.cuh does; that
// kernel is the bias gradient's (column_sums.cuh). The backwards are the kernel table's rmsnorm_backward and
// qk_norm_backward: the norm_one_pass variant forms dinp and the partials in one kernel
// (kernels/variants/norm_one_pass.cuh).
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/column_sums.cuh"
#include "kernels/qkv_copy.cuh"

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
        if (vec) kernel<T, Pack128<T>::size><<<grid_, block_, 0, be_stream(be)>>>(__VA_ARGS__);          \
        else kernel<T, 1><<<grid_, block_, 0, be_stream(be)>>>(__VA_ARGS__);                             \
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
        rms_backward_dw_partial_kernel<X><<<dim3(ceil_div(r.D, 32), RB), dim3(32, RMS_ROWS_PER_PASS), 0, be_stream(be)>>>(
            partial, (const X*)dout, (const X*)inp, rstd, r);
        LAUNCH_CHECK();
        // The column sums of the partials in row order, added to dw.
        bias_grad_final_kernel<X><<<ceil_div(r.D, 256), 256, 0, be_stream(be)>>>((X*)dw, partial, RB, r.D);
        LAUNCH_CHECK();
    });
}

extern "C" void rmsnorm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* w, int N, int C,
                                float eps) {
    rms_forward_rows(be, dt, out, rstd, inp, w, RmsRows{N, 1, C, 0, 1, (size_t)C}, eps);
}

// The table's rmsnorm_backward by default (norm_one_pass replaces it).
static void rmsnorm_backward_default(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp,
                                     const void* w, const float* rstd, int N, int C) {
    const RmsRows r{N, 1, C, 0, 1, (size_t)C};
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, w, rstd, r, true);
    rms_backward_dw_rows(be, dt, dw, dout, inp, rstd, r, "rmsnorm_backward");
}

extern "C" void rmsnorm_backward(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp,
                                 const void* w, const float* rstd, int N, int C) {
    be_kernels(be)->rmsnorm_backward(be, dt, dinp, dw, dout, inp, w, rstd, N, C);
}

// The q heads' rows and the k heads' rows of packed qkv; rstd (N, NH+KV) holds q's then k's.
static RmsRows q_rows(int N, int NH, int KV, int D) { return RmsRows{N, NH, D, 0, NH + KV, (size_t)(NH + 2 * KV) * D}; }
static RmsRows k_rows(int N, int NH, int KV, int D) { return RmsRows{N, KV, D, NH, NH + KV, (size_t)(NH + 2 * KV) * D}; }

extern "C" void qk_norm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* qw,
                                const void* kw, int N, int NH, int KV, int D, float eps) {
    rms_forward_rows(be, dt, out, rstd, inp, qw, q_rows(N, NH, KV, D), eps);
    rms_forward_rows(be, dt, out, rstd, inp, kw, k_rows(N, NH, KV, D), eps);
    qkv_copy_v(be, dt, out, inp, N, NH, KV, D);
}

// The table's qk_norm_backward by default (norm_one_pass replaces it).
static void qk_norm_backward_default(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout,
                                     const void* inp, const void* qw, const void* kw, const float* rstd, int N, int NH,
                                     int KV, int D) {
    const RmsRows q = q_rows(N, NH, KV, D), k = k_rows(N, NH, KV, D);
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, qw, rstd, q, false);
    rms_backward_dinp_rows(be, dt, dinp, dout, inp, kw, rstd, k, false);
    qkv_copy_v(be, dt, dinp, dout, N, NH, KV, D);
    rms_backward_dw_rows(be, dt, dqw, dout, inp, rstd, q, "qk_norm_backward");
    rms_backward_dw_rows(be, dt, dkw, dout, inp, rstd, k, "qk_norm_backward");
}

extern "C" void qk_norm_backward(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout,
                                 const void* inp, const void* qw, const void* kw, const float* rstd, int N, int NH,
                                 int KV, int D) {
    be_kernels(be)->qk_norm_backward(be, dt, dinp, dqw, dkw, dout, inp, qw, kw, rstd, N, NH, KV, D);
}
