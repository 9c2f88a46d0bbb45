// checkpoint.c: model files and checkpoints. See checkpoint.h.
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/crc32.h"
#include "fs.h"
#include "run_dir.h"

// ---------------------------------------------------------------------------------------------------
// Model files.

static GPTShape read_model_header(FILE* f, const char* path, int* version) {
    int h[256];
    xfread(h, sizeof(int), 256, f, path);
    if (h[0] != MODEL_MAGIC) fail("%s is not a model file (wrong magic %d, expected %d)", path, h[0], MODEL_MAGIC);
    if (h[1] != 3 && h[1] != 5) fail("%s has model file version %d; supported: 3 (fp32), 5 (bf16)", path, h[1]);
    *version = h[1];
    GPTShape s = {h[4], h[6], h[5], h[3], h[7], h[2]};   // header: maxT, V, L, NH, C, Vp
    shape_validate(&s);
    return s;
}

GPTShape model_file_shape(const char* path) {
    FILE* f = xfopen(path, "rb");
    int version;
    GPTShape s = read_model_header(f, path, &version);
    fclose(f);
    size_t count = shape_param_count(&s), elem = version == 3 ? 4 : 2;
    long long have = file_size(path);   // >= 1024: the header was read
    // Compared in elements, so a huge shape never overflows the byte count it would need.
    if (count > (size_t)(have - 1024) / elem)
        fail("%s is truncated (%lld bytes, the header's shape needs 1024 + %zu x %zu)", path, have, count, elem);
    long long want = 1024 + (long long)(count * elem);
    if (have > want) fail("%s has %lld bytes after the tensors its header describes", path, have - want);
    return s;
}

// Positions f at the first element of canonical offset c (elements of elem bytes after `header` bytes).
static void seek_canonical(FILE* f, const char* path, size_t header, size_t c, size_t elem) {
    if (fseeko(f, (off_t)(header + c * elem), SEEK_SET) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
}

static void check_same_shape(const GPTShape* fs, const GPTShape* want, const char* path) {
    if (memcmp(fs, want, sizeof(*fs)) != 0)
        fail("%s holds a model of another shape (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, expected L=%d C=%d NH=%d V=%d Vp=%d maxT=%d)",
             path, fs->L, fs->C, fs->NH, fs->V, fs->Vp, fs->maxT, want->L, want->C, want->NH, want->V, want->Vp, want->maxT);
}

float* model_file_read(const ParamLayout* lay, const char* path) {
    GPTShape fs = model_file_shape(path);
    check_same_shape(&fs, &lay->shape, path);
    FILE* f = xfopen(path, "rb");
    int version;
    read_model_header(f, path, &version);
    size_t elem = version == 3 ? 4 : 2;
    float* flat = (float*)xcalloc(lay->total, sizeof(float));
    size_t longest_run = 1;   // bf16 files are read a run at a time through this much scratch
    for (int i = 0; i < lay->num_tensors; i++) longest_run = lay->tensors[i].run > longest_run ? lay->tensors[i].run : longest_run;
    uint16_t* raw = version == 5 ? (uint16_t*)xmalloc(longest_run * 2) : NULL;
    for (int i = 0; i < lay->num_tensors; i++) {   // a stage reads its own tensors (and its mirror's), run by run
        const ParamTensor* t = &lay->tensors[i];
        for (size_t j = 0; j < t->size; j += t->run) {
            seek_canonical(f, path, 1024, tensor_canonical(t, j), elem);
            if (raw) {
                xfread(raw, 2, t->run, f, path);
                host_from_dtype(flat + t->offset + j, raw, DT_BF16, t->run);
            } else {
                xfread(flat + t->offset + j, sizeof(float), t->run, f, path);
            }
        }
    }
    free(raw);
    fclose(f);
    return flat;
}

float* model_init(const ParamLayout* lay, unsigned long long seed) {
    float* flat = (float*)xcalloc(lay->total, sizeof(float));
    for (int i = 0; i < lay->num_tensors; i++)
        init_tensor_values(flat + lay->tensors[i].offset, &lay->shape, &lay->tensors[i], seed);
    return flat;
}

static void write_model_header(const GPTShape* s, FILE* f, const char* path) {
    int h[256] = {0};
    h[0] = MODEL_MAGIC;
    h[1] = 3;
    h[2] = s->maxT;
    h[3] = s->V;
    h[4] = s->L;
    h[5] = s->NH;
    h[6] = s->C;
    h[7] = s->Vp;
    xfwrite(h, sizeof(int), 256, f, path);
}

void model_file_create(const GPTShape* s, const char* path, int header) {
    FILE* f = xfopen(path, "wb");
    if (header) write_model_header(s, f, path);
    // Sized up front (zero-filled, sparse where the filesystem allows) so each stage can write its part.
    if (ftruncate(fileno(f), (off_t)((header ? 1024 : 0) + shape_param_count(s) * sizeof(float))) != 0)
        fail("cannot size %s: %s", path, strerror(errno));
    xfclose(f, path);
}

void model_file_write_part(const ParamLayout* lay, const float* flat, const char* path, int header) {
    FILE* f = fopen(path, "r+b");
    if (!f) fail("cannot open %s for writing: %s", path, strerror(errno));
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (tensor_is_copy(lay, t)) continue;   // its owner (stage 0, tensor rank 0) writes it
        for (size_t j = 0; j < t->size; j += t->run) {
            seek_canonical(f, path, header ? 1024 : 0, tensor_canonical(t, j), sizeof(float));
            xfwrite(flat + t->offset + j, sizeof(float), t->run, f, path);
        }
    }
    xfclose(f, path);
}

void model_file_write(const ParamLayout* lay, const float* flat, const char* path, int header) {
    model_file_create(&lay->shape, path, header);
    model_file_write_part(lay, flat, path, header);
}

// ---------------------------------------------------------------------------------------------------
// Optimizer state: header [magic, version, num_params, num_spans, working dtype, rank, dp, stage], then per
// span (canonical offset, count) and its master, m, v (fp32) and, when the run is not fp32, the working copy.

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
    float* sources[3] = {s->master, s->m, s->v};
    for (int k = 0; k < 3; k++) {
        copy_to_host(w->be, w->ms->state_on_host, buf, sources[k], n * sizeof(float));
        state_write(w, buf, n * sizeof(float));
    }
    if (w->dt != DT_FP32) {
        copy_to_host(w->be, w->ms->params_on_host, buf, s->params, n * dtype_size(w->dt));
        state_write(w, buf, n * dtype_size(w->dt));
    }
    free(buf);
}

