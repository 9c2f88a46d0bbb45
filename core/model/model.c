// model.c: GPT-2 shapes, the layer-ordered parameter layout, initialization. See model.h.
#include "core/model/model.h"

#include <math.h>

#include "base/common.h"
#include "core/util/rng.h"

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
    char seen[8] = "";
    while (*p) {
        char key = *p++;
        char* end;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : 0;   // digits only: no sign, no space
        if (v <= 0 || v > (1L << 30)) fail("bad model spec '%s': expected L<n>C<n>H<n>[V<n>][T<n>]", spec);
        if (strchr(seen, key)) fail("bad model spec '%s': '%c' is given twice", spec, key);
        if (strlen(seen) < sizeof(seen) - 1) strncat(seen, &key, 1);
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

int shape_splits_vocab(const GPTShape* s, int tp) { return tp >= 1 && s->Vp % (8 * tp) == 0; }

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

// How tensor parallelism cuts a kind (model.h): a (rows x cols) matrix in llm.c's row-major order (a bias is
// rows x 1) keeps, per rank, a 1/tp share of the rows of each of `sections` equal row blocks (CUT_ROWS: q, k
// and v are three), or of the columns of every row (CUT_COLS); CUT_NONE is held whole.
typedef enum { CUT_NONE, CUT_ROWS, CUT_COLS } Cut;
typedef struct {
    Cut cut;
    size_t rows, cols, sections;
} TensorCut;

static TensorCut tensor_cut(const GPTShape* s, ParamKind k) {
    size_t C = (size_t)s->C;
    switch (k) {
        case P_QKVW: return (TensorCut){CUT_ROWS, 3 * C, C, 3};
        case P_QKVB: return (TensorCut){CUT_ROWS, 3 * C, 1, 3};
        case P_FCW: return (TensorCut){CUT_ROWS, 4 * C, C, 1};
        case P_FCB: return (TensorCut){CUT_ROWS, 4 * C, 1, 1};
        case P_ATTPROJW: return (TensorCut){CUT_COLS, C, C, 1};
        case P_FCPROJW: return (TensorCut){CUT_COLS, C, 4 * C, 1};
        case P_WTE: return (TensorCut){CUT_ROWS, (size_t)s->Vp, C, 1};   // the vocabulary-parallel embedding and head
        default: return (TensorCut){CUT_NONE, param_kind_elems(s, k), 1, 1};
    }
}

// Rank r of tp's share of t's kind: its size and canonical runs (t->canonical is the whole tensor's start).
static void cut_tensor(ParamTensor* t, const GPTShape* s, int r, int tp) {
    TensorCut c = tensor_cut(s, t->kind);
    size_t whole = param_kind_elems(s, t->kind);
    t->size = t->run = t->stride = whole;
    t->replica = c.cut == CUT_NONE && r > 0;
    t->group_whole = c.cut == CUT_NONE && tp > 1;
    if (tp == 1 || c.cut == CUT_NONE) return;
    if (c.cut == CUT_ROWS) {   // of each section, rows [r, r + 1) * rows / (sections * tp): one run per section
        size_t section_rows = c.rows / c.sections, mine = section_rows / (size_t)tp;
        t->run = mine * c.cols;
        t->stride = section_rows * c.cols;
        t->canonical += (size_t)r * t->run;
        t->size = c.sections * t->run;
    } else {                   // of each row, columns [r, r + 1) * cols / tp: one run per row
        t->run = c.cols / (size_t)tp;
        t->stride = c.cols;
        t->canonical += (size_t)r * t->run;
        t->size = c.rows * t->run;
    }
    if (t->size == t->run) t->stride = t->size;   // one run: contiguous
}

void tensor_overlaps(const ParamTensor* t, size_t c, size_t count, TensorRunFn fn, void* ctx) {
    size_t runs = t->size / t->run;
    for (size_t k = 0; k < runs; k++) {
        size_t begin = t->canonical + k * t->stride, end = begin + t->run;
        size_t a = begin > c ? begin : c, b = end < c + count ? end : c + count;
        if (a < b) fn(t, k * t->run + (a - begin), a, b - a, ctx);
    }
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
        t->canonical = canonical_offset(&lay->shape, kinds[i], layer);
        cut_tensor(t, &lay->shape, lay->tp_rank, lay->tp_size);
        t->offset = u->offset + off;
        t->decay = is_matrix_kind(kinds[i]);
        t->unit = lay->num_units - 1;
        off += (t->size + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
        if (!t->replica) lay->num_params += t->size;
    }
    u->size = off;
    u->padded = (off + pad_multiple - 1) / pad_multiple * pad_multiple;
    lay->total += u->padded;
}

void layout_build_stage(ParamLayout* lay, const GPTShape* s, size_t pad_multiple, const int* first_block, const int* num_blocks,
                        int chunks, EmbeddingRole embeddings, int with_final, int tp_rank, int tp_size) {
    static const ParamKind EMB[] = {P_WTE, P_WPE};
    static const ParamKind BLOCK[] = {P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
                                      P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB};
    static const ParamKind FINAL[] = {P_LNFW, P_LNFB};
    if (pad_multiple == 0 || pad_multiple % TENSOR_ALIGN != 0) fail("internal: unit padding %zu must be a multiple of %d", pad_multiple, TENSOR_ALIGN);
    if (chunks < 1 || chunks > MAX_MODEL_CHUNKS) fail("internal: %d model chunks in a layout", chunks);
    for (int c = 0; c < chunks; c++)
        if (first_block[c] < 0 || num_blocks[c] < 0 || first_block[c] + num_blocks[c] > s->L ||
            (c > 0 && first_block[c] < first_block[c - 1] + num_blocks[c - 1]))
            fail("internal: blocks [%d, %d) outside the model's %d or before the previous chunk's", first_block[c],
                 first_block[c] + num_blocks[c], s->L);
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size || s->NH % tp_size != 0)
        fail("internal: tensor-parallel rank %d of %d for %d heads", tp_rank, tp_size, s->NH);
    if (!shape_splits_vocab(s, tp_size))
        fail("-tp %d does not split the padded vocabulary of %d rows into equal multiples of 8 (it needs a multiple of %d)",
             tp_size, s->Vp, 8 * tp_size);
    memset(lay, 0, sizeof(*lay));
    lay->shape = *s;
    lay->tp_rank = tp_rank;
    lay->tp_size = tp_size;
    lay->first_block = first_block[0];
    lay->num_chunks = chunks;
    for (int c = 0; c < chunks; c++) {
        lay->chunk_first[c] = first_block[c];
        lay->chunk_count[c] = num_blocks[c];
        lay->num_blocks += num_blocks[c];
    }
    lay->emb_unit = lay->final_unit = -1;
    for (int l = 0; l < MAX_LAYERS; l++) lay->block_unit[l] = -1;
    if (embeddings != EMB_NONE) {
        lay->emb_unit = lay->num_units;
        lay->emb_mirror = embeddings == EMB_MIRROR;
        add_unit(lay, EMB, 2, -1, pad_multiple);
        if (lay->emb_mirror) lay->num_params = 0;   // counts the parameters this stage owns
    }
    for (int c = 0; c < chunks; c++)
        for (int l = first_block[c]; l < first_block[c] + num_blocks[c]; l++) {
            lay->block_unit[l] = lay->num_units;
            add_unit(lay, BLOCK, 12, l, pad_multiple);
        }
    if (with_final) {
        lay->final_unit = lay->num_units;
        add_unit(lay, FINAL, 2, -1, pad_multiple);
    }
}

