// test_kernels.c: the CPU twins' forward and backward passes checked against double-precision references
// and central finite differences, and their accumulate/overwrite/aliasing contract (matmul, layernorm,
// attention, encoder, gelu and residual, classifier, and the vocabulary-parallel embedding and
// cross-entropy). Beside it: test_kernels_llama.c (the same for the Llama kernels: RMSNorm, q/k norm, RoPE,
// SwiGLU), test_kernel_precision.c (the dtype helpers, the backend's copies, AdamW, sum of squares) and
// test_kernel_runners.c (thread-count determinism, 16-bit storage, guard pages).
//
// Tolerances (relative error = max |got - ref| / max |ref| over a tensor):
//   fp32 forward vs double reference          1e-5   (fp32 sums of at most a few hundred terms)
//   fp32 backward vs double central FD        2e-5   (h = 1e-4 on a double reference: FD error ~1e-9,
//                                                     so this bounds the kernel's fp32 rounding; seen ~2e-7)
//   bf16 kernels vs fp32 on the same inputs   1e-2   (8 significant bits, 2^-9 per rounding; seen ~3e-3)
//   fp16 kernels vs fp32 on the same inputs   2e-3   (11 significant bits; seen ~4e-4)
//   AdamW fp32 vs double reference, 3 steps   1e-5
// Everything that is meant to be exact (causality, determinism, accumulate semantics, rounding) is
// compared bit for bit.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/attention_mha_oracle.h"
#include "tests/unit/kernel_testlib.h"

// ---------------------------------------------------------------------------------------------------
// Helpers.

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// ---------------------------------------------------------------------------------------------------
// matmul.

typedef struct { int N, IC, OC, gelu_in; double *x, *w, *b, *dout; } MmCtx;

// sum dout . (f(x) @ w^T + b), f = gelu when gelu_in (x is then the pre-activation).
static double mm_loss(const void* v) {
    const MmCtx* c = v;
    double L = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double y = c->b[o];
            for (int i = 0; i < c->IC; i++) {
                double xi = c->x[(size_t)n * c->IC + i];
                y += (c->gelu_in ? gelu_d(xi) : xi) * c->w[(size_t)o * c->IC + i];
            }
            L += c->dout[(size_t)n * c->OC + o] * y;
        }
    return L;
}

