// bpe.c: pre-tokenization and byte-level BPE; see bpe.h. Also the tables the loaders fill
// (core/tokenizer/tokenizer_file.c picks the loader).
#include "core/tokenizer/bpe.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/tokenizer/nfc.h"
#include "core/util/utf8.h"

enum { UC_OTHER = 0, UC_L = 1, UC_N = 2, UC_WS = 3 };
#include "core/tokenizer/unicode_tables.h"

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_PIECE 48   // longer pieces are rare; caching them would only churn the arena
#define NAIVE_MAX 64   // below this, an O(n^2) merge loop beats the heap's bookkeeping
#define EMPTY UINT32_MAX

typedef BpeModel Model;

// ---------- model: merge ranks, the vocabulary, added tokens ----------

static uint64_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// Eight bytes at a step: every piece and every vocabulary lookup hashes its bytes.
static uint64_t hash_bytes(const uint8_t* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = hash64(h ^ w);
    }
    w = 0;
    memcpy(&w, p, n);
    return hash64(h ^ w) | 1;   // 0 marks an empty cache slot
}

static uint32_t table_slots(size_t n) {   // a power of two, at least twice n: short probe runs
    uint32_t s = 1024;
    while (s < 2 * n) s *= 2;
    return s;
}

static const MergeSlot* merge_find(const Model* m, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (uint64_t i = hash64(key) & m->merge_mask;; i = (i + 1) & m->merge_mask) {
        const MergeSlot* s = &m->merges[i];
        if (s->rank == EMPTY) return NULL;
        if (s->key == key) return s;
    }
}

void bpe_merges_reserve(BpeModel* m, size_t n) {
    uint32_t slots = table_slots(n);
    m->merges = xmalloc(slots * sizeof(MergeSlot));
    m->merge_mask = slots - 1;
    for (uint32_t i = 0; i < slots; i++) m->merges[i].rank = EMPTY;
}

int bpe_merge_add(BpeModel* m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
    uint64_t key = (uint64_t)a << 32 | b, i = hash64(key) & m->merge_mask;
    while (m->merges[i].rank != EMPTY && m->merges[i].key != key) i = (i + 1) & m->merge_mask;
    if (m->merges[i].rank != EMPTY) return 0;
    m->merges[i] = (MergeSlot){key, rank, merged};
    return 1;
}

const uint8_t* bpe_token_bytes(const BpeModel* m, uint32_t id, size_t* len) {
    if (id >= m->vocab_size) return NULL;
    *len = m->offset[id + 1] - m->offset[id] - 1;
    return m->bytes + m->offset[id];
}

void bpe_vocab_reserve(BpeModel* m, size_t n) {
    uint32_t slots = table_slots(n);
    m->vocab_slots = xmalloc(slots * sizeof *m->vocab_slots);
    m->vocab_mask = slots - 1;
    for (uint32_t i = 0; i < slots; i++) m->vocab_slots[i].id = EMPTY;
}

// The slot holding bytes p[0, n) of hash h, or the empty one where they would go. The tag spares most
// mismatches a look at the token's bytes.
static VocabSlot* vocab_slot(const Model* m, const uint8_t* p, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & m->vocab_mask;; i = (i + 1) & m->vocab_mask) {
        VocabSlot* s = &m->vocab_slots[i];
        if (s->id == EMPTY) return s;
        if (s->tag != tag) continue;
        size_t len = 0;
        const uint8_t* t = bpe_token_bytes(m, s->id, &len);
        if (len == n && !memcmp(t, p, n)) return s;
    }
}

int bpe_vocab_add(BpeModel* m, uint32_t id) {
    size_t n = 0;
    const uint8_t* p = bpe_token_bytes(m, id, &n);
    uint64_t h = hash_bytes(p, n);
    VocabSlot* s = vocab_slot(m, p, n, h);
    if (s->id != EMPTY) return 0;
    *s = (VocabSlot){(uint32_t)(h >> 32), id};
    return 1;
}

static int64_t vocab_find(const Model* m, const uint8_t* p, size_t n, uint64_t h) {
    uint32_t id = vocab_slot(m, p, n, h)->id;
    return id == EMPTY ? -1 : (int64_t)id;
}

