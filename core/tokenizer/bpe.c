/* bpe.c: GPT-2's pre-tokenization and byte-level BPE; see bpe.h. Moved out of gpt2tok.c unchanged, so the
 * tool and the trainer's -prompt encode alike. */
#include "core/tokenizer/bpe.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { UC_OTHER = 0, UC_L = 1, UC_N = 2, UC_WS = 3 };
#include "core/tokenizer/unicode_tables.h"

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_PIECE 48       /* longer pieces are rare; caching them would only churn the arena */
#define NAIVE_MAX 64             /* below this, an O(n^2) merge loop beats the heap's bookkeeping */

/* ---------- small helpers ---------- */

void bpe_die(const char *label, const char *msg) {
    fprintf(stderr, "error: %s%s%s\n", label ? label : "", label ? ": " : "", msg);
    exit(1);
}

void *bpe_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) bpe_die(NULL, "out of memory");
    return p;
}

void *bpe_xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) bpe_die(NULL, "out of memory");
    return p;
}

static int read_exact(FILE *f, void *buf, size_t n) { return fread(buf, 1, n, f) == n; }

/* ---------- model: byte ids and merge ranks ---------- */

#define MERGE_SLOTS (1u << 17)
typedef BpeModel Model;

static uint32_t hash32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

static const MergeSlot *merge_find(const Model *m, uint16_t a, uint16_t b) {
    uint32_t key = (uint32_t)a << 16 | b;
    for (uint32_t i = hash32(key) & (MERGE_SLOTS - 1);; i = (i + 1) & (MERGE_SLOTS - 1)) {
        const MergeSlot *s = &m->slots[i];
        if (s->rank == UINT32_MAX) return NULL;
        if (s->key == key) return s;
    }
}

static void merge_insert(Model *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
    uint32_t key = a << 16 | b;
    uint32_t i = hash32(key) & (MERGE_SLOTS - 1);
    while (m->slots[i].rank != UINT32_MAX && m->slots[i].key != key) i = (i + 1) & (MERGE_SLOTS - 1);
    if (m->slots[i].rank == UINT32_MAX) m->slots[i] = (MergeSlot){key, rank, merged};
}

void bpe_model_load(BpeModel *m, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) bpe_die(path, strerror(errno));
    int32_t hdr[4];
    uint32_t bytes[256];
    if (!read_exact(f, hdr, sizeof hdr) || hdr[0] != GPT2TOK_MAGIC || hdr[1] != 1 || hdr[2] <= 0 ||
        hdr[2] >= (int32_t)(MERGE_SLOTS / 2) || !read_exact(f, bytes, sizeof bytes))
        bpe_die(path, "not a gpt2tok model file");
    for (int i = 0; i < 256; i++) {
        if (bytes[i] > 0xffff) bpe_die(path, "byte id out of range");
        m->byte_id[i] = (uint16_t)bytes[i];
    }
    m->slots = bpe_xmalloc(MERGE_SLOTS * sizeof(MergeSlot));
    for (uint32_t i = 0; i < MERGE_SLOTS; i++) m->slots[i].rank = UINT32_MAX;
    for (int32_t r = 0; r < hdr[2]; r++) {
        uint32_t t[3];
        if (!read_exact(f, t, sizeof t) || t[0] > 0xffff || t[1] > 0xffff || t[2] > 0xffff)
            bpe_die(path, "truncated or corrupt merges");
        merge_insert(m, t[0], t[1], (uint32_t)r, t[2]);
    }
    if (fclose(f) != 0) bpe_die(path, strerror(errno));
}

/* ---------- UTF-8 and character classes ---------- */

/* Offset of the first byte that is not part of valid UTF-8 (strict: no overlongs, surrogates or
 * code points above U+10FFFF), or len when all of it is valid. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        if (c < 0xC2 || c > 0xF4 || i + (size_t)n >= len) return i;
        uint32_t cp = c & (0x3F >> n);
        for (int k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += (size_t)n + 1;
    }
    return len;
}

/* Decodes the (already validated) character at s; *n gets its byte length. */
static uint32_t utf8_decode(const uint8_t *s, int *n) {
    uint8_t c = s[0];
    if (c < 0x80) { *n = 1; return c; }
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = c & (0x3F >> k);
    for (int i = 1; i <= k; i++) cp = cp << 6 | (s[i] & 0x3F);
    *n = k + 1;
    return cp;
}