// dp and zero_stage are recorded for whoever reads the file; loading needs neither. Returns the file's CRC-32.
static uint32_t state_save(const ModelState* ms, Backend* be, const char* path, int world_rank, int dp, int zero_stage) {
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
static int tensor_at_canonical(const GPTShape* s, long long c, long long count, ParamKind* kind, int* layer) {
    if (c < 0 || count < 0) return 0;
    size_t off = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++) {
        size_t n = param_kind_elems(s, (ParamKind)k), reps = param_kind_layers(s, (ParamKind)k);
        if ((size_t)c >= off + n * reps) {
            off += n * reps;
            continue;
        }
        size_t l = ((size_t)c - off) / n, into = (size_t)c - off - l * n;
        *kind = (ParamKind)k;
        *layer = param_kind_is_block((ParamKind)k) ? (int)l : -1;   // block kinds even when L = 1
        return (size_t)count <= n - into;
    }
    return 0;
}

// Uploads the part of one file span that this rank keeps: master, m, v where it owns them; the working
// parameters everywhere it holds them (the whole span where it holds all of them, else its own part).
static void restore_span(const ModelState* ms, Backend* be, const ParamTensor* t, size_t flat0, size_t n, float* const vals[3],
                         const void* params) {
    size_t x = dtype_size(ms->dt);
    StateSpan s;
    if (ms->owned_span(ms->ctx, t, flat0, n, &s)) {
        float* dests[3] = {s.master, s.m, s.v};
        for (int k = 0; k < 3; k++) copy_from_host(be, ms->state_on_host, dests[k], vals[k] + (s.flat - flat0), s.n * sizeof(float));
        if (!ms->whole_params) copy_from_host(be, ms->params_on_host, s.params, (const char*)params + (s.flat - flat0) * x, s.n * x);
    }
    if (ms->whole_params) be_upload(be, (char*)ms->whole_params + flat0 * x, params, n * x);
}

// One file span's values (canonical offset c), restored where this layout's tensor holds them.
typedef struct {
    const ModelState* ms;
    Backend* be;
    size_t c;
    float* const* vals;
    const void* params;
} SpanValues;

static void restore_overlap(const ParamTensor* t, size_t index, size_t canonical, size_t n, void* ctx) {
    SpanValues* sv = (SpanValues*)ctx;
    size_t skip = canonical - sv->c, x = dtype_size(sv->ms->dt);
    float* vals[3] = {sv->vals[0] + skip, sv->vals[1] + skip, sv->vals[2] + skip};
    restore_span(sv->ms, sv->be, t, t->offset + index, n, vals, (const char*)sv->params + skip * x);
}

// Where a state file's bytes come from: the file itself, or (node-local directories) the rank that reads it,
// through a broadcast that every rank takes part in (f is NULL on the others).
typedef struct {
    FILE* f;
    const char* path;
    Comm* world;   // NULL: read f directly
    int root;
} StateReader;

static void reader_get(StateReader* r, void* buf, size_t bytes) {
    if (r->f) xfread(buf, 1, bytes, r->f, r->path);
    if (r->world) comm_broadcast_host(r->world, buf, bytes, r->root);
}

static void state_load(const ModelState* ms, Backend* be, StateReader* r) {
    StateHeader h;
    reader_get(r, &h, sizeof(h));   // header, spans and size passed inspect_state_file
    size_t x = dtype_size(ms->dt);
    for (long long i = 0; i < h.h[3]; i++) {
        long long span[2];
        reader_get(r, span, sizeof(span));
        ParamKind kind;
        int layer;
        if (!tensor_at_canonical(&ms->lay->shape, span[0], span[1], &kind, &layer))
            fail("%s changed after it was inspected (span [%lld, +%lld))", r->path, span[0], span[1]);
        size_t n = (size_t)span[1];
        const ParamTensor* t = layout_tensor(ms->lay, kind, layer);
        if (!t && !r->world) {   // another pipeline stage's tensor; a broadcast span is taken by every rank
            if (fseeko(r->f, (off_t)(n * (12 + (ms->dt != DT_FP32 ? x : 0))), SEEK_CUR) != 0)
                fail("cannot seek in %s: %s", r->path, strerror(errno));
            continue;
        }
        float* vals[3];
        for (int k = 0; k < 3; k++) {
            vals[k] = (float*)xmalloc(n * sizeof(float));
            reader_get(r, vals[k], n * sizeof(float));
        }
        void* params = vals[0];   // fp32 runs: the working copy is the master
        if (ms->dt != DT_FP32) {
            params = xmalloc(n * x);
            reader_get(r, params, n * x);
        }
        SpanValues sv = {ms, be, (size_t)span[0], vals, params};
        if (t) tensor_overlaps(t, (size_t)span[0], n, restore_overlap, &sv);
        if (params != vals[0]) free(params);
        for (int k = 0; k < 3; k++) free(vals[k]);
    }
}

// ---------------------------------------------------------------------------------------------------
// Writing a checkpoint directory.

// The checkpoint's files' CRC-32s: [r] state_rank<r>.bin for each world rank r, [world] model.bin.
static void write_checksums(FILE* f, const uint32_t* crcs, int world) {
    fprintf(f, "\"crc32\": {\"model.bin\": \"%08x\"", crcs[world]);
    for (int r = 0; r < world; r++) fprintf(f, ", \"state_rank%d.bin\": \"%08x\"", r, crcs[r]);
    fprintf(f, "},\n ");
}

