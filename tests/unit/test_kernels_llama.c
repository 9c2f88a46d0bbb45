// test_kernels_llama.c: the Llama decoder's kernels (RMSNorm, the per-head q/k RMSNorm, RoPE, SwiGLU) checked
// as test_kernels.c checks GPT-2's: forwards against double-precision references, backwards against central
// finite differences, and the accumulate/overwrite/aliasing contract of kernels.h. Their thread-count
// determinism, guard pages and 16-bit storage are checked in test_kernel_runners.c.
//
// Tolerances (relative error = max |got - ref| / max |ref| over a tensor), as test_kernels.c's:
//   fp32 forward vs double reference          1e-5
//   fp32 saved statistics (rstd) vs double    1e-6   (summed in double, rounded once to fp32)
//   fp32 backward vs double central FD        2e-5
//   RoPE backward(forward(x)) vs x            1e-6   (two fp32 rotations: a few roundings of 2^-24 each)
// What is meant to be exact (copied v heads, t = 0, aliasing, accumulate semantics) is compared bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/kernel_testlib.h"

static const char* tname(char* buf, size_t n, const char* check, const char* tag) {
    snprintf(buf, n, "%s_%s", check, tag);
    return buf;
}
#define NAME(check) tname(name, sizeof name, check, tag)

// sum dout . y over n outputs, y = ref(ctx) in double: the scalar loss whose gradient the backwards give.
typedef void (*RefFn)(const void* ctx, double* y);
static double dot_loss(RefFn ref, const void* ctx, const double* dout, size_t n) {
    double* y = xmalloc(sizeof(double) * n);
    ref(ctx, y);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += dout[i] * y[i];
    free(y);
    return L;
}

// n NaNs: an output that a kernel leaves unwritten fails every comparison.
static float* nan_vec(size_t n) {
    float* v = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = NAN;
    return v;
}

// ---------------------------------------------------------------------------------------------------
// Rows normalized in double: y = x * rstd * w over D channels, rstd = 1/sqrt(mean(x^2) + eps).
static double rms_ref_row(const double* x, const double* w, int D, double eps, double* y) {
    double ss = 0.0;
    for (int c = 0; c < D; c++) ss += x[c] * x[c];
    const double rs = 1.0 / sqrt(ss / D + eps);
    for (int c = 0; c < D; c++) y[c] = x[c] * rs * w[c];
    return rs;
}

// RMSNorm and qk_norm as one reference: every row of N holds H = NH + KV normalized heads of D (the first NH
// with weight w[0], the rest with w[1]) and then V copied channels. RMSNorm is NH = 1, KV = 0, V = 0.
typedef struct { int N, NH, KV, D, V; double eps; double *x, *w[2], *dout; } RmsCtx;

static size_t rms_width(const RmsCtx* c) { return (size_t)(c->NH + c->KV) * c->D + c->V; }

static void rms_ref(const RmsCtx* c, double* y, double* rstd) {
    const size_t W = rms_width(c);
    for (int n = 0; n < c->N; n++) {
        for (int h = 0; h < c->NH + c->KV; h++) {
            const size_t o = n * W + (size_t)h * c->D;
            const double rs = rms_ref_row(c->x + o, c->w[h >= c->NH], c->D, c->eps, y + o);
            if (rstd) rstd[(size_t)n * (c->NH + c->KV) + h] = rs;
        }
        for (int i = 0; i < c->V; i++) y[n * W + W - c->V + i] = c->x[n * W + W - c->V + i];
    }
}

static void rms_ref_y(const void* c, double* y) { rms_ref(c, y, NULL); }
static double rms_loss(const void* v) {
    const RmsCtx* c = v;
    return dot_loss(rms_ref_y, c, c->dout, c->N * rms_width(c));
}

