// test_attention_chunk.c: attention in chunks (kernels.h: attention_chunk_forward, attention_lse_merge,
// attention_chunk_backward) on the CPU twins equals attention over the whole sequence. T is split into query
// and key chunks at their global offsets; each query chunk meets every key chunk in some order (in order,
// reversed, ring attention's load-balanced order where rank r holds chunks r and 2N-1-r and the key chunks
// travel round the ring), its partial results merged as they come; the backward of every chunk pair, given
// the merged out and lse, accumulates into dq and the key chunk's dkv. Then:
//   out and lse of the merges vs attention_forward's        fp32 1e-6, bf16 2e-2
//   summed dq, dk, dv vs attention_backward's dqkv          fp32 1e-5, bf16 2e-2
// (relative error = max |got - ref| / max |ref|; fp32 differs only in the order of the sums; bf16 rounds out at
// every merge and dq, dk, dv at every pair's +=, a few of its 2^-8 ulps.)
// With documents packed into the rows (a query chunk passes its queries' document starts; documents cross
// the chunk boundaries, one is a single token, and whole chunk pairs leave some rows no key) the same splits
// against the whole sequence's attention with doc, at the same tolerances.
// Exact: a chunk wholly in the queries' future gives lse = -inf and out = 0 and adds nothing to the gradients;
// so do the rows of a pair whose keys all lie before their document, even given that pair's own lse of -inf;
// a merge with a side at -inf keeps the other side's bits, both at -inf stay -inf with out 0.
// Threads: the equality checks run on one OpenMP thread (hundreds of tiny parallel regions spin on a loaded
// machine); one split is then rerun on three threads and must give the same bits.
// Refused: query heads that do not share the kv heads evenly, negative offsets.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/child_testlib.h"
#include "tests/unit/kernel_testlib.h"

typedef struct {
    int B, T, NH, KV, D;
    DType dt;
    const char* tag;
} Prob;
enum Order { IN_ORDER, REVERSED, RING };
typedef struct {
    int nq, nk;
    enum Order order;
    const char* tag;
} Split;

static size_t qkv_width(const Prob* p) { return (size_t)(p->NH + 2 * p->KV) * p->D; }

