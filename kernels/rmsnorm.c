// rmsnorm.c: RMSNorm over the last dimension, and the per-head RMSNorm of q and k in packed qkv (CPU twins).
// Both normalize "rows": spans of D channels at a fixed stride, each with its own rstd. RMSNorm has one row of
// C channels per token; qk_norm has one row per q head and one per k head of every token.
#include <string.h>

#include "kernels/cpu_common.h"

// Rows (n, h), n < N, h < H: channels [n*W + (h0 + h)*D, + D) of the tensor, rstd at n*S + h0 + h.
typedef struct {
    int N, H, D, h0, S;
    size_t W;
} RmsRows;

static size_t rows_off(const RmsRows* r, int n, int h) { return (size_t)n * r->W + (size_t)(r->h0 + h) * r->D; }
static size_t rows_stat(const RmsRows* r, int n, int h) { return (size_t)n * r->S + r->h0 + h; }

// Sum of squares in double: the saved rstd is then exact to fp32, so the backward and any recompute see the
// same number whatever the row length.
static void rms_forward_rows(DType dt, void* out, float* rstd, const void* inp, const void* w, const RmsRows* r,
                             float eps) {
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < (long long)r->N * r->H; k++) {
        const int n = (int)(k / r->H), h = (int)(k % r->H);
        const size_t o = rows_off(r, n, h);
        double ss = 0.0;
        for (int c = 0; c < r->D; c++) {
            const double x = ld(inp, o + c, dt);
            ss += x * x;
        }
        const float rs = (float)(1.0 / sqrt(ss / r->D + (double)eps));
        for (int c = 0; c < r->D; c++) st(out, o + c, ld(inp, o + c, dt) * rs * ld(w, c, dt), dt);
        rstd[rows_stat(r, n, h)] = rs;
    }
}

// dinp of every row: (dn - xhat * mean(dn * xhat)) * rstd, dn = dout * w, xhat = inp * rstd. Added to dinp
// (RMSNorm: the residual) or stored over it (qk_norm).
static void rms_dinp_rows(DType dt, void* dinp, const void* dout, const void* inp, const void* w, const float* rstd,
                          const RmsRows* r, int accumulate) {
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < (long long)r->N * r->H; k++) {
        const int n = (int)(k / r->H), h = (int)(k % r->H);
        const size_t o = rows_off(r, n, h);
        const float rs = rstd[rows_stat(r, n, h)];
        float dot = 0.0f;
        for (int c = 0; c < r->D; c++) dot += ld(dout, o + c, dt) * ld(w, c, dt) * ld(inp, o + c, dt) * rs;
        dot /= r->D;
        for (int c = 0; c < r->D; c++) {
            const float g = (ld(dout, o + c, dt) * ld(w, c, dt) - ld(inp, o + c, dt) * rs * dot) * rs;
            st(dinp, o + c, accumulate ? ld(dinp, o + c, dt) + g : g, dt);
        }
    }
}

#define RMS_CHUNK 64   // channels per task of the dw column sums

// dw (D) += sum over rows of dout * xhat: each channel is summed by one thread in row order (n, then h), so
// the bits do not depend on the thread count.
static void rms_dw_rows(DType dt, void* dw, const void* dout, const void* inp, const float* rstd, const RmsRows* r) {
    const int nchunks = (r->D + RMS_CHUNK - 1) / RMS_CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunks; k++) {
        const int c0 = k * RMS_CHUNK, c1 = c0 + RMS_CHUNK < r->D ? c0 + RMS_CHUNK : r->D;
        float acc[RMS_CHUNK] = {0};
        for (int n = 0; n < r->N; n++)
            for (int h = 0; h < r->H; h++) {
                const size_t o = rows_off(r, n, h);
                const float rs = rstd[rows_stat(r, n, h)];
                for (int c = c0; c < c1; c++) acc[c - c0] += ld(dout, o + c, dt) * ld(inp, o + c, dt) * rs;
            }
        for (int c = c0; c < c1; c++) st(dw, c, ld(dw, c, dt) + acc[c - c0], dt);
    }
}

void rmsnorm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps) {
    BACKEND_ENTRY(be, out, rstd, inp, w);
    const RmsRows r = {N, 1, C, 0, 1, (size_t)C};
    rms_forward_rows(dt, out, rstd, inp, w, &r, eps);
}

void rmsnorm_backward(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp, const void* w,
                      const float* rstd, int N, int C) {
    BACKEND_ENTRY(be, dinp, dw, dout, inp, w, rstd);
    const RmsRows r = {N, 1, C, 0, 1, (size_t)C};
    rms_dinp_rows(dt, dinp, dout, inp, w, rstd, &r, 1);
    rms_dw_rows(dt, dw, dout, inp, rstd, &r);
}

// The q heads' rows and the k heads' rows of packed qkv; rstd (N, NH+KV) holds q's then k's.
static RmsRows q_rows(int N, int NH, int KV, int D) { return (RmsRows){N, NH, D, 0, NH + KV, (size_t)(NH + 2 * KV) * D}; }
static RmsRows k_rows(int N, int NH, int KV, int D) { return (RmsRows){N, KV, D, NH, NH + KV, (size_t)(NH + 2 * KV) * D}; }

// The v part of every row, copied unchanged.
static void copy_v(DType dt, void* dst, const void* src, int N, int NH, int KV, int D) {
    const size_t es = dtype_size(dt), W = (size_t)(NH + 2 * KV) * D, v0 = (size_t)(NH + KV) * D;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy((char*)dst + ((size_t)n * W + v0) * es, (const char*)src + ((size_t)n * W + v0) * es, (size_t)KV * D * es);
}

void qk_norm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* qw, const void* kw,
                     int N, int NH, int KV, int D, float eps) {
    BACKEND_ENTRY(be, out, rstd, inp, qw, kw);
    const RmsRows q = q_rows(N, NH, KV, D), k = k_rows(N, NH, KV, D);
    rms_forward_rows(dt, out, rstd, inp, qw, &q, eps);
    rms_forward_rows(dt, out, rstd, inp, kw, &k, eps);
    copy_v(dt, out, inp, N, NH, KV, D);
}

void qk_norm_backward(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout, const void* inp,
                      const void* qw, const void* kw, const float* rstd, int N, int NH, int KV, int D) {
    BACKEND_ENTRY(be, dinp, dqw, dkw, dout, inp, qw, kw, rstd);
    const RmsRows q = q_rows(N, NH, KV, D), k = k_rows(N, NH, KV, D);
    rms_dinp_rows(dt, dinp, dout, inp, qw, rstd, &q, 0);
    rms_dinp_rows(dt, dinp, dout, inp, kw, rstd, &k, 0);
    copy_v(dt, dinp, dout, N, NH, KV, D);
    rms_dw_rows(dt, dqw, dout, inp, rstd, &q);
    rms_dw_rows(dt, dkw, dout, inp, rstd, &k);
}
