// state_file.c: the optimizer state files of a checkpoint. See state_file.h.
#include "core/checkpoint/state_file.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/crc32.h"
#include "core/util/fs.h"

typedef struct {
    long long h[8];
} StateHeader;

typedef struct {
    Backend* be;
    const ModelState* ms;
    DType dt;
    FILE* f;
    const char* path;
    long long spans;
    Crc32* crc;   // of every byte written, for the manifest
} StateWriter;

static void count_span(const StateSpan* s, void* ctx) { ((StateWriter*)ctx)->spans++; }

static void state_write(StateWriter* w, const void* p, size_t bytes) {
    xfwrite(p, 1, bytes, w->f, w->path);
    crc32_add(w->crc, p, bytes);
}

static void write_span(const StateSpan* s, void* ctx) {
    StateWriter* w = (StateWriter*)ctx;
    size_t n = s->n;
    long long span[2] = {(long long)tensor_canonical(s->t, s->flat - s->t->offset), (long long)n};   // inside one run
    state_write(w, span, sizeof(span));
    float* buf = (float*)xmalloc(n * sizeof(float));
    for (int b = 0; b < optimizer_buffers(optimizer_kind(s->optimizer)); b++) {
        span_to_host(w->ms, w->be, s, span_optimizer_buffer(b), buf);
        state_write(w, buf, n * sizeof(float));
    }
    if (w->dt != DT_FP32) {
        span_to_host(w->ms, w->be, s, SPAN_PARAMS, buf);
        state_write(w, buf, n * dtype_size(w->dt));
    }
    free(buf);
}

uint32_t state_file_write(const ModelState* ms, Backend* be, const char* path, int world_rank, int dp, int zero_stage) {
    Crc32* crc = (Crc32*)xmalloc(sizeof(Crc32));
    crc32_begin(crc);
    StateWriter w = {be, ms, ms->dt, xfopen(path, "wb"), path, 0, crc};
    ms->for_each_span(ms->ctx, STATE_CHECKPOINT, count_span, &w);
    StateHeader h = {{STATE_MAGIC, 2, (long long)shape_param_count(&ms->lay->shape), w.spans, ms->dt, world_rank, dp, zero_stage}};
    state_write(&w, &h, sizeof(h));
    ms->for_each_span(ms->ctx, STATE_CHECKPOINT, write_span, &w);
    xfclose(w.f, path);
    uint32_t value = crc->crc;
    free(crc);
    return value;
}

// The model tensor (kind, layer) holding canonical range [c, c + count); 0 when the range is outside the
// model or crosses a tensor boundary (spans never do). c and count come from a file, so nothing here may
// overflow: no c + count.
static int tensor_at_canonical(const ModelShape* s, long long c, long long count, int* kind, int* layer) {
    if (c < 0 || count < 0) return 0;
    size_t off = 0;
    for (int k = 0; k < s->family->num_kinds; k++) {
        size_t n = param_kind_elems(s, k), reps = param_kind_layers(s, k);
        if ((size_t)c >= off + n * reps) {
            off += n * reps;
            continue;
        }
        size_t l = ((size_t)c - off) / n, into = (size_t)c - off - l * n;
        *kind = k;
        *layer = kind_is_block(s, k) ? (int)l : -1;   // block kinds even when L = 1
        return (size_t)count <= n - into;
    }
    return 0;
}

// The fp32 buffers a file span of kind k holds per element (its optimizer's: the master, then the state),
// and all its bytes per element (the working copy too unless fp32).
static int file_buffers(const ModelShape* s, int k) { return optimizer_buffers(kind_optimizer(s, k)); }
static long long file_elem_bytes(const ModelShape* s, int k, long long dt) {
    return 4LL * file_buffers(s, k) + (dt != DT_FP32 ? (long long)dtype_size((DType)dt) : 0);
}

