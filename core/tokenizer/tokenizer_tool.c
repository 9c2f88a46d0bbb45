// tokenizer_tool.c, built as build/tokenizer: the hot loop of scripts/tokenize.py, pre-tokenization and
// byte-level BPE (core/tokenizer/bpe.c).
//
// usage: tokenizer MODEL [-t THREADS] [-w 2|4]   encode
//        tokenizer MODEL --info                "vocab_size V" and "doc_start ID" lines (tokenizer.json only)
//        tokenizer MODEL --decode              uint32 ids on stdin -> their bytes on stdout (tokenizer.json only)
//   MODEL   a Hugging Face tokenizer.json (core/tokenizer/tokenizer_json.c says which), or GPT-2's merges in
//           the compact form scripts/tokenize.py writes (core/tokenizer/tokenizer_file.h; the script owns the
//           sha256 check of GPT-2's files)
//   stdin   documents: 'F' u32 n path[n]            (the helper reads the file itself)
//                      'T' u32 n label[n] u64 m text[m]
//   stdout  per document, in input order: u64 ntok, then ntok token ids of -w bytes each (default 2)
// Invalid UTF-8, an unreadable/empty file or ids wider than -w end the run with one "error: ..." line on
// stderr, exit 1.
//
// Work is parallel over chunks of a batch of documents. The added tokens of the first pass are found first,
// one pass over each document; the sections between them are cut only where bpe_next_cut says the encoding
// cannot change, so the output does not depend on the thread count or the chunking.
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "core/tokenizer/tokenizer_file.h"

#define BATCH_BYTES (8u << 20)   // enough work per batch to keep every thread busy
#define CHUNK_BYTES (64u << 10)   // small enough to balance, large enough to amortize the split scan

static int read_exact(FILE* f, void* buf, size_t n) { return fread(buf, 1, n, f) == n; }

// ---------- encoding a chunk (core/tokenizer/bpe.c) ----------

typedef struct {
    size_t doc, start, end;
    int nonspace_after;
    size_t bad_at;   // offset of invalid UTF-8 within the document, or SIZE_MAX
    BpeTokens out;
} Chunk;

static void encode_chunk(BpeWorker* w, const uint8_t* doc, Chunk* ch) {
    ch->bad_at = bpe_encode_span(w, doc, ch->start, ch->end, ch->nonspace_after, &ch->out);
}

// ---------- batches of documents ----------

typedef struct {
    char* label;
    uint8_t* text;
    size_t len;
} Doc;

typedef struct {
    Doc* docs;
    size_t ndocs, cap_docs, bytes;
    Chunk* chunks;
    size_t nchunks, cap_chunks;
} Batch;

static void add_chunk(Batch* b, size_t doc, size_t start, size_t end, int nonspace_after) {
    if (b->nchunks == b->cap_chunks) {
        b->cap_chunks = b->cap_chunks ? 2 * b->cap_chunks : 256;
        b->chunks = xrealloc(b->chunks, b->cap_chunks * sizeof *b->chunks);
    }
    b->chunks[b->nchunks++] = (Chunk){doc, start, end, nonspace_after, SIZE_MAX, {0}};
}

// A section, text between added tokens: its end is the end of a text to the pattern.
static void split_section(Batch* b, const BpeModel* m, size_t d, const uint8_t* text, size_t start, size_t end) {
    while (start < end) {
        size_t cut = end - start > 2 * CHUNK_BYTES ? bpe_next_cut(m, text, start + CHUNK_BYTES, end) : end;
        add_chunk(b, d, start, cut, cut < end);
        start = cut;
    }
}

static void split_docs(Batch* b, const BpeModel* m) {
    b->nchunks = 0;
    for (size_t d = 0; d < b->ndocs; d++) {
        const Doc* doc = &b->docs[d];
        size_t p = 0, at, len;
        uint32_t id;
        while (bpe_next_added(m, doc->text, p, doc->len, &at, &len, &id)) {
            split_section(b, m, d, doc->text, p, at);
            add_chunk(b, d, at, at + len, 0);   // the added token alone, which encodes to its id
            p = at + len;
        }
        split_section(b, m, d, doc->text, p, doc->len);
    }
}

static void write_all(const void* p, size_t n) {
    if (fwrite(p, 1, n, stdout) != n) fail("stdout: %s", strerror(errno));
}

// A chunk's ids at `width` bytes each (the caller checked that they fit).
static void write_ids(const BpeTokens* t, int width) {
    if (width == 4) {
        write_all(t->v, t->n * sizeof *t->v);
        return;
    }
    uint16_t narrow[4096];
    for (size_t i = 0; i < t->n; i += 4096) {
        size_t k = t->n - i < 4096 ? t->n - i : 4096;
        for (size_t j = 0; j < k; j++) narrow[j] = (uint16_t)t->v[i + j];
        write_all(narrow, k * sizeof *narrow);
    }
}

// Emits each document's ids (or stops at the first bad document) and frees the batch.
static void flush_batch(Batch* b, int width) {
    size_t c = 0;
    for (size_t d = 0; d < b->ndocs; d++) {
        uint64_t ntok = 0;
        size_t first = c;
        for (; c < b->nchunks && b->chunks[c].doc == d; c++) {
            if (b->chunks[c].bad_at != SIZE_MAX) {
                fail("%s: not valid UTF-8 at byte %zu", b->docs[d].label, b->chunks[c].bad_at);
            }
            ntok += b->chunks[c].out.n;
        }
        write_all(&ntok, sizeof ntok);
        for (size_t k = first; k < c; k++) write_ids(&b->chunks[k].out, width);
    }
    for (size_t k = 0; k < b->nchunks; k++) free(b->chunks[k].out.v);
    for (size_t d = 0; d < b->ndocs; d++) {
        free(b->docs[d].label);
        free(b->docs[d].text);
    }
    b->ndocs = b->bytes = b->nchunks = 0;
    if (fflush(stdout) != 0) fail("stdout: %s", strerror(errno));
}

