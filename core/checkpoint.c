// checkpoint.c: model files and checkpoints. See checkpoint.h.
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

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

float* model_file_read(const ParamLayout* lay, const char* path) {
    GPTShape fs = model_file_shape(path);
    const GPTShape* want = &lay->shape;
    if (memcmp(&fs, want, sizeof(fs)) != 0)
        fail("%s holds a model of another shape (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, expected L=%d C=%d NH=%d V=%d Vp=%d maxT=%d)",
             path, fs.L, fs.C, fs.NH, fs.V, fs.Vp, fs.maxT, want->L, want->C, want->NH, want->V, want->Vp, want->maxT);
    FILE* f = xfopen(path, "rb");
    int version;
    read_model_header(f, path, &version);
    size_t elem = version == 3 ? 4 : 2;
    float* flat = (float*)xcalloc(lay->total, sizeof(float));
    for (int i = 0; i < lay->num_tensors; i++) {   // a stage reads its own tensors (and its mirror's)
        const ParamTensor* t = &lay->tensors[i];
        seek_canonical(f, path, 1024, t->canonical, elem);
        if (version == 5) {
            uint16_t* raw = (uint16_t*)xmalloc(t->size * 2);
            xfread(raw, 2, t->size, f, path);
            host_from_dtype(flat + t->offset, raw, DT_BF16, t->size);
            free(raw);
        } else {
            xfread(flat + t->offset, sizeof(float), t->size, f, path);
        }
    }
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
        if (unit_is_mirror(lay, t->unit)) continue;   // stage 0 writes the embeddings
        seek_canonical(f, path, header ? 1024 : 0, t->canonical, sizeof(float));
        xfwrite(flat + t->offset, sizeof(float), t->size, f, path);
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
    FILE* f;
    const char* path;
    long long spans;
} StateWriter;

static void count_span(Zero* z, const ParamTensor* t, size_t flat, size_t si, size_t n, void* ctx) {
    ((StateWriter*)ctx)->spans++;
}

static void write_span(Zero* z, const ParamTensor* t, size_t flat, size_t si, size_t n, void* ctx) {
    StateWriter* w = (StateWriter*)ctx;
    long long span[2] = {(long long)(t->canonical + (flat - t->offset)), (long long)n};
    xfwrite(span, sizeof(span), 1, w->f, w->path);
    float* buf = (float*)xmalloc(n * sizeof(float));
    float* sources[3] = {z->master + si, z->adam_m + si, z->adam_v + si};
    for (int k = 0; k < 3; k++) {
        be_download(w->be, buf, sources[k], n * sizeof(float));
        xfwrite(buf, sizeof(float), n, w->f, w->path);
    }
    if (z->dt != DT_FP32) {
        be_download(w->be, buf, zero_param_dest(z, flat, si), n * dtype_size(z->dt));
        xfwrite(buf, dtype_size(z->dt), n, w->f, w->path);
    }
    free(buf);
}

