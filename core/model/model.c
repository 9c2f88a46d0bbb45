// model.c: shapes of any family (the checks and counts every family shares), the layer-ordered parameter layout,
// initialization. See model.h.
#include "core/model/model.h"

#include <math.h>

#include "base/common.h"
#include "core/util/rng.h"

const char* param_kind_name(const ModelShape* s, int k) { return kind_info(s, k)->name; }

// The head-size and kv-head rules are the attention kernels' (every family's attention runs on them).
void shape_validate(const ModelShape* s) {
    if (!s->family) fail("internal: a shape without a family");
    if (s->L < 1 || s->L > MAX_LAYERS) fail("model has %d layers; supported: 1..%d", s->L, MAX_LAYERS);
    LayerSizes z = shape_layer_sizes(s);
    if (s->C < 1 || s->NH < 1 || z.kv_heads < 1 || z.mlp < 1)
        fail("model has %d channels, %d heads, %d kv heads, MLP width %d: all must be positive", s->C, s->NH, z.kv_heads, z.mlp);
    s->family->validate(s);   // first: a family's own message names the fields the common checks derive from
    if (s->NH % z.kv_heads != 0) fail("n_kv_heads %d does not divide the %d heads", z.kv_heads, s->NH);
    if (z.head_size % 8 != 0 || z.head_size < 8 || z.head_size > 128)
        fail("head size %d must be a multiple of 8 and at most 128", z.head_size);
    if (s->V < 2 || s->V > (1 << 24)) fail("vocabulary size %d is outside 2..%d", s->V, 1 << 24);
    if (s->Vp < s->V || s->Vp % 128 != 0) fail("padded vocabulary %d must be a multiple of 128 and >= %d", s->Vp, s->V);
    if (s->maxT < 1) fail("maximum sequence length %d must be positive", s->maxT);
}

size_t param_kind_elems(const ModelShape* s, int k) { return s->family->kind_elems(s, k); }

int shape_splits_vocab(const ModelShape* s, int tp) { return tp >= 1 && s->Vp % (8 * tp) == 0; }

size_t param_kind_layers(const ModelShape* s, int k) { return kind_is_block(s, k) ? (size_t)s->L : 1; }

size_t shape_param_count(const ModelShape* s) {
    size_t n = 0, e;
    for (int k = 0; k < s->family->num_kinds; k++)
        if (__builtin_mul_overflow(param_kind_elems(s, k), param_kind_layers(s, k), &e) || __builtin_add_overflow(n, e, &n))
            return SIZE_MAX;
    return n;
}

size_t shape_real_param_count(const ModelShape* s) {
    size_t n = shape_param_count(s);
    for (int k = 0; k < s->family->num_kinds && n != SIZE_MAX; k++)
        if (kind_info(s, k)->vocab_rows) n -= param_kind_elems(s, k) / (size_t)s->Vp * (size_t)(s->Vp - s->V);
    return n;
}

// A family's parameters are a struct without padding, so equal values are equal bytes (family.h).
int shape_equal(const ModelShape* a, const ModelShape* b) {
    return a->family == b->family && a->L == b->L && a->C == b->C && a->NH == b->NH && a->V == b->V && a->Vp == b->Vp &&
           a->maxT == b->maxT && a->tied == b->tied && memcmp(a->params.bytes, b->params.bytes, sizeof(a->params.bytes)) == 0;
}

// GPT-2's as llm.c's header has it; another family's with its name first and its own fields after.
void shape_describe(const ModelShape* s, char* out, size_t n) {
    int other = s->family->file_id != 0;
    int w = snprintf(out, n, "%s%sL=%d C=%d NH=%d V=%d Vp=%d maxT=%d", other ? s->family->name : "", other ? " " : "", s->L, s->C,
                     s->NH, s->V, s->Vp, s->maxT);
    if (s->family->describe && w >= 0 && (size_t)w < n) s->family->describe(s, out + w, n - (size_t)w);
}

// llm.c's order: each kind stacked over its layers.
static size_t canonical_offset(const ModelShape* s, int kind, int layer) {
    size_t off = 0;
    for (int k = 0; k < kind; k++) off += param_kind_elems(s, k) * param_kind_layers(s, k);
    return off + (layer > 0 ? (size_t)layer * param_kind_elems(s, kind) : 0);
}

