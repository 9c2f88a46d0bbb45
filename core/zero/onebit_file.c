// onebit_file.c: see onebit_file.h. Layout: "ONEBIT2\0"; uint64 writer's size, rank, units; per unit uint64 n
// and n floats (worker error); per unit uint64 first, n and n floats (server chunk); uint32 CRC-32 of all after
// the magic.
#include "core/zero/onebit_file.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/crc32.h"
#include "core/util/fs.h"

static const char MAGIC[8] = "ONEBIT2";

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

static void file_path(const char* dir, int r, char* p, size_t size) {
    char name[64];
    snprintf(name, sizeof(name), "onebit_rank%d.bin", r);
    path_join(p, size, dir, name);
}

typedef struct {
    FILE* f;
    const char* path;
    Crc32 crc;
} Stream;

static void put(Stream* s, const void* p, size_t bytes) {
    xfwrite(p, 1, bytes, s->f, s->path);
    crc32_add(&s->crc, p, bytes);
}
static void take(Stream* s, void* p, size_t bytes) {
    if (fread(p, 1, bytes, s->f) != bytes) fail("%s: truncated (1-bit Adam's errors)", s->path);
    crc32_add(&s->crc, p, bytes);
}
static uint64_t take_u64(Stream* s) {
    uint64_t v;
    take(s, &v, sizeof v);
    return v;
}

void onebit_file_save(const OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir) {
    char p[PATH_MAX];
    file_path(dir, pc->rank, p, sizeof(p));
    Stream s = {.f = xfopen(p, "wb"), .path = p};
    crc32_begin(&s.crc);
    xfwrite(MAGIC, 1, sizeof(MAGIC), s.f, p);
    float* w = (float*)xmalloc(b->whole * 4 + 4);
    float* e = (float*)xmalloc(b->mine * 4 + 4);
    be_download(be, w, b->worker_err, b->whole * 4);
    be_download(be, e, b->server_err, b->mine * 4);
    int L = pc->lay->num_units;
    uint64_t head[3] = {(uint64_t)pc->size, (uint64_t)pc->rank, (uint64_t)L};
    put(&s, head, sizeof head);
    for (int u = 0; u < L; u++) {
        uint64_t n = real_of(pc, u);
        put(&s, &n, sizeof n);
        put(&s, w + pc->grad_offset[u], n * 4);
    }
    for (int u = 0; u < L; u++) {
        uint64_t at[2] = {chunk_first(pc, u, pc->rank), chunk_real(pc, u, pc->rank)};
        put(&s, at, sizeof at);
        put(&s, e + pc->mine_offset[u], at[1] * 4);
    }
    uint32_t sum = s.crc.crc;
    xfwrite(&sum, sizeof sum, 1, s.f, p);
    xfclose(s.f, p);
    free(w), free(e);
}

// One writer's file: its worker errors added into `worker` (whole layout of this size), its server chunks into
// `server` (per unit, real elements, at unit u's grad_offset). Returns the writer's size.
static int read_file(const Pieces* pc, const char* dir, int r, float* worker, float* server) {
    char p[PATH_MAX];
    file_path(dir, r, p, sizeof(p));
    if (!path_exists(p)) fail("%s is missing: checkpoint %s was not written by a run with -opt adam1bit on this many ranks", p, dir);
    Stream s = {.f = xfopen(p, "rb"), .path = p};
    char magic[sizeof(MAGIC)];
    if (fread(magic, 1, sizeof magic, s.f) != sizeof magic || memcmp(magic, MAGIC, sizeof magic)) fail("%s is not a 1-bit Adam error file", p);
    crc32_begin(&s.crc);
    uint64_t size = take_u64(&s), rank = take_u64(&s), units = take_u64(&s);
    if (rank != (uint64_t)r || units != (uint64_t)pc->lay->num_units)
        fail("%s: written as rank %llu of a model of %llu units, read as rank %d of %d units", p, (unsigned long long)rank,
             (unsigned long long)units, r, pc->lay->num_units);
    for (int u = 0; u < pc->lay->num_units; u++) {
        uint64_t n = take_u64(&s);
        if (n != real_of(pc, u)) fail("%s: unit %d holds %llu elements, this model's %zu", p, u, (unsigned long long)n, real_of(pc, u));
        float* dst = worker + pc->grad_offset[u];
        for (uint64_t i = 0; i < n; i++) {
            float x;
            take(&s, &x, sizeof x);
            dst[i] += x;
        }
    }
    for (int u = 0; u < pc->lay->num_units; u++) {
        uint64_t first = take_u64(&s), n = take_u64(&s);
        if (first + n > real_of(pc, u)) fail("%s: unit %d's server chunk [%llu, +%llu) is past its %zu elements", p, u,
                                             (unsigned long long)first, (unsigned long long)n, real_of(pc, u));
        take(&s, server + pc->grad_offset[u] + first, n * 4);
    }
    uint32_t want = s.crc.crc, sum;
    if (fread(&sum, sizeof sum, 1, s.f) != 1 || sum != want) fail("%s: damaged (its CRC-32 does not match 1-bit Adam's errors it holds)", p);
    xfclose(s.f, p);
    return (int)size;
}

void onebit_file_load(OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir) {
    float* worker = (float*)xcalloc(b->whole + 1, 4);
    float* server = (float*)xcalloc(b->whole + 1, 4);   // every writer's chunks, whole layout
    int writers = read_file(pc, dir, 0, worker, server);
    if (writers == pc->size) {   // this rank's own file: the bits it wrote
        memset(worker, 0, (b->whole + 1) * 4);
        read_file(pc, dir, pc->rank, worker, server);
    } else {
        for (int r = 1; r < writers; r++) read_file(pc, dir, r, worker, server);
        for (size_t i = 0; i < b->whole; i++) worker[i] /= (float)writers;
        if (pc->rank == 0) printf("1-bit Adam: the errors of %d ranks resharded for %d: the server chunks recut, each worker error their mean\n", writers, pc->size);
    }
    float* mine = (float*)xcalloc(b->mine + 1, 4);
    for (int u = 0; u < pc->lay->num_units; u++)
        memcpy(mine + pc->mine_offset[u], server + pc->grad_offset[u] + chunk_first(pc, u, pc->rank), chunk_real(pc, u, pc->rank) * 4);
    be_upload(be, b->worker_err, worker, b->whole * 4);
    be_upload(be, b->server_err, mine, b->mine * 4);
    b->has_momentum = 0;
    free(worker), free(server), free(mine);
}
