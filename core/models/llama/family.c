// family.c: the Llama family described for the trainer (family.h): kinds, cuts, shapes, sizes, file fields, costs.
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
    LlamaParams p = llama_params(s);
    size_t C = (size_t)s->C, D = (size_t)p.D, NH = (size_t)s->NH, KV = (size_t)p.KV, F = (size_t)p.F;
    switch ((LlamaKind)k) {
        case LLAMA_WTE: return (size_t)s->Vp * C;
        case LLAMA_WQ: return NH * D * C;
        case LLAMA_WKV: return 2 * KV * D * C;
        case LLAMA_BQ: return p.qkv_bias ? NH * D : 0;
        case LLAMA_BKV: return p.qkv_bias ? 2 * KV * D : 0;
        case LLAMA_Q_NORM: case LLAMA_K_NORM: return p.qk_norm ? D : 0;
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
    LlamaParams p = llama_params(s);
    size_t C = (size_t)s->C, D = (size_t)p.D, Vp = (size_t)s->Vp, NH = (size_t)s->NH, KV = (size_t)p.KV, F = (size_t)p.F;
    switch ((LlamaKind)k) {
        case LLAMA_WQ: return (TensorCut){CUT_ROWS, NH * D, C, 1, NH};
        case LLAMA_WKV: return (TensorCut){CUT_ROWS, 2 * KV * D, C, 2, KV};
        case LLAMA_BQ: return (TensorCut){CUT_ROWS, NH * D, 1, 1, NH};
        case LLAMA_BKV: return (TensorCut){CUT_ROWS, 2 * KV * D, 1, 2, KV};
        case LLAMA_WO: return (TensorCut){CUT_COLS, C, NH * D, 1, 0};
        case LLAMA_GATE_UP: return (TensorCut){CUT_ROWS, 2 * F, C, 2, 0};
        case LLAMA_DOWN: return (TensorCut){CUT_COLS, C, F, 1, 0};
        case LLAMA_WTE: case LLAMA_HEAD: return (TensorCut){CUT_ROWS, Vp, C, 1, 0};
        default: return (TensorCut){CUT_NONE, kind_elems(s, k), 1, 1, 0};
    }
}

static ModelShape llama_shape(int L, int C, int NH, int V, int maxT, int tied, const LlamaParams* p) {
    ModelShape s = {.family = &LLAMA_FAMILY, .L = L, .C = C, .NH = NH, .V = V, .Vp = padded_vocab(V), .maxT = maxT, .tied = tied};
    family_params_set(&s, p, sizeof(*p));
    return s;
}

// Without rope_scaling: factor 1.
static Rope plain_rope(float theta) { return (Rope){.scaling = ROPE_NONE, .theta = theta, .factor = 1.0f}; }

