// encoder.c: token + position embeddings (CPU twin); encoder_forward_vocab and encoder_backward_vocab
// touch only the wte rows this rank holds under -tp, so no rank needs the whole table.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

// The position row of token bt: its position in its document, or in its row.
static inline size_t position_of(const int* pos, int bt, int T) { return (size_t)(pos ? pos[bt] : bt % T); }

void encoder_forward(Backend* be, DType dt, void* out, const int* tokens, const int* pos, const void* wte,
                     const void* wpe, int B, int T, int C) {
    BACKEND_ENTRY(be, out, tokens, pos, wte, wpe);
    cpu_check_pos(pos, B, T, "encoder_forward");
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        size_t tok = (size_t)tokens[bt], t = position_of(pos, bt, T), o = (size_t)bt * C;
        for (int c = 0; c < C; c++) st(out, o + c, ld(wte, tok * C + c, dt) + ld(wpe, t * C + c, dt), dt);
    }
}

void encoder_forward_vocab(Backend* be, DType dt, void* out, const int* tokens, const int* pos, const void* wte,
                           const void* wpe, int v0, int Vl, int B, int T, int C) {
    BACKEND_ENTRY(be, out, tokens, pos, wte, wpe);
    cpu_check_pos(pos, B, T, "encoder_forward_vocab");
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int mine = tokens[bt] >= v0 && tokens[bt] - v0 < Vl;
        size_t row = mine ? (size_t)(tokens[bt] - v0) : 0, t = position_of(pos, bt, T), o = (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float e = mine ? ld(wte, row * C + c, dt) : 0.0f, p = wpe ? ld(wpe, t * C + c, dt) : 0.0f;
            st(out, o + c, e + p, dt);
        }
    }
}

// Token indices (b*T + t) grouped by a key (the token, or the position), each group in increasing index order.
// Every row of dwte (dwpe) then gets one fp32 sum in a fixed order and one rounding, whatever the thread count.
typedef struct { int64_t* key; int* start; int ngroups; } TokenGroups;   // key = group << 32 | index

static int cmp_i64(const void* a, const void* b) {
    int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return x < y ? -1 : x > y;
}

// Only the keys in [v0, v0 + Vl) are grouped (the rows of this rank's wte shard; keys hold token - v0).
static TokenGroups group_by_token(const int* tokens, int n, int v0, int Vl) {
    TokenGroups g = {xmalloc(sizeof(int64_t) * (n ? n : 1)), xmalloc(sizeof(int) * (n + 1)), 0};
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0) fail("encoder_backward: negative token %d at position %d", tokens[i], i);
        if (tokens[i] >= v0 && tokens[i] - v0 < Vl) g.key[m++] = (int64_t)((uint64_t)(tokens[i] - v0) << 32 | (uint64_t)i);
    }
    qsort(g.key, m, sizeof(int64_t), cmp_i64);
    for (int i = 0; i < m; i++)
        if (i == 0 || g.key[i] >> 32 != g.key[i - 1] >> 32) g.start[g.ngroups++] = i;
    g.start[g.ngroups] = m;
    return g;
}

// Adds each group's rows of dout into the row of `dw` its key names.
static void scatter_groups(DType dt, void* dw, const void* dout, const TokenGroups* g, int C) {
#pragma omp parallel
    {
        float* acc = xmalloc(sizeof(float) * C);
#pragma omp for schedule(dynamic, 4)
        for (int k = 0; k < g->ngroups; k++) {   // one output row per group
            memset(acc, 0, sizeof(float) * C);
            for (int i = g->start[k]; i < g->start[k + 1]; i++)
                for (int c = 0; c < C; c++) acc[c] += ld(dout, (size_t)(g->key[i] & 0xffffffff) * C + c, dt);
            size_t row = (size_t)(g->key[g->start[k]] >> 32) * C;
            for (int c = 0; c < C; c++) st(dw, row + c, ld(dw, row + c, dt) + acc[c], dt);
        }
        free(acc);
    }
}

static void free_groups(TokenGroups* g) {
    free(g->key);
    free(g->start);
}

static void backward_range(DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens, const int* pos,
                           int v0, int Vl, int B, int T, int C) {
    TokenGroups g = group_by_token(tokens, B * T, v0, Vl);
    scatter_groups(dt, dwte, dout, &g, C);
    free_groups(&g);
    if (dwpe && pos) {   // positions repeat across documents, or start past T (-cp): grouped like tokens
        TokenGroups p = group_by_token(pos, B * T, 0, INT_MAX);
        scatter_groups(dt, dwpe, dout, &p, C);
        free_groups(&p);
        return;
    }
#pragma omp parallel
    {
        float* acc = xmalloc(sizeof(float) * C);
#pragma omp for schedule(static)
        for (int t = 0; t < (dwpe ? T : 0); t++) {
            memset(acc, 0, sizeof(float) * C);
            for (int b = 0; b < B; b++)
                for (int c = 0; c < C; c++) acc[c] += ld(dout, ((size_t)b * T + t) * C + c, dt);
            for (int c = 0; c < C; c++) st(dwpe, (size_t)t * C + c, ld(dwpe, (size_t)t * C + c, dt) + acc[c], dt);
        }
        free(acc);
    }
}

void encoder_backward(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens,
                      const int* pos, int B, int T, int C) {
    BACKEND_ENTRY(be, dwte, dwpe, dout, tokens, pos);
    cpu_check_pos(pos, B, T, "encoder_backward");
    backward_range(dt, dwte, dwpe, dout, tokens, pos, 0, INT_MAX, B, T, C);
}

void encoder_backward_vocab(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens,
                            const int* pos, int v0, int Vl, int B, int T, int C) {
    BACKEND_ENTRY(be, dwte, dwpe, dout, tokens, pos);
    cpu_check_pos(pos, B, T, "encoder_backward_vocab");
    backward_range(dt, dwte, dwpe, dout, tokens, pos, v0, Vl, B, T, C);
}
