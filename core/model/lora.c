// lora.c: the LoRA'd family (lora.h).
#include "core/model/lora.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/dtype.h"

static const LoraFamily* lora_family(const ModelShape* s) { return (const LoraFamily*)s->family; }

// The adapter kinds' selected target (j) and whether it is B, for kind k past the base's.
static int adapter_target(const LoraFamily* lf, int k, int* is_b) {
    int a = k - lf->base->num_kinds;
    *is_b = a % 2;
    return lf->target[a / 2];
}

static size_t lora_kind_elems(const ModelShape* s, int k) {
    const LoraFamily* lf = lora_family(s);
    if (k < lf->base->num_kinds) return lf->base->kind_elems(s, k);
    int is_b, t = adapter_target(lf, k, &is_b);
    LoraGeometry g = lf->base->lora_geometry(s, t);
    return (size_t)lf->rank * (size_t)(is_b ? g.out : g.in);
}

// A column-parallel layer's B is cut by rows as the layer's weight is, its A held whole; a row-parallel
// layer's A by columns, its B whole.
static TensorCut lora_kind_cut(const ModelShape* s, int k) {
    const LoraFamily* lf = lora_family(s);
    if (k < lf->base->num_kinds) return lf->base->kind_cut(s, k);
    int is_b, t = adapter_target(lf, k, &is_b);
    LoraGeometry g = lf->base->lora_geometry(s, t);
    size_t R = (size_t)lf->rank, in = (size_t)g.in, out = (size_t)g.out;
    if (is_b) return g.cut == CUT_ROWS ? (TensorCut){CUT_ROWS, out, R, (size_t)g.sections, (size_t)g.heads} : (TensorCut){CUT_NONE, out, R, 1, 0};
    return g.cut == CUT_COLS ? (TensorCut){CUT_COLS, R, in, 1, 0} : (TensorCut){CUT_NONE, R, in, 1, 0};
}

// Rows of a column-parallel target's block that each of tp ranks holds, as model.c's cut_tensor cuts them:
// 1/tp of each section, or one head of each (a copy) when the sections have fewer heads than ranks.
static int rows_per_rank(const LoraGeometry* g, int tp) {
    int copies = g->heads && g->heads < tp ? tp / g->heads : 1;
    return g->sections * (g->out / g->sections * copies / tp);
}

LoraGeometry lora_rank_geometry(const ModelFamily* base, const ModelShape* s, int target, int tp) {
    LoraGeometry g = base->lora_geometry(s, target);
    if (tp == 1) return g;
    if (g.cut == CUT_COLS) {
        g.in /= tp;
        return g;
    }
    // A fused output holds this rank's rows of each of its targets' blocks, in the blocks' order.
    int col = 0, width = 0, whole = 0;
    for (int t = 0; t < base->num_lora_targets; t++) {
        if (base->lora_weight_kinds[t] != base->lora_weight_kinds[target]) continue;
        LoraGeometry o = base->lora_geometry(s, t);
        int rows = rows_per_rank(&o, tp);
        col += o.col < g.col ? rows : 0;
        width += rows;
        whole += o.out;
    }
    if (whole != g.width) fail("internal: LoRA target %s's fused output is not its targets' blocks", base->lora_targets[target]);
    g.out = rows_per_rank(&g, tp);
    g.col = col;
    g.width = width;
    return g;
}

// Target names of the family, selected by a comma-separated list (NULL or "": all); one-line errors.
static unsigned select_targets(const ModelFamily* f, const char* list) {
    if (!list || !list[0]) return (1u << f->num_lora_targets) - 1;
    unsigned bits = 0;
    const char* at = list;
    while (1) {
        size_t n = strcspn(at, ",");
        int found = -1;
        for (int i = 0; i < f->num_lora_targets; i++)
            if (strlen(f->lora_targets[i]) == n && strncmp(at, f->lora_targets[i], n) == 0) found = i;
        char known[128] = "";
        for (int i = 0; i < f->num_lora_targets; i++)
            snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", i ? "," : "", f->lora_targets[i]);
        if (found < 0) fail("-lora-targets %s: %s has no target '%.*s' (its targets: %s)", list, f->name, (int)n, at, known);
        if (bits >> found & 1) fail("-lora-targets %s: '%.*s' given twice", list, (int)n, at);
        bits |= 1u << found;
        if (!at[n]) return bits;
        at += n + 1;
    }
}

