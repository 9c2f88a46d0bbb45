// kernel_check.c: runs every kernel of kernels.h on seeded inputs and writes its outputs as raw float32,
// so the CPU twins and the CUDA kernels can be compared file by file (tests/gpu/compare_kernels.py).
// One source, built twice: build/kernel_check_cpu (CPU backend) and build/kernel_check_gpu (CUDA).
//
//   kernel_check OUTDIR SEED DTYPE      DTYPE = fp32 | bf16 | fp16
//
// Inputs are generated on the host from SEED (the same values in both builds, never zeros), rounded to
// DTYPE with host_to_dtype and uploaded. Every output buffer is poisoned (0xFF bytes: NaN in every type)
// except those the contract says accumulate, which start from random values. Each output is written as
// OUTDIR/<shape>_<kernel>.<tensor>.f32 and listed in OUTDIR/index.txt ("<shape>_<kernel> <tensor> <n>").
// Kernels that promise determinism run twice from the same state; the bits must match ("ok det_...").
// The kernels that take documents (kernels.h) also run with them ("..._doc", "..._pos", "..._ignore" outputs):
// rows packed with seeded documents (make_docs), and targets of -1 for the classifiers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/common.h"
#include "kernels/kernels.h"
#include "tests/unit/testlib.h"

typedef struct {
    const char* name;
    int B, T, C, NH, V, Vp, cls_rows;
} Shape;

typedef struct {
    Backend* be;
    DType dt;
    const char* outdir;
    uint32_t seed;
    FILE* index;
    TestStats stats;
    void* live[64];   // backend buffers of the current test, freed by end_test
    int n_live;
} Ctx;

// ---------------------------------------------------------------------------------------------------
// Seeded values: element i of stream `tag` is a pure function of (seed, tag, i).
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float urand(const Ctx* c, uint32_t tag, size_t i) {   // uniform in [-1, 1)
    const uint64_t u = mix64(mix64(((uint64_t)c->seed << 32) ^ tag) ^ (uint64_t)i);
    return (float)((double)(u >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}
// Host values lo + (hi - lo) * u, u in [0,1), already rounded to the run's dtype (so host-side references
// see exactly what the backend sees).
static float* hvals(Ctx* c, uint32_t tag, size_t n, float lo, float hi, DType round_dt) {
    float* h = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = dtype_round(lo + (hi - lo) * 0.5f * (urand(c, tag, i) + 1.0f), round_dt);
    return h;
}

static void* track(Ctx* c, void* p) {
    if (c->n_live == (int)(sizeof(c->live) / sizeof(c->live[0]))) fail("kernel_check: too many live buffers");
    c->live[c->n_live++] = p;
    return p;
}
static void end_test(Ctx* c) {
    for (int i = 0; i < c->n_live; i++) be_free(c->be, c->live[i]);
    c->n_live = 0;
}
static void* dalloc(Ctx* c, size_t bytes) { return track(c, be_malloc(c->be, bytes)); }
// Upload host floats as dtype dt into an existing buffer.
static void put(Ctx* c, void* d, const float* h, size_t n, DType dt) {
    void* tmp = xmalloc(n * dtype_size(dt));
    host_to_dtype(tmp, dt, h, n);
    be_upload(c->be, d, tmp, n * dtype_size(dt));
    free(tmp);
}
static void* dnew(Ctx* c, const float* h, size_t n, DType dt) {
    void* d = dalloc(c, n * dtype_size(dt));
    put(c, d, h, n, dt);
    return d;
}
static void poison(Ctx* c, void* d, size_t bytes) {
    void* tmp = xmalloc(bytes);
    memset(tmp, 0xff, bytes);
    be_upload(c->be, d, tmp, bytes);
    free(tmp);
}
static void* dpoisoned(Ctx* c, size_t bytes) {
    void* d = dalloc(c, bytes);
    poison(c, d, bytes);
    return d;
}

// Documents packed into B rows of T (kernels.h): doc (B,T) and pos (B,T) on the host. Even rows hold documents of
// seeded lengths up to T, odd rows short ones (up to 37 tokens, the first of one token), so documents start and
// end inside the kernels' tiles, and whole tiles lie before a row's document or after a key's.
static void make_docs(const Ctx* c, int B, int T, int* doc, int* pos) {
    for (int b = 0; b < B; b++)
        for (int t = 0, k = 0; t < T; k++) {
            const uint64_t u = mix64(((uint64_t)c->seed << 32) ^ (0xd0c0000u + (uint64_t)b * 4096 + (uint64_t)k));
            int len = 1 + (int)(u % (uint64_t)(b % 2 ? 37 : T));
            if (b % 2 && k == 0) len = 1;
            for (int i = t; i < T && i < t + len; i++) doc[(size_t)b * T + i] = t, pos[(size_t)b * T + i] = i - t;
            t += len;
        }
}
// make_docs' arrays uploaded: doc if want_doc, else pos.
static int* ddocs(Ctx* c, int B, int T, int want_doc) {
    int* doc = (int*)xmalloc((size_t)B * T * sizeof(int));
    int* pos = (int*)xmalloc((size_t)B * T * sizeof(int));
    make_docs(c, B, T, doc, pos);
    int* d = (int*)dalloc(c, (size_t)B * T * sizeof(int));
    be_upload(c->be, d, want_doc ? doc : pos, (size_t)B * T * sizeof(int));
    free(doc), free(pos);
    return d;
}

// Outputs of one test: rep 0 writes the files and keeps the raw bytes, rep 1 compares bits with rep 0.
typedef struct {
    char kernel[96];
    int n;
    void* raw[16];
    size_t bytes[16];
    char tensor[16][32];
} Outs;

static void outs_begin_named(Outs* o, const char* shape, const char* kernel) {
    memset(o, 0, sizeof(*o));
    snprintf(o->kernel, sizeof(o->kernel), "%s_%s", shape, kernel);
}
static void outs_begin(Outs* o, const Shape* s, const char* kernel) { outs_begin_named(o, s->name, kernel); }
// Collect output `tensor` (n elements of dt at d) for repetition `rep`.
static void out(Ctx* c, Outs* o, int rep, const char* tensor, const void* d, DType dt, size_t n) {
    const size_t bytes = n * dtype_size(dt);
    void* raw = xmalloc(bytes);
    be_download(c->be, raw, d, bytes);
    if (rep == 0) {
        float* f = (float*)xmalloc(n * sizeof(float));
        host_from_dtype(f, raw, dt, n);
        char path[512];
        snprintf(path, sizeof(path), "%s/%s.%s.f32", c->outdir, o->kernel, tensor);
        FILE* fp = xfopen(path, "wb");
        xfwrite(f, sizeof(float), n, fp, path);
        xfclose(fp, path);
        free(f);
        fprintf(c->index, "%s %s %zu\n", o->kernel, tensor, n);
        if (o->n == 16) fail("kernel_check: too many outputs for %s", o->kernel);
        o->raw[o->n] = raw;
        o->bytes[o->n] = bytes;
        snprintf(o->tensor[o->n], sizeof(o->tensor[0]), "%s", tensor);
        o->n++;
        return;
    }
    for (int i = 0; i < o->n; i++) {
        if (strcmp(o->tensor[i], tensor) != 0) continue;
        char name[160];
        snprintf(name, sizeof(name), "det_%s.%s", o->kernel, tensor);
        check_true(&c->stats, name, o->bytes[i] == bytes && memcmp(o->raw[i], raw, bytes) == 0);
    }
    free(raw);
}
static void outs_end(Outs* o) {
    for (int i = 0; i < o->n; i++) free(o->raw[i]);
}

// ---------------------------------------------------------------------------------------------------
static float gelu_host(float x) {
    const float s = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x)));
}

// With `pos` (device, make_docs' positions) the _pos outputs: wpe rows by position in the document.
static void t_encoder(Ctx* c, const Shape* s, int with_pos) {
    const DType dt = c->dt;
    const int B = s->B, T = s->T, C = s->C, N = B * T;
    // Half the positions draw from a handful of ids, so dwte rows collect many contributions.
    int* tok = (int*)xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) {
        const uint64_t u = mix64(((uint64_t)c->seed << 32) ^ (0x70c0000u + (uint64_t)i));
        tok[i] = (i % 2) ? (int)(u % (uint64_t)s->V) : (int)(u % 7u) * 13;
    }
    int* dtok = (int*)dalloc(c, (size_t)N * sizeof(int));
    be_upload(c->be, dtok, tok, (size_t)N * sizeof(int));
    float* hwte = hvals(c, 101, (size_t)s->Vp * C, -0.5f, 0.5f, dt);
    float* hwpe = hvals(c, 102, (size_t)T * C, -0.2f, 0.2f, dt);
    void* wte = dnew(c, hwte, (size_t)s->Vp * C, dt);
    void* wpe = dnew(c, hwpe, (size_t)T * C, dt);
    const int* pos = with_pos ? ddocs(c, B, T, 0) : NULL;
    Outs o;
    outs_begin(&o, s, with_pos ? "encoder_forward_pos" : "encoder_forward");
    void* outp = dpoisoned(c, (size_t)N * C * dtype_size(dt));
    encoder_forward(c->be, dt, outp, dtok, pos, wte, wpe, B, T, C);
    out(c, &o, 0, "out", outp, dt, (size_t)N * C);
    outs_end(&o);

    // Backward: wte/wpe now play the accumulated gradients' initial values.
    float* hdout = hvals(c, 103, (size_t)N * C, -1.0f, 1.0f, dt);
    void* dout = dnew(c, hdout, (size_t)N * C, dt);
    outs_begin(&o, s, with_pos ? "encoder_backward_pos" : "encoder_backward");
    for (int rep = 0; rep < 2; rep++) {
        put(c, wte, hwte, (size_t)s->Vp * C, dt);
        put(c, wpe, hwpe, (size_t)T * C, dt);
        encoder_backward(c->be, dt, wte, wpe, dout, dtok, pos, B, T, C);
        out(c, &o, rep, "dwte", wte, dt, (size_t)s->Vp * C);
        out(c, &o, rep, "dwpe", wpe, dt, (size_t)T * C);
    }
    outs_end(&o);
    free(tok), free(hwte), free(hwpe), free(hdout);
    end_test(c);
}