static void write_manifest(const char* path, const ModelState* ms, const Grid* g, const Config* cfg, const CheckpointInfo* info,
                           int host_dirs, const uint32_t* crcs) {
    FILE* f = xfopen(path, "w");
    const GPTShape* s = &ms->lay->shape;
    fprintf(f, "{\"step\": %d, \"tokens_per_step\": %lld, \"seed\": %llu, \"state_files\": %d,\n", info->step,
            info->tokens_per_step, info->seed, comm_size(g->world));
    fprintf(f, " \"loss_scale\": %.9g, \"clean_steps\": %d, \"overflows_left\": %d,\n", info->scaler.scale,
            info->scaler.clean_steps, info->scaler.overflows_left);
    fprintf(f, " \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d},\n", s->L, s->C,
            s->NH, s->V, s->Vp, s->maxT);
    fprintf(f, " \"batch\": {\"B\": %d, \"T\": %d, \"ga\": %d}, \"precision\": \"%s\",\n", cfg->B, cfg->T,
            cfg->grad_accum, dtype_name(ms->dt));
    fprintf(f, " \"topology\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"zero\": %d},\n", comm_size(g->world), g->dp, g->pp,
            cfg->zero_stage);
    fprintf(f, " \"data\": {\"shuffle\": %d, \"next_step\": %d},\n ", cfg->shuffle, info->step);
    if (host_dirs) fprintf(f, "\"host_dirs\": %d,\n ", host_dirs);   // only then: shared -o manifests stay as they were
    write_checksums(f, crcs, comm_size(g->world));
    run_record_write_json(f, &info->run, path);   // last: the keys above are looked up as the first match
    fprintf(f, "}\n");
    xfclose(f, path);
}

#define MODEL_PART_TAG 7301

// Node-local directories keep model.bin in rank 0's only: a stage writer on another host sends it its
// tensors, each as a header (runs, run length), the runs' canonical offsets and the values; (0, 0) ends.
static void send_model_part(const ParamLayout* lay, const float* flat, Comm* world) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (tensor_is_copy(lay, t)) continue;   // its owner writes it
        long long head[2] = {(long long)(t->size / t->run), (long long)t->run};
        long long* canon = (long long*)xmalloc((size_t)head[0] * sizeof(long long));
        for (long long j = 0; j < head[0]; j++) canon[j] = (long long)tensor_canonical(t, (size_t)j * t->run);
        comm_send_host(world, head, sizeof(head), 0, MODEL_PART_TAG);
        comm_send_host(world, canon, (size_t)head[0] * sizeof(long long), 0, MODEL_PART_TAG);
        comm_send_host(world, flat + t->offset, t->size * sizeof(float), 0, MODEL_PART_TAG);
        free(canon);
    }
    long long end[2] = {0, 0};
    comm_send_host(world, end, sizeof(end), 0, MODEL_PART_TAG);
}

static void recv_model_part(Comm* world, int from, const char* path, long long params) {
    FILE* f = fopen(path, "r+b");
    if (!f) fail("cannot open %s for writing: %s", path, strerror(errno));
    long long head[2];
    for (;;) {
        comm_recv_host(world, head, sizeof(head), from, MODEL_PART_TAG);
        if (head[0] == 0) break;
        if (head[0] < 0 || head[1] < 1 || head[0] > params / head[1])
            fail("internal: rank %d sent a model part of %lld runs of %lld values", from, head[0], head[1]);
        size_t runs = (size_t)head[0], run = (size_t)head[1];
        long long* canon = (long long*)xmalloc(runs * sizeof(long long));
        float* vals = (float*)xmalloc(runs * run * sizeof(float));
        comm_recv_host(world, canon, runs * sizeof(long long), from, MODEL_PART_TAG);
        comm_recv_host(world, vals, runs * run * sizeof(float), from, MODEL_PART_TAG);
        for (size_t j = 0; j < runs; j++) {
            if (canon[j] < 0 || canon[j] > params - (long long)run) fail("internal: rank %d sent a run at %lld", from, canon[j]);
            seek_canonical(f, path, 1024, (size_t)canon[j], sizeof(float));
            xfwrite(vals + j * run, sizeof(float), run, f, path);
        }
        free(vals);
        free(canon);
    }
    xfclose(f, path);
}

// Rank 0 takes the parts of the writers that flagged `sends`, in rank order.
static void model_parts_to_root(const ParamLayout* lay, const float* flat, int sends, Comm* world, const char* path) {
    int size = comm_size(world), rank = comm_rank(world);
    double* from = (double*)xcalloc((size_t)size, sizeof(double));
    from[rank] = sends;
    comm_allreduce_host_sum(world, from, size);
    if (sends) send_model_part(lay, flat, world);
    for (int r = 1; rank == 0 && r < size; r++)
        if (from[r] > 0) recv_model_part(world, r, path, (long long)shape_param_count(&lay->shape));
    free(from);
}

// model.bin: rank 0 sizes the file, then each stage's replica-0 rank gathers its stage's master weights
// and writes its tensors in place (or sends them to rank 0 from another host's directory), so no rank
// ever holds more than its own stage.
static void model_save(const ModelState* ms, Backend* be, const Grid* g, const RunDir* rd, const char* path) {
    if (comm_rank(g->world) == 0) model_file_create(&ms->lay->shape, path, 1);
    comm_barrier(g->world);
    int writer = g->dp_rank == 0, sends = writer && !rd->root_dir;
    float* flat = writer ? (float*)xcalloc(ms->lay->total, sizeof(float)) : NULL;
    ms->master_to_host(ms->ctx, be, flat);   // collective over the stage's replicas
    if (writer && !sends) model_file_write_part(ms->lay, flat, path, 1);
    if (rd->node_local) model_parts_to_root(ms->lay, flat, sends, g->world, path);
    free(flat);
}