void layout_build(ParamLayout* lay, const GPTShape* s, size_t pad_multiple) {
    int first = 0;
    layout_build_stage(lay, s, pad_multiple, &first, &s->L, 1, EMB_OWN, 1, 0, 1);
}

void layout_chunk_view(const ParamLayout* lay, int c, ParamLayout* view) {
    if (c < 0 || c >= lay->num_chunks) fail("internal: chunk %d of %d", c, lay->num_chunks);
    int last = c == lay->num_chunks - 1;
    *view = *lay;
    view->num_chunks = 1;
    view->first_block = view->chunk_first[0] = lay->chunk_first[c];
    view->num_blocks = view->chunk_count[0] = lay->chunk_count[c];
    if (lay->emb_unit >= 0 && !(lay->emb_mirror ? last : c == 0)) view->emb_unit = -1, view->emb_mirror = 0;
    if (!last) view->final_unit = -1;
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

// The whole tensor of t's kind and layer (n elements).
static void init_whole(float* out, const GPTShape* s, ParamKind k, int layer, size_t n, unsigned long long seed) {
    if (k == P_LN1W || k == P_LN2W || k == P_LNFW) {
        for (size_t i = 0; i < n; i++) out[i] = 1.0f;
        return;
    }
    if (!is_matrix_kind(k)) {   // biases
        memset(out, 0, n * sizeof(float));
        return;
    }
    // Residual projections are scaled down by sqrt(2L) so the residual stream's variance stays bounded.
    float std = (k == P_ATTPROJW || k == P_FCPROJW) ? 0.02f / sqrtf(2.0f * (float)s->L) : 0.02f;
    Rng rng = rng_seeded(seed, (unsigned long long)k * 1000003ull + (unsigned long long)(layer + 1));
    size_t real = k == P_WTE ? (size_t)s->V * s->C : n;   // padded vocabulary rows stay zero
    for (size_t i = 0; i < real; i++) out[i] = std * rng_normal(&rng);
    for (size_t i = real; i < n; i++) out[i] = 0.0f;
}

void init_tensor_values(float* out, const GPTShape* s, const ParamTensor* t, unsigned long long seed) {
    size_t whole = param_kind_elems(s, t->kind);
    if (t->size == whole) {
        init_whole(out, s, t->kind, t->layer, whole, seed);
        return;
    }
    float* all = (float*)xmalloc(whole * sizeof(float));   // a shard: its elements of the whole tensor's values
    init_whole(all, s, t->kind, t->layer, whole, seed);
    size_t base = canonical_offset(s, t->kind, t->layer);
    for (size_t i = 0; i < t->size; i += t->run) memcpy(out + i, all + (tensor_canonical(t, i) - base), t->run * sizeof(float));
    free(all);
}