static void t_layernorm(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const int N = s->B * s->T, C = s->C;
    float* hinp = hvals(c, 201, (size_t)N * C, -2.0f, 2.5f, dt);
    float* hw = hvals(c, 202, C, 0.5f, 1.5f, dt);
    float* hb = hvals(c, 203, C, -0.3f, 0.3f, dt);
    void* inp = dnew(c, hinp, (size_t)N * C, dt);
    void* w = dnew(c, hw, C, dt);
    void* b = dnew(c, hb, C, dt);
    Outs o;
    outs_begin(&o, s, "layernorm_forward");
    void* outp = dpoisoned(c, (size_t)N * C * dtype_size(dt));
    float* mean = (float*)dpoisoned(c, (size_t)N * 4);
    float* rstd = (float*)dpoisoned(c, (size_t)N * 4);
    layernorm_forward(c->be, dt, outp, mean, rstd, inp, w, b, N, C);
    out(c, &o, 0, "out", outp, dt, (size_t)N * C);
    out(c, &o, 0, "mean", mean, DT_FP32, N);
    out(c, &o, 0, "rstd", rstd, DT_FP32, N);
    outs_end(&o);

    // The backward gets mean/rstd computed here in double, so it does not depend on the forward's bits.
    float* hmean = (float*)xmalloc((size_t)N * 4);
    float* hrstd = (float*)xmalloc((size_t)N * 4);
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += hinp[(size_t)n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (hinp[(size_t)n * C + i] - m) * (hinp[(size_t)n * C + i] - m);
        hmean[n] = (float)m;
        hrstd[n] = (float)(1.0 / sqrt(v / C + 1e-5));
    }
    put(c, mean, hmean, N, DT_FP32);
    put(c, rstd, hrstd, N, DT_FP32);
    float* hdout = hvals(c, 204, (size_t)N * C, -1.0f, 1.0f, dt);
    float* hdinp = hvals(c, 205, (size_t)N * C, -0.5f, 0.5f, dt);
    float* hdw = hvals(c, 206, C, -0.5f, 0.5f, dt);
    float* hdb = hvals(c, 207, C, -0.5f, 0.5f, dt);
    void* dout = dnew(c, hdout, (size_t)N * C, dt);
    void* dinp = dalloc(c, (size_t)N * C * dtype_size(dt));
    void* dw = dalloc(c, (size_t)C * dtype_size(dt));
    void* db = dalloc(c, (size_t)C * dtype_size(dt));
    outs_begin(&o, s, "layernorm_backward");
    for (int rep = 0; rep < 2; rep++) {
        put(c, dinp, hdinp, (size_t)N * C, dt);
        put(c, dw, hdw, C, dt);
        put(c, db, hdb, C, dt);
        layernorm_backward(c->be, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        out(c, &o, rep, "dinp", dinp, dt, (size_t)N * C);
        out(c, &o, rep, "dw", dw, dt, C);
        out(c, &o, rep, "db", db, dt, C);
    }
    outs_end(&o);
    free(hinp), free(hw), free(hb), free(hmean), free(hrstd), free(hdout), free(hdinp), free(hdw), free(hdb);
    end_test(c);
}

// ---------------------------------------------------------------------------------------------------
// The Llama kernels. Packed qkv takes the shape's head size D = C/NH and KV = NH/3 k/v heads where 3 divides NH
// (grouped), else 1.
static int shape_kv(const Shape* s) { return s->NH % 3 == 0 ? s->NH / 3 : 1; }

// rstd of H heads of D channels per row of width W (the first H*D channels), in double: the backwards get
// statistics that do not depend on either build's forward.
static float* rms_rstd_host(const float* x, int N, int H, int D, size_t W, float eps) {
    float* r = (float*)xmalloc((size_t)N * H * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            double ss = 0;
            for (int i = 0; i < D; i++) ss += (double)x[n * W + (size_t)h * D + i] * x[n * W + (size_t)h * D + i];
            r[(size_t)n * H + h] = (float)(1.0 / sqrt(ss / D + eps));
        }
    return r;
}

// C = the shape's C (16-byte packs on the GPU) or not a multiple of 8 (element by element).
static void t_rmsnorm(Ctx* c, const Shape* s, int C, const char* fwd, const char* bwd) {
    const DType dt = c->dt;
    const int N = s->B * s->T;
    const float eps = 1e-6f;
    float* hinp = hvals(c, 1301, (size_t)N * C, -2.0f, 2.5f, dt);
    float* hw = hvals(c, 1302, C, 0.5f, 1.5f, dt);
    void* inp = dnew(c, hinp, (size_t)N * C, dt);
    void* w = dnew(c, hw, C, dt);
    void* outp = dpoisoned(c, (size_t)N * C * dtype_size(dt));
    float* rstd = (float*)dpoisoned(c, (size_t)N * 4);
    Outs o;
    outs_begin(&o, s, fwd);
    rmsnorm_forward(c->be, dt, outp, rstd, inp, w, N, C, eps);
    out(c, &o, 0, "out", outp, dt, (size_t)N * C);
    out(c, &o, 0, "rstd", rstd, DT_FP32, N);
    outs_end(&o);

    float* hrstd = rms_rstd_host(hinp, N, 1, C, C, eps);
    put(c, rstd, hrstd, N, DT_FP32);
    float* hdout = hvals(c, 1303, (size_t)N * C, -1.0f, 1.0f, dt);
    float* hdinp = hvals(c, 1304, (size_t)N * C, -0.5f, 0.5f, dt);
    float* hdw = hvals(c, 1305, C, -0.5f, 0.5f, dt);
    void* dout = dnew(c, hdout, (size_t)N * C, dt);
    void* dinp = dalloc(c, (size_t)N * C * dtype_size(dt));
    void* dw = dalloc(c, (size_t)C * dtype_size(dt));
    outs_begin(&o, s, bwd);
    for (int rep = 0; rep < 2; rep++) {
        put(c, dinp, hdinp, (size_t)N * C, dt);
        put(c, dw, hdw, C, dt);
        rmsnorm_backward(c->be, dt, dinp, dw, dout, inp, w, rstd, N, C);
        out(c, &o, rep, "dinp", dinp, dt, (size_t)N * C);
        out(c, &o, rep, "dw", dw, dt, C);
    }
    outs_end(&o);
    free(hinp), free(hw), free(hrstd), free(hdout), free(hdinp), free(hdw);
    end_test(c);
}

static void t_qk_norm(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const int N = s->B * s->T, NH = s->NH, KV = shape_kv(s), D = s->C / s->NH;
    const size_t W = (size_t)(NH + 2 * KV) * D, n = (size_t)N * W, ns = (size_t)N * (NH + KV);
    const float eps = 1e-6f;
    float* hinp = hvals(c, 1311, n, -2.0f, 2.5f, dt);
    float* hqw = hvals(c, 1312, D, 0.5f, 1.5f, dt);
    float* hkw = hvals(c, 1313, D, 0.5f, 1.5f, dt);
    void* inp = dnew(c, hinp, n, dt);
    void* qw = dnew(c, hqw, D, dt);
    void* kw = dnew(c, hkw, D, dt);
    void* outp = dpoisoned(c, n * dtype_size(dt));
    float* rstd = (float*)dpoisoned(c, ns * 4);
    Outs o;
    outs_begin(&o, s, "qk_norm_forward");
    qk_norm_forward(c->be, dt, outp, rstd, inp, qw, kw, N, NH, KV, D, eps);
    out(c, &o, 0, "out", outp, dt, n);
    out(c, &o, 0, "rstd", rstd, DT_FP32, ns);
    outs_end(&o);

    float* hrstd = rms_rstd_host(hinp, N, NH + KV, D, W, eps);
    put(c, rstd, hrstd, ns, DT_FP32);
    float* hdout = hvals(c, 1314, n, -1.0f, 1.0f, dt);
    float* hdw = hvals(c, 1315, 2 * (size_t)D, -0.5f, 0.5f, dt);
    void* dout = dnew(c, hdout, n, dt);
    void* dinp = dalloc(c, n * dtype_size(dt));
    void* dqw = dalloc(c, (size_t)D * dtype_size(dt));
    void* dkw = dalloc(c, (size_t)D * dtype_size(dt));
    outs_begin(&o, s, "qk_norm_backward");
    for (int rep = 0; rep < 2; rep++) {
        poison(c, dinp, n * dtype_size(dt));
        put(c, dqw, hdw, D, dt);
        put(c, dkw, hdw + D, D, dt);
        qk_norm_backward(c->be, dt, dinp, dqw, dkw, dout, inp, qw, kw, rstd, N, NH, KV, D);
        out(c, &o, rep, "dinp", dinp, dt, n);
        out(c, &o, rep, "dqw", dqw, dt, D);
        out(c, &o, rep, "dkw", dkw, dt, D);
    }
    outs_end(&o);
    free(hinp), free(hqw), free(hkw), free(hrstd), free(hdout), free(hdw);
    end_test(c);
}

// One direction of RoPE into a poisoned buffer, then in place (out aliasing inp), as the model runs it; with pos
// (device) at the tokens' positions in their documents.
static void rope_rows(Ctx* c, const Shape* s, int backward, const float* hx, const float* inv_freq, const int* pos) {
    const DType dt = c->dt;
    const int B = s->B, T = s->T, NH = s->NH, KV = shape_kv(s), D = s->C / s->NH;
    const size_t n = (size_t)B * T * (NH + 2 * KV) * D;
    void* x = dnew(c, hx, n, dt);
    void* y = dpoisoned(c, n * dtype_size(dt));
    void (*rope)(Backend*, DType, void*, const void*, const float*, const int*, int, int, int, int, int) =
        backward ? rope_backward : rope_forward;
    Outs o;
    char name[64];
    snprintf(name, sizeof name, "rope_%s%s", backward ? "backward" : "forward", pos ? "_pos" : "");
    outs_begin(&o, s, name);
    rope(c->be, dt, y, x, inv_freq, pos, B, T, NH, KV, D);
    out(c, &o, 0, backward ? "dinp" : "out", y, dt, n);
    outs_end(&o);
    snprintf(name, sizeof name, "rope_%s_inplace%s", backward ? "backward" : "forward", pos ? "_pos" : "");
    outs_begin(&o, s, name);
    rope(c->be, dt, x, x, inv_freq, pos, B, T, NH, KV, D);
    out(c, &o, 0, backward ? "dinp" : "out", x, dt, n);
    outs_end(&o);
}

static void t_rope(Ctx* c, const Shape* s) {
    const int D = s->C / s->NH, KV = shape_kv(s);
    const size_t n = (size_t)s->B * s->T * (s->NH + 2 * KV) * D;
    float* hf = (float*)xmalloc((size_t)(D / 2) * sizeof(float));
    for (int i = 0; i < D / 2; i++) hf[i] = (float)pow(10000.0, -2.0 * i / D);   // rope_theta 10000
    float* inv_freq = (float*)dnew(c, hf, D / 2, DT_FP32);
    float* hx = hvals(c, 1321, n, -2.0f, 2.0f, c->dt);
    float* hdout = hvals(c, 1322, n, -1.0f, 1.0f, c->dt);
    rope_rows(c, s, 0, hx, inv_freq, NULL);
    rope_rows(c, s, 1, hdout, inv_freq, NULL);
    const int* pos = ddocs(c, s->B, s->T, 0);
    rope_rows(c, s, 0, hx, inv_freq, pos);
    rope_rows(c, s, 1, hdout, inv_freq, pos);
    free(hf), free(hx), free(hdout);
    end_test(c);
}

// F = a whole number of 16-byte packs (vectorized on the GPU) or not (element by element).
static void t_swiglu(Ctx* c, const Shape* s, int F, const char* fwd, const char* bwd) {
    const DType dt = c->dt;
    const int N = s->B * s->T;
    const size_t n = (size_t)N * F;
    float* hgu = hvals(c, 1331, 2 * n, -6.0f, 6.0f, dt);
    float* hdout = hvals(c, 1332, n, -1.0f, 1.0f, dt);
    void* gu = dnew(c, hgu, 2 * n, dt);
    void* dout = dnew(c, hdout, n, dt);
    void* outp = dpoisoned(c, n * dtype_size(dt));
    void* dgu = dalloc(c, 2 * n * dtype_size(dt));
    Outs o;
    outs_begin(&o, s, fwd);
    swiglu_forward(c->be, dt, outp, gu, N, F);
    out(c, &o, 0, "out", outp, dt, n);
    outs_end(&o);
    outs_begin(&o, s, bwd);
    for (int rep = 0; rep < 2; rep++) {
        poison(c, dgu, 2 * n * dtype_size(dt));
        swiglu_backward(c->be, dt, dgu, dout, gu, N, F);
        out(c, &o, rep, "dgu", dgu, dt, 2 * n);
    }
    outs_end(&o);
    free(hgu), free(hdout);
    end_test(c);
}

// kind: 0 = bias, 1 = no bias, 2 = bias + fused GELU.
static void t_matmul_forward(Ctx* c, const Shape* s, int kind) {
    const DType dt = c->dt;
    const int N = s->B * s->T, IC = s->C, OC = kind == 0 ? 3 * s->C : kind == 1 ? s->C : 4 * s->C;
    const float ws = 1.0f / sqrtf((float)IC);
    float* hinp = hvals(c, 301 + 10 * kind, (size_t)N * IC, -1.5f, 1.5f, dt);
    float* hw = hvals(c, 302 + 10 * kind, (size_t)OC * IC, -ws, ws, dt);
    float* hb = hvals(c, 303 + 10 * kind, OC, -0.5f, 0.5f, dt);
    void* inp = dnew(c, hinp, (size_t)N * IC, dt);
    void* w = dnew(c, hw, (size_t)OC * IC, dt);
    void* b = kind == 1 ? NULL : dnew(c, hb, OC, dt);
    void* outp = dpoisoned(c, (size_t)N * OC * dtype_size(dt));
    void* pre = kind == 2 ? dpoisoned(c, (size_t)N * OC * dtype_size(dt)) : NULL;
    Outs o;
    outs_begin(&o, s, kind == 0 ? "matmul_forward_bias" : kind == 1 ? "matmul_forward_nobias" : "matmul_forward_gelu");
    matmul_forward(c->be, dt, outp, pre, inp, w, b, N, IC, OC);
    out(c, &o, 0, "out", outp, dt, (size_t)N * OC);
    if (pre) out(c, &o, 0, "pre_gelu", pre, dt, (size_t)N * OC);
    outs_end(&o);
    free(hinp), free(hw), free(hb);
    end_test(c);
}

// kind: 0 = bias (IC=C, OC=3C), 1 = no bias (IC=OC=C), 2 = bias + GELU input (IC=4C, OC=C).
static void t_matmul_backward(Ctx* c, const Shape* s, int kind) {
    const DType dt = c->dt;
    const int N = s->B * s->T, IC = kind == 2 ? 4 * s->C : s->C, OC = kind == 0 ? 3 * s->C : s->C;
    const float ws = 1.0f / sqrtf((float)IC);
    float* hdout = hvals(c, 401 + 10 * kind, (size_t)N * OC, -1.0f, 1.0f, dt);
    float* hinp = hvals(c, 402 + 10 * kind, (size_t)N * IC, -1.5f, 1.5f, dt);
    float* hw = hvals(c, 403 + 10 * kind, (size_t)OC * IC, -ws, ws, dt);
    float* hdw = hvals(c, 404 + 10 * kind, (size_t)OC * IC, -0.1f, 0.1f, dt);
    float* hdb = hvals(c, 405 + 10 * kind, OC, -0.5f, 0.5f, dt);
    float* hpre = NULL;
    if (kind == 2) {   // inp = gelu(pre), stored rounded, as the forward would have left it
        hpre = hinp;
        hinp = (float*)xmalloc((size_t)N * IC * sizeof(float));
        for (size_t i = 0; i < (size_t)N * IC; i++) hinp[i] = dtype_round(gelu_host(hpre[i]), dt);
    }
    void* dout = dnew(c, hdout, (size_t)N * OC, dt);
    void* inp = dnew(c, hinp, (size_t)N * IC, dt);
    void* pre = hpre ? dnew(c, hpre, (size_t)N * IC, dt) : NULL;
    void* w = dnew(c, hw, (size_t)OC * IC, dt);
    void* dinp = dalloc(c, (size_t)N * IC * dtype_size(dt));
    void* dw = dalloc(c, (size_t)OC * IC * dtype_size(dt));
    void* db = kind == 1 ? NULL : dalloc(c, (size_t)OC * dtype_size(dt));
    Outs o;
    outs_begin(&o, s, kind == 0 ? "matmul_backward_bias" : kind == 1 ? "matmul_backward_nobias" : "matmul_backward_gelu");
    for (int rep = 0; rep < 2; rep++) {
        poison(c, dinp, (size_t)N * IC * dtype_size(dt));
        put(c, dw, hdw, (size_t)OC * IC, dt);
        if (db) put(c, db, hdb, OC, dt);
        matmul_backward(c->be, dt, dinp, dw, db, dout, inp, pre, w, N, IC, OC);
        out(c, &o, rep, "dinp", dinp, dt, (size_t)N * IC);
        out(c, &o, rep, "dw", dw, dt, (size_t)OC * IC);
        if (db) out(c, &o, rep, "dbias", db, dt, OC);
    }
    outs_end(&o);
    free(hdout), free(hinp), free(hw), free(hdw), free(hdb), free(hpre);
    end_test(c);
}

// An attention test's shape: NH query heads sharing KV kv heads of size D.
typedef struct {
    const char* name;
    int B, T, NH, KV, D;
} AttShape;

// Host attention in double: out (B,T,NH*D) rounded to dt and lse (B,NH,T), inputs for the backward; with doc
// (host, make_docs') each query attends its document's keys only.
static void attention_host(const float* qkv, float* outh, float* lse, const AttShape* a, DType dt, const int* doc) {
    const int T = a->T, D = a->D, NH = a->NH, R = a->NH / a->KV;
    const size_t ld = (size_t)(NH + 2 * a->KV) * D;
    const double scale = 1.0 / sqrt((double)D);
    double* sc = (double*)xmalloc((size_t)T * sizeof(double));
    double* acc = (double*)xmalloc((size_t)D * sizeof(double));
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float* rows = qkv + (size_t)b * T * ld;
                const float* q = rows + i * ld + h * D;
                const size_t koff = (size_t)(NH + h / R) * D, voff = koff + (size_t)a->KV * D;
                double m = -INFINITY;
                const int j0 = doc ? doc[(size_t)b * T + i] : 0;
                for (int j = j0; j <= i; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)q[e] * rows[j * ld + koff + e];
                    sc[j] = d * scale;
                    if (sc[j] > m) m = sc[j];
                }
                double sum = 0;
                for (int e = 0; e < D; e++) acc[e] = 0;
                for (int j = j0; j <= i; j++) {
                    const double p = exp(sc[j] - m);
                    sum += p;
                    for (int e = 0; e < D; e++) acc[e] += p * rows[j * ld + voff + e];
                }
                for (int e = 0; e < D; e++)
                    outh[((size_t)b * T + i) * NH * D + h * D + e] = dtype_round((float)(acc[e] / sum), dt);
                lse[((size_t)b * NH + h) * T + i] = (float)(m + log(sum));
            }
    free(sc);
    free(acc);
}

