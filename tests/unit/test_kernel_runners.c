// test_kernel_runners.c: each kernel's forward and backward run on seeded inputs at shapes that leave partial
// tiles and chunks everywhere (the runners), and run again: with 1, 2 and 3 threads (the same bits), with
// every operand flush against an inaccessible page (the same bits, no fault), and in bf16 and fp16 (close to
// fp32, every output representable). Beside test_kernels.c and test_kernel_precision.c.
//
// Tolerances (relative error = max |got - ref| / max |ref| over a tensor, worst tensor):
//   bf16 kernels vs fp32 on the same inputs   1e-2   (8 significant bits, 2^-9 per rounding; seen ~3e-3)
//   fp16 kernels vs fp32 on the same inputs   2e-3   (11 significant bits; seen ~4e-4)
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/unit/kernel_testlib.h"

// ---------------------------------------------------------------------------------------------------
// The runners' buffers: a pool passed to each runner. With guard set (test_bounds), each buffer is placed
// flush against a page no one may touch, after its last byte (GUARD_AFTER) or before its first
// (GUARD_BEFORE), so a kernel that reads or writes one element outside an operand faults at once;
// be_malloc's rounding to 64 bytes would hide a small overrun from any checker.
typedef enum { GUARD_NONE, GUARD_AFTER, GUARD_BEFORE } Guard;
enum { MAX_GUARDED = 16 };
typedef struct {
    Backend* be;
    Guard guard;
    struct { void* p; void* map; size_t len; } guarded[MAX_GUARDED];
} Pool;

static void* pool_alloc(Pool* pool, size_t bytes) {
    if (pool->guard == GUARD_NONE) return be_malloc(pool->be, bytes);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page, len = data + page;
    unsigned char* map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("test: mmap of %zu bytes failed", len);
    if (mprotect(pool->guard == GUARD_AFTER ? map + data : map, page, PROT_NONE) != 0) fail("test: mprotect failed");
    void* p = pool->guard == GUARD_AFTER ? map + data - bytes : map + page;
    for (int i = 0; i < MAX_GUARDED; i++)
        if (!pool->guarded[i].p) {
            pool->guarded[i].p = p, pool->guarded[i].map = map, pool->guarded[i].len = len;
            return p;
        }
    fail("test: more than %d guarded buffers", MAX_GUARDED);
}
static void pool_release(Pool* pool, void* p) {
    for (int i = 0; i < MAX_GUARDED; i++)
        if (p && pool->guarded[i].p == p) {
            if (munmap(pool->guarded[i].map, pool->guarded[i].len) != 0) fail("test: munmap failed");
            pool->guarded[i].p = NULL;
            return;
        }
    be_free(pool->be, p);
}
// pool_release of each buffer named.
#define POOL_RELEASE(pool, ...)                                                                          \
    do {                                                                                                 \
        void* bufs_[] = {__VA_ARGS__};                                                                   \
        for (size_t i_ = 0; i_ < sizeof bufs_ / sizeof bufs_[0]; i_++) pool_release(pool, bufs_[i_]);    \
    } while (0)
static void* pool_from(Pool* pool, DType dt, const float* h, size_t n) {
    return dev_store(pool_alloc(pool, n * dtype_size(dt)), dt, h, n);
}
static void* pool_zeros(Pool* pool, DType dt, size_t n) {
    void* d = pool_alloc(pool, n * dtype_size(dt));
    be_memset0(pool->be, d, n * dtype_size(dt));
    return d;
}

