// test_kernels.c: the CPU twins checked against double-precision references, central finite differences,
// their accumulate/overwrite contract, thread-count determinism, 16-bit storage, no access outside their
// operands (guard pages), and the dtype helpers.
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
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"
#include "tests/testlib.h"

// ---------------------------------------------------------------------------------------------------
// Helpers.

typedef struct { uint64_t s; } Rng;

static uint64_t rng_next(Rng* r) {   // splitmix64
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_unif(Rng* r) { return (float)((rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

// n uniform values in (-scale, scale), each rounded to `round_dt` so every storage type sees them exactly.
static float* rand_vec(Rng* r, size_t n, float scale, DType round_dt) {
    float* v = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = dtype_round(rng_unif(r) * scale, round_dt);
    return v;
}
static double* to_double(const float* f, size_t n) {
    double* d = xmalloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}
// Backend buffers of the runners. With g_guard set (test_bounds), each is placed flush against a page no
// one may touch, after its last byte (GUARD_AFTER) or before its first (GUARD_BEFORE), so a kernel that
// reads or writes one element outside an operand faults at once; be_malloc's rounding to 64 bytes would
// hide a small overrun from any checker.
typedef enum { GUARD_NONE, GUARD_AFTER, GUARD_BEFORE } Guard;
static Guard g_guard = GUARD_NONE;
enum { MAX_GUARDED = 16 };
static struct { void* p; void* map; size_t len; } g_guarded[MAX_GUARDED];

static void* dev_alloc(Backend* be, size_t bytes) {
    if (g_guard == GUARD_NONE) return be_malloc(be, bytes);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page, len = data + page;
    unsigned char* map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("test: mmap of %zu bytes failed", len);
    if (mprotect(g_guard == GUARD_AFTER ? map + data : map, page, PROT_NONE) != 0) fail("test: mprotect failed");
    void* p = g_guard == GUARD_AFTER ? map + data - bytes : map + page;
    for (int i = 0; i < MAX_GUARDED; i++)
        if (!g_guarded[i].p) {
            g_guarded[i].p = p, g_guarded[i].map = map, g_guarded[i].len = len;
            return p;
        }
    fail("test: more than %d guarded buffers", MAX_GUARDED);
}
static void dev_release(Backend* be, void* p) {
    for (int i = 0; i < MAX_GUARDED; i++)
        if (p && g_guarded[i].p == p) {
            if (munmap(g_guarded[i].map, g_guarded[i].len) != 0) fail("test: munmap failed");
            g_guarded[i].p = NULL;
            return;
        }
    be_free(be, p);
}
static void* dev_from(Backend* be, DType dt, const float* h, size_t n) {
    void* d = dev_alloc(be, n * dtype_size(dt));
    host_to_dtype(d, dt, h, n);
    return d;
}
static void* dev_zeros(Backend* be, DType dt, size_t n) {
    void* d = dev_alloc(be, n * dtype_size(dt));
    be_memset0(be, d, n * dtype_size(dt));
    return d;
}
static float* host_of(const void* d, DType dt, size_t n) {
    float* h = xmalloc(sizeof(float) * (n ? n : 1));
    host_from_dtype(h, d, dt, n);
    return h;
}

static double rel_err(const float* got, const double* ref, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        num = e > num || isnan(e) ? e : num;
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}
static double rel_err_f(const float* got, const float* ref, size_t n) {
    double* r = to_double(ref, n);
    double e = rel_err(got, r, n);
    free(r);
    return e;
}

// A scalar loss of double inputs; FD perturbs the inputs in place through the context.
typedef double (*LossFn)(const void* ctx);

static void check_fd(TestStats* s, const char* name, LossFn f, const void* ctx, double* x, const float* grad, size_t n) {
    const double h = 1e-4;
    double* g = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(ctx);
        x[i] = x0 - h;
        double fm = f(ctx);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
    check_close(s, name, rel_err(grad, g, n), 2e-5);
    free(g);
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static int same_bits(const void* a, const void* b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

// ---------------------------------------------------------------------------------------------------
// dtype conversions.

static uint16_t bf16_of(float x) { uint16_t h; host_to_dtype(&h, DT_BF16, &x, 1); return h; }
static uint16_t fp16_of(float x) { uint16_t h; host_to_dtype(&h, DT_FP16, &x, 1); return h; }

static void test_dtype(TestStats* s) {
    const float fmax = f32_from_bits(0x7f7fffffu);
    check_true(s, "bf16_rne_exact", bf16_of(1.0f) == 0x3f80 && bf16_of(-2.0f) == 0xc000);
    check_true(s, "bf16_rne_ties_to_even", bf16_of(f32_from_bits(0x3f808000u)) == 0x3f80 &&
                                               bf16_of(f32_from_bits(0x3f818000u)) == 0x3f82 &&
                                               bf16_of(f32_from_bits(0x3f808001u)) == 0x3f81);
    check_true(s, "bf16_overflow_inf", bf16_of(fmax) == 0x7f80 && bf16_of(-fmax) == 0xff80 && bf16_of(INFINITY) == 0x7f80);
    check_true(s, "bf16_subnormal", bf16_of(f32_from_bits(0x00010000u)) == 0x0001 && bf16_of(f32_from_bits(0x00008001u)) == 0x0001);
    check_true(s, "bf16_nan_stays_nan", isnan(dtype_round(NAN, DT_BF16)) && bf16_of(f32_from_bits(0x7f800001u)) == 0x7fc0);

    check_true(s, "fp16_rne_exact", fp16_of(1.0f) == 0x3c00 && fp16_of(65504.0f) == 0x7bff && fp16_of(-0.5f) == 0xb800);
    check_true(s, "fp16_rne_ties_to_even", fp16_of(1.0f + ldexpf(1, -11)) == 0x3c00 && fp16_of(1.0f + 3 * ldexpf(1, -11)) == 0x3c02);
    check_true(s, "fp16_overflow_inf", fp16_of(65519.0f) == 0x7bff && fp16_of(65520.0f) == 0x7c00 && fp16_of(-1e6f) == 0xfc00);
    check_true(s, "fp16_subnormal", fp16_of(ldexpf(1, -24)) == 0x0001 && fp16_of(ldexpf(1, -25)) == 0x0000 &&
                                        fp16_of(3 * ldexpf(1, -25)) == 0x0002 && fp16_of(ldexpf(1, -14)) == 0x0400 &&
                                        dtype_round(ldexpf(1, -24) * 5, DT_FP16) == ldexpf(1, -24) * 5);
    check_true(s, "fp16_nan_stays_nan", isnan(dtype_round(NAN, DT_FP16)) && (fp16_of(NAN) & 0x7e00) == 0x7e00);

    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {   // every non-NaN 16-bit value survives fp32 and back
        float fb, fh;
        uint16_t h16 = (uint16_t)h, back;
        host_from_dtype(&fb, &h16, DT_BF16, 1);
        host_from_dtype(&fh, &h16, DT_FP16, 1);
        if (!isnan(fb) && (host_to_dtype(&back, DT_BF16, &fb, 1), back != h16)) bad++;
        if (!isnan(fh) && (host_to_dtype(&back, DT_FP16, &fh, 1), back != h16)) bad++;
    }
    check_true(s, "dtype_round_trip_all_16bit", bad == 0);

    // Stochastic rounding: x sits 1/3 of a bf16 ulp above 1, where RNE would be biased by -1/3 ulp.
    const double ulp = ldexp(1, -7);
    float x = (float)(1.0 + ulp / 3);
    double mean = 0.0;
    int n = 200000, repeat_ok = 1, seeds_differ = 0;
    for (int i = 0; i < n; i++) {
        uint16_t r = bf16_from_f32_stochastic(x, element_noise(1234, (uint64_t)i) & 0xffff);
        mean += f32_from_bf16(r);
        repeat_ok &= r == bf16_from_f32_stochastic(x, element_noise(1234, (uint64_t)i) & 0xffff);
        seeds_differ |= r != bf16_from_f32_stochastic(x, element_noise(99, (uint64_t)i) & 0xffff);
    }
    mean /= n;
    // sigma of the mean = ulp * sqrt(p(1-p)/n) ~ 1.1e-3 ulp; 0.01 ulp is ~9 sigma and well below 1/3.
    check_close(s, "bf16_stochastic_unbiased", fabs(mean - x) / ulp, 0.01);
    check_true(s, "bf16_stochastic_deterministic", repeat_ok && seeds_differ);
}

static void test_backend(TestStats* s) {
    Backend* be = backend_create(0);
    void* a = be_malloc(be, 1000);
    void* b = be_malloc(be, 2000);
    be_free(be, a);
    void* c = be_malloc(be, 500);
    check_true(s, "backend_peak_bytes", be_peak_bytes(be) == 3000 && !backend_is_gpu(be) &&
                                            strcmp(backend_device_name(be), "cpu") == 0);
    be_free(be, b);
    be_free(be, c);
    void* d = be_malloc(be, 3500);
    check_true(s, "backend_peak_after_free", be_peak_bytes(be) == 3500);
    be_free(be, d);

    Rng r = {7};
    float* src = rand_vec(&r, 100, 70000.0f, DT_FP32);   // exceeds fp16's range: exercises inf
    void* f32 = dev_from(be, DT_FP32, src, 100);
    void* b16 = dev_zeros(be, DT_BF16, 100);
    void* h16 = dev_zeros(be, DT_FP16, 100);
    convert(be, b16, DT_BF16, f32, DT_FP32, 100);
    convert(be, h16, DT_FP16, b16, DT_BF16, 100);
    int ok = 1;
    for (int i = 0; i < 100; i++) {
        ok &= ((uint16_t*)b16)[i] == bf16_from_f32(src[i]);
        ok &= ((uint16_t*)h16)[i] == fp16_from_f32(f32_from_bf16(bf16_from_f32(src[i])));
    }
    check_true(s, "convert_matches_rne", ok);
    free(src);
    be_free(be, f32);
    be_free(be, b16);
    be_free(be, h16);
    backend_destroy(be);
}

// The CPU backend's asynchronous copies (kernels.h): one queue per direction, each run as late as it may,
// its destination poisoned from issue until then, so that the model runs catch a missing wait. Waiting for
// an upload runs no download; a copy runs when its event is waited for; main-stream work after
// be_stream_wait sees the upload, and without it sees poison, neither old nor new bytes; a download reads
// what the main stream wrote before it was issued.
static void test_backend_copies(TestStats* s) {
    Backend* be = backend_create(0);
    float one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2};
    float* host_down = be_host_alloc(be, sizeof one);
    float* host_up = be_host_alloc(be, sizeof one);
    void* x = dev_from(be, DT_FP32, one, 4);   // downloaded
    void* y = dev_from(be, DT_FP32, one, 4);   // uploaded into
    void* z = dev_zeros(be, DT_FP32, 4);
    BeEvent *down = be_event_create(be), *up = be_event_create(be);
    memcpy(host_up, two, sizeof two);
    for (int i = 0; i < 4; i++) host_down[i] = 0.0f;
    be_download_async(be, host_down, x, sizeof one, down);
    be_upload_async(be, y, host_up, sizeof two, up);
    convert(be, z, DT_FP32, y, DT_FP32, 4);     // issued before any wait: reads poison, not y's old bytes
    float got[4];
    be_download(be, got, z, sizeof got);
    check_true(s, "backend_copy_not_run_before_wait", isnan(got[0]) && isnan(host_down[0]));
    be_stream_wait(be, up);
    convert(be, z, DT_FP32, y, DT_FP32, 4);     // after the wait: the upload's bytes
    be_download(be, got, z, sizeof got);
    check_true(s, "backend_stream_wait_orders_upload", got[0] == 2.0f);
    be_event_synchronize(be, up);
    check_true(s, "backend_upload_wait_runs_no_download", isnan(host_down[0]));
    be_event_synchronize(be, down);
    check_true(s, "backend_download_wait_runs_it", host_down[0] == 1.0f && host_down[3] == 1.0f);
    be_event_destroy(be, down);
    be_event_destroy(be, up);
    be_host_free(be, host_down);
    be_host_free(be, host_up);
    be_free(be, x);
    be_free(be, y);
    be_free(be, z);
    backend_destroy(be);
}

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
// Runners for the storage-type and thread-count checks: one forward + backward on seeded inputs that are
// rounded to round_dt, computed in dt; all outputs come back as fp32 host tensors.

typedef struct { int k; float* t[8]; size_t n[8]; } Outs;

static void outs_add(Outs* o, const void* d, DType dt, size_t n) {
    o->t[o->k] = host_of(d, dt, n);
    o->n[o->k++] = n;
}
static void outs_free(Outs* o) {
    for (int i = 0; i < o->k; i++) free(o->t[i]);
}
static double outs_rel_err(const Outs* got, const Outs* ref) {   // worst tensor
    double e = 0.0;
    for (int i = 0; i < ref->k; i++) {
        double ei = rel_err_f(got->t[i], ref->t[i], ref->n[i]);
        e = ei > e || isnan(ei) ? ei : e;
    }
    return e;
}
static int outs_same_bits(const Outs* a, const Outs* b) {
    int ok = a->k == b->k;
    for (int i = 0; ok && i < a->k; i++) ok = same_bits(a->t[i], b->t[i], sizeof(float) * a->n[i]);
    return ok;
}
static int outs_representable(const Outs* o, DType dt) {   // ld(st(x)) == x for every stored value
    int ok = 1;
    for (int i = 0; i < o->k; i++)
        for (size_t j = 0; j < o->n[i]; j++) ok &= dtype_round(o->t[i][j], dt) == o->t[i][j];
    return ok;
}

typedef Outs (*Runner)(Backend* be, DType dt, DType round_dt);

static Outs run_matmul(Backend* be, DType dt, DType rd) {
    const int N = 203, IC = 72, OC = 100;
    Rng r = {21};
    float *x = rand_vec(&r, N * IC, 2, rd), *w = rand_vec(&r, OC * IC, 0.2f, rd), *b = rand_vec(&r, OC, 1, rd), *dy = rand_vec(&r, N * OC, 1, rd);
    void *dx = dev_from(be, dt, x, N * IC), *dw = dev_from(be, dt, w, OC * IC), *db = dev_from(be, dt, b, OC), *ddy = dev_from(be, dt, dy, N * OC);
    void *out = dev_zeros(be, dt, N * OC), *pre = dev_zeros(be, dt, N * OC), *gx = dev_zeros(be, dt, N * IC);
    void *gin = dev_zeros(be, dt, N * IC), *gw = dev_zeros(be, dt, OC * IC), *gb = dev_zeros(be, dt, OC);
    Outs o = {0};
    matmul_forward(be, dt, out, pre, dx, dw, db, N, IC, OC);
    gelu_forward(be, dt, gx, dx, (size_t)N * IC);
    matmul_backward(be, dt, gin, gw, gb, ddy, gx, dx, dw, N, IC, OC);
    outs_add(&o, out, dt, N * OC); outs_add(&o, pre, dt, N * OC);
    outs_add(&o, gin, dt, N * IC); outs_add(&o, gw, dt, OC * IC); outs_add(&o, gb, dt, OC);
    matmul_backward(be, dt, gin, gw, gb, ddy, dx, NULL, dw, N, IC, OC);
    outs_add(&o, gin, dt, N * IC);
    free(x); free(w); free(b); free(dy);
    void* bufs[] = {dx, dw, db, ddy, out, pre, gx, gin, gw, gb};
    for (int i = 0; i < 10; i++) dev_release(be, bufs[i]);
    return o;
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

static Outs run_layernorm(Backend* be, DType dt, DType rd) {
    const int N = 203, C = 150;
    Rng r = {32};
    float *x = rand_vec(&r, N * C, 2, rd), *w = rand_vec(&r, C, 1, rd), *b = rand_vec(&r, C, 1, rd), *dy = rand_vec(&r, N * C, 1, rd);
    void *dx = dev_from(be, dt, x, N * C), *dw = dev_from(be, dt, w, C), *db = dev_from(be, dt, b, C), *ddy = dev_from(be, dt, dy, N * C);
    void *out = dev_zeros(be, dt, N * C), *gx = dev_zeros(be, dt, N * C), *gw = dev_zeros(be, dt, C), *gb = dev_zeros(be, dt, C);
    float *mean = dev_zeros(be, DT_FP32, N), *rstd = dev_zeros(be, DT_FP32, N);
    layernorm_forward(be, dt, out, mean, rstd, dx, dw, db, N, C);
    layernorm_backward(be, dt, gx, gw, gb, ddy, dx, dw, mean, rstd, N, C);
    Outs o = {0};
    outs_add(&o, out, dt, N * C); outs_add(&o, gx, dt, N * C); outs_add(&o, gw, dt, C); outs_add(&o, gb, dt, C);
    free(x); free(w); free(b); free(dy);
    void* bufs[] = {dx, dw, db, ddy, out, gx, gw, gb, mean, rstd};
    for (int i = 0; i < 10; i++) dev_release(be, bufs[i]);
    return o;
}

// ---------------------------------------------------------------------------------------------------
// attention.

typedef struct { int B, T, C, NH; double *qkv, *dout; } AtCtx;

// Explicit softmax with the causal mask; out (B,T,C), lse (B,NH,T).
static void attn_ref(const AtCtx* c, double* out, double* lse) {
    int T = c->T, C = c->C, hs = C / c->NH;
    double p[64];
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int t = 0; t < T; t++) {
                const double* q = c->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < T; j++) {
                    const double* k = c->qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) d += q[i] * k[i];
                    p[j] = j <= t ? d / sqrt(hs) : -INFINITY;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j < T; j++) sum += (p[j] = exp(p[j] - mx));
                if (lse) lse[((size_t)b * c->NH + h) * T + t] = mx + log(sum);
                for (int i = 0; i < hs; i++) {
                    double y = 0.0;
                    for (int j = 0; j < T; j++) y += p[j] / sum * c->qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + i];
                    out[((size_t)b * T + t) * C + h * hs + i] = y;
                }
            }
}

static double attn_loss(const void* v) {
    const AtCtx* c = v;
    size_t n = (size_t)c->B * c->T * c->C;
    double* out = xmalloc(sizeof(double) * n);
    attn_ref(c, out, NULL);
    double L = 0.0;
    for (size_t i = 0; i < n; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

static void test_attention(TestStats* s, Backend* be) {
    enum { B = 2, T = 5, C = 8, NH = 2 };
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    Rng r = {41};
    float *qkv = rand_vec(&r, nq, 1.5f, DT_FP32), *dy = rand_vec(&r, no, 1, DT_FP32);
    float *out = dev_zeros(be, DT_FP32, no), *lse = dev_zeros(be, DT_FP32, nl), *scratch = dev_zeros(be, DT_FP32, nl);
    float* dq = be_malloc(be, nq * 4);
    for (size_t i = 0; i < nq; i++) dq[i] = 1e3f;   // garbage: dqkv must be overwritten
    attention_forward(be, DT_FP32, out, lse, qkv, B, T, C, NH);
    AtCtx c = {B, T, C, NH, to_double(qkv, nq), to_double(dy, no)};
    double oref[B * T * C], lref[B * NH * T];
    attn_ref(&c, oref, lref);
    check_close(s, "attention_forward_ref", rel_err(out, oref, no), 1e-5);
    check_close(s, "attention_forward_lse_ref", rel_err(lse, lref, nl), 1e-6);

    attention_backward(be, DT_FP32, dq, scratch, dy, qkv, out, lse, B, T, C, NH);
    check_fd(s, "attention_backward_dqkv_fd", attn_loss, &c, c.qkv, dq, nq);
    float* dq1 = host_of(dq, DT_FP32, nq);
    attention_backward(be, DT_FP32, dq, scratch, dy, qkv, out, lse, B, T, C, NH);
    check_true(s, "attention_backward_overwrites", same_bits(dq, dq1, nq * 4));

    // Causality: changing the last position leaves every earlier output bit-identical...
    float* out2 = dev_zeros(be, DT_FP32, no);
    float* qkv2 = host_of(qkv, DT_FP32, nq);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < 3 * C; i++) qkv2[((size_t)b * T + T - 1) * 3 * C + i] += 0.5f;
    attention_forward(be, DT_FP32, out2, lse, qkv2, B, T, C, NH);
    int ok = 1;
    for (int b = 0; b < B; b++) ok &= same_bits(out + (size_t)b * T * C, out2 + (size_t)b * T * C, (size_t)(T - 1) * C * 4);
    ok &= !same_bits(out + (size_t)(T - 1) * C, out2 + (size_t)(T - 1) * C, (size_t)C * 4);
    check_true(s, "attention_forward_causal", ok);
    // ...and a gradient entering at position 1 reaches no later position of q, k or v.
    attention_forward(be, DT_FP32, out, lse, qkv, B, T, C, NH);
    float* dy1 = xcalloc(no, sizeof(float));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < C; i++) dy1[((size_t)b * T + 1) * C + i] = dy[((size_t)b * T + 1) * C + i];
    attention_backward(be, DT_FP32, dq, scratch, dy1, qkv, out, lse, B, T, C, NH);
    ok = 1;
    int nonzero_past = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < 3 * C; i++) {
                float g = dq[((size_t)b * T + t) * 3 * C + i];
                if (t > 1) ok &= g == 0.0f;
                else nonzero_past |= g != 0.0f;
            }
    check_true(s, "attention_backward_causal", ok && nonzero_past);
    free(qkv); free(dy); free(dq1); free(qkv2); free(dy1); free(c.qkv); free(c.dout);
    be_free(be, out); be_free(be, out2); be_free(be, lse); be_free(be, scratch); be_free(be, dq);
}

static Outs run_attention(Backend* be, DType dt, DType rd) {
    enum { B = 2, T = 37, C = 32, NH = 4 };
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    Rng r = {42};
    float *qkv = rand_vec(&r, nq, 2, rd), *dy = rand_vec(&r, no, 1, rd);
    void *dqkv_in = dev_from(be, dt, qkv, nq), *ddy = dev_from(be, dt, dy, no);
    void *out = dev_zeros(be, dt, no), *dq = dev_zeros(be, dt, nq);
    float *lse = dev_zeros(be, DT_FP32, nl), *scratch = dev_zeros(be, DT_FP32, nl);
    attention_forward(be, dt, out, lse, dqkv_in, B, T, C, NH);
    attention_backward(be, dt, dq, scratch, ddy, dqkv_in, out, lse, B, T, C, NH);
    Outs o = {0};
    outs_add(&o, out, dt, no); outs_add(&o, dq, dt, nq);
    free(qkv); free(dy);
    dev_release(be, dqkv_in); dev_release(be, ddy); dev_release(be, out); dev_release(be, dq); dev_release(be, lse); dev_release(be, scratch);
    return o;
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
    encoder_forward(be, DT_FP32, out, tokens, wte, wpe, B, T, C);
    int ok = 1;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) ok &= out[i * C + c] == wte[tokens[i] * C + c] + wpe[(i % T) * C + c];
    check_true(s, "encoder_forward_ref", ok);

    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, B, T, C);
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
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, B, T, C);
    float *a1 = host_of(dwte, DT_FP32, Vp * C), *b1 = host_of(dwpe, DT_FP32, T * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, B, T, C);
    ok = 1;
    for (int i = 0; i < Vp * C; i++) ok &= dwte[i] == 2 * a1[i];
    for (int i = 0; i < T * C; i++) ok &= dwpe[i] == 2 * b1[i];
    check_true(s, "encoder_backward_accumulate", ok);
    free(wte); free(wpe); free(dy); free(g0); free(p0); free(a1); free(b1);
    be_free(be, out); be_free(be, dwte); be_free(be, dwpe);
}