// Rows t0 .. t0+n-1 of columns col .. col+width-1 of src (B,T,W) as (B,n,width), and back.
static float* take(const float* src, int B, int T, size_t W, size_t col, size_t width, int t0, int n) {
    float* dst = xmalloc(sizeof(float) * ((size_t)B * n * width + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(dst + ((size_t)b * n + t) * width, src + ((size_t)b * T + t0 + t) * W + col, sizeof(float) * width);
    return dst;
}
static void give(float* dst, const float* src, int B, int T, size_t W, size_t col, size_t width, int t0, int n) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(dst + ((size_t)b * T + t0 + t) * W + col, src + ((size_t)b * n + t) * width, sizeof(float) * width);
}

// The key chunk query chunk a meets at its step-th turn. RING: nq = nk = 2N, query chunk a held by rank
// r = min(a, 2N-1-a); at step 2s + e the rank holds the key chunks of rank (r - s) mod N, e picks which.
static int key_chunk(const Split* sp, int a, int step) {
    if (sp->order == IN_ORDER) return step;
    if (sp->order == REVERSED) return sp->nk - 1 - step;
    const int N = sp->nk / 2, r = a < N ? a : 2 * N - 1 - a, src = ((r - step / 2) % N + N) % N;
    return step % 2 ? 2 * N - 1 - src : src;
}

typedef struct {
    float *out, *lse, *dqkv;
} Result;

static void result_free(Result* r) { free(r->out), free(r->lse), free(r->dqkv); }

// Documents of T = 24 rows: even rows [0,5) [5,6) [6,17) [17,24), odd rows [0,1) [1,13) [13,24): starts inside
// the chunks of every split and on some of their boundaries. doc[b,t] is the start of t's document.
static int* make_docs(int B, int T) {
    static const int even[] = {0, 5, 6, 17}, odd[] = {0, 1, 13};
    int* doc = xmalloc(sizeof(int) * B * T);
    for (int b = 0; b < B; b++) {
        const int* starts = b % 2 ? odd : even;
        const int n = b % 2 ? 3 : 4;
        for (int t = 0, k = 0; t < T; t++) {
            while (k + 1 < n && starts[k + 1] <= t) k++;
            doc[b * T + t] = starts[k];
        }
    }
    return doc;
}

// Columns t0 .. t0+n-1 of the (B,T) host ints, as (B,n) in backend memory; NULL for NULL.
static int* dev_docs(Backend* be, const int* hdoc, int B, int T, int t0, int n) {
    if (!hdoc) return NULL;
    int* h = xmalloc(sizeof(int) * ((size_t)B * n + 1));
    for (int b = 0; b < B; b++) memcpy(h + (size_t)b * n, hdoc + (size_t)b * T + t0, sizeof(int) * n);
    int* d = be_malloc(be, sizeof(int) * ((size_t)B * n + 1));
    be_upload(be, d, h, sizeof(int) * (size_t)B * n);
    free(h);
    return d;
}

static Result reference(Backend* be, const Prob* p, const float* hqkv, const float* hdout, const int* hdoc) {
    const size_t nqkv = (size_t)p->B * p->T * qkv_width(p), no = (size_t)p->B * p->T * p->NH * p->D;
    const size_t nl = (size_t)p->B * p->NH * p->T;
    void* qkv = dev_from(be, p->dt, hqkv, nqkv);
    void* dout = dev_from(be, p->dt, hdout, no);
    void* out = dev_zeros(be, p->dt, no);
    void* dqkv = dev_zeros(be, p->dt, nqkv);
    float* lse = be_malloc(be, nl * 4);
    float* scratch = be_malloc(be, nl * 4);
    int* doc = dev_docs(be, hdoc, p->B, p->T, 0, p->T);
    attention_forward(be, p->dt, out, lse, qkv, doc, p->B, p->T, p->NH, p->KV, p->D);
    attention_backward(be, p->dt, dqkv, scratch, dout, qkv, out, lse, doc, p->B, p->T, p->NH, p->KV, p->D);
    if (doc) be_free(be, doc);
    Result r = {host_of(out, p->dt, no), host_of(lse, DT_FP32, nl), host_of(dqkv, p->dt, nqkv)};
    be_free(be, qkv), be_free(be, dout), be_free(be, out), be_free(be, dqkv), be_free(be, lse), be_free(be, scratch);
    return r;
}

// One query chunk a against every key chunk: forward and merges into (out, lse), then each pair's backward.
typedef struct {
    void **kv, **dkv;
    void *q, *dout, *out, *out2, *dq;
    float *lse, *lse2;
    const int* doc;   // the query chunk's document starts, or NULL
} ChunkBufs;

static void query_chunk(Backend* be, const Prob* p, const Split* sp, int a, const ChunkBufs* c) {
    const int Tq = p->T / sp->nq, Tk = p->T / sp->nk, q0 = a * Tq;
    for (int step = 0; step < sp->nk; step++) {
        const int k = key_chunk(sp, a, step);
        void* o = step ? c->out2 : c->out;
        float* l = step ? c->lse2 : c->lse;
        attention_chunk_forward(be, p->dt, o, l, c->q, c->kv[k], c->doc, p->B, Tq, Tk, q0, k * Tk, p->NH, p->KV, p->D);
        if (step) attention_lse_merge(be, p->dt, c->out, c->lse, c->out2, c->lse2, p->B, Tq, p->NH, p->D);
    }
    for (int step = 0; step < sp->nk; step++) {
        const int k = key_chunk(sp, a, step);
        attention_chunk_backward(be, p->dt, c->dq, c->dkv[k], c->dout, c->q, c->kv[k], c->out, c->lse, c->doc, p->B, Tq, Tk, q0,
                                 k * Tk, p->NH, p->KV, p->D);
    }
}

static Result chunked(Backend* be, const Prob* p, const Split* sp, const float* hqkv, const float* hdout, const int* hdoc) {
    const int B = p->B, T = p->T, Tq = T / sp->nq, Tk = T / sp->nk;
    const size_t W = qkv_width(p), C = (size_t)p->NH * p->D, KVW = 2 * (size_t)p->KV * p->D;
    Result r = {xmalloc(sizeof(float) * B * T * C), xmalloc(sizeof(float) * B * T * p->NH),
                xmalloc(sizeof(float) * B * T * W)};
    ChunkBufs c;
    memset(&c, 0, sizeof c);
    c.kv = xmalloc(sizeof(void*) * sp->nk), c.dkv = xmalloc(sizeof(void*) * sp->nk);
    for (int k = 0; k < sp->nk; k++) {
        float* h = take(hqkv, B, T, W, C, KVW, k * Tk, Tk);
        c.kv[k] = dev_from(be, p->dt, h, (size_t)B * Tk * KVW);
        c.dkv[k] = dev_zeros(be, p->dt, (size_t)B * Tk * KVW);
        free(h);
    }
    const size_t nqc = (size_t)B * Tq * C, nlc = (size_t)B * p->NH * Tq;
    c.out = dev_zeros(be, p->dt, nqc), c.out2 = dev_zeros(be, p->dt, nqc);
    c.lse = be_malloc(be, nlc * 4), c.lse2 = be_malloc(be, nlc * 4);
    for (int a = 0; a < sp->nq; a++) {
        float* hq = take(hqkv, B, T, W, 0, C, a * Tq, Tq);
        float* hd = take(hdout, B, T, C, 0, C, a * Tq, Tq);
        c.q = dev_from(be, p->dt, hq, nqc), c.dout = dev_from(be, p->dt, hd, nqc), c.dq = dev_zeros(be, p->dt, nqc);
        int* doc = dev_docs(be, hdoc, B, T, a * Tq, Tq);
        c.doc = doc;
        query_chunk(be, p, sp, a, &c);
        if (doc) be_free(be, doc);
        float* ho = host_of(c.out, p->dt, nqc);
        float* hl = host_of(c.lse, DT_FP32, nlc);
        float* hdq = host_of(c.dq, p->dt, nqc);
        give(r.out, ho, B, T, C, 0, C, a * Tq, Tq);
        give(r.lse, hl, B * p->NH, T, 1, 0, 1, a * Tq, Tq);
        give(r.dqkv, hdq, B, T, W, 0, C, a * Tq, Tq);
        free(hq), free(hd), free(ho), free(hl), free(hdq);
        be_free(be, c.q), be_free(be, c.dout), be_free(be, c.dq);
    }
    for (int k = 0; k < sp->nk; k++) {
        float* h = host_of(c.dkv[k], p->dt, (size_t)B * Tk * KVW);
        give(r.dqkv, h, B, T, W, C, KVW, k * Tk, Tk);
        free(h);
        be_free(be, c.kv[k]), be_free(be, c.dkv[k]);
    }
    be_free(be, c.out), be_free(be, c.out2), be_free(be, c.lse), be_free(be, c.lse2);
    free(c.kv), free(c.dkv);
    return r;
}

static double rel_err_f(const float* got, const float* ref, size_t n) {
    double* d = to_double(ref, n);
    const double e = rel_err(got, d, n);
    free(d);
    return e;
}

static void check_split(TestStats* st, Backend* be, const Prob* p, const Split* sp, const float* hqkv,
                        const float* hdout, const int* hdoc, const Result* ref) {
    const int bf = p->dt != DT_FP32;
    const size_t no = (size_t)p->B * p->T * p->NH * p->D, nl = (size_t)p->B * p->NH * p->T;
    const char* docs = hdoc ? "_docs" : "";
    Result r = chunked(be, p, sp, hqkv, hdout, hdoc);
    char name[128];
    snprintf(name, sizeof name, "chunk_forward_out_%s_%s%s", p->tag, sp->tag, docs);
    check_close(st, name, rel_err_f(r.out, ref->out, no), bf ? 2e-2 : 1e-6);
    snprintf(name, sizeof name, "chunk_forward_lse_%s_%s%s", p->tag, sp->tag, docs);
    check_close(st, name, rel_err_f(r.lse, ref->lse, nl), bf ? 2e-2 : 1e-6);
    snprintf(name, sizeof name, "chunk_backward_dqkv_%s_%s%s", p->tag, sp->tag, docs);
    check_close(st, name, rel_err_f(r.dqkv, ref->dqkv, (size_t)p->B * p->T * qkv_width(p)), bf ? 2e-2 : 1e-5);
    result_free(&r);
}

static void check_problem(TestStats* st, Backend* be, const Prob* p, uint64_t seed, const int* hdoc) {
    Rng rng = {seed};
    const size_t nqkv = (size_t)p->B * p->T * qkv_width(p), no = (size_t)p->B * p->T * p->NH * p->D;
    float* hqkv = rand_vec(&rng, nqkv, 1.5f, p->dt);
    float* hdout = rand_vec(&rng, no, 1.0f, p->dt);
    Result ref = reference(be, p, hqkv, hdout, hdoc);
    const Split splits[] = {
        {2, 2, IN_ORDER, "2chunks"}, {4, 4, IN_ORDER, "4chunks"}, {4, 4, REVERSED, "4chunks_reversed"},
        {4, 4, RING, "ring2ranks"},  {6, 6, RING, "ring3ranks"},  {2, 6, IN_ORDER, "q2_k6"},
    };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
        if (p->T % splits[i].nq == 0 && p->T % splits[i].nk == 0) check_split(st, be, p, &splits[i], hqkv, hdout, hdoc, &ref);
    result_free(&ref);
    free(hqkv), free(hdout);
}

// A key chunk wholly after the query chunk: lse -inf, out 0 (over NaN), nothing added to dq or dkv.
static void check_future_chunk(TestStats* st, Backend* be) {
    const int B = 2, Tq = 5, Tk = 7, NH = 4, KV = 2, D = 8, q0 = 3, k0 = 8;
    const size_t nq = (size_t)B * Tq * NH * D, nkv = (size_t)B * Tk * 2 * KV * D, nl = (size_t)B * NH * Tq;
    Rng rng = {7};
    float *hq = rand_vec(&rng, nq, 1.0f, DT_FP32), *hkv = rand_vec(&rng, nkv, 1.0f, DT_FP32);
    float *hdq = rand_vec(&rng, nq, 1.0f, DT_FP32), *hdkv = rand_vec(&rng, nkv, 1.0f, DT_FP32);
    float* nan = xmalloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) nan[i] = NAN;
    void *q = dev_from(be, DT_FP32, hq, nq), *kv = dev_from(be, DT_FP32, hkv, nkv),
         *out = dev_from(be, DT_FP32, nan, nq);
    void *dq = dev_from(be, DT_FP32, hdq, nq), *dkv = dev_from(be, DT_FP32, hdkv, nkv);
    float* lse = dev_from(be, DT_FP32, nan, nl);
    attention_chunk_forward(be, DT_FP32, out, lse, q, kv, NULL, B, Tq, Tk, q0, k0, NH, KV, D);
    int zero = 1, minf = 1;
    for (size_t i = 0; i < nq; i++) zero &= ((float*)out)[i] == 0.0f && !signbit(((float*)out)[i]);
    for (size_t i = 0; i < nl; i++) minf &= lse[i] == -INFINITY;
    check_true(st, "chunk_future_out_zero", zero);
    check_true(st, "chunk_future_lse_minus_inf", minf);
    // The backward of the pair, with some finite final out and lse of the rows: nothing to add.
    float* fin = rand_vec(&rng, nl, 1.0f, DT_FP32);
    memcpy(lse, fin, sizeof(float) * nl);
    attention_chunk_backward(be, DT_FP32, dq, dkv, q, q, kv, q, lse, NULL, B, Tq, Tk, q0, k0, NH, KV, D);
    check_true(st, "chunk_future_backward_adds_nothing",
               same_bits(dq, hdq, nq * sizeof(float)) && same_bits(dkv, hdkv, nkv * sizeof(float)));
    be_free(be, q), be_free(be, kv), be_free(be, out), be_free(be, dq), be_free(be, dkv), be_free(be, lse);
    free(hq), free(hkv), free(hdq), free(hdkv), free(nan), free(fin);
}