static void test_rmsnorm(TestStats* s, Backend* be, int N, int C, float eps, const char* tag) {
    char name[96];
    const size_t n = (size_t)N * C;
    Rng r = {81 + C};
    float *x = rand_vec(&r, n, 2, DT_FP32), *w = rand_vec(&r, C, 1.5f, DT_FP32), *dy = rand_vec(&r, n, 1, DT_FP32);
    float *dx0 = rand_vec(&r, n, 1, DT_FP32), *dw0 = rand_vec(&r, C, 1, DT_FP32), *nans = nan_vec(n);
    float *out = dev_from(be, DT_FP32, nans, n), *rstd = dev_from(be, DT_FP32, nans, N);
    float *dx = dev_from(be, DT_FP32, dx0, n), *dw = dev_from(be, DT_FP32, dw0, C);
    RmsCtx c = {N, 1, 0, C, 0, eps, to_double(x, n), {to_double(w, C), NULL}, to_double(dy, n)};
    c.w[1] = c.w[0];
    double *yref = xmalloc(sizeof(double) * n), *rref = xmalloc(sizeof(double) * N);
    rms_ref(&c, yref, rref);
    rmsnorm_forward(be, DT_FP32, out, rstd, x, w, N, C, eps);
    check_close(s, NAME("rmsnorm_forward_ref"), rel_err(out, yref, n), 1e-5);
    check_close(s, NAME("rmsnorm_forward_rstd_ref"), rel_err(rstd, rref, N), 1e-6);

    rmsnorm_backward(be, DT_FP32, dx, dw, dy, x, w, rstd, N, C);
    float *gx = xmalloc(sizeof(float) * n), *gw = xmalloc(sizeof(float) * C);   // both accumulate: the increments
    for (size_t i = 0; i < n; i++) gx[i] = dx[i] - dx0[i];
    for (int i = 0; i < C; i++) gw[i] = dw[i] - dw0[i];
    check_fd(s, NAME("rmsnorm_backward_dinp_fd"), rms_loss, &c, c.x, gx, n);
    check_fd(s, NAME("rmsnorm_backward_dw_fd"), rms_loss, &c, c.w[0], gw, C);

    // Both accumulate: from zero, a second call exactly doubles them.
    memset(dx, 0, sizeof(float) * n);
    memset(dw, 0, sizeof(float) * C);
    rmsnorm_backward(be, DT_FP32, dx, dw, dy, x, w, rstd, N, C);
    float *dx1 = host_of(dx, DT_FP32, n), *dw1 = host_of(dw, DT_FP32, C);
    rmsnorm_backward(be, DT_FP32, dx, dw, dy, x, w, rstd, N, C);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= dx[i] == 2 * dx1[i];
    for (int i = 0; i < C; i++) ok &= dw[i] == 2 * dw1[i];
    check_true(s, NAME("rmsnorm_backward_accumulate"), ok);
    free(x); free(w); free(dy); free(dx0); free(dw0); free(nans); free(yref); free(rref); free(gx); free(gw);
    free(dx1); free(dw1); free(c.x); free(c.w[0]); free(c.dout);
    be_free(be, out); be_free(be, rstd); be_free(be, dx); be_free(be, dw);
}

