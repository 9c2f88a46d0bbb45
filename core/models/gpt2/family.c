// family.c: GPT-2 described for the trainer (family.h): kinds, cuts, shapes, sizes, file fields, costs.
#include <limits.h>
#include <string.h>

#include "base/common.h"
#include "core/model/model.h"
#include "core/models/gpt2/gpt2.h"

#define EMB(name, init, decay, vocab) {name, UNIT_EMBEDDING, init, decay, vocab, 0, OPT_ADAMW}
#define BLK(name, init, decay) {name, UNIT_BLOCK, init, decay, 0, 0, OPT_ADAMW}
#define FIN(name, init) {name, UNIT_FINAL, init, 0, 0, 0, OPT_ADAMW}
static const KindInfo KINDS[GPT2_NUM_KINDS] = {
    EMB("wte", INIT_NORMAL, 1, 1),          EMB("wpe", INIT_NORMAL, 1, 0),
    BLK("ln1w", INIT_ONES, 0),              BLK("ln1b", INIT_ZEROS, 0),
    BLK("qkvw", INIT_NORMAL, 1),            BLK("qkvb", INIT_ZEROS, 0),
    BLK("attprojw", INIT_RESIDUAL, 1),      BLK("attprojb", INIT_ZEROS, 0),
    BLK("ln2w", INIT_ONES, 0),              BLK("ln2b", INIT_ZEROS, 0),
    BLK("fcw", INIT_NORMAL, 1),             BLK("fcb", INIT_ZEROS, 0),
    BLK("fcprojw", INIT_RESIDUAL, 1),       BLK("fcprojb", INIT_ZEROS, 0),
    FIN("lnfw", INIT_ONES),                 FIN("lnfb", INIT_ZEROS),
};
#undef EMB
#undef BLK
#undef FIN

static size_t kind_elems(const ModelShape* s, int k) {
    size_t C = (size_t)s->C;
    switch ((Gpt2Kind)k) {
        case GPT2_WTE: return (size_t)s->Vp * C;
        case GPT2_WPE: return (size_t)s->maxT * C;
        case GPT2_QKVW: return 3 * C * C;
        case GPT2_QKVB: return 3 * C;
        case GPT2_ATTPROJW: return C * C;
        case GPT2_FCW: case GPT2_FCPROJW: return 4 * C * C;
        case GPT2_FCB: return 4 * C;
        default: return C;   // LayerNorm weights and biases, attprojb, fcprojb
    }
}

// Megatron's cut: qkv and fc column-parallel (q, k and v each split by heads), the projections row-parallel,
// wte by vocabulary rows; the LayerNorms, the projections' biases and wpe whole.
static TensorCut kind_cut(const ModelShape* s, int k) {
    size_t C = (size_t)s->C;
    switch ((Gpt2Kind)k) {
        case GPT2_QKVW: return (TensorCut){CUT_ROWS, 3 * C, C, 3, (size_t)s->NH};
        case GPT2_QKVB: return (TensorCut){CUT_ROWS, 3 * C, 1, 3, (size_t)s->NH};
        case GPT2_FCW: return (TensorCut){CUT_ROWS, 4 * C, C, 1, 0};
        case GPT2_FCB: return (TensorCut){CUT_ROWS, 4 * C, 1, 1, 0};
        case GPT2_ATTPROJW: return (TensorCut){CUT_COLS, C, C, 1, 0};
        case GPT2_FCPROJW: return (TensorCut){CUT_COLS, C, 4 * C, 1, 0};
        case GPT2_WTE: return (TensorCut){CUT_ROWS, (size_t)s->Vp, C, 1, 0};
        default: return (TensorCut){CUT_NONE, kind_elems(s, k), 1, 1, 0};
    }
}

// 4C, or 0 (refused by shape_validate) when a file's header names channels beyond int's range for it.
static int mlp_width(int C) { return C > 0 && C <= INT_MAX / 4 ? 4 * C : 0; }

// GPT-2 has no parameters of its own: multi-head attention of C / NH channels a head, the MLP 4C, eps 1e-5.
ModelShape gpt2_shape(int L, int C, int NH, int V, int maxT) {
    ModelShape s = {.family = &GPT2_FAMILY, .L = L, .C = C, .NH = NH, .V = V, .Vp = padded_vocab(V), .maxT = maxT, .tied = 1};
    return s;
}

static LayerSizes layer_sizes(const ModelShape* s) {
    LayerSizes z = {.kv_heads = s->NH, .head_size = s->NH > 0 ? s->C / s->NH : 0, .mlp = mlp_width(s->C), .norm_eps = 1e-5f};
    return z;
}