static double rel_err_f(const float* got, const float* ref, size_t n) {
    double* r = to_double(ref, n);
    double e = rel_err(got, r, n);
    free(r);
    return e;
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

typedef Outs (*Runner)(Pool* pool, DType dt, DType round_dt);

// matmul with the fused GELU, forward and backward (with and without the pre-activation).
static Outs run_matmul(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    const int N = 203, IC = 72, OC = 100;
    Rng r = {21};
    float *x = rand_vec(&r, N * IC, 2, rd), *w = rand_vec(&r, OC * IC, 0.2f, rd), *b = rand_vec(&r, OC, 1, rd), *dy = rand_vec(&r, N * OC, 1, rd);
    void *dx = pool_from(pool, dt, x, N * IC), *dw = pool_from(pool, dt, w, OC * IC), *db = pool_from(pool, dt, b, OC), *ddy = pool_from(pool, dt, dy, N * OC);
    void *out = pool_zeros(pool, dt, N * OC), *pre = pool_zeros(pool, dt, N * OC), *gx = pool_zeros(pool, dt, N * IC);
    void *gin = pool_zeros(pool, dt, N * IC), *gw = pool_zeros(pool, dt, OC * IC), *gb = pool_zeros(pool, dt, OC);
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
    for (int i = 0; i < 10; i++) pool_release(pool, bufs[i]);
    return o;
}

// layernorm.
static Outs run_layernorm(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    const int N = 203, C = 150;
    Rng r = {32};
    float *x = rand_vec(&r, N * C, 2, rd), *w = rand_vec(&r, C, 1, rd), *b = rand_vec(&r, C, 1, rd), *dy = rand_vec(&r, N * C, 1, rd);
    void *dx = pool_from(pool, dt, x, N * C), *dw = pool_from(pool, dt, w, C), *db = pool_from(pool, dt, b, C), *ddy = pool_from(pool, dt, dy, N * C);
    void *out = pool_zeros(pool, dt, N * C), *gx = pool_zeros(pool, dt, N * C), *gw = pool_zeros(pool, dt, C), *gb = pool_zeros(pool, dt, C);
    float *mean = pool_zeros(pool, DT_FP32, N), *rstd = pool_zeros(pool, DT_FP32, N);
    layernorm_forward(be, dt, out, mean, rstd, dx, dw, db, N, C);
    layernorm_backward(be, dt, gx, gw, gb, ddy, dx, dw, mean, rstd, N, C);
    Outs o = {0};
    outs_add(&o, out, dt, N * C); outs_add(&o, gx, dt, N * C); outs_add(&o, gw, dt, C); outs_add(&o, gb, dt, C);
    free(x); free(w); free(b); free(dy);
    void* bufs[] = {dx, dw, db, ddy, out, gx, gw, gb, mean, rstd};
    for (int i = 0; i < 10; i++) pool_release(pool, bufs[i]);
    return o;
}

// attention: multi-head, and grouped-query (3 query heads per kv head, head size 24).
static Outs run_attention_heads(Pool* pool, DType dt, DType rd, int NH, int KV, int D) {
    Backend* be = pool->be;
    enum { B = 2, T = 37 };
    const size_t nq = (size_t)B * T * (NH + 2 * KV) * D, no = (size_t)B * T * NH * D, nl = (size_t)B * NH * T;
    Rng r = {42};
    float *qkv = rand_vec(&r, nq, 2, rd), *dy = rand_vec(&r, no, 1, rd);
    void *dqkv_in = pool_from(pool, dt, qkv, nq), *ddy = pool_from(pool, dt, dy, no);
    void *out = pool_zeros(pool, dt, no), *dq = pool_zeros(pool, dt, nq);
    float *lse = pool_zeros(pool, DT_FP32, nl), *scratch = pool_zeros(pool, DT_FP32, nl);
    attention_forward(be, dt, out, lse, dqkv_in, NULL, B, T, NH, KV, D);
    attention_backward(be, dt, dq, scratch, ddy, dqkv_in, out, lse, NULL, B, T, NH, KV, D);
    Outs o = {0};
    outs_add(&o, out, dt, no); outs_add(&o, dq, dt, nq);
    free(qkv); free(dy);
    pool_release(pool, dqkv_in); pool_release(pool, ddy); pool_release(pool, out); pool_release(pool, dq); pool_release(pool, lse); pool_release(pool, scratch);
    return o;
}
static Outs run_attention(Pool* pool, DType dt, DType rd) { return run_attention_heads(pool, dt, rd, 4, 4, 8); }
static Outs run_attention_gqa(Pool* pool, DType dt, DType rd) { return run_attention_heads(pool, dt, rd, 6, 2, 24); }

// encoder.
static Outs run_encoder(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    enum { B = 4, T = 64, C = 40, Vp = 32 };
    Rng r = {52};
    int* tokens = pool_alloc(pool, sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(rng_next(&r) % 20);   // many repeats
    float *wte = rand_vec(&r, Vp * C, 1, rd), *wpe = rand_vec(&r, T * C, 1, rd), *dy = rand_vec(&r, B * T * C, 1, rd);
    void *dwte_in = pool_from(pool, dt, wte, Vp * C), *dwpe_in = pool_from(pool, dt, wpe, T * C), *ddy = pool_from(pool, dt, dy, B * T * C);
    void *out = pool_zeros(pool, dt, B * T * C), *gte = pool_zeros(pool, dt, Vp * C), *gpe = pool_zeros(pool, dt, T * C);
    encoder_forward(be, dt, out, tokens, NULL, dwte_in, dwpe_in, B, T, C);
    encoder_backward(be, dt, gte, gpe, ddy, tokens, NULL, B, T, C);
    Outs o = {0};
    outs_add(&o, out, dt, B * T * C); outs_add(&o, gte, dt, Vp * C); outs_add(&o, gpe, dt, T * C);
    free(wte); free(wpe); free(dy);
    void* bufs[] = {tokens, dwte_in, dwpe_in, ddy, out, gte, gpe};
    for (int i = 0; i < 7; i++) pool_release(pool, bufs[i]);
    return o;
}

// gelu and residual.
static Outs run_gelu(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    const size_t n = 5000;
    Rng r = {62};
    float *x = rand_vec(&r, n, 4, rd), *dy = rand_vec(&r, n, 1, rd);
    void *dx = pool_from(pool, dt, x, n), *ddy = pool_from(pool, dt, dy, n), *out = pool_zeros(pool, dt, n), *g = pool_zeros(pool, dt, n);
    gelu_forward(be, dt, out, dx, n);
    gelu_backward(be, dt, g, dx, ddy, n);
    Outs o = {0};
    outs_add(&o, out, dt, n); outs_add(&o, g, dt, n);
    residual_forward(be, dt, out, dx, ddy, n);
    outs_add(&o, out, dt, n);
    free(x); free(dy);
    pool_release(pool, dx); pool_release(pool, ddy); pool_release(pool, out); pool_release(pool, g);
    return o;
}

// classifier.
static Outs run_classifier(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    enum { N = 67, V = 500, Vp = 512 };
    Rng r = {72};
    int* targets = pool_alloc(pool, sizeof(int) * N);
    for (int n = 0; n < N; n++) targets[n] = (int)(rng_next(&r) % V);
    float* x = rand_vec(&r, N * Vp, 6, rd);
    void* logits = pool_from(pool, dt, x, N * Vp);
    float* losses = pool_zeros(pool, DT_FP32, N);
    classifier_forward(be, dt, logits, losses, targets, N, V, Vp, 1.0f / N, 1);
    Outs o = {0};
    outs_add(&o, logits, dt, N * Vp);
    o.t[o.k] = host_of(losses, DT_FP32, N);   // fp32 by contract: rounded here only for the 16-bit check
    for (int n = 0; n < N; n++) o.t[o.k][n] = dtype_round(o.t[o.k][n], rd);
    o.n[o.k++] = N;
    free(x);
    pool_release(pool, targets); pool_release(pool, logits); pool_release(pool, losses);
    return o;
}

// RMSNorm: 150 channels against the dw chunks of 64.
static Outs run_rmsnorm(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    const int N = 203, C = 150;
    Rng r = {82};
    float *x = rand_vec(&r, N * C, 2, rd), *w = rand_vec(&r, C, 1, rd), *dy = rand_vec(&r, N * C, 1, rd);
    void *dx = pool_from(pool, dt, x, N * C), *dw = pool_from(pool, dt, w, C), *ddy = pool_from(pool, dt, dy, N * C);
    void *out = pool_zeros(pool, dt, N * C), *gx = pool_zeros(pool, dt, N * C), *gw = pool_zeros(pool, dt, C);
    float* rstd = pool_zeros(pool, DT_FP32, N);
    rmsnorm_forward(be, dt, out, rstd, dx, dw, N, C, 1e-6f);
    rmsnorm_backward(be, dt, gx, gw, ddy, dx, dw, rstd, N, C);
    Outs o = {0};
    outs_add(&o, out, dt, N * C); outs_add(&o, gx, dt, N * C); outs_add(&o, gw, dt, C);
    free(x); free(w); free(dy);
    POOL_RELEASE(pool, dx, dw, ddy, out, gx, gw, rstd);
    return o;
}

// qk_norm on packed qkv with grouped k/v heads: D = 96 against the dw chunks of 64.
static Outs run_qk_norm(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    enum { N = 37, NH = 4, KV = 2, D = 96, W = (NH + 2 * KV) * D };
    Rng r = {92};
    float *x = rand_vec(&r, N * W, 2, rd), *qw = rand_vec(&r, D, 1, rd), *kw = rand_vec(&r, D, 1, rd), *dy = rand_vec(&r, N * W, 1, rd);
    void *dx = pool_from(pool, dt, x, N * W), *dqw = pool_from(pool, dt, qw, D), *dkw = pool_from(pool, dt, kw, D);
    void *ddy = pool_from(pool, dt, dy, N * W), *out = pool_zeros(pool, dt, N * W), *gx = pool_zeros(pool, dt, N * W);
    void *gq = pool_zeros(pool, dt, D), *gk = pool_zeros(pool, dt, D);
    float* rstd = pool_zeros(pool, DT_FP32, N * (NH + KV));
    qk_norm_forward(be, dt, out, rstd, dx, dqw, dkw, N, NH, KV, D, 1e-6f);
    qk_norm_backward(be, dt, gx, gq, gk, ddy, dx, dqw, dkw, rstd, N, NH, KV, D);
    Outs o = {0};
    outs_add(&o, out, dt, N * W); outs_add(&o, gx, dt, N * W); outs_add(&o, gq, dt, D); outs_add(&o, gk, dt, D);
    free(x); free(qw); free(kw); free(dy);
    POOL_RELEASE(pool, dx, dqw, dkw, ddy, out, gx, gq, gk, rstd);
    return o;
}

// RoPE forward and backward, one k/v head.
static Outs run_rope(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    enum { B = 3, T = 29, NH = 4, KV = 1, D = 64, n = B * T * (NH + 2 * KV) * D };
    Rng r = {102};
    float *x = rand_vec(&r, n, 2, rd), *dy = rand_vec(&r, n, 1, rd), f[D / 2];
    for (int i = 0; i < D / 2; i++) f[i] = (float)pow(10000.0, -2.0 * i / D);
    void *dx = pool_from(pool, dt, x, n), *ddy = pool_from(pool, dt, dy, n), *out = pool_zeros(pool, dt, n), *g = pool_zeros(pool, dt, n);
    float* inv_freq = pool_from(pool, DT_FP32, f, D / 2);
    rope_forward(be, dt, out, dx, inv_freq, NULL, B, T, NH, KV, D);
    rope_backward(be, dt, g, ddy, inv_freq, NULL, B, T, NH, KV, D);
    Outs o = {0};
    outs_add(&o, out, dt, n); outs_add(&o, g, dt, n);
    free(x); free(dy);
    POOL_RELEASE(pool, dx, ddy, out, g, inv_freq);
    return o;
}

// SwiGLU.
static Outs run_swiglu(Pool* pool, DType dt, DType rd) {
    Backend* be = pool->be;
    const int N = 67, F = 150;
    Rng r = {112};
    float *gu = rand_vec(&r, N * 2 * F, 6, rd), *dy = rand_vec(&r, N * F, 1, rd);
    void *dgu_in = pool_from(pool, dt, gu, N * 2 * F), *ddy = pool_from(pool, dt, dy, N * F);
    void *out = pool_zeros(pool, dt, N * F), *g = pool_zeros(pool, dt, N * 2 * F);
    swiglu_forward(be, dt, out, dgu_in, N, F);
    swiglu_backward(be, dt, g, ddy, dgu_in, N, F);
    Outs o = {0};
    outs_add(&o, out, dt, N * F); outs_add(&o, g, dt, N * 2 * F);
    free(gu); free(dy);
    POOL_RELEASE(pool, dgu_in, ddy, out, g);
    return o;
}

// ---------------------------------------------------------------------------------------------------
// Thread-count determinism and 16-bit storage, over the runners.

typedef struct { const char* name; Runner run; } Case;

static void test_threads(TestStats* s, Pool* pool, const Case* c) {
    int nthreads = omp_get_max_threads();
    omp_set_num_threads(1);
    Outs one = c->run(pool, DT_FP32, DT_FP32);
    omp_set_num_threads(3);
    Outs three = c->run(pool, DT_FP32, DT_FP32);
    omp_set_num_threads(2);
    Outs two = c->run(pool, DT_FP32, DT_FP32);
    omp_set_num_threads(nthreads);
    char name[96];
    snprintf(name, sizeof name, "%s_threads_1_2_3_identical", c->name);
    check_true(s, name, outs_same_bits(&one, &three) && outs_same_bits(&one, &two));
    outs_free(&one); outs_free(&two); outs_free(&three);
}

// Each runner again with every operand flush against an inaccessible page, after it and then before it
// (pool_alloc): the same bits, and no fault. The runners' shapes leave partial tiles and chunks everywhere
// (matmul: 203 rows against micro-tiles of 6 or 12, 100 and 72 columns against panels of 32 and dbias
// chunks of 64; layernorm, rmsnorm and qk_norm: 150 and 96 channels against chunks of 64), where an edge bound off by one reads or
// writes past an operand and the values alone would not show it (extra rows are computed, then dropped).
static const char* volatile g_bounds_name = "bounds";
static void on_bounds_fault(int sig) {
    static const char why[] = ": a kernel touched memory outside its operands\n";
    (void)sig;
    if (write(1, "FAIL ", 5) < 0 || write(1, (const char*)g_bounds_name, strlen((const char*)g_bounds_name)) < 0 ||
        write(1, why, sizeof why - 1) < 0) _exit(2);
    _exit(1);
}

static void test_bounds(TestStats* s, Pool* pool, const Case* c) {
    const struct { Guard g; DType dt; const char* what; } modes[] = {
        {GUARD_AFTER, DT_FP32, "after_fp32"}, {GUARD_BEFORE, DT_FP32, "before_fp32"}, {GUARD_AFTER, DT_BF16, "after_bf16"}};
    struct sigaction sa = {0}, old_segv, old_bus;
    sa.sa_handler = on_bounds_fault;
    if (sigaction(SIGSEGV, &sa, &old_segv) != 0 || sigaction(SIGBUS, &sa, &old_bus) != 0) fail("test: sigaction: %s", strerror(errno));
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        Outs ref = c->run(pool, modes[i].dt, modes[i].dt);
        char name[96];
        snprintf(name, sizeof name, "%s_bounds_%s", c->name, modes[i].what);
        g_bounds_name = name;
        fflush(stdout);
        pool->guard = modes[i].g;
        Outs got = c->run(pool, modes[i].dt, modes[i].dt);
        pool->guard = GUARD_NONE;
        check_true(s, name, outs_same_bits(&got, &ref));
        outs_free(&ref); outs_free(&got);
    }
    if (sigaction(SIGSEGV, &old_segv, NULL) != 0 || sigaction(SIGBUS, &old_bus, NULL) != 0) fail("test: sigaction: %s", strerror(errno));
}

static void test_16bit(TestStats* s, Pool* pool, const Case* c, DType dt, double tol) {
    Outs ref = c->run(pool, DT_FP32, dt), got = c->run(pool, dt, dt);
    char name[96];
    snprintf(name, sizeof name, "%s_%s_close_to_fp32", c->name, dtype_name(dt));
    check_close(s, name, outs_rel_err(&got, &ref), tol);
    snprintf(name, sizeof name, "%s_%s_outputs_representable", c->name, dtype_name(dt));
    check_true(s, name, outs_representable(&got, dt) && !outs_representable(&ref, dt));
    outs_free(&ref); outs_free(&got);
}

int main(void) {
    TestStats s = {0, 0};
    Pool pool = {.be = backend_create(0), .guard = GUARD_NONE};
    const Case cases[] = {{"matmul", run_matmul}, {"layernorm", run_layernorm}, {"attention", run_attention},
                          {"attention_gqa", run_attention_gqa}, {"encoder", run_encoder}, {"gelu", run_gelu},
                          {"classifier", run_classifier}, {"rmsnorm", run_rmsnorm}, {"qk_norm", run_qk_norm},
                          {"rope", run_rope}, {"swiglu", run_swiglu}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_threads(&s, &pool, &cases[i]);
        test_bounds(&s, &pool, &cases[i]);
        test_16bit(&s, &pool, &cases[i], DT_BF16, 1e-2);
        test_16bit(&s, &pool, &cases[i], DT_FP16, 2e-3);
    }
    backend_destroy(pool.be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
