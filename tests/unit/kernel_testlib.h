// kernel_testlib.h: what the kernel test programs share (test_kernels.c, test_kernels_llama.c,
// test_kernel_precision.c, test_kernel_runners.c): seeded inputs, backend buffers from host tensors and back,
// relative error against a double reference, central finite differences, bitwise comparison.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"
#include "tests/unit/testlib.h"

typedef struct { uint64_t s; } Rng;

static inline uint64_t rng_next(Rng* r) {   // splitmix64
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float rng_unif(Rng* r) { return (float)((rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

// n uniform values in (-scale, scale), each rounded to `round_dt` so every storage type sees them exactly.
static inline float* rand_vec(Rng* r, size_t n, float scale, DType round_dt) {
    float* v = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = dtype_round(rng_unif(r) * scale, round_dt);
    return v;
}
static inline double* to_double(const float* f, size_t n) {
    double* d = xmalloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

// Backend buffers (be_free them): n values of dt stored from h, or zeros. dev_store fills a buffer of n values
// that came from elsewhere (test_kernel_runners.c's guarded pool).
static inline void* dev_store(void* d, DType dt, const float* h, size_t n) {
    host_to_dtype(d, dt, h, n);
    return d;
}
static inline void* dev_from(Backend* be, DType dt, const float* h, size_t n) {
    return dev_store(be_malloc(be, n * dtype_size(dt)), dt, h, n);
}
static inline void* dev_zeros(Backend* be, DType dt, size_t n) {
    void* d = be_malloc(be, n * dtype_size(dt));
    be_memset0(be, d, n * dtype_size(dt));
    return d;
}
static inline float* host_of(const void* d, DType dt, size_t n) {
    float* h = xmalloc(sizeof(float) * (n ? n : 1));
    host_from_dtype(h, d, dt, n);
    return h;
}

static inline double rel_err(const float* got, const double* ref, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        num = e > num || isnan(e) ? e : num;
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}

static inline int same_bits(const void* a, const void* b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

// A scalar loss of double inputs; FD perturbs the inputs in place through the context.
typedef double (*LossFn)(const void* ctx);

// grad (n) against central differences of f over x (n), h = 1e-4 on a double reference: the FD error is ~1e-9,
// so 2e-5 bounds the kernel's fp32 rounding.
static inline void check_fd(TestStats* s, const char* name, LossFn f, const void* ctx, double* x, const float* grad,
                            size_t n) {
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