// The finished ckpt_tmp takes the step's name. A directory already there (a damaged checkpoint of this
// step: a complete one is never re-saved) is moved aside first and removed last, as an entry: a symlink
// to storage elsewhere loses the link, never the files behind it. At every moment the newest complete
// checkpoint is in place under its name.
static void publish(const char* tmp, const char* dir, const char* out_dir) {
    char old[PATH_MAX];
    path_join(old, sizeof(old), out_dir, "ckpt_old");
    remove_path(old);
    if (path_exists(dir) && rename(dir, old) != 0) fail("cannot move %s aside: %s", dir, strerror(errno));
    if (rename(tmp, dir) != 0) fail("cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    sync_dir(out_dir);
    remove_path(old);
}

// Why the copies can differ: the tied pair sums its gradients, so the same update keeps the two equal and a
// difference is a bug; each tensor rank updates its copies of the whole tensors (LayerNorms, the
// projections' biases, wpe, the final LayerNorm) from its own data-parallel group's reduction, so their bits
// agree only while those reductions add alike (NCCL picks its order per communicator). A hash of each
// rank's copies compares them without sending them.
typedef struct {
    const ModelState* ms;
    Backend* be;
    CopyPick pick;
    uint64_t hash;
} CopyHash;

static void hash_copy(const StateSpan* s, void* ctx) {
    CopyHash* c = (CopyHash*)ctx;
    if (!c->pick(s->t, c->ms->lay)) return;
    size_t master = s->n * sizeof(float), working = s->n * dtype_size(c->ms->dt);
    unsigned char* host = (unsigned char*)xmalloc(master > working ? master : working);
    copy_to_host(c->be, c->ms->state_on_host, host, s->master, master);
    c->hash = fnv1a(c->hash, host, master);
    copy_to_host(c->be, c->ms->params_on_host, host, s->params, working);
    c->hash = fnv1a(c->hash, host, working);
    free(host);
}

int copies_agree(const ModelState* ms, Backend* be, Comm* group, CopyPick pick) {
    if (!group) return 1;
    CopyHash c = {ms, be, pick, FNV1A_START};
    ms->for_each_span(ms->ctx, STATE_UPDATE, hash_copy, &c);
    return comm_all_equal(group, c.hash);
}

int copy_in_embedding_unit(const ParamTensor* t, const ParamLayout* lay) { return t->unit == lay->emb_unit; }
int copy_held_whole_by_group(const ParamTensor* t, const ParamLayout* lay) {
    (void)lay;
    return t->group_whole;
}

// Every rank's state file CRC-32 (mine: this rank's) and model.bin's, on every rank, as write_checksums takes
// them. The stages write model.bin in place, in parts, so rank 0 reads it back once all of them are done.
static uint32_t* gather_checksums(Comm* world, uint32_t mine, const char* model_path) {
    int size = comm_size(world), rank = comm_rank(world);
    double* v = (double*)xcalloc((size_t)size, sizeof(double));   // a CRC-32 is exact in a double
    v[rank] = mine;
    comm_allreduce_host_sum(world, v, size);   // after every rank's part of model.bin
    uint32_t* crcs = (uint32_t*)xmalloc(((size_t)size + 1) * sizeof(uint32_t));
    for (int r = 0; r < size; r++) crcs[r] = (uint32_t)v[r];
    free(v);
    if (rank == 0 && !crc32_file(model_path, &crcs[size])) fail("cannot read back %s: %s", model_path, strerror(errno));
    comm_broadcast_host(world, &crcs[size], sizeof(uint32_t), 0);
    return crcs;
}

// DONE, written last, holds the manifest's CRC-32: a damaged manifest is caught like a damaged state file.
static void write_done(const char* dir) {
    char manifest[PATH_MAX], done[PATH_MAX];
    path_join(manifest, sizeof(manifest), dir, "manifest.json");
    path_join(done, sizeof(done), dir, "DONE");
    uint32_t crc;
    if (!crc32_file(manifest, &crc)) fail("cannot read back %s: %s", manifest, strerror(errno));
    FILE* f = xfopen(done, "w");
    fprintf(f, "{\"manifest.json\": \"%08x\"}\n", crc);
    xfclose(f, done);
}

void checkpoint_save(const ModelState* ms, Backend* be, const Grid* g, const Config* cfg, const RunDir* rd, const CheckpointInfo* info,
                     char* dir, size_t dir_size) {
    char tmp[PATH_MAX], p[PATH_MAX], name[64];
    Comm* world = g->world;
    int rank = comm_rank(world), manager = rd->manager;   // of this rank's directory
    run_dir_checkpoint_path(dir, dir_size, cfg->out_dir, info->step);
    path_join(tmp, sizeof(tmp), cfg->out_dir, "ckpt_tmp");
    if (manager) {
        remove_path(tmp);   // left by a crash mid-write
        make_dirs(tmp);
    }
    comm_barrier(world);
    if (!copies_agree(ms, be, g->tied, copy_in_embedding_unit))   // only stage 0's copy is saved
        fail("internal: the last stage's copy of the tied embedding differs from stage 0's (replica %d)", g->dp_rank);
    if (!copies_agree(ms, be, g->tp_group, copy_held_whole_by_group))   // only tensor rank 0's copies are saved
        fail("internal: the tensor ranks' copies of the tensors they hold whole differ (stage %d, replica %d): their "
             "data-parallel reductions added in different orders", g->stage, g->dp_rank);
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    path_join(p, sizeof(p), tmp, name);
    uint32_t state_crc = state_save(ms, be, p, rank, g->dp, cfg->zero_stage);
    path_join(p, sizeof(p), tmp, "model.bin");
    model_save(ms, be, g, rd, p);
    uint32_t* crcs = gather_checksums(world, state_crc, p);
    if (manager) {
        path_join(p, sizeof(p), tmp, "manifest.json");
        write_manifest(p, ms, g, cfg, info, rd->node_local ? rd->dirs : 0, crcs);
    }
    free(crcs);
    comm_barrier(world);   // every file on every host is on disk before any DONE
    if (manager) {
        write_done(tmp);
        sync_dir(tmp);
        publish(tmp, dir, cfg->out_dir);
    }
    comm_barrier(world);
}

// ---------------------------------------------------------------------------------------------------
// Inspecting a checkpoint directory: everything a resume relies on, checked before anything is loaded,
// without exiting, so a damaged newest checkpoint can be skipped for an older complete one.

static int bad(char* why, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char* why, size_t size, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return 0;
}

// A regular file (a FIFO would block the reader, a directory has no bytes); its size into *size.
static int regular_file(const char* dir, const char* name, long long* size, char* why, size_t why_size) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    struct stat st;
    if (stat(p, &st) != 0) return bad(why, why_size, errno == ENOENT ? "%s is missing" : "%s: cannot stat", name);
    if (!S_ISREG(st.st_mode)) return bad(why, why_size, "%s is not a regular file", name);
    *size = (long long)st.st_size;
    return 1;
}