static void state_save(Zero* z, Backend* be, const char* path, int world_rank) {
    StateWriter w = {be, xfopen(path, "wb"), path, 0};
    zero_for_each_span(z, ZERO_CHECKPOINT, count_span, &w);
    StateHeader h = {{STATE_MAGIC, 2, (long long)shape_param_count(&z->lay->shape), w.spans, z->dt, world_rank, z->size, z->stage}};
    xfwrite(&h, sizeof(h), 1, w.f, path);
    zero_for_each_span(z, ZERO_CHECKPOINT, write_span, &w);
    xfclose(w.f, path);
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
// parameters everywhere it holds them (all of them below stage 3).
static void restore_span(Zero* z, Backend* be, const ParamTensor* t, size_t flat0, size_t n, float* const vals[3], const void* params) {
    size_t x = dtype_size(z->dt), a, b, si;
    if (zero_owned_range(z, t->unit, flat0, flat0 + n, &a, &b, &si)) {
        float* dests[3] = {z->master, z->adam_m, z->adam_v};
        for (int k = 0; k < 3; k++) be_upload(be, dests[k] + si, vals[k] + (a - flat0), (b - a) * sizeof(float));
        if (z->stage == 3) be_upload(be, zero_param_dest(z, a, si), (const char*)params + (a - flat0) * x, (b - a) * x);
    }
    if (z->stage < 3) be_upload(be, zero_param_dest(z, flat0, 0), params, n * x);
}

static void state_load(Zero* z, Backend* be, const char* path) {
    FILE* f = xfopen(path, "rb");
    StateHeader h;
    xfread(&h, sizeof(h), 1, f, path);
    if (h.h[0] != STATE_MAGIC || h.h[1] != 2) fail("%s is not an optimizer state file (wrong magic or version)", path);
    size_t model_params = shape_param_count(&z->lay->shape);
    if (h.h[2] != (long long)model_params) fail("%s holds %lld parameters, the model has %zu", path, h.h[2], model_params);
    if (h.h[4] != (long long)z->dt)
        fail("%s was written by a %s run; resuming in %s is not supported", path, dtype_name((DType)h.h[4]), dtype_name(z->dt));
    size_t x = dtype_size(z->dt);
    for (long long i = 0; i < h.h[3]; i++) {
        long long span[2];
        xfread(span, sizeof(span), 1, f, path);
        ParamKind kind;
        int layer;
        if (!tensor_at_canonical(&z->lay->shape, span[0], span[1], &kind, &layer))
            fail("%s has a span [%lld, +%lld) outside the model", path, span[0], span[1]);
        size_t n = (size_t)span[1];
        const ParamTensor* t = layout_tensor(z->lay, kind, layer);
        if (!t) {   // another pipeline stage's tensor
            if (fseeko(f, (off_t)(n * (12 + (z->dt != DT_FP32 ? x : 0))), SEEK_CUR) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
            continue;
        }
        size_t flat0 = t->offset + (size_t)(span[0] - (long long)t->canonical);
        float* vals[3];
        for (int k = 0; k < 3; k++) {
            vals[k] = (float*)xmalloc(n * sizeof(float));
            xfread(vals[k], sizeof(float), n, f, path);
        }
        void* params = vals[0];   // fp32 runs: the working copy is the master
        if (z->dt != DT_FP32) {
            params = xmalloc(n * x);
            xfread(params, x, n, f, path);
        }
        restore_span(z, be, t, flat0, n, vals, params);
        if (params != vals[0]) free(params);
        for (int k = 0; k < 3; k++) free(vals[k]);
    }
    // Skipped spans seek rather than read, so a short file shows here as well as extra bytes do.
    off_t end = ftello(f);
    if (end < 0 || (long long)end != file_size(path))
        fail("%s does not end after its last span (%lld bytes, the spans cover %lld)", path, file_size(path), (long long)end);
    fclose(f);
}

// ---------------------------------------------------------------------------------------------------
// Checkpoint directories.

static void make_dir(const char* path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) fail("cannot create directory %s: %s", path, strerror(errno));
}

static void remove_tree(const char* path) {   // one level: checkpoint directories hold only files
    DIR* d = opendir(path);
    if (!d) return;
    struct dirent* e;
    char p[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        path_join(p, sizeof(p), path, e->d_name);
        if (unlink(p) != 0) fail("cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(path) != 0) fail("cannot remove %s: %s", path, strerror(errno));
}

static void sync_dir(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) fail("cannot open directory %s: %s", path, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) fail("cannot sync directory %s: %s", path, strerror(errno));
    close(fd);
}

static void write_manifest(const char* path, Zero* z, const Grid* g, const Config* cfg, const CheckpointInfo* info) {
    FILE* f = xfopen(path, "w");
    const GPTShape* s = &z->lay->shape;
    fprintf(f, "{\"step\": %d, \"tokens_per_step\": %lld, \"seed\": %llu, \"state_files\": %d,\n", info->step,
            info->tokens_per_step, info->seed, comm_size(g->world));
    fprintf(f, " \"loss_scale\": %.9g, \"clean_steps\": %d, \"overflows_left\": %d,\n", info->scaler.scale,
            info->scaler.clean_steps, info->scaler.overflows_left);
    fprintf(f, " \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d},\n", s->L, s->C,
            s->NH, s->V, s->Vp, s->maxT);
    fprintf(f, " \"batch\": {\"B\": %d, \"T\": %d, \"ga\": %d}, \"precision\": \"%s\",\n", cfg->B, cfg->T,
            cfg->grad_accum, dtype_name(z->dt));
    fprintf(f, " \"topology\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"zero\": %d},\n", comm_size(g->world), g->dp, g->pp,
            z->stage);
    fprintf(f, " \"data\": {\"train\": \"%s\", \"shuffle\": %d, \"next_step\": %d}}\n", cfg->train_pattern,
            cfg->shuffle, info->step);
    xfclose(f, path);
}

// model.bin: rank 0 sizes the file, then each stage's replica-0 rank gathers its stage's master weights
// and writes its tensors in place, so no rank ever holds more than its own stage.
static void model_save(Zero* z, Backend* be, const Grid* g, const char* path) {
    if (comm_rank(g->world) == 0) model_file_create(&z->lay->shape, path, 1);
    comm_barrier(g->world);
    int writer = g->dp_rank == 0;
    float* flat = writer ? (float*)xcalloc(z->lay->total, sizeof(float)) : NULL;
    zero_master_to_host(z, be, flat);   // collective over the stage's replicas
    if (writer) model_file_write_part(z->lay, flat, path, 1);
    free(flat);
}

void checkpoint_save(Zero* z, Backend* be, const Grid* g, const Config* cfg, const CheckpointInfo* info) {
    char dir[PATH_MAX], tmp[PATH_MAX], p[PATH_MAX], name[64];
    Comm* world = g->world;
    int rank = comm_rank(world), root = rank == 0;
    snprintf(name, sizeof(name), "ckpt_%06d", info->step);
    path_join(dir, sizeof(dir), cfg->out_dir, name);
    path_join(tmp, sizeof(tmp), cfg->out_dir, "ckpt_tmp");
    if (root) {
        make_dir(cfg->out_dir);
        remove_tree(tmp);   // left by a crash mid-write
        make_dir(tmp);
    }
    comm_barrier(world);
    if (!zero_tied_in_sync(z, be))   // a checkpoint keeps only stage 0's copy: never save a diverged pair
        fail("internal: the last stage's copy of the tied embedding differs from stage 0's (replica %d)", g->dp_rank);
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    path_join(p, sizeof(p), tmp, name);
    state_save(z, be, p, rank);
    path_join(p, sizeof(p), tmp, "model.bin");
    model_save(z, be, g, p);
    if (root) {
        path_join(p, sizeof(p), tmp, "manifest.json");
        write_manifest(p, z, g, cfg, info);
    }
    comm_barrier(world);   // every file is on disk before DONE
    if (root) {
        path_join(p, sizeof(p), tmp, "DONE");
        xfclose(xfopen(p, "w"), p);
        sync_dir(tmp);
        remove_tree(dir);   // an older checkpoint of the same step (a re-run); the new one is complete
        if (rename(tmp, dir) != 0) fail("cannot rename %s to %s: %s", tmp, dir, strerror(errno));
        sync_dir(cfg->out_dir);
    }
    comm_barrier(world);
}

int checkpoint_latest(const char* out_dir, char* path, size_t path_size) {
    DIR* d = opendir(out_dir);
    if (!d) return -1;
    int best = -1;
    struct dirent* e;
    char done[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        int step;
        char tail;
        if (sscanf(e->d_name, "ckpt_%d%c", &step, &tail) != 1) continue;   // skips ckpt_tmp
        path_join(done, sizeof(done), out_dir, e->d_name);
        if (strlen(done) + 6 > sizeof(done)) continue;
        strcat(done, "/DONE");
        if (file_size(done) < 0 || step <= best) continue;
        best = step;
        path_join(path, path_size, out_dir, e->d_name);
    }
    closedir(d);
    return best;
}

static const char* json_value(const char* text, const char* key, const char* path) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char* p = strstr(text, pat);
    if (!p) fail("%s lacks \"%s\"", path, key);
    return p + strlen(pat);
}

static long long json_int(const char* text, const char* key, const char* path) {
    return strtoll(json_value(text, key, path), NULL, 10);
}

void checkpoint_load(Zero* z, Backend* be, const char* dir, CheckpointInfo* info) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, "manifest.json");
    long long n = file_size(p);
    if (n <= 0 || n > (1 << 20)) fail("checkpoint %s has no readable manifest.json", dir);
    char* text = (char*)xcalloc((size_t)n + 1, 1);
    FILE* f = xfopen(p, "rb");
    xfread(text, 1, (size_t)n, f, p);
    fclose(f);
    info->step = (int)json_int(text, "step", p);
    info->tokens_per_step = json_int(text, "tokens_per_step", p);
    info->seed = (unsigned long long)json_int(text, "seed", p);
    // Manifests from before pipelines (no "state_files") had one state file per data-parallel rank.
    info->ranks = (int)json_int(text, strstr(text, "\"state_files\":") ? "state_files" : "dp", p);
    info->pp = (int)json_int(text, "pp", p);
    info->scaler.scale = strtof(json_value(text, "loss_scale", p), NULL);
    info->scaler.clean_steps = (int)json_int(text, "clean_steps", p);
    info->scaler.overflows_left = (int)json_int(text, "overflows_left", p);
    free(text);
    if (!(info->scaler.scale >= 1.0f)) fail("%s: bad loss scale", p);
    if (info->ranks < 1 || info->pp < 1) fail("%s: bad topology (%d state files, %d stages)", p, info->ranks, info->pp);
    path_join(p, sizeof(p), dir, "model.bin");
    float* flat = model_file_read(z->lay, p);   // checks the shape
    zero_set_from_host(z, be, flat);
    free(flat);
    for (int r = 0; r < info->ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        if (file_size(p) < 0) fail("checkpoint %s lacks %s (written by %d ranks)", dir, name, info->ranks);
        state_load(z, be, p);
    }
}
