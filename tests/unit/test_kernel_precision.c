// test_kernel_precision.c: the dtype helpers (round to nearest even, overflow, subnormals, NaN, every 16-bit
// value's round trip, stochastic rounding), the CPU backend (peak bytes, convert, its asynchronous copies),
// AdamW against a double reference and its 16-bit parameters, and the sum of squares. Beside
// test_kernels.c and test_kernel_runners.c.
//
// Tolerance: AdamW fp32 vs double reference, 3 steps 1e-5 (relative error = max |got - ref| / max |ref|).
// Rounding, determinism and the 16-bit parameters are compared bit for bit.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/kernel_testlib.h"

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

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    test_dtype(&s);
    test_backend(&s);
    test_backend_copies(&s);
    test_adamw(&s, be);
    test_sum_squares(&s, be);
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