// Where the value of "key": starts in text (spaces skipped), or NULL when the key is missing; json_int and
// json_float then take it only as a whole integer or finite number.
static const char* json_after(const char* text, const char* key) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char* p = strstr(text, pat);
    if (!p) return NULL;
    for (p += strlen(pat); *p == ' '; p++) {}
    return p;
}
static int json_ends_value(const char* end) { return *end == ',' || *end == '}' || *end == '\n'; }
static int json_int(const char* text, const char* key, long long* v) {
    const char* p = json_after(text, key);
    if (!p) return 0;
    char* end;
    errno = 0;
    *v = strtoll(p, &end, 10);
    return !errno && end != p && json_ends_value(end);
}
static int json_float(const char* text, const char* key, double* v) {
    const char* p = json_after(text, key);
    if (!p) return 0;
    char* end;
    *v = strtod(p, &end);
    return end != p && json_ends_value(end) && isfinite(*v);
}

static char* read_text(const char* dir, const char* name, char* why, size_t why_size) {
    long long n = 0;
    if (!regular_file(dir, name, &n, why, why_size)) return NULL;
    if (n <= 0 || n > (1 << 20)) return bad(why, why_size, "%s has %lld bytes", name, n), NULL;
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    FILE* f = fopen(p, "rb");
    char* text = (char*)xcalloc((size_t)n + 1, 1);
    if (!f || fread(text, 1, (size_t)n, f) != (size_t)n) {
        bad(why, why_size, "cannot read %s: %s", name, f ? "short read" : strerror(errno));
        free(text);
        text = NULL;
    }
    if (f) fclose(f);
    return text;
}

// The 8 hex digits of a CRC-32 at p, followed by a quote: 1 and *crc, or 0.
static int parse_crc(const char* p, uint32_t* crc) {
    if (strspn(p, "0123456789abcdef") != 8 || p[8] != '"') return 0;
    *crc = (uint32_t)strtoul(p, NULL, 16);
    return 1;
}

// manifest.json's text, checked against the CRC-32 that DONE holds (an empty DONE, from before checksums
// were written, holds none).
static char* read_manifest(const char* dir, char* why, size_t n) {
    char* text = read_text(dir, "manifest.json", why, n);
    long long done_size = 0;
    if (!text || !regular_file(dir, "DONE", &done_size, why, n) || done_size == 0) return text;
    char* done = read_text(dir, "DONE", why, n);
    const char* at = done ? strstr(done, "{\"manifest.json\": \"") : NULL;
    uint32_t want, got;
    int ok = at && parse_crc(at + 19, &want);
    if (done && !ok) bad(why, n, "DONE is malformed");
    got = crc32_of(text, strlen(text));
    if (ok && got != want) ok = bad(why, n, "manifest.json is damaged: its CRC-32 is %08x, DONE's %08x", got, want);
    free(done);
    if (!ok) free(text);
    return ok ? text : NULL;
}

// The CRC-32 the manifest records for file `name`: 1 and *crc; 0 when it records none (written before
// checksums were), -1 when its "crc32" lacks a well-formed entry for name.
static int manifest_crc(const char* text, const char* name, uint32_t* crc) {
    const char* sums = strstr(text, "\"crc32\": {");
    if (!sums) return 0;
    const char* end = strchr(sums, '}');
    char key[80];
    snprintf(key, sizeof(key), "\"%s\": \"", name);
    const char* at = strstr(sums, key);
    return at && end && at < end && parse_crc(at + strlen(key), crc) ? 1 : -1;
}

// A file of the checkpoint against the manifest's CRC-32 of it (nothing to check when it records none).
static int verify_file(const char* dir, const char* name, const char* text, char* why, size_t n) {
    uint32_t want, got;
    int recorded = manifest_crc(text, name, &want);
    if (recorded == 0) return 1;
    if (recorded < 0) return bad(why, n, "manifest.json has no well-formed CRC-32 for %s", name);
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    if (!crc32_file(p, &got)) return bad(why, n, "cannot read %s: %s", name, strerror(errno));
    if (got != want) return bad(why, n, "%s is damaged: its CRC-32 is %08x, the manifest's %08x", name, got, want);
    return 1;
}

// The dtype the manifest's "precision" names, or -1.
static long long manifest_dtype(const char* text) {
    const char* prec = strstr(text, "\"precision\": \"");
    return !prec ? -1 : !strncmp(prec + 14, "fp32\"", 5) ? DT_FP32 : !strncmp(prec + 14, "bf16\"", 5) ? DT_BF16
                        : !strncmp(prec + 14, "fp16\"", 5) ? DT_FP16 : -1;
}

static int parse_manifest(const char* text, const char* dir, CheckpointInfo* info, char* why, size_t n) {
    long long step, tps, seed, ranks, pp, clean, left, T, dt = manifest_dtype(text);
    double scale;
    // Manifests from before pipelines (no "state_files") had one state file per data-parallel rank.
    const char* ranks_key = strstr(text, "\"state_files\":") ? "state_files" : "dp";
    if (!json_int(text, "step", &step) || !json_int(text, "tokens_per_step", &tps) || !json_int(text, "seed", &seed) ||
        !json_int(text, ranks_key, &ranks) || !json_int(text, "pp", &pp) || !json_float(text, "loss_scale", &scale) ||
        !json_int(text, "clean_steps", &clean) || !json_int(text, "overflows_left", &left))
        return bad(why, n, "manifest.json lacks a field or has a malformed one (step, tokens_per_step, seed, %s, pp, loss_scale, "
                   "clean_steps, overflows_left)", ranks_key);
    int named = run_dir_step_of(dir);
    if (step < 0 || step > INT_MAX || (named >= 0 && step != named))
        return bad(why, n, "manifest.json says step %lld, its directory's name %d", step, named);
    if (ranks < 1 || ranks > (1 << 20) || pp < 1 || pp > ranks || tps < 1 || seed < 0)
        return bad(why, n, "manifest.json: bad topology or batch (%lld state files, %lld stages, %lld tokens per step)", ranks, pp, tps);
    if (!(scale >= 1.0) || clean < 0 || left < 0) return bad(why, n, "manifest.json: bad loss-scale state");
    if (dt < 0) return bad(why, n, "manifest.json lacks a well-formed \"precision\"");
    if (!json_int(text, "T", &T) || T < 1 || T > INT_MAX) return bad(why, n, "manifest.json lacks a well-formed batch \"T\"");
    memset(info, 0, sizeof(*info));
    info->step = (int)step;
    info->tokens_per_step = tps;
    info->seed = (unsigned long long)seed;
    info->dt = (DType)dt;
    info->T = (int)T;
    info->ranks = (int)ranks;
    info->pp = (int)pp;
    info->scaler.scale = (float)scale;
    info->scaler.clean_steps = (int)clean;
    info->scaler.overflows_left = (int)left;
    long long dirs = 0;   // absent: one directory
    if (strstr(text, "\"host_dirs\":") && (!json_int(text, "host_dirs", &dirs) || dirs < 2 || dirs > ranks))
        return bad(why, n, "manifest.json has a malformed \"host_dirs\"");
    info->host_dirs = (int)dirs;
    info->has_run = run_record_parse_json(&info->run, text, why, n);
    return why[0] == '\0' ? 1 : bad(why, n, "manifest.json: %.400s", why);
}