static LayerSizes layer_sizes(const ModelShape* s) {
    LlamaParams p = llama_params(s);
    LayerSizes z = {.kv_heads = p.KV, .head_size = p.D, .mlp = p.F, .norm_eps = p.eps};
    return z;
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
        LlamaParams p = {.KV = n->KV, .D = n->D, .F = n->F, .qk_norm = n->qk_norm, .eps = n->eps, .rope = plain_rope(n->theta)};
        if (n->llama3_factor > 0) p.rope = (Rope){ROPE_LLAMA3, n->theta, n->llama3_factor, 1.0f, 4.0f, 8192};
        *out = llama_shape(n->L, n->C, n->NH, n->V, n->maxT, n->tied, &p);
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

// A custom spec while it is read: the shape's common fields and the family's own.
typedef struct {
    ModelShape shape;
    LlamaParams p;
} Draft;

// The fields of a custom spec (SPEC_SYNTAX), as data: what each sets, and where in the draft. Fields that set
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
    size_t offset;      // of the int (FIELD_INT, FIELD_FLAG) or float (FIELD_NUMBER) in Draft
} SpecField;
static const SpecField SPEC_FIELDS[] = {
    {"L", FIELD_INT, SET_L, offsetof(Draft, shape.L)},
    {"C", FIELD_INT, SET_C, offsetof(Draft, shape.C)},
    {"H", FIELD_INT, SET_H, offsetof(Draft, shape.NH)},
    {"F", FIELD_INT, SET_F, offsetof(Draft, p.F)},
    {"K", FIELD_INT, SET_K, offsetof(Draft, p.KV)},
    {"D", FIELD_INT, SET_D, offsetof(Draft, p.D)},
    {"V", FIELD_INT, SET_V, offsetof(Draft, shape.V)},
    {"T", FIELD_INT, SET_T, offsetof(Draft, shape.maxT)},
    {"theta", FIELD_NUMBER, SET_THETA, offsetof(Draft, p.rope.theta)},
    {"eps", FIELD_NUMBER, SET_EPS, offsetof(Draft, p.eps)},
    {"tied", FIELD_FLAG, SET_TIED, offsetof(Draft, shape.tied)},
    {"qknorm", FIELD_FLAG, SET_QK_NORM, offsetof(Draft, p.qk_norm)},
    {"qkvbias", FIELD_FLAG, SET_QKV_BIAS, offsetof(Draft, p.qkv_bias)},
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

// One comma-separated field of a custom spec into d; set_by[k]: the field that set setting k, or NULL.
static void parse_field(const char* spec, const char* tok, Draft* d, const char** set_by) {
    const SpecField* f = spec_field(tok);
    if (!f) fail("bad model spec '%s': unknown field '%s' (expected %s)", spec, tok, SPEC_SYNTAX);
    if (set_by[f->sets])
        fail("bad model spec '%s': '%s' and '%s' both set %s; give one", spec, set_by[f->sets], tok, SETTING_NAMES[f->sets]);
    set_by[f->sets] = tok;
    const char* value = tok + strlen(f->name);
    char* at = (char*)d + f->offset;
    switch (f->kind) {
        case FIELD_INT: *(int*)at = whole(spec, f->name, value); break;
        case FIELD_NUMBER: *(float*)at = (float)number(spec, f->name, value); break;
        case FIELD_FLAG: *(int*)at = 1; break;
        case FIELD_ROPE_LINEAR:
            d->p.rope.scaling = ROPE_LINEAR, d->p.rope.factor = (float)number(spec, f->name, value + (*value == ':'));
            break;
        case FIELD_ROPE_LLAMA3: parse_rope_llama3(spec, value, &d->p.rope); break;
    }
}

// A named shape, or "llama:" and comma-separated fields (SPEC_SYNTAX).
static int parse_spec(const char* spec, ModelShape* out) {
    if (parse_named(spec, out)) return 1;
    if (strncmp(spec, "llama:", 6) != 0) return 0;
    Draft d = {.shape = {.V = 50257, .maxT = 1024}, .p = {.eps = 1e-5f, .rope = plain_rope(10000.0f)}};
    const char* set_by[NUM_SETTINGS] = {0};   // point into buf
    char buf[512];
    if (strlen(spec + 6) >= sizeof(buf)) fail("bad model spec '%s': too long", spec);
    strcpy(buf, spec + 6);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) parse_field(spec, tok, &d, set_by);
    if (!set_by[SET_L] || !set_by[SET_C] || !set_by[SET_H] || !set_by[SET_F])
        fail("bad model spec '%s': L, C, H and F are required (%s)", spec, SPEC_SYNTAX);
    if (!set_by[SET_K]) d.p.KV = d.shape.NH;
    if (!set_by[SET_D]) {
        if (d.shape.C % d.shape.NH)
            fail("bad model spec '%s': C %d is not a multiple of H %d; give the head size D", spec, d.shape.C, d.shape.NH);
        d.p.D = d.shape.C / d.shape.NH;
    }
    ModelShape s = llama_shape(d.shape.L, d.shape.C, d.shape.NH, d.shape.V, d.shape.maxT, d.shape.tied, &d.p);
    shape_validate(&s);
    *out = s;
    return 1;
}

