// attention_chunk.c: causal attention of a query chunk against a key/value chunk at global offsets, the
// log-sum-exp merge of two such partial results, and the chunk pair's backward (CPU twins). Ring attention is
// built from them: each rank attends its query chunk to every key/value chunk that passes by, merging as it
// goes, and the backward, given the merged out and lse, adds each pair's share of dq, dk and dv.
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

// Element offsets: q and out (B,Tq,NH*D), kv (B,Tk,2*KV*D) with k before v in each row, lse (B,NH,Tq).
// doc (B,Tq) or NULL: each query's document start, in the sequence's positions (those of q0 and k0).
typedef struct {
    int Tq, Tk, q0, k0, NH, KV, R, D;
    float scale;
    const int* doc;
} ChunkShape;
static inline size_t cq_at(const ChunkShape* s, int b, int t, int h) {
    return (((size_t)b * s->Tq + t) * s->NH + h) * s->D;
}
static inline size_t ck_at(const ChunkShape* s, int b, int j, int kh) {
    return ((size_t)b * s->Tk + j) * 2 * s->KV * s->D + (size_t)kh * s->D;
}
static inline size_t cv_at(const ChunkShape* s, int b, int j, int kh) { return ck_at(s, b, j, s->KV + kh); }
static inline size_t clse_at(const ChunkShape* s, int b, int h, int t) { return ((size_t)b * s->NH + h) * s->Tq + t; }

// The last key query t may attend (key j at k0 + j, query t at q0 + t): -1 when the chunk is all in its future.
static inline int last_key(const ChunkShape* s, int t) {
    const long long last = (long long)s->q0 + t - s->k0;
    return last < 0 ? -1 : last >= s->Tk ? s->Tk - 1 : (int)last;
}
// The first key query t of row b may attend: its document's first position, on this chunk's keys (past the
// last key when its document starts after the chunk).
static inline int first_key(const ChunkShape* s, int b, int t) {
    if (!s->doc) return 0;
    const long long first = (long long)s->doc[(size_t)b * s->Tq + t] - s->k0;
    return first <= 0 ? 0 : first > s->Tk ? s->Tk : (int)first;
}
// Whether query t of row b (at or after key j causally) attends key j: both in one document.
static inline int same_document(const ChunkShape* s, int b, int t, int j) {
    return !s->doc || s->doc[(size_t)b * s->Tq + t] <= s->k0 + j;
}
// The first query that attends key j causally: Tq when none does.
static inline int first_query(const ChunkShape* s, int j) {
    const long long first = (long long)s->k0 + j - s->q0;
    return first <= 0 ? 0 : first >= s->Tq ? s->Tq : (int)first;
}

static float cdot(const void* x, size_t ox, const void* y, size_t oy, int n, DType dt) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += ld(x, ox + i, dt) * ld(y, oy + i, dt);
    return acc;
}

static ChunkShape chunk_shape(const char* who, const int* doc, int B, int Tq, int Tk, int q0, int k0, int NH, int KV,
                              int D) {
    if (NH <= 0 || KV <= 0 || NH % KV) fail("%s: NH=%d query heads do not share KV=%d kv heads evenly", who, NH, KV);
    if (D <= 0) fail("%s: head size %d", who, D);
    if (B < 0 || Tq < 0 || Tk < 0 || q0 < 0 || k0 < 0)
        fail("%s: negative size or offset (B=%d Tq=%d Tk=%d q0=%d k0=%d)", who, B, Tq, Tk, q0, k0);
    ChunkShape s = {Tq, Tk, q0, k0, NH, KV, NH / KV, D, 1.0f / sqrtf((float)D), doc};
    for (int b = 0; doc && b < B; b++)
        for (int t = 0; t < Tq; t++)
            if (doc[(size_t)b * Tq + t] < 0 || doc[(size_t)b * Tq + t] > q0 + t)
                fail("%s: query %d of row %d (position %d) has document start %d, outside [0, %d]", who, t, b, q0 + t,
                     doc[(size_t)b * Tq + t], q0 + t);
    return s;
}

