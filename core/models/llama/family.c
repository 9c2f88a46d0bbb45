// family.c: the Llama family described for the trainer (family.h): kinds, cuts, shapes, file fields, costs.
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model/model.h"
#include "core/models/llama/llama.h"
#include "kernels/dtype.h"

#define EMB(name) {name, UNIT_EMBEDDING, INIT_NORMAL, 1, 1, 0, OPT_ADAMW}
#define BLK(name, init, decay) {name, UNIT_BLOCK, init, decay, 0, 0, OPT_ADAMW}
#define JOINED(name, init, decay) {name, UNIT_BLOCK, init, decay, 0, 1, OPT_ADAMW}
static const KindInfo KINDS[LLAMA_NUM_KINDS] = {
    [LLAMA_WTE] = EMB("wte"),
    [LLAMA_ATTN_NORM] = BLK("attn_norm", INIT_ONES, 0),
    [LLAMA_WQ] = BLK("wq", INIT_NORMAL, 1),
    [LLAMA_WKV] = JOINED("wkv", INIT_NORMAL, 1),
    [LLAMA_BQ] = BLK("bq", INIT_ZEROS, 0),
    [LLAMA_BKV] = JOINED("bkv", INIT_ZEROS, 0),
    [LLAMA_Q_NORM] = BLK("q_norm", INIT_ONES, 0),
    [LLAMA_K_NORM] = BLK("k_norm", INIT_ONES, 0),
    [LLAMA_WO] = BLK("wo", INIT_RESIDUAL, 1),
    [LLAMA_MLP_NORM] = BLK("mlp_norm", INIT_ONES, 0),
    [LLAMA_GATE_UP] = BLK("gate_up", INIT_NORMAL, 1),
    [LLAMA_DOWN] = BLK("down", INIT_RESIDUAL, 1),
    [LLAMA_FINAL_NORM] = {"final_norm", UNIT_FINAL, INIT_ONES, 0, 0, 0},
    [LLAMA_HEAD] = {"lm_head", UNIT_FINAL, INIT_NORMAL, 1, 1, 0},
};
#undef EMB
#undef BLK
#undef JOINED

static size_t kind_elems(const ModelShape* s, int k) {
    size_t C = (size_t)s->C, D = (size_t)s->D, NH = (size_t)s->NH, KV = (size_t)s->KV, F = (size_t)s->F;
    switch ((LlamaKind)k) {
        case LLAMA_WTE: return (size_t)s->Vp * C;
        case LLAMA_WQ: return NH * D * C;
        case LLAMA_WKV: return 2 * KV * D * C;
        case LLAMA_BQ: return s->qkv_bias ? NH * D : 0;
        case LLAMA_BKV: return s->qkv_bias ? 2 * KV * D : 0;
        case LLAMA_Q_NORM: case LLAMA_K_NORM: return s->qk_norm ? D : 0;
        case LLAMA_WO: return C * NH * D;
        case LLAMA_GATE_UP: return 2 * F * C;
        case LLAMA_DOWN: return C * F;
        case LLAMA_HEAD: return s->tied ? 0 : (size_t)s->Vp * C;
        default: return C;   // the norms
    }
}

