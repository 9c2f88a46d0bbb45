// test_layout.c: the layer-ordered parameter layout, whole and per pipeline stage. A model split into stages
// must hold every parameter exactly once (same canonical offsets), each stage's flat buffer must be its own
// (starting at 0, units padded), and lookups of what a stage does not hold must say so.
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model.h"
#include "core/pipeline.h"
#include "core/schedule.h"
#include "tests/testlib.h"

static size_t canonical_total(const GPTShape* s) {
    size_t n = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++) n += param_kind_elems(s, (ParamKind)k) * ((k >= P_LN1W && k <= P_FCPROJB) ? (size_t)s->L : 1);
    return n;
}

// Marks the canonical range of every tensor the layout owns (not a mirror's); returns 0 if some element is
// marked twice.
static int mark(const ParamLayout* lay, unsigned char* seen) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (unit_is_mirror(lay, t->unit)) continue;
        for (size_t j = 0; j < t->size; j++) {
            if (seen[t->canonical + j]) return 0;
            seen[t->canonical + j] = 1;
        }
    }
    return 1;
}

static int units_well_formed(const ParamLayout* lay, size_t pad) {
    size_t off = 0;
    for (int u = 0; u < lay->num_units; u++) {
        const Unit* un = &lay->units[u];
        if (un->offset != off || un->padded % pad || un->padded < un->size) return 0;
        for (int i = un->first_tensor; i < un->first_tensor + un->num_tensors; i++) {
            const ParamTensor* t = &lay->tensors[i];
            if (t->unit != u || t->offset < un->offset || t->offset + t->size > un->offset + un->size || t->offset % 64) return 0;
        }
        off += un->padded;
    }
    return off == lay->total;
}

static void test_whole(TestStats* st) {
    GPTShape s;
    shape_from_spec("L5C64H4V1000T32", &s);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(lay, &s, 64 * 3);
    check_true(st, "layout_whole_units", lay->num_units == s.L + 2 && lay->emb_unit == 0 && lay->final_unit == s.L + 1 &&
                                             lay->block_unit[0] == 1 && lay->block_unit[s.L - 1] == s.L);
    check_true(st, "layout_whole_well_formed", units_well_formed(lay, 64 * 3));
    size_t n = canonical_total(&s);
    unsigned char* seen = (unsigned char*)xcalloc(n, 1);
    int once = mark(lay, seen), all = 1;
    for (size_t i = 0; i < n; i++) all &= seen[i];
    check_true(st, "layout_whole_covers_canonical_once", once && all && lay->num_params == n);
    int lookups = 1;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        for (int l = 0; l < s.L; l++) {
            int block = k >= P_LN1W && k <= P_FCPROJB;
            const ParamTensor* t = layout_tensor(lay, (ParamKind)k, block ? l : -1);
            lookups &= t && t->kind == (ParamKind)k && t->layer == (block ? l : -1);
        }
    check_true(st, "layout_whole_lookup", lookups);
    free(seen);
    free(lay);
}

// The last stage's mirror of the embedding unit has stage 0's unit shape: same padded size, same tensors at
// the same places, same canonical offsets, so ZeRO cuts both into the same pieces.
static int mirror_matches(const ParamLayout* first, const ParamLayout* last) {
    const Unit *a = &first->units[first->emb_unit], *b = &last->units[last->emb_unit];
    if (first->emb_mirror || !last->emb_mirror || a->padded != b->padded || a->size != b->size || a->num_tensors != b->num_tensors) return 0;
    for (int i = 0; i < a->num_tensors; i++) {
        const ParamTensor *x = &first->tensors[a->first_tensor + i], *y = &last->tensors[b->first_tensor + i];
        if (x->kind != y->kind || x->canonical != y->canonical || x->offset - a->offset != y->offset - b->offset) return 0;
    }
    return 1;
}

static void test_stages(TestStats* st, const char* spec, int P) {
    GPTShape s;
    shape_from_spec(spec, &s);
    PipelinePlan plan;
    pipeline_plan(&plan, &s, P, P, s.maxT, 1);
    const int *first = plan.first, *nb = plan.count;
    size_t n = canonical_total(&s);
    unsigned char* seen = (unsigned char*)xcalloc(n, 1);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    ParamLayout* stage0 = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    int once = 1, formed = 1, absent = 1, mirror = 1;
    for (int p = 0; p < P; p++) {
        pipeline_stage_layout(lay, &plan, &s, 2, p);   // 2 replicas: units padded to 128
        if (p == 0) memcpy(stage0, lay, sizeof(*lay));
        int last = p == P - 1, has_mirror = last && P > 1;
        once &= mark(lay, seen);
        formed &= units_well_formed(lay, 128) && lay->num_units == nb[p] + (p == 0) + last + has_mirror &&
                  lay->first_block == first[p] && lay->num_blocks == nb[p];
        for (int l = 0; l < s.L; l++) {   // a block of another stage is absent; one of this stage is found
            int here = l >= first[p] && l < first[p] + nb[p];
            absent &= (layout_tensor(lay, P_QKVW, l) != NULL) == here && (lay->block_unit[l] >= 0) == here;
        }
        absent &= (layout_tensor(lay, P_WTE, -1) != NULL) == (p == 0 || last) && (layout_tensor(lay, P_LNFW, -1) != NULL) == last;
        absent &= (layout_tensor(lay, P_WPE, -1) != NULL) == (p == 0 || last) && lay->emb_mirror == has_mirror;
        if (has_mirror) mirror &= mirror_matches(stage0, lay);
    }
    int all = 1;
    for (size_t i = 0; i < n; i++) all &= seen[i];
    char name[96];
    snprintf(name, sizeof(name), "layout_stages_%s_P%d_cover_once", spec, P);
    check_true(st, name, once && all);
    snprintf(name, sizeof(name), "layout_stages_%s_P%d_well_formed", spec, P);
    check_true(st, name, formed);
    snprintf(name, sizeof(name), "layout_stages_%s_P%d_lookups", spec, P);
    check_true(st, name, absent);
    snprintf(name, sizeof(name), "layout_stages_%s_P%d_mirror_is_stage0_embedding", spec, P);
    check_true(st, name, mirror);
    free(stage0);
    free(lay);
    free(seen);
}

int main(void) {
    TestStats st = {0, 0};
    test_whole(&st);
    test_stages(&st, "L12C64H4V1000T64", 4);
    test_stages(&st, "L7C64H4V1000T64", 3);
    test_stages(&st, "L3C64H4V1000T64", 3);
    test_stages(&st, "L4C64H4V1000T64", 1);
    return test_exit(&st);
}
