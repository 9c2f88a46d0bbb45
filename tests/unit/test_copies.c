// test_copies.c: copies_agree (checkpoint.h), which keeps a checkpoint from writing one of two copies that
// should be bit-identical and are not. The world plays the group: alone (tests/run_all.sh) every check is
// one of agreement; under mpirun (tests/system/t_tp.sh runs 2 and 3 ranks) the last rank changes one element and
// the group must see it exactly where the pick looks, in the fp32 master or in the working copy.
//
// The ranks hold layouts the way real groups do: a tensor group's ranks hold different shards of the
// matrices (tp_rank = rank % 2 of 2) and the same whole tensors; the tied pair's ranks hold stage 0's blocks
// with the embedding, and the last stage's blocks with its mirror.
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/checkpoint/checkpoint.h"
#include "tests/unit/testlib.h"

typedef struct {
    const ParamLayout* lay;
    float* master;
    uint16_t* params;   // bf16 working copy
} Copies;

// One span per tensor (canonical runs do not matter to the hash: the picked tensors are whole).
static void each_tensor(void* ctx, StateParts which, StateSpanFn fn, void* fn_ctx) {
    (void)which;
    Copies* c = (Copies*)ctx;
    for (int i = 0; i < c->lay->num_tensors; i++) {
        const ParamTensor* t = &c->lay->tensors[i];
        StateSpan s = {.t = t, .flat = t->offset, .n = t->size, .state = t->offset, .params = c->params + t->offset,
                       .master = c->master + t->offset, .grad_dt = DT_FP32};
        fn(&s, fn_ctx);
    }
}

// Values that depend on the element's canonical offset only, so a tensor's copies agree and two shards differ.
static void fill(Copies* c) {
    for (int i = 0; i < c->lay->num_tensors; i++) {
        const ParamTensor* t = &c->lay->tensors[i];
        for (size_t j = 0; j < t->size; j++) {
            float v = (float)(tensor_canonical(t, j) % 1009) / 1009.0f - 0.5f;
            c->master[t->offset + j] = v;
            host_to_dtype(&c->params[t->offset + j], DT_BF16, &v, 1);
        }
    }
}

static ModelState state_of(Copies* c) {
    ModelState ms;
    memset(&ms, 0, sizeof(ms));
    ms.ctx = c;
    ms.lay = c->lay;
    ms.dt = DT_BF16;
    ms.places = (StatePlaces){.params = IN_HOST, .state = IN_HOST, .grads = IN_HOST};   // no backend copies: memcpy
    ms.for_each_span = each_tensor;
    return ms;
}

typedef struct {
    Comm* world;
    int rank, size;
    TestStats st;
} T;

// A check passes when it held on every rank; rank 0 prints it.
static void verdict(T* t, const char* name, int ok) {
    long long bad = ok ? 0 : 1;
    comm_allreduce_host_max_i64(t->world, &bad, 1);
    if (t->rank != 0) {
        bad ? t->st.failed++ : t->st.passed++;
        return;
    }
    char full[128];
    snprintf(full, sizeof full, "copies_np%d_%s", t->size, name);
    check_true(&t->st, full, bad == 0);
}

// Whether the group sees the last rank's change of element `at` of tensor (kind, layer), in the master
// (working = 0) or the working copy (working = 1); the copies are restored afterwards.
static int sees_change(T* t, Copies* c, CopyPick pick, int kind, int layer, size_t at, int working) {
    const ParamTensor* x = layout_tensor(c->lay, kind, layer);
    if (!x) fail("test: the layout has no tensor %d of layer %d", (int)kind, layer);
    ModelState ms = state_of(c);
    size_t i = x->offset + at;
    float m = c->master[i];
    uint16_t p = c->params[i];
    if (t->rank == t->size - 1) {
        if (working) c->params[i] ^= 1;   // one bit of the bf16 mantissa
        else c->master[i] = nextafterf(m, 1.0f);
    }
    int agree = copies_agree(&ms, NULL, t->world, pick);
    c->master[i] = m, c->params[i] = p;
    return !agree;
}