// The base's own fields, then the adapters': rank, scale, targets and the parameters they train.
static void lora_describe(const ModelShape* s, char* out, size_t n) {
    const LoraFamily* lf = lora_family(s);
    if (lf->base->describe) lf->base->describe(s, out, n);
    size_t trained = 0, at = strlen(out);
    for (int k = lf->base->num_kinds; k < lf->family.num_kinds; k++) trained += lf->family.kind_elems(s, k) * (size_t)s->L;
    at += (size_t)snprintf(out + at, at < n ? n - at : 0, " + LoRA r=%d scale %g on ", lf->rank, lf->scale);
    for (int j = 0; j < lf->num_targets && at < n; j++)
        at += (size_t)snprintf(out + at, n - at, "%s%s", j ? "," : "", lf->base->lora_targets[lf->target[j]]);
    if (at < n) snprintf(out + at, n - at, " (%zu trained, the base frozen)", trained);
}

static void build_kinds(LoraFamily* lf) {
    const ModelFamily* b = lf->base;
    int n = b->num_kinds + 2 * lf->num_targets;
    if (n > LORA_MAX_KINDS) fail("internal: %d kinds with LoRA (at most %d)", n, LORA_MAX_KINDS);
    for (int k = 0; k < b->num_kinds; k++) {
        lf->kinds[k] = b->kinds[k];
        lf->kinds[k].optimizer = OPT_FROZEN;
    }
    for (int j = 0; j < lf->num_targets; j++)
        for (int ab = 0; ab < 2; ab++) {
            int k = b->num_kinds + 2 * j + ab;
            snprintf(lf->kind_names[k], LORA_KIND_NAME, "lora_%s.%s", ab ? "B" : "A", b->lora_targets[lf->target[j]]);
            lf->kinds[k] = (KindInfo){.name = lf->kind_names[k], .unit = UNIT_BLOCK, .init = ab ? INIT_ZEROS : INIT_FAN_IN,
                                      .decay = 1, .optimizer = OPT_ADAMW};
        }
    lf->family.num_kinds = n;
    lf->family.kinds = lf->kinds;
}

static void check_rank(const LoraFamily* lf, const ModelShape* base) {
    if (lf->rank < 1) fail("-lora %d: the rank must be at least 1", lf->rank);
    for (int j = 0; j < lf->num_targets; j++) {
        LoraGeometry g = lf->base->lora_geometry(base, lf->target[j]);
        int smaller = g.in < g.out ? g.in : g.out;
        if (lf->rank > smaller)
            fail("-lora %d: larger than target %s's layer (%d x %d)", lf->rank, lf->base->lora_targets[lf->target[j]], g.out, g.in);
    }
}

void lora_family_build(LoraFamily* lf, const ModelShape* base, const LoraOptions* o) {
    const ModelFamily* b = base->family;
    memset(lf, 0, sizeof(*lf));
    if (!b->num_lora_targets) fail("-lora: the %s family has no LoRA targets", b->name);
    if (!(o->dropout >= 0.0f && o->dropout < 1.0f)) fail("-lora-dropout %g: must be in [0, 1)", o->dropout);
    lf->base = b;
    lf->family = *b;
    snprintf(lf->name, sizeof(lf->name), "%s+lora", b->name);
    lf->family.name = lf->name;
    lf->family.kind_elems = lora_kind_elems;
    lf->family.kind_cut = lora_kind_cut;
    lf->family.describe = lora_describe;
    lf->rank = o->rank;
    lf->rslora = o->rslora;
    lf->dropout = o->dropout;
    lf->alpha = o->alpha > 0.0f ? o->alpha : (float)o->rank;
    lf->target_bits = select_targets(b, o->targets);
    for (int i = 0; i < b->num_lora_targets; i++)
        if (lf->target_bits >> i & 1) lf->target[lf->num_targets++] = i;
    check_rank(lf, base);
    lf->scale = lf->rslora ? lf->alpha / sqrtf((float)lf->rank) : lf->alpha / (float)lf->rank;
    build_kinds(lf);
}