/* Unicode White_Space, which is what \s means in the `regex` module GPT-2's encoder.py used (not JS's
 * \s: that adds U+FEFF and drops U+0085). The property has not changed since Unicode 6.3. */
static int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static const unsigned char ASCII_CLASS[128] = {   /* the common case without a search */
    ['\t' ... '\r'] = UC_WS, [' '] = UC_WS, ['0' ... '9'] = UC_N, ['A' ... 'Z'] = UC_L, ['a' ... 'z'] = UC_L,
};

static inline int char_class(uint32_t c) {
    if (c < 0x80) return ASCII_CLASS[c];
    if (is_white_space(c)) return UC_WS;
    size_t lo = 0, hi = sizeof UC_RANGES / sizeof UC_RANGES[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < UC_RANGES[mid].first) hi = mid;
        else if (c > UC_RANGES[mid].last) lo = mid + 1;
        else return UC_RANGES[mid].cls;
    }
    return UC_OTHER;
}

static inline int class_at(const uint8_t *s, size_t i, int *n) {
    if (s[i] < 0x80) { *n = 1; return ASCII_CLASS[s[i]]; }
    return char_class(utf8_decode(s + i, n));
}

/* ---------- pre-tokenization ----------
 * The pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * piece_end returns where the piece starting at i ends. `end` is the end of this chunk; nonspace_after
 * says the document goes on past it with a non-space character (how chunks are cut), which decides the
 * (?!\S) lookahead at the chunk's end. */

static size_t contraction_end(const uint8_t *s, size_t i, size_t end) {
    if (i + 1 >= end) return 0;
    uint8_t a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= end) return 0;
    uint8_t b = s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

static size_t run_end(const uint8_t *s, size_t j, size_t end, int cls) {
    int n;
    while (j < end && class_at(s, j, &n) == cls) j += (size_t)n;
    return j;
}

static size_t piece_end(const uint8_t *s, size_t i, size_t end, int nonspace_after) {
    int n;
    if (s[i] == '\'') {
        size_t e = contraction_end(s, i, end);
        if (e) return e;
    }
    int cls = class_at(s, i, &n);
    size_t j = i + (size_t)n;
    if (s[i] == ' ' && j < end) {
        int n2, next = class_at(s, j, &n2);
        if (next != UC_WS) return run_end(s, j, end, next);
    }
    if (cls != UC_WS) return run_end(s, j, end, cls);
    /* Whitespace: the run, minus its last character when a non-space follows (that one joins the next
     * piece or stands alone), but never less than one character. */
    size_t last = i;
    while (j < end && class_at(s, j, &n) == UC_WS) { last = j; j += (size_t)n; }
    if (j == end && !nonspace_after) return j;
    return last > i ? last : j;
}

/* ---------- BPE ---------- */

typedef BpeTokens Tokens;

void bpe_tokens_push(BpeTokens *t, uint16_t id) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->v = bpe_xrealloc(t->v, t->cap * sizeof *t->v);
    }
    t->v[t->n++] = id;
}

typedef struct { uint32_t rank; uint32_t pos; uint16_t a, b; } HeapItem;

typedef struct {            /* per-thread scratch for merging one piece */
    uint16_t *id;
    uint32_t *rank;         /* naive: rank of (id[i], id[i+1]) */
    int32_t *prev, *next;   /* heap: linked list over the piece's symbols */
    HeapItem *heap;
    size_t cap, heap_cap;
} Scratch;