// One file span's values (canonical offset c): the optimizer's buffers vals[0 .. buffers), the working copy.
typedef struct {
    const ModelState* ms;
    Backend* be;
    size_t c;
    int buffers;
    float* const* vals;
    const void* params;
} SpanValues;

// Uploads the part of one file span that this rank keeps: the master and the state where it owns them
// (skip: the part's first element in the file span); the working parameters everywhere it holds them (the
// whole part where it holds all of it, else its own).
static void restore_span(const SpanValues* sv, const ParamTensor* t, size_t flat0, size_t n, size_t skip) {
    StateSpan s;
    int owned = sv->ms->owned_span(sv->ms->ctx, t, flat0, n, &s);
    for (int b = 0; owned && b < sv->buffers; b++)
        span_from_host(sv->ms, sv->be, &s, span_optimizer_buffer(b), sv->vals[b] + skip + (s.flat - flat0));
    const char* params = (const char*)sv->params + skip * dtype_size(sv->ms->dt);
    state_params_from_host(sv->ms, sv->be, flat0, n, owned ? &s : NULL, params);
}

static void restore_overlap(const ParamTensor* t, size_t index, size_t canonical, size_t n, void* ctx) {
    SpanValues* sv = (SpanValues*)ctx;
    restore_span(sv, t, t->offset + index, n, canonical - sv->c);
}

static void reader_get(StateReader* r, void* buf, size_t bytes) {
    if (r->f) xfread(buf, 1, bytes, r->f, r->path);
    if (r->world) comm_broadcast_host(r->world, buf, bytes, r->root);
}

void state_file_read(const ModelState* ms, Backend* be, StateReader* r) {
    StateHeader h;
    reader_get(r, &h, sizeof(h));   // header, spans and size passed inspect_state_file
    size_t x = dtype_size(ms->dt);
    for (long long i = 0; i < h.h[3]; i++) {
        long long span[2];
        reader_get(r, span, sizeof(span));
        int kind;
        int layer;
        if (!tensor_at_canonical(&ms->lay->shape, span[0], span[1], &kind, &layer))
            fail("%s changed after it was inspected (span [%lld, +%lld))", r->path, span[0], span[1]);
        size_t n = (size_t)span[1];
        const ParamTensor* t = layout_tensor(ms->lay, kind, layer);
        if (!t && !r->world) {   // another pipeline stage's tensor; a broadcast span is taken by every rank
            if (fseeko(r->f, (off_t)((long long)n * file_elem_bytes(&ms->lay->shape, kind, ms->dt)), SEEK_CUR) != 0)
                fail("cannot seek in %s: %s", r->path, strerror(errno));
            continue;
        }
        int buffers = file_buffers(&ms->lay->shape, kind);   // >= 1: inspect refused a frozen kind's span
        float* vals[1 + OPT_MAX_STATE];
        for (int b = 0; b < buffers; b++) {
            vals[b] = (float*)xmalloc(n * sizeof(float));
            reader_get(r, vals[b], n * sizeof(float));
        }
        void* params = vals[0];   // fp32 runs: the working copy is the master
        if (ms->dt != DT_FP32) {
            params = xmalloc(n * x);
            reader_get(r, params, n * x);
        }
        SpanValues sv = {ms, be, (size_t)span[0], buffers, vals, params};
        if (t) tensor_overlaps(t, (size_t)span[0], n, restore_overlap, &sv);
        if (params != vals[0]) free(params);
        for (int b = 0; b < buffers; b++) free(vals[b]);
    }
}

void span_push(SpanList* l, long long start, long long count) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        Span* grown = (Span*)realloc(l->items, l->cap * sizeof(Span));
        if (!grown) fail("out of host memory listing checkpoint spans");
        l->items = grown;
    }
    l->items[l->n++] = (Span){start, count};
}