// Rank r of tp's share of t's kind: its size and canonical runs (t->canonical is the whole tensor's start).
static void cut_tensor(ParamTensor* t, const ModelShape* s, int r, int tp) {
    TensorCut c = s->family->kind_cut(s, t->kind);
    size_t whole = param_kind_elems(s, t->kind);
    t->size = t->run = t->stride = whole;
    t->replica = c.cut == CUT_NONE && r > 0;
    t->group_whole = c.cut == CUT_NONE && tp > 1;
    t->copies = 1;
    if (tp == 1 || c.cut == CUT_NONE) return;
    if (c.cut == CUT_ROWS) {   // of each section, rows [r, r + 1) * rows / (sections * tp): one run per section
        // or, with fewer heads than ranks, head r / copies of each section, which `copies` ranks hold
        size_t copies = c.heads && c.heads < (size_t)tp ? (size_t)tp / c.heads : 1;
        size_t section_rows = c.rows / c.sections, mine = section_rows * copies / (size_t)tp;
        t->run = mine * c.cols;
        t->stride = section_rows * c.cols;
        t->canonical += (size_t)r / copies * t->run;
        t->size = c.sections * t->run;
        t->copies = (int)copies;
        t->replica = r % (int)copies != 0;
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

static int kind_is_frozen(const ModelShape* s, int k) { return !kind_optimizer(s, k)->updates; }

// Tensor t of kind k (of block `layer`) at element `off` of unit u, or right after the previous tensor when
// the kind joins it; returns the element after it, aligned.
static size_t place_tensor(ParamLayout* lay, ParamTensor* t, int k, int layer, size_t off) {
    const ModelShape* s = &lay->shape;
    Unit* u = &lay->units[lay->num_units - 1];
    t->kind = k;
    t->layer = layer;
    t->canonical = canonical_offset(s, k, layer);
    cut_tensor(t, s, lay->tp_rank, lay->tp_size);
    size_t at = off;
    if (kind_info(s, k)->joins_previous) {   // right after the previous tensor, whose padding it takes
        const ParamTensor* prev = t - 1;
        if (t == &lay->tensors[u->first_tensor] || prev->kind != k - 1 || kind_is_frozen(s, k) != kind_is_frozen(s, k - 1))
            fail("internal: %s joins %s, which this unit does not hold just before it", kind_info(s, k)->name, kind_info(s, k - 1)->name);
        at = prev->offset - u->offset + prev->size;
    }
    t->offset = u->offset + at;
    t->decay = kind_info(s, k)->decay;
    t->unit = lay->num_units - 1;
    if (!t->replica) lay->num_params += t->size;
    return at + (t->size + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
}

// A unit of the shape's kinds held by `role` units (of block `layer`), those this shape has (elements > 0):
// the frozen section, then the trained one (Unit), each padded to `pad_multiple`.
static void add_unit(ParamLayout* lay, UnitRole role, int layer, size_t pad_multiple) {
    const ModelShape* s = &lay->shape;
    Unit* u = &lay->units[lay->num_units++];
    u->offset = lay->total;
    u->first_tensor = lay->num_tensors;
    size_t end[2] = {0, 0};   // of each section's last tensor
    for (int trained = 0; trained < 2; trained++) {
        size_t off = trained ? u->frozen : 0;
        for (int k = 0; k < s->family->num_kinds; k++) {
            if (kind_info(s, k)->unit != role || param_kind_elems(s, k) == 0 || kind_is_frozen(s, k) == trained) continue;
            if (lay->num_tensors - u->first_tensor >= MAX_UNIT_TENSORS) fail("internal: a unit of more than %d tensors", MAX_UNIT_TENSORS);
            end[trained] = off = place_tensor(lay, &lay->tensors[lay->num_tensors++], k, layer, off);
        }
        if (!trained) u->frozen = (end[0] + pad_multiple - 1) / pad_multiple * pad_multiple;
    }
    u->num_tensors = lay->num_tensors - u->first_tensor;
    u->size = end[1] ? end[1] : end[0];
    u->padded = (u->size + pad_multiple - 1) / pad_multiple * pad_multiple;
    lay->total += u->padded;
}

void layout_build_stage(ParamLayout* lay, const ModelShape* s, size_t pad_multiple, const int* first_block, const int* num_blocks,
                        int chunks, EmbeddingRole embeddings, int with_final, int tp_rank, int tp_size) {
    if (pad_multiple == 0 || pad_multiple % TENSOR_ALIGN != 0) fail("internal: unit padding %zu must be a multiple of %d", pad_multiple, TENSOR_ALIGN);
    if (chunks < 1 || chunks > MAX_MODEL_CHUNKS) fail("internal: %d model chunks in a layout", chunks);
    for (int c = 0; c < chunks; c++)
        if (first_block[c] < 0 || num_blocks[c] < 0 || first_block[c] + num_blocks[c] > s->L ||
            (c > 0 && first_block[c] < first_block[c - 1] + num_blocks[c - 1]))
            fail("internal: blocks [%d, %d) outside the model's %d or before the previous chunk's", first_block[c],
                 first_block[c] + num_blocks[c], s->L);
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) fail("internal: tensor-parallel rank %d of %d", tp_rank, tp_size);
    if (!shape_splits_vocab(s, tp_size))
        fail("-tp %d does not split the padded vocabulary of %d rows into equal multiples of 8 (it needs a multiple of %d)",
             tp_size, s->Vp, 8 * tp_size);
    char why[200];
    if (!s->family->splits_tp(s, tp_size, why, sizeof(why))) fail("%s", why);
    if (embeddings == EMB_MIRROR && !layout_needs_mirror(s)) fail("internal: a mirror of the embedding for an untied head");
    memset(lay, 0, sizeof(*lay));
    lay->shape = *s;
    lay->tp_rank = tp_rank;
    lay->tp_size = tp_size;
    lay->cp_size = 1;
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
        add_unit(lay, UNIT_EMBEDDING, -1, pad_multiple);
        if (lay->emb_mirror) lay->num_params = 0;   // counts the parameters this stage owns
    }
    for (int c = 0; c < chunks; c++)
        for (int l = first_block[c]; l < first_block[c] + num_blocks[c]; l++) {
            lay->block_unit[l] = lay->num_units;
            add_unit(lay, UNIT_BLOCK, l, pad_multiple);
        }
    if (with_final) {
        lay->final_unit = lay->num_units;
        add_unit(lay, UNIT_FINAL, -1, pad_multiple);
    }
}

void layout_build(ParamLayout* lay, const ModelShape* s, size_t pad_multiple) {
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

const ParamTensor* layout_tensor(const ParamLayout* lay, int kind, int layer) {
    UnitRole role = kind_info(&lay->shape, kind)->unit;
    int u = role == UNIT_EMBEDDING ? lay->emb_unit : role == UNIT_FINAL ? lay->final_unit
            : layer >= 0 && layer < lay->shape.L ? lay->block_unit[layer] : -1;
    if (u < 0) return NULL;
    const Unit* un = &lay->units[u];
    for (int i = un->first_tensor; i < un->first_tensor + un->num_tensors; i++)
        if (lay->tensors[i].kind == kind) return &lay->tensors[i];
    return NULL;
}

void* unit_tensor(const ParamLayout* lay, void* unit_base, int kind, int layer, DType dt) {
    const ParamTensor* t = layout_tensor(lay, kind, layer);
    return t ? tensor_in_unit(lay, unit_base, t, dt) : NULL;
}

void* unit_grad_tensor(const ParamLayout* lay, void* unit_base, int kind, int layer, DType dt) {
    const ParamTensor* t = layout_tensor(lay, kind, layer);
    if (!t || !tensor_optimizer(lay, t)->updates) return NULL;
    return (char*)unit_base + unit_grad_index(lay, t->unit, t->offset) * dtype_size(dt);
}

// The whole tensor of t's kind and layer (n elements).
static void init_whole(float* out, const ModelShape* s, int k, int layer, size_t n, unsigned long long seed) {
    const KindInfo* info = kind_info(s, k);
    if (info->init == INIT_ONES || info->init == INIT_ZEROS) {
        for (size_t i = 0; i < n; i++) out[i] = info->init == INIT_ONES ? 1.0f : 0.0f;
        return;
    }
    Rng rng = rng_seeded(seed, (unsigned long long)k * 1000003ull + (unsigned long long)(layer + 1));
    if (info->init == INIT_FAN_IN) {
        float bound = 1.0f / sqrtf((float)s->family->kind_cut(s, k).cols);
        for (size_t i = 0; i < n; i++) out[i] = bound * (2.0f * rng_uniform(&rng) - 1.0f);
        return;
    }
    float std = info->init == INIT_RESIDUAL ? 0.02f / sqrtf(2.0f * (float)s->L) : 0.02f;
    size_t real = info->vocab_rows ? (size_t)s->V * (n / (size_t)s->Vp) : n;   // padded vocabulary rows stay zero
    for (size_t i = 0; i < real; i++) out[i] = std * rng_normal(&rng);
    for (size_t i = real; i < n; i++) out[i] = 0.0f;
}

void init_tensor_values(float* out, const ModelShape* s, const ParamTensor* t, unsigned long long seed) {
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
