// test_layout.c: the layer-ordered parameter layout, whole, per pipeline stage and per tensor-parallel rank.
// A model split into stages or tensor shards must hold every parameter exactly once (same canonical
// offsets, copies aside), each stage's flat buffer must be its own (starting at 0, units padded), lookups of
// what a stage does not hold must say so, and a shard's runs, overlaps and initial values must be the whole
// tensor's at the canonical places. Also the model specs, the initial values themselves, and the per-chunk
// views of an interleaved stage.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/model/model.h"
#include "core/pipeline/pipeline.h"
#include "core/pipeline/schedule.h"
#include "tests/unit/testlib.h"

static size_t canonical_total(const ModelShape* s) {
    size_t n = 0;
    for (int k = 0; k < GPT2_NUM_KINDS; k++) n += param_kind_elems(s, (int)k) * ((k >= GPT2_LN1W && k <= GPT2_FCPROJB) ? (size_t)s->L : 1);
    return n;
}

// Marks the canonical offset of every element the layout owns (not a mirror's or a tensor-group copy's);
// returns 0 if some element is marked twice.
static int mark(const ParamLayout* lay, unsigned char* seen) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (tensor_is_copy(lay, t)) continue;
        for (size_t j = 0; j < t->size; j++) {
            if (seen[tensor_canonical(t, j)]) return 0;
            seen[tensor_canonical(t, j)] = 1;
        }
    }
    return 1;
}

// Units follow one another from 0, each padded to the smallest multiple of pad that holds it.
static int units_well_formed(const ParamLayout* lay, size_t pad) {
    size_t off = 0;
    for (int u = 0; u < lay->num_units; u++) {
        const Unit* un = &lay->units[u];
        if (un->offset != off || un->padded % pad || un->padded < un->size || un->padded >= un->size + pad) return 0;
        for (int i = un->first_tensor; i < un->first_tensor + un->num_tensors; i++) {
            const ParamTensor* t = &lay->tensors[i];
            if (t->unit != u || t->offset < un->offset || t->offset + t->size > un->offset + un->size || t->offset % 64) return 0;
        }
        off += un->padded;
    }
    return off == lay->total;
}

