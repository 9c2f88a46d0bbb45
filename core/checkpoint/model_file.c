// model_file.c: llm.c model files. See model_file.h.
#include "core/checkpoint/model_file.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "core/model/lora.h"
#include "core/model/lora_peft.h"
#include "core/util/fs.h"
#include "core/models/catalog.h"

// Slots 2-7 are llm.c's (maxT, V, L, NH, C, Vp); slot 8 names the family (0: GPT-2, llm.c's own files), whose
// fields follow. 0 when the family is unknown.
static int shape_of_header(const int32_t* h, ModelShape* s) {
    const ModelFamily* fam = family_of_file_id(h[8]);
    if (!fam) return 0;
    fam->header_read(h, s);
    s->family = fam;
    s->V = h[3], s->Vp = h[7], s->maxT = h[2];
    return 1;
}

static ModelShape read_model_header(FILE* f, const char* path, int* version) {
    int32_t h[256];
    xfread(h, sizeof(int32_t), 256, f, path);
    if (h[0] != MODEL_MAGIC) fail("%s is not a model file (wrong magic %d, expected %d)", path, h[0], MODEL_MAGIC);
    if (h[1] != 3 && h[1] != 5) fail("%s has model file version %d; supported: 3 (fp32), 5 (bf16)", path, h[1]);
    *version = h[1];
    ModelShape s;
    if (!shape_of_header(h, &s)) fail("%s names model family %d in its header (slot 8), which this build does not know", path, h[8]);
    shape_validate(&s);
    return s;
}

ModelShape model_file_shape(const char* path) {
    FILE* f = xfopen(path, "rb");
    int version;
    ModelShape s = read_model_header(f, path, &version);
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

void model_file_seek(FILE* f, const char* path, size_t header, size_t c, size_t elem) {
    if (fseeko(f, (off_t)(header + c * elem), SEEK_SET) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
}

void model_file_check_shape(const ModelShape* fs, const ModelShape* want, const char* path) {
    if (shape_equal(fs, want)) return;
    char got[300], expected[300];
    shape_describe(fs, got, sizeof(got));
    shape_describe(want, expected, sizeof(expected));
    fail("%s holds a model of another shape (%s, expected %s)", path, got, expected);
}

int model_file_peek_shape(const char* path, ModelShape* shape) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE* f = fopen(path, "rb");
    int32_t h[256];
    int ok = f && fread(h, sizeof(int32_t), 256, f) == 256;
    if (f) fclose(f);
    return ok && h[0] == MODEL_MAGIC && shape_of_header(h, shape);
}

float* model_file_read(const ParamLayout* lay, const char* path) {
    ModelShape fs = model_file_shape(path), base = lora_base_shape(&lay->shape);
    model_file_check_shape(&fs, &base, path);
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
        if (t->kind >= base.family->num_kinds) continue;   // LoRA's adapters: not the file's
        for (size_t j = 0; j < t->size; j += t->run) {
            model_file_seek(f, path, 1024, tensor_canonical(t, j), elem);
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

ModelShape model_resolve(const char* model, int* is_spec) {
    ModelShape s;
    *is_spec = shape_from_spec(model, &s);
    if (*is_spec) return s;
    if (file_size(model) < 0) fail("-e %s: neither a model shape (GPT-2's d12|d24|d36|d48|L<n>C<n>H<n>..., a Llama family's smollm2-135m|...|llama:..., see -h) nor an existing file", model);
    return model_file_shape(model);
}

float* model_start(const ParamLayout* lay, const char* model, int is_spec, unsigned long long seed, const char* adapters) {
    float* flat = is_spec ? model_init(lay, seed) : model_file_read(lay, model);
    const LoraFamily* lf = lora_of(&lay->shape);
    if (lf && adapters && lora_peft_is_folder(adapters)) lora_peft_read(adapters, lay, flat);
    else if (lf && adapters) lora_read_adapters(adapters, lay, flat);
    for (int i = 0; i < lay->num_tensors && lf && !adapters && !is_spec; i++)   // model_init did them from a shape
        if (lay->tensors[i].kind >= lf->base->num_kinds) init_tensor_values(flat + lay->tensors[i].offset, &lay->shape, &lay->tensors[i], seed);
    return flat;
}

static void write_model_header(const ModelShape* s, FILE* f, const char* path) {
    int32_t h[256] = {0};
    h[0] = MODEL_MAGIC;
    h[1] = 3;
    h[2] = s->maxT;
    h[3] = s->V;
    h[4] = s->L;
    h[5] = s->NH;
    h[6] = s->C;
    h[7] = s->Vp;
    h[8] = s->family->file_id;
    s->family->header_write(s, h);
    xfwrite(h, sizeof(int32_t), 256, f, path);
}

void model_file_create(const ModelShape* s, const char* path, int header) {
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
            model_file_seek(f, path, header ? 1024 : 0, tensor_canonical(t, j), sizeof(float));
            xfwrite(flat + t->offset + j, sizeof(float), t->run, f, path);
        }
    }
    xfclose(f, path);
}

void model_file_write(const ParamLayout* lay, const float* flat, const char* path, int header) {
    model_file_create(&lay->shape, path, header);
    model_file_write_part(lay, flat, path, header);
}

int model_file_inspect(const char* dir, const ModelShape* s, char* why, size_t n) {
    long long size = 0;
    if (!regular_file_size(dir, "model.bin", &size, why, n)) return 0;
    long long want = 1024 + (long long)shape_param_count(s) * 4;
    if (size != want) return set_why(why, n, "model.bin has %lld bytes, an fp32 model of this shape %lld", size, want);
    return 1;
}