// One query row, two passes as attention_forward's rows: scores into `row` (Tk floats), acc (D floats).
static void chunk_forward_row(const ChunkShape* s, DType dt, void* out, float* lse, const void* q, const void* kv,
                              int b, int h, int t, float* row, float* acc) {
    const int first = first_key(s, b, t), last = last_key(s, t), kh = h / s->R;
    const size_t qo = cq_at(s, b, t, h);
    memset(acc, 0, sizeof(float) * s->D);
    float mx = -INFINITY, sum = 0.0f;
    for (int j = first; j <= last; j++) {
        row[j] = cdot(q, qo, kv, ck_at(s, b, j, kh), s->D, dt) * s->scale;
        mx = fmaxf(mx, row[j]);
    }
    for (int j = first; j <= last; j++) sum += (row[j] = expf(row[j] - mx));
    for (int j = first; j <= last; j++) {
        const float p = row[j] / sum;
        const size_t vo = cv_at(s, b, j, kh);
        for (int i = 0; i < s->D; i++) acc[i] += p * ld(kv, vo + i, dt);
    }
    for (int i = 0; i < s->D; i++) st(out, qo + i, acc[i], dt);
    lse[clse_at(s, b, h, t)] = first > last ? -INFINITY : mx + logf(sum);
}

void attention_chunk_forward(Backend* be, DType dt, void* out, float* lse, const void* q, const void* kv, const int* doc,
                             int B, int Tq, int Tk, int q0, int k0, int NH, int KV, int D) {
    BACKEND_ENTRY(be, out, lse, q, kv, doc);
    const ChunkShape s = chunk_shape("attention_chunk_forward", doc, B, Tq, Tk, q0, k0, NH, KV, D);
    const int per_thread = Tk + D;
    float* buf = xmalloc(sizeof(float) * per_thread * cpu_max_threads());
#pragma omp parallel for schedule(dynamic, 8)
    for (long long r = 0; r < (long long)B * NH * Tq; r++) {
        const int t = (int)(r % Tq), h = (int)(r / Tq % NH), b = (int)(r / ((long long)Tq * NH));
        float* mine = buf + (size_t)per_thread * cpu_thread_num();
        chunk_forward_row(&s, dt, out, lse, q, kv, b, h, t, mine, mine + Tk);
    }
    free(buf);
}

void attention_lse_merge(Backend* be, DType dt, void* out, float* lse, const void* out2, const float* lse2, int B,
                         int T, int NH, int D) {
    BACKEND_ENTRY(be, out, lse, out2, lse2);
    if (B < 0 || T < 0 || NH <= 0 || D <= 0) fail("attention_lse_merge: bad shape B=%d T=%d NH=%d D=%d", B, T, NH, D);
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)B * T * NH; r++) {   // r = (b*T + t)*NH + h: out's row order
        const int h = (int)(r % NH), t = (int)(r / NH % T), b = (int)(r / ((long long)NH * T));
        const size_t lo = ((size_t)b * NH + h) * T + t, o = (size_t)r * D;
        const float l1 = lse[lo], l2 = lse2[lo], m = fmaxf(l1, l2);
        if (m == -INFINITY) {   // neither side attended a key: exp(-inf - -inf) would be NaN
            for (int i = 0; i < D; i++) st(out, o + i, 0.0f, dt);
            continue;
        }
        const float w1 = expf(l1 - m), w2 = expf(l2 - m), w = w1 + w2;
        for (int i = 0; i < D; i++) st(out, o + i, (w1 * ld(out, o + i, dt) + w2 * ld(out2, o + i, dt)) / w, dt);
        lse[lo] = m + logf(w);
    }
}

// The chunk pair's backward terms for query head h, query i, key j (FlashAttention-2's backward, with the merged
// lse and Drow = rowsum(dout * out) of the whole row): p = exp(s - lse), ds = p (dout . v - Drow).
typedef struct {
    const ChunkShape* s;
    DType dt;
    const void *dout, *q, *kv;
    const float *lse, *drow;
} ChunkBwd;

static void chunk_p_ds(const ChunkBwd* a, int b, int h, int i, int j, float* p, float* ds) {
    const ChunkShape* s = a->s;
    const int kh = h / s->R;
    const size_t row = clse_at(s, b, h, i), qo = cq_at(s, b, i, h);
    const float score = cdot(a->q, qo, a->kv, ck_at(s, b, j, kh), s->D, a->dt) * s->scale;
    *p = expf(score - a->lse[row]);
    *ds = *p * (cdot(a->dout, qo, a->kv, cv_at(s, b, j, kh), s->D, a->dt) - a->drow[row]);
}