// "d12" | "d24" | "d36" | "d48" (GPT-2 124M/350M/774M/1558M, maxT 1024, V 50257), or a custom
// "L<layers>C<channels>H<heads>[V<vocab>][T<maxT>]" such as L2C64H4V512T64.
static int parse_spec(const char* spec, ModelShape* out) {
    static const struct { const char* name; int L, C, NH; } named[] = {
        {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        if (strcmp(spec, named[i].name) == 0) {
            *out = gpt2_shape(named[i].L, named[i].C, named[i].NH, 50257, 1024);
            return 1;
        }
    if (spec[0] != 'L' || spec[1] < '0' || spec[1] > '9') return 0;
    int f[5] = {0, 0, 0, 50257, 1024};   // L, C, H, V, T; every field a positive integer
    const char* keys = "LCHVT";
    char seen[8] = "";
    for (const char* p = spec; *p;) {
        char key = *p++;
        char* end;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : 0;   // digits only: no sign, no space
        if (v <= 0 || v > (1L << 30)) fail("bad model spec '%s': expected L<n>C<n>H<n>[V<n>][T<n>]", spec);
        if (strchr(seen, key)) fail("bad model spec '%s': '%c' is given twice", spec, key);
        if (strlen(seen) < sizeof(seen) - 1) strncat(seen, &key, 1);
        p = end;
        const char* at = strchr(keys, key);
        if (!at || !key) fail("bad model spec '%s': unknown field '%c'", spec, key);
        f[at - keys] = (int)v;
    }
    if (!f[0] || !f[1] || !f[2]) fail("bad model spec '%s': L, C and H are required", spec);
    *out = gpt2_shape(f[0], f[1], f[2], f[3], f[4]);
    shape_validate(out);
    return 1;
}

static void validate(const ModelShape* s) {
    if (s->C % s->NH != 0) fail("model channels %d are not divisible by its %d heads", s->C, s->NH);
    if ((s->C / s->NH) % 8 != 0 || s->C / s->NH > 128)
        fail("head size %d (channels %d / heads %d) must be a multiple of 8 and at most 128", s->C / s->NH, s->C, s->NH);
    static const FamilyParams none;
    if (!s->tied || memcmp(&s->params, &none, sizeof(none)) != 0) fail("internal: a GPT-2 shape with another family's fields");
}

static int splits_tp(const ModelShape* s, int tp, char* why, size_t n) {
    if (s->NH % tp == 0) return 1;
    return set_why(why, n, "-tp %d does not divide the model's %d attention heads", tp, s->NH);
}

// llm.c's files carry no more: slots 8.. stay zero, which is what marks a file as GPT-2.
static void header_write(const ModelShape* s, int32_t* h) {}
static void header_read(const int32_t* h, ModelShape* s) { *s = gpt2_shape(h[4], h[6], h[5], h[3], h[2]); }

// 6 per parameter (forward 2, backward 4) plus attention's scores and weighted sums: 12 L C T.
static double flops_per_token(const ModelShape* s, int T) {
    return 6.0 * (double)shape_param_count(s) + 12.0 * s->L * s->C * (double)T;
}

// Forward FLOPs per token: the tied head 2 Vp C; a block 24 C^2 (qkv 6C^2, attention projection 2C^2, MLP
// 16C^2) plus 4 T C for attention (no causal discount, as in the usual MFU formulas). d12 at T=1024: 4.47.
static double head_cost(const ModelShape* s, int T) {
    if (s->Vp < 1 || s->C < 1 || T < 1) fail("pipeline: bad shape for the cost model (V %d, C %d, T %d)", s->Vp, s->C, T);
    double V = s->Vp, C = s->C, t = T;
    return 2.0 * V * C / (24.0 * C * C + 4.0 * t * C);
}

// GPT-2's and GPT-3's sizes.
static const ShapeRung LADDER[] = {
    {"124M", "L12C768H12"},  {"350M", "L24C1024H16"}, {"774M", "L36C1280H20"}, {"1.6B", "L48C1600H25"},
    {"2.7B", "L32C2560H32"}, {"6.7B", "L32C4096H32"}, {"13B", "L40C5120H40"},  {"30B", "L48C7168H56"},
    {"65B", "L80C8192H64"},  {"175B", "L96C12288H96"},
};

// LoRA's targets (lora.h): c_attn (q|k|v as one, as PEFT adapts GPT-2), c_proj, c_fc, the MLP's c_proj; each
// cut by -tp as kind_cut cuts its matrix.
static const char* const LORA_TARGETS[] = {"qkv", "proj", "fc", "fcproj"};
static const int LORA_WEIGHTS[] = {GPT2_QKVW, GPT2_ATTPROJW, GPT2_FCW, GPT2_FCPROJW};
static const char* const LORA_HF_MODULES[] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

static LoraGeometry lora_geometry(const ModelShape* s, int target) {
    int C = s->C, F = mlp_width(s->C);
    switch (target) {
        case 0: return (LoraGeometry){C, 3 * C, 0, 3 * C, CUT_ROWS, 3, s->NH};
        case 1: return (LoraGeometry){C, C, 0, C, CUT_COLS, 1, 0};
        case 2: return (LoraGeometry){C, F, 0, F, CUT_ROWS, 1, 0};
        default: return (LoraGeometry){F, C, 0, C, CUT_COLS, 1, 0};
    }
}

const ModelFamily GPT2_FAMILY = {
    .name = "gpt2",
    .file_id = 0,
    .num_kinds = GPT2_NUM_KINDS,
    .kinds = KINDS,
    .kind_elems = kind_elems,
    .kind_cut = kind_cut,
    .wte = GPT2_WTE,
    .head = -1,
    .final_w = GPT2_LNFW,
    .final_b = GPT2_LNFB,
    .norm = NORM_LAYER,
    .layer_sizes = layer_sizes,
    .parse_spec = parse_spec,
    .validate = validate,
    .splits_tp = splits_tp,
    .header_write = header_write,
    .header_read = header_read,
    .flops_per_token = flops_per_token,
    .head_cost = head_cost,
    .num_lora_targets = 4,
    .lora_targets = LORA_TARGETS,
    .lora_geometry = lora_geometry,
    .lora_weight_kinds = LORA_WEIGHTS,
    .lora_hf_blocks = "transformer.h",
    .lora_hf_modules = LORA_HF_MODULES,
    .block = &GPT2_BLOCK,
    .ends = &GPT2_ENDS,
    .ladder = LADDER,
    .ladder_len = (int)(sizeof(LADDER) / sizeof(LADDER[0])),
};