// With `docs`, the _doc outputs: documents packed into the rows (make_docs).
static void t_attention(Ctx* c, const AttShape* a, int docs) {
    const DType dt = c->dt;
    const int B = a->B, T = a->T, NH = a->NH, KV = a->KV, D = a->D, N = B * T;
    int* hdoc = NULL;
    int* doc = NULL;
    if (docs) {
        hdoc = (int*)xmalloc((size_t)N * sizeof(int));
        int* hpos = (int*)xmalloc((size_t)N * sizeof(int));
        make_docs(c, B, T, hdoc, hpos);
        free(hpos);
        doc = ddocs(c, B, T, 1);
    }
    const size_t nq = (size_t)N * (NH + 2 * KV) * D, no = (size_t)N * NH * D, nl = (size_t)B * NH * T;
    float* hqkv = hvals(c, 501, nq, -1.5f, 1.5f, dt);
    void* qkv = dnew(c, hqkv, nq, dt);
    void* outp = dpoisoned(c, no * dtype_size(dt));
    float* lse = (float*)dpoisoned(c, nl * 4);
    Outs o;
    outs_begin_named(&o, a->name, docs ? "attention_forward_doc" : "attention_forward");
    attention_forward(c->be, dt, outp, lse, qkv, doc, B, T, NH, KV, D);
    out(c, &o, 0, "out", outp, dt, no);
    out(c, &o, 0, "lse", lse, DT_FP32, nl);
    outs_end(&o);

    float* hout = (float*)xmalloc(no * sizeof(float));
    float* hlse = (float*)xmalloc(nl * sizeof(float));
    attention_host(hqkv, hout, hlse, a, dt, hdoc);
    put(c, outp, hout, no, dt);
    put(c, lse, hlse, nl, DT_FP32);
    float* hdout = hvals(c, 502, no, -1.0f, 1.0f, dt);
    void* dout = dnew(c, hdout, no, dt);
    void* dqkv = dalloc(c, nq * dtype_size(dt));
    float* scratch = (float*)dalloc(c, nl * 4);
    outs_begin_named(&o, a->name, docs ? "attention_backward_doc" : "attention_backward");
    for (int rep = 0; rep < 2; rep++) {
        poison(c, dqkv, nq * dtype_size(dt));
        poison(c, scratch, nl * 4);
        attention_backward(c->be, dt, dqkv, scratch, dout, qkv, outp, lse, doc, B, T, NH, KV, D);
        out(c, &o, rep, "dqkv", dqkv, dt, nq);
    }
    outs_end(&o);
    free(hqkv), free(hout), free(hlse), free(hdout), free(hdoc);
    end_test(c);
}

