// lora_peft.c: a PEFT adapter folder as -lora-init's adapters (lora_peft.h).
#include "core/model/lora_peft.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "core/model/lora.h"
#include "core/util/fs.h"
#include "core/util/json.h"
#include "kernels/dtype.h"

#define PEFT_CONFIG "adapter_config.json"
#define PEFT_WEIGHTS "adapter_model.safetensors"
#define PEFT_PREFIX "base_model.model."
#define PEFT_NAME_MAX 256
#define SAFETENSORS_MAX_HEADER 100000000LL   // the safetensors library's own limit
#define SAFETENSORS_MAX_DIMS 8

// adapter_config.json keys that make an adapter compute more than plain LoRA's scale * x A^T B^T, or on other
// layers than target_modules names in every block (DoRA, per-layer ranks, alphas or layers, trained copies of
// whole modules, a bias on B, ...): refused when set.
static const char* const PEFT_VARIANTS[] = {"use_dora",
                                            "lora_bias",
                                            "use_qalora",
                                            "alora_invocation_tokens",
                                            "layers_to_transform",
                                            "layers_pattern",
                                            "rank_pattern",
                                            "alpha_pattern",
                                            "modules_to_save",
                                            "layer_replication",
                                            "target_parameters",
                                            "exclude_modules",
                                            "trainable_token_indices"};

typedef struct {
    const LoraFamily* lf;
    const ModelShape* s;
    char config[PATH_MAX], weights[PATH_MAX];   // the folder's two files
} PeftFolder;

int lora_peft_is_folder(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// Value i (-1: absent) as PEFT's Python reads a setting: absent, null, false, 0, "" and empty lists or
// objects are unset.
static int json_is_set(const Json* j, int i) {
    if (i < 0) return 0;
    const JsonValue* v = &j->values[i];
    switch (v->type) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_NUMBER: return strtod(v->text, NULL) != 0.0;
    case JSON_STRING: return v->string[0] != '\0';
    case JSON_ARRAY:
    case JSON_OBJECT: return json_first(j, i) >= 0;
    default: return 1;
    }
}

// Value i (-1: absent) in a few words, for messages.
static const char* json_brief(const Json* j, int i, char* out, size_t n) {
    if (i < 0) return "missing";
    const JsonValue* v = &j->values[i];
    switch (v->type) {
    case JSON_NULL: return "null";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NUMBER: snprintf(out, n, "%.*s", (int)strspn(v->text, "+-0123456789.eE"), v->text); return out;
    case JSON_STRING: snprintf(out, n, "\"%.60s\"", v->string); return out;
    case JSON_ARRAY: return json_first(j, i) >= 0 ? "a list" : "an empty list";
    default: return json_first(j, i) >= 0 ? "an object" : "an empty object";
    }
}

// The run's names of the family's targets that bits selects, comma-separated.
static const char* target_names(const LoraFamily* lf, unsigned bits, char* out, size_t n) {
    out[0] = '\0';
    for (int t = 0; t < lf->base->num_lora_targets; t++)
        if (bits >> t & 1)
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? "," : "", lf->base->lora_targets[t]);
    return out;
}

static void module_path(const LoraFamily* lf, int layer, int target, char* out, size_t n) {
    snprintf(out, n, "%s.%d.%s", lf->base->lora_hf_blocks, layer, lf->base->lora_hf_modules[target]);
}

// PEFT's rule for a list of target_modules: an entry selects the module it names whole or as a dotted tail.
static int peft_selects(const char* module, const char* entry) {
    size_t n = strlen(module), k = strlen(entry);
    if (n == k) return strcmp(module, entry) == 0;
    return n > k && module[n - k - 1] == '.' && strcmp(module + n - k, entry) == 0;
}

static Json read_config(const PeftFolder* p, const char* folder) {
    char why[256];
    char* text = read_small_text(folder, PEFT_CONFIG, why, sizeof(why));
    if (!text)
        fail("-lora-init %s: %s (a PEFT adapter folder holds %s and %s)", folder, why, PEFT_CONFIG, PEFT_WEIGHTS);
    Json j;
    if (!json_parse_buffer(&j, text, why, sizeof(why))) fail("-lora-init %s: not JSON: %s", p->config, why);
    if (j.values[0].type != JSON_OBJECT) fail("-lora-init %s: not a JSON object", p->config);
    return j;
}