// Megatron's cut: q by heads, k and v each by kv heads (copied when fewer than the ranks), gate and up each
// by hidden rows (column-parallel); wo and down by columns (row-parallel); the embedding and the head by
// vocabulary rows; the norms whole.
static TensorCut kind_cut(const ModelShape* s, int k) {
    size_t C = (size_t)s->C, D = (size_t)s->D, Vp = (size_t)s->Vp, NH = (size_t)s->NH, KV = (size_t)s->KV;
    switch ((LlamaKind)k) {
        case LLAMA_WQ: return (TensorCut){CUT_ROWS, NH * D, C, 1, NH};
        case LLAMA_WKV: return (TensorCut){CUT_ROWS, 2 * KV * D, C, 2, KV};
        case LLAMA_BQ: return (TensorCut){CUT_ROWS, NH * D, 1, 1, NH};
        case LLAMA_BKV: return (TensorCut){CUT_ROWS, 2 * KV * D, 1, 2, KV};
        case LLAMA_WO: return (TensorCut){CUT_COLS, C, (size_t)s->NH * D, 1, 0};
        case LLAMA_GATE_UP: return (TensorCut){CUT_ROWS, 2 * (size_t)s->F, C, 2, 0};
        case LLAMA_DOWN: return (TensorCut){CUT_COLS, C, (size_t)s->F, 1, 0};
        case LLAMA_WTE: case LLAMA_HEAD: return (TensorCut){CUT_ROWS, Vp, C, 1, 0};
        default: return (TensorCut){CUT_NONE, kind_elems(s, k), 1, 1, 0};
    }
}

static ModelShape llama_shape(int L, int C, int NH, int KV, int D, int F, int V, int maxT, float theta, float eps, int tied,
                              int qk_norm, int qkv_bias) {
    ModelShape s = {.family = &LLAMA_FAMILY, .L = L, .C = C, .NH = NH, .V = V, .Vp = padded_vocab(V), .maxT = maxT, .KV = KV,
                    .D = D, .F = F, .tied = tied, .qk_norm = qk_norm, .qkv_bias = qkv_bias, .eps = eps,
                    .rope = {.scaling = ROPE_NONE, .theta = theta, .factor = 1.0f}};
    return s;
}

