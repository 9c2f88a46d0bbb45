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

#include "core/tokenizer/bpe.h"

#define BATCH_BYTES (8u << 20)   /* enough work per batch to keep every thread busy */
#define CHUNK_BYTES (64u << 10)  /* small enough to balance, large enough to amortize the split scan */

static int read_exact(FILE *f, void *buf, size_t n) { return fread(buf, 1, n, f) == n; }

/* ---------- encoding a chunk (core/tokenizer/bpe.c) ---------- */

typedef struct {
    size_t doc, start, end;
    int nonspace_after;
    size_t bad_at;   /* offset of invalid UTF-8 within the document, or SIZE_MAX */
    BpeTokens out;
} Chunk;

static void encode_chunk(BpeWorker *w, const uint8_t *doc, Chunk *ch) {
    ch->bad_at = bpe_encode_span(w, doc, ch->start, ch->end, ch->nonspace_after, &ch->out);
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
        b->chunks = bpe_xrealloc(b->chunks, b->cap_chunks * sizeof *b->chunks);
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
    if (fwrite(p, 1, n, stdout) != n) bpe_die("stdout", strerror(errno));
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
                bpe_die(b->docs[d].label, msg);
            }
            ntok += b->chunks[c].out.n;
        }
        write_all(&ntok, sizeof ntok);
        for (size_t k = first; k < c; k++) write_all(b->chunks[k].out.v, b->chunks[k].out.n * sizeof(uint16_t));
    }
    for (size_t k = 0; k < b->nchunks; k++) free(b->chunks[k].out.v);
    for (size_t d = 0; d < b->ndocs; d++) { free(b->docs[d].label); free(b->docs[d].text); }
    b->ndocs = b->bytes = b->nchunks = 0;
    if (fflush(stdout) != 0) bpe_die("stdout", strerror(errno));
}

static void run_batch(Batch *b, BpeWorker **workers) {
    split_docs(b);
    #pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < b->nchunks; k++)
        encode_chunk(workers[omp_get_thread_num()], b->docs[b->chunks[k].doc].text, &b->chunks[k]);
    flush_batch(b);
}

/* ---------- input ---------- */

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) bpe_die(path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) bpe_die(path, strerror(errno));
    if (!S_ISREG(st.st_mode)) bpe_die(path, "not a regular file");
    if (st.st_size == 0) bpe_die(path, "empty file");
    uint8_t *buf = bpe_xmalloc((size_t)st.st_size);
    if (!read_exact(f, buf, (size_t)st.st_size)) bpe_die(path, ferror(f) ? strerror(errno) : "file shrank while reading");
    if (fclose(f) != 0) bpe_die(path, strerror(errno));
    *len = (size_t)st.st_size;
    return buf;
}

/* Reads one document record; returns 0 at a clean end of input. */
static int read_doc(Doc *d) {
    int kind = getchar();
    if (kind == EOF) {
        if (ferror(stdin)) bpe_die("stdin", strerror(errno));   /* a broken pipe is not the end of the corpus */
        return 0;
    }
    uint32_t n;
    if ((kind != 'F' && kind != 'T') || !read_exact(stdin, &n, sizeof n) || n > 65536)
        bpe_die("stdin", "bad document record");
    d->label = bpe_xmalloc(n + 1);
    if (!read_exact(stdin, d->label, n)) bpe_die("stdin", "truncated document record");
    d->label[n] = 0;
    if (kind == 'F') { d->text = read_file(d->label, &d->len); return 1; }
    uint64_t m;
    if (!read_exact(stdin, &m, sizeof m)) bpe_die("stdin", "truncated document record");
    d->text = bpe_xmalloc((size_t)m);
    d->len = (size_t)m;
    if (!read_exact(stdin, d->text, d->len)) bpe_die("stdin", "truncated document record");
    return 1;
}

static void add_doc(Batch *b, Doc d) {
    if (b->ndocs == b->cap_docs) {
        b->cap_docs = b->cap_docs ? 2 * b->cap_docs : 64;
        b->docs = bpe_xrealloc(b->docs, b->cap_docs * sizeof *b->docs);
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
        if (t < 1) bpe_die("-t", "needs a positive thread count");
        omp_set_num_threads(t);
    }
    BpeModel m;
    bpe_model_load(&m, argv[1]);
    int nthreads = omp_get_max_threads();
    BpeWorker **workers = bpe_xmalloc((size_t)nthreads * sizeof *workers);
    for (int t = 0; t < nthreads; t++) workers[t] = bpe_worker_new(&m);
    Batch b = {0};
    Doc d;
    while (read_doc(&d)) {
        add_doc(&b, d);
        if (b.bytes >= BATCH_BYTES) run_batch(&b, workers);
    }
    if (b.ndocs) run_batch(&b, workers);
    return 0;
}