int64_t bpe_vocab_find(const BpeModel* m, const uint8_t* p, size_t n) {
    return m->vocab_slots ? vocab_find(m, p, n, hash_bytes(p, n)) : -1;
}

// Byte order, a prefix before the longer strings it begins: the tokens that share their first d bytes with
// a text then form one run of the sorted list, and the one of exactly d bytes, if any, comes first.
static int added_order(const void* x, const void* y) {
    const BpeAdded *a = x, *b = y;
    int c = memcmp(a->bytes, b->bytes, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

int bpe_added_index(BpeAddedSet* s) {
    qsort(s->v, s->n, sizeof *s->v, added_order);
    for (uint32_t i = 1; i < s->n; i++)
        if (!added_order(&s->v[i - 1], &s->v[i])) return 0;
    uint32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < s->n && s->v[k].bytes[0] < b) k++;
        s->range[b] = k;
    }
    return 1;
}

// Narrows the run [lo, hi) of tokens longer than d bytes to those whose byte d is c.
static void narrow(const BpeAddedSet* s, uint32_t* lo, uint32_t* hi, size_t d, uint8_t c) {
    uint32_t a = *lo, b = *hi;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (s->v[mid].bytes[d] < c)
            a = mid + 1;
        else
            b = mid;
    }
    uint32_t e = a, f = *hi;
    while (e < f) {
        uint32_t mid = e + (f - e) / 2;
        if (s->v[mid].bytes[d] <= c)
            e = mid + 1;
        else
            f = mid;
    }
    *lo = a;
    *hi = e;
}

// The longest token of s that text[p, end) begins with (its index in s->v), or -1.
static int64_t added_at(const BpeAddedSet* s, const uint8_t* text, size_t p, size_t end) {
    uint32_t lo = s->range[text[p]], hi = s->range[text[p] + 1];
    int64_t best = -1;
    for (size_t d = 1; lo < hi; d++) {
        if (s->v[lo].len == d) best = lo++;
        if (p + d >= end || lo >= hi) break;
        narrow(s, &lo, &hi, d, text[p + d]);
    }
    return best;
}

// The next position in text[p, end) where a token of s may begin: memchr's speed when all begin with one
// byte, as Llama 3's, Qwen2's and GPT-2's do ('<').
static size_t next_candidate(const BpeAddedSet* s, const uint8_t* text, size_t p, size_t end) {
    if (s->range[s->v[0].bytes[0] + 1] == s->n) {
        const uint8_t* c = memchr(text + p, s->v[0].bytes[0], end - p);
        return c ? (size_t)(c - text) : end;
    }
    while (p < end && s->range[text[p]] == s->range[text[p] + 1]) p++;
    return p;
}

static int next_added(const BpeAddedSet* s, const uint8_t* text, size_t from, size_t end, size_t* at, size_t* len,
                      uint32_t* id) {
    if (!s->n) return 0;
    for (size_t p = from; (p = next_candidate(s, text, p, end)) < end; p++) {
        int64_t k = added_at(s, text, p, end);
        if (k < 0) continue;
        *at = p;
        *len = s->v[k].len;
        *id = s->v[k].id;
        return 1;
    }
    return 0;
}

int bpe_next_added(const BpeModel* m, const uint8_t* text, size_t from, size_t end, size_t* at, size_t* len,
                   uint32_t* id) {
    return next_added(&m->added, text, from, end, at, len, id);
}

// After a '\n' and before a printable ASCII non-space: no alternative of any pattern joins a newline to what
// follows it, and the whitespace run before the cut ends at a non-space; NFC leaves both characters alone and
// joins neither to its neighbour. Only a second-pass added token holding that pair could span the cut.
static int cut_between(uint8_t a, uint8_t b) { return a == '\n' && b > 0x20 && b < 0x7F; }

size_t bpe_next_cut(const BpeModel* m, const uint8_t* text, size_t from, size_t len) {
    if (m->uncut) return len;
    for (size_t i = from; i + 1 < len; i++)
        if (cut_between(text[i], text[i + 1])) return i + 1;
    return len;
}

static int holds_cut(const BpeAddedSet* s) {
    for (uint32_t k = 0; k < s->n; k++)
        for (uint32_t i = 0; i + 1 < s->v[k].len; i++)
            if (cut_between(s->v[k].bytes[i], s->v[k].bytes[i + 1])) return 1;
    return 0;
}