// The published configurations (their config.json files on the Hugging Face hub).
typedef struct {
    const char* name;
    int L, C, NH, KV, D, F, V, maxT;
    float theta, eps;
    int tied, qk_norm;
    float llama3_factor;   // rope_scaling llama3 (low 1, high 4, original 8192), or 0
} Named;
static const Named NAMED[] = {
    {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, 1, 0, 0},
    {"smollm2-360m", 32, 960, 15, 5, 64, 2560, 49152, 8192, 100000.0f, 1e-5f, 1, 0, 0},
    {"smollm2-1.7b", 24, 2048, 32, 32, 64, 8192, 49152, 8192, 130000.0f, 1e-5f, 1, 0, 0},
    {"llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, 0, 32.0f},
    {"llama3.2-3b", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, 0, 32.0f},
    {"llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f, 0, 0, 8.0f},
    {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, 1, 1, 0},
    {"qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f, 1, 1, 0},
};

static int parse_named(const char* spec, ModelShape* out) {
    for (size_t i = 0; i < sizeof(NAMED) / sizeof(NAMED[0]); i++) {
        const Named* n = &NAMED[i];
        if (strcmp(spec, n->name) != 0) continue;
        *out = llama_shape(n->L, n->C, n->NH, n->KV, n->D, n->F, n->V, n->maxT, n->theta, n->eps, n->tied, n->qk_norm, 0);
        if (n->llama3_factor > 0)
            out->rope = (Rope){ROPE_LLAMA3, n->theta, n->llama3_factor, 1.0f, 4.0f, 8192};
        return 1;
    }
    return 0;
}

#define SPEC_SYNTAX "llama:L<n>,C<n>,H<n>,F<n>[,K<kv heads>][,D<head size>][,V<n>][,T<n>][,theta<x>][,eps<x>][,tied][,qknorm][,qkvbias]" \
                    "[,rope-linear[:]<factor>][,rope-llama3[:]<factor>/<low>/<high>/<original>]"

static double number(const char* spec, const char* field, const char* text) {
    char* end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v > 0) || v > 1e12) fail("bad model spec '%s': field '%s' needs a positive number", spec, field);
    return v;
}

static int whole(const char* spec, const char* field, const char* text) {
    double v = number(spec, field, text);
    if (v != floor(v) || v > (1 << 30)) fail("bad model spec '%s': field '%s' needs a positive integer", spec, field);
    return (int)v;
}

static void parse_rope_llama3(const char* spec, const char* text, Rope* r) {
    if (*text == ':') text++;
    float f, lo, hi;
    int orig, used = 0;
    if (sscanf(text, "%f/%f/%f/%d%n", &f, &lo, &hi, &orig, &used) != 4 || text[used] || !(f > 0) || !(lo > 0) || !(hi > lo) ||
        orig < 1)
        fail("bad model spec '%s': rope-llama3 needs <factor>/<low>/<high>/<original> with high > low > 0", spec);
    *r = (Rope){ROPE_LLAMA3, r->theta, f, lo, hi, orig};
}

// The fields of a custom spec (SPEC_SYNTAX), as data: what each sets, and where in the shape. Fields that set
// one thing (rope-linear and rope-llama3 both set the RoPE scaling) share a Setting, so that a spec setting a
// thing twice, with the same field or another, is refused instead of the last one winning.
typedef enum {
    SET_L, SET_C, SET_H, SET_F, SET_K, SET_D, SET_V, SET_T, SET_THETA, SET_EPS, SET_TIED, SET_QK_NORM, SET_QKV_BIAS,
    SET_ROPE_SCALING, NUM_SETTINGS
} Setting;
static const char* const SETTING_NAMES[NUM_SETTINGS] = {
    "the layers", "the channels", "the heads", "the MLP width", "the kv heads", "the head size", "the vocabulary",
    "the context length", "the RoPE theta", "the RMSNorm eps", "the tied head", "the q/k norms", "the q/k/v biases",
    "the RoPE scaling"};
typedef enum { FIELD_INT, FIELD_NUMBER, FIELD_FLAG, FIELD_ROPE_LINEAR, FIELD_ROPE_LLAMA3 } FieldKind;
typedef struct {
    const char* name;   // an integer field's letter, digits follow; a number's or a scaling's prefix; a flag whole
    FieldKind kind;
    Setting sets;
    size_t offset;      // of the int (FIELD_INT, FIELD_FLAG) or float (FIELD_NUMBER) in ModelShape
} SpecField;
static const SpecField SPEC_FIELDS[] = {
    {"L", FIELD_INT, SET_L, offsetof(ModelShape, L)},
    {"C", FIELD_INT, SET_C, offsetof(ModelShape, C)},
    {"H", FIELD_INT, SET_H, offsetof(ModelShape, NH)},
    {"F", FIELD_INT, SET_F, offsetof(ModelShape, F)},
    {"K", FIELD_INT, SET_K, offsetof(ModelShape, KV)},
    {"D", FIELD_INT, SET_D, offsetof(ModelShape, D)},
    {"V", FIELD_INT, SET_V, offsetof(ModelShape, V)},
    {"T", FIELD_INT, SET_T, offsetof(ModelShape, maxT)},
    {"theta", FIELD_NUMBER, SET_THETA, offsetof(ModelShape, rope.theta)},
    {"eps", FIELD_NUMBER, SET_EPS, offsetof(ModelShape, eps)},
    {"tied", FIELD_FLAG, SET_TIED, offsetof(ModelShape, tied)},
    {"qknorm", FIELD_FLAG, SET_QK_NORM, offsetof(ModelShape, qk_norm)},
    {"qkvbias", FIELD_FLAG, SET_QKV_BIAS, offsetof(ModelShape, qkv_bias)},
    {"rope-linear", FIELD_ROPE_LINEAR, SET_ROPE_SCALING, 0},
    {"rope-llama3", FIELD_ROPE_LLAMA3, SET_ROPE_SCALING, 0},
};

static const SpecField* spec_field(const char* tok) {
    for (size_t i = 0; i < sizeof(SPEC_FIELDS) / sizeof(SPEC_FIELDS[0]); i++) {
        const SpecField* f = &SPEC_FIELDS[i];
        size_t n = strlen(f->name);
        if (strncmp(tok, f->name, n) != 0) continue;
        if (f->kind == FIELD_FLAG ? tok[n] == 0 : f->kind == FIELD_INT ? tok[n] >= '0' && tok[n] <= '9' : 1) return f;
    }
    return NULL;
}

// One comma-separated field of a custom spec into s; set_by[k]: the field that set setting k, or NULL.
static void parse_field(const char* spec, const char* tok, ModelShape* s, const char** set_by) {
    const SpecField* f = spec_field(tok);
    if (!f) fail("bad model spec '%s': unknown field '%s' (expected %s)", spec, tok, SPEC_SYNTAX);
    if (set_by[f->sets])
        fail("bad model spec '%s': '%s' and '%s' both set %s; give one", spec, set_by[f->sets], tok, SETTING_NAMES[f->sets]);
    set_by[f->sets] = tok;
    const char* value = tok + strlen(f->name);
    char* at = (char*)s + f->offset;
    switch (f->kind) {
        case FIELD_INT: *(int*)at = whole(spec, f->name, value); break;
        case FIELD_NUMBER: *(float*)at = (float)number(spec, f->name, value); break;
        case FIELD_FLAG: *(int*)at = 1; break;
        case FIELD_ROPE_LINEAR:
            s->rope.scaling = ROPE_LINEAR, s->rope.factor = (float)number(spec, f->name, value + (*value == ':'));
            break;
        case FIELD_ROPE_LLAMA3: parse_rope_llama3(spec, value, &s->rope); break;
    }
}

// A named shape, or "llama:" and comma-separated fields (SPEC_SYNTAX).
static int parse_spec(const char* spec, ModelShape* out) {
    if (parse_named(spec, out)) return 1;
    if (strncmp(spec, "llama:", 6) != 0) return 0;
    ModelShape s = llama_shape(0, 0, 0, 0, 0, 0, 50257, 1024, 10000.0f, 1e-5f, 0, 0, 0);
    const char* set_by[NUM_SETTINGS] = {0};   // point into buf
    char buf[512];
    if (strlen(spec + 6) >= sizeof(buf)) fail("bad model spec '%s': too long", spec);
    strcpy(buf, spec + 6);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) parse_field(spec, tok, &s, set_by);
    if (!set_by[SET_L] || !set_by[SET_C] || !set_by[SET_H] || !set_by[SET_F])
        fail("bad model spec '%s': L, C, H and F are required (%s)", spec, SPEC_SYNTAX);
    if (!set_by[SET_K]) s.KV = s.NH;
    if (!set_by[SET_D]) {
        if (s.C % s.NH) fail("bad model spec '%s': C %d is not a multiple of H %d; give the head size D", spec, s.C, s.NH);
        s.D = s.C / s.NH;
    }
    s.Vp = padded_vocab(s.V);
    shape_validate(&s);
    *out = s;
    return 1;
}