// A pair of past keys (6..11) for queries 12..17 whose documents start at 6 (query 12 of row 0), at 13 (the rest of
// row 0: no key here) and at 9 (row 1: keys 9..11). The rows with no key: out 0 over NaN, lse -inf. The backward
// from the pair's own out and lse (-inf on those rows), their q and dout NaN: their dq keeps its bits and
// nothing NaN reaches dq or dkv (exp(s - lse) of a masked row would be inf, its q NaN).
static void check_doc_masked_rows(TestStats* st, Backend* be) {
    const int B = 2, Tq = 6, Tk = 6, NH = 4, KV = 2, D = 8, q0 = 12, k0 = 6;
    const int hdoc[] = {6, 13, 13, 13, 13, 13, 9, 9, 9, 9, 9, 9};
    const size_t row = (size_t)NH * D, nq = (size_t)B * Tq * row, nkv = (size_t)B * Tk * 2 * KV * D, nl = (size_t)B * NH * Tq;
    Rng rng = {13};
    float *hq = rand_vec(&rng, nq, 1.0f, DT_FP32), *hkv = rand_vec(&rng, nkv, 1.0f, DT_FP32);
    float *hdq = rand_vec(&rng, nq, 1.0f, DT_FP32), *hdkv = rand_vec(&rng, nkv, 1.0f, DT_FP32);
    float* hdout = rand_vec(&rng, nq, 1.0f, DT_FP32);
    float* nan = xmalloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) nan[i] = NAN;
    void *q = dev_from(be, DT_FP32, hq, nq), *kv = dev_from(be, DT_FP32, hkv, nkv), *out = dev_from(be, DT_FP32, nan, nq);
    float* lse = dev_from(be, DT_FP32, nan, nl);
    int* doc = dev_docs(be, hdoc, B, Tq, 0, Tq);
    attention_chunk_forward(be, DT_FP32, out, lse, q, kv, doc, B, Tq, Tk, q0, k0, NH, KV, D);
    float *ho = host_of(out, DT_FP32, nq), *hl = host_of(lse, DT_FP32, nl);
    int masked_ok = 1, seen_ok = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            const int none = hdoc[b * Tq + t] > k0 + Tk - 1;
            for (int h = 0; h < NH; h++) {
                const float l = hl[((size_t)b * NH + h) * Tq + t];
                if (none) masked_ok &= l == -INFINITY;
                else seen_ok &= isfinite(l);
                for (int i = 0; i < D; i++) {
                    const float o = ho[((size_t)b * Tq + t) * row + (size_t)h * D + i];
                    if (none) masked_ok &= o == 0.0f && !signbit(o);
                    else seen_ok &= isfinite(o);
                }
            }
            if (none) memcpy(hq + ((size_t)b * Tq + t) * row, nan, sizeof(float) * row);
            if (none) memcpy(hdout + ((size_t)b * Tq + t) * row, nan, sizeof(float) * row);
        }
    check_true(st, "chunk_doc_no_key_out_zero_lse_minus_inf", masked_ok);
    check_true(st, "chunk_doc_some_keys_finite", seen_ok);
    void *qn = dev_from(be, DT_FP32, hq, nq), *dout = dev_from(be, DT_FP32, hdout, nq);
    void *dq = dev_from(be, DT_FP32, hdq, nq), *dkv = dev_from(be, DT_FP32, hdkv, nkv);
    attention_chunk_backward(be, DT_FP32, dq, dkv, dout, qn, kv, out, lse, doc, B, Tq, Tk, q0, k0, NH, KV, D);
    float *gq = host_of(dq, DT_FP32, nq), *gkv = host_of(dkv, DT_FP32, nkv);
    int kept = 1, finite = 1, changed = 0;
    for (size_t i = 0; i < nq; i++) {
        const int none = hdoc[i / row] > k0 + Tk - 1;
        finite &= isfinite(gq[i]);
        if (none) kept &= same_bits(&gq[i], &hdq[i], sizeof(float));
        else changed |= gq[i] != hdq[i];
    }
    for (size_t i = 0; i < nkv; i++) finite &= isfinite(gkv[i]);
    check_true(st, "chunk_doc_no_key_backward_adds_nothing", kept && finite && changed);
    be_free(be, q), be_free(be, kv), be_free(be, out), be_free(be, lse), be_free(be, doc), be_free(be, qn);
    be_free(be, dout), be_free(be, dq), be_free(be, dkv);
    free(hq), free(hkv), free(hdq), free(hdkv), free(hdout), free(nan), free(ho), free(hl), free(gq), free(gkv);
}

