/* gpt2tok: the hot loop of scripts/tokenize.py — GPT-2 pre-tokenization and byte-level BPE.
 *
 * usage: gpt2tok MODEL [-t THREADS]
 *   MODEL   merges in the compact form scripts/tokenize.py writes (it owns the sha256 check):
 *           int32 [GPT2TOK_MAGIC, 1, n_merges, 0], uint32 byte_id[256], n_merges x uint32 {a, b, merged}
 *   stdin   documents: 'F' u32 n path[n]            (the helper reads the file itself)
 *                      'T' u32 n label[n] u64 m text[m]
 *   stdout  per document, in input order: u64 ntok, then ntok x uint16 token ids
 * Invalid UTF-8 or an unreadable/empty file ends the run with one "error: ..." line on stderr, exit 1.
 *
 * Work is parallel over chunks of a batch of documents; chunks are cut only where the pattern is certain
 * to have a piece boundary, so the output does not depend on the thread count or the chunking. */
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { UC_OTHER = 0, UC_L = 1, UC_N = 2, UC_WS = 3 };
#include "unicode_tables.h"

#define GPT2TOK_MAGIC 20240601
#define BATCH_BYTES (8u << 20)   /* enough work per batch to keep every thread busy */
#define CHUNK_BYTES (64u << 10)  /* small enough to balance, large enough to amortize the split scan */
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_PIECE 48       /* longer pieces are rare; caching them would only churn the arena */
#define NAIVE_MAX 64             /* below this, an O(n^2) merge loop beats the heap's bookkeeping */

/* ---------- small helpers ---------- */

static void die(const char *label, const char *msg) {
    fprintf(stderr, "error: %s%s%s\n", label ? label : "", label ? ": " : "", msg);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die(NULL, "out of memory");
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die(NULL, "out of memory");
    return p;
}

static int read_exact(FILE *f, void *buf, size_t n) { return fread(buf, 1, n, f) == n; }

/* ---------- model: byte ids and merge ranks ---------- */

typedef struct { uint32_t key, rank, merged; } MergeSlot;   /* key = a << 16 | b; rank UINT32_MAX = empty */
#define MERGE_SLOTS (1u << 17)

typedef struct {
    uint16_t byte_id[256];
    MergeSlot *slots;
} Model;

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

static void model_load(Model *m, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path, strerror(errno));
    int32_t hdr[4];
    uint32_t bytes[256];
    if (!read_exact(f, hdr, sizeof hdr) || hdr[0] != GPT2TOK_MAGIC || hdr[1] != 1 || hdr[2] <= 0 ||
        hdr[2] >= (int32_t)(MERGE_SLOTS / 2) || !read_exact(f, bytes, sizeof bytes))
        die(path, "not a gpt2tok model file");
    for (int i = 0; i < 256; i++) {
        if (bytes[i] > 0xffff) die(path, "byte id out of range");
        m->byte_id[i] = (uint16_t)bytes[i];
    }
    m->slots = xmalloc(MERGE_SLOTS * sizeof(MergeSlot));
    for (uint32_t i = 0; i < MERGE_SLOTS; i++) m->slots[i].rank = UINT32_MAX;
    for (int32_t r = 0; r < hdr[2]; r++) {
        uint32_t t[3];
        if (!read_exact(f, t, sizeof t) || t[0] > 0xffff || t[1] > 0xffff || t[2] > 0xffff)
            die(path, "truncated or corrupt merges");
        merge_insert(m, t[0], t[1], (uint32_t)r, t[2]);
    }
    if (fclose(f) != 0) die(path, strerror(errno));
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

typedef struct { uint16_t *v; size_t n, cap; } Tokens;

static void tokens_push(Tokens *t, uint16_t id) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->v = xrealloc(t->v, t->cap * sizeof *t->v);
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
    s->id = xrealloc(s->id, s->cap * sizeof *s->id);
    s->rank = xrealloc(s->rank, s->cap * sizeof *s->rank);
    s->prev = xrealloc(s->prev, s->cap * sizeof *s->prev);
    s->next = xrealloc(s->next, s->cap * sizeof *s->next);
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
        s->heap = xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
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
    c->slots = xmalloc(CACHE_SLOTS * sizeof *c->slots);
    c->keys = xmalloc(CACHE_KEY_BYTES);
    c->ids = xmalloc(CACHE_IDS * sizeof *c->ids);
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

