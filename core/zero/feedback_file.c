// feedback_file.c: see feedback_file.h.
#include "core/zero/feedback_file.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/crc32.h"
#include "core/util/fs.h"

#define MAGIC_BYTES 8

// Unit u's real trained elements (its gradient's first ones), and where rank r's server chunk's real ones start.
static size_t real_of(const Pieces* pc, int u) {
    const Unit* un = &pc->lay->units[u];
    return un->size > un->frozen ? un->size - un->frozen : 0;
}
static size_t chunk_first(const Pieces* pc, int u, int r) { return (size_t)r * pc->mine_len[u]; }
static size_t chunk_real(const Pieces* pc, int u, int r) {
    size_t first = chunk_first(pc, u, r), real = real_of(pc, u);
    return first >= real ? 0 : real - first < pc->mine_len[u] ? real - first : pc->mine_len[u];
}

size_t feedback_whole_len(const Pieces* pc) {
    int last = pc->lay->num_units - 1;
    return last < 0 ? 0 : pc->grad_offset[last] + pc->grad_len[last];
}

static void file_path(const FeedbackKind* k, const char* dir, int r, char* p, size_t size) {
    char name[64];
    snprintf(name, sizeof(name), "%s_rank%d.bin", k->prefix, r);
    path_join(p, size, dir, name);
}

// A file and the CRC-32 of what passed through it after the magic.
typedef struct {
    FILE* f;
    const char* path;
    const FeedbackKind* kind;
    Crc32 crc;
} Stream;

static void put(Stream* s, const void* p, size_t bytes) {
    xfwrite(p, 1, bytes, s->f, s->path);
    crc32_add(&s->crc, p, bytes);
}
static void take(Stream* s, void* p, size_t bytes) {
    if (fread(p, 1, bytes, s->f) != bytes) fail("%s: truncated (%s's errors)", s->path, s->kind->name);
    crc32_add(&s->crc, p, bytes);
}
static uint64_t take_u64(Stream* s) {
    uint64_t v;
    take(s, &v, sizeof v);
    return v;
}

void feedback_file_save(const FeedbackKind* k, const Pieces* pc, const char* dir, const float* whole, const float* chunks) {
    char p[PATH_MAX];
    file_path(k, dir, pc->rank, p, sizeof(p));
    Stream s = {.f = xfopen(p, "wb"), .path = p, .kind = k};
    xfwrite(k->magic, 1, MAGIC_BYTES, s.f, p);
    crc32_begin(&s.crc);
    int L = pc->lay->num_units;
    uint64_t head[3] = {(uint64_t)pc->size, (uint64_t)pc->rank, (uint64_t)L};
    put(&s, head, sizeof head);
    for (int u = 0; u < L; u++) {
        uint64_t n = real_of(pc, u);
        put(&s, &n, sizeof n);
        put(&s, whole + pc->grad_offset[u], n * 4);
    }
    for (int u = 0; k->has_chunks && u < L; u++) {
        uint64_t at[2] = {chunk_first(pc, u, pc->rank), chunk_real(pc, u, pc->rank)};
        put(&s, at, sizeof at);
        put(&s, chunks + pc->mine_offset[u], at[1] * 4);
    }
    uint32_t sum = s.crc.crc;
    xfwrite(&sum, sizeof sum, 1, s.f, p);
    xfclose(s.f, p);
}

// The magic and the header of writer r's file (of a group of `writers` ranks; 0: not known yet). Returns the
// writer's size.
static int take_header(Stream* s, const Pieces* pc, int r, int writers) {
    char magic[MAGIC_BYTES];
    const FeedbackKind* k = s->kind;
    if (fread(magic, 1, sizeof magic, s->f) != sizeof magic) fail("%s is not a %s error file", s->path, k->name);
    if (k->retired_magic && !memcmp(magic, k->retired_magic, sizeof magic))
        fail("%s holds %s's errors in an earlier format (%s): resume it with the binary that wrote it", s->path, k->name, k->retired_magic);
    if (memcmp(magic, k->magic, sizeof magic)) fail("%s is not a %s error file", s->path, k->name);
    crc32_begin(&s->crc);
    uint64_t size = take_u64(s), rank = take_u64(s), units = take_u64(s);
    if (rank != (uint64_t)r || units != (uint64_t)pc->lay->num_units)
        fail("%s: written as rank %llu of a model of %llu units, read as rank %d of %d units", s->path, (unsigned long long)rank,
             (unsigned long long)units, r, pc->lay->num_units);
    if (size <= rank || size > INT_MAX)
        fail("%s: written by rank %llu of a group of %llu ranks", s->path, (unsigned long long)rank, (unsigned long long)size);
    if (writers && size != (uint64_t)writers)
        fail("%s: written in a group of %llu ranks, rank 0's file in one of %d", s->path, (unsigned long long)size, writers);
    return (int)size;
}

