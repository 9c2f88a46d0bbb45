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

typedef void (*TensorVisitor)(GPT* g, Backend* be, const ParamTensor* t, void* ctx);

static void for_each_canonical(GPT* g, Backend* be, TensorVisitor visit, void* ctx) {
    for (int k = 0; k < NUM_PARAM_KINDS; k++) {
        int block_kind = k >= P_LN1W && k <= P_FCPROJB;
        for (int l = 0; l < (block_kind ? g->shape.L : 1); l++)
            visit(g, be, layout_tensor(g->layout, (ParamKind)k, block_kind ? l : -1), ctx);
    }
}

typedef struct {
    FILE* f;
    const char* path;
    const void* flat;   // buffer to write from / NULL
    DType dt;           // its storage type
    int file_version;   // for reads: 3 fp32, 5 bf16
} TensorIO;

static void write_tensor(GPT* g, Backend* be, const ParamTensor* t, void* ctx) {
    TensorIO* io = (TensorIO*)ctx;
    size_t x = dtype_size(io->dt);
    void* raw = xmalloc(t->size * x);
    float* vals = (float*)xmalloc(t->size * sizeof(float));
    be_download(be, raw, (const char*)io->flat + t->offset * x, t->size * x);
    host_from_dtype(vals, raw, io->dt, t->size);
    xfwrite(vals, sizeof(float), t->size, io->f, io->path);
    free(vals);
    free(raw);
}

// Uploads host fp32 values of one tensor into the parameters (rounded to dt) and the master copy.
static void upload_tensor(GPT* g, Backend* be, const ParamTensor* t, const float* vals) {
    if (g->dt != DT_FP32) {
        void* low = xmalloc(t->size * dtype_size(g->dt));
        host_to_dtype(low, g->dt, vals, t->size);
        be_upload(be, tensor_ptr(g->params, t, g->dt), low, t->size * dtype_size(g->dt));
        free(low);
    }
    be_upload(be, g->master + t->offset, vals, t->size * sizeof(float));
}

static void read_tensor(GPT* g, Backend* be, const ParamTensor* t, void* ctx) {
    TensorIO* io = (TensorIO*)ctx;
    float* vals = (float*)xmalloc(t->size * sizeof(float));
    if (io->file_version == 5) {
        uint16_t* raw = (uint16_t*)xmalloc(t->size * 2);
        xfread(raw, 2, t->size, io->f, io->path);
        host_from_dtype(vals, raw, DT_BF16, t->size);
        free(raw);
    } else {
        xfread(vals, sizeof(float), t->size, io->f, io->path);
    }
    upload_tensor(g, be, t, vals);
    free(vals);
}