// Rows t0 .. t0+n-1 of columns col .. col+width-1 of src (B,T,W), as (B,n,width): a chunk of a sequence.
static float* rows_of(const float* src, int B, int T, size_t W, size_t col, size_t width, int t0, int n) {
    float* dst = (float*)xmalloc(sizeof(float) * ((size_t)B * n * width + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(dst + ((size_t)b * n + t) * width, src + ((size_t)b * T + t0 + t) * W + col, sizeof(float) * width);
    return dst;
}
// An lse that may hold -inf (a row with no key), which compare_kernels.py refuses: written as the finite values
// with 0 at -inf ("lse") and the mask of -inf ("lse_inf"), so both the values and where the -infs are compare.
static void out_lse(Ctx* c, Outs* o, int rep, const float* lse, size_t n) {
    float* h = (float*)xmalloc(n * sizeof(float));
    float* mask = (float*)xmalloc(n * sizeof(float));
    be_download(c->be, h, lse, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        mask[i] = h[i] == -INFINITY ? 1.0f : 0.0f;
        h[i] = h[i] == -INFINITY ? 0.0f : h[i];
    }
    float* d = (float*)be_malloc(c->be, n * sizeof(float));
    be_upload(c->be, d, h, n * sizeof(float));
    out(c, o, rep, "lse", d, DT_FP32, n);
    be_upload(c->be, d, mask, n * sizeof(float));
    out(c, o, rep, "lse_inf", d, DT_FP32, n);
    be_free(c->be, d);
    free(h), free(mask);
}

// Attention in chunks (kernels.h): the sequence's rows [t1, T) as the query chunk against the key chunks
// [0, t1) (every key attended: "past") and [t1, T) (causal: "diag"); the rows [0, t1) against the keys
// [t1 - 7, T), of which only the last 7 queries see any ("partial": rows of -inf lse and zero out beside the
// others); the merge of seeded partial results, some rows at -inf on one side or both; and the backward of
// the three pairs from the whole sequence's out and lse (attention_host), accumulating into seeded dq and dkv.
// With hdoc (make_docs' doc of the whole rows) the _doc outputs: each pair given its queries' document starts,
// so rows whose document starts after a pair's keys have none there (lse -inf, out 0, nothing added).
typedef struct { int q0, Tq, k0, Tk; const char* name; } ChunkPair;

// The query chunk's document starts (columns q0 .. q0+Tq-1 of the (B,T) host doc) on the device; NULL for NULL.
static int* chunk_docs(Ctx* c, const int* hdoc, int B, int T, int q0, int Tq) {
    if (!hdoc) return NULL;
    int* h = (int*)xmalloc(sizeof(int) * ((size_t)B * Tq + 1));
    for (int b = 0; b < B; b++) memcpy(h + (size_t)b * Tq, hdoc + (size_t)b * T + q0, sizeof(int) * Tq);
    int* d = (int*)dalloc(c, sizeof(int) * ((size_t)B * Tq + 1));
    be_upload(c->be, d, h, sizeof(int) * (size_t)B * Tq);
    free(h);
    return d;
}

static void t_attention_chunk_forward(Ctx* c, const AttShape* a, const float* hqkv, const ChunkPair* pairs,
                                      const int* hdoc) {
    const DType dt = c->dt;
    const int B = a->B, T = a->T, NH = a->NH, KV = a->KV, D = a->D;
    const size_t W = (size_t)(NH + 2 * KV) * D, C = (size_t)NH * D;
    for (int k = 0; k < 3; k++) {
        const ChunkPair* p = &pairs[k];
        float* hq = rows_of(hqkv, B, T, W, 0, C, p->q0, p->Tq);
        float* hkv = rows_of(hqkv, B, T, W, C, 2 * (size_t)KV * D, p->k0, p->Tk);
        void* q = dnew(c, hq, (size_t)B * p->Tq * C, dt);
        void* kv = dnew(c, hkv, (size_t)B * p->Tk * 2 * KV * D, dt);
        const size_t no = (size_t)B * p->Tq * C, nl = (size_t)B * NH * p->Tq;
        void* outp = dpoisoned(c, no * dtype_size(dt));
        float* lse = (float*)dpoisoned(c, nl * 4);
        const int* doc = chunk_docs(c, hdoc, B, T, p->q0, p->Tq);
        char kernel[64];
        snprintf(kernel, sizeof kernel, "attention_chunk_forward_%s%s", hdoc ? "doc_" : "", p->name);
        Outs o;
        outs_begin_named(&o, a->name, kernel);
        attention_chunk_forward(c->be, dt, outp, lse, q, kv, doc, B, p->Tq, p->Tk, p->q0, p->k0, NH, KV, D);
        out(c, &o, 0, "out", outp, dt, no);
        out_lse(c, &o, 0, lse, nl);
        outs_end(&o);
        free(hq), free(hkv);
    }
}

static void t_attention_lse_merge(Ctx* c, const AttShape* a) {
    const DType dt = c->dt;
    const int B = a->B, T = a->T, NH = a->NH, D = a->D;
    const size_t no = (size_t)B * T * NH * D, nl = (size_t)B * NH * T;
    float* ho = hvals(c, 511, no, -1.0f, 1.0f, dt);
    float* ho2 = hvals(c, 512, no, -1.0f, 1.0f, dt);
    float* hl = hvals(c, 513, nl, -2.0f, 3.0f, DT_FP32);
    float* hl2 = hvals(c, 514, nl, -2.0f, 3.0f, DT_FP32);
    for (size_t i = 0; i < nl; i++) {   // every 5th row empty on the first side, every 7th on the second
        if (i % 5 == 0) hl[i] = -INFINITY;
        if (i % 7 == 0) hl2[i] = -INFINITY;
    }
    void* outp = dalloc(c, no * dtype_size(dt));
    float* lse = (float*)dalloc(c, nl * 4);
    void* out2 = dnew(c, ho2, no, dt);
    float* lse2 = (float*)dnew(c, hl2, nl, DT_FP32);
    Outs o;
    outs_begin_named(&o, a->name, "attention_lse_merge");
    for (int rep = 0; rep < 2; rep++) {
        put(c, outp, ho, no, dt);
        put(c, lse, hl, nl, DT_FP32);
        attention_lse_merge(c->be, dt, outp, lse, out2, lse2, B, T, NH, D);
        out(c, &o, rep, "out", outp, dt, no);
        out_lse(c, &o, rep, lse, nl);
    }
    outs_end(&o);
    free(ho), free(ho2), free(hl), free(hl2);
}

static void t_attention_chunk_backward(Ctx* c, const AttShape* a, const float* hqkv, const ChunkPair* pairs,
                                       const int* hdoc) {
    const DType dt = c->dt;
    const int B = a->B, T = a->T, NH = a->NH, KV = a->KV, D = a->D;
    const size_t W = (size_t)(NH + 2 * KV) * D, C = (size_t)NH * D, KW = 2 * (size_t)KV * D;
    float* hout = (float*)xmalloc(sizeof(float) * B * T * C);
    float* hlse = (float*)xmalloc(sizeof(float) * B * NH * T);
    attention_host(hqkv, hout, hlse, a, dt, hdoc);
    float* hdout = hvals(c, 515, (size_t)B * T * C, -1.0f, 1.0f, dt);
    for (int k = 0; k < 3; k++) {
        const ChunkPair* p = &pairs[k];
        const size_t nq = (size_t)B * p->Tq * C, nkv = (size_t)B * p->Tk * KW;
        float* hq = rows_of(hqkv, B, T, W, 0, C, p->q0, p->Tq);
        float* hkv = rows_of(hqkv, B, T, W, C, KW, p->k0, p->Tk);
        float* ho = rows_of(hout, B, T, C, 0, C, p->q0, p->Tq);
        float* hd = rows_of(hdout, B, T, C, 0, C, p->q0, p->Tq);
        float* hl = rows_of(hlse, B * NH, T, 1, 0, 1, p->q0, p->Tq);
        float* hdq = hvals(c, 516, nq, -0.5f, 0.5f, dt);
        float* hdkv = hvals(c, 517, nkv, -0.5f, 0.5f, dt);
        void *q = dnew(c, hq, nq, dt), *kv = dnew(c, hkv, nkv, dt), *outp = dnew(c, ho, nq, dt), *dout = dnew(c, hd, nq, dt);
        float* lse = (float*)dnew(c, hl, (size_t)B * NH * p->Tq, DT_FP32);
        void* dq = dalloc(c, nq * dtype_size(dt));
        void* dkv = dalloc(c, nkv * dtype_size(dt));
        const int* doc = chunk_docs(c, hdoc, B, T, p->q0, p->Tq);
        char kernel[64];
        snprintf(kernel, sizeof kernel, "attention_chunk_backward_%s%s", hdoc ? "doc_" : "", p->name);
        Outs o;
        outs_begin_named(&o, a->name, kernel);
        for (int rep = 0; rep < 2; rep++) {
            put(c, dq, hdq, nq, dt);
            put(c, dkv, hdkv, nkv, dt);
            attention_chunk_backward(c->be, dt, dq, dkv, dout, q, kv, outp, lse, doc, B, p->Tq, p->Tk, p->q0, p->k0, NH, KV, D);
            out(c, &o, rep, "dq", dq, dt, nq);
            out(c, &o, rep, "dkv", dkv, dt, nkv);
        }
        outs_end(&o);
        free(hq), free(hkv), free(ho), free(hd), free(hl), free(hdq), free(hdkv);
    }
    free(hout), free(hlse), free(hdout);
}

static void t_attention_chunk(Ctx* c, const AttShape* a) {
    const int t1 = a->T / 3;
    const ChunkPair pairs[3] = {{t1, a->T - t1, 0, t1, "past"}, {t1, a->T - t1, t1, a->T - t1, "diag"},
                                {0, t1, t1 - 7, a->T - t1 + 7, "partial"}};
    const size_t nqkv = (size_t)a->B * a->T * (a->NH + 2 * a->KV) * a->D;
    float* hqkv = hvals(c, 510, nqkv, -1.5f, 1.5f, c->dt);
    t_attention_chunk_forward(c, a, hqkv, pairs, NULL);
    t_attention_lse_merge(c, a);
    t_attention_chunk_backward(c, a, hqkv, pairs, NULL);
    end_test(c);   // the device buffers so far, before the documents' as many again
    int* hdoc = (int*)xmalloc(sizeof(int) * (size_t)a->B * a->T);
    int* hpos = (int*)xmalloc(sizeof(int) * (size_t)a->B * a->T);
    make_docs(c, a->B, a->T, hdoc, hpos);
    t_attention_chunk_forward(c, a, hqkv, pairs, hdoc);
    t_attention_chunk_backward(c, a, hqkv, pairs, hdoc);
    free(hqkv), free(hdoc), free(hpos);
    end_test(c);
}

static void t_elementwise(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const size_t n = (size_t)s->B * s->T * s->C * 4 + 3;   // + 3: a tail that is not a whole 16-byte pack
    float* ha = hvals(c, 601, n, -3.0f, 3.0f, dt);
    float* hb = hvals(c, 602, n, -1.0f, 1.0f, dt);
    void* a = dnew(c, ha, n, dt);
    void* b = dnew(c, hb, n, dt);
    void* o1 = dpoisoned(c, n * dtype_size(dt));
    Outs o;
    outs_begin(&o, s, "residual_forward");
    residual_forward(c->be, dt, o1, a, b, n);
    out(c, &o, 0, "out", o1, dt, n);
    outs_end(&o);
    outs_begin(&o, s, "gelu_forward");
    poison(c, o1, n * dtype_size(dt));
    gelu_forward(c->be, dt, o1, a, n);
    out(c, &o, 0, "out", o1, dt, n);
    outs_end(&o);
    outs_begin(&o, s, "gelu_backward");
    poison(c, o1, n * dtype_size(dt));
    gelu_backward(c->be, dt, o1, a, b, n);
    out(c, &o, 0, "dinp", o1, dt, n);
    outs_end(&o);
    // In place (dinp aliases dout; out aliases a), as the trainer uses them.
    outs_begin(&o, s, "gelu_backward_inplace");
    gelu_backward(c->be, dt, b, a, b, n);
    out(c, &o, 0, "dinp", b, dt, n);
    outs_end(&o);
    outs_begin(&o, s, "residual_forward_inplace");
    put(c, b, hb, n, dt);
    residual_forward(c->be, dt, a, a, b, n);
    out(c, &o, 0, "out", a, dt, n);
    outs_end(&o);
    free(ha), free(hb);
    end_test(c);
}

// LoRA's dropout: a whole matrix (C + 3 columns: rows that are not whole 16-byte packs); columns of a wider
// one whose indices pass 2^32 (the mask's 64-bit element index); in place at another rate.
static void t_lora_dropout(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const int N = s->B * s->T, C = s->C + 3, width = 1 << 30, col0 = width - 2 * C;
    const size_t n = (size_t)N * C;
    const uint32_t key = c->seed * 2654435761u + 1401u;
    float* hx = hvals(c, 1401, n, -2.0f, 2.0f, dt);
    void* x = dnew(c, hx, n, dt);
    void* o1 = dpoisoned(c, n * dtype_size(dt));
    Outs o;
    outs_begin(&o, s, "lora_dropout");
    lora_dropout(c->be, dt, o1, x, N, C, 0, C, key, 0.1f);
    out(c, &o, 0, "out", o1, dt, n);
    outs_end(&o);
    outs_begin(&o, s, "lora_dropout_columns");
    poison(c, o1, n * dtype_size(dt));
    lora_dropout(c->be, dt, o1, x, N, C, col0, width, key, 0.1f);
    out(c, &o, 0, "out", o1, dt, n);
    outs_end(&o);
    outs_begin(&o, s, "lora_dropout_inplace");
    lora_dropout(c->be, dt, x, x, N, C, 0, C, key + 1, 0.5f);
    out(c, &o, 0, "out", x, dt, n);
    outs_end(&o);
    free(hx);
    end_test(c);
}

// Integer bytes (q of quantize_blocks) written as floats, signed for int8, the raw byte for packed int4.
static void out_bytes(Ctx* c, Outs* o, const char* tensor, const void* d, size_t n, int is_signed) {
    unsigned char* raw = (unsigned char*)xmalloc(n);
    be_download(c->be, raw, d, n);
    float* f = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = is_signed ? (float)(signed char)raw[i] : (float)raw[i];
    void* tmp = dalloc(c, n * sizeof(float));
    be_upload(c->be, tmp, f, n * sizeof(float));
    out(c, o, 0, tensor, tmp, DT_FP32, n);
    free(raw), free(f);
}

// Block quantization at 8 and 4 bits: blocks of 2048 (ZeRO++'s weights) and of 64 with a short last block, a
// zero block among them; the integers, the scales, the round trip and the round trip added to x.
static void t_quantize(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const size_t n = (size_t)s->B * s->T * s->C + 37;
    float* hx = hvals(c, 1501, n, -3.0f, 3.0f, dt);
    for (size_t i = 64; i < 128 && i < n; i++) hx[i] = 0.0f;
    void* x = dnew(c, hx, n, dt);
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int block = 2048; block >= 64; block /= 32) {
            char name[64];
            snprintf(name, sizeof name, "quantize_int%d_block%d", bits, block);
            const size_t nb = quantized_blocks(n, block), qb = quantized_bytes(n, bits);
            void* q = dpoisoned(c, qb);
            float* scales = (float*)dpoisoned(c, nb * sizeof(float));
            void* y = dpoisoned(c, n * dtype_size(dt));
            Outs o;
            outs_begin(&o, s, name);
            quantize_blocks(c->be, dt, q, scales, x, n, block, bits);
            out_bytes(c, &o, "q", q, qb, bits == 8);
            out(c, &o, 0, "scales", scales, DT_FP32, nb);
            dequantize_blocks(c->be, dt, y, q, scales, n, block, bits, 0);
            out(c, &o, 0, "out", y, dt, n);
            be_copy(c->be, y, x, n * dtype_size(dt));
            dequantize_blocks(c->be, dt, y, q, scales, n, block, bits, 1);
            out(c, &o, 0, "added", y, dt, n);
            outs_end(&o);
        }
    free(hx);
    end_test(c);
}

// With `ignore`, every third target is -1 (not a label) and the outputs are the _ignore ones.
static void t_classifier(Ctx* c, const Shape* s, int ignore) {
    const DType dt = c->dt;
    const int N = s->cls_rows < s->B * s->T ? s->cls_rows : s->B * s->T, V = s->V, Vp = s->Vp;
    float* hl = hvals(c, 701, (size_t)N * Vp, -4.0f, 4.0f, dt);
    int* tg = (int*)xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tg[i] = (int)(mix64(((uint64_t)c->seed << 32) ^ (0x7a000u + (uint64_t)i)) % (uint64_t)V);
    tg[0] = V - 1;   // the last real column: the padded tail's neighbour
    for (int i = 1; i < N; i += 3) tg[i] = ignore ? CLASSIFIER_IGNORE : tg[i];
    int* dtg = (int*)dalloc(c, (size_t)N * sizeof(int));
    be_upload(c->be, dtg, tg, (size_t)N * sizeof(int));
    void* logits = dnew(c, hl, (size_t)N * Vp, dt);
    float* losses = (float*)dpoisoned(c, (size_t)N * 4);
    Outs o;
    outs_begin(&o, s, ignore ? "classifier_loss_only_ignore" : "classifier_loss_only");
    classifier_forward(c->be, dt, logits, losses, dtg, N, V, Vp, 1.0f / N, 0);
    out(c, &o, 0, "losses", losses, DT_FP32, N);
    out(c, &o, 0, "logits", logits, dt, (size_t)N * Vp);   // untouched
    outs_end(&o);
    outs_begin(&o, s, ignore ? "classifier_dlogits_ignore" : "classifier_dlogits");
    poison(c, losses, (size_t)N * 4);
    classifier_forward(c->be, dt, logits, losses, dtg, N, V, Vp, 1.0f / N, 1);
    out(c, &o, 0, "losses", losses, DT_FP32, N);
    out(c, &o, 0, "dlogits", logits, dt, (size_t)N * Vp);
    outs_end(&o);
    free(hl), free(tg);
    end_test(c);
}

// The vocabulary-parallel kernels on the second of two tensor ranks' slices: v0 = Vp/2, Vl = Vp/2, so its
// columns end in the padding (real < Vl) and half the tokens and targets are another rank's.
static void t_encoder_vocab(Ctx* c, const Shape* s, int with_pos) {
    const DType dt = c->dt;
    const int B = s->B, T = s->T, C = s->C, N = B * T, Vl = s->Vp / 2, v0 = s->Vp / 2;
    int* tok = (int*)xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) {
        const uint64_t u = mix64(((uint64_t)c->seed << 32) ^ (0x70d0000u + (uint64_t)i));
        tok[i] = (i % 2) ? (int)(u % (uint64_t)s->V) : v0 + (int)(u % 5u) * 3;   // repeats in this rank's range
    }
    int* dtok = (int*)dalloc(c, (size_t)N * sizeof(int));
    be_upload(c->be, dtok, tok, (size_t)N * sizeof(int));
    float* hwte = hvals(c, 111, (size_t)Vl * C, -0.5f, 0.5f, dt);
    float* hwpe = hvals(c, 112, (size_t)T * C, -0.2f, 0.2f, dt);
    void* wte = dnew(c, hwte, (size_t)Vl * C, dt);
    void* wpe = dnew(c, hwpe, (size_t)T * C, dt);
    const int* pos = with_pos ? ddocs(c, B, T, 0) : NULL;
    Outs o;
    for (int with_wpe = with_pos; with_wpe < 2; with_wpe++) {
        outs_begin(&o, s, with_pos ? "encoder_forward_vocab_wpe_pos" : with_wpe ? "encoder_forward_vocab_wpe" : "encoder_forward_vocab");
        void* outp = dpoisoned(c, (size_t)N * C * dtype_size(dt));
        encoder_forward_vocab(c->be, dt, outp, dtok, pos, wte, with_wpe ? wpe : NULL, v0, Vl, B, T, C);
        out(c, &o, 0, "out", outp, dt, (size_t)N * C);
        outs_end(&o);
    }
    float* hdout = hvals(c, 113, (size_t)N * C, -1.0f, 1.0f, dt);
    void* dout = dnew(c, hdout, (size_t)N * C, dt);
    outs_begin(&o, s, with_pos ? "encoder_backward_vocab_pos" : "encoder_backward_vocab");
    for (int rep = 0; rep < 2; rep++) {
        put(c, wte, hwte, (size_t)Vl * C, dt);
        put(c, wpe, hwpe, (size_t)T * C, dt);
        encoder_backward_vocab(c->be, dt, wte, wpe, dout, dtok, pos, v0, Vl, B, T, C);
        out(c, &o, rep, "dwte", wte, dt, (size_t)Vl * C);
        out(c, &o, rep, "dwpe", wpe, dt, (size_t)T * C);
    }
    outs_end(&o);
    free(tok), free(hwte), free(hwpe), free(hdout);
    end_test(c);
}