static void validate(const ModelShape* s) {
    if (s->C % 8 != 0) fail("model channels %d must be a multiple of 8", s->C);
    if (!(s->eps > 0)) fail("RMSNorm eps %g must be positive", (double)s->eps);
    if (!(s->rope.theta > 0)) fail("rope_theta %g must be positive", (double)s->rope.theta);
    if (s->rope.scaling != ROPE_NONE && !(s->rope.factor > 0)) fail("rope_scaling factor %g must be positive", (double)s->rope.factor);
}

static int splits_tp(const ModelShape* s, int tp, char* why, size_t n) {
    if (s->NH % tp) return set_why(why, n, "-tp %d does not divide the model's %d attention heads", tp, s->NH);
    if (s->KV % tp && tp % s->KV)
        return set_why(why, n, "-tp %d and n_kv_heads %d: one must divide the other (each rank holds KV / tp kv heads, or a copy of one)",
                       tp, s->KV);
    if (s->F % tp) return set_why(why, n, "-tp %d does not divide the MLP's intermediate size %d", tp, s->F);
    return 1;
}

static int32_t float_bits(float f) { return (int32_t)f32_bits(f); }
static float bits_float(int32_t i) { return f32_from_bits((uint32_t)i); }

// Slots 9..21: KV, D, F, tied, qk_norm, rope scaling kind, then theta, eps, factor, low and high frequency
// factors as float32 bits, the original context length, and qkv_bias.
static void header_write(const ModelShape* s, int32_t* h) {
    int32_t v[] = {s->KV, s->D, s->F, s->tied, s->qk_norm, (int32_t)s->rope.scaling, float_bits(s->rope.theta),
                   float_bits(s->eps), float_bits(s->rope.factor), float_bits(s->rope.low_freq_factor),
                   float_bits(s->rope.high_freq_factor), s->rope.original_max, s->qkv_bias};
    memcpy(h + 9, v, sizeof(v));
}