static void init_tensor(GPT* g, Backend* be, const ParamTensor* t, void* ctx) {
    float* vals = (float*)xmalloc(t->size * sizeof(float));
    init_tensor_values(vals, &g->shape, t, *(unsigned long long*)ctx);
    upload_tensor(g, be, t, vals);
    free(vals);
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

static size_t canonical_count(const GPTShape* s) {
    size_t n = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        n += param_kind_elems(s, (ParamKind)k) * ((k >= P_LN1W && k <= P_FCPROJB) ? (size_t)s->L : 1);
    return n;
}

GPTShape model_file_shape(const char* path) {
    FILE* f = xfopen(path, "rb");
    int version;
    GPTShape s = read_model_header(f, path, &version);
    fclose(f);
    long long want = 1024 + (long long)canonical_count(&s) * (version == 3 ? 4 : 2);
    long long have = file_size(path);
    if (have < want) fail("%s is truncated (%lld bytes, the header's shape needs %lld)", path, have, want);
    if (have > want) fail("%s has %lld bytes after the tensors its header describes", path, have - want);
    return s;
}

void model_file_load(GPT* g, Backend* be, const char* path) {
    GPTShape fs = model_file_shape(path);
    if (memcmp(&fs, &g->shape, sizeof(fs)) != 0)
        fail("%s holds a model of another shape (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, expected L=%d C=%d NH=%d V=%d Vp=%d maxT=%d)",
             path, fs.L, fs.C, fs.NH, fs.V, fs.Vp, fs.maxT, g->shape.L, g->shape.C, g->shape.NH, g->shape.V,
             g->shape.Vp, g->shape.maxT);
    FILE* f = xfopen(path, "rb");
    TensorIO io = {f, path, NULL, DT_FP32, 0};
    read_model_header(f, path, &io.file_version);
    for_each_canonical(g, be, read_tensor, &io);
    fclose(f);
}

void model_init_random(GPT* g, Backend* be, unsigned long long seed) { for_each_canonical(g, be, init_tensor, &seed); }

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

void model_file_save(GPT* g, Backend* be, const char* path) {
    FILE* f = xfopen(path, "wb");
    write_model_header(&g->shape, f, path);
    TensorIO io = {f, path, g->master, DT_FP32, 3};
    for_each_canonical(g, be, write_tensor, &io);
    xfclose(f, path);
}

void write_canonical_f32(GPT* g, Backend* be, const void* flat, DType dt, const char* path) {
    FILE* f = xfopen(path, "wb");
    TensorIO io = {f, path, flat, dt, 3};
    for_each_canonical(g, be, write_tensor, &io);
    xfclose(f, path);
}

// ---------------------------------------------------------------------------------------------------
// Optimizer state: header [magic, version, num_params, num_spans, working dtype], then per span
// (canonical offset, count) and its master, m, v (fp32) and, when the run is not fp32, the working copy.

typedef struct {
    long long header[8];
} StateHeader;

static void state_save(GPT* g, Backend* be, const char* path) {
    FILE* f = xfopen(path, "wb");
    const ParamLayout* lay = g->layout;
    StateHeader h = {{STATE_MAGIC, 1, (long long)lay->num_params, lay->num_tensors, g->dt, 0, 0, 0}};
    xfwrite(&h, sizeof(h), 1, f, path);
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        long long span[2] = {(long long)t->canonical, (long long)t->size};
        xfwrite(span, sizeof(span), 1, f, path);
        float* buf = (float*)xmalloc(t->size * sizeof(float));
        float* sources[3] = {g->master, g->adam_m, g->adam_v};
        for (int s = 0; s < 3; s++) {
            be_download(be, buf, sources[s] + t->offset, t->size * sizeof(float));
            xfwrite(buf, sizeof(float), t->size, f, path);
        }
        if (g->dt != DT_FP32) {
            size_t bytes = t->size * dtype_size(g->dt);
            be_download(be, buf, tensor_ptr(g->params, t, g->dt), bytes);
            xfwrite(buf, 1, bytes, f, path);
        }
        free(buf);
    }
    xfclose(f, path);
}

// The tensor holding canonical offset c (tensors do not overlap in canonical order).
static const ParamTensor* tensor_at_canonical(const ParamLayout* lay, long long c, long long count) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (c >= (long long)t->canonical && c + count <= (long long)(t->canonical + t->size)) return t;
    }
    return NULL;
}