static void scratch_reserve(Scratch *s, size_t n) {
    if (n <= s->cap) return;
    s->cap = n * 2;
    s->id = bpe_xrealloc(s->id, s->cap * sizeof *s->id);
    s->rank = bpe_xrealloc(s->rank, s->cap * sizeof *s->rank);
    s->prev = bpe_xrealloc(s->prev, s->cap * sizeof *s->prev);
    s->next = bpe_xrealloc(s->next, s->cap * sizeof *s->next);
}

static uint32_t pair_rank(const Model *m, uint16_t a, uint16_t b) {
    const MergeSlot *s = merge_find(m, a, b);
    return s ? s->rank : UINT32_MAX;
}

/* Lowest rank first, leftmost among equals: the same order as encoder.py's merge-all-occurrences loop,
 * because a pair containing a freshly merged token always ranks after the merge that made it. */
static size_t bpe_naive(const Model *m, uint16_t *id, uint32_t *rank, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(m, id[i], id[i + 1]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++) if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = merge_find(m, id[best], id[best + 1])->merged;
        memmove(id + best + 1, id + best + 2, (n - best - 2) * sizeof *id);
        memmove(rank + best + 1, rank + best + 2, (n - best - 2) * sizeof *rank);
        n--;
        if (best + 1 < n) rank[best] = pair_rank(m, id[best], id[best + 1]);
        else rank[best] = UINT32_MAX;
        if (best > 0) rank[best - 1] = pair_rank(m, id[best - 1], id[best]);
    }
    return n;
}

static int heap_less(const HeapItem *x, const HeapItem *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(Scratch *s, size_t *len, HeapItem it) {
    if (*len == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 1024;
        s->heap = bpe_xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
    }
    size_t i = (*len)++;
    while (i > 0 && heap_less(&it, &s->heap[(i - 1) / 2])) { s->heap[i] = s->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    s->heap[i] = it;
}

static HeapItem heap_pop(Scratch *s, size_t *len) {
    HeapItem top = s->heap[0], last = s->heap[--*len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *len) break;
        if (c + 1 < *len && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (*len) s->heap[i] = last;
    return top;
}

static void heap_offer(const Model *m, Scratch *s, size_t *len, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0) return;
    const MergeSlot *ms = merge_find(m, s->id[pos], s->id[nx]);
    if (ms) heap_push(s, len, (HeapItem){ms->rank, (uint32_t)pos, s->id[pos], s->id[nx]});
}

/* Same order as bpe_naive in O(n log n), for the occasional long piece (a line of '=' or a base64 blob).
 * Stale heap entries are recognised by their ids no longer matching the list. */
static size_t bpe_heap(const Model *m, Scratch *s, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++) { s->prev[i] = (int32_t)i - 1; s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1; }
    for (size_t i = 0; i + 1 < n; i++) heap_offer(m, s, &len, (int32_t)i);
    while (len) {
        HeapItem it = heap_pop(s, &len);
        int32_t p = (int32_t)it.pos, q = s->next[p];
        if (s->prev[p] == -2 || q < 0 || s->id[p] != it.a || s->id[q] != it.b) continue;
        s->id[p] = merge_find(m, it.a, it.b)->merged;
        s->next[p] = s->next[q];
        if (s->next[q] >= 0) s->prev[s->next[q]] = p;
        s->prev[q] = -2;   /* marks a removed symbol */
        if (s->prev[p] >= 0) heap_offer(m, s, &len, s->prev[p]);
        heap_offer(m, s, &len, p);
    }
    size_t k = 0;
    for (int32_t p = 0; p >= 0; p = s->next[p]) s->id[k++] = s->id[p];
    return k;
}

/* ---------- per-thread piece cache ---------- */

typedef struct { uint64_t hash; uint32_t key_off, ids_off; uint16_t key_len, ids_len; } CacheSlot;

typedef struct {
    CacheSlot *slots;
    uint8_t *keys;
    uint16_t *ids;
    size_t used, keys_used, ids_used;
} Cache;

#define CACHE_KEY_BYTES (CACHE_SLOTS * 16u)
#define CACHE_IDS (CACHE_SLOTS * 8u)

static void cache_clear(Cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->used = c->keys_used = c->ids_used = 0;
}

static void cache_init(Cache *c) {
    c->slots = bpe_xmalloc(CACHE_SLOTS * sizeof *c->slots);
    c->keys = bpe_xmalloc(CACHE_KEY_BYTES);
    c->ids = bpe_xmalloc(CACHE_IDS * sizeof *c->ids);
    cache_clear(c);
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
    return h | 1;   /* 0 marks an empty slot */
}

static CacheSlot *cache_slot(Cache *c, const uint8_t *p, size_t n, uint64_t h) {
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        CacheSlot *s = &c->slots[i];
        if (!s->hash) return s;
        if (s->hash == h && s->key_len == n && !memcmp(c->keys + s->key_off, p, n)) return s;
    }
}