static ParamLayout* build(const char* spec, int first, int count, EmbeddingRole emb, int with_final, int tp_rank, int tp_size) {
    ModelShape s;
    shape_from_spec(spec, &s);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build_stage(lay, &s, 64, &first, &count, 1, emb, with_final, tp_rank, tp_size);
    return lay;
}

static Copies copies_of(const ParamLayout* lay) {
    Copies c = {lay, (float*)xmalloc(lay->total * sizeof(float)), (uint16_t*)xmalloc(lay->total * sizeof(uint16_t))};
    memset(c.master, 0, lay->total * sizeof(float));
    memset(c.params, 0, lay->total * sizeof(uint16_t));
    fill(&c);
    return c;
}

// A tensor group: whole tensors are compared, shards are not (they differ by design).
static void test_tensor_group(T* t) {
    ParamLayout* lay = build("L2C64H4V1000T64", 0, 2, EMB_OWN, 1, t->rank % 2, 2);
    Copies c = copies_of(lay);
    ModelState ms = state_of(&c);
    int many = t->size > 1;
    verdict(t, "group_whole_agree", copies_agree(&ms, NULL, t->world, copy_held_whole_by_group));
    verdict(t, "no_group_agrees", copies_agree(&ms, NULL, NULL, copy_held_whole_by_group));
    verdict(t, "group_whole_ln1w_master", sees_change(t, &c, copy_held_whole_by_group, GPT2_LN1W, 1, 5, 0) == many);
    verdict(t, "group_whole_attprojb_working", sees_change(t, &c, copy_held_whole_by_group, GPT2_ATTPROJB, 0, 63, 1) == many);
    verdict(t, "group_whole_wpe_master", sees_change(t, &c, copy_held_whole_by_group, GPT2_WPE, -1, 0, 0) == many);
    verdict(t, "group_whole_lnfb_working", sees_change(t, &c, copy_held_whole_by_group, GPT2_LNFB, -1, 17, 1) == many);
    verdict(t, "group_whole_ignores_shards", !sees_change(t, &c, copy_held_whole_by_group, GPT2_QKVW, 0, 3, 0) &&
                                                 !sees_change(t, &c, copy_held_whole_by_group, GPT2_WTE, -1, 3, 1));
    free(c.master), free(c.params), free(lay);
}

// The tied pair: stage 0 (blocks 0-1 and the embedding) and the last stage (blocks 2-3, lnf and the mirror).
static void test_tied_pair(T* t) {
    int last = t->rank % 2;
    ParamLayout* lay = last ? build("L4C64H4V1000T64", 2, 2, EMB_MIRROR, 1, 0, 1) : build("L4C64H4V1000T64", 0, 2, EMB_OWN, 0, 0, 1);
    Copies c = copies_of(lay);
    ModelState ms = state_of(&c);
    int many = t->size > 1;
    verdict(t, "tied_agree", copies_agree(&ms, NULL, t->world, copy_in_embedding_unit));
    verdict(t, "tied_wte_master", sees_change(t, &c, copy_in_embedding_unit, GPT2_WTE, -1, 64 * 999 + 1, 0) == many);
    verdict(t, "tied_wte_working", sees_change(t, &c, copy_in_embedding_unit, GPT2_WTE, -1, 0, 1) == many);
    verdict(t, "tied_wpe_master", sees_change(t, &c, copy_in_embedding_unit, GPT2_WPE, -1, 64 * 63, 0) == many);
    int block = last ? 2 : 0;   // each end's own blocks differ by design
    verdict(t, "tied_ignores_blocks", !sees_change(t, &c, copy_in_embedding_unit, GPT2_FCW, block, 7, 0));
    free(c.master), free(c.params), free(lay);
}

int main(int argc, char** argv) {
    T t = {0};
    t.world = comm_init_world(&argc, &argv);
    t.rank = comm_rank(t.world);
    t.size = comm_size(t.world);
    test_tensor_group(&t);
    test_tied_pair(&t);
    int failed = t.st.failed;
    comm_finalize(t.world);
    return failed ? 1 : 0;
}