static Outs run_encoder(Backend* be, DType dt, DType rd) {
    enum { B = 4, T = 64, C = 40, Vp = 32 };
    Rng r = {52};
    int* tokens = dev_alloc(be, sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&r) % 20);   // many repeats
    float *wte = rand_vec(&r, Vp * C, 1, rd), *wpe = rand_vec(&r, T * C, 1, rd), *dy = rand_vec(&r, B * T * C, 1, rd);
    void *dwte_in = dev_from(be, dt, wte, Vp * C), *dwpe_in = dev_from(be, dt, wpe, T * C), *ddy = dev_from(be, dt, dy, B * T * C);
    void *out = dev_zeros(be, dt, B * T * C), *gte = dev_zeros(be, dt, Vp * C), *gpe = dev_zeros(be, dt, T * C);
    encoder_forward(be, dt, out, tokens, dwte_in, dwpe_in, B, T, C);
    encoder_backward(be, dt, gte, gpe, ddy, tokens, B, T, C);
    Outs o = {0};
    outs_add(&o, out, dt, B * T * C); outs_add(&o, gte, dt, Vp * C); outs_add(&o, gpe, dt, T * C);
    free(wte); free(wpe); free(dy);
    void* bufs[] = {tokens, dwte_in, dwpe_in, ddy, out, gte, gpe};
    for (int i = 0; i < 7; i++) dev_release(be, bufs[i]);
    return o;
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