// ---------- character classes ----------

// Unicode White_Space: \s in GPT-2's `regex` module, in Hugging Face tokenizers' Oniguruma and in
// tiktoken (not JavaScript's \s, which adds U+FEFF and drops U+0085). Unchanged since Unicode 6.3.
static int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static const unsigned char ASCII_CLASS[128] = {
    // the common case without a search
    ['\t' ... '\r'] = UC_WS, [' '] = UC_WS, ['0' ... '9'] = UC_N, ['A' ... 'Z'] = UC_L, ['a' ... 'z'] = UC_L,
};

static inline int char_class(uint32_t c) {
    if (c < 0x80) return ASCII_CLASS[c];
    if (is_white_space(c)) return UC_WS;
    size_t lo = 0, hi = sizeof UC_RANGES / sizeof UC_RANGES[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < UC_RANGES[mid].first)
            hi = mid;
        else if (c > UC_RANGES[mid].last)
            lo = mid + 1;
        else
            return UC_RANGES[mid].cls;
    }
    return UC_OTHER;
}

static inline int class_at(const Model* m, const uint8_t* s, size_t i, int* n) {
    if (s[i] < 0x80) {
        *n = 1;
        return ASCII_CLASS[s[i]];
    }
    uint32_t c = utf8_decode(s + i, n);
    return c < 0x10000 ? m->bmp_class[c] : char_class(c);
}

// The class of every character below U+10000, for the scanners: most text needs no search then.
static void build_classes(Model* m) {
    m->bmp_class = xmalloc(0x10000);
    for (uint32_t c = 0; c < 0x10000; c++) m->bmp_class[c] = (uint8_t)char_class(c);
}

void bpe_model_finish(BpeModel* m) {
    m->uncut = holds_cut(&m->added_normalized);
    build_classes(m);
}

void bpe_model_free(BpeModel* m) {
    free(m->merges);
    free(m->bytes);
    free(m->offset);
    free(m->vocab_slots);
    free(m->bmp_class);
    free(m->added.v);
    free(m->added_normalized.v);
    free(m->normalized_bytes);
    memset(m, 0, sizeof *m);
}

// ---------- pre-tokenization ----------
// Each scanner returns where the piece starting at i ends. `end` is the end of this span; nonspace_after
// says the section goes on past it with a non-space character (how spans are cut), which decides the
// (?!\S) lookahead at the span's end.

// 's|'t|'re|'ve|'m|'ll|'d, or with fold (?i:...) of them: the letters are ASCII, so | 0x20 folds them
// exactly (only 'S' and 's' become 's', and so on).
static size_t contraction_end(const uint8_t* s, size_t i, size_t end, uint8_t fold) {
    if (i + 1 >= end) return 0;
    uint8_t a = s[i + 1] | fold;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= end) return 0;
    uint8_t b = s[i + 2] | fold;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

static size_t run_end(const Model* m, const uint8_t* s, size_t j, size_t end, int cls) {
    int n;
    while (j < end && class_at(m, s, j, &n) == cls) j += (size_t)n;
    return j;
}

static int is_newline(uint8_t c) { return c == '\r' || c == '\n'; }