static int flag_slot(const int32_t* h, int slot, const char* name) {
    if (h[slot] != 0 && h[slot] != 1) fail("model file: header slot %d (%s) is %d, not 0 or 1", slot, name, h[slot]);
    return h[slot];
}

static void header_read(const int32_t* h, ModelShape* s) {
    *s = llama_shape(h[4], h[6], h[5], h[9], h[10], h[11], h[3], h[2], bits_float(h[15]), bits_float(h[16]), flag_slot(h, 12, "tied"),
                     flag_slot(h, 13, "qk_norm"), flag_slot(h, 21, "qkv_bias"));
    s->rope.scaling = h[14] == 1 ? ROPE_LINEAR : h[14] == 2 ? ROPE_LLAMA3 : ROPE_NONE;
    if (h[14] < 0 || h[14] > 2) fail("model file: unknown rope scaling kind %d in header slot 14", h[14]);
    s->rope.factor = bits_float(h[17]);
    s->rope.low_freq_factor = bits_float(h[18]);
    s->rope.high_freq_factor = bits_float(h[19]);
    s->rope.original_max = h[20];
}

// Matrix FLOPs per token of one block (forward): 2 per weight.
static double block_matrix_flops(const ModelShape* s) {
    double C = s->C, A = (double)s->NH * s->D, KVD = (double)s->KV * s->D;
    return 2.0 * (C * (A + 2.0 * KVD) + A * C + 3.0 * C * s->F);
}

// 6 per weight a token multiplies by (the lookup multiplies by none), plus attention's scores and weighted
// sums: 12 L NH D T.
static double flops_per_token(const ModelShape* s, int T) {
    double lookup = s->tied ? 0.0 : (double)s->Vp * s->C;
    return 6.0 * ((double)shape_param_count(s) - lookup) + 12.0 * s->L * (double)s->NH * s->D * (double)T;
}

static double head_cost(const ModelShape* s, int T) {
    if (T < 1) fail("pipeline: bad sequence length %d for the cost model", T);
    return 2.0 * (double)s->Vp * s->C / (block_matrix_flops(s) + 4.0 * (double)T * s->NH * s->D);
}

const ModelFamily LLAMA_FAMILY = {
    .name = "llama",
    .file_id = 1,
    .num_kinds = LLAMA_NUM_KINDS,
    .kinds = KINDS,
    .kind_elems = kind_elems,
    .kind_cut = kind_cut,
    .wte = LLAMA_WTE,
    .wpe = -1,
    .head = LLAMA_HEAD,
    .final_w = LLAMA_FINAL_NORM,
    .final_b = -1,
    .norm = NORM_RMS,
    .parse_spec = parse_spec,
    .validate = validate,
    .splits_tp = splits_tp,
    .header_write = header_write,
    .header_read = header_read,
    .flops_per_token = flops_per_token,
    .head_cost = head_cost,
    .block = &LLAMA_BLOCK,
};
