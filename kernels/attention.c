// attention.c: causal self-attention with grouped-query heads (CPU twin), flash-attention style: the forward
// keeps only the log-sum-exp of each score row, the backward recomputes probabilities from q, k and lse.
// With KV == NH every sum runs over the same terms in the same order as multi-head attention written for
// that case alone (tests/unit/attention_mha_oracle.h), so GPT-2's bits do not depend on the grouping.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

// Element offsets into qkv (B,T,(NH+2KV)D) of query head h's q and kv head kh's k and v at row (b,t), and
// into out (B,T,NH*D). Query head h reads kv head h / R.
// doc (B,T) or NULL (kernels.h).
typedef struct { int T, NH, KV, R, D; size_t ld; float scale; const int* doc; } AttnShape;
static inline size_t row_of(const AttnShape* s, int b, int t) { return (size_t)b * s->T + t; }
static inline size_t q_at(const AttnShape* s, int b, int t, int h) { return row_of(s, b, t) * s->ld + (size_t)h * s->D; }
static inline size_t k_at(const AttnShape* s, int b, int t, int kh) {
    return row_of(s, b, t) * s->ld + (size_t)(s->NH + kh) * s->D;
}
static inline size_t v_at(const AttnShape* s, int b, int t, int kh) {
    return row_of(s, b, t) * s->ld + (size_t)(s->NH + s->KV + kh) * s->D;
}
static inline size_t o_at(const AttnShape* s, int b, int t, int h) {
    return row_of(s, b, t) * s->NH * s->D + (size_t)h * s->D;
}

static float dot(const void* x, size_t ox, const void* y, size_t oy, int n, DType dt) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += ld(x, ox + i, dt) * ld(y, oy + i, dt);
    return s;
}

static AttnShape attn_shape(const int* doc, int B, int T, int NH, int KV, int D) {
    if (NH <= 0 || KV <= 0 || NH % KV) fail("attention: NH=%d query heads do not share KV=%d kv heads evenly", NH, KV);
    if (D <= 0) fail("attention: head size %d", D);
    cpu_check_doc(doc, B, T, "attention");
    AttnShape s = {T, NH, KV, NH / KV, D, (size_t)(NH + 2 * KV) * D, 1.0f / sqrtf((float)D), doc};
    return s;
}

// The first key query (b,t) attends; the end (one past the last query) of the document of key (b,j).
static inline int doc_first(const AttnShape* s, int b, int t) { return s->doc ? s->doc[row_of(s, b, t)] : 0; }
static inline int doc_end(const AttnShape* s, int b, int j) {
    if (!s->doc) return s->T;
    const int first = s->doc[row_of(s, b, j)];
    int end = j + 1;
    while (end < s->T && s->doc[row_of(s, b, end)] == first) end++;
    return end;
}

// One query row: scores into `row` (t+1 floats), acc (D floats) for the output.
static void attn_forward_row(const AttnShape* s, DType dt, void* out, float* lse, const void* qkv,
                             int b, int h, int t, float* row, float* acc) {
    size_t qo = q_at(s, b, t, h);
    int kh = h / s->R, j0 = doc_first(s, b, t);
    float mx = -INFINITY;
    for (int j = j0; j <= t; j++) {
        row[j] = dot(qkv, qo, qkv, k_at(s, b, j, kh), s->D, dt) * s->scale;
        mx = fmaxf(mx, row[j]);
    }
    float sum = 0.0f;
    for (int j = j0; j <= t; j++) sum += (row[j] = expf(row[j] - mx));
    memset(acc, 0, sizeof(float) * s->D);
    for (int j = j0; j <= t; j++) {
        float p = row[j] / sum;
        size_t vo = v_at(s, b, j, kh);
        for (int i = 0; i < s->D; i++) acc[i] += p * ld(qkv, vo + i, dt);
    }
    size_t oo = o_at(s, b, t, h);
    for (int i = 0; i < s->D; i++) st(out, oo + i, acc[i], dt);
    lse[((size_t)b * s->NH + h) * s->T + t] = mx + logf(sum);
}

void attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, const int* doc, int B, int T,
                       int NH, int KV, int D) {
    BACKEND_ENTRY(be, out, lse, qkv, doc);
    AttnShape s = attn_shape(doc, B, T, NH, KV, D);
    int per_thread = T + D;   // one score row + one output accumulator
    float* buf = xmalloc(sizeof(float) * per_thread * cpu_max_threads());
#pragma omp parallel for schedule(dynamic, 8)
    for (int r = 0; r < B * NH * T; r++) {
        int t = r % T, h = (r / T) % NH, b = r / (T * NH);
        float* mine = buf + (size_t)per_thread * cpu_thread_num();
        attn_forward_row(&s, dt, out, lse, qkv, b, h, t, mine, mine + T);
    }
    free(buf);
}

