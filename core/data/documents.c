// documents.c: see documents.h.
#include "core/data/documents.h"

#include <errno.h>

#include "base/common.h"
#include "core/data/packing.h"

#define MASK_MAGIC 20261129
#define MASK_VERSION 1
#define MASK_HEADER_BYTES 1024
#define SCAN_CHUNK (1 << 16)

// X.mask for X.bin (a path without ".bin" gains ".mask").
static char* mask_path_of(const char* shard) {
    size_t n = strlen(shard);
    if (n >= 4 && !strcmp(shard + n - 4, ".bin")) n -= 4;
    char* p = xmalloc(n + 6);
    memcpy(p, shard, n);
    memcpy(p + n, ".mask", 6);
    return p;
}

int documents_find_masks(Shard* shards, int n, const char* pattern) {
    int with = -1, without = -1;
    for (int i = 0; i < n; i++) {
        char* m = mask_path_of(shards[i].path);
        if (file_size(m) >= 0) {
            shards[i].mask_path = m;
            if (with < 0) with = i;
        } else {
            free(m);
            if (without < 0) without = i;
        }
    }
    if (with >= 0 && without >= 0)
        fail("token shards %s: %s has a mask file (%s) but %s has none; a document dataset has one beside every shard "
             "(run tokenize.py again)", pattern, shards[with].path, shards[with].mask_path, shards[without].path);
    return with >= 0;
}

static uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Opens a shard's mask file positioned at its first byte, its header and size checked against the shard.
static FILE* open_mask(const Shard* s) {
    const char* path = s->mask_path;
    FILE* f = xfopen(path, "rb");
    long long size = file_size(path);
    if (size < MASK_HEADER_BYTES)
        fail("mask file %s is shorter than its %d-byte header (%lld bytes)", path, MASK_HEADER_BYTES, size);
    unsigned char h[MASK_HEADER_BYTES];
    xfread(h, 1, sizeof h, f, path);
    int32_t magic = (int32_t)le32(h), version = (int32_t)le32(h + 4), ntok = (int32_t)le32(h + 8);
    uint64_t set = (uint64_t)le32(h + 12) | (uint64_t)le32(h + 16) << 32;
    if (magic != MASK_MAGIC) fail("mask file %s has wrong magic %d (expected %d)", path, magic, MASK_MAGIC);
    if (version != MASK_VERSION) fail("mask file %s has wrong version %d (expected %d)", path, version, MASK_VERSION);
    if (ntok != s->ntok)
        fail("mask file %s is for %d tokens but its shard %s holds %lld: they are not one pair (run tokenize.py again)", path,
             ntok, s->path, s->ntok);
    if (set != s->set)
        fail("mask file %s belongs to set %016llx but its shard %s to set %016llx: they are not one pair (run tokenize.py "
             "again)", path, (unsigned long long)set, s->path, (unsigned long long)s->set);
    if (size != MASK_HEADER_BYTES + s->ntok)
        fail("mask file %s has %lld bytes, its header and %lld tokens make %lld", path, size, s->ntok,
             MASK_HEADER_BYTES + s->ntok);
    return f;
}

// The documents of a split, in stream order.
typedef struct {
    long long *start, *len;
    int* trained;   // labels among the first T tokens
    long long count, cap;
} DocList;

static void doc_push(DocList* d, long long start) {
    if (d->count == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 1024;
        d->start = xrealloc(d->start, (size_t)d->cap * sizeof *d->start);
        d->len = xrealloc(d->len, (size_t)d->cap * sizeof *d->len);
        d->trained = xrealloc(d->trained, (size_t)d->cap * sizeof *d->trained);
    }
    d->start[d->count] = start;
    d->len[d->count] = 0;
    d->trained[d->count++] = 0;
}

static void check_byte(const Shard* s, long long i, uint8_t b) {
    if (b & ~(MASK_TRAINED | MASK_DOC_START))
        fail("mask file %s: byte %d at token %lld (only 1, a label, and 2, a document start, are defined)", s->mask_path, b, i);
    if ((b & MASK_TRAINED) && (b & MASK_DOC_START))
        fail("mask file %s: token %lld starts a document and is a label (a document's first token has no label)",
             s->mask_path, i);
    if (i == 0 && !(b & MASK_DOC_START))
        fail("mask file %s: its first token does not start a document (a document never spans two shards)", s->mask_path);
}

