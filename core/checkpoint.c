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
// The 16 llm.c tensors in file order, each kind stacked over layers.

#define NUM_FILE_TENSORS(lay) (4 + 12 * (lay)->shape.L)

// The i-th tensor in file order, or NULL when the layout (a pipeline stage's) does not hold it.
static const ParamTensor* canonical_tensor(const ParamLayout* lay, int i) {
    int L = lay->shape.L;
    if (i < 2) return layout_tensor(lay, (ParamKind)i, -1);
    if (i < 2 + 12 * L) return layout_tensor(lay, (ParamKind)(P_LN1W + (i - 2) / L), (i - 2) % L);
    return layout_tensor(lay, (ParamKind)(P_LNFW + (i - 2 - 12 * L)), -1);
}

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

// SIZE_MAX when the count does not fit: a header's shape is untrusted, and C = 2^30 with L = 256 overflows.
static size_t canonical_count(const GPTShape* s) {
    size_t n = 0, e;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        if (__builtin_mul_overflow(param_kind_elems(s, (ParamKind)k), (k >= P_LN1W && k <= P_FCPROJB) ? (size_t)s->L : 1, &e) ||
            __builtin_add_overflow(n, e, &n))
            return SIZE_MAX;
    return n;
}

GPTShape model_file_shape(const char* path) {
    FILE* f = xfopen(path, "rb");
    int version;
    GPTShape s = read_model_header(f, path, &version);
    fclose(f);
    size_t count = canonical_count(&s), elem = version == 3 ? 4 : 2;
    long long have = file_size(path);   // >= 1024: the header was read
    // Compared in elements, so a huge shape never overflows the byte count it would need.
    if (count > (size_t)(have - 1024) / elem)
        fail("%s is truncated (%lld bytes, the header's shape needs 1024 + %zu x %zu)", path, have, count, elem);
    long long want = 1024 + (long long)(count * elem);
    if (have > want) fail("%s has %lld bytes after the tensors its header describes", path, have - want);
    return s;
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
    float* flat = (float*)xcalloc(lay->total, sizeof(float));
    for (int i = 0; i < NUM_FILE_TENSORS(lay); i++) {
        const ParamTensor* t = canonical_tensor(lay, i);
        if (!t) fail("internal: model files are read into whole-model layouts");
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

void model_file_write(const ParamLayout* lay, const float* flat, const char* path, int header) {
    FILE* f = xfopen(path, "wb");
    if (header) write_model_header(&lay->shape, f, path);
    for (int i = 0; i < NUM_FILE_TENSORS(lay); i++) {
        const ParamTensor* t = canonical_tensor(lay, i);
        if (!t) fail("internal: model files are written from whole-model layouts");
        xfwrite(flat + t->offset, sizeof(float), t->size, f, path);
    }
    xfclose(f, path);
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

static void state_save(Zero* z, Backend* be, const char* path) {
    StateWriter w = {be, xfopen(path, "wb"), path, 0};
    zero_for_each_span(z, 1, count_span, &w);
    StateHeader h = {{STATE_MAGIC, 2, (long long)z->lay->num_params, w.spans, z->dt, z->rank, z->size, z->stage}};
    xfwrite(&h, sizeof(h), 1, w.f, path);
    zero_for_each_span(z, 1, write_span, &w);
    xfclose(w.f, path);
}

// The tensor holding canonical range [c, c + count) (spans never cross tensors).
static const ParamTensor* tensor_at_canonical(const ParamLayout* lay, long long c, long long count) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        long long first = (long long)t->canonical, size = (long long)t->size;
        // No c + count: both come from the file, and the sum can overflow.
        if (c >= first && c - first <= size && count >= 0 && count <= size - (c - first)) return t;
    }
    return NULL;
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
    if (h.h[2] != (long long)z->lay->num_params)
        fail("%s holds %lld parameters, the model has %zu", path, h.h[2], z->lay->num_params);
    if (h.h[4] != (long long)z->dt)
        fail("%s was written by a %s run; resuming in %s is not supported", path, dtype_name((DType)h.h[4]), dtype_name(z->dt));
    size_t x = dtype_size(z->dt);
    for (long long i = 0; i < h.h[3]; i++) {
        long long span[2];
        xfread(span, sizeof(span), 1, f, path);
        const ParamTensor* t = tensor_at_canonical(z->lay, span[0], span[1]);
        if (!t) fail("%s has a span [%lld, +%lld) outside the model", path, span[0], span[1]);
        size_t n = (size_t)span[1], flat0 = t->offset + (size_t)(span[0] - (long long)t->canonical);
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
    char extra;
    if (fread(&extra, 1, 1, f) == 1) fail("%s has trailing bytes after its last span", path);
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

static void write_manifest(const char* path, Zero* z, const Config* cfg, const CheckpointInfo* info) {
    FILE* f = xfopen(path, "w");
    const GPTShape* s = &z->lay->shape;
    fprintf(f, "{\"step\": %d, \"tokens_per_step\": %lld, \"seed\": %llu, \"dp\": %d,\n", info->step,
            info->tokens_per_step, info->seed, z->size);
    fprintf(f, " \"loss_scale\": %.9g, \"clean_steps\": %d, \"overflows_left\": %d,\n", info->scaler.scale,
            info->scaler.clean_steps, info->scaler.overflows_left);
    fprintf(f, " \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d},\n", s->L, s->C,
            s->NH, s->V, s->Vp, s->maxT);
    fprintf(f, " \"batch\": {\"B\": %d, \"T\": %d, \"ga\": %d}, \"precision\": \"%s\",\n", cfg->B, cfg->T,
            cfg->grad_accum, dtype_name(z->dt));
    fprintf(f, " \"topology\": {\"world\": %d, \"pp\": 1, \"zero\": %d},\n", z->size, z->stage);
    fprintf(f, " \"data\": {\"train\": \"%s\", \"shuffle\": %d, \"next_step\": %d}}\n", cfg->train_pattern,
            cfg->shuffle, info->step);
    xfclose(f, path);
}

void checkpoint_save(Zero* z, Backend* be, Comm* world, const Config* cfg, const CheckpointInfo* info) {
    char dir[PATH_MAX], tmp[PATH_MAX], p[PATH_MAX], name[64];
    int root = comm_rank(world) == 0;
    snprintf(name, sizeof(name), "ckpt_%06d", info->step);
    path_join(dir, sizeof(dir), cfg->out_dir, name);
    path_join(tmp, sizeof(tmp), cfg->out_dir, "ckpt_tmp");
    if (root) {
        make_dir(cfg->out_dir);
        remove_tree(tmp);   // left by a crash mid-write
        make_dir(tmp);
    }
    comm_barrier(world);
    snprintf(name, sizeof(name), "state_rank%d.bin", z->rank);
    path_join(p, sizeof(p), tmp, name);
    state_save(z, be, p);
    float* flat = root ? (float*)xcalloc(z->lay->total, sizeof(float)) : NULL;
    zero_master_to_host(z, be, flat);   // collective
    if (root) {
        path_join(p, sizeof(p), tmp, "model.bin");
        model_file_write(z->lay, flat, p, 1);
        path_join(p, sizeof(p), tmp, "manifest.json");
        write_manifest(p, z, cfg, info);
    }
    free(flat);
    comm_barrier(world);   // every state file is on disk before DONE
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
    info->dp = (int)json_int(text, "dp", p);
    info->scaler.scale = strtof(json_value(text, "loss_scale", p), NULL);
    info->scaler.clean_steps = (int)json_int(text, "clean_steps", p);
    info->scaler.overflows_left = (int)json_int(text, "overflows_left", p);
    free(text);
    if (!(info->scaler.scale >= 1.0f)) fail("%s: bad loss scale", p);
    if (info->dp < 1) fail("%s: bad data-parallel size %d", p, info->dp);
    path_join(p, sizeof(p), dir, "model.bin");
    float* flat = model_file_read(z->lay, p);   // checks the shape
    zero_set_from_host(z, be, flat);
    free(flat);
    for (int r = 0; r < info->dp; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        if (file_size(p) < 0) fail("checkpoint %s lacks %s (written by %d data-parallel ranks)", dir, name, info->dp);
        state_load(z, be, p);
    }
}