// A merge with one side at -inf keeps the other's bits (either side); both at -inf stay -inf with out 0.
static void check_merge_edges(TestStats* st, Backend* be, DType dt) {
    const int B = 1, T = 3, NH = 2, D = 8;
    const size_t n = (size_t)B * T * NH * D, nl = (size_t)B * NH * T;
    Rng rng = {11};
    float *ha = rand_vec(&rng, n, 1.0f, dt), *hb = rand_vec(&rng, n, 1.0f, dt), *hl = rand_vec(&rng, nl, 3.0f, DT_FP32);
    float* minf = xmalloc(sizeof(float) * nl);
    for (size_t i = 0; i < nl; i++) minf[i] = -INFINITY;
    void *a = dev_from(be, dt, ha, n), *b = dev_from(be, dt, hb, n);
    float *la = dev_from(be, DT_FP32, hl, nl), *lb = dev_from(be, DT_FP32, minf, nl);
    const size_t bytes = n * dtype_size(dt);
    void* want = xmalloc(bytes);
    memcpy(want, a, bytes);
    attention_lse_merge(be, dt, a, la, b, lb, B, T, NH, D);
    check_true(st, dt == DT_FP32 ? "merge_minus_inf_second_keeps_bits" : "merge_minus_inf_second_keeps_bits_bf16",
               same_bits(a, want, bytes) && same_bits(la, hl, nl * 4));
    attention_lse_merge(be, dt, b, lb, a, la, B, T, NH, D);
    check_true(st, dt == DT_FP32 ? "merge_minus_inf_first_takes_bits" : "merge_minus_inf_first_takes_bits_bf16",
               same_bits(b, want, bytes) && same_bits(lb, hl, nl * 4));
    memcpy(la, minf, nl * 4), memcpy(lb, minf, nl * 4);
    attention_lse_merge(be, dt, a, la, b, lb, B, T, NH, D);
    float* got = host_of(a, dt, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= got[i] == 0.0f;
    for (size_t i = 0; i < nl; i++) ok &= la[i] == -INFINITY;
    check_true(st, dt == DT_FP32 ? "merge_both_minus_inf" : "merge_both_minus_inf_bf16", ok);
    be_free(be, a), be_free(be, b), be_free(be, la), be_free(be, lb);
    free(ha), free(hb), free(hl), free(minf), free(want), free(got);
}

// The ring split's out, lse and dqkv on one thread and on three: the same bits.
static void check_threads(TestStats* st, Backend* be, const Prob* p) {
    Rng rng = {5};
    const size_t nqkv = (size_t)p->B * p->T * qkv_width(p), no = (size_t)p->B * p->T * p->NH * p->D;
    float* hqkv = rand_vec(&rng, nqkv, 1.5f, p->dt);
    float* hdout = rand_vec(&rng, no, 1.0f, p->dt);
    const Split ring = {4, 4, RING, "ring2ranks"};
    omp_set_num_threads(1);
    Result one = chunked(be, p, &ring, hqkv, hdout, NULL);
    omp_set_num_threads(3);
    Result three = chunked(be, p, &ring, hqkv, hdout, NULL);
    omp_set_num_threads(1);
    const size_t nl = (size_t)p->B * p->NH * p->T;
    check_true(st, "chunk_bits_independent_of_threads",
               same_bits(one.out, three.out, no * 4) && same_bits(one.lse, three.lse, nl * 4) &&
                   same_bits(one.dqkv, three.dqkv, nqkv * 4));
    result_free(&one), result_free(&three);
    free(hqkv), free(hdout);
}

typedef struct {
    int NH, KV, q0;
} BadArgs;
static void bad_forward(const void* arg) {
    const BadArgs* a = arg;
    Backend* be = backend_create(0);
    float buf[64] = {0};
    attention_chunk_forward(be, DT_FP32, buf, buf, buf, buf, NULL, 1, 1, 1, a->q0, 0, a->NH, a->KV, 8);
}

int main(void) {
    TestStats st = {0, 0};
    // The refusals first, forked while this process has no OpenMP threads yet: a sanitizer's exit-time leak
    // check in a child forked from a threaded parent adds lines of its own to the child's stderr.
    const BadArgs uneven = {4, 3, 0}, negative = {4, 2, -1};
    check_refusal(&st, "chunk_refuses_uneven_heads", bad_forward, &uneven, "do not share KV=3 kv heads evenly");
    check_refusal(&st, "chunk_refuses_negative_offset", bad_forward, &negative, "q0=-1");
    omp_set_num_threads(1);
    Backend* be = backend_create(0);
    const Prob probs[] = {
        {2, 24, 4, 2, 16, DT_FP32, "gqa4x2"},
        {2, 24, 3, 3, 8, DT_FP32, "mha3"},
        {1, 24, 4, 1, 8, DT_FP32, "mqa4x1"},
        {2, 24, 4, 2, 16, DT_BF16, "gqa4x2_bf16"},
    };
    for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++) check_problem(&st, be, &probs[i], 100 + i, NULL);
    for (size_t i = 0; i < sizeof probs / sizeof probs[0]; i++) {
        int* doc = make_docs(probs[i].B, probs[i].T);
        check_problem(&st, be, &probs[i], 200 + i, doc);
        free(doc);
    }
    check_doc_masked_rows(&st, be);
    check_threads(&st, be, &probs[0]);
    check_future_chunk(&st, be);
    check_merge_edges(&st, be, DT_FP32);
    check_merge_edges(&st, be, DT_BF16);
    backend_destroy(be);
    return test_exit(&st);
}