// qk_norm on packed qkv (N, (NH+2KV)*D).
static void test_qk_norm(TestStats* s, Backend* be, int N, int NH, int KV, int D, const char* tag) {
    char name[96];
    const size_t W = (size_t)(NH + 2 * KV) * D, n = N * W, ns = (size_t)N * (NH + KV);
    Rng r = {91 + NH * 7 + KV + D};
    float *x = rand_vec(&r, n, 2, DT_FP32), *qw = rand_vec(&r, D, 1.5f, DT_FP32), *kw = rand_vec(&r, D, 1.5f, DT_FP32);
    float *dy = rand_vec(&r, n, 1, DT_FP32), *dq0 = rand_vec(&r, D, 1, DT_FP32), *dk0 = rand_vec(&r, D, 1, DT_FP32);
    float *nans = nan_vec(n), *out = dev_from(be, DT_FP32, nans, n), *rstd = dev_from(be, DT_FP32, nans, ns);
    float *dx = dev_from(be, DT_FP32, nans, n), *dqw = dev_from(be, DT_FP32, dq0, D), *dkw = dev_from(be, DT_FP32, dk0, D);
    RmsCtx c = {N, NH, KV, D, KV * D, 1e-6, to_double(x, n), {to_double(qw, D), to_double(kw, D)}, to_double(dy, n)};
    double *yref = xmalloc(sizeof(double) * n), *rref = xmalloc(sizeof(double) * ns);
    rms_ref(&c, yref, rref);
    qk_norm_forward(be, DT_FP32, out, rstd, x, qw, kw, N, NH, KV, D, 1e-6f);
    check_close(s, NAME("qk_norm_forward_ref"), rel_err(out, yref, n), 1e-5);
    check_close(s, NAME("qk_norm_forward_rstd_ref"), rel_err(rstd, rref, ns), 1e-6);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= same_bits(out + i * W + (NH + KV) * D, x + i * W + (NH + KV) * D, sizeof(float) * KV * D);
    check_true(s, NAME("qk_norm_forward_v_copied"), ok);

    // dinp starts as NaN (it is overwritten); its v part is dout's, which the FD of the copy gives too.
    qk_norm_backward(be, DT_FP32, dx, dqw, dkw, dy, x, qw, kw, rstd, N, NH, KV, D);
    float *gq = xmalloc(sizeof(float) * D), *gk = xmalloc(sizeof(float) * D);
    for (int i = 0; i < D; i++) gq[i] = dqw[i] - dq0[i], gk[i] = dkw[i] - dk0[i];
    check_fd(s, NAME("qk_norm_backward_dinp_fd"), rms_loss, &c, c.x, dx, n);
    check_fd(s, NAME("qk_norm_backward_dqw_fd"), rms_loss, &c, c.w[0], gq, D);
    check_fd(s, NAME("qk_norm_backward_dkw_fd"), rms_loss, &c, c.w[1], gk, D);

    // dinp is overwritten (the same bits over other contents); dqw and dkw accumulate (exactly doubled from 0).
    float* dx1 = host_of(dx, DT_FP32, n);
    memcpy(dx, dy, sizeof(float) * n);
    memset(dqw, 0, sizeof(float) * D);
    memset(dkw, 0, sizeof(float) * D);
    qk_norm_backward(be, DT_FP32, dx, dqw, dkw, dy, x, qw, kw, rstd, N, NH, KV, D);
    float *dq1 = host_of(dqw, DT_FP32, D), *dk1 = host_of(dkw, DT_FP32, D);
    qk_norm_backward(be, DT_FP32, dx, dqw, dkw, dy, x, qw, kw, rstd, N, NH, KV, D);
    ok = same_bits(dx, dx1, sizeof(float) * n);
    for (int i = 0; i < D; i++) ok &= dqw[i] == 2 * dq1[i] && dkw[i] == 2 * dk1[i];
    check_true(s, NAME("qk_norm_backward_overwrite_accumulate"), ok);
    free(x); free(qw); free(kw); free(dy); free(dq0); free(dk0); free(nans); free(yref); free(rref); free(gq); free(gk);
    free(dx1); free(dq1); free(dk1); free(c.x); free(c.w[0]); free(c.w[1]); free(c.dout);
    be_free(be, out); be_free(be, rstd); be_free(be, dx); be_free(be, dqw); be_free(be, dkw);
}

// ---------------------------------------------------------------------------------------------------
// RoPE on packed qkv (B,T,(NH+2KV)*D).

typedef struct { int B, T, NH, KV, D; const float* inv_freq; double *x, *dout; } RopeCtx;