typedef struct { const Model *m; Scratch s; Cache cache; } Worker;

static void encode_piece(Worker *w, const uint8_t *p, size_t n, Tokens *out) {
    if (n == 1) { tokens_push(out, w->m->byte_id[p[0]]); return; }
    uint64_t h = 0;
    CacheSlot *slot = NULL;
    if (n <= CACHE_MAX_PIECE) {
        h = hash_bytes(p, n);
        slot = cache_slot(&w->cache, p, n, h);
        if (slot->hash) {
            for (size_t i = 0; i < slot->ids_len; i++) tokens_push(out, w->cache.ids[slot->ids_off + i]);
            return;
        }
    }
    scratch_reserve(&w->s, n);
    for (size_t i = 0; i < n; i++) w->s.id[i] = w->m->byte_id[p[i]];
    size_t k = n <= NAIVE_MAX ? bpe_naive(w->m, w->s.id, w->s.rank, n) : bpe_heap(w->m, &w->s, n);
    for (size_t i = 0; i < k; i++) tokens_push(out, w->s.id[i]);
    if (!slot) return;
    Cache *c = &w->cache;
    if (c->used * 2 >= CACHE_SLOTS || c->keys_used + n > CACHE_KEY_BYTES || c->ids_used + k > CACHE_IDS) {
        cache_clear(c);   /* a full reset keeps it simple; the hot words come back within a few KB */
        slot = cache_slot(c, p, n, h);
    }
    cache_put(c, slot, p, n, h, w->s.id, k);
}

typedef struct {
    size_t doc, start, end;
    int nonspace_after;
    size_t bad_at;   /* offset of invalid UTF-8 within the document, or SIZE_MAX */
    Tokens out;
} Chunk;

static void encode_chunk(Worker *w, const uint8_t *doc, Chunk *ch) {
    size_t bad = utf8_invalid_at(doc + ch->start, ch->end - ch->start);
    if (bad != ch->end - ch->start) { ch->bad_at = ch->start + bad; return; }
    for (size_t i = ch->start; i < ch->end;) {
        size_t e = piece_end(doc, i, ch->end, ch->nonspace_after);
        encode_piece(w, doc + i, e - i, &ch->out);
        i = e;
    }
}

/* ---------- batches of documents ---------- */

typedef struct { char *label; uint8_t *text; size_t len; } Doc;

typedef struct {
    Doc *docs; size_t ndocs, cap_docs, bytes;
    Chunk *chunks; size_t nchunks, cap_chunks;
} Batch;

/* A cut after '\n' and before a printable ASCII non-space is always a piece boundary: no alternative
 * joins a newline to what follows it, and the whitespace run before the cut ends at a non-space. */
static size_t next_cut(const uint8_t *s, size_t from, size_t len) {
    for (size_t i = from; i + 1 < len; i++)
        if (s[i] == '\n' && s[i + 1] > 0x20 && s[i + 1] < 0x7F) return i + 1;
    return len;
}

static void add_chunk(Batch *b, size_t doc, size_t start, size_t end, int nonspace_after) {
    if (b->nchunks == b->cap_chunks) {
        b->cap_chunks = b->cap_chunks ? 2 * b->cap_chunks : 256;
        b->chunks = xrealloc(b->chunks, b->cap_chunks * sizeof *b->chunks);
    }
    b->chunks[b->nchunks++] = (Chunk){doc, start, end, nonspace_after, SIZE_MAX, {0}};
}

static void split_docs(Batch *b) {
    b->nchunks = 0;
    for (size_t d = 0; d < b->ndocs; d++) {
        const Doc *doc = &b->docs[d];
        size_t start = 0;
        while (start < doc->len) {
            size_t end = doc->len - start > 2 * CHUNK_BYTES ? next_cut(doc->text, start + CHUNK_BYTES, doc->len)
                                                            : doc->len;
            add_chunk(b, d, start, end, end < doc->len);
            start = end;
        }
    }
}

static void write_all(const void *p, size_t n) {
    if (fwrite(p, 1, n, stdout) != n) die("stdout", strerror(errno));
}