typedef struct {
    long long start, count;   // canonical (llm.c-order) offset and length
} Span;

typedef struct {
    Span* items;
    size_t n, cap;
} SpanList;

static void span_push(SpanList* l, long long start, long long count) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        Span* grown = (Span*)realloc(l->items, l->cap * sizeof(Span));
        if (!grown) fail("out of host memory listing checkpoint spans");
        l->items = grown;
    }
    l->items[l->n++] = (Span){start, count};
}

// One state file: its header names this rank, the model's size and the run's dtype; its spans lie inside
// the model's tensors, and its bytes end after the last one. The spans go to `all`.
static int inspect_state_file(const char* dir, int rank, const GPTShape* s, long long dt, SpanList* all, char* why, size_t n) {
    char name[64], p[PATH_MAX];
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    long long size = 0;
    if (!regular_file(dir, name, &size, why, n)) return 0;
    path_join(p, sizeof(p), dir, name);
    FILE* f = fopen(p, "rb");
    if (!f) return bad(why, n, "cannot open %s: %s", name, strerror(errno));
    StateHeader h;
    int ok = fread(&h, sizeof(h), 1, f) == 1;
    if (!ok) bad(why, n, "%s is shorter than its header", name);
    else if (h.h[0] != STATE_MAGIC || h.h[1] != 2) ok = bad(why, n, "%s is not an optimizer state file (magic or version)", name);
    else if (h.h[2] != (long long)shape_param_count(s)) ok = bad(why, n, "%s holds %lld parameters, the model %zu", name, h.h[2], shape_param_count(s));
    else if (h.h[4] != dt) ok = bad(why, n, "%s holds %s state, the manifest says %s", name, dtype_name((DType)(h.h[4] & 3)), dtype_name((DType)dt));
    else if (h.h[5] != rank) ok = bad(why, n, "%s was written by rank %lld (a copied or renamed file)", name, h.h[5]);
    long long per_elem = 12 + (dt != DT_FP32 ? (long long)dtype_size((DType)dt) : 0), pos = (long long)sizeof(h);
    for (long long i = 0; ok && i < h.h[3]; i++) {
        long long span[2];
        ParamKind kind;
        int layer;
        if (fread(span, sizeof(span), 1, f) != 1) ok = bad(why, n, "%s is truncated in its span %lld", name, i);
        else if (!tensor_at_canonical(s, span[0], span[1], &kind, &layer) || span[1] < 1)
            ok = bad(why, n, "%s has a span [%lld, +%lld) outside the model's tensors", name, span[0], span[1]);
        else if (span[1] > (size - pos - 16) / per_elem) ok = bad(why, n, "%s is truncated in its span %lld", name, i);
        else {
            pos += 16 + span[1] * per_elem;
            ok = fseeko(f, (off_t)pos, SEEK_SET) == 0 || bad(why, n, "cannot seek in %s", name);
            span_push(all, span[0], span[1]);
        }
    }
    if (ok && pos != size) ok = bad(why, n, "%s has %lld bytes after its last span", name, size - pos);
    fclose(f);
    return ok;
}

static int by_start(const void* a, const void* b) {
    long long x = ((const Span*)a)->start, y = ((const Span*)b)->start;
    return (x > y) - (x < y);
}

// Together the state files must hold every parameter exactly once: a missing rank file named in the
// manifest, a rank file copied over another, or a manifest claiming fewer ranks shows as a gap or an overlap.
static int check_coverage(SpanList* all, size_t params, int ranks, char* why, size_t n) {
    qsort(all->items, all->n, sizeof(Span), by_start);
    long long next = 0;
    for (size_t i = 0; i < all->n; i++) {
        if (all->items[i].start != next)
            return bad(why, n, "the %d state files %s parameters [%lld, %lld)", ranks, all->items[i].start > next ? "miss" : "repeat",
                       all->items[i].start > next ? next : all->items[i].start, all->items[i].start > next ? all->items[i].start : next);
        next += all->items[i].count;
    }
    if (next != (long long)params) return bad(why, n, "the %d state files miss parameters [%lld, %zu)", ranks, next, params);
    return 1;
}

static int inspect_model_file(const char* dir, const GPTShape* s, char* why, size_t n) {
    long long size = 0;
    if (!regular_file(dir, "model.bin", &size, why, n)) return 0;
    if (size != 1024 + (long long)shape_param_count(s) * 4)
        return bad(why, n, "model.bin has %lld bytes, an fp32 model of this shape %lld", size, 1024 + (long long)shape_param_count(s) * 4);
    return 1;
}

#define COPY_HINT "copy the hosts' checkpoint directories onto one shared filesystem, or resume on the hosts that hold them"

// A state file missing from a checkpoint that several hosts wrote into their own directories is on one of
// the others: say so (returns 1), rather than only that it is missing.
static int missing_on_other_host(const char* dir, int rank, const CheckpointInfo* info, char* why, size_t n) {
    char name[64], p[PATH_MAX];
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    path_join(p, sizeof(p), dir, name);
    if (info->host_dirs < 2 || path_exists(p)) return 0;
    bad(why, n, "%s is missing: the checkpoint was written into %d hosts' own directories; " COPY_HINT, name, info->host_dirs);
    return 1;
}