// Opens writer r's file and reads its header (see take_header). Returns the writer's size.
static int open_file(Stream* s, const FeedbackKind* k, const Pieces* pc, const char* dir, int r, int writers, char* p) {
    file_path(k, dir, r, p, PATH_MAX);
    if (!path_exists(p) && r == 0) fail("%s is missing: checkpoint %s was not written by a run with %s", p, dir, k->flag);
    if (!path_exists(p)) fail("%s is missing: rank 0's file in checkpoint %s names a group of %d ranks", p, dir, writers);
    *s = (Stream){.f = xfopen(p, "rb"), .path = p, .kind = k};
    return take_header(s, pc, r, writers);
}

// The writers' size, from rank 0's header.
static int writers_of(const FeedbackKind* k, const Pieces* pc, const char* dir) {
    char p[PATH_MAX];
    Stream s;
    int size = open_file(&s, k, pc, dir, 0, 0, p);
    xfclose(s.f, p);
    return size;
}

// Writer r's file: its whole-layout values copied (add = 0) or added (add = 1) into whole, with has_chunks its
// server chunks into `chunks` (the whole layout).
static void read_file(const FeedbackKind* k, const Pieces* pc, const char* dir, int r, int writers, int add, float* whole, float* chunks) {
    char p[PATH_MAX];
    Stream s;
    open_file(&s, k, pc, dir, r, writers, p);
    for (int u = 0; u < pc->lay->num_units; u++) {
        uint64_t n = take_u64(&s);
        if (n != real_of(pc, u)) fail("%s: unit %d holds %llu elements, this model's %zu", p, u, (unsigned long long)n, real_of(pc, u));
        float* dst = whole + pc->grad_offset[u];
        float* in = add ? (float*)xmalloc(n * 4 + 4) : dst;
        take(&s, in, n * 4);
        for (uint64_t i = 0; add && i < n; i++) dst[i] += in[i];
        if (add) free(in);
    }
    for (int u = 0; k->has_chunks && u < pc->lay->num_units; u++) {
        uint64_t first = take_u64(&s), n = take_u64(&s);
        if (n && (first + n > real_of(pc, u) || first + n < first))   // a chunk all padding starts past them
            fail("%s: unit %d's server chunk [%llu, +%llu) is past its %zu elements", p, u, (unsigned long long)first,
                 (unsigned long long)n, real_of(pc, u));
        take(&s, chunks + pc->grad_offset[u] + first, n * 4);
    }
    uint32_t want = s.crc.crc, sum;
    if (fread(&sum, sizeof sum, 1, s.f) != 1 || sum != want) fail("%s: damaged (its CRC-32 does not match %s's errors it holds)", p, k->name);
    xfclose(s.f, p);
}

int feedback_file_load(const FeedbackKind* k, const Pieces* pc, const char* dir, float* whole, float* chunks) {
    size_t len = feedback_whole_len(pc);
    float* all_chunks = k->has_chunks ? (float*)xcalloc(len + 1, 4) : NULL;   // every writer's, whole layout
    memset(whole, 0, len * 4);
    int writers = writers_of(k, pc, dir);
    if (writers == pc->size) {   // this rank's own file: the bits it wrote
        read_file(k, pc, dir, pc->rank, writers, 0, whole, all_chunks);
    } else {
        for (int r = 0; r < writers; r++) read_file(k, pc, dir, r, writers, 1, whole, all_chunks);
        float share = (float)(k->group_sums ? pc->size : writers);
        for (size_t i = 0; i < len; i++) whole[i] /= share;
    }
    for (int u = 0; k->has_chunks && u < pc->lay->num_units; u++) {
        float* mine = chunks + pc->mine_offset[u];
        memset(mine, 0, pc->mine_len[u] * 4);
        memcpy(mine, all_chunks + pc->grad_offset[u] + chunk_first(pc, u, pc->rank), chunk_real(pc, u, pc->rank) * 4);
    }
    free(all_chunks);
    return writers;
}