static void test_matmul_forward(TestStats* s, Backend* be, int N, int IC, int OC, const char* name, const char* name_gelu) {
    Rng r = {11};
    float *x = rand_vec(&r, (size_t)N * IC, 1, DT_FP32), *w = rand_vec(&r, (size_t)OC * IC, 1, DT_FP32), *b = rand_vec(&r, OC, 1, DT_FP32);
    void *dx = dev_from(be, DT_FP32, x, (size_t)N * IC), *dw = dev_from(be, DT_FP32, w, (size_t)OC * IC), *db = dev_from(be, DT_FP32, b, OC);
    void *out = dev_zeros(be, DT_FP32, (size_t)N * OC), *pre = dev_zeros(be, DT_FP32, (size_t)N * OC);
    double *ref = xmalloc(sizeof(double) * N * OC), *ref_g = xmalloc(sizeof(double) * N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double y = b[o];
            for (int i = 0; i < IC; i++) y += (double)x[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            ref[(size_t)n * OC + o] = y;
            ref_g[(size_t)n * OC + o] = gelu_d(y);
        }
    matmul_forward(be, DT_FP32, out, NULL, dx, dw, db, N, IC, OC);
    check_close(s, name, rel_err(out, ref, (size_t)N * OC), 1e-5);
    matmul_forward(be, DT_FP32, out, pre, dx, dw, db, N, IC, OC);
    double e = fmax(rel_err(pre, ref, (size_t)N * OC), rel_err(out, ref_g, (size_t)N * OC));
    check_close(s, name_gelu, e, 1e-5);
    free(x); free(w); free(b); free(ref); free(ref_g);
    be_free(be, dx); be_free(be, dw); be_free(be, db); be_free(be, out); be_free(be, pre);
}

static void test_matmul_backward_fd(TestStats* s, Backend* be, int gelu_in) {
    const int N = 10, IC = 8, OC = 12;   // N, OC off the micro-tile sizes: exercises the padded edges
    Rng r = {12 + gelu_in};
    float *x = rand_vec(&r, N * IC, 1.5f, DT_FP32), *w = rand_vec(&r, OC * IC, 1, DT_FP32);
    float *b = rand_vec(&r, OC, 1, DT_FP32), *dout = rand_vec(&r, N * OC, 1, DT_FP32);
    float* xin = xmalloc(sizeof(float) * N * IC);   // the layer's input: gelu(x) when fused
    void* dx = dev_from(be, DT_FP32, x, N * IC);
    if (gelu_in) gelu_forward(be, DT_FP32, xin, dx, (size_t)N * IC);
    else memcpy(xin, x, sizeof(float) * N * IC);
    void *dxin = dev_from(be, DT_FP32, xin, N * IC), *dwt = dev_from(be, DT_FP32, w, OC * IC), *ddout = dev_from(be, DT_FP32, dout, N * OC);
    void *dinp = dev_zeros(be, DT_FP32, N * IC), *dw = dev_zeros(be, DT_FP32, OC * IC), *db = dev_zeros(be, DT_FP32, OC);
    matmul_backward(be, DT_FP32, dinp, dw, db, ddout, dxin, gelu_in ? dx : NULL, dwt, N, IC, OC);
    MmCtx c = {N, IC, OC, gelu_in, to_double(x, N * IC), to_double(w, OC * IC), to_double(b, OC), to_double(dout, N * OC)};
    check_fd(s, gelu_in ? "matmul_backward_gelu_dinp_fd" : "matmul_backward_dinp_fd", mm_loss, &c, c.x, dinp, N * IC);
    check_fd(s, gelu_in ? "matmul_backward_gelu_dw_fd" : "matmul_backward_dw_fd", mm_loss, &c, c.w, dw, OC * IC);
    check_fd(s, gelu_in ? "matmul_backward_gelu_dbias_fd" : "matmul_backward_dbias_fd", mm_loss, &c, c.b, db, OC);

    // Twice more on the same buffers: dw, dbias accumulate (exactly doubled), dinp is overwritten.
    float* dinp1 = host_of(dinp, DT_FP32, N * IC);
    float *dw1 = host_of(dw, DT_FP32, OC * IC), *db1 = host_of(db, DT_FP32, OC);
    matmul_backward(be, DT_FP32, dinp, dw, db, ddout, dxin, gelu_in ? dx : NULL, dwt, N, IC, OC);
    int ok = same_bits(dinp, dinp1, sizeof(float) * N * IC);
    for (int i = 0; i < OC * IC; i++) ok &= ((float*)dw)[i] == 2 * dw1[i];
    for (int i = 0; i < OC; i++) ok &= ((float*)db)[i] == 2 * db1[i];
    check_true(s, gelu_in ? "matmul_backward_gelu_accumulate" : "matmul_backward_accumulate", ok);

    // dbias may be NULL.
    matmul_backward(be, DT_FP32, dinp, dw, NULL, ddout, dxin, gelu_in ? dx : NULL, dwt, N, IC, OC);
    check_true(s, gelu_in ? "matmul_backward_gelu_null_dbias" : "matmul_backward_null_dbias",
               same_bits(dinp, dinp1, sizeof(float) * N * IC) && ((float*)dw)[5] == 3 * dw1[5]);
    free(x); free(w); free(b); free(dout); free(xin); free(dinp1); free(dw1); free(db1);
    free(c.x); free(c.w); free(c.b); free(c.dout);
    be_free(be, dx); be_free(be, dxin); be_free(be, dwt); be_free(be, ddout); be_free(be, dinp); be_free(be, dw); be_free(be, db);
}

// The backward at a shape of many tiles against double references (the FD check above fits in one tile):
// 203 rows against micro-tiles of 6 or 12, 72 and 100 columns against panels of 32, OC = 100 against the
// dbias chunks of 64. dinp through the fused GELU's pre-activation; dw and dbias accumulate onto 0.5.
static double gelu_grad_d(double x) {
    const double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_matmul_backward_blocks(TestStats* s, Backend* be) {
    const int N = 203, IC = 72, OC = 100;
    Rng r = {13};
    float *pre = rand_vec(&r, N * IC, 2, DT_FP32), *w = rand_vec(&r, OC * IC, 0.2f, DT_FP32), *dout = rand_vec(&r, N * OC, 1, DT_FP32);
    float* half = xmalloc(sizeof(float) * OC * IC);
    for (int i = 0; i < OC * IC; i++) half[i] = 0.5f;
    void *dpre = dev_from(be, DT_FP32, pre, N * IC), *dwt = dev_from(be, DT_FP32, w, OC * IC), *ddout = dev_from(be, DT_FP32, dout, N * OC);
    void* dx = dev_zeros(be, DT_FP32, N * IC);   // the layer's input, gelu(pre)
    gelu_forward(be, DT_FP32, dx, dpre, (size_t)N * IC);
    float* x = host_of(dx, DT_FP32, N * IC);
    void *dinp = dev_zeros(be, DT_FP32, N * IC), *dw = dev_from(be, DT_FP32, half, OC * IC), *db = dev_from(be, DT_FP32, half, OC);
    matmul_backward(be, DT_FP32, dinp, dw, db, ddout, dx, dpre, dwt, N, IC, OC);
    double *ri = xmalloc(sizeof(double) * N * IC), *rw = xmalloc(sizeof(double) * OC * IC), *rb = xmalloc(sizeof(double) * OC);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double a = 0.0;
            for (int o = 0; o < OC; o++) a += (double)dout[(size_t)n * OC + o] * w[(size_t)o * IC + i];
            ri[(size_t)n * IC + i] = a * gelu_grad_d(pre[(size_t)n * IC + i]);
        }
    for (int o = 0; o < OC; o++) {
        rb[o] = 0.5;
        for (int n = 0; n < N; n++) rb[o] += dout[(size_t)n * OC + o];
        for (int i = 0; i < IC; i++) {
            double a = 0.5;
            for (int n = 0; n < N; n++) a += (double)dout[(size_t)n * OC + o] * x[(size_t)n * IC + i];
            rw[(size_t)o * IC + i] = a;
        }
    }
    check_close(s, "matmul_backward_gelu_dinp_ref_blocks", rel_err(dinp, ri, (size_t)N * IC), 1e-5);
    check_close(s, "matmul_backward_dw_ref_blocks", rel_err(dw, rw, (size_t)OC * IC), 1e-5);
    check_close(s, "matmul_backward_dbias_ref_blocks", rel_err(db, rb, OC), 1e-5);
    free(pre); free(w); free(dout); free(half); free(x); free(ri); free(rw); free(rb);
    be_free(be, dpre); be_free(be, dwt); be_free(be, ddout); be_free(be, dx); be_free(be, dinp); be_free(be, dw); be_free(be, db);
}

// ---------------------------------------------------------------------------------------------------
// layernorm.

typedef struct { int N, C; double *x, *w, *b, *dout; } LnCtx;

static void ln_ref_row(const double* x, const double* w, const double* b, int C, double* y, double* mean, double* rstd) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    double rs = 1.0 / sqrt(v / C + 1e-5);
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c] + b[c];
    *mean = m;
    *rstd = rs;
}