int checkpoint_inspect(const char* dir, const GPTShape* s, CheckpointInfo* info, char* why, size_t n) {
    char* text = read_manifest(dir, why, n);
    if (!text) return 0;
    int ok = parse_manifest(text, dir, info, why, n);
    free(text);
    ok = ok && inspect_model_file(dir, s, why, n);
    SpanList all = {0};
    for (int r = 0; ok && r < info->ranks; r++)
        ok = !missing_on_other_host(dir, r, info, why, n) && inspect_state_file(dir, r, s, info->dt, &all, why, n);
    ok = ok && check_coverage(&all, shape_param_count(s), info->ranks, why, n);
    free(all.items);
    return ok;
}

// Every file's bytes against the manifest's CRC-32s: the whole checkpoint is read once.
static int verify_files(const char* dir, const CheckpointInfo* info, int verbose, char* why, size_t n) {
    char* text = read_manifest(dir, why, n);
    if (text && verbose && !strstr(text, "\"crc32\": {"))
        printf("note: %s records no checksums (written before they were): its files are not verified\n", dir);
    int ok = text && verify_file(dir, "model.bin", text, why, n);
    for (int r = 0; ok && r < info->ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        ok = verify_file(dir, name, text, why, n);
    }
    free(text);
    return ok;
}

// Another shape is another run, not damage: an error rather than a fallback. A header that cannot be read
// is left to the inspection.
static void refuse_other_shape(const char* dir, const GPTShape* want) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, "model.bin");
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) return;
    FILE* f = fopen(p, "rb");
    int h[8];
    int ok = f && fread(h, sizeof(int), 8, f) == 8;
    if (f) fclose(f);
    if (!ok || h[0] != MODEL_MAGIC) return;
    GPTShape fs = {h[4], h[6], h[5], h[3], h[7], h[2]};   // header: maxT, V, L, NH, C, Vp
    check_same_shape(&fs, want, p);
}

int checkpoint_find(const char* out_dir, const GPTShape* s, char* path, size_t size, int verbose) {
    int* steps;
    int count = run_dir_checkpoints(out_dir, &steps), found = -1;
    char why[512], skipped[2048] = "";
    size_t used = 0;
    for (int i = 0; i < count && found < 0; i++) {
        CheckpointInfo info;
        run_dir_checkpoint_path(path, size, out_dir, steps[i]);
        long long done_size = 0;
        int ok = regular_file(path, "DONE", &done_size, why, sizeof(why)) || bad(why, sizeof(why), "no DONE marker (incomplete)");
        if (ok) {
            refuse_other_shape(path, s);
            ok = checkpoint_inspect(path, s, &info, why, sizeof(why)) && verify_files(path, &info, verbose, why, sizeof(why));
        }
        if (ok) found = steps[i];
        int w = ok ? 0 : snprintf(skipped + used, sizeof(skipped) - used, "%s%s: %s", used ? "; " : "", path, why);
        used = w > 0 && used + (size_t)w < sizeof(skipped) ? used + (size_t)w : used;
    }
    free(steps);
    if (count > 0 && found < 0) fail("no usable checkpoint in %s (%s)", out_dir, skipped);
    if (found >= 0 && used && verbose) fprintf(stderr, "warning: skipping damaged checkpoints: %s\n", skipped);
    return found;
}

void checkpoint_load(const ModelState* ms, Backend* be, const char* dir, const CheckpointInfo* info) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, "model.bin");
    float* flat = model_file_read(ms->lay, p);   // checks the shape
    ms->set_from_host(ms->ctx, be, flat);
    free(flat);
    for (int r = 0; r < info->ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        StateReader reader = {xfopen(p, "rb"), p, NULL, 0};
        state_load(ms, be, &reader);
        fclose(reader.f);
    }
}

// ---------------------------------------------------------------------------------------------------
// Node-local directories (run_dir.h): each host's directory holds its ranks' state files, the manifest
// and DONE; rank 0's also model.bin. The ranks agree on what every host holds through the world.

#define WHY_SIZE 512

// Whether `ok` holds on every rank; where not, every rank's why (WHY_SIZE bytes) becomes the lowest
// failing rank's.
static int agree(Comm* world, int ok, char* why) {
    int size = comm_size(world);
    double first = ok ? 0.0 : (double)(size - comm_rank(world));
    comm_allreduce_host_max(world, &first, 1);
    if (first == 0.0) return 1;
    comm_broadcast_host(world, why, WHY_SIZE, size - (int)first);
    why[WHY_SIZE - 1] = '\0';
    return 0;
}

// For each of n state files in dir, the lowest rank whose host's directory holds it; -1 where none does.
static int* state_holders(Comm* world, const char* dir, int n) {
    int size = comm_size(world);
    double* v = (double*)xmalloc((size_t)n * sizeof(double));
    for (int r = 0; r < n; r++) {
        char name[64], p[PATH_MAX];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        v[r] = path_exists(p) ? (double)(size - comm_rank(world)) : 0.0;
    }
    comm_allreduce_host_max(world, v, n);
    int* holders = (int*)xmalloc((size_t)n * sizeof(int));
    for (int r = 0; r < n; r++) holders[r] = v[r] > 0.0 ? size - (int)v[r] : -1;
    free(v);
    return holders;
}

// What this rank's host holds of dir: DONE, a manifest (its hash), model.bin when there (well sized).
static int inspect_local(const char* dir, const GPTShape* s, CheckpointInfo* info, uint64_t* hash, int* has_model, char* why) {
    long long size = 0;
    char p[PATH_MAX];
    if (!regular_file(dir, "DONE", &size, why, WHY_SIZE)) return bad(why, WHY_SIZE, "no DONE marker (incomplete)");
    char* text = read_manifest(dir, why, WHY_SIZE);
    if (!text) return 0;
    int ok = parse_manifest(text, dir, info, why, WHY_SIZE);
    *hash = fnv1a(FNV1A_START, text, strlen(text));   // the hosts' manifests compared without sending them
    free(text);
    path_join(p, sizeof(p), dir, "model.bin");
    *has_model = path_exists(p);
    return ok && (!*has_model || inspect_model_file(dir, s, why, WHY_SIZE));
}