static Outs run_gelu(Backend* be, DType dt, DType rd) {
    const size_t n = 5000;
    Rng r = {62};
    float *x = rand_vec(&r, n, 4, rd), *dy = rand_vec(&r, n, 1, rd);
    void *dx = dev_from(be, dt, x, n), *ddy = dev_from(be, dt, dy, n), *out = dev_zeros(be, dt, n), *g = dev_zeros(be, dt, n);
    gelu_forward(be, dt, out, dx, n);
    gelu_backward(be, dt, g, dx, ddy, n);
    Outs o = {0};
    outs_add(&o, out, dt, n); outs_add(&o, g, dt, n);
    residual_forward(be, dt, out, dx, ddy, n);
    outs_add(&o, out, dt, n);
    free(x); free(dy);
    dev_release(be, dx); dev_release(be, ddy); dev_release(be, out); dev_release(be, g);
    return o;
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
    encoder_forward(be, DT_FP32, whole, tokens, wte, wpe, B, T, C);
    for (int k = 0; k < TP; k++) {   // rank 0 adds wpe
        encoder_forward_vocab(be, DT_FP32, part, tokens, wte + k * VL * C, k == 0 ? wpe : NULL, k * VL, VL, B, T, C);
        for (int i = 0; i < B * T * C; i++) sum[i] += part[i];
    }
    check_true(s, "encoder_forward_vocab_sum_is_whole", same_bits(sum, whole, sizeof(sum)));
    // Backward: each rank's slice of dwte, and its (whole) dwpe, against encoder_backward's.
    float *dwte = dev_from(be, DT_FP32, g0, Vp * C), *dwpe = dev_from(be, DT_FP32, p0, T * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, B, T, C);
    int ok_te = 1, ok_pe = 1;
    for (int k = 0; k < TP; k++) {
        float *mte = dev_from(be, DT_FP32, g0 + k * VL * C, VL * C), *mpe = dev_from(be, DT_FP32, p0, T * C);
        encoder_backward_vocab(be, DT_FP32, mte, mpe, dy, tokens, k * VL, VL, B, T, C);
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

static Outs run_classifier(Backend* be, DType dt, DType rd) {
    enum { N = 67, V = 500, Vp = 512 };
    Rng r = {72};
    int* targets = dev_alloc(be, sizeof(int) * N);
    for (int n = 0; n < N; n++) targets[n] = (int)(rng_next(&r) % V);
    float* x = rand_vec(&r, N * Vp, 6, rd);
    void* logits = dev_from(be, dt, x, N * Vp);
    float* losses = dev_zeros(be, DT_FP32, N);
    classifier_forward(be, dt, logits, losses, targets, N, V, Vp, 1.0f / N, 1);
    Outs o = {0};
    outs_add(&o, logits, dt, N * Vp);
    o.t[o.k] = host_of(losses, DT_FP32, N);   // fp32 by contract: rounded here only for the 16-bit check
    for (int n = 0; n < N; n++) o.t[o.k][n] = dtype_round(o.t[o.k][n], rd);
    o.n[o.k++] = N;
    free(x);
    dev_release(be, targets); dev_release(be, logits); dev_release(be, losses);
    return o;
}

// ---------------------------------------------------------------------------------------------------
// AdamW and sum of squares.

typedef struct { float* master; float* m; float* v; } AdamState;

static AdamWArgs adam_args(int step) {
    AdamWArgs a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                   .grad_scale = 0.5f, .step = step, .seed = 777};
    return a;
}

// Three steps from seeded state; grads of grad_dt, params of param_dt (NULL: params alias master).
static void adam_run(Backend* be, size_t n, DType param_dt, DType grad_dt, int alias, float* master, float* m, float* v,
                     void* params, float* const grads[3]) {
    for (int step = 1; step <= 3; step++) {
        AdamWArgs a = adam_args(step);
        void* g = dev_from(be, grad_dt, grads[step - 1], n);
        adamw_update(be, alias ? (void*)master : params, param_dt, master, g, grad_dt, m, v, n, 1000, &a);
        be_free(be, g);
    }
}

static void test_adamw(TestStats* s, Backend* be) {
    enum { n = 1000 };
    Rng r = {81};
    float* w0 = rand_vec(&r, n, 1, DT_FP32);
    float* grads[3];
    for (int k = 0; k < 3; k++) grads[k] = rand_vec(&r, n, 3, DT_BF16);   // exact in bf16: same grads both ways
    float *master = host_of(w0, DT_FP32, n), *m = xcalloc(n, 4), *v = xcalloc(n, 4);
    adam_run(be, n, DT_FP32, DT_FP32, 1, master, m, v, NULL, grads);

    double rw[n], rm[n], rv[n];
    for (int i = 0; i < n; i++) {
        double w = w0[i], mi = 0, vi = 0;
        for (int step = 1; step <= 3; step++) {
            double g = grads[step - 1][i] * 0.5;
            mi = 0.9 * mi + 0.1 * g;
            vi = 0.95 * vi + 0.05 * g * g;
            double mhat = mi / (1 - pow(0.9, step)), vhat = vi / (1 - pow(0.95, step));
            w -= 1e-2 * (mhat / (sqrt(vhat) + 1e-8) + 0.1 * w);
        }
        rw[i] = w;
        rm[i] = mi;
        rv[i] = vi;
    }
    check_close(s, "adamw_fp32_master_ref", rel_err(master, rw, n), 1e-5);
    check_close(s, "adamw_fp32_moments_ref", fmax(rel_err(m, rm, n), rel_err(v, rv, n)), 1e-5);

    // bf16 params and bf16 grads: master is the same; params are the stochastic rounding of master with
    // the noise of (seed, offset + i), bit for bit, whatever the thread count.
    uint16_t p1[n], p2[n];
    float *master2 = host_of(w0, DT_FP32, n), *m2 = xcalloc(n, 4), *v2 = xcalloc(n, 4);
    adam_run(be, n, DT_BF16, DT_BF16, 0, master2, m2, v2, p1, grads);
    int ok = same_bits(master2, master, sizeof(float) * n), rounded_up = 0, rounded_down = 0;
    for (int i = 0; i < n; i++) {
        ok &= p1[i] == bf16_from_f32_stochastic(master2[i], element_noise(777, 1000 + (uint64_t)i) & 0xffff);
        rounded_up += f32_from_bf16(p1[i]) > master2[i];
        rounded_down += f32_from_bf16(p1[i]) < master2[i];
    }
    check_true(s, "adamw_bf16_params_stochastic", ok && rounded_up > 100 && rounded_down > 100);
    int nthreads = omp_get_max_threads();
    omp_set_num_threads(3);
    memcpy(master2, w0, sizeof(float) * n);
    memset(m2, 0, sizeof(float) * n);
    memset(v2, 0, sizeof(float) * n);
    adam_run(be, n, DT_BF16, DT_BF16, 0, master2, m2, v2, p2, grads);
    omp_set_num_threads(nthreads);
    check_true(s, "adamw_bf16_deterministic", same_bits(p1, p2, sizeof p1) && same_bits(master2, master, sizeof(float) * n));

    memcpy(master2, w0, sizeof(float) * n);
    memset(m2, 0, sizeof(float) * n);
    memset(v2, 0, sizeof(float) * n);
    adam_run(be, n, DT_FP16, DT_FP32, 0, master2, m2, v2, p2, grads);
    ok = same_bits(master2, master, sizeof(float) * n);
    for (int i = 0; i < n; i++) ok &= p2[i] == fp16_from_f32(master2[i]);
    check_true(s, "adamw_fp16_params_rne", ok);

    float* sep = xmalloc(sizeof(float) * n);   // fp32 params in their own buffer equal the master
    memcpy(master2, w0, sizeof(float) * n);
    memset(m2, 0, sizeof(float) * n);
    memset(v2, 0, sizeof(float) * n);
    adam_run(be, n, DT_FP32, DT_FP32, 0, master2, m2, v2, sep, grads);
    check_true(s, "adamw_fp32_separate_params", same_bits(sep, master, sizeof(float) * n));
    for (int k = 0; k < 3; k++) free(grads[k]);
    free(w0); free(master); free(m); free(v); free(master2); free(m2); free(v2); free(sep);
}

static void test_sum_squares(TestStats* s, Backend* be) {
    const size_t n = 300001;   // several fixed chunks and a ragged tail
    Rng r = {91};
    float* x = rand_vec(&r, n, 1, DT_FP32);
    double ref = 1.5;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    float* acc = dev_zeros(be, DT_FP32, 1);
    *acc = 1.5f;   // accumulates
    sum_squares(be, DT_FP32, acc, x, n);
    check_close(s, "sum_squares_ref", fabs(*acc - ref) / ref, 1e-6);
    int nthreads = omp_get_max_threads();
    float first = *acc;
    omp_set_num_threads(1);
    *acc = 1.5f;
    sum_squares(be, DT_FP32, acc, x, n);
    float one = *acc;
    omp_set_num_threads(3);
    *acc = 1.5f;
    sum_squares(be, DT_FP32, acc, x, n);
    omp_set_num_threads(nthreads);
    check_true(s, "sum_squares_deterministic", same_bits(&one, acc, 4) && same_bits(&first, acc, 4));
    void* xb = dev_from(be, DT_BF16, x, n);
    float* xr = host_of(xb, DT_BF16, n);
    double refb = 0.0;
    for (size_t i = 0; i < n; i++) refb += (double)xr[i] * xr[i];
    *acc = 0.0f;
    sum_squares(be, DT_BF16, acc, xb, n);
    check_close(s, "sum_squares_bf16_ref", fabs(*acc - refb) / refb, 1e-6);
    // Four whole chunks of 65536 (SUM_SQUARES_CHUNK, adamw_host.h) and a tail of one element, which counts.
    const size_t n1 = 4 * 65536 + 1;
    float* y = xcalloc(n1, sizeof(float));
    y[0] = 1.0f, y[n1 - 1] = 3.0f;
    *acc = 0.0f;
    sum_squares(be, DT_FP32, acc, y, n1);
    check_true(s, "sum_squares_one_element_tail", *acc == 10.0f);
    free(x); free(xr); free(y);
    be_free(be, acc); be_free(be, xb);
}

// ---------------------------------------------------------------------------------------------------
// Thread-count determinism and 16-bit storage, over the runners.

typedef struct { const char* name; Runner run; } Case;

static void test_threads(TestStats* s, Backend* be, const Case* c) {
    int nthreads = omp_get_max_threads();
    omp_set_num_threads(1);
    Outs one = c->run(be, DT_FP32, DT_FP32);
    omp_set_num_threads(3);
    Outs three = c->run(be, DT_FP32, DT_FP32);
    omp_set_num_threads(2);
    Outs two = c->run(be, DT_FP32, DT_FP32);
    omp_set_num_threads(nthreads);
    char name[96];
    snprintf(name, sizeof name, "%s_threads_1_2_3_identical", c->name);
    check_true(s, name, outs_same_bits(&one, &three) && outs_same_bits(&one, &two));
    outs_free(&one); outs_free(&two); outs_free(&three);
}

// Each runner again with every operand flush against an inaccessible page, after it and then before it
// (dev_alloc): the same bits, and no fault. The runners' shapes leave partial tiles and chunks everywhere
// (matmul: 203 rows against micro-tiles of 6 or 12, 100 and 72 columns against panels of 32 and dbias
// chunks of 64; layernorm: 150 channels against chunks of 64), where an edge bound off by one reads or
// writes past an operand and the values alone would not show it (extra rows are computed, then dropped).
static const char* volatile g_bounds_name = "bounds";
static void on_bounds_fault(int sig) {
    static const char why[] = ": a kernel touched memory outside its operands\n";
    (void)sig;
    if (write(1, "FAIL ", 5) < 0 || write(1, (const char*)g_bounds_name, strlen((const char*)g_bounds_name)) < 0 ||
        write(1, why, sizeof why - 1) < 0) _exit(2);
    _exit(1);
}

static void test_bounds(TestStats* s, Backend* be, const Case* c) {
    const struct { Guard g; DType dt; const char* what; } modes[] = {
        {GUARD_AFTER, DT_FP32, "after_fp32"}, {GUARD_BEFORE, DT_FP32, "before_fp32"}, {GUARD_AFTER, DT_BF16, "after_bf16"}};
    struct sigaction sa = {0}, old_segv, old_bus;
    sa.sa_handler = on_bounds_fault;
    if (sigaction(SIGSEGV, &sa, &old_segv) != 0 || sigaction(SIGBUS, &sa, &old_bus) != 0) fail("test: sigaction: %s", strerror(errno));
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        Outs ref = c->run(be, modes[i].dt, modes[i].dt);
        char name[96];
        snprintf(name, sizeof name, "%s_bounds_%s", c->name, modes[i].what);
        g_bounds_name = name;
        fflush(stdout);
        g_guard = modes[i].g;
        Outs got = c->run(be, modes[i].dt, modes[i].dt);
        g_guard = GUARD_NONE;
        check_true(s, name, outs_same_bits(&got, &ref));
        outs_free(&ref); outs_free(&got);
    }
    if (sigaction(SIGSEGV, &old_segv, NULL) != 0 || sigaction(SIGBUS, &old_bus, NULL) != 0) fail("test: sigaction: %s", strerror(errno));
}