// With `ignore`, every third target is -1, and the outputs are the _ignore ones.
static void t_classifier_vocab(Ctx* c, const Shape* s, int ignore) {
    const DType dt = c->dt;
    const int N = s->cls_rows < s->B * s->T ? s->cls_rows : s->B * s->T, Vl = s->Vp / 2, v0 = s->Vp / 2;
    const int real = s->V - v0, ranks = 2;
    float* hl = hvals(c, 711, (size_t)N * Vl, -4.0f, 4.0f, dt);
    int* tg = (int*)xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tg[i] = (int)(mix64(((uint64_t)c->seed << 32) ^ (0x7b000u + (uint64_t)i)) % (uint64_t)s->V);
    tg[0] = s->V - 1;
    for (int i = 1; i < N; i += 3) tg[i] = ignore ? CLASSIFIER_IGNORE : tg[i];
    const char* sfx = ignore ? "_ignore" : "";
    char name[64];
    int* dtg = (int*)dalloc(c, (size_t)N * sizeof(int));
    be_upload(c->be, dtg, tg, (size_t)N * sizeof(int));
    void* logits = dnew(c, hl, (size_t)N * Vl, dt);
    float* rowmax = (float*)dpoisoned(c, (size_t)N * 4);
    Outs o;
    snprintf(name, sizeof name, "classifier_vocab_max%s", sfx);
    outs_begin(&o, s, name);
    classifier_vocab_max(c->be, dt, rowmax, logits, N, real, Vl);
    out(c, &o, 0, "rowmax", rowmax, DT_FP32, N);
    outs_end(&o);
    // The group's max as the other rank might raise it: 0.5 above this rank's bound, the same on both builds.
    float* hmax = hvals(c, 712, (size_t)N, 4.0f, 4.5f, DT_FP32);
    float* gmax = (float*)dnew(c, hmax, (size_t)N, DT_FP32);
    float* stats = (float*)dpoisoned(c, (size_t)3 * N * 4);
    snprintf(name, sizeof name, "classifier_vocab_sums%s", sfx);
    outs_begin(&o, s, name);
    classifier_vocab_sums(c->be, dt, stats, logits, gmax, dtg, v0, N, real, Vl);
    out(c, &o, 0, "sum", stats, DT_FP32, N);                       // hi; lo differs (0 on the GPU) and is tiny
    out(c, &o, 0, "target", stats + (size_t)2 * N, DT_FP32, N);
    outs_end(&o);
    // Every rank's stats, synthesized: positive normalizers, this rank's target logits from the logits.
    float* hall = hvals(c, 713, (size_t)ranks * 3 * N, 0.5f, 40.0f, DT_FP32);
    for (int n = 0; n < N; n++) {
        int t = tg[n] - v0;
        hall[N + n] = hall[3 * N + N + n] = 0.0f;                    // lo
        hall[2 * N + n] = t < 0 ? hl[n] : 0.0f;                      // rank 0's target logit, or 0
        hall[3 * N + 2 * N + n] = t >= 0 ? hl[(size_t)n * Vl + t] : 0.0f;
    }
    float* all = (float*)dnew(c, hall, (size_t)ranks * 3 * N, DT_FP32);
    float* losses = (float*)dpoisoned(c, (size_t)N * 4);
    snprintf(name, sizeof name, "classifier_vocab_finish_loss_only%s", sfx);
    outs_begin(&o, s, name);
    classifier_vocab_finish(c->be, dt, logits, losses, gmax, all, ranks, dtg, v0, N, real, Vl, 1.0f / N, 0);
    out(c, &o, 0, "losses", losses, DT_FP32, N);
    out(c, &o, 0, "logits", logits, dt, (size_t)N * Vl);   // untouched
    outs_end(&o);
    snprintf(name, sizeof name, "classifier_vocab_finish_dlogits%s", sfx);
    outs_begin(&o, s, name);
    poison(c, losses, (size_t)N * 4);
    classifier_vocab_finish(c->be, dt, logits, losses, gmax, all, ranks, dtg, v0, N, real, Vl, 1.0f / N, 1);
    out(c, &o, 0, "losses", losses, DT_FP32, N);
    out(c, &o, 0, "dlogits", logits, dt, (size_t)N * Vl);
    outs_end(&o);
    free(hl), free(tg), free(hmax), free(hall);
    end_test(c);
}