// peft_type, the variants, bias and fan_in_fan_out.
static void check_plain_lora(const PeftFolder* p, const Json* j) {
    char b[96];
    int type = json_find(j, 0, "peft_type");
    const char* name = json_get_string(j, type);
    if (!name || strcmp(name, "LORA") != 0)
        fail("-lora-init %s: peft_type is %s; only LORA adapters are read", p->config,
             json_brief(j, type, b, sizeof(b)));
    for (size_t k = 0; k < sizeof(PEFT_VARIANTS) / sizeof(PEFT_VARIANTS[0]); k++) {
        int i = json_find(j, 0, PEFT_VARIANTS[k]);
        if (json_is_set(j, i))
            fail("-lora-init %s: %s is %s; the trainer's adapters are plain LoRA", p->config, PEFT_VARIANTS[k],
                 json_brief(j, i, b, sizeof(b)));
    }
    int bias = json_find(j, 0, "bias");
    const char* bias_name = bias < 0 ? "none" : json_get_string(j, bias);
    if (!bias_name || strcmp(bias_name, "none") != 0)
        fail("-lora-init %s: bias is %s; the trainer's adapters have none (\"none\")", p->config,
             json_brief(j, bias, b, sizeof(b)));
    // PEFT sets fan_in_fan_out itself from the layer's class (true for GPT-2's Conv1D, false for nn.Linear)
    // and stores A and B with nn.Linear's shapes either way: the value changes nothing read here.
    int fifo = json_find(j, 0, "fan_in_fan_out");
    if (fifo >= 0 && j->values[fifo].type != JSON_TRUE && j->values[fifo].type != JSON_FALSE)
        fail("-lora-init %s: fan_in_fan_out is %s, not true or false", p->config, json_brief(j, fifo, b, sizeof(b)));
}

// r, lora_alpha and use_rslora against the run's -lora, -lora-alpha and -lora-rslora.
static void check_scale(const PeftFolder* p, const Json* j) {
    const LoraFamily* lf = p->lf;
    char b[96];
    int ri = json_find(j, 0, "r");
    long long r = 0;
    if (!json_get_int(j, ri, 1, INT_MAX, &r))
        fail("-lora-init %s: r is %s, not a positive whole number", p->config, json_brief(j, ri, b, sizeof(b)));
    if (r != lf->rank) fail("-lora-init %s: r %lld, the run's -lora is %d", p->config, r, lf->rank);
    int ai = json_find(j, 0, "lora_alpha");
    double alpha = 8.0;   // PEFT's default
    if (ai >= 0 && !(json_get_number(j, ai, &alpha) && alpha > 0))
        fail("-lora-init %s: lora_alpha is %s, not a positive number", p->config, json_brief(j, ai, b, sizeof(b)));
    if ((float)alpha != lf->alpha)
        fail("-lora-init %s: lora_alpha %g, the run's -lora-alpha is %g", p->config, alpha, lf->alpha);
    int si = json_find(j, 0, "use_rslora");
    if (si >= 0 && j->values[si].type != JSON_TRUE && j->values[si].type != JSON_FALSE)
        fail("-lora-init %s: use_rslora is %s, not true or false", p->config, json_brief(j, si, b, sizeof(b)));
    int rslora = si >= 0 && j->values[si].type == JSON_TRUE;
    if (rslora != lf->rslora)
        fail("-lora-init %s: use_rslora %s, the run's -lora-rslora is %d", p->config, rslora ? "true" : "false",
             lf->rslora);
}

// Whether an entry of the list target_modules (strings, checked) selects module.
static int modules_select(const Json* j, int list, const char* module) {
    for (int e = json_first(j, list); e >= 0; e = json_next(j, e))
        if (peft_selects(module, json_get_string(j, e))) return 1;
    return 0;
}