// A whitespace run at i: with newlines (crlf, \s*[\r\n]+) up to just after its last \r or \n; else the run,
// minus its last character when a non-space follows (\s+(?!\S): that one joins the next piece or stands
// alone), but never less than one character (\s+).
static size_t space_end(const Model* m, const uint8_t* s, size_t i, size_t end, int nonspace_after, int crlf) {
    size_t j = i, last = i, after_newline = 0;
    int n;
    while (j < end && class_at(m, s, j, &n) == UC_WS) {
        if (is_newline(s[j])) after_newline = j + 1;
        last = j;
        j += (size_t)n;
    }
    if (crlf && after_newline) return after_newline;
    if (j == end && !nonspace_after) return j;
    return last > i ? last : j;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static size_t piece_end_gpt2(const Model* m, const uint8_t* s, size_t i, size_t end, int nonspace_after) {
    int n;
    if (s[i] == '\'') {
        size_t e = contraction_end(s, i, end, 0);
        if (e) return e;
    }
    int cls = class_at(m, s, i, &n);
    size_t j = i + (size_t)n;
    if (s[i] == ' ' && j < end) {
        int n2, next = class_at(m, s, j, &n2);
        if (next != UC_WS) return run_end(m, s, j, end, next);
    }
    if (cls != UC_WS) return run_end(m, s, j, end, cls);
    return space_end(m, s, i, end, nonspace_after, 0);
}

// Llama 3 (digits = 3) and Qwen2 (digits = 1):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with \p{N} in place of \p{N}{1,3} for Qwen2. The alternatives in order: a contraction; letters, after one
// character that is neither a newline, a letter nor a number; up to `digits` numbers; punctuation (other),
// after an optional space, and the newlines right after it; whitespace.
static size_t piece_end_llama3(const Model* m, const uint8_t* s, size_t i, size_t end, int nonspace_after, int digits) {
    int n, n2;
    if (s[i] == '\'') {
        size_t e = contraction_end(s, i, end, 0x20);
        if (e) return e;
    }
    int cls = class_at(m, s, i, &n);
    size_t j = i + (size_t)n;
    if (cls == UC_L) return run_end(m, s, j, end, UC_L);
    if (cls == UC_N) {
        for (int k = 1; k < digits && j < end && class_at(m, s, j, &n2) == UC_N; k++) j += (size_t)n2;
        return j;
    }
    int next = j < end ? class_at(m, s, j, &n2) : -1;
    if (!is_newline(s[i]) && next == UC_L) return run_end(m, s, j + (size_t)n2, end, UC_L);
    if (cls == UC_OTHER || (s[i] == ' ' && next == UC_OTHER)) {
        size_t k = run_end(m, s, j, end, UC_OTHER);
        while (k < end && is_newline(s[k])) k++;
        return k;
    }
    return space_end(m, s, i, end, nonspace_after, 1);
}

static size_t piece_end(const Model* m, const uint8_t* s, size_t i, size_t end, int nonspace_after) {
    switch (m->pattern) {
    case BPE_PATTERN_LLAMA3: return piece_end_llama3(m, s, i, end, nonspace_after, 3);
    case BPE_PATTERN_QWEN2: return piece_end_llama3(m, s, i, end, nonspace_after, 1);
    default: return piece_end_gpt2(m, s, i, end, nonspace_after);
    }
}

// ---------- BPE ----------

typedef BpeTokens Tokens;

void bpe_tokens_push(BpeTokens* t, uint32_t id) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->v = xrealloc(t->v, t->cap * sizeof *t->v);
    }
    t->v[t->n++] = id;
}

typedef struct {
    uint32_t rank;
    uint32_t pos;
    uint32_t a, b;
} HeapItem;

typedef struct {   // per-thread scratch for merging one piece
    uint32_t* id;
    uint32_t* rank;   // naive: rank of (id[i], id[i+1])
    int32_t *prev, *next;   // heap: linked list over the piece's symbols
    HeapItem* heap;
    size_t cap, heap_cap;
} Scratch;

static void scratch_reserve(Scratch* s, size_t n) {
    if (n <= s->cap) return;
    s->cap = n * 2;
    s->id = xrealloc(s->id, s->cap * sizeof *s->id);
    s->rank = xrealloc(s->rank, s->cap * sizeof *s->rank);
    s->prev = xrealloc(s->prev, s->cap * sizeof *s->prev);
    s->next = xrealloc(s->next, s->cap * sizeof *s->next);
}

static uint32_t pair_rank(const Model* m, uint32_t a, uint32_t b) {
    const MergeSlot* s = merge_find(m, a, b);
    return s ? s->rank : EMPTY;
}

// Lowest rank first, leftmost among equals: the order of encoder.py's merge-all-occurrences loop and of
// Hugging Face's priority queue, because a pair containing a freshly merged token always ranks after the
// merge that made it.
static size_t bpe_naive(const Model* m, uint32_t* id, uint32_t* rank, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)   // the table is megabytes: its misses overlap when asked for together
        __builtin_prefetch(&m->merges[hash64((uint64_t)id[i] << 32 | id[i + 1]) & m->merge_mask]);
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(m, id[i], id[i + 1]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == EMPTY) break;
        id[best] = merge_find(m, id[best], id[best + 1])->merged;
        memmove(id + best + 1, id + best + 2, (n - best - 2) * sizeof *id);
        memmove(rank + best + 1, rank + best + 2, (n - best - 2) * sizeof *rank);
        n--;
        if (best + 1 < n)
            rank[best] = pair_rank(m, id[best], id[best + 1]);
        else
            rank[best] = EMPTY;
        if (best > 0) rank[best - 1] = pair_rank(m, id[best - 1], id[best]);
    }
    return n;
}