static void test_16bit(TestStats* s, Backend* be, const Case* c, DType dt, double tol) {
    Outs ref = c->run(be, DT_FP32, dt), got = c->run(be, dt, dt);
    char name[96];
    snprintf(name, sizeof name, "%s_%s_close_to_fp32", c->name, dtype_name(dt));
    check_close(s, name, outs_rel_err(&got, &ref), tol);
    snprintf(name, sizeof name, "%s_%s_outputs_representable", c->name, dtype_name(dt));
    check_true(s, name, outs_representable(&got, dt) && !outs_representable(&ref, dt));
    outs_free(&ref); outs_free(&got);
}

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    test_dtype(&s);
    test_backend(&s);
    test_backend_copies(&s);
    test_matmul_forward(&s, be, 10, 8, 12, "matmul_forward_ref_small", "matmul_forward_gelu_ref_small");
    test_matmul_forward(&s, be, 131, 300, 70, "matmul_forward_ref_blocks", "matmul_forward_gelu_ref_blocks");
    test_matmul_backward_fd(&s, be, 0);
    test_matmul_backward_fd(&s, be, 1);
    test_matmul_backward_blocks(&s, be);
    test_layernorm(&s, be);
    test_attention(&s, be);
    test_encoder(&s, be);
    test_gelu(&s, be);
    test_classifier(&s, be);
    test_encoder_vocab(&s, be);
    test_classifier_vocab(&s, be);
    test_adamw(&s, be);
    test_sum_squares(&s, be);
    const Case cases[] = {{"matmul", run_matmul}, {"layernorm", run_layernorm}, {"attention", run_attention},
                          {"encoder", run_encoder}, {"gelu", run_gelu}, {"classifier", run_classifier}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_threads(&s, be, &cases[i]);
        test_bounds(&s, be, &cases[i]);
        test_16bit(&s, be, &cases[i], DT_BF16, 1e-2);
        test_16bit(&s, be, &cases[i], DT_FP16, 2e-3);
    }
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