static double ln_loss(const void* v) {
    const LnCtx* c = v;
    double L = 0.0, y[64], m, rs;
    for (int n = 0; n < c->N; n++) {
        ln_ref_row(c->x + (size_t)n * c->C, c->w, c->b, c->C, y, &m, &rs);
        for (int i = 0; i < c->C; i++) L += c->dout[(size_t)n * c->C + i] * y[i];
    }
    return L;
}

static void test_layernorm(TestStats* s, Backend* be) {
    const int N = 10, C = 8;
    Rng r = {31};
    float *x = rand_vec(&r, N * C, 2, DT_FP32), *w = rand_vec(&r, C, 1, DT_FP32), *b = rand_vec(&r, C, 1, DT_FP32);
    float *dy = rand_vec(&r, N * C, 1, DT_FP32), *dx0 = rand_vec(&r, N * C, 1, DT_FP32);
    for (int i = 0; i < N * C; i++) x[i] += 3.0f;   // a mean far from 0: the variance must not cancel
    float *out = xmalloc(sizeof(float) * N * C), mean[N], rstd[N];
    float *dx = dev_from(be, DT_FP32, dx0, N * C), *dw = dev_zeros(be, DT_FP32, C), *db = dev_zeros(be, DT_FP32, C);
    layernorm_forward(be, DT_FP32, out, mean, rstd, x, w, b, N, C);
    LnCtx c = {N, C, to_double(x, N * C), to_double(w, C), to_double(b, C), to_double(dy, N * C)};
    double yref[N * C], mref[N], rref[N];
    for (int n = 0; n < N; n++) ln_ref_row(c.x + n * C, c.w, c.b, C, yref + n * C, mref + n, rref + n);
    check_close(s, "layernorm_forward_ref", rel_err(out, yref, N * C), 1e-5);
    check_close(s, "layernorm_forward_stats_ref", fmax(rel_err(mean, mref, N), rel_err(rstd, rref, N)), 1e-6);

    layernorm_backward(be, DT_FP32, dx, dw, db, dy, x, w, mean, rstd, N, C);
    float gx[N * C];   // dinp accumulates onto its initial contents: the FD gradient is the increment
    for (int i = 0; i < N * C; i++) gx[i] = dx[i] - dx0[i];
    check_fd(s, "layernorm_backward_dinp_fd", ln_loss, &c, c.x, gx, N * C);
    check_fd(s, "layernorm_backward_dw_fd", ln_loss, &c, c.w, dw, C);
    check_fd(s, "layernorm_backward_db_fd", ln_loss, &c, c.b, db, C);

    // All three accumulate: from zero, a second call exactly doubles them.
    memset(dx, 0, sizeof(float) * N * C);
    memset(dw, 0, sizeof(float) * C);
    memset(db, 0, sizeof(float) * C);
    layernorm_backward(be, DT_FP32, dx, dw, db, dy, x, w, mean, rstd, N, C);
    float *dx1 = host_of(dx, DT_FP32, N * C), *dw1 = host_of(dw, DT_FP32, C), *db1 = host_of(db, DT_FP32, C);
    layernorm_backward(be, DT_FP32, dx, dw, db, dy, x, w, mean, rstd, N, C);
    int ok = 1;
    for (int i = 0; i < N * C; i++) ok &= dx[i] == 2 * dx1[i];
    for (int i = 0; i < C; i++) ok &= dw[i] == 2 * dw1[i] && db[i] == 2 * db1[i];
    check_true(s, "layernorm_backward_accumulate", ok);
    free(x); free(w); free(b); free(dy); free(dx0); free(out); free(dx1); free(dw1); free(db1);
    free(c.x); free(c.w); free(c.b); free(c.dout);
    be_free(be, dx); be_free(be, dw); be_free(be, db);
}

// ---------------------------------------------------------------------------------------------------
// attention.

typedef struct { int B, T, NH, KV, D; double *qkv, *dout; } AtCtx;

static size_t at_ld(int NH, int KV, int D) { return (size_t)(NH + 2 * KV) * D; }

// Explicit softmax with the causal mask; out (B,T,NH*D), lse (B,NH,T). Query head h reads kv head h/(NH/KV).
static void attn_ref(const AtCtx* c, double* out, double* lse) {
    const int T = c->T, D = c->D, kvh = c->NH / c->KV;
    const size_t ld = at_ld(c->NH, c->KV, D);
    double p[64];
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int t = 0; t < T; t++) {
                const double* rows = c->qkv + (size_t)b * T * ld;
                const double* q = rows + t * ld + h * D;
                const int koff = (c->NH + h / kvh) * D, voff = koff + c->KV * D;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < T; j++) {
                    double d = 0.0;
                    for (int i = 0; i < D; i++) d += q[i] * rows[j * ld + koff + i];
                    p[j] = j <= t ? d / sqrt(D) : -INFINITY;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j < T; j++) sum += (p[j] = exp(p[j] - mx));
                if (lse) lse[((size_t)b * c->NH + h) * T + t] = mx + log(sum);
                for (int i = 0; i < D; i++) {
                    double y = 0.0;
                    for (int j = 0; j < T; j++) y += p[j] / sum * rows[j * ld + voff + i];
                    out[((size_t)b * T + t) * c->NH * D + h * D + i] = y;
                }
            }
}