// Every entry of target_modules (a non-empty list of strings) names some layer's target.
static void check_module_entries(const PeftFolder* p, const Json* j, int list) {
    const ModelFamily* f = p->lf->base;
    char b[96], path[PEFT_NAME_MAX], known[256] = "";
    for (int t = 0; t < f->num_lora_targets; t++)
        snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", t ? ", " : "", f->lora_hf_modules[t]);
    if (list < 0 || j->values[list].type != JSON_ARRAY || json_first(j, list) < 0)
        fail("-lora-init %s: target_modules is %s; want a list of module names (a regular expression is not read)",
             p->config, json_brief(j, list, b, sizeof(b)));
    for (int e = json_first(j, list); e >= 0; e = json_next(j, e)) {
        const char* entry = json_get_string(j, e);
        if (!entry)
            fail("-lora-init %s: target_modules holds %s, not a module name", p->config,
                 json_brief(j, e, b, sizeof(b)));
        int hits = 0;
        for (int t = 0; t < f->num_lora_targets; t++)
            for (int l = 0; l < p->s->L; l++) {
                module_path(p->lf, l, t, path, sizeof(path));
                hits += peft_selects(path, entry);
            }
        if (!hits)
            fail(
                "-lora-init %s: target_modules entry \"%s\" is none of this %s model's LoRA targets (%s in each block)",
                p->config, entry, f->name, known);
    }
}

// The targets target_modules selects must be the run's, each in every layer.
static void check_targets(const PeftFolder* p, const Json* j) {
    const LoraFamily* lf = p->lf;
    int list = json_find(j, 0, "target_modules");
    check_module_entries(p, j, list);
    unsigned bits = 0;
    char path[PEFT_NAME_MAX], have[128], want[128];
    for (int t = 0; t < lf->base->num_lora_targets; t++) {
        int layers = 0;
        for (int l = 0; l < p->s->L; l++) {
            module_path(lf, l, t, path, sizeof(path));
            layers += modules_select(j, list, path);
        }
        if (layers && layers < p->s->L)
            fail("-lora-init %s: target_modules select %s in %d of the %d layers; the trainer adapts every layer",
                 p->config, lf->base->lora_hf_modules[t], layers, p->s->L);
        if (layers) bits |= 1u << t;
    }
    if (bits != lf->target_bits)
        fail("-lora-init %s: target_modules select %s; the run's -lora-targets are %s", p->config,
             target_names(lf, bits, have, sizeof(have)), target_names(lf, lf->target_bits, want, sizeof(want)));
}

// ---- adapter_model.safetensors: an 8-byte little-endian header length N, N bytes of JSON {name: {"dtype",
// "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the tensors' bytes, little-endian,
// offsets counted from the end of the header.

typedef struct {
    FILE* f;
    const char* path;
    Json header;
    long long size, data_start;   // the file's bytes; where its data begins
} Safetensors;

typedef struct {
    int width;   // bytes per value: 4 (F32) or 2 (BF16, F16)
    int bf16;
    long long begin, end;   // from data_start
} TensorBytes;

static void safetensors_open(Safetensors* st, const char* folder, const char* path) {
    char why[256];
    if (!regular_file_size(folder, PEFT_WEIGHTS, &st->size, why, sizeof(why)))
        fail("-lora-init %s: %s (a PEFT adapter folder holds %s and %s)", folder, why, PEFT_CONFIG, PEFT_WEIGHTS);
    st->path = path;
    if (st->size < 8) fail("-lora-init %s: %lld bytes, shorter than a safetensors header's length", path, st->size);
    st->f = xfopen(path, "rb");
    unsigned char le[8];
    xfread(le, 1, 8, st->f, path);
    unsigned long long n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | le[i];
    if (n > (unsigned long long)SAFETENSORS_MAX_HEADER)
        fail("-lora-init %s: header length %llu, past safetensors' limit of %lld bytes (not a safetensors file?)", path,
             n, SAFETENSORS_MAX_HEADER);
    if ((long long)n > st->size - 8)
        fail("-lora-init %s: truncated: %lld bytes, its header alone takes %llu", path, st->size, n + 8);
    char* text = (char*)xmalloc((size_t)n + 1);
    xfread(text, 1, (size_t)n, st->f, path);
    text[n] = '\0';
    if (strlen(text) != n) fail("-lora-init %s: a NUL byte in the header, at byte %zu", path, 8 + strlen(text));
    if (!json_parse_buffer(&st->header, text, why, sizeof(why))) fail("-lora-init %s: header: %s", path, why);
    if (st->header.values[0].type != JSON_OBJECT) fail("-lora-init %s: the header is not a JSON object", path);
    st->data_start = 8 + (long long)n;
}