int lora_max_rank(const ModelShape* base, const LoraOptions* o) {
    const ModelFamily* b = base->family;
    unsigned bits = select_targets(b, o->targets);
    int most = INT_MAX;
    for (int i = 0; i < b->num_lora_targets; i++)
        if (bits >> i & 1) {
            LoraGeometry g = b->lora_geometry(base, i);
            most = g.in < most ? g.in : most;
            most = g.out < most ? g.out : most;
        }
    return most;
}

ModelShape lora_shape(const LoraFamily* lf, const ModelShape* base) {
    ModelShape s = *base;
    s.family = &lf->family;
    return s;
}

ModelShape lora_apply(LoraFamily* lf, ModelShape base, const LoraOptions* o) {
    if (!o->rank) return base;
    lora_family_build(lf, &base, o);
    return lora_shape(lf, &base);
}

const LoraFamily* lora_of(const ModelShape* s) {
    return s->family->kind_elems == lora_kind_elems ? lora_family(s) : NULL;
}

ModelShape lora_base_shape(const ModelShape* s) {
    ModelShape b = *s;
    const LoraFamily* lf = lora_of(s);
    if (lf) b.family = lf->base;
    return b;
}

int lora_selected(const LoraFamily* lf, int target) {
    for (int j = 0; j < lf->num_targets; j++)
        if (lf->target[j] == target) return j;
    return -1;
}

uint32_t lora_dropout_key(const LoraFamily* lf, long long position, int layer, int target) {
    uint32_t run = element_noise((uint32_t)lf->seed, lf->seed >> 32);
    uint32_t micro = element_noise(run, (uint64_t)position);
    return element_noise(micro, (uint64_t)layer * LORA_MAX_TARGETS + (uint64_t)target);
}

// The header's fields against the run's: one line naming the first difference.
static void check_adapter_header(const char* path, const int32_t* h, const LoraFamily* lf, int L) {
    if (h[0] != LORA_FILE_MAGIC || h[1] != 1) fail("-lora-init %s: not an adapter file (magic %d, version %d)", path, h[0], h[1]);
    if (h[2] != lf->rank) fail("-lora-init %s: rank %d, the run's -lora is %d", path, h[2], lf->rank);
    if (h[4] != L) fail("-lora-init %s: %d layers, the model has %d", path, h[4], L);
    char have[128] = "", want[128] = "";
    for (int i = 0; i < lf->base->num_lora_targets; i++) {
        if ((unsigned)h[5] >> i & 1) snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s", have[0] ? "," : "", lf->base->lora_targets[i]);
        if (lf->target_bits >> i & 1) snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%s", want[0] ? "," : "", lf->base->lora_targets[i]);
    }
    if ((unsigned)h[5] != lf->target_bits || h[3] != lf->num_targets)
        fail("-lora-init %s: targets %s (bits %d, %d targets), the run's -lora-targets are %s", path, have, h[5], h[3], want);
    int alpha = (int)lroundf(lf->alpha * 1000.0f);
    if (h[6] != alpha) fail("-lora-init %s: alpha %g, the run's -lora-alpha is %g", path, h[6] / 1000.0, lf->alpha);
    if (h[7] != lf->rslora) fail("-lora-init %s: rslora %d, the run's -lora-rslora is %d", path, h[7], lf->rslora);
}

// Bytes the adapters of a file for this run hold after the header.
static long long adapter_bytes(const LoraFamily* lf, const ModelShape* s) {
    long long per_layer = 0;
    for (int j = 0; j < lf->num_targets; j++) {
        LoraGeometry g = lf->base->lora_geometry(s, lf->target[j]);
        per_layer += (long long)lf->rank * (g.in + g.out);
    }
    return per_layer * s->L * 4;
}

long long lora_adapter_file_bytes(const ModelShape* s) { return 1024 + adapter_bytes(lora_family(s), s); }

// Where the adapter file holds kind k of layer l (elements past the header): the layers in order, each its
// targets' A then B.
static size_t file_position(const LoraFamily* lf, const ModelShape* s, int k, int l) {
    size_t per_layer = 0, at = 0;
    for (int j = 0; j < lf->num_targets; j++) {
        LoraGeometry g = lf->base->lora_geometry(s, lf->target[j]);
        size_t a = (size_t)lf->rank * (size_t)g.in, b = (size_t)lf->rank * (size_t)g.out;
        if (k == lora_kind_a(lf, j)) at = per_layer;
        if (k == lora_kind_b(lf, j)) at = per_layer + a;
        per_layer += a + b;
    }
    return (size_t)l * per_layer + at;
}