static void validate(const ModelShape* s) {
    LlamaParams p = llama_params(s);
    if (s->C % 8 != 0) fail("model channels %d must be a multiple of 8", s->C);
    if (!(p.eps > 0)) fail("RMSNorm eps %g must be positive", (double)p.eps);
    if (!(p.rope.theta > 0)) fail("rope_theta %g must be positive", (double)p.rope.theta);
    if (p.rope.scaling != ROPE_NONE && !(p.rope.factor > 0)) fail("rope_scaling factor %g must be positive", (double)p.rope.factor);
}

static void describe(const ModelShape* s, char* out, size_t n) {
    static const char* const ROPE[] = {"", " rope-linear", " rope-llama3"};
    LlamaParams p = llama_params(s);
    snprintf(out, n, " KV=%d D=%d F=%d%s%s%s theta=%g eps=%g%s", p.KV, p.D, p.F, s->tied ? " tied" : "", p.qk_norm ? " qk_norm" : "",
             p.qkv_bias ? " qkv_bias" : "", (double)p.rope.theta, (double)p.eps, ROPE[p.rope.scaling]);
}

static int splits_tp(const ModelShape* s, int tp, char* why, size_t n) {
    LlamaParams p = llama_params(s);
    if (s->NH % tp) return set_why(why, n, "-tp %d does not divide the model's %d attention heads", tp, s->NH);
    if (p.KV % tp && tp % p.KV)
        return set_why(why, n, "-tp %d and n_kv_heads %d: one must divide the other (each rank holds KV / tp kv heads, or a copy of one)",
                       tp, p.KV);
    if (p.F % tp) return set_why(why, n, "-tp %d does not divide the MLP's intermediate size %d", tp, p.F);
    return 1;
}

static int32_t float_bits(float f) { return (int32_t)f32_bits(f); }
static float bits_float(int32_t i) { return f32_from_bits((uint32_t)i); }

// Slots 9..21: KV, D, F, tied, qk_norm, rope scaling kind, then theta, eps, factor, low and high frequency
// factors as float32 bits, the original context length, and qkv_bias.
static void header_write(const ModelShape* s, int32_t* h) {
    LlamaParams p = llama_params(s);
    int32_t v[] = {p.KV, p.D, p.F, s->tied, p.qk_norm, (int32_t)p.rope.scaling, float_bits(p.rope.theta),
                   float_bits(p.eps), float_bits(p.rope.factor), float_bits(p.rope.low_freq_factor),
                   float_bits(p.rope.high_freq_factor), p.rope.original_max, p.qkv_bias};
    memcpy(h + 9, v, sizeof(v));
}

static int flag_slot(const int32_t* h, int slot, const char* name) {
    if (h[slot] != 0 && h[slot] != 1) fail("model file: header slot %d (%s) is %d, not 0 or 1", slot, name, h[slot]);
    return h[slot];
}

static void header_read(const int32_t* h, ModelShape* s) {
    int tied = flag_slot(h, 12, "tied");
    LlamaParams p = {.KV = h[9], .D = h[10], .F = h[11], .qk_norm = flag_slot(h, 13, "qk_norm"), .eps = bits_float(h[16])};
    p.qkv_bias = flag_slot(h, 21, "qkv_bias");
    if (h[14] < 0 || h[14] > 2) fail("model file: unknown rope scaling kind %d in header slot 14", h[14]);
    p.rope = (Rope){h[14] == 1 ? ROPE_LINEAR : h[14] == 2 ? ROPE_LLAMA3 : ROPE_NONE, bits_float(h[15]), bits_float(h[17]),
                    bits_float(h[18]), bits_float(h[19]), h[20]};
    *s = llama_shape(h[4], h[6], h[5], h[3], h[2], tied, &p);
}

// Matrix FLOPs per token of one block (forward): 2 per weight.
static double block_matrix_flops(const ModelShape* s) {
    LlamaParams p = llama_params(s);
    double C = s->C, A = (double)s->NH * p.D, KVD = (double)p.KV * p.D;
    return 2.0 * (C * (A + 2.0 * KVD) + A * C + 3.0 * C * p.F);
}