// State file r, inspected by its holder; its spans go to every rank's `all`.
static int state_file_spans(Comm* world, const char* dir, int r, int holder, const GPTShape* s, long long dt, SpanList* all, char* why) {
    SpanList mine = {0};
    long long head[2] = {0, 0};   // ok, spans
    if (comm_rank(world) == holder) {
        char name[64], *text = read_manifest(dir, why, WHY_SIZE);
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        head[0] = text && inspect_state_file(dir, r, s, dt, &mine, why, WHY_SIZE) && verify_file(dir, name, text, why, WHY_SIZE);
        head[1] = (long long)mine.n;
        free(text);
    }
    comm_broadcast_host(world, head, sizeof(head), holder);
    if (!head[0]) {
        comm_broadcast_host(world, why, WHY_SIZE, holder);
        why[WHY_SIZE - 1] = '\0';
        free(mine.items);
        return 0;
    }
    if (comm_rank(world) != holder) {
        mine.items = (Span*)xmalloc((size_t)head[1] * sizeof(Span));
        mine.n = (size_t)head[1];
    }
    comm_broadcast_host(world, mine.items, mine.n * sizeof(Span), holder);
    for (size_t i = 0; i < mine.n; i++) span_push(all, mine.items[i].start, mine.items[i].count);
    free(mine.items);
    return 1;
}

// model.bin is on some host, and the lowest rank that has it finds its bytes as the manifest records them.
static int model_verified(Comm* world, const char* dir, int has_model, char* why) {
    int size = comm_size(world), rank = comm_rank(world);
    double lowest = has_model ? (double)(size - rank) : 0.0;
    comm_allreduce_host_max(world, &lowest, 1);
    if (lowest == 0.0) return bad(why, WHY_SIZE, "model.bin is on no host");
    int ok = 1;
    if (rank == size - (int)lowest) {
        char mine[WHY_SIZE], *text = read_manifest(dir, mine, WHY_SIZE);
        ok = text && verify_file(dir, "model.bin", text, mine, WHY_SIZE);
        if (!ok) snprintf(why, WHY_SIZE, "on the host of rank %d: %.480s", rank, mine);
        free(text);
    }
    return agree(world, ok, why);
}

// checkpoint_inspect over the hosts' directories; the same answer (and why) on every rank.
static int inspect_hosts(Comm* world, const char* dir, const GPTShape* s, CheckpointInfo* info, char* why) {
    uint64_t hash = 0;
    int has_model = 0;
    char mine[WHY_SIZE];
    int ok = inspect_local(dir, s, info, &hash, &has_model, mine);
    if (!ok) snprintf(why, WHY_SIZE, "on the host of rank %d: %.480s", comm_rank(world), mine);
    if (!agree(world, ok, why)) return 0;
    if (!comm_all_equal(world, hash)) return bad(why, WHY_SIZE, "the hosts' manifest.json differ");
    if (!model_verified(world, dir, has_model, why)) return 0;
    int* holders = state_holders(world, dir, info->ranks);
    SpanList all = {0};
    for (int r = 0; ok && r < info->ranks; r++)
        ok = holders[r] >= 0 ? state_file_spans(world, dir, r, holders[r], s, info->dt, &all, why)
                             : bad(why, WHY_SIZE, "state_rank%d.bin is on no host; " COPY_HINT, r);
    ok = ok && check_coverage(&all, shape_param_count(s), info->ranks, why, WHY_SIZE);
    free(all.items);
    free(holders);
    return ok;
}

// The newest step of this host's that is at most bound, least over the hosts: -1 when some host has none.
static int common_candidate(Comm* world, const int* steps, int count, int bound) {
    double c = 1.0;   // negated: a max over ranks is the least step
    for (int i = 0; i < count && c > 0.0; i++)
        if (steps[i] <= bound) c = -(double)steps[i];
    comm_allreduce_host_max(world, &c, 1);
    return c > 0.0 ? -1 : (int)-c;
}

int checkpoint_find_hosts(const char* out_dir, Comm* world, const GPTShape* s, char* path, size_t size, CheckpointInfo* info,
                          int verbose) {
    int* steps;
    int count = run_dir_checkpoints(out_dir, &steps), found = -1, bound = INT_MAX;
    double any = count;
    comm_allreduce_host_max(world, &any, 1);
    char why[WHY_SIZE], skipped[2048] = "";
    size_t used = 0;
    for (int step; any > 0.0 && found < 0 && (step = common_candidate(world, steps, count, bound)) >= 0; bound = step - 1) {
        run_dir_checkpoint_path(path, size, out_dir, step);
        refuse_other_shape(path, s);
        if (inspect_hosts(world, path, s, info, why)) {
            found = step;
            break;
        }
        int w = snprintf(skipped + used, sizeof(skipped) - used, "%s%s: %s", used ? "; " : "", path, why);
        used = w > 0 && used + (size_t)w < sizeof(skipped) ? used + (size_t)w : used;
    }
    free(steps);
    if (any > 0.0 && found < 0)
        fail("no checkpoint in %s is complete on every host (%s)", out_dir, used ? skipped : "some host's directory holds none");
    if (found >= 0 && used && verbose) fprintf(stderr, "warning: skipping checkpoints incomplete on some host: %s\n", skipped);
    return found;
}

void checkpoint_load_hosts(const ModelState* ms, Backend* be, Comm* world, const char* dir, const CheckpointInfo* info) {
    // Every value a rank keeps comes from the state files (their coverage was checked); the padding starts
    // at zero, as model_file_read leaves it.
    float* flat = (float*)xcalloc(ms->lay->total, sizeof(float));
    ms->set_from_host(ms->ctx, be, flat);
    free(flat);
    int* holders = state_holders(world, dir, info->ranks);
    for (int r = 0; r < info->ranks; r++) {
        char name[64], p[PATH_MAX];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        if (holders[r] < 0) fail("%s: %s is on no host (removed after it was inspected); " COPY_HINT, dir, name);
        StateReader reader = {comm_rank(world) == holders[r] ? xfopen(p, "rb") : NULL, p, world, holders[r]};
        state_load(ms, be, &reader);
        if (reader.f) fclose(reader.f);
    }
    free(holders);
}