static double attn_loss(const void* v) {
    const AtCtx* c = v;
    size_t n = (size_t)c->B * c->T * c->NH * c->D;
    double* out = xmalloc(sizeof(double) * n);
    attn_ref(c, out, NULL);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

// Causality: changing the last position leaves every earlier output bit-identical, and a gradient entering
// at position 1 reaches no later position of q, k or v.
static void check_attention_causal(TestStats* s, Backend* be, const AtCtx* c, const float* qkv, const float* dy,
                                   const char* tag) {
    const int B = c->B, T = c->T, NH = c->NH, KV = c->KV, D = c->D, OW = NH * D;
    const size_t ld = at_ld(NH, KV, D), nq = (size_t)B * T * ld, no = (size_t)B * T * OW, nl = (size_t)B * NH * T;
    float *out = dev_zeros(be, DT_FP32, no), *out2 = dev_zeros(be, DT_FP32, no), *lse = dev_zeros(be, DT_FP32, nl);
    float *scratch = dev_zeros(be, DT_FP32, nl), *dq = dev_zeros(be, DT_FP32, nq), *qkv2 = host_of(qkv, DT_FP32, nq);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < ld; i++) qkv2[((size_t)b * T + T - 1) * ld + i] += 0.5f;
    attention_forward(be, DT_FP32, out2, lse, qkv2, NULL, B, T, NH, KV, D);
    attention_forward(be, DT_FP32, out, lse, qkv, NULL, B, T, NH, KV, D);
    int ok = 1;
    for (int b = 0; b < B; b++) ok &= same_bits(out + (size_t)b * T * OW, out2 + (size_t)b * T * OW, (size_t)(T - 1) * OW * 4);
    ok &= !same_bits(out + (size_t)(T - 1) * OW, out2 + (size_t)(T - 1) * OW, (size_t)OW * 4);
    char name[96];
    snprintf(name, sizeof name, "attention_forward_causal%s", tag);
    check_true(s, name, ok);
    float* dy1 = xcalloc(no, sizeof(float));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < OW; i++) dy1[((size_t)b * T + 1) * OW + i] = dy[((size_t)b * T + 1) * OW + i];
    attention_backward(be, DT_FP32, dq, scratch, dy1, qkv, out, lse, NULL, B, T, NH, KV, D);
    ok = 1;
    int nonzero_past = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (size_t i = 0; i < ld; i++) {
                float g = dq[((size_t)b * T + t) * ld + i];
                if (t > 1) ok &= g == 0.0f;
                else nonzero_past |= g != 0.0f;
            }
    snprintf(name, sizeof name, "attention_backward_causal%s", tag);
    check_true(s, name, ok && nonzero_past);
    free(qkv2); free(dy1);
    be_free(be, out); be_free(be, out2); be_free(be, lse); be_free(be, scratch); be_free(be, dq);
}

// Forward against the double reference, backward against central differences of it, dqkv overwritten.
static void test_attention(TestStats* s, Backend* be, int NH, int KV, int D) {
    enum { B = 2, T = 5 };
    const size_t nq = B * T * at_ld(NH, KV, D), no = (size_t)B * T * NH * D, nl = (size_t)B * NH * T;
    char tag[32] = "", name[96];
    if (NH != 2 || KV != 2 || D != 4) snprintf(tag, sizeof tag, "_h%dkv%dd%d", NH, KV, D);   // the first shape keeps its names
    Rng r = {41};
    float *qkv = rand_vec(&r, nq, 1.5f, DT_FP32), *dy = rand_vec(&r, no, 1, DT_FP32);
    float *out = dev_zeros(be, DT_FP32, no), *lse = dev_zeros(be, DT_FP32, nl), *scratch = dev_zeros(be, DT_FP32, nl);
    float* dq = be_malloc(be, nq * 4);
    for (size_t i = 0; i < nq; i++) dq[i] = 1e3f;   // garbage: dqkv must be overwritten
    attention_forward(be, DT_FP32, out, lse, qkv, NULL, B, T, NH, KV, D);
    AtCtx c = {B, T, NH, KV, D, to_double(qkv, nq), to_double(dy, no)};
    double *oref = xmalloc(sizeof(double) * no), *lref = xmalloc(sizeof(double) * nl);
    attn_ref(&c, oref, lref);
    snprintf(name, sizeof name, "attention_forward_ref%s", tag);
    check_close(s, name, rel_err(out, oref, no), 1e-5);
    snprintf(name, sizeof name, "attention_forward_lse_ref%s", tag);
    check_close(s, name, rel_err(lse, lref, nl), 1e-6);

    attention_backward(be, DT_FP32, dq, scratch, dy, qkv, out, lse, NULL, B, T, NH, KV, D);
    snprintf(name, sizeof name, "attention_backward_dqkv_fd%s", tag);
    check_fd(s, name, attn_loss, &c, c.qkv, dq, nq);
    float* dq1 = host_of(dq, DT_FP32, nq);
    attention_backward(be, DT_FP32, dq, scratch, dy, qkv, out, lse, NULL, B, T, NH, KV, D);
    snprintf(name, sizeof name, "attention_backward_overwrites%s", tag);
    check_true(s, name, same_bits(dq, dq1, nq * 4));
    check_attention_causal(s, be, &c, qkv, dy, tag);
    free(qkv); free(dy); free(dq1); free(oref); free(lref); free(c.qkv); free(c.dout);
    be_free(be, out); be_free(be, lse); be_free(be, scratch); be_free(be, dq);
}