static void t_adamw(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const size_t n = (size_t)s->C * 1000 + 7;
    const size_t offset = ((size_t)1 << 32) + 12345;   // above 2^32: the noise index is 64-bit
    float* hmaster = hvals(c, 801, n, -0.5f, 0.5f, DT_FP32);
    float* hm = hvals(c, 802, n, -0.01f, 0.01f, DT_FP32);
    float* hv = hvals(c, 803, n, 1e-6f, 1e-4f, DT_FP32);
    float* master = (float*)dnew(c, hmaster, n, DT_FP32);
    float* m = (float*)dnew(c, hm, n, DT_FP32);
    float* v = (float*)dnew(c, hv, n, DT_FP32);
    // fp32 params alias the master copy, as the contract allows.
    void* params = dt == DT_FP32 ? (void*)master : dpoisoned(c, n * dtype_size(dt));
    void* grads = dalloc(c, n * dtype_size(dt));
    AdamWArgs a = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0, c->seed * 2654435761u + 17u};
    for (int step = 1; step <= 3; step++) {
        float* hg = hvals(c, 810 + step, n, -0.1f, 0.1f, dt);
        put(c, grads, hg, n, dt);
        free(hg);
        a.step = step;
        adamw_update(c->be, params, dt, master, grads, dt, m, v, n, offset, &a);
    }
    Outs o;
    outs_begin(&o, s, "adamw");
    out(c, &o, 0, "params", params, dt, n);
    out(c, &o, 0, "master", master, DT_FP32, n);
    out(c, &o, 0, "m", m, DT_FP32, n);
    out(c, &o, 0, "v", v, DT_FP32, n);
    outs_end(&o);
    free(hmaster), free(hm), free(hv);
    end_test(c);
}

static void t_sum_squares(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const size_t n = (size_t)s->B * s->T * s->C + 5;
    float* hx = hvals(c, 901, n, -1.0f, 1.0f, dt);
    void* x = dnew(c, hx, n, dt);
    float* acc = (float*)dalloc(c, 4);
    const float init = 3.25f;
    Outs o;
    outs_begin(&o, s, "sum_squares");
    for (int rep = 0; rep < 2; rep++) {
        put(c, acc, &init, 1, DT_FP32);
        sum_squares(c->be, dt, acc, x, n);
        sum_squares(c->be, dt, acc, x, n / 3);   // accumulates
        out(c, &o, rep, "acc", acc, DT_FP32, 1);
    }
    outs_end(&o);
    free(hx);
    end_test(c);
}

// The lists: many spans of odd sizes (two empty; more than one launch's table of either list under the
// adamw_multi variant) cut from shared buffers with gaps between them. The list's results are written for
// compare_kernels.py, and must equal the per-span calls' bit for bit, gaps untouched (the variant's promise).
#define SPANS_COUNT 170
#define SPANS_GAP 3
static size_t span_size(const Shape* s, int i) {
    if (i == 2 || i == 100) return 0;
    if (i == 5) return (size_t)s->C * 1000 + 7;
    if (i == 60) return (size_t)s->B * s->T * s->C + 5;
    return ((size_t)i * i * 37 + 11) % 3001;
}
// Span i starts at at[i]; SPANS_GAP elements precede each span and follow the last. Returns the total.
static size_t span_layout(const Shape* s, size_t* at) {
    size_t total = SPANS_GAP;
    for (int i = 0; i < SPANS_COUNT; i++) {
        at[i] = total;
        total += span_size(s, i) + SPANS_GAP;
    }
    return total;
}
static int same_device_bits(Ctx* c, const void* a, const void* b, size_t bytes) {
    void* ha = xmalloc(bytes);
    void* hb = xmalloc(bytes);
    be_download(c->be, ha, a, bytes);
    be_download(c->be, hb, b, bytes);
    const int same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

typedef struct {
    void* params;
    float *master, *m, *v;
} AdamBufs;

// Seeded master, m, v; 16-bit params poisoned inside the spans and seeded in the gaps, fp32 params the master.
static AdamBufs adam_bufs(Ctx* c, const Shape* s, const size_t* at, size_t total) {
    const DType dt = c->dt;
    float* h = hvals(c, 801, total, -0.5f, 0.5f, DT_FP32);
    AdamBufs b = {NULL, (float*)dnew(c, h, total, DT_FP32), NULL, NULL};
    if (dt == DT_FP32) b.params = b.master;
    else {
        b.params = dnew(c, h, total, dt);
        for (int i = 0; i < SPANS_COUNT; i++) poison(c, (char*)b.params + at[i] * dtype_size(dt), span_size(s, i) * dtype_size(dt));
    }
    free(h);
    h = hvals(c, 802, total, -0.01f, 0.01f, DT_FP32);
    b.m = (float*)dnew(c, h, total, DT_FP32);
    free(h);
    h = hvals(c, 803, total, 1e-6f, 1e-4f, DT_FP32);
    b.v = (float*)dnew(c, h, total, DT_FP32);
    free(h);
    return b;
}

static void adam_spans_of(Ctx* c, const Shape* s, const AdamBufs* b, const void* grads, const size_t* at, AdamWSpan* out) {
    const size_t x = dtype_size(c->dt);
    for (int i = 0; i < SPANS_COUNT; i++)
        out[i] = (AdamWSpan){.params = (char*)b->params + at[i] * x, .master = b->master + at[i],
                             .grads = (const char*)grads + at[i] * x, .m = b->m + at[i], .v = b->v + at[i],
                             .n = span_size(s, i), .offset = ((size_t)1 << 32) + 12345 + 7 * at[i],
                             .weight_decay = i % 3 ? 0.1f : 0.0f};
}

static void t_adamw_spans(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    size_t at[SPANS_COUNT];
    const size_t total = span_layout(s, at);
    AdamBufs list = adam_bufs(c, s, at, total), one = adam_bufs(c, s, at, total);
    void* grads = dalloc(c, total * dtype_size(dt));
    AdamWSpan sl[SPANS_COUNT], so[SPANS_COUNT];
    adam_spans_of(c, s, &list, grads, at, sl);
    adam_spans_of(c, s, &one, grads, at, so);
    AdamWArgs a = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.7f /* not read */, 0.5f, 0, c->seed * 2654435761u + 17u};
    for (int step = 1; step <= 3; step++) {
        float* hg = hvals(c, 810 + step, total, -0.1f, 0.1f, dt);
        put(c, grads, hg, total, dt);
        free(hg);
        a.step = step;
        adamw_update_spans(c->be, dt, dt, sl, SPANS_COUNT, &a);
        for (int i = 0; i < SPANS_COUNT; i++) {
            AdamWArgs ai = a;
            ai.weight_decay = so[i].weight_decay;
            adamw_update(c->be, so[i].params, dt, so[i].master, so[i].grads, dt, so[i].m, so[i].v, so[i].n, so[i].offset, &ai);
        }
    }
    Outs o;
    outs_begin(&o, s, "adamw_update_spans");
    out(c, &o, 0, "params", list.params, dt, total);
    out(c, &o, 0, "master", list.master, DT_FP32, total);
    out(c, &o, 0, "m", list.m, DT_FP32, total);
    out(c, &o, 0, "v", list.v, DT_FP32, total);
    outs_end(&o);
    char name[160];
    snprintf(name, sizeof(name), "%s_adamw_update_spans_same_bits_as_per_span", s->name);
    check_true(&c->stats, name, same_device_bits(c, list.params, one.params, total * dtype_size(dt)) &&
                                    same_device_bits(c, list.master, one.master, total * 4) &&
                                    same_device_bits(c, list.m, one.m, total * 4) && same_device_bits(c, list.v, one.v, total * 4));
    end_test(c);
}

