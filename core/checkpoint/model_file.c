// model_file.c: llm.c model files. See model_file.h.
#include "core/checkpoint/model_file.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/fs.h"

static GPTShape shape_of_header(const int* h) { return (GPTShape){h[4], h[6], h[5], h[3], h[7], h[2]}; }   // maxT, V, L, NH, C, Vp

static GPTShape read_model_header(FILE* f, const char* path, int* version) {
    int h[256];
    xfread(h, sizeof(int), 256, f, path);
    if (h[0] != MODEL_MAGIC) fail("%s is not a model file (wrong magic %d, expected %d)", path, h[0], MODEL_MAGIC);
    if (h[1] != 3 && h[1] != 5) fail("%s has model file version %d; supported: 3 (fp32), 5 (bf16)", path, h[1]);
    *version = h[1];
    GPTShape s = shape_of_header(h);
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

void model_file_seek(FILE* f, const char* path, size_t header, size_t c, size_t elem) {
    if (fseeko(f, (off_t)(header + c * elem), SEEK_SET) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
}

void model_file_check_shape(const GPTShape* fs, const GPTShape* want, const char* path) {
    if (memcmp(fs, want, sizeof(*fs)) != 0)
        fail("%s holds a model of another shape (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, expected L=%d C=%d NH=%d V=%d Vp=%d maxT=%d)",
             path, fs->L, fs->C, fs->NH, fs->V, fs->Vp, fs->maxT, want->L, want->C, want->NH, want->V, want->Vp, want->maxT);
}

int model_file_peek_shape(const char* path, GPTShape* shape) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE* f = fopen(path, "rb");
    int h[8];
    int ok = f && fread(h, sizeof(int), 8, f) == 8;
    if (f) fclose(f);
    if (!ok || h[0] != MODEL_MAGIC) return 0;
    *shape = shape_of_header(h);
    return 1;
}

float* model_file_read(const ParamLayout* lay, const char* path) {
    GPTShape fs = model_file_shape(path);
    model_file_check_shape(&fs, &lay->shape, path);
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

int model_file_inspect(const char* dir, const GPTShape* s, char* why, size_t n) {
    long long size = 0;
    if (!regular_file_size(dir, "model.bin", &size, why, n)) return 0;
    long long want = 1024 + (long long)shape_param_count(s) * 4;
    if (size != want) return set_why(why, n, "model.bin has %lld bytes, an fp32 model of this shape %lld", size, want);
    return 1;
}