/* Emits each document's ids (or stops at the first bad document) and frees the batch. */
static void flush_batch(Batch *b) {
    size_t c = 0;
    for (size_t d = 0; d < b->ndocs; d++) {
        uint64_t ntok = 0;
        size_t first = c;
        for (; c < b->nchunks && b->chunks[c].doc == d; c++) {
            if (b->chunks[c].bad_at != SIZE_MAX) {
                char msg[96];
                snprintf(msg, sizeof msg, "not valid UTF-8 at byte %zu", b->chunks[c].bad_at);
                die(b->docs[d].label, msg);
            }
            ntok += b->chunks[c].out.n;
        }
        write_all(&ntok, sizeof ntok);
        for (size_t k = first; k < c; k++) write_all(b->chunks[k].out.v, b->chunks[k].out.n * sizeof(uint16_t));
    }
    for (size_t k = 0; k < b->nchunks; k++) free(b->chunks[k].out.v);
    for (size_t d = 0; d < b->ndocs; d++) { free(b->docs[d].label); free(b->docs[d].text); }
    b->ndocs = b->bytes = b->nchunks = 0;
    if (fflush(stdout) != 0) die("stdout", strerror(errno));
}

static void run_batch(Batch *b, Worker *workers) {
    split_docs(b);
    #pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < b->nchunks; k++)
        encode_chunk(&workers[omp_get_thread_num()], b->docs[b->chunks[k].doc].text, &b->chunks[k]);
    flush_batch(b);
}

/* ---------- input ---------- */

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die(path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die(path, "not a regular file");
    if (st.st_size == 0) die(path, "empty file");
    uint8_t *buf = xmalloc((size_t)st.st_size);
    if (!read_exact(f, buf, (size_t)st.st_size)) die(path, ferror(f) ? strerror(errno) : "file shrank while reading");
    if (fclose(f) != 0) die(path, strerror(errno));
    *len = (size_t)st.st_size;
    return buf;
}

/* Reads one document record; returns 0 at a clean end of input. */
static int read_doc(Doc *d) {
    int kind = getchar();
    if (kind == EOF) return 0;
    uint32_t n;
    if ((kind != 'F' && kind != 'T') || !read_exact(stdin, &n, sizeof n) || n > 65536)
        die("stdin", "bad document record");
    d->label = xmalloc(n + 1);
    if (!read_exact(stdin, d->label, n)) die("stdin", "truncated document record");
    d->label[n] = 0;
    if (kind == 'F') { d->text = read_file(d->label, &d->len); return 1; }
    uint64_t m;
    if (!read_exact(stdin, &m, sizeof m)) die("stdin", "truncated document record");
    d->text = xmalloc((size_t)m);
    d->len = (size_t)m;
    if (!read_exact(stdin, d->text, d->len)) die("stdin", "truncated document record");
    return 1;
}

static void add_doc(Batch *b, Doc d) {
    if (b->ndocs == b->cap_docs) {
        b->cap_docs = b->cap_docs ? 2 * b->cap_docs : 64;
        b->docs = xrealloc(b->docs, b->cap_docs * sizeof *b->docs);
    }
    b->docs[b->ndocs++] = d;
    b->bytes += d.len;
}

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 4 && !strcmp(argv[2], "-t"))) {
        fprintf(stderr, "usage: gpt2tok MODEL [-t THREADS]  (documents on stdin; see scripts/tokenize.py)\n");
        return 2;
    }
    if (argc == 4) {
        int t = atoi(argv[3]);
        if (t < 1) die("-t", "needs a positive thread count");
        omp_set_num_threads(t);
    }
    Model m;
    model_load(&m, argv[1]);
    int nthreads = omp_get_max_threads();
    Worker *workers = xmalloc((size_t)nthreads * sizeof *workers);
    for (int t = 0; t < nthreads; t++) {
        workers[t] = (Worker){.m = &m};
        cache_init(&workers[t].cache);
    }
    Batch b = {0};
    Doc d;
    while (read_doc(&d)) {
        add_doc(&b, d);
        if (b.bytes >= BATCH_BYTES) run_batch(&b, workers);
    }
    if (b.ndocs) run_batch(&b, workers);
    return 0;
}