// KV == NH at GPT-2's head size (and the small test models' 16) against the multi-head-only oracle, bit for
// bit, in every storage type.
static void test_attention_mha_bits(TestStats* s, Backend* be, int NH, int D, DType dt) {
    enum { B = 2, T = 33 };
    const int C = NH * D;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    Rng r = {43};
    float *qkv = rand_vec(&r, nq, 1.5f, dt), *dy = rand_vec(&r, no, 1, dt);
    void *dqkv_in = dev_from(be, dt, qkv, nq), *ddy = dev_from(be, dt, dy, no);
    void *out = dev_zeros(be, dt, no), *dq = dev_zeros(be, dt, nq), *out0 = dev_zeros(be, dt, no), *dq0 = dev_zeros(be, dt, nq);
    float *lse = dev_zeros(be, DT_FP32, nl), *lse0 = dev_zeros(be, DT_FP32, nl), *scratch = dev_zeros(be, DT_FP32, nl);
    attention_forward(be, dt, out, lse, dqkv_in, NULL, B, T, NH, NH, D);
    attention_backward(be, dt, dq, scratch, ddy, dqkv_in, out, lse, NULL, B, T, NH, NH, D);
    mha_attention_forward(be, dt, out0, lse0, dqkv_in, B, T, C, NH);
    mha_attention_backward(be, dt, dq0, scratch, ddy, dqkv_in, out0, lse0, B, T, C, NH);
    const size_t es = dtype_size(dt);
    char name[96];
    snprintf(name, sizeof name, "attention_mha_same_bits_h%dd%d_%s", NH, D, dtype_name(dt));
    check_true(s, name, same_bits(out, out0, no * es) && same_bits(lse, lse0, nl * 4) && same_bits(dq, dq0, nq * es));
    free(qkv); free(dy);
    void* bufs[] = {dqkv_in, ddy, out, dq, out0, dq0, lse, lse0, scratch};
    for (int i = 0; i < 9; i++) be_free(be, bufs[i]);
}

// Grouped heads are multi-head attention on k, v repeated for every query head of a group: the forward and dq
// are the same operations on the same values, so the same bits.
static void test_attention_gqa_expands(TestStats* s, Backend* be, int NH, int KV, int D) {
    enum { B = 2, T = 19 };
    const int R = NH / KV;
    const size_t ldg = at_ld(NH, KV, D), ldm = at_ld(NH, NH, D);
    const size_t nqg = B * T * ldg, nqm = B * T * ldm, no = (size_t)B * T * NH * D, nl = (size_t)B * NH * T;
    Rng r = {47};
    float *qkv = rand_vec(&r, nqg, 1.5f, DT_FP32), *dy = rand_vec(&r, no, 1, DT_FP32), *qkvm = xmalloc(sizeof(float) * nqm);
    for (int bt = 0; bt < B * T; bt++) {
        const float* g = qkv + bt * ldg;
        float* m = qkvm + bt * ldm;
        memcpy(m, g, sizeof(float) * NH * D);
        for (int h = 0; h < NH; h++) {
            memcpy(m + (NH + h) * D, g + (NH + h / R) * D, sizeof(float) * D);
            memcpy(m + (2 * NH + h) * D, g + (NH + KV + h / R) * D, sizeof(float) * D);
        }
    }
    float *og = dev_zeros(be, DT_FP32, no), *om = dev_zeros(be, DT_FP32, no), *lg = dev_zeros(be, DT_FP32, nl);
    float *lm = dev_zeros(be, DT_FP32, nl), *scratch = dev_zeros(be, DT_FP32, nl);
    float *dg = dev_zeros(be, DT_FP32, nqg), *dm = dev_zeros(be, DT_FP32, nqm);
    attention_forward(be, DT_FP32, og, lg, qkv, NULL, B, T, NH, KV, D);
    attention_forward(be, DT_FP32, om, lm, qkvm, NULL, B, T, NH, NH, D);
    attention_backward(be, DT_FP32, dg, scratch, dy, qkv, og, lg, NULL, B, T, NH, KV, D);
    attention_backward(be, DT_FP32, dm, scratch, dy, qkvm, om, lm, NULL, B, T, NH, NH, D);
    int dq_same = 1;
    for (int bt = 0; bt < B * T; bt++) dq_same &= same_bits(dg + bt * ldg, dm + bt * ldm, sizeof(float) * NH * D);
    char name[96];
    snprintf(name, sizeof name, "attention_gqa_is_repeated_kv_h%dkv%dd%d", NH, KV, D);
    check_true(s, name, same_bits(og, om, no * 4) && same_bits(lg, lm, nl * 4) && dq_same);
    free(qkv); free(dy); free(qkvm);
    be_free(be, og); be_free(be, om); be_free(be, lg); be_free(be, lm); be_free(be, scratch); be_free(be, dg); be_free(be, dm);
}

// ---------------------------------------------------------------------------------------------------
// encoder.

