// lora.c: the LoRA'd family (lora.h).
#include "core/model/lora.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"

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