static void t_sum_squares_spans(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    size_t at[SPANS_COUNT], n[SPANS_COUNT];
    const size_t total = span_layout(s, at);
    float* hx = hvals(c, 901, total, -1.0f, 1.0f, dt);
    void* x = dnew(c, hx, total, dt);
    const void* xs[SPANS_COUNT];
    for (int i = 0; i < SPANS_COUNT; i++) xs[i] = (const char*)x + at[i] * dtype_size(dt), n[i] = span_size(s, i);
    float* acc = (float*)dalloc(c, 4);
    float* acc_one = (float*)dalloc(c, 4);
    const float init = 3.25f;
    Outs o;
    outs_begin(&o, s, "sum_squares_spans");
    for (int rep = 0; rep < 2; rep++) {
        put(c, acc, &init, 1, DT_FP32);
        sum_squares_spans(c->be, dt, acc, xs, n, SPANS_COUNT);
        sum_squares_spans(c->be, dt, acc, xs, n, 7);   // accumulates
        out(c, &o, rep, "acc", acc, DT_FP32, 1);
    }
    outs_end(&o);
    put(c, acc_one, &init, 1, DT_FP32);
    for (int i = 0; i < SPANS_COUNT; i++) sum_squares(c->be, dt, acc_one, xs[i], n[i]);
    for (int i = 0; i < 7; i++) sum_squares(c->be, dt, acc_one, xs[i], n[i]);
    char name[160];
    snprintf(name, sizeof(name), "%s_sum_squares_spans_same_bits_as_per_span", s->name);
    check_true(&c->stats, name, same_device_bits(c, acc, acc_one, 4));
    free(hx);
    end_test(c);
}

static void t_convert(Ctx* c, const Shape* s) {
    const DType dt = c->dt;
    const size_t n = (size_t)s->B * s->T * s->C + 3;
    // Wide range, including values that round differently in bf16 and fp16 and fp16 subnormals.
    float* h = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const float u = urand(c, 1001, i);
        h[i] = u * powf(2.0f, (float)((int)(i % 40) - 26));
    }
    void* src = dnew(c, h, n, DT_FP32);
    void* dst = dpoisoned(c, n * dtype_size(dt));
    Outs o;
    outs_begin(&o, s, "convert_from_fp32");
    convert(c->be, dst, dt, src, DT_FP32, n);
    out(c, &o, 0, "out", dst, dt, n);
    outs_end(&o);
    const DType other = dt == DT_BF16 ? DT_FP16 : DT_BF16;
    void* dst2 = dpoisoned(c, n * dtype_size(other));
    outs_begin(&o, s, "convert_cross");
    convert(c->be, dst2, other, dst, dt, n);
    out(c, &o, 0, "out", dst2, other, n);
    outs_end(&o);
    void* back = dpoisoned(c, n * 4);
    outs_begin(&o, s, "convert_to_fp32");
    convert(c->be, back, DT_FP32, dst, dt, n);
    out(c, &o, 0, "out", back, DT_FP32, n);
    outs_end(&o);
    free(h);
    end_test(c);
}


// ---------------------------------------------------------------------------------------------------
// KERNEL_CHECK_BENCH=1 (GPU build only): time each kernel at GPT-2 124M training sizes (B=8, T=1024).
// Prints "bench <kernel> <ms>" lines; inputs are a tiled random pattern (not zeros).
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static void* bench_buf(Ctx* c, size_t n, DType dt, const float* pat, size_t npat) {
    void* d = dalloc(c, n * dtype_size(dt));
    const size_t chunk = npat;
    for (size_t off = 0; off < n; off += chunk) {
        const size_t k = n - off < chunk ? n - off : chunk;
        put(c, (char*)d + off * dtype_size(dt), pat, k, dt);
    }
    return d;
}
#define BENCH(name, reps, call)                                                                          \
    do {                                                                                                 \
        call;                                                                                            \
        be_synchronize(c->be);                                                                           \
        const double t0_ = now_ms();                                                                     \
        for (int r_ = 0; r_ < (reps); r_++) call;                                                        \
        be_synchronize(c->be);                                                                           \
        printf("bench %-28s %9.3f ms\n", name, (now_ms() - t0_) / (reps));                              \
        fflush(stdout);                                                                                  \
    } while (0)

// Llama-style attention at T = 1024: 32 query heads of 128 sharing 8 kv heads, and the same heads unshared.
// Its buffers stay live until the caller's end_test.
static void bench_attention_gqa(Ctx* c, int B, const float* pat, size_t npat) {
    const DType dt = c->dt;
    const int T = 1024, NH = 32, D = 128, N = B * T;
    const int kvs[] = {8, NH};
    for (int k = 0; k < 2; k++) {
        const int KV = kvs[k];
        void* qkv = bench_buf(c, (size_t)N * (NH + 2 * KV) * D, dt, pat, npat);
        void* dqkv = bench_buf(c, (size_t)N * (NH + 2 * KV) * D, dt, pat, npat);
        void* att = bench_buf(c, (size_t)N * NH * D, dt, pat, npat);
        void* datt = bench_buf(c, (size_t)N * NH * D, dt, pat, npat);
        float* lse = (float*)bench_buf(c, (size_t)B * NH * T, DT_FP32, pat, npat);
        float* scr = (float*)bench_buf(c, (size_t)B * NH * T, DT_FP32, pat, npat);
        char name[2][64];
        snprintf(name[0], sizeof(name[0]), "attention_forward h%dkv%dd%d", NH, KV, D);
        snprintf(name[1], sizeof(name[1]), "attention_backward h%dkv%dd%d", NH, KV, D);
        BENCH(name[0], 20, attention_forward(c->be, dt, att, lse, qkv, NULL, B, T, NH, KV, D));
        BENCH(name[1], 20, attention_backward(c->be, dt, dqkv, scr, datt, qkv, att, lse, NULL, B, T, NH, KV, D));
        if (KV == NH) continue;
        // Four documents of 256 tokens a row: the masked tiles skipped, against the causal rows above.
        int* hdoc = (int*)xmalloc((size_t)N * sizeof(int));
        for (int i = 0; i < N; i++) hdoc[i] = (i % T) / 256 * 256;
        int* doc = (int*)dalloc(c, (size_t)N * sizeof(int));
        be_upload(c->be, doc, hdoc, (size_t)N * sizeof(int));
        free(hdoc);
        snprintf(name[0], sizeof(name[0]), "attention_forward h%dkv%dd%d 4 docs a row", NH, KV, D);
        snprintf(name[1], sizeof(name[1]), "attention_backward h%dkv%dd%d 4 docs a row", NH, KV, D);
        BENCH(name[0], 20, attention_forward(c->be, dt, att, lse, qkv, doc, B, T, NH, KV, D));
        BENCH(name[1], 20, attention_backward(c->be, dt, dqkv, scr, datt, qkv, att, lse, doc, B, T, NH, KV, D));
    }
}