static void run_batch(Batch* b, const BpeModel* m, BpeWorker** workers, int width) {
    split_docs(b, m);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < b->nchunks; k++)
        encode_chunk(workers[omp_get_thread_num()], b->docs[b->chunks[k].doc].text, &b->chunks[k]);
    flush_batch(b, width);
}

// ---------- input ----------

static uint8_t* read_file(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    if (!f) fail("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) fail("%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", path);
    if (st.st_size == 0) fail("%s: empty file", path);
    uint8_t* buf = xmalloc((size_t)st.st_size);
    if (!read_exact(f, buf, (size_t)st.st_size))
        fail("%s: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
    if (fclose(f) != 0) fail("%s: %s", path, strerror(errno));
    *len = (size_t)st.st_size;
    return buf;
}

// Reads one document record; returns 0 at a clean end of input.
static int read_doc(Doc* d) {
    int kind = getchar();
    if (kind == EOF) {
        if (ferror(stdin)) fail("stdin: %s", strerror(errno));   // a broken pipe is not the end of the corpus
        return 0;
    }
    uint32_t n;
    if ((kind != 'F' && kind != 'T') || !read_exact(stdin, &n, sizeof n) || n > 65536)
        fail("stdin: bad document record");
    d->label = xmalloc(n + 1);
    if (!read_exact(stdin, d->label, n)) fail("stdin: truncated document record");
    d->label[n] = 0;
    if (kind == 'F') {
        d->text = read_file(d->label, &d->len);
        return 1;
    }
    uint64_t m;
    if (!read_exact(stdin, &m, sizeof m)) fail("stdin: truncated document record");
    d->text = xmalloc((size_t)m);
    d->len = (size_t)m;
    if (!read_exact(stdin, d->text, d->len)) fail("stdin: truncated document record");
    return 1;
}

static void add_doc(Batch* b, Doc d) {
    if (b->ndocs == b->cap_docs) {
        b->cap_docs = b->cap_docs ? 2 * b->cap_docs : 64;
        b->docs = xrealloc(b->docs, b->cap_docs * sizeof *b->docs);
    }
    b->docs[b->ndocs++] = d;
    b->bytes += d.len;
}

// ---------- --info and --decode ----------

static void need_table(const BpeModel* m, const char* path, const char* flag) {
    if (!m->vocab_size) fail("%s: %s needs a tokenizer.json (this is a compact merges file)", path, flag);
}

static void print_info(const BpeModel* m) {
    if (printf("vocab_size %u\ndoc_start %u\n", m->vocab_size, m->doc_start) < 0 || fflush(stdout) != 0)
        fail("stdout: %s", strerror(errno));
}

static void decode(const BpeModel* m) {
    uint32_t id;
    for (size_t k = 0; read_exact(stdin, &id, sizeof id); k++) {
        size_t len;
        const uint8_t* p = bpe_token_bytes(m, id, &len);
        if (!p) fail("stdin: id %u (the %zu-th) is not below the vocabulary size %u", id, k, m->vocab_size);
        write_all(p, len);
    }
    if (ferror(stdin)) fail("stdin: %s", strerror(errno));
    if (fflush(stdout) != 0) fail("stdout: %s", strerror(errno));
}

static void encode(const BpeModel* m, int width) {
    int nthreads = omp_get_max_threads();
    BpeWorker** workers = xmalloc((size_t)nthreads * sizeof *workers);
    for (int t = 0; t < nthreads; t++) workers[t] = bpe_worker_new(m);
    Batch b = {0};
    Doc d;
    while (read_doc(&d)) {
        add_doc(&b, d);
        if (b.bytes >= BATCH_BYTES) run_batch(&b, m, workers, width);
    }
    if (b.ndocs) run_batch(&b, m, workers, width);
}

static int usage(void) {
    fprintf(
        stderr,
        "usage: tokenizer MODEL [-t THREADS] [-w 2|4] | MODEL --info | MODEL --decode  (see scripts/tokenize.py)\n");
    return 2;
}

int main(int argc, char** argv) {
    if (argc < 2) return usage();
    int width = 2, mode = 0;   // 0: encode, 1: --info, 2: --decode
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--info") || !strcmp(argv[i], "--decode"))
            mode = argv[i][2] == 'i' ? 1 : 2;
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            int t = atoi(argv[++i]);
            if (t < 1) fail("-t needs a positive thread count");
            omp_set_num_threads(t);
        } else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
            width = atoi(argv[++i]);
            if (width != 2 && width != 4) fail("-w takes 2 or 4 (bytes per id)");
        } else
            return usage();
    }
    BpeModel m;
    tokenizer_file_load(&m, argv[1]);
    if (mode) need_table(&m, argv[1], mode == 1 ? "--info" : "--decode");
    if (mode == 1)
        print_info(&m);
    else if (mode == 2)
        decode(&m);
    else if (width == 2 && m.vocab_size > 65536)
        fail("%s: -w 2 cannot hold the ids of its %u-token vocabulary: use -w 4", argv[1], m.vocab_size);
    else
        encode(&m, width);
    bpe_model_free(&m);
    return 0;
}