// 6 per weight a token multiplies by (the lookup multiplies by none), plus attention's scores and weighted
// sums: 12 L NH D T.
static double flops_per_token(const ModelShape* s, int T) {
    double lookup = s->tied ? 0.0 : (double)s->Vp * s->C;
    return 6.0 * ((double)shape_param_count(s) - lookup) + 12.0 * s->L * (double)s->NH * llama_params(s).D * (double)T;
}

static double head_cost(const ModelShape* s, int T) {
    if (T < 1) fail("pipeline: bad sequence length %d for the cost model", T);
    return 2.0 * (double)s->Vp * s->C / (block_matrix_flops(s) + 4.0 * (double)T * s->NH * llama_params(s).D);
}

// SmolLM2's two smallest and Llama 3.x's sizes (70B and 405B are not named shapes: their fields).
static const ShapeRung LADDER[] = {
    {"135M", "smollm2-135m"},
    {"360M", "smollm2-360m"},
    {"1B", "llama3.2-1b"},
    {"3B", "llama3.2-3b"},
    {"8B", "llama3.1-8b"},
    {"70B", "llama:L80,C8192,H64,K8,F28672,V128256,T131072,theta500000"},
    {"405B", "llama:L126,C16384,H128,K8,F53248,V128256,T131072,theta500000"},
};

// LoRA's targets (lora.h), as PEFT names the modules: q, k and v add into their column blocks of the fused
// q|k|v output, gate and up into theirs of gate|up; each cut by -tp as kind_cut cuts its rows of wq|wkv or gate_up.
static const char* const LORA_TARGETS[] = {"q", "k", "v", "o", "gate", "up", "down"};
static const int LORA_WEIGHTS[] = {LLAMA_WQ, LLAMA_WQ, LLAMA_WQ, LLAMA_WO, LLAMA_GATE_UP, LLAMA_GATE_UP, LLAMA_DOWN};
static const char* const LORA_HF_MODULES[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                              "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

static LoraGeometry lora_geometry(const ModelShape* s, int target) {
    LlamaParams p = llama_params(s);
    int C = s->C, Q = s->NH * p.D, KV = p.KV * p.D, QKV = Q + 2 * KV;
    switch (target) {
        case 0: return (LoraGeometry){C, Q, 0, QKV, CUT_ROWS, 1, s->NH};
        case 1: return (LoraGeometry){C, KV, Q, QKV, CUT_ROWS, 1, p.KV};
        case 2: return (LoraGeometry){C, KV, Q + KV, QKV, CUT_ROWS, 1, p.KV};
        case 3: return (LoraGeometry){Q, C, 0, C, CUT_COLS, 1, 0};
        case 4: return (LoraGeometry){C, p.F, 0, 2 * p.F, CUT_ROWS, 1, 0};
        case 5: return (LoraGeometry){C, p.F, p.F, 2 * p.F, CUT_ROWS, 1, 0};
        default: return (LoraGeometry){p.F, C, 0, C, CUT_COLS, 1, 0};
    }
}

const ModelFamily LLAMA_FAMILY = {
    .name = "llama",
    .file_id = 1,
    .num_kinds = LLAMA_NUM_KINDS,
    .kinds = KINDS,
    .kind_elems = kind_elems,
    .kind_cut = kind_cut,
    .wte = LLAMA_WTE,
    .head = LLAMA_HEAD,
    .final_w = LLAMA_FINAL_NORM,
    .final_b = -1,
    .norm = NORM_RMS,
    .layer_sizes = layer_sizes,
    .parse_spec = parse_spec,
    .validate = validate,
    .describe = describe,
    .splits_tp = splits_tp,
    .header_write = header_write,
    .header_read = header_read,
    .flops_per_token = flops_per_token,
    .head_cost = head_cost,
    .num_lora_targets = 7,
    .lora_targets = LORA_TARGETS,
    .lora_geometry = lora_geometry,
    .lora_weight_kinds = LORA_WEIGHTS,
    .lora_hf_blocks = "model.layers",
    .lora_hf_modules = LORA_HF_MODULES,
    .block = &LLAMA_BLOCK,
    .ladder = LADDER,
    .ladder_len = (int)(sizeof(LADDER) / sizeof(LADDER[0])),
};