// GPT-2 124M's tensors in its layout's order (wte, wpe, 12 blocks of 12, lnfw, lnfb): the spans one rank
// updates and sums under -z 0, which the optimizer hands to the list calls.
#define GPT2_SPANS 148
static void gpt2_span_sizes(size_t* n) {
    const size_t C = 768, block[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    int k = 0;
    n[k++] = 50304 * C, n[k++] = 1024 * C;
    for (int l = 0; l < 12; l++)
        for (int j = 0; j < 12; j++) n[k++] = block[j];
    n[k++] = C, n[k++] = C;
}

// The 124M lists over the bench's whole-model buffers, timed beside the one-span calls above.
static void bench_spans(Ctx* c, void* params, float* master, const void* grads, float* m, float* v, float* acc,
                        const AdamWArgs* a) {
    const DType dt = c->dt;
    const size_t x = dtype_size(dt);
    size_t n[GPT2_SPANS], at = 0;
    gpt2_span_sizes(n);
    AdamWSpan sp[GPT2_SPANS];
    const void* gs[GPT2_SPANS];
    for (int i = 0; i < GPT2_SPANS; i++) {
        sp[i] = (AdamWSpan){.params = (char*)params + at * x, .master = master + at, .grads = (const char*)grads + at * x,
                            .m = m + at, .v = v + at, .n = n[i], .offset = at, .weight_decay = 0.1f};
        gs[i] = sp[i].grads;
        at += n[i];
    }
    BENCH("adamw_update_spans 124M", 5, adamw_update_spans(c->be, dt, dt, sp, GPT2_SPANS, a));
    BENCH("sum_squares_spans 124M", 5, sum_squares_spans(c->be, dt, acc, gs, n, GPT2_SPANS));
}

// KERNEL_CHECK_BENCH_B sets B (default 8); KERNEL_CHECK_BENCH=att times only the attention kernels.
static void bench(Ctx* c, int only_attention) {
    const DType dt = c->dt;
    const char* bs = getenv("KERNEL_CHECK_BENCH_B");
    const int B = bs && atoi(bs) > 0 ? atoi(bs) : 8;
    const int T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304, N = B * T;
    const size_t npat = (size_t)1 << 20;
    float* pat = hvals(c, 1201, npat, -1.0f, 1.0f, dt);
    float* pos = hvals(c, 1202, npat, 0.5f, 1.0f, DT_FP32);
    int* tok = (int*)xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tok[i] = (int)(mix64((uint64_t)i) % (uint64_t)V);
    int* dtok = (int*)dalloc(c, (size_t)N * sizeof(int));
    be_upload(c->be, dtok, tok, (size_t)N * sizeof(int));
    void* qkv = bench_buf(c, (size_t)N * 3 * C, dt, pat, npat);
    void* att = bench_buf(c, (size_t)N * C, dt, pat, npat);
    void* datt = bench_buf(c, (size_t)N * C, dt, pat, npat);
    void* dqkv = bench_buf(c, (size_t)N * 3 * C, dt, pat, npat);
    float* lse = (float*)bench_buf(c, (size_t)B * NH * T, DT_FP32, pat, npat);
    float* scr = (float*)bench_buf(c, (size_t)B * NH * T, DT_FP32, pat, npat);
    printf("bench B=%d T=%d C=%d NH=%d %s\n", B, T, C, NH, dtype_name(dt));
    BENCH("attention_forward", 20, attention_forward(c->be, dt, att, lse, qkv, NULL, B, T, NH, NH, C / NH));
    BENCH("attention_backward", 20, attention_backward(c->be, dt, dqkv, scr, datt, qkv, att, lse, NULL, B, T, NH, NH, C / NH));
    bench_attention_gqa(c, B, pat, npat);
    if (only_attention) {
        end_test(c);
        free(pat), free(pos), free(tok);
        return;
    }
    void* x = bench_buf(c, (size_t)N * C, dt, pat, npat);
    void* w = bench_buf(c, (size_t)4 * C * C, dt, pat, npat);
    void* bias = bench_buf(c, (size_t)4 * C, dt, pat, npat);
    void* h = bench_buf(c, (size_t)N * 4 * C, dt, pat, npat);
    void* hpre = bench_buf(c, (size_t)N * 4 * C, dt, pat, npat);
    void* dw = bench_buf(c, (size_t)4 * C * C, dt, pat, npat);
    void* db = bench_buf(c, (size_t)4 * C, dt, pat, npat);
    BENCH("matmul_forward fc+gelu", 10, matmul_forward(c->be, dt, h, hpre, x, w, bias, N, C, 4 * C));
    BENCH("matmul_forward fc", 10, matmul_forward(c->be, dt, h, NULL, x, w, bias, N, C, 4 * C));
    BENCH("matmul_backward fcproj+gelu", 10, matmul_backward(c->be, dt, hpre, dw, db, x, h, hpre, w, N, 4 * C, C));
    float* mean = (float*)bench_buf(c, N, DT_FP32, pos, npat);
    float* rstd = (float*)bench_buf(c, N, DT_FP32, pos, npat);
    void* lw = bench_buf(c, C, dt, pat, npat);
    BENCH("layernorm_forward", 20, layernorm_forward(c->be, dt, att, mean, rstd, x, lw, lw, N, C));
    BENCH("layernorm_backward", 20, layernorm_backward(c->be, dt, datt, lw, lw, x, att, lw, mean, rstd, N, C));
    BENCH("gelu_forward", 20, gelu_forward(c->be, dt, h, hpre, (size_t)N * 4 * C));
    BENCH("residual_forward", 20, residual_forward(c->be, dt, att, x, datt, (size_t)N * C));
    void* wte = bench_buf(c, (size_t)Vp * C, dt, pat, npat);
    void* wpe = bench_buf(c, (size_t)T * C, dt, pat, npat);
    BENCH("encoder_forward", 20, encoder_forward(c->be, dt, att, dtok, NULL, wte, wpe, B, T, C));
    BENCH("encoder_backward", 20, encoder_backward(c->be, dt, wte, wpe, x, dtok, NULL, B, T, C));
    void* logits = bench_buf(c, (size_t)N * Vp, dt, pat, npat);
    float* losses = (float*)dalloc(c, (size_t)N * 4);
    BENCH("classifier_forward+dlogits", 5, classifier_forward(c->be, dt, logits, losses, dtok, N, V, Vp, 1.0f / N, 1));
    end_test(c);   // (frees dtok too: nothing below uses it)
    const size_t P = 124475904;   // GPT-2 124M parameter count (padded vocab)
    void* params = bench_buf(c, P, dt, pat, npat);
    void* grads = bench_buf(c, P, dt, pat, npat);
    float* master = (float*)bench_buf(c, P, DT_FP32, pat, npat);
    float* m = (float*)bench_buf(c, P, DT_FP32, pat, npat);
    float* v = (float*)bench_buf(c, P, DT_FP32, pos, npat);
    float* acc = (float*)dalloc(c, 4);
    AdamWArgs a = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 1234u};
    BENCH("adamw_update 124M", 5, adamw_update(c->be, params, dt, master, grads, dt, m, v, P, 0, &a));
    BENCH("sum_squares 124M", 5, sum_squares(c->be, dt, acc, grads, P));
    bench_spans(c, params, master, grads, m, v, acc, &a);
    end_test(c);
    free(pat), free(pos), free(tok);
}

int main(int argc, char** argv) {
    if (argc != 4) fail("usage: %s OUTDIR SEED DTYPE(fp32|bf16|fp16)", argv[0]);
    Ctx c;
    memset(&c, 0, sizeof(c));
    c.outdir = argv[1];
    c.seed = (uint32_t)strtoul(argv[2], NULL, 10);
    if (!strcmp(argv[3], "fp32")) c.dt = DT_FP32;
    else if (!strcmp(argv[3], "bf16")) c.dt = DT_BF16;
    else if (!strcmp(argv[3], "fp16")) c.dt = DT_FP16;
    else fail("unknown dtype '%s' (fp32, bf16 or fp16)", argv[3]);
    mkdir(c.outdir, 0755);
    char path[512];
    snprintf(path, sizeof(path), "%s/index.txt", c.outdir);
    c.index = xfopen(path, "w");
    c.be = backend_create(0);
    fprintf(stderr, "kernel_check: %s, seed %u, %s\n", backend_device_name(c.be), c.seed, dtype_name(c.dt));

    // GPT-2 124M's layer shapes (classifier on 256 rows); an odd small one for tails; head sizes 24 and 128;
    // hs = 64 with T not a multiple of the attention tiles.
    const Shape shapes[] = {
        {"gpt2", 4, 256, 768, 12, 50257, 50304, 256},
        {"odd", 3, 67, 96, 6, 1000, 1024, 201},
        {"hs24", 2, 45, 72, 3, 300, 384, 90},
        {"hs128", 2, 80, 256, 2, 520, 640, 160},
        {"hs64tail", 2, 75, 128, 2, 333, 384, 150},
    };
    const char* only = getenv("KERNEL_CHECK_SHAPES");   // e.g. "odd,hs24" for a quick run
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const Shape* s = &shapes[i];
        if (only && !strstr(only, s->name)) continue;
        t_encoder(&c, s, 0);
        t_encoder(&c, s, 1);
        t_layernorm(&c, s);
        for (int k = 0; k < 3; k++) t_matmul_forward(&c, s, k);
        for (int k = 0; k < 3; k++) t_matmul_backward(&c, s, k);
        const AttShape mha = {s->name, s->B, s->T, s->NH, s->NH, s->C / s->NH};
        t_attention(&c, &mha, 0);
        t_attention(&c, &mha, 1);
        t_elementwise(&c, s);
        t_lora_dropout(&c, s);
        t_quantize(&c, s);
        t_rmsnorm(&c, s, s->C, "rmsnorm_forward", "rmsnorm_backward");
        t_rmsnorm(&c, s, s->C + 3, "rmsnorm_forward_tail", "rmsnorm_backward_tail");
        t_qk_norm(&c, s);
        t_rope(&c, s);
        t_swiglu(&c, s, 2 * s->C, "swiglu_forward", "swiglu_backward");
        t_swiglu(&c, s, 2 * s->C + 3, "swiglu_forward_tail", "swiglu_backward_tail");
        for (int k = 0; k < 2; k++) {
            t_classifier(&c, s, k);
            t_encoder_vocab(&c, s, k);
            t_classifier_vocab(&c, s, k);
        }
        t_adamw(&c, s);
        t_sum_squares(&c, s);
        t_adamw_spans(&c, s);
        t_sum_squares_spans(&c, s);
        t_convert(&c, s);
        fprintf(stderr, "kernel_check: shape %s done\n", s->name);
    }
    // The norms alone at the widths and row counts the larger models bring (and the one-pass backward's
    // accumulator sizes: 16, 64 and 128 columns a lane, and more rows than its blocks, so each block takes many).
    const Shape norms[] = {
        {"norm400", 2, 40, 400, 1, 0, 0, 0},
        {"norm1600", 2, 50, 1600, 1, 0, 0, 0},
        {"norm4096", 1, 40, 4096, 1, 0, 0, 0},
        {"normrows", 64, 1100, 64, 1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(norms) / sizeof(norms[0]); i++) {
        if (only && !strstr(only, norms[i].name)) continue;
        t_layernorm(&c, &norms[i]);
        t_rmsnorm(&c, &norms[i], norms[i].C, "rmsnorm_forward", "rmsnorm_backward");
        fprintf(stderr, "kernel_check: shape %s done\n", norms[i].name);
    }
    // Grouped-query heads (attention only): head sizes 128 and 64 on the tensor-core path, 32 (multi-query)
    // on the CUDA-core one; query heads per kv head 4, 3, 2 and 4; T not a multiple of the tiles.
    const AttShape gqa[] = {{"gqa8x2d128", 2, 80, 8, 2, 128}, {"gqa9x3d64", 2, 75, 9, 3, 64}, {"gqa4x2d64", 2, 70, 4, 2, 64},
                            {"mqa4x1d32", 2, 45, 4, 1, 32}};
    for (size_t i = 0; i < sizeof(gqa) / sizeof(gqa[0]); i++) {
        if (only && !strstr(only, gqa[i].name)) continue;
        t_attention(&c, &gqa[i], 0);
        t_attention(&c, &gqa[i], 1);
        fprintf(stderr, "kernel_check: shape %s done\n", gqa[i].name);
    }
    // Documents over more tiles than the shapes above have: whole key tiles before a block's documents and
    // query tiles after a key block's are skipped (T = 200: four 64-row tiles).
    const AttShape docs[] = {{"docs4x2d64", 2, 200, 4, 2, 64}};
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        if (only && !strstr(only, docs[i].name)) continue;
        t_attention(&c, &docs[i], 1);
        fprintf(stderr, "kernel_check: shape %s done\n", docs[i].name);
    }
    // Attention in chunks: head sizes 40 (lanes past D) and 128 (every lane's four dims), grouped and not.
    const AttShape chunks[] = {{"chunk4x2d40", 2, 40, 4, 2, 40}, {"chunk3x3d128", 1, 29, 3, 3, 128}};
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        if (only && !strstr(only, chunks[i].name)) continue;
        t_attention_chunk(&c, &chunks[i]);
        fprintf(stderr, "kernel_check: shape %s done\n", chunks[i].name);
    }
    xfclose(c.index, path);
    const char* b = getenv("KERNEL_CHECK_BENCH");
    if (b && (b[0] == '1' || !strcmp(b, "att")) && backend_is_gpu(c.be)) bench(&c, !strcmp(b, "att"));
    backend_destroy(c.be);
    return test_exit(&c.stats);
}
