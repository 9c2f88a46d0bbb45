// attention_mha_oracle.h: causal multi-head attention written for KV == NH alone (qkv rows [q | k | v] of
// C channels, NH heads): the CPU twin's operations that GPT-2's results rest on, under other names. Compiled
// with the kernels' flags (the same contractions into FMAs), it fixes the bits attention_forward/backward
// must give for KV == NH.
#pragma once
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

// Element offsets into qkv (B,T,3C) of head h's q, k, v channels at row (b,t).
typedef struct { int T, C, NH, hs; float scale; } MhaShape;
static inline size_t mha_q_at(const MhaShape* s, int b, int t, int h) { return ((size_t)b * s->T + t) * 3 * s->C + (size_t)h * s->hs; }
static inline size_t mha_k_at(const MhaShape* s, int b, int t, int h) { return mha_q_at(s, b, t, h) + s->C; }
static inline size_t mha_v_at(const MhaShape* s, int b, int t, int h) { return mha_q_at(s, b, t, h) + 2 * s->C; }
static inline size_t mha_o_at(const MhaShape* s, int b, int t, int h) { return ((size_t)b * s->T + t) * s->C + (size_t)h * s->hs; }

static float mha_dot(const void* x, size_t ox, const void* y, size_t oy, int n, DType dt) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += ld(x, ox + i, dt) * ld(y, oy + i, dt);
    return s;
}