// dq_i += scale * sum_{first <= j <= last} ds_ij k_j. A row with no key here adds nothing (its lse may be -inf).
static void chunk_dq_row(const ChunkBwd* a, void* dq, int b, int h, int i, float* acc) {
    const ChunkShape* s = a->s;
    const int first = first_key(s, b, i), last = last_key(s, i);
    if (first > last) return;
    memset(acc, 0, sizeof(float) * s->D);
    for (int j = first; j <= last; j++) {
        float p, ds;
        chunk_p_ds(a, b, h, i, j, &p, &ds);
        const size_t ko = ck_at(s, b, j, h / s->R);
        for (int c = 0; c < s->D; c++) acc[c] += ds * ld(a->kv, ko + c, a->dt);
    }
    const size_t qo = cq_at(s, b, i, h);
    for (int c = 0; c < s->D; c++) st(dq, qo + c, ld(dq, qo + c, a->dt) + acc[c] * s->scale, a->dt);
}

// dk_j += scale * sum_h sum_{i >= first} ds_ij q_i, dv_j += sum_h sum_{i >= first} p_ij dout_i over the query heads
// of kv head kh in increasing h, the queries of another document left out.
static void chunk_dkv_row(const ChunkBwd* a, void* dkv, int b, int kh, int j, float* acck, float* accv) {
    const ChunkShape* s = a->s;
    const int first = first_query(s, j);
    if (first >= s->Tq) return;
    memset(acck, 0, sizeof(float) * s->D);
    memset(accv, 0, sizeof(float) * s->D);
    for (int h = kh * s->R; h < (kh + 1) * s->R; h++)
        for (int i = first; i < s->Tq; i++) {
            if (!same_document(s, b, i, j)) continue;
            float p, ds;
            chunk_p_ds(a, b, h, i, j, &p, &ds);
            const size_t qo = cq_at(s, b, i, h);
            for (int c = 0; c < s->D; c++) {
                acck[c] += ds * ld(a->q, qo + c, a->dt);
                accv[c] += p * ld(a->dout, qo + c, a->dt);
            }
        }
    const size_t ko = ck_at(s, b, j, kh), vo = cv_at(s, b, j, kh);
    for (int c = 0; c < s->D; c++) {
        st(dkv, ko + c, ld(dkv, ko + c, a->dt) + acck[c] * s->scale, a->dt);
        st(dkv, vo + c, ld(dkv, vo + c, a->dt) + accv[c], a->dt);
    }
}

// Each output row is summed by one thread in a fixed order: the bits do not depend on the thread count.
void attention_chunk_backward(Backend* be, DType dt, void* dq, void* dkv, const void* dout, const void* q,
                              const void* kv, const void* out, const float* lse, const int* doc, int B, int Tq, int Tk,
                              int q0, int k0, int NH, int KV, int D) {
    BACKEND_ENTRY(be, dq, dkv, dout, q, kv, out, lse, doc);
    const ChunkShape s = chunk_shape("attention_chunk_backward", doc, B, Tq, Tk, q0, k0, NH, KV, D);
    const long long qrows = (long long)B * NH * Tq, krows = (long long)B * KV * Tk;
    float* drow = xmalloc(sizeof(float) * (qrows ? qrows : 1));
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < qrows; r++) {
        const int t = (int)(r % Tq), h = (int)(r / Tq % NH), b = (int)(r / ((long long)Tq * NH));
        drow[r] = cdot(dout, cq_at(&s, b, t, h), out, cq_at(&s, b, t, h), D, dt);
    }
    const ChunkBwd a = {&s, dt, dout, q, kv, lse, drow};
    float* buf = xmalloc(sizeof(float) * 2 * D * cpu_max_threads());
#pragma omp parallel
    {
        float* mine = buf + (size_t)2 * D * cpu_thread_num();
#pragma omp for schedule(dynamic, 8)
        for (long long r = 0; r < qrows; r++)
            chunk_dq_row(&a, dq, (int)(r / ((long long)Tq * NH)), (int)(r / Tq % NH), (int)(r % Tq), mine);
#pragma omp for schedule(dynamic, 8)
        for (long long r = 0; r < krows; r++)
            chunk_dkv_row(&a, dkv, (int)(r / ((long long)Tk * KV)), (int)(r / Tk % KV), (int)(r % Tk), mine, mine + D);
    }
    free(buf);
    free(drow);
}
