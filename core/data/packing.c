// packing.c: see packing.h.
#include "core/data/packing.h"

#include "base/common.h"

// The open rows by free room: a min-heap of row indices per free room f (1..T), and a two-level bitmap of
// the rooms whose heap is not empty, so that the smallest room >= len is found in O(T / 4096) word reads
// and the lowest row of that room in O(log rows).
typedef struct {
    long long* rows;
    long long count, cap;
} RowHeap;

typedef struct {
    int T;
    RowHeap* heap;      // [T + 1]
    uint64_t* bits;     // [T / 64 + 1]: bit f of word f / 64, room f has an open row
    uint64_t* summary;  // [T / 4096 + 1]: bit w, word w of bits is not zero
} OpenRows;

static void heap_push(RowHeap* h, long long row) {
    if (h->count == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 4;
        h->rows = xrealloc(h->rows, (size_t)h->cap * sizeof *h->rows);
    }
    long long i = h->count++;
    while (i > 0 && h->rows[(i - 1) / 2] > row) {
        h->rows[i] = h->rows[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->rows[i] = row;
}

static long long heap_pop(RowHeap* h) {
    long long top = h->rows[0], last = h->rows[--h->count], i = 0;
    for (;;) {
        long long c = 2 * i + 1;
        if (c >= h->count) break;
        if (c + 1 < h->count && h->rows[c + 1] < h->rows[c]) c++;
        if (h->rows[c] >= last) break;
        h->rows[i] = h->rows[c];
        i = c;
    }
    if (h->count) h->rows[i] = last;
    return top;
}

static void mark(OpenRows* o, int f, int on) {
    uint64_t bit = (uint64_t)1 << (f % 64);
    if (on) o->bits[f / 64] |= bit;
    else o->bits[f / 64] &= ~bit;
    uint64_t sbit = (uint64_t)1 << ((f / 64) % 64);
    if (o->bits[f / 64]) o->summary[f / 4096] |= sbit;
    else o->summary[f / 4096] &= ~sbit;
}

// The smallest room >= len with an open row, or 0.
static int smallest_room(const OpenRows* o, int len) {
    int nwords = o->T / 64 + 1, w = len / 64;
    uint64_t here = o->bits[w] & (~(uint64_t)0 << (len % 64));
    if (here) return w * 64 + __builtin_ctzll(here);
    int nsum = o->T / 4096 + 1, s = (w + 1) / 64;
    if (w + 1 >= nwords) return 0;
    uint64_t above = o->summary[s] & (~(uint64_t)0 << ((w + 1) % 64));
    while (!above && ++s < nsum) above = o->summary[s];
    if (!above) return 0;
    int word = s * 64 + __builtin_ctzll(above);
    return word * 64 + __builtin_ctzll(o->bits[word]);
}

long long packing_best_fit(const int* len, long long n, int T, long long* row_of, int* at) {
    OpenRows o = {T, xcalloc((size_t)T + 1, sizeof(RowHeap)), xcalloc((size_t)T / 64 + 1, sizeof(uint64_t)),
                  xcalloc((size_t)T / 4096 + 1, sizeof(uint64_t))};
    int* used = NULL;   // per row
    long long rows = 0, cap = 0;
    for (long long i = 0; i < n; i++) {
        int L = len[i];
        if (L < 1 || L > T) fail("internal: a document of %d tokens packed into rows of %d", L, T);
        int room = smallest_room(&o, L);
        long long r;
        if (room) {
            r = heap_pop(&o.heap[room]);
            if (!o.heap[room].count) mark(&o, room, 0);
        } else {
            if (rows == cap) {
                cap = cap ? 2 * cap : 64;
                used = xrealloc(used, (size_t)cap * sizeof *used);
            }
            r = rows++;
            used[r] = 0;
        }
        row_of[i] = r;
        at[i] = used[r];
        used[r] += L;
        int left = T - used[r];
        if (left > 0) {
            heap_push(&o.heap[left], r);
            mark(&o, left, 1);
        }
    }
    for (int f = 0; f <= T; f++) free(o.heap[f].rows);
    free(o.heap), free(o.bits), free(o.summary), free(used);
    return rows;
}

void packing_fill_row(const uint32_t* tok, const uint8_t* mask, const int* doc_len, int ndocs, int T, int* tokens,
                      int* targets, int* pos, int* doc) {
    int t = 0;
    for (int k = 0; k < ndocs; k++) {
        int start = t, end = t + doc_len[k];
        for (; t < end; t++) {
            tokens[t] = (int)tok[t];
            pos[t] = t - start;
            doc[t] = start;
            targets[t] = t + 1 < end && (mask[t + 1] & MASK_TRAINED) ? (int)tok[t + 1] : -1;
        }
    }
    for (int start = t; t < T; t++) {
        tokens[t] = 0;
        pos[t] = t - start;
        doc[t] = start;
        targets[t] = -1;
    }
}

void packing_fill_window(const uint32_t* raw, const uint8_t* mask, int doc_token, int B, int T, int* tokens, int* targets,
                         int* pos, int* doc) {
    for (int b = 0; b < B; b++) {
        int last = 0;
        for (int t = 0; t < T; t++) {
            long long i = (long long)b * T + t;
            int starts = mask ? (mask[i] & MASK_DOC_START) != 0 : raw[i] == (uint32_t)doc_token;
            if (starts) last = t;
            tokens[i] = (int)raw[i];
            targets[i] = mask && !(mask[i + 1] & MASK_TRAINED) ? -1 : (int)raw[i + 1];
            doc[i] = last;
            pos[i] = t - last;
        }
    }
}
