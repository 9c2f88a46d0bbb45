// model.c: GPT-2 shapes, the layer-ordered parameter layout, initialization. See model.h.
#include "model.h"

#include <math.h>

#include "base/common.h"
#include "rng.h"

static const char* const KIND_NAMES[NUM_PARAM_KINDS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

const char* param_kind_name(ParamKind k) { return KIND_NAMES[k]; }

static int is_matrix_kind(ParamKind k) {
    return k == P_WTE || k == P_WPE || k == P_QKVW || k == P_ATTPROJW || k == P_FCW || k == P_FCPROJW;
}

static int round_up_int(int x, int m) { return (x + m - 1) / m * m; }

int shape_from_spec(const char* spec, GPTShape* out) {
    static const struct { const char* name; int L, C, NH; } gpt2[] = {
        {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    for (size_t i = 0; i < sizeof(gpt2) / sizeof(gpt2[0]); i++) {
        if (strcmp(spec, gpt2[i].name) == 0) {
            *out = (GPTShape){gpt2[i].L, gpt2[i].C, gpt2[i].NH, 50257, 50304, 1024};
            return 1;
        }
    }
    if (spec[0] != 'L' || spec[1] < '0' || spec[1] > '9') return 0;
    // Custom: L<n>C<n>H<n>[V<n>][T<n>]; every field a positive integer.
    GPTShape s = {0, 0, 0, 50257, 0, 1024};
    const char* p = spec;
    while (*p) {
        char key = *p++;
        char* end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > (1L << 30)) fail("bad model spec '%s': expected L<n>C<n>H<n>[V<n>][T<n>]", spec);
        p = end;
        switch (key) {
            case 'L': s.L = (int)v; break;
            case 'C': s.C = (int)v; break;
            case 'H': s.NH = (int)v; break;
            case 'V': s.V = (int)v; break;
            case 'T': s.maxT = (int)v; break;
            default: fail("bad model spec '%s': unknown field '%c'", spec, key);
        }
    }
    if (!s.L || !s.C || !s.NH) fail("bad model spec '%s': L, C and H are required", spec);
    s.Vp = round_up_int(s.V, 128);
    shape_validate(&s);
    *out = s;
    return 1;
}

void shape_validate(const GPTShape* s) {
    if (s->L < 1 || s->L > MAX_LAYERS) fail("model has %d layers; supported: 1..%d", s->L, MAX_LAYERS);
    if (s->C < 1 || s->NH < 1 || s->C % s->NH != 0)
        fail("model channels %d are not divisible by its %d heads", s->C, s->NH);
    if ((s->C / s->NH) % 8 != 0 || s->C / s->NH > 128)
        fail("head size %d (channels %d / heads %d) must be a multiple of 8 and at most 128", s->C / s->NH, s->C, s->NH);
    if (s->V < 2 || s->V > 65536) fail("vocabulary size %d is outside 2..65536 (tokens are uint16)", s->V);
    if (s->Vp < s->V || s->Vp % 128 != 0) fail("padded vocabulary %d must be a multiple of 128 and >= %d", s->Vp, s->V);
    if (s->maxT < 1) fail("maximum sequence length %d must be positive", s->maxT);
}

size_t param_kind_elems(const GPTShape* s, ParamKind k) {
    size_t C = (size_t)s->C;
    switch (k) {
        case P_WTE: return (size_t)s->Vp * C;
        case P_WPE: return (size_t)s->maxT * C;
        case P_QKVW: return 3 * C * C;
        case P_QKVB: return 3 * C;
        case P_ATTPROJW: return C * C;
        case P_FCW: case P_FCPROJW: return 4 * C * C;
        case P_FCB: return 4 * C;
        default: return C;   // LayerNorm weights and biases, attprojb, fcprojb
    }
}

size_t param_kind_layers(const GPTShape* s, ParamKind k) { return param_kind_is_block(k) ? (size_t)s->L : 1; }

size_t shape_param_count(const GPTShape* s) {
    size_t n = 0, e;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        if (__builtin_mul_overflow(param_kind_elems(s, (ParamKind)k), param_kind_layers(s, (ParamKind)k), &e) ||
            __builtin_add_overflow(n, e, &n))
            return SIZE_MAX;
    return n;
}

// llm.c's order: each kind stacked over its layers.
static size_t canonical_offset(const GPTShape* s, ParamKind kind, int layer) {
    size_t off = 0;
    for (int k = 0; k < (int)kind; k++) off += param_kind_elems(s, (ParamKind)k) * param_kind_layers(s, (ParamKind)k);
    return off + (layer > 0 ? (size_t)layer * param_kind_elems(s, kind) : 0);
}

// Tensors start on 64-element boundaries so every tensor is 128-byte aligned in any storage type.
#define TENSOR_ALIGN 64

static void add_unit(ParamLayout* lay, const ParamKind* kinds, int n, int layer, size_t pad_multiple) {
    Unit* u = &lay->units[lay->num_units++];
    u->offset = lay->total;
    u->first_tensor = lay->num_tensors;
    u->num_tensors = n;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        ParamTensor* t = &lay->tensors[lay->num_tensors++];
        t->kind = kinds[i];
        t->layer = layer;
        t->size = param_kind_elems(&lay->shape, kinds[i]);
        t->offset = u->offset + off;
        t->canonical = canonical_offset(&lay->shape, kinds[i], layer);
        t->decay = is_matrix_kind(kinds[i]);
        t->unit = lay->num_units - 1;
        off += (t->size + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
        lay->num_params += t->size;
    }
    u->size = off;
    u->padded = (off + pad_multiple - 1) / pad_multiple * pad_multiple;
    lay->total += u->padded;
}

void layout_build_stage(ParamLayout* lay, const GPTShape* s, size_t pad_multiple, int first_block, int num_blocks,
                        EmbeddingRole embeddings, int with_final) {
    static const ParamKind EMB[] = {P_WTE, P_WPE};
    static const ParamKind BLOCK[] = {P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
                                      P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB};
    static const ParamKind FINAL[] = {P_LNFW, P_LNFB};
    if (pad_multiple == 0 || pad_multiple % TENSOR_ALIGN != 0) fail("internal: unit padding %zu must be a multiple of %d", pad_multiple, TENSOR_ALIGN);
    if (first_block < 0 || num_blocks < 0 || first_block + num_blocks > s->L)
        fail("internal: blocks [%d, %d) outside the model's %d", first_block, first_block + num_blocks, s->L);
    memset(lay, 0, sizeof(*lay));
    lay->shape = *s;
    lay->first_block = first_block;
    lay->num_blocks = num_blocks;
    lay->emb_unit = lay->final_unit = -1;
    for (int l = 0; l < MAX_LAYERS; l++) lay->block_unit[l] = -1;
    if (embeddings != EMB_NONE) {
        lay->emb_unit = lay->num_units;
        lay->emb_mirror = embeddings == EMB_MIRROR;
        add_unit(lay, EMB, 2, -1, pad_multiple);
        if (lay->emb_mirror) lay->num_params = 0;   // counts the parameters this stage owns
    }
    for (int l = first_block; l < first_block + num_blocks; l++) {
        lay->block_unit[l] = lay->num_units;
        add_unit(lay, BLOCK, 12, l, pad_multiple);
    }
    if (with_final) {
        lay->final_unit = lay->num_units;
        add_unit(lay, FINAL, 2, -1, pad_multiple);
    }
}

void layout_build(ParamLayout* lay, const GPTShape* s, size_t pad_multiple) {
    layout_build_stage(lay, s, pad_multiple, 0, s->L, EMB_OWN, 1);
}

const ParamTensor* layout_tensor(const ParamLayout* lay, ParamKind kind, int layer) {
    int u, i;
    if (kind == P_WTE || kind == P_WPE) u = lay->emb_unit, i = kind - P_WTE;
    else if (kind == P_LNFW || kind == P_LNFB) u = lay->final_unit, i = kind - P_LNFW;
    else u = layer >= 0 && layer < lay->shape.L ? lay->block_unit[layer] : -1, i = kind - P_LN1W;
    return u < 0 ? NULL : &lay->tensors[lay->units[u].first_tensor + i];
}

BlockParams block_params(const ParamLayout* lay, void* base, int layer, DType dt) {
#define T(kind) tensor_in_unit(lay, base, layout_tensor(lay, kind, layer), dt)
    BlockParams p = {T(P_LN1W), T(P_LN1B), T(P_QKVW), T(P_QKVB), T(P_ATTPROJW), T(P_ATTPROJB),
                     T(P_LN2W), T(P_LN2B), T(P_FCW), T(P_FCB), T(P_FCPROJW), T(P_FCPROJB)};
#undef T
    return p;
}

EmbeddingParams embedding_params(const ParamLayout* lay, void* base, DType dt) {
    EmbeddingParams p = {tensor_in_unit(lay, base, layout_tensor(lay, P_WTE, -1), dt),
                         tensor_in_unit(lay, base, layout_tensor(lay, P_WPE, -1), dt)};
    return p;
}

FinalNormParams final_norm_params(const ParamLayout* lay, void* base, DType dt) {
    FinalNormParams p = {tensor_in_unit(lay, base, layout_tensor(lay, P_LNFW, -1), dt),
                         tensor_in_unit(lay, base, layout_tensor(lay, P_LNFB, -1), dt)};
    return p;
}

void init_tensor_values(float* out, const GPTShape* s, const ParamTensor* t, unsigned long long seed) {
    ParamKind k = t->kind;
    if (k == P_LN1W || k == P_LN2W || k == P_LNFW) {
        for (size_t i = 0; i < t->size; i++) out[i] = 1.0f;
        return;
    }
    if (!is_matrix_kind(k)) {   // biases
        memset(out, 0, t->size * sizeof(float));
        return;
    }
    // Residual projections are scaled down by sqrt(2L) so the residual stream's variance stays bounded.
    float std = (k == P_ATTPROJW || k == P_FCPROJW) ? 0.02f / sqrtf(2.0f * (float)s->L) : 0.02f;
    Rng rng = rng_seeded(seed, (unsigned long long)k * 1000003ull + (unsigned long long)(t->layer + 1));
    size_t real = k == P_WTE ? (size_t)s->V * s->C : t->size;   // padded vocabulary rows stay zero
    for (size_t i = 0; i < real; i++) out[i] = std * rng_normal(&rng);
    for (size_t i = real; i < t->size; i++) out[i] = 0.0f;
}
