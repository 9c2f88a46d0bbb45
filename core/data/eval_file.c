// eval_file.c: see eval_file.h.
#include "core/data/eval_file.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

#define EVAL_HEADER_BYTES 1024
// Far above HellaSwag's 3.6 MB; the file is read whole.
#define EVAL_MAX_BYTES (1LL << 30)
// The smallest example: six fields, one context token, four endings of one token each.
#define EVAL_MIN_ELEMENTS (6 + 1 + 2 * EVAL_ENDINGS)

// The elements after the header, as the file stores them.
typedef struct {
    const unsigned char* p;
    long long n;       // elements
    int width;         // 2 or 4 bytes each
    const char* path;
} Elements;

static uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t element(const Elements* e, long long i) {
    const unsigned char* p = e->p + i * e->width;
    return e->width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : le32(p);
}

static unsigned char* read_whole(const char* path, long long* size) {
    FILE* f = xfopen(path, "rb");   // regular files only
    *size = file_size(path);
    if (*size < 0) fail("cannot stat evaluation file %s: %s", path, strerror(errno));
    if (*size < EVAL_HEADER_BYTES)
        fail("evaluation file %s is shorter than its %d-byte header (%lld bytes)", path, EVAL_HEADER_BYTES, *size);
    if (*size > EVAL_MAX_BYTES) fail("evaluation file %s is %lld bytes, more than the %lld it may be", path, *size, EVAL_MAX_BYTES);
    unsigned char* data = (unsigned char*)xmalloc((size_t)*size);
    xfread(data, 1, (size_t)*size, f, path);
    if (fclose(f) != 0) fail("cannot close evaluation file %s: %s", path, strerror(errno));
    return data;
}

// One count field of example i at element at (a length: at least 1, within the example's end).
static int length_at(const Elements* e, long long at, long long end, int i, const char* what) {
    if (at >= end) fail("evaluation file %s: example %d ends before its %s's length", e->path, i, what);
    uint32_t n = element(e, at);
    if (n == 0) fail("evaluation file %s: example %d has an empty %s", e->path, i, what);
    if ((long long)n > end - at - 1)
        fail("evaluation file %s: example %d's %s of %u tokens runs past the example's end", e->path, i, what, n);
    return (int)n;
}

// Checks every token of the part at [at, at + n) against the vocabulary and, when `out`, copies it there.
static void take_tokens(const Elements* e, long long at, int n, int vocab, int i, int* out) {
    for (int k = 0; k < n; k++) {
        uint32_t t = element(e, at + k);
        if (t >= (uint32_t)vocab)
            fail("evaluation file %s: example %d has token %u, outside the model's vocabulary of %d", e->path, i, t, vocab);
        if (out) out[k] = (int)t;
    }
}

// The fixed fields of example i at element *pos: checks them, returns the element past its end.
static long long example_head(const Elements* e, long long pos, int i, EvalExample* ex) {
    uint32_t start = e->width == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    if (pos + 6 > e->n) fail("evaluation file %s is truncated: example %d starts %lld elements before its end", e->path, i, e->n - pos);
    if (element(e, pos) != start)
        fail("evaluation file %s: example %d does not start with the delimiter %u (found %u)", e->path, i, start, element(e, pos));
    uint32_t bytes = element(e, pos + 1);
    if (bytes % (uint32_t)e->width || bytes / (uint32_t)e->width < EVAL_MIN_ELEMENTS)
        fail("evaluation file %s: example %d claims %u bytes, not a whole example", e->path, i, bytes);
    long long end = pos + bytes / (uint32_t)e->width;
    if (end > e->n) fail("evaluation file %s is truncated: example %d ends past the end of the file", e->path, i);
    if (element(e, pos + 2) != (uint32_t)i)
        fail("evaluation file %s: example %d carries the index %u", e->path, i, element(e, pos + 2));
    uint32_t label = element(e, pos + 3), endings = element(e, pos + 4);
    if (label >= EVAL_ENDINGS) fail("evaluation file %s: example %d has label %u, outside 0..3", e->path, i, label);
    if (endings != EVAL_ENDINGS) fail("evaluation file %s: example %d has %u endings, not 4", e->path, i, endings);
    ex->label = (int)label;
    return end;
}