static void state_load(GPT* g, Backend* be, const char* path) {
    FILE* f = xfopen(path, "rb");
    StateHeader h;
    xfread(&h, sizeof(h), 1, f, path);
    if (h.header[0] != STATE_MAGIC || h.header[1] != 1) fail("%s is not an optimizer state file (wrong magic)", path);
    if (h.header[2] != (long long)g->layout->num_params)
        fail("%s holds %lld parameters, the model has %zu", path, h.header[2], g->layout->num_params);
    if (h.header[4] != (long long)g->dt)
        fail("%s was written by a %s run; resuming in %s is not supported", path, dtype_name((DType)h.header[4]), dtype_name(g->dt));
    for (long long i = 0; i < h.header[3]; i++) {
        long long span[2];
        xfread(span, sizeof(span), 1, f, path);
        const ParamTensor* t = tensor_at_canonical(g->layout, span[0], span[1]);
        if (!t || span[1] < 0) fail("%s has a span [%lld, +%lld) outside the model", path, span[0], span[1]);
        size_t off = t->offset + (size_t)(span[0] - (long long)t->canonical), n = (size_t)span[1];
        float* buf = (float*)xmalloc(n * sizeof(float));
        float* dests[3] = {g->master, g->adam_m, g->adam_v};
        for (int s = 0; s < 3; s++) {
            xfread(buf, sizeof(float), n, f, path);
            be_upload(be, dests[s] + off, buf, n * sizeof(float));
        }
        if (g->dt != DT_FP32) {
            xfread(buf, dtype_size(g->dt), n, f, path);
            be_upload(be, (char*)g->params + off * dtype_size(g->dt), buf, n * dtype_size(g->dt));
        }
        free(buf);
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

static void write_manifest(const char* path, GPT* g, const Config* cfg, const CheckpointInfo* info) {
    FILE* f = xfopen(path, "w");
    const GPTShape* s = &g->shape;
    fprintf(f, "{\"step\": %d, \"tokens_per_step\": %lld, \"seed\": %llu,\n", info->step, info->tokens_per_step, info->seed);
    fprintf(f, " \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d},\n", s->L, s->C,
            s->NH, s->V, s->Vp, s->maxT);
    fprintf(f, " \"batch\": {\"B\": %d, \"T\": %d, \"ga\": %d}, \"precision\": \"%s\",\n", g->B, g->T, cfg->grad_accum,
            dtype_name(g->dt));
    fprintf(f, " \"topology\": {\"world\": 1, \"dp\": 1, \"pp\": 1, \"zero\": %d},\n", cfg->zero_stage);
    fprintf(f, " \"data\": {\"train\": \"%s\", \"shuffle\": %d, \"next_step\": %d}}\n", cfg->train_pattern, cfg->shuffle, info->step);
    xfclose(f, path);
}

void checkpoint_save(GPT* g, Backend* be, const Config* cfg, const CheckpointInfo* info) {
    char dir[PATH_MAX], tmp[PATH_MAX], p[PATH_MAX];
    make_dir(cfg->out_dir);
    char name[32];
    snprintf(name, sizeof(name), "ckpt_%06d", info->step);
    path_join(dir, sizeof(dir), cfg->out_dir, name);
    path_join(tmp, sizeof(tmp), cfg->out_dir, "ckpt_tmp");
    remove_tree(tmp);   // left by a crash mid-write
    make_dir(tmp);
    path_join(p, sizeof(p), tmp, "model.bin");
    model_file_save(g, be, p);
    path_join(p, sizeof(p), tmp, "state_rank0.bin");
    state_save(g, be, p);
    path_join(p, sizeof(p), tmp, "manifest.json");
    write_manifest(p, g, cfg, info);
    path_join(p, sizeof(p), tmp, "DONE");
    xfclose(xfopen(p, "w"), p);
    sync_dir(tmp);
    remove_tree(dir);   // an older checkpoint of the same step (a re-run); the new one is complete
    if (rename(tmp, dir) != 0) fail("cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    sync_dir(cfg->out_dir);
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

static long long json_int(const char* text, const char* key, const char* path) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char* p = strstr(text, pat);
    if (!p) fail("%s lacks \"%s\"", path, key);
    return strtoll(p + strlen(pat), NULL, 10);
}

void checkpoint_load(GPT* g, Backend* be, const char* dir, CheckpointInfo* info) {
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
    free(text);
    path_join(p, sizeof(p), dir, "model.bin");
    model_file_load(g, be, p);   // checks the shape
    path_join(p, sizeof(p), dir, "state_rank0.bin");
    state_load(g, be, p);
}