// The angle is the fp32 product the contract names; cos and sin of it are taken in double.
static void rope_ref(const void* v, double* y) {
    const RopeCtx* c = v;
    const int half = c->D / 2;
    const size_t W = (size_t)(c->NH + 2 * c->KV) * c->D;
    memcpy(y, c->x, sizeof(double) * c->B * c->T * W);
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int h = 0; h < c->NH + c->KV; h++)
            for (int i = 0; i < half; i++) {
                const double a = (float)(bt % c->T) * c->inv_freq[i];
                const size_t o = bt * W + (size_t)h * c->D + i;
                y[o] = c->x[o] * cos(a) - c->x[o + half] * sin(a);
                y[o + half] = c->x[o + half] * cos(a) + c->x[o] * sin(a);
            }
}

static double rope_loss(const void* v) {
    const RopeCtx* c = v;
    return dot_loss(rope_ref, c, c->dout, (size_t)c->B * c->T * (c->NH + 2 * c->KV) * c->D);
}

// Hugging Face's default: inv_freq[i] = theta^(-2i/D), theta = 10000.
static float* rope_inv_freq(int D) {
    float* f = xmalloc(sizeof(float) * (D / 2));
    for (int i = 0; i < D / 2; i++) f[i] = (float)pow(10000.0, -2.0 * i / D);
    return f;
}

static void test_rope(TestStats* s, Backend* be, int B, int T, int NH, int KV, int D, int fd, const char* tag) {
    char name[96];
    const size_t W = (size_t)(NH + 2 * KV) * D, n = (size_t)B * T * W;
    Rng r = {101 + T + NH + KV + D};
    float *x = rand_vec(&r, n, 2, DT_FP32), *dy = rand_vec(&r, n, 1, DT_FP32), *nans = nan_vec(n);
    float *f = rope_inv_freq(D), *inv_freq = dev_from(be, DT_FP32, f, D / 2);
    float *out = dev_from(be, DT_FP32, nans, n), *dx = dev_from(be, DT_FP32, nans, n);
    RopeCtx c = {B, T, NH, KV, D, f, to_double(x, n), to_double(dy, n)};
    double* yref = xmalloc(sizeof(double) * n);
    rope_ref(&c, yref);
    rope_forward(be, DT_FP32, out, x, inv_freq, NULL, B, T, NH, KV, D);
    check_close(s, NAME("rope_forward_ref"), rel_err(out, yref, n), 1e-5);
    int ok = 1;   // t = 0 (cos 1, sin 0) is the identity, and v is copied at every position
    for (int b = 0; b < B; b++) ok &= same_bits(out + (size_t)b * T * W, x + (size_t)b * T * W, sizeof(float) * W);
    for (int bt = 0; bt < B * T; bt++) ok &= same_bits(out + bt * W + (NH + KV) * D, x + bt * W + (NH + KV) * D, sizeof(float) * KV * D);
    check_true(s, NAME("rope_forward_t0_identity_v_copied"), ok);
    float* inplace = host_of(x, DT_FP32, n);
    rope_forward(be, DT_FP32, inplace, inplace, inv_freq, NULL, B, T, NH, KV, D);
    check_true(s, NAME("rope_forward_in_place"), same_bits(inplace, out, sizeof(float) * n));

    rope_backward(be, DT_FP32, dx, dy, inv_freq, NULL, B, T, NH, KV, D);
    if (fd) check_fd(s, NAME("rope_backward_fd"), rope_loss, &c, c.x, dx, n);
    memcpy(inplace, dy, sizeof(float) * n);
    rope_backward(be, DT_FP32, inplace, inplace, inv_freq, NULL, B, T, NH, KV, D);
    check_true(s, NAME("rope_backward_in_place"), same_bits(inplace, dx, sizeof(float) * n));
    rope_backward(be, DT_FP32, inplace, out, inv_freq, NULL, B, T, NH, KV, D);   // the inverse of the forward
    check_close(s, NAME("rope_backward_of_forward_is_identity"), rel_err(inplace, c.x, n), 1e-6);
    free(x); free(dy); free(nans); free(f); free(yref); free(inplace); free(c.x); free(c.dout);
    be_free(be, inv_freq); be_free(be, out); be_free(be, dx);
}