static MhaShape mha_shape(int T, int C, int NH) {
    if (NH <= 0 || C % NH) fail("attention: C=%d is not a multiple of NH=%d", C, NH);
    MhaShape s = {T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
    return s;
}

// One query row: scores into `row` (t+1 floats), acc (hs floats) for the output.
static void mha_forward_row(const MhaShape* s, DType dt, void* out, float* lse, const void* qkv,
                             int b, int h, int t, float* row, float* acc) {
    size_t qo = mha_q_at(s, b, t, h);
    float mx = -INFINITY;
    for (int j = 0; j <= t; j++) {
        row[j] = mha_dot(qkv, qo, qkv, mha_k_at(s, b, j, h), s->hs, dt) * s->scale;
        mx = fmaxf(mx, row[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) sum += (row[j] = expf(row[j] - mx));
    memset(acc, 0, sizeof(float) * s->hs);
    for (int j = 0; j <= t; j++) {
        float p = row[j] / sum;
        size_t vo = mha_v_at(s, b, j, h);
        for (int i = 0; i < s->hs; i++) acc[i] += p * ld(qkv, vo + i, dt);
    }
    size_t oo = mha_o_at(s, b, t, h);
    for (int i = 0; i < s->hs; i++) st(out, oo + i, acc[i], dt);
    lse[((size_t)b * s->NH + h) * s->T + t] = mx + logf(sum);
}

static void mha_attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, int B, int T, int C, int NH) {
    BACKEND_ENTRY(be, out, lse, qkv);
    MhaShape s = mha_shape(T, C, NH);
    int per_thread = T + s.hs;   // one score row + one output accumulator
    float* buf = xmalloc(sizeof(float) * per_thread * omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 8)
    for (int r = 0; r < B * NH * T; r++) {
        int t = r % T, h = (r / T) % NH, b = r / (T * NH);
        float* mine = buf + (size_t)per_thread * omp_get_thread_num();
        mha_forward_row(&s, dt, out, lse, qkv, b, h, t, mine, mine + T);
    }
    free(buf);
}

// p[i,j] and ds[i,j] = p (dp - D_i) with dp = dout_i . v_j, recomputed wherever they are needed.
typedef struct { const MhaShape* s; DType dt; const void* dout; const void* qkv; const float* lse; const float* D; } MhaBwd;

static void mha_p_ds(const MhaBwd* a, int b, int h, int i, int j, float* p, float* ds) {
    const MhaShape* s = a->s;
    size_t row = ((size_t)b * s->NH + h) * s->T + i;
    float score = mha_dot(a->qkv, mha_q_at(s, b, i, h), a->qkv, mha_k_at(s, b, j, h), s->hs, a->dt) * s->scale;
    *p = expf(score - a->lse[row]);
    float dp = mha_dot(a->dout, mha_o_at(s, b, i, h), a->qkv, mha_v_at(s, b, j, h), s->hs, a->dt);
    *ds = *p * (dp - a->D[row]);
}

// dq_i = scale * sum_{j<=i} ds_ij k_j.
static void mha_dq_row(const MhaBwd* a, void* dqkv, int b, int h, int i, float* acc) {
    const MhaShape* s = a->s;
    memset(acc, 0, sizeof(float) * s->hs);
    for (int j = 0; j <= i; j++) {
        float p, ds;
        mha_p_ds(a, b, h, i, j, &p, &ds);
        size_t ko = mha_k_at(s, b, j, h);
        for (int c = 0; c < s->hs; c++) acc[c] += ds * ld(a->qkv, ko + c, a->dt);
    }
    size_t qo = mha_q_at(s, b, i, h);
    for (int c = 0; c < s->hs; c++) st(dqkv, qo + c, acc[c] * s->scale, a->dt);
}

// dk_j = scale * sum_{i>=j} ds_ij q_i,  dv_j = sum_{i>=j} p_ij dout_i.
static void mha_dkv_row(const MhaBwd* a, void* dqkv, int b, int h, int j, float* acck, float* accv) {
    const MhaShape* s = a->s;
    memset(acck, 0, sizeof(float) * s->hs);
    memset(accv, 0, sizeof(float) * s->hs);
    for (int i = j; i < s->T; i++) {
        float p, ds;
        mha_p_ds(a, b, h, i, j, &p, &ds);
        size_t qo = mha_q_at(s, b, i, h), oo = mha_o_at(s, b, i, h);
        for (int c = 0; c < s->hs; c++) {
            acck[c] += ds * ld(a->qkv, qo + c, a->dt);
            accv[c] += p * ld(a->dout, oo + c, a->dt);
        }
    }
    size_t ko = mha_k_at(s, b, j, h), vo = mha_v_at(s, b, j, h);
    for (int c = 0; c < s->hs; c++) {
        st(dqkv, ko + c, acck[c] * s->scale, a->dt);
        st(dqkv, vo + c, accv[c], a->dt);
    }
}

// Every output row (dq_i, or dk_j with dv_j) is summed by one thread in a fixed order, so the bits do not
// depend on the thread count; the price is computing each score twice.
static void mha_attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                        const void* out, const float* lse, int B, int T, int C, int NH) {
    BACKEND_ENTRY(be, dqkv, scratch, dout, qkv, out, lse);
    MhaShape s = mha_shape(T, C, NH);
    int rows = B * NH * T;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {   // D_i = dout_i . out_i, into scratch (B,NH,T)
        int t = r % T, h = (r / T) % NH, b = r / (T * NH);
        scratch[r] = mha_dot(dout, mha_o_at(&s, b, t, h), out, mha_o_at(&s, b, t, h), s.hs, dt);
    }
    MhaBwd a = {&s, dt, dout, qkv, lse, scratch};
    float* buf = xmalloc(sizeof(float) * 2 * s.hs * omp_get_max_threads());
#pragma omp parallel
    {
        float* mine = buf + (size_t)2 * s.hs * omp_get_thread_num();
#pragma omp for schedule(dynamic, 8)
        for (int r = 0; r < rows; r++) mha_dq_row(&a, dqkv, r / (T * NH), (r / T) % NH, r % T, mine);
#pragma omp for schedule(dynamic, 8)
        for (int r = 0; r < rows; r++) mha_dkv_row(&a, dqkv, r / (T * NH), (r / T) % NH, r % T, mine, mine + s.hs);
    }
    free(buf);
}