static void test_encoder(TestStats* s, Backend* be) {
    enum { B = 2, T = 5, C = 8, Vp = 16 };
    Rng r = {51};
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&r) % 11);
    tokens[7] = tokens[3];   // a repeated token: its gradients must add up
    tokens[9] = tokens[3];
    float *wte = rand_vec(&r, Vp * C, 1, DT_FP32), *wpe = rand_vec(&r, T * C, 1, DT_FP32), *dy = rand_vec(&r, B * T * C, 1, DT_FP32);
    float *g0 = rand_vec(&r, Vp * C, 1, DT_FP32), *p0 = rand_vec(&r, T * C, 1, DT_FP32);
    float *out = dev_zeros(be, DT_FP32, B * T * C), *dwte = dev_from(be, DT_FP32, g0, Vp * C), *dwpe = dev_from(be, DT_FP32, p0, T * C);
    encoder_forward(be, DT_FP32, out, tokens, NULL, wte, wpe, B, T, C);
    int ok = 1;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) ok &= out[i * C + c] == wte[tokens[i] * C + c] + wpe[(i % T) * C + c];
    check_true(s, "encoder_forward_ref", ok);

    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, NULL, B, T, C);
    double rte[Vp * C] = {0}, rpe[T * C] = {0};   // the increments, in double
    float gte[Vp * C], gpe[T * C];
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) {
            rte[tokens[i] * C + c] += dy[i * C + c];
            rpe[(i % T) * C + c] += dy[i * C + c];
        }
    for (int i = 0; i < Vp * C; i++) gte[i] = dwte[i] - g0[i];
    for (int i = 0; i < T * C; i++) gpe[i] = dwpe[i] - p0[i];
    check_close(s, "encoder_backward_dwte_ref", rel_err(gte, rte, Vp * C), 1e-6);
    check_close(s, "encoder_backward_dwpe_ref", rel_err(gpe, rpe, T * C), 1e-6);
    ok = 1;   // rows of tokens that never occur are untouched
    for (int v = 0; v < Vp; v++) {
        int used = 0;
        for (int i = 0; i < B * T; i++) used |= tokens[i] == v;
        if (!used) ok &= same_bits(dwte + v * C, g0 + v * C, C * 4);
    }
    check_true(s, "encoder_backward_unused_rows_untouched", ok);

    memset(dwte, 0, sizeof(float) * Vp * C);
    memset(dwpe, 0, sizeof(float) * T * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, NULL, B, T, C);
    float *a1 = host_of(dwte, DT_FP32, Vp * C), *b1 = host_of(dwpe, DT_FP32, T * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, NULL, B, T, C);
    ok = 1;
    for (int i = 0; i < Vp * C; i++) ok &= dwte[i] == 2 * a1[i];
    for (int i = 0; i < T * C; i++) ok &= dwpe[i] == 2 * b1[i];
    check_true(s, "encoder_backward_accumulate", ok);
    free(wte); free(wpe); free(dy); free(g0); free(p0); free(a1); free(b1);
    be_free(be, out); be_free(be, dwte); be_free(be, dwpe);
}

// ---------------------------------------------------------------------------------------------------
// gelu and residual.

typedef struct { int n; double *x, *dout; } GeCtx;
static double gelu_loss(const void* v) {
    const GeCtx* c = v;
    double L = 0.0;
    for (int i = 0; i < c->n; i++) L += c->dout[i] * gelu_d(c->x[i]);
    return L;
}

static void test_gelu(TestStats* s, Backend* be) {
    enum { n = 80 };
    Rng r = {61};
    float *x = rand_vec(&r, n, 4, DT_FP32), *dy = rand_vec(&r, n, 1, DT_FP32), out[n], dx[n];
    double ref[n];
    for (int i = 0; i < n; i++) ref[i] = gelu_d(x[i]);
    gelu_forward(be, DT_FP32, out, x, n);
    check_close(s, "gelu_forward_ref", rel_err(out, ref, n), 1e-6);
    gelu_backward(be, DT_FP32, dx, x, dy, n);
    GeCtx c = {n, to_double(x, n), to_double(dy, n)};
    check_fd(s, "gelu_backward_fd", gelu_loss, &c, c.x, dx, n);
    float* alias = host_of(dy, DT_FP32, n);   // dinp may alias dout
    gelu_backward(be, DT_FP32, alias, x, alias, n);
    check_true(s, "gelu_backward_in_place", same_bits(alias, dx, sizeof dx));

    float a[n], b[n], sum[n];
    memcpy(a, x, sizeof a);
    memcpy(b, dy, sizeof b);
    residual_forward(be, DT_FP32, sum, a, b, n);
    residual_forward(be, DT_FP32, a, a, b, n);   // out may alias a
    int ok = same_bits(a, sum, sizeof a);
    for (int i = 0; i < n; i++) ok &= sum[i] == x[i] + dy[i];
    check_true(s, "residual_forward_ref", ok);
    free(x); free(dy); free(alias); free(c.x); free(c.dout);
}

// ---------------------------------------------------------------------------------------------------
// classifier.

typedef struct { int N, V, Vp; const int* targets; double dloss; double* logits; } ClCtx;

static double cl_row_loss(const double* x, int V, int target) {
    double mx = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++) mx = fmax(mx, x[v]);
    for (int v = 0; v < V; v++) sum += exp(x[v] - mx);
    return mx + log(sum) - x[target];   // -log softmax[target]
}
static double cl_loss(const void* v) {
    const ClCtx* c = v;
    double L = 0.0;
    for (int n = 0; n < c->N; n++) L += c->dloss * cl_row_loss(c->logits + (size_t)n * c->Vp, c->V, c->targets[n]);
    return L;
}