static void cache_put(Cache *c, CacheSlot *slot, const uint8_t *p, size_t n, uint64_t h,
                      const uint16_t *ids, size_t k) {
    slot->hash = h;
    slot->key_off = (uint32_t)c->keys_used; slot->key_len = (uint16_t)n;
    slot->ids_off = (uint32_t)c->ids_used; slot->ids_len = (uint16_t)k;
    memcpy(c->keys + c->keys_used, p, n);
    memcpy(c->ids + c->ids_used, ids, k * sizeof *ids);
    c->keys_used += n; c->ids_used += k; c->used++;
}

/* ---------- encoding a chunk ---------- */

struct BpeWorker { const Model *m; Scratch s; Cache cache; };
typedef BpeWorker Worker;

static void encode_piece(Worker *w, const uint8_t *p, size_t n, Tokens *out) {
    if (n == 1) { bpe_tokens_push(out, w->m->byte_id[p[0]]); return; }
    uint64_t h = 0;
    CacheSlot *slot = NULL;
    if (n <= CACHE_MAX_PIECE) {
        h = hash_bytes(p, n);
        slot = cache_slot(&w->cache, p, n, h);
        if (slot->hash) {
            for (size_t i = 0; i < slot->ids_len; i++) bpe_tokens_push(out, w->cache.ids[slot->ids_off + i]);
            return;
        }
    }
    scratch_reserve(&w->s, n);
    for (size_t i = 0; i < n; i++) w->s.id[i] = w->m->byte_id[p[i]];
    size_t k = n <= NAIVE_MAX ? bpe_naive(w->m, w->s.id, w->s.rank, n) : bpe_heap(w->m, &w->s, n);
    for (size_t i = 0; i < k; i++) bpe_tokens_push(out, w->s.id[i]);
    if (!slot) return;
    Cache *c = &w->cache;
    if (c->used * 2 >= CACHE_SLOTS || c->keys_used + n > CACHE_KEY_BYTES || c->ids_used + k > CACHE_IDS) {
        cache_clear(c);   /* a full reset keeps it simple; the hot words come back within a few KB */
        slot = cache_slot(c, p, n, h);
    }
    cache_put(c, slot, p, n, h, w->s.id, k);
}

size_t bpe_encode_span(BpeWorker *w, const uint8_t *text, size_t start, size_t end, int nonspace_after, BpeTokens *out) {
    size_t bad = utf8_invalid_at(text + start, end - start);
    if (bad != end - start) return start + bad;
    for (size_t i = start; i < end;) {
        size_t e = piece_end(text, i, end, nonspace_after);
        encode_piece(w, text + i, e - i, out);
        i = e;
    }
    return SIZE_MAX;
}

BpeWorker *bpe_worker_new(const BpeModel *m) {
    BpeWorker *w = bpe_xmalloc(sizeof *w);
    memset(w, 0, sizeof *w);
    w->m = m;
    cache_init(&w->cache);
    return w;
}

void bpe_worker_free(BpeWorker *w) {
    Scratch *s = &w->s;
    free(s->id); free(s->rank); free(s->prev); free(s->next); free(s->heap);
    free(w->cache.slots); free(w->cache.keys); free(w->cache.ids);
    free(w);
}

void bpe_model_free(BpeModel *m) { free(m->slots); }