int state_file_inspect(const char* dir, int rank, const ModelShape* s, long long dt, SpanList* all, char* why, size_t n) {
    char name[64], p[PATH_MAX];
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    long long size = 0;
    if (!regular_file_size(dir, name, &size, why, n)) return 0;
    path_join(p, sizeof(p), dir, name);
    FILE* f = fopen(p, "rb");
    if (!f) return set_why(why, n, "cannot open %s: %s", name, strerror(errno));
    StateHeader h;
    int ok = fread(&h, sizeof(h), 1, f) == 1;
    if (!ok) set_why(why, n, "%s is shorter than its header", name);
    else if (h.h[0] != STATE_MAGIC || h.h[1] != 2) ok = set_why(why, n, "%s is not an optimizer state file (magic or version)", name);
    else if (h.h[2] != (long long)shape_param_count(s)) ok = set_why(why, n, "%s holds %lld parameters, the model %zu", name, h.h[2], shape_param_count(s));
    else if (h.h[4] != dt) ok = set_why(why, n, "%s holds %s state, the manifest says %s", name, dtype_name((DType)(h.h[4] & 3)), dtype_name((DType)dt));
    else if (h.h[5] != rank) ok = set_why(why, n, "%s was written by rank %lld (a copied or renamed file)", name, h.h[5]);
    long long pos = (long long)sizeof(h);
    for (long long i = 0; ok && i < h.h[3]; i++) {
        long long span[2];
        int kind;
        int layer;
        if (fread(span, sizeof(span), 1, f) != 1) ok = set_why(why, n, "%s is truncated in its span %lld", name, i);
        else if (!tensor_at_canonical(s, span[0], span[1], &kind, &layer) || span[1] < 1)
            ok = set_why(why, n, "%s has a span [%lld, +%lld) outside the model's tensors", name, span[0], span[1]);
        else if (!file_buffers(s, kind))
            ok = set_why(why, n, "%s holds optimizer state for %s, which this run keeps frozen", name, param_kind_name(s, kind));
        else if (span[1] > (size - pos - 16) / file_elem_bytes(s, kind, dt)) ok = set_why(why, n, "%s is truncated in its span %lld", name, i);
        else {
            pos += 16 + span[1] * file_elem_bytes(s, kind, dt);
            ok = fseeko(f, (off_t)pos, SEEK_SET) == 0 || set_why(why, n, "cannot seek in %s", name);
            span_push(all, span[0], span[1]);
        }
    }
    if (ok && pos != size) ok = set_why(why, n, "%s has %lld bytes after its last span", name, size - pos);
    fclose(f);
    return ok;
}

static int by_start(const void* a, const void* b) {
    long long x = ((const Span*)a)->start, y = ((const Span*)b)->start;
    return (x > y) - (x < y);
}

// Each frozen kind's canonical range (a kind's tensors are stacked over layers: one range), which no
// state file holds.
static void push_frozen_kinds(SpanList* all, const ModelShape* s) {
    size_t off = 0;
    for (int k = 0; k < s->family->num_kinds; k++) {
        size_t elems = param_kind_elems(s, k) * param_kind_layers(s, k);
        if (elems && !file_buffers(s, k)) span_push(all, (long long)off, (long long)elems);
        off += elems;
    }
}

int spans_cover(SpanList* all, const ModelShape* s, int ranks, char* why, size_t n) {
    size_t params = shape_param_count(s);
    push_frozen_kinds(all, s);
    qsort(all->items, all->n, sizeof(Span), by_start);
    long long next = 0;
    for (size_t i = 0; i < all->n; i++) {
        if (all->items[i].start != next)
            return set_why(why, n, "the %d state files %s parameters [%lld, %lld)", ranks, all->items[i].start > next ? "miss" : "repeat",
                       all->items[i].start > next ? next : all->items[i].start, all->items[i].start > next ? all->items[i].start : next);
        next += all->items[i].count;
    }
    if (next != (long long)params) return set_why(why, n, "the %d state files miss parameters [%lld, %zu)", ranks, next, params);
    return 1;
}