static void test_whole(TestStats* st) {
    ModelShape s;
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
    for (int k = 0; k < GPT2_NUM_KINDS; k++)
        for (int l = 0; l < s.L; l++) {
            int block = k >= GPT2_LN1W && k <= GPT2_FCPROJB;
            const ParamTensor* t = layout_tensor(lay, (int)k, block ? l : -1);
            lookups &= t && t->kind == (int)k && t->layer == (block ? l : -1);
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
    ModelShape s;
    shape_from_spec(spec, &s);
    PipelinePlan plan;
    pipeline_plan(&plan, &s, P, SCHEDULE_1F1B, 1, 1, 1, 0, P, s.maxT, 1);
    const int *first = plan.first, *nb = plan.count;
    size_t n = canonical_total(&s);
    unsigned char* seen = (unsigned char*)xcalloc(n, 1);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    ParamLayout* stage0 = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    int once = 1, formed = 1, absent = 1, mirror = 1;
    for (int p = 0; p < P; p++) {
        pipeline_stage_layout(lay, &plan, &s, 2, p, 0);   // 2 replicas: units padded to 128
        if (p == 0) memcpy(stage0, lay, sizeof(*lay));
        int last = p == P - 1, has_mirror = last && P > 1;
        once &= mark(lay, seen);
        formed &= units_well_formed(lay, 128) && lay->num_units == nb[p] + (p == 0) + last + has_mirror &&
                  lay->first_block == first[p] && lay->num_blocks == nb[p];
        for (int l = 0; l < s.L; l++) {   // a block of another stage is absent; one of this stage is found
            int here = l >= first[p] && l < first[p] + nb[p];
            absent &= (layout_tensor(lay, GPT2_QKVW, l) != NULL) == here && (lay->block_unit[l] >= 0) == here;
        }
        absent &= (layout_tensor(lay, GPT2_WTE, -1) != NULL) == (p == 0 || last) && (layout_tensor(lay, GPT2_LNFW, -1) != NULL) == last;
        absent &= (layout_tensor(lay, GPT2_WPE, -1) != NULL) == (p == 0 || last) && lay->emb_mirror == has_mirror;
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

// tensor_overlaps of a canonical range lands each element once, at the index whose canonical offset it is.
typedef struct {
    size_t c, count;
    unsigned char* hit;   // per element of [c, c + count)
    int ok;
} OverlapCheck;

static void check_overlap(const ParamTensor* t, size_t index, size_t canonical, size_t n, void* ctx) {
    OverlapCheck* o = (OverlapCheck*)ctx;
    for (size_t i = 0; i < n; i++) {
        size_t c = canonical + i;
        if (c < o->c || c >= o->c + o->count || tensor_canonical(t, index + i) != c || o->hit[c - o->c]) o->ok = 0;
        else o->hit[c - o->c] = 1;
    }
}

// Tensor parallelism over tp ranks of each pipeline stage: the shards and the copies of rank 0 hold every
// element once; the copies are exactly the kinds held whole; each shard has the Megatron widths; a range
// of each tensor is found once across the ranks; and a shard's initial values are the whole tensor's.
static void test_tensor_parallel(TestStats* st, const char* spec, int P, int tp) {
    ModelShape s;
    shape_from_spec(spec, &s);
    PipelinePlan plan;
    pipeline_plan(&plan, &s, P, SCHEDULE_1F1B, 1, 1, 1, 0, P, s.maxT, 1);
    size_t n = canonical_total(&s), C = (size_t)s.C;
    unsigned char* seen = (unsigned char*)xcalloc(n, 1);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    ParamLayout* whole = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(whole, &s, 64);
    int once = 1, copies = 1, widths = 1, formed = 1, values = 1;
    OverlapCheck ov[GPT2_NUM_KINDS];
    for (int k = 0; k < GPT2_NUM_KINDS; k++) {   // a range inside each tensor of block 0 (or the tensor)
        const ParamTensor* w = layout_tensor(whole, (int)k, 0);
        ov[k] = (OverlapCheck){w->canonical + w->size / 3, w->size / 2 + 1, (unsigned char*)xcalloc(w->size, 1), 1};
    }
    for (int p = 0; p < P; p++)
        for (int r = 0; r < tp; r++) {
            layout_build_stage(lay, &s, 128, &plan.first[p], &plan.count[p], 1, p == 0 ? EMB_OWN : p == P - 1 ? EMB_MIRROR : EMB_NONE,
                               p == P - 1, r, tp);
            once &= mark(lay, seen);
            formed &= units_well_formed(lay, 128);
            widths &= layout_heads(lay) == s.NH / tp && layout_attn_channels(lay) == (int)C / tp;
            for (int i = 0; i < lay->num_tensors; i++) {
                const ParamTensor* t = &lay->tensors[i];
                const ParamTensor* w = layout_tensor(whole, t->kind, t->layer);
                int held_whole = t->kind != GPT2_QKVW && t->kind != GPT2_QKVB && t->kind != GPT2_FCW && t->kind != GPT2_FCB &&
                                 t->kind != GPT2_ATTPROJW && t->kind != GPT2_FCPROJW && t->kind != GPT2_WTE;
                copies &= t->replica == (held_whole && r > 0) && (held_whole ? t->size == w->size : t->size * (size_t)tp == w->size);
                if (t->kind == GPT2_ATTPROJW) widths &= t->run == C / (size_t)tp && t->stride == C;
                if (t->kind == GPT2_QKVW) widths &= t->run == C / (size_t)tp * C && t->stride == C * C;
                if (t->kind == GPT2_WTE)   // the vocabulary-parallel embedding: rows [r, r + 1) * Vp / tp, one run
                    widths &= t->run == t->size && t->canonical == w->canonical + (size_t)r * (size_t)(s.Vp / tp) * C &&
                              layout_vocab_first(lay) == r * s.Vp / tp && layout_vocab_rows(lay) == s.Vp / tp;
                if (t->layer == 0 || (t->layer < 0 && !unit_is_mirror(lay, t->unit))) {
                    if (!t->replica) tensor_overlaps(t, ov[t->kind].c, ov[t->kind].count, check_overlap, &ov[t->kind]);
                    float* mine = (float*)xmalloc(t->size * sizeof(float));
                    float* all = (float*)xmalloc(w->size * sizeof(float));
                    init_tensor_values(mine, &s, t, 42);
                    init_tensor_values(all, &s, w, 42);
                    for (size_t j = 0; j < t->size; j++) values &= mine[j] == all[tensor_canonical(t, j) - w->canonical];
                    free(mine);
                    free(all);
                }
            }
        }
    int all = 1, found = 1;
    for (size_t i = 0; i < n; i++) all &= seen[i];
    for (int k = 0; k < GPT2_NUM_KINDS; k++) {
        for (size_t i = 0; i < ov[k].count; i++) found &= ov[k].hit[i];
        found &= ov[k].ok;
        free(ov[k].hit);
    }
    char name[96];
    snprintf(name, sizeof(name), "layout_tp%d_%s_P%d_cover_once", tp, spec, P);
    check_true(st, name, once && all);
    snprintf(name, sizeof(name), "layout_tp%d_%s_P%d_copies_are_whole_kinds", tp, spec, P);
    check_true(st, name, copies);
    snprintf(name, sizeof(name), "layout_tp%d_%s_P%d_megatron_widths", tp, spec, P);
    check_true(st, name, widths && formed);
    snprintf(name, sizeof(name), "layout_tp%d_%s_P%d_overlaps_find_each_element_once", tp, spec, P);
    check_true(st, name, found);
    snprintf(name, sizeof(name), "layout_tp%d_%s_P%d_shard_values_are_the_whole_tensors", tp, spec, P);
    check_true(st, name, values);
    free(whole);
    free(lay);
    free(seen);
}

// The vocabulary split: which -tp can cut Vp rows in equal multiples of 8, and each rank's real rows.
static void test_vocab_split(TestStats* st) {
    ModelShape s;
    shape_from_spec("L1C64H4V1000T64", &s);   // Vp 1024
    check_true(st, "vocab_split_allowed", shape_splits_vocab(&s, 1) && shape_splits_vocab(&s, 2) && shape_splits_vocab(&s, 128));
    check_true(st, "vocab_split_refused", !shape_splits_vocab(&s, 3) && !shape_splits_vocab(&s, 256));
    ModelShape gpt2;
    shape_from_spec("d12", &gpt2);   // Vp 50304 = 128 * 393
    check_true(st, "vocab_split_gpt2", shape_splits_vocab(&gpt2, 16) && shape_splits_vocab(&gpt2, 3) && !shape_splits_vocab(&gpt2, 32));
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    int real[4], ok = 1, first = 0, count = 1;
    for (int r = 0; r < 4; r++) {
        layout_build_stage(lay, &s, 64, &first, &count, 1, EMB_OWN, 1, r, 4);
        real[r] = layout_vocab_real(lay);
        ok &= layout_vocab_rows(lay) == 256 && layout_vocab_first(lay) == 256 * r;
    }
    check_true(st, "vocab_split_real_rows", ok && real[0] == 256 && real[2] == 256 && real[3] == 1000 - 768);
    free(lay);
}

// Model specs: GPT-2's four presets, a custom spec's defaults (V 50257, T 1024), decimal fields (a leading
// zero is not octal), a vocabulary that is already a multiple of 128 kept unpadded, and names that are not
// specs (a model file's, say) left to the caller. The parameter count is llm.c's for GPT-2 124M with the
// padded vocabulary.
static int shape_is(const ModelShape* s, int L, int C, int NH, int V, int Vp, int maxT) {
    return s->L == L && s->C == C && s->NH == NH && s->V == V && s->Vp == Vp && s->maxT == maxT;
}

static void test_specs(TestStats* st) {
    static const struct { const char* name; int L, C, NH; } gpt2[] = {
        {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    ModelShape s;
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        memset(&s, 0, sizeof s);
        ok &= shape_from_spec(gpt2[i].name, &s) == 1 && shape_is(&s, gpt2[i].L, gpt2[i].C, gpt2[i].NH, 50257, 50304, 1024);
    }
    check_true(st, "spec_gpt2_presets", ok);
    shape_from_spec("d12", &s);
    check_true(st, "spec_d12_param_count", shape_param_count(&s) == 124475904);
    memset(&s, 0, sizeof s);
    ok = shape_from_spec("L9C64H4", &s) == 1 && shape_is(&s, 9, 64, 4, 50257, 50304, 1024);
    memset(&s, 0, sizeof s);
    ok &= shape_from_spec("L2C064H4V1024T08", &s) == 1 && shape_is(&s, 2, 64, 4, 1024, 1024, 8);
    check_true(st, "spec_custom_fields", ok);
    check_true(st, "spec_other_names_are_not_specs",
               !shape_from_spec("model.bin", &s) && !shape_from_spec("d13", &s) && !shape_from_spec("L", &s) &&
                   !shape_from_spec("Lx", &s));
}

// Initial values of a whole model: LayerNorm weights 1, biases 0, matrices N(0, 0.02) (the residual
// projections 0.02 / sqrt(2L)), every real wte row drawn and the padded rows zero; the same seed gives the
// same values, another seed others.
static void test_init(TestStats* st) {
    ModelShape s;
    shape_from_spec("L2C64H4V1000T32", &s);   // Vp 1024: 24 padded rows
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(lay, &s, 64);
    int consts = 1, stds = 1, wte_ok = 1, seeded = 1;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        float* a = (float*)xmalloc(t->size * sizeof(float));
        float* b = (float*)xmalloc(t->size * sizeof(float));
        init_tensor_values(a, &s, t, 42);
        init_tensor_values(b, &s, t, 42);
        seeded &= memcmp(a, b, t->size * sizeof(float)) == 0;
        int k = t->kind;
        if (k == GPT2_LN1W || k == GPT2_LN2W || k == GPT2_LNFW || k == GPT2_LN1B || k == GPT2_LN2B || k == GPT2_LNFB || k == GPT2_QKVB ||
            k == GPT2_ATTPROJB || k == GPT2_FCB || k == GPT2_FCPROJB) {
            float want = k == GPT2_LN1W || k == GPT2_LN2W || k == GPT2_LNFW ? 1.0f : 0.0f;
            for (size_t j = 0; j < t->size; j++) consts &= a[j] == want;
        } else {
            size_t real = k == GPT2_WTE ? (size_t)s.V * s.C : t->size;
            double ss = 0.0;
            for (size_t j = 0; j < real; j++) {
                ss += (double)a[j] * a[j];
                wte_ok &= a[j] != 0.0f;   // a normal draw is never exactly 0
            }
            for (size_t j = real; j < t->size; j++) wte_ok &= a[j] == 0.0f;
            double want = k == GPT2_ATTPROJW || k == GPT2_FCPROJW ? 0.02 / sqrt(2.0 * s.L) : 0.02;
            stds &= fabs(sqrt(ss / real) / want - 1.0) < 0.1;   // >= 2048 draws: the std's own spread is < 2%
            init_tensor_values(b, &s, t, 43);
            seeded &= memcmp(a, b, t->size * sizeof(float)) != 0;
        }
        free(a);
        free(b);
    }
    check_true(st, "init_layernorm_ones_biases_zero", consts);
    check_true(st, "init_matrices_std", stds);
    check_true(st, "init_every_real_row_drawn_padding_zero", wte_ok);
    check_true(st, "init_same_seed_same_values", seeded);
    free(lay);
}

// Chunk views of the two stages of an interleaved pipeline over 4 blocks (2 chunks of 1 block each): each
// view is one chunk of its block, over the stage's own units; the embeddings go with the chunk that runs
// them (stage 0's first, the mirror on the last stage's last) and the final LayerNorm with the last stage's
// last chunk.
static void test_chunk_views(TestStats* st) {
    ModelShape s;
    shape_from_spec("L4C64H4V1000T64", &s);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    ParamLayout* view = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    int ok = 1;
    for (int stage = 0; stage < 2; stage++) {
        int first[2] = {stage, stage + 2}, count[2] = {1, 1};
        layout_build_stage(lay, &s, 64, first, count, 2, stage ? EMB_MIRROR : EMB_OWN, stage, 0, 1);
        for (int c = 0; c < 2; c++) {
            layout_chunk_view(lay, c, view);
            int emb = stage ? c == 1 : c == 0, fin = stage && c == 1;
            ok &= view->num_chunks == 1 && view->first_block == first[c] && view->chunk_first[0] == first[c] &&
                  view->num_blocks == 1 && view->chunk_count[0] == 1;
            ok &= (view->emb_unit >= 0) == emb && (view->emb_unit < 0 || view->emb_unit == lay->emb_unit) &&
                  view->emb_mirror == (emb && stage) && (view->final_unit >= 0) == fin;
            ok &= view->total == lay->total && view->block_unit[first[c]] == lay->block_unit[first[c]];
        }
    }
    check_true(st, "chunk_views_embeddings_final_and_blocks", ok);
    free(lay);
    free(view);
}

int main(void) {
    TestStats st = {0, 0};
    test_specs(&st);
    test_chunk_views(&st);
    test_init(&st);
    test_whole(&st);
    test_vocab_split(&st);
    test_tensor_parallel(&st, "L3C64H4V1000T64", 1, 2);
    test_tensor_parallel(&st, "L3C64H4V1000T64", 1, 4);
    test_tensor_parallel(&st, "L4C64H4V1000T64", 2, 2);
    test_stages(&st, "L12C64H4V1000T64", 4);
    test_stages(&st, "L7C64H4V1000T64", 3);
    test_stages(&st, "L3C64H4V1000T64", 3);
    test_stages(&st, "L4C64H4V1000T64", 1);
    return test_exit(&st);
}