static int heap_less(const HeapItem* x, const HeapItem* y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(Scratch* s, size_t* len, HeapItem it) {
    if (*len == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 1024;
        s->heap = xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
    }
    size_t i = (*len)++;
    while (i > 0 && heap_less(&it, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = it;
}

static HeapItem heap_pop(Scratch* s, size_t* len) {
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

static void heap_offer(const Model* m, Scratch* s, size_t* len, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0) return;
    const MergeSlot* ms = merge_find(m, s->id[pos], s->id[nx]);
    if (ms) heap_push(s, len, (HeapItem){ms->rank, (uint32_t)pos, s->id[pos], s->id[nx]});
}

// Same order as bpe_naive in O(n log n), for the occasional long piece (a line of '=' or a base64 blob).
// Stale heap entries are recognised by their ids no longer matching the list.
static size_t bpe_heap(const Model* m, Scratch* s, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) heap_offer(m, s, &len, (int32_t)i);
    while (len) {
        HeapItem it = heap_pop(s, &len);
        int32_t p = (int32_t)it.pos, q = s->next[p];
        if (s->prev[p] == -2 || q < 0 || s->id[p] != it.a || s->id[q] != it.b) continue;
        s->id[p] = merge_find(m, it.a, it.b)->merged;
        s->next[p] = s->next[q];
        if (s->next[q] >= 0) s->prev[s->next[q]] = p;
        s->prev[q] = -2;   // marks a removed symbol
        if (s->prev[p] >= 0) heap_offer(m, s, &len, s->prev[p]);
        heap_offer(m, s, &len, p);
    }
    size_t k = 0;
    for (int32_t p = 0; p >= 0; p = s->next[p]) s->id[k++] = s->id[p];
    return k;
}

// ---------- per-thread piece cache ----------

typedef struct {
    uint64_t hash;
    uint32_t key_off, ids_off;
    uint16_t key_len, ids_len;
} CacheSlot;

typedef struct {
    CacheSlot* slots;
    uint8_t* keys;
    uint32_t* ids;
    size_t used, keys_used, ids_used;
} Cache;

#define CACHE_KEY_BYTES (CACHE_SLOTS * 16u)
#define CACHE_IDS (CACHE_SLOTS * 8u)

static void cache_clear(Cache* c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->used = c->keys_used = c->ids_used = 0;
}

static void cache_init(Cache* c) {
    c->slots = xmalloc(CACHE_SLOTS * sizeof *c->slots);
    c->keys = xmalloc(CACHE_KEY_BYTES);
    c->ids = xmalloc(CACHE_IDS * sizeof *c->ids);
    cache_clear(c);
}

static CacheSlot* cache_slot(Cache* c, const uint8_t* p, size_t n, uint64_t h) {
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        CacheSlot* s = &c->slots[i];
        if (!s->hash) return s;
        if (s->hash == h && s->key_len == n && !memcmp(c->keys + s->key_off, p, n)) return s;
    }
}

static void cache_put(Cache* c, CacheSlot* slot, const uint8_t* p, size_t n, uint64_t h, const uint32_t* ids,
                      size_t k) {
    slot->hash = h;
    slot->key_off = (uint32_t)c->keys_used;
    slot->key_len = (uint16_t)n;
    slot->ids_off = (uint32_t)c->ids_used;
    slot->ids_len = (uint16_t)k;
    memcpy(c->keys + c->keys_used, p, n);
    memcpy(c->ids + c->ids_used, ids, k * sizeof *ids);
    c->keys_used += n;
    c->ids_used += k;
    c->used++;
}

// ---------- encoding a span ----------

struct BpeWorker {
    const Model* m;
    Scratch s;
    Cache cache;
    Nfc nfc;
};
typedef BpeWorker Worker;

static void merge_piece(Worker* w, const uint8_t* p, size_t n, CacheSlot* slot, uint64_t h, Tokens* out) {
    scratch_reserve(&w->s, n);
    for (size_t i = 0; i < n; i++) w->s.id[i] = w->m->byte_id[p[i]];
    size_t k = n <= NAIVE_MAX ? bpe_naive(w->m, w->s.id, w->s.rank, n) : bpe_heap(w->m, &w->s, n);
    for (size_t i = 0; i < k; i++) bpe_tokens_push(out, w->s.id[i]);
    if (!slot) return;
    Cache* c = &w->cache;
    if (c->used * 2 >= CACHE_SLOTS || c->keys_used + n > CACHE_KEY_BYTES || c->ids_used + k > CACHE_IDS) {
        cache_clear(c);   // a full reset keeps it simple; the hot words come back within a few KB
        slot = cache_slot(c, p, n, h);
    }
    cache_put(c, slot, p, n, h, w->s.id, k);
}

static void encode_piece(Worker* w, const uint8_t* p, size_t n, Tokens* out) {
    if (n == 1) {
        bpe_tokens_push(out, w->m->byte_id[p[0]]);
        return;
    }
    uint64_t h = hash_bytes(p, n);
    if (w->m->ignore_merges) {
        int64_t id = vocab_find(w->m, p, n, h);
        if (id >= 0) {
            bpe_tokens_push(out, (uint32_t)id);
            return;
        }
    }
    CacheSlot* slot = NULL;
    if (n <= CACHE_MAX_PIECE) {
        slot = cache_slot(&w->cache, p, n, h);
        if (slot->hash) {
            for (size_t i = 0; i < slot->ids_len; i++) bpe_tokens_push(out, w->cache.ids[slot->ids_off + i]);
            return;
        }
    }
    merge_piece(w, p, n, slot, h, out);
}

// Text between added tokens, which the pattern sees as a whole text.
static void encode_pieces(Worker* w, const uint8_t* text, size_t start, size_t end, int nonspace_after, Tokens* out) {
    for (size_t i = start; i < end;) {
        size_t e = piece_end(w->m, text, i, end, nonspace_after);
        encode_piece(w, text + i, e - i, out);
        i = e;
    }
}

// Text between first-pass added tokens: normalized, then split at the second pass's.
static void encode_section(Worker* w, const uint8_t* text, size_t start, size_t end, int nonspace_after, Tokens* out) {
    const uint8_t* s = text + start;
    size_t n = end - start, at, len;
    if (w->m->nfc && nfc_quick_check(s, n) < n) {
        nfc_normalize(&w->nfc, s, n);
        s = w->nfc.text;
        n = w->nfc.len;
    }
    uint32_t id;
    size_t p = 0;
    for (; next_added(&w->m->added_normalized, s, p, n, &at, &len, &id); p = at + len) {
        encode_pieces(w, s, p, at, 0, out);
        bpe_tokens_push(out, id);
    }
    encode_pieces(w, s, p, n, nonspace_after, out);
}

size_t bpe_encode_span(BpeWorker* w, const uint8_t* text, size_t start, size_t end, int nonspace_after,
                       BpeTokens* out) {
    size_t bad = utf8_invalid_at(text + start, end - start);
    if (bad != end - start) return start + bad;
    size_t at, len;
    uint32_t id;
    for (size_t p = start; p < end; p = at + len) {
        if (!bpe_next_added(w->m, text, p, end, &at, &len, &id)) {
            encode_section(w, text, p, end, nonspace_after, out);
            break;
        }
        encode_section(w, text, p, at, 0, out);
        bpe_tokens_push(out, id);
    }
    return SIZE_MAX;
}

BpeWorker* bpe_worker_new(const BpeModel* m) {
    BpeWorker* w = xcalloc(1, sizeof *w);
    w->m = m;
    cache_init(&w->cache);
    return w;
}

void bpe_worker_free(BpeWorker* w) {
    Scratch* s = &w->s;
    free(s->id);
    free(s->rank);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(w->cache.slots);
    free(w->cache.keys);
    free(w->cache.ids);
    nfc_free(&w->nfc);
    free(w);
}