static void scan_shard(const Shard* s, long long bt, long long windows, long long* win_trained, int T, DocList* docs,
                       uint8_t* buf) {
    FILE* f = open_mask(s);
    for (long long i0 = 0; i0 < s->ntok; i0 += SCAN_CHUNK) {
        long long n = s->ntok - i0 < SCAN_CHUNK ? s->ntok - i0 : SCAN_CHUNK;
        xfread(buf, 1, (size_t)n, f, s->mask_path);
        for (long long k = 0; k < n; k++) {
            long long i = i0 + k, p = s->first + i;
            check_byte(s, i, buf[k]);
            if (buf[k] & MASK_DOC_START) doc_push(docs, p);
            if (!(buf[k] & MASK_TRAINED)) continue;
            long long d = docs->count - 1;
            if (p - docs->start[d] < T) docs->trained[d]++;
            if (win_trained && p >= 1 && (p - 1) / bt < windows) win_trained[(p - 1) / bt]++;
        }
    }
    if (fclose(f) != 0) fail("cannot close mask file %s: %s", s->mask_path, strerror(errno));
}

// Best fit over the documents that fit (cut to T with truncate_long), then each row's documents in order.
static void pack(const DocList* docs, int T, int truncate_long, Packing* pk, long long** row_trained, PackStats* st) {
    int* len = xmalloc((size_t)(docs->count ? docs->count : 1) * sizeof *len);
    long long* idx = xmalloc((size_t)(docs->count ? docs->count : 1) * sizeof *idx);
    long long n = 0;
    for (long long k = 0; k < docs->count; k++) {
        int is_long = docs->len[k] > T;
        st->long_docs += is_long;
        if (is_long && !truncate_long) continue;
        len[n] = is_long ? T : (int)docs->len[k];
        idx[n++] = k;
    }
    st->docs = docs->count;
    long long* row_of = xmalloc((size_t)(n ? n : 1) * sizeof *row_of);
    int* at = xmalloc((size_t)(n ? n : 1) * sizeof *at);
    pk->rows = packing_best_fit(len, n, T, row_of, at);
    pk->first = xcalloc((size_t)pk->rows + 1, sizeof *pk->first);
    pk->start = xmalloc((size_t)(n ? n : 1) * sizeof *pk->start);
    pk->len = xmalloc((size_t)(n ? n : 1) * sizeof *pk->len);
    *row_trained = xcalloc((size_t)(pk->rows ? pk->rows : 1), sizeof **row_trained);
    for (long long i = 0; i < n; i++) pk->first[row_of[i] + 1]++;
    for (long long r = 0; r < pk->rows; r++) pk->first[r + 1] += pk->first[r];
    long long* fill = xmalloc((size_t)(pk->rows ? pk->rows : 1) * sizeof *fill);
    memcpy(fill, pk->first, (size_t)pk->rows * sizeof *fill);
    for (long long i = 0; i < n; i++) {   // in stream order: each row's documents in the order they were put in
        long long slot = fill[row_of[i]]++;
        pk->start[slot] = docs->start[idx[i]];
        pk->len[slot] = len[i];
        (*row_trained)[row_of[i]] += docs->trained[idx[i]];
        st->used += len[i];
    }
    st->rows = pk->rows;
    free(fill), free(row_of), free(at), free(len), free(idx);
}

void documents_scan(const Shard* shards, int n, long long bt, long long windows, long long* win_trained, int T,
                    int truncate_long, Packing* pk, long long** row_trained, PackStats* stats) {
    DocList docs = {0};
    uint8_t* buf = xmalloc(SCAN_CHUNK);
    for (int i = 0; i < n; i++) scan_shard(&shards[i], bt, windows, win_trained, T, &docs, buf);
    free(buf);
    for (long long k = 0; k < docs.count; k++)
        docs.len[k] = (k + 1 < docs.count ? docs.start[k + 1] : shards[n - 1].first + shards[n - 1].ntok) - docs.start[k];
    if (pk) pack(&docs, T, truncate_long, pk, row_trained, stats);
    free(docs.start), free(docs.len), free(docs.trained);
}

void documents_free(Packing* pk) {
    free(pk->first), free(pk->start), free(pk->len);
    memset(pk, 0, sizeof *pk);
}