// p[i,j] and ds[i,j] = p (dp - D_i) with dp = dout_i . v_j for query head h, recomputed wherever they are needed.
typedef struct { const AttnShape* s; DType dt; const void* dout; const void* qkv; const float* lse; const float* D; } AttnBwd;

static void attn_p_ds(const AttnBwd* a, int b, int h, int i, int j, float* p, float* ds) {
    const AttnShape* s = a->s;
    size_t row = ((size_t)b * s->NH + h) * s->T + i;
    int kh = h / s->R;
    float score = dot(a->qkv, q_at(s, b, i, h), a->qkv, k_at(s, b, j, kh), s->D, a->dt) * s->scale;
    *p = expf(score - a->lse[row]);
    float dp = dot(a->dout, o_at(s, b, i, h), a->qkv, v_at(s, b, j, kh), s->D, a->dt);
    *ds = *p * (dp - a->D[row]);
}

// dq_i = scale * sum_{doc_i<=j<=i} ds_ij k_j.
static void attn_dq_row(const AttnBwd* a, void* dqkv, int b, int h, int i, float* acc) {
    const AttnShape* s = a->s;
    memset(acc, 0, sizeof(float) * s->D);
    for (int j = doc_first(s, b, i); j <= i; j++) {
        float p, ds;
        attn_p_ds(a, b, h, i, j, &p, &ds);
        size_t ko = k_at(s, b, j, h / s->R);
        for (int c = 0; c < s->D; c++) acc[c] += ds * ld(a->qkv, ko + c, a->dt);
    }
    size_t qo = q_at(s, b, i, h);
    for (int c = 0; c < s->D; c++) st(dqkv, qo + c, acc[c] * s->scale, a->dt);
}

// dk_j = scale * sum_h sum_{j<=i<end_j} ds_ij q_i,  dv_j = sum_h sum_{j<=i<end_j} p_ij dout_i over the query
// heads h of kv head kh, in increasing h, into one accumulator each; end_j is the end of j's document.
static void attn_dkv_row(const AttnBwd* a, void* dqkv, int b, int kh, int j, float* acck, float* accv) {
    const AttnShape* s = a->s;
    const int end = doc_end(s, b, j);
    memset(acck, 0, sizeof(float) * s->D);
    memset(accv, 0, sizeof(float) * s->D);
    for (int h = kh * s->R; h < (kh + 1) * s->R; h++)
        for (int i = j; i < end; i++) {
            float p, ds;
            attn_p_ds(a, b, h, i, j, &p, &ds);
            size_t qo = q_at(s, b, i, h), oo = o_at(s, b, i, h);
            for (int c = 0; c < s->D; c++) {
                acck[c] += ds * ld(a->qkv, qo + c, a->dt);
                accv[c] += p * ld(a->dout, oo + c, a->dt);
            }
        }
    size_t ko = k_at(s, b, j, kh), vo = v_at(s, b, j, kh);
    for (int c = 0; c < s->D; c++) {
        st(dqkv, ko + c, acck[c] * s->scale, a->dt);
        st(dqkv, vo + c, accv[c], a->dt);
    }
}

// Every output row (dq_i, or dk_j with dv_j) is summed by one thread in a fixed order, so the bits do not
// depend on the thread count; the price is computing each score twice.
void attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                        const void* out, const float* lse, const int* doc, int B, int T, int NH, int KV, int D) {
    BACKEND_ENTRY(be, dqkv, scratch, dout, qkv, out, lse, doc);
    AttnShape s = attn_shape(doc, B, T, NH, KV, D);
    int qrows = B * NH * T, krows = B * KV * T;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < qrows; r++) {   // D_i = dout_i . out_i, into scratch (B,NH,T)
        int t = r % T, h = (r / T) % NH, b = r / (T * NH);
        scratch[r] = dot(dout, o_at(&s, b, t, h), out, o_at(&s, b, t, h), s.D, dt);
    }
    AttnBwd a = {&s, dt, dout, qkv, lse, scratch};
    float* buf = xmalloc(sizeof(float) * 2 * s.D * cpu_max_threads());
#pragma omp parallel
    {
        float* mine = buf + (size_t)2 * s.D * cpu_thread_num();
#pragma omp for schedule(dynamic, 8)
        for (int r = 0; r < qrows; r++) attn_dq_row(&a, dqkv, r / (T * NH), (r / T) % NH, r % T, mine);
#pragma omp for schedule(dynamic, 8)
        for (int r = 0; r < krows; r++) attn_dkv_row(&a, dqkv, r / (T * KV), (r / T) % KV, r % T, mine, mine + s.D);
    }
    free(buf);
}