// Example i at element pos: checked whole, its lengths into *ex, its tokens into out when not NULL.
// Returns the element after it.
static long long parse_example(const Elements* e, long long pos, int i, int vocab, EvalExample* ex, int* out) {
    long long end = example_head(e, pos, i, ex), at = pos + 5;
    ex->context = length_at(e, at, end, i, "context");
    take_tokens(e, at + 1, ex->context, vocab, i, out);
    at += 1 + ex->context;
    long long taken = ex->context;
    for (int k = 0; k < EVAL_ENDINGS; k++) {
        char what[24];   // room for any int, so no compiler sees a truncation
        snprintf(what, sizeof what, "ending %d", k);
        ex->ending[k] = length_at(e, at, end, i, what);
        take_tokens(e, at + 1, ex->ending[k], vocab, i, out ? out + taken : NULL);
        at += 1 + ex->ending[k];
        taken += ex->ending[k];
    }
    if (at != end) fail("evaluation file %s: example %d claims %lld bytes, its fields take %lld", e->path, i,
                        (end - pos) * e->width, (at - pos) * e->width);
    return end;
}

static int longest_ending(const EvalExample* ex) {
    int m = 0;
    for (int k = 0; k < EVAL_ENDINGS; k++) m = ex->ending[k] > m ? ex->ending[k] : m;
    return m;
}

// The header's fields: the element width, and the example count and longest example it claims.
static Elements read_header(const unsigned char* data, long long size, const char* path, int* count, long long* longest) {
    int32_t magic = (int32_t)le32(data), version = (int32_t)le32(data + 4);
    if (magic != EVAL_MAGIC)
        fail("evaluation file %s has wrong magic %d (expected %d: a file from scripts/prepare_hellaswag.py)", path, magic, EVAL_MAGIC);
    if (version != 1 && version != 2) fail("evaluation file %s has version %d (expected 1: uint16, or 2: uint32)", path, version);
    Elements e = {data + EVAL_HEADER_BYTES, 0, version == 1 ? 2 : 4, path};
    if ((size - EVAL_HEADER_BYTES) % e.width) fail("evaluation file %s ends in the middle of an element", path);
    e.n = (size - EVAL_HEADER_BYTES) / e.width;
    *count = (int32_t)le32(data + 8);
    *longest = (int32_t)le32(data + 12);
    if (*count < 1) fail("evaluation file %s has %d examples in its header", path, *count);
    if (*count > e.n / EVAL_MIN_ELEMENTS)
        fail("evaluation file %s is truncated: its header says %d examples, its %lld bytes hold at most %lld", path, *count,
             size, e.n / EVAL_MIN_ELEMENTS);
    return e;
}

void eval_file_read(EvalFile* ef, const char* path, int vocab, int max_len) {
    memset(ef, 0, sizeof(*ef));
    long long size, longest, seen = 0;
    int count;
    unsigned char* data = read_whole(path, &size);
    Elements e = read_header(data, size, path, &count, &longest);
    ef->width = e.width;
    ef->examples = (EvalExample*)xmalloc((size_t)count * sizeof(EvalExample));
    ef->tokens = (int*)xmalloc((size_t)e.n * sizeof(int));   // more than every example's tokens
    long long pos = 0, used = 0;
    for (int i = 0; i < count; i++) {
        EvalExample* ex = &ef->examples[ef->count];
        long long next = parse_example(&e, pos, i, vocab, ex, ef->tokens + used);
        if ((next - pos) * e.width > seen) seen = (next - pos) * e.width;
        pos = next;
        if (ex->context + longest_ending(ex) > max_len) {
            ef->dropped++;
            continue;
        }
        ex->first = used;
        used += ex->context;
        for (int k = 0; k < EVAL_ENDINGS; k++) used += ex->ending[k];
        ef->count++;
    }
    if (pos != e.n) fail("evaluation file %s has %lld bytes after its last example", path, (e.n - pos) * e.width);
    if (longest != seen) fail("evaluation file %s: its header says the longest example is %lld bytes, it is %lld", path, longest, seen);
    free(data);
}

void eval_file_free(EvalFile* ef) {
    free(ef->examples);
    free(ef->tokens);
    memset(ef, 0, sizeof(*ef));
}

const int* eval_example_tokens(const EvalFile* ef, const EvalExample* e, int ending, int* n) {
    long long at = e->first;
    if (ending < 0) {
        *n = e->context;
        return ef->tokens + at;
    }
    at += e->context;
    for (int k = 0; k < ending; k++) at += e->ending[k];
    *n = e->ending[ending];
    return ef->tokens + at;
}