// "[a, b, ...]" of header entry i's shape list, which must hold sizes; its dimensions in *dims, sizes in d.
static const char* tensor_shape(const Safetensors* st, int i, const char* name, long long* d, int* dims, char* out,
                                size_t n) {
    const Json* h = &st->header;
    int shape = json_find(h, i, "shape");
    if (shape < 0 || h->values[shape].type != JSON_ARRAY)
        fail("-lora-init %s: tensor %s has no shape list", st->path, name);
    *dims = 0;
    snprintf(out, n, "[");
    for (int e = json_first(h, shape); e >= 0; e = json_next(h, e)) {
        if (*dims == SAFETENSORS_MAX_DIMS || !json_get_int(h, e, 0, 1LL << 40, &d[*dims]))
            fail("-lora-init %s: tensor %s's shape is not a list of at most %d sizes", st->path, name,
                 SAFETENSORS_MAX_DIMS);
        snprintf(out + strlen(out), n - strlen(out), "%s%lld", *dims ? ", " : "", d[*dims]);
        (*dims)++;
    }
    snprintf(out + strlen(out), n - strlen(out), "]");
    return out;
}

// Header entry i, tensor `name`: a (rows, cols) tensor of F32, BF16 or F16 whose bytes the file holds.
static TensorBytes tensor_bytes(const Safetensors* st, int i, const char* name, long long rows, long long cols) {
    const Json* h = &st->header;
    if (h->values[i].type != JSON_OBJECT) fail("-lora-init %s: tensor %s's entry is not an object", st->path, name);
    long long d[SAFETENSORS_MAX_DIMS];
    int dims;
    char shape[160];
    tensor_shape(st, i, name, d, &dims, shape, sizeof(shape));
    if (dims != 2 || d[0] != rows || d[1] != cols)
        fail("-lora-init %s: tensor %s has shape %s, the run's adapters make it [%lld, %lld] (an adapter of another "
             "base model?)",
             st->path, name, shape, rows, cols);
    const char* dtype = json_get_string(h, json_find(h, i, "dtype"));
    TensorBytes tb = {0};
    if (!dtype || (strcmp(dtype, "F32") && strcmp(dtype, "BF16") && strcmp(dtype, "F16")))
        fail("-lora-init %s: tensor %s is %s; F32, BF16 and F16 are read", st->path, name,
             dtype ? dtype : "of no dtype");
    tb.width = strcmp(dtype, "F32") ? 2 : 4;
    tb.bf16 = !strcmp(dtype, "BF16");
    int off = json_find(h, i, "data_offsets"), first = json_first(h, off), second = json_next(h, first);
    if (off < 0 || h->values[off].type != JSON_ARRAY || !json_get_int(h, first, 0, LLONG_MAX / 2, &tb.begin) ||
        !json_get_int(h, second, tb.begin, LLONG_MAX / 2, &tb.end) || json_next(h, second) >= 0)
        fail("-lora-init %s: tensor %s's data_offsets are not [begin, end] with 0 <= begin <= end", st->path, name);
    if (tb.end - tb.begin != rows * cols * tb.width)
        fail("-lora-init %s: tensor %s has %lld bytes, its shape and dtype make %lld", st->path, name,
             tb.end - tb.begin, rows * cols * tb.width);
    if (st->data_start + tb.end > st->size)
        fail("-lora-init %s: truncated: %lld bytes, tensor %s ends at byte %lld", st->path, st->size, name,
             st->data_start + tb.end);
    return tb;
}

// The tensor's n values, widened to fp32 exactly.
static void tensor_read(const Safetensors* st, const TensorBytes* tb, float* out, size_t n) {
    unsigned char* raw = (unsigned char*)xmalloc(n * (size_t)tb->width);
    xfseek(st->f, st->data_start + tb->begin, SEEK_SET, st->path);
    xfread(raw, (size_t)tb->width, n, st->f, st->path);
    if (tb->width == 4) memcpy(out, raw, n * 4);
    for (size_t e = 0; tb->width == 2 && e < n; e++) {
        uint16_t bits = (uint16_t)(raw[2 * e] | raw[2 * e + 1] << 8);
        out[e] = tb->bf16 ? f32_from_bf16(bits) : f32_from_fp16(bits);
    }
    free(raw);
}