static void test_classifier(TestStats* s, Backend* be) {
    enum { N = 10, V = 11, Vp = 16 };
    Rng r = {71};
    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int)(rng_next(&r) % V);
    float *x = rand_vec(&r, N * Vp, 4, DT_FP32), losses[N];
    for (int n = 0; n < N; n++)   // huge padded logits: they must not enter the max or the sum
        for (int v = V; v < Vp; v++) x[n * Vp + v] += 100.0f;
    float* logits = host_of(x, DT_FP32, N * Vp);
    ClCtx c = {N, V, Vp, targets, 1.0 / N, to_double(x, N * Vp)};
    double lref[N];
    for (int n = 0; n < N; n++) lref[n] = cl_row_loss(c.logits + n * Vp, V, targets[n]);
    classifier_forward(be, DT_FP32, logits, losses, targets, N, V, Vp, 1.0f / N, 0);
    check_close(s, "classifier_loss_ref", rel_err(losses, lref, N), 1e-6);
    check_true(s, "classifier_no_dlogits_leaves_logits", same_bits(logits, x, sizeof(float) * N * Vp));
    classifier_forward(be, DT_FP32, logits, losses, targets, N, V, Vp, 1.0f / N, 1);
    check_close(s, "classifier_loss_ref_with_dlogits", rel_err(losses, lref, N), 1e-6);
    float g[N * V];
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) g[n * V + v] = logits[n * Vp + v];
    // FD over the real columns only (padded ones do not enter the loss).
    double* gfd = xmalloc(sizeof(double) * N * V);
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) {
            double* p = c.logits + n * Vp + v;
            double x0 = *p, h = 1e-4;
            *p = x0 + h;
            double fp = cl_loss(&c);
            *p = x0 - h;
            double fm = cl_loss(&c);
            *p = x0;
            gfd[n * V + v] = (fp - fm) / (2 * h);
        }
    check_close(s, "classifier_dlogits_fd", rel_err(g, gfd, N * V), 2e-5);
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) ok &= logits[n * Vp + v] == 0.0f && x[n * Vp + v] != 0.0f;
    check_true(s, "classifier_padded_dlogits_zero", ok);
    free(x); free(logits); free(gfd); free(c.logits);
}

// The vocabulary-parallel embedding and cross-entropy (-tp): `tp` simulated tensor ranks, each with its slice of
// the vocabulary, whose results summed (as the tensor group sums them) must be the whole-vocabulary kernels'.
static void test_encoder_vocab(TestStats* s, Backend* be) {
    enum { B = 2, T = 5, C = 8, Vp = 16, TP = 4, VL = Vp / TP };
    Rng r = {53};
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&r) % 11);
    tokens[7] = tokens[3];
    tokens[9] = tokens[3];
    float *wte = rand_vec(&r, Vp * C, 1, DT_FP32), *wpe = rand_vec(&r, T * C, 1, DT_FP32), *dy = rand_vec(&r, B * T * C, 1, DT_FP32);
    float *g0 = rand_vec(&r, Vp * C, 1, DT_FP32), *p0 = rand_vec(&r, T * C, 1, DT_FP32);
    float *whole = dev_zeros(be, DT_FP32, B * T * C), *part = dev_zeros(be, DT_FP32, B * T * C);
    float sum[B * T * C] = {0};
    encoder_forward(be, DT_FP32, whole, tokens, NULL, wte, wpe, B, T, C);
    for (int k = 0; k < TP; k++) {   // rank 0 adds wpe
        encoder_forward_vocab(be, DT_FP32, part, tokens, NULL, wte + k * VL * C, k == 0 ? wpe : NULL, k * VL, VL, B, T, C);
        for (int i = 0; i < B * T * C; i++) sum[i] += part[i];
    }
    check_true(s, "encoder_forward_vocab_sum_is_whole", same_bits(sum, whole, sizeof(sum)));
    // Backward: each rank's slice of dwte, and its (whole) dwpe, against encoder_backward's.
    float *dwte = dev_from(be, DT_FP32, g0, Vp * C), *dwpe = dev_from(be, DT_FP32, p0, T * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, NULL, B, T, C);
    int ok_te = 1, ok_pe = 1;
    for (int k = 0; k < TP; k++) {
        float *mte = dev_from(be, DT_FP32, g0 + k * VL * C, VL * C), *mpe = dev_from(be, DT_FP32, p0, T * C);
        encoder_backward_vocab(be, DT_FP32, mte, mpe, dy, tokens, NULL, k * VL, VL, B, T, C);
        ok_te &= same_bits(mte, dwte + k * VL * C, sizeof(float) * VL * C);
        ok_pe &= same_bits(mpe, dwpe, sizeof(float) * T * C);
        be_free(be, mte); be_free(be, mpe);
    }
    check_true(s, "encoder_backward_vocab_slices_are_whole", ok_te);
    check_true(s, "encoder_backward_vocab_dwpe_whole", ok_pe);
    free(wte); free(wpe); free(dy); free(g0); free(p0);
    be_free(be, whole); be_free(be, part); be_free(be, dwte); be_free(be, dwpe);
}

