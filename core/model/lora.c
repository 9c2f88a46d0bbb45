// lora.c: the LoRA'd family (lora.h).
#include "core/model/lora.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

static TensorCut lora_kind_cut(const ModelShape* s, int k) {
    const LoraFamily* lf = lora_family(s);
    if (k < lf->base->num_kinds) return lf->base->kind_cut(s, k);
    int is_b, t = adapter_target(lf, k, &is_b);
    LoraGeometry g = lf->base->lora_geometry(s, t);
    size_t R = (size_t)lf->rank;
    return is_b ? (TensorCut){CUT_NONE, (size_t)g.out, R, 1, 0} : (TensorCut){CUT_NONE, R, (size_t)g.in, 1, 0};
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

void lora_write_adapters(const char* path, const ParamLayout* lay, const float* flat) {
    const LoraFamily* lf = lora_of(&lay->shape);
    if (!lf) fail("internal: adapters of a model without LoRA");
    int32_t h[256] = {LORA_FILE_MAGIC, 1, lf->rank, lf->num_targets, lay->shape.L, (int32_t)lf->target_bits,
                      (int32_t)lroundf(lf->alpha * 1000.0f), lf->rslora};
    FILE* f = xfopen(path, "wb");
    xfwrite(h, sizeof(int32_t), 256, f, path);
    for (int l = 0; l < lay->shape.L; l++)
        for (int j = 0; j < lf->num_targets; j++)
            for (int ab = 0; ab < 2; ab++) {
                const ParamTensor* t = layout_tensor(lay, ab ? lora_kind_b(lf, j) : lora_kind_a(lf, j), l);
                if (!t || t->size != param_kind_elems(&lay->shape, t->kind)) fail("internal: adapters not held whole here");
                xfwrite(flat + t->offset, sizeof(float), t->size, f, path);
            }
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
    if (fseek(f, 0, SEEK_END) != 0) fail("-lora-init %s: cannot seek", path);
    long long size = ftell(f);
    if (size != want) fail("-lora-init %s: %lld bytes, the run's adapters take %lld", path, size, want);
    if (fseek(f, 1024, SEEK_SET) != 0) fail("-lora-init %s: cannot seek", path);
    for (int l = 0; l < lay->shape.L; l++)
        for (int j = 0; j < lf->num_targets; j++)
            for (int ab = 0; ab < 2; ab++) {
                int k = ab ? lora_kind_b(lf, j) : lora_kind_a(lf, j);
                size_t n = param_kind_elems(&lay->shape, k);
                const ParamTensor* t = layout_tensor(lay, k, l);
                if (t && t->size != n) fail("internal: -lora-init into a split adapter");
                if (!t) {   // another stage's layer
                    if (fseek(f, (long)(n * 4), SEEK_CUR) != 0) fail("-lora-init %s: cannot seek", path);
                    continue;
                }
                xfread(flat + t->offset, sizeof(float), n, f, path);
            }
    fclose(f);
}