static void peft_tensor_name(const PeftFolder* p, int layer, int j, int is_b, char* out, size_t n) {
    snprintf(out, n, "%s%s.%d.%s.lora_%c.weight", PEFT_PREFIX, p->lf->base->lora_hf_blocks, layer,
             p->lf->base->lora_hf_modules[p->lf->target[j]], is_b ? 'B' : 'A');
}

static int is_adapter_name(const PeftFolder* p, const char* key) {
    char name[PEFT_NAME_MAX];
    for (int l = 0; l < p->s->L; l++)
        for (int j = 0; j < p->lf->num_targets; j++)
            for (int ab = 0; ab < 2; ab++) {
                peft_tensor_name(p, l, j, ab, name, sizeof(name));
                if (!strcmp(name, key)) return 1;
            }
    return 0;
}

// Keys being unique (json.h), more tensors than the run's adapters means one that is none of them: named.
static void refuse_extra_tensors(const PeftFolder* p, const Safetensors* st) {
    const Json* h = &st->header;
    long long count = 0, want = 2LL * p->s->L * p->lf->num_targets;
    for (int i = json_first(h, 0); i >= 0; i = json_next(h, i)) count += strcmp(h->values[i].key, "__metadata__") != 0;
    if (count <= want) return;
    char names[128];
    for (int i = json_first(h, 0); i >= 0; i = json_next(h, i))
        if (strcmp(h->values[i].key, "__metadata__") && !is_adapter_name(p, h->values[i].key))
            fail("-lora-init %s: tensor %s is none of the run's adapters (%d layers of %s; an adapter of another base "
                 "model?)",
                 st->path, h->values[i].key, p->s->L, target_names(p->lf, p->lf->target_bits, names, sizeof(names)));
}

// Every layer's A and B of every target, in the adapter file's order, into the layout's tensors.
static void read_tensors(const PeftFolder* p, const Safetensors* st, const ParamLayout* lay, float* flat) {
    const LoraFamily* lf = p->lf;
    char name[PEFT_NAME_MAX];
    for (int l = 0; l < p->s->L; l++)
        for (int j = 0; j < lf->num_targets; j++)
            for (int ab = 0; ab < 2; ab++) {
                peft_tensor_name(p, l, j, ab, name, sizeof(name));
                int i = json_find(&st->header, 0, name);
                if (i < 0) fail("-lora-init %s: tensor %s is missing", st->path, name);
                LoraGeometry g = lf->base->lora_geometry(p->s, lf->target[j]);
                long long rows = ab ? g.out : lf->rank, cols = ab ? lf->rank : g.in;
                TensorBytes tb = tensor_bytes(st, i, name, rows, cols);
                const ParamTensor* t = layout_tensor(lay, ab ? lora_kind_b(lf, j) : lora_kind_a(lf, j), l);
                if (!t) continue;   // another stage's layer
                float* whole = xmalloc((size_t)(rows * cols) * sizeof(float));
                tensor_read(st, &tb, whole, (size_t)(rows * cols));
                lora_place_whole(lay, t, whole, flat);
                free(whole);
            }
}

void lora_peft_read(const char* folder, const ParamLayout* lay, float* flat) {
    PeftFolder p = {.lf = lora_of(&lay->shape), .s = &lay->shape};
    if (!p.lf) fail("internal: adapters for a model without LoRA");
    path_join(p.config, sizeof(p.config), folder, PEFT_CONFIG);
    path_join(p.weights, sizeof(p.weights), folder, PEFT_WEIGHTS);
    Json config = read_config(&p, folder);
    check_plain_lora(&p, &config);
    check_scale(&p, &config);
    check_targets(&p, &config);
    json_free(&config);
    Safetensors st;
    safetensors_open(&st, folder, p.weights);
    refuse_extra_tensors(&p, &st);
    read_tensors(&p, &st, lay, flat);
    if (fclose(st.f) != 0) fail("-lora-init %s: cannot close", p.weights);
    json_free(&st.header);
}