static void test_classifier_vocab(TestStats* s, Backend* be) {
    // V = 11 of Vp = 16 over 4 ranks: rank 2 holds 3 real columns and 1 padded, rank 3 only padding.
    enum { N = 10, V = 11, Vp = 16, TP = 4, VL = Vp / TP };
    Rng r = {73};
    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int)(rng_next(&r) % V);
    targets[0] = V - 1;   // on rank 2, beside its padding
    targets[1] = 0;
    float *x = rand_vec(&r, N * Vp, 4, DT_FP32), losses[N], ref_losses[N];
    for (int n = 0; n < N; n++)   // huge padded logits: they must not enter the max or the sum
        for (int v = V; v < Vp; v++) x[n * Vp + v] += 100.0f;
    float* ref = host_of(x, DT_FP32, N * Vp);
    classifier_forward(be, DT_FP32, ref, ref_losses, targets, N, V, Vp, 1.0f / N, 1);
    for (int with_dlogits = 0; with_dlogits < 2; with_dlogits++) {
        float part[TP][N * VL], rowmax[TP][N], stats[TP][3 * N], gmax[N], rank0_losses[N];
        for (int k = 0; k < TP; k++)
            for (int n = 0; n < N; n++) memcpy(part[k] + n * VL, x + n * Vp + k * VL, sizeof(float) * VL);
        int real[TP];
        for (int k = 0; k < TP; k++) real[k] = V - k * VL < 0 ? 0 : V - k * VL > VL ? VL : V - k * VL;
        for (int k = 0; k < TP; k++) classifier_vocab_max(be, DT_FP32, rowmax[k], part[k], N, real[k], VL);
        int ok = 1;
        for (int n = 0; n < N; n++) ok &= rowmax[3][n] == -INFINITY;
        if (!with_dlogits) check_true(s, "classifier_vocab_max_padding_only_rank", ok);
        for (int n = 0; n < N; n++) {   // the group's max, then sums in rank order
            gmax[n] = rowmax[0][n];
            for (int k = 1; k < TP; k++) gmax[n] = fmaxf(gmax[n], rowmax[k][n]);
        }
        for (int k = 0; k < TP; k++) classifier_vocab_sums(be, DT_FP32, stats[k], part[k], gmax, targets, k * VL, N, real[k], VL);
        ok = 1;   // the target's logit from its rank, zeros from the others
        for (int n = 0; n < N; n++)
            for (int k = 0; k < TP; k++) ok &= stats[k][2 * N + n] == (targets[n] / VL == k ? x[n * Vp + targets[n]] : 0.0f);
        if (!with_dlogits) check_true(s, "classifier_vocab_target_logit_from_its_rank", ok);
        int same_losses = 1;
        double worst = 0.0;
        for (int k = 0; k < TP; k++) {
            classifier_vocab_finish(be, DT_FP32, part[k], losses, gmax, &stats[0][0], TP, targets, k * VL, N, real[k], VL,
                                    1.0f / N, with_dlogits);
            for (int n = 0; n < N; n++) worst = fmax(worst, fabs(losses[n] - ref_losses[n]) / fabs(ref_losses[n]));
            if (k == 0) memcpy(rank0_losses, losses, sizeof(losses));
            same_losses &= same_bits(losses, rank0_losses, sizeof(losses));   // every rank gets rank 0's bits
        }
        check_close(s, with_dlogits ? "classifier_vocab_loss_with_dlogits" : "classifier_vocab_loss", worst, 1e-6);
        check_true(s, with_dlogits ? "classifier_vocab_losses_same_on_ranks_dlogits" : "classifier_vocab_losses_same_on_ranks",
                   same_losses);
        if (!with_dlogits) {
            ok = 1;
            for (int k = 0; k < TP; k++)
                for (int n = 0; n < N; n++) ok &= same_bits(part[k] + n * VL, x + n * Vp + k * VL, sizeof(float) * VL);
            check_true(s, "classifier_vocab_no_dlogits_leaves_logits", ok);
            continue;
        }
        float got[N * Vp];
        double want[N * Vp];
        for (int k = 0; k < TP; k++)
            for (int n = 0; n < N; n++)
                for (int v = 0; v < VL; v++) got[n * Vp + k * VL + v] = part[k][n * VL + v], want[n * Vp + k * VL + v] = ref[n * Vp + k * VL + v];
        check_close(s, "classifier_vocab_dlogits_match_whole", rel_err(got, want, N * Vp), 1e-6);
        ok = 1;
        for (int n = 0; n < N; n++)
            for (int v = V; v < Vp; v++) ok &= got[n * Vp + v] == 0.0f;
        check_true(s, "classifier_vocab_padded_dlogits_zero", ok);
    }
    free(x); free(ref);
}

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    test_matmul_forward(&s, be, 10, 8, 12, "matmul_forward_ref_small", "matmul_forward_gelu_ref_small");
    test_matmul_forward(&s, be, 131, 300, 70, "matmul_forward_ref_blocks", "matmul_forward_gelu_ref_blocks");
    test_matmul_backward_fd(&s, be, 0);
    test_matmul_backward_fd(&s, be, 1);
    test_matmul_backward_blocks(&s, be);
    test_layernorm(&s, be);
    const int att_shapes[][3] = {{2, 2, 4}, {4, 4, 16}, {4, 2, 16}, {4, 1, 16}, {2, 1, 128}};
    for (size_t i = 0; i < sizeof att_shapes / sizeof att_shapes[0]; i++)
        test_attention(&s, be, att_shapes[i][0], att_shapes[i][1], att_shapes[i][2]);
    const DType dts[] = {DT_FP32, DT_BF16, DT_FP16};
    for (int i = 0; i < 3; i++) {
        test_attention_mha_bits(&s, be, 3, 64, dts[i]);
        test_attention_mha_bits(&s, be, 4, 16, dts[i]);
    }
    test_attention_gqa_expands(&s, be, 6, 2, 24);
    test_attention_gqa_expands(&s, be, 4, 1, 16);
    test_encoder(&s, be);
    test_gelu(&s, be);
    test_classifier(&s, be);
    test_encoder_vocab(&s, be);
    test_classifier_vocab(&s, be);
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