// The canonical offset of kind k's whole tensor of layer l (llm.c's order: each kind stacked over layers).
static size_t whole_canonical(const ModelShape* s, int k, int l) {
    size_t off = 0;
    for (int i = 0; i < k; i++) off += param_kind_elems(s, i) * param_kind_layers(s, i);
    return off + (size_t)l * param_kind_elems(s, k);
}

// Each run of the adapters a layout holds (a tensor-parallel shard: runs of rows or of columns) and where
// the file holds it, in bytes; copies too when `copies`.
typedef void (*AdapterRunFn)(FILE* f, const char* path, off_t at, float* values, size_t n);
static void adapter_runs(const ParamLayout* lay, float* flat, int copies, FILE* f, const char* path, AdapterRunFn fn) {
    const LoraFamily* lf = lora_family(&lay->shape);
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (t->kind < lf->base->num_kinds || (!copies && tensor_is_copy(lay, t))) continue;
        size_t whole = whole_canonical(&lay->shape, t->kind, t->layer), at = file_position(lf, &lay->shape, t->kind, t->layer);
        for (size_t j = 0; j < t->size; j += t->run)
            fn(f, path, (off_t)(1024 + (at + tensor_canonical(t, j) - whole) * sizeof(float)), flat + t->offset + j, t->run);
    }
}

void lora_place_whole(const ParamLayout* lay, const ParamTensor* t, const float* whole, float* flat) {
    size_t first = whole_canonical(&lay->shape, t->kind, t->layer);
    for (size_t j = 0; j < t->size; j += t->run) memcpy(flat + t->offset + j, whole + (tensor_canonical(t, j) - first), t->run * sizeof(float));
}

static void seek_to(FILE* f, const char* path, off_t at) {
    if (fseeko(f, at, SEEK_SET) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
}
static void write_run(FILE* f, const char* path, off_t at, float* values, size_t n) {
    seek_to(f, path, at);
    xfwrite(values, sizeof(float), n, f, path);
}
static void read_run(FILE* f, const char* path, off_t at, float* values, size_t n) {
    seek_to(f, path, at);
    xfread(values, sizeof(float), n, f, path);
}

void lora_adapter_file_create(const char* path, const ModelShape* s) {
    const LoraFamily* lf = lora_of(s);
    if (!lf) fail("internal: adapters of a model without LoRA");
    int32_t h[256] = {LORA_FILE_MAGIC, 1, lf->rank, lf->num_targets, s->L, (int32_t)lf->target_bits,
                      (int32_t)lroundf(lf->alpha * 1000.0f), lf->rslora};
    FILE* f = xfopen(path, "wb");
    xfwrite(h, sizeof(int32_t), 256, f, path);
    // Sized up front so each writer (a pipeline stage, a tensor rank) can write its part in place.
    if (ftruncate(fileno(f), (off_t)lora_adapter_file_bytes(s)) != 0) fail("cannot size %s: %s", path, strerror(errno));
    xfclose(f, path);
}

void lora_write_adapter_part(const char* path, const ParamLayout* lay, const float* flat) {
    if (!lora_of(&lay->shape)) fail("internal: adapters of a model without LoRA");
    FILE* f = fopen(path, "r+b");
    if (!f) fail("cannot open %s for writing: %s", path, strerror(errno));
    adapter_runs(lay, (float*)flat, 0, f, path, write_run);
    xfclose(f, path);
}

void lora_read_adapters(const char* path, const ParamLayout* lay, float* flat) {
    const LoraFamily* lf = lora_of(&lay->shape);
    if (!lf) fail("internal: adapters for a model without LoRA");
    FILE* f = xfopen(path, "rb");
    int32_t h[256];
    if (fread(h, sizeof(int32_t), 256, f) != 256) fail("-lora-init %s: shorter than its header", path);
    check_adapter_header(path, h, lf, lay->shape.L);
    long long want = 1024 + adapter_bytes(lf, &lay->shape);
    if (fseeko(f, 0, SEEK_END) != 0) fail("-lora-init %s: cannot seek", path);
    long long size = (long long)ftello(f);
    if (size != want) fail("-lora-init %s: %lld bytes, the run's adapters take %lld", path, size, want);
    adapter_runs(lay, flat, 1, f, path, read_run);
    fclose(f);
}