// ---------------------------------------------------------------------------------------------------
// SwiGLU: out (N,F) = silu(gate) * up from gu (N,2F) = [gate | up].

typedef struct { int N, F; double *gu, *dout; } SwCtx;

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static double swiglu_loss(const void* v) {
    const SwCtx* c = v;
    double L = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int f = 0; f < c->F; f++) {
            const double* g = c->gu + (size_t)n * 2 * c->F + f;
            L += c->dout[(size_t)n * c->F + f] * silu_d(g[0]) * g[c->F];
        }
    return L;
}

static void test_swiglu(TestStats* s, Backend* be, int N, int F, const char* tag) {
    char name[96];
    const size_t n = (size_t)N * F;
    Rng r = {111 + F};
    float *gu = rand_vec(&r, 2 * n, 6, DT_FP32), *dy = rand_vec(&r, n, 1, DT_FP32), *nans = nan_vec(2 * n);
    gu[0] = -100.0f;   // exp(-gate) overflows to inf: silu and its slope must still be their limits (0)
    gu[1] = 100.0f;
    float *out = dev_from(be, DT_FP32, nans, n), *dgu = dev_from(be, DT_FP32, nans, 2 * n);
    SwCtx c = {N, F, to_double(gu, 2 * n), to_double(dy, n)};
    double* ref = xmalloc(sizeof(double) * n);
    for (int i = 0; i < N; i++)
        for (int f = 0; f < F; f++) ref[(size_t)i * F + f] = silu_d(c.gu[(size_t)i * 2 * F + f]) * c.gu[(size_t)i * 2 * F + F + f];
    swiglu_forward(be, DT_FP32, out, gu, N, F);
    check_close(s, NAME("swiglu_forward_ref"), rel_err(out, ref, n), 1e-5);
    swiglu_backward(be, DT_FP32, dgu, dy, gu, N, F);
    check_fd(s, NAME("swiglu_backward_fd"), swiglu_loss, &c, c.gu, dgu, 2 * n);
    float* dgu1 = host_of(dgu, DT_FP32, 2 * n);   // overwritten: the same bits over other contents
    memcpy(dgu, gu, sizeof(float) * 2 * n);
    swiglu_backward(be, DT_FP32, dgu, dy, gu, N, F);
    check_true(s, NAME("swiglu_backward_overwrites"), same_bits(dgu, dgu1, sizeof(float) * 2 * n));
    free(gu); free(dy); free(nans); free(ref); free(dgu1); free(c.gu); free(c.dout);
    be_free(be, out); be_free(be, dgu);
}

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    test_rmsnorm(&s, be, 10, 13, 1e-6f, "C13");   // C not a multiple of 8
    test_rmsnorm(&s, be, 7, 72, 0.05f, "C72_eps");   // an eps large enough that leaving it out fails
    test_rmsnorm(&s, be, 5, 150, 1e-5f, "C150");   // the dw chunks of 64 end in a partial one
    test_qk_norm(&s, be, 4, 4, 2, 8, "gqa_D8");
    test_qk_norm(&s, be, 3, 4, 1, 64, "kv1_D64");
    test_qk_norm(&s, be, 2, 2, 2, 128, "mha_D128");
    test_rope(&s, be, 2, 3, 4, 2, 8, 1, "gqa_D8");
    test_rope(&s, be, 2, 3, 4, 2, 64, 1, "gqa_D64");
    test_rope(&s, be, 1, 3, 3, 1, 128, 1, "kv1_D128");
    test_rope(&s, be, 2, 200, 4, 1, 64, 0, "kv1_D64_T200");   // angles up to 199 rad
    test_swiglu(&s, be, 7, 13, "F13");
    test_swiglu(&s, be, 3, 64, "F64");
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
