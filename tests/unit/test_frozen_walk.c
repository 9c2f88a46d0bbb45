// test_frozen_walk.c: the backward walk over kinds that carry the frozen optimizer (optimizer_kind.h). A
// frozen kind gets no weight gradient (its gradient buffer is left as zero_begin_step left it), while the
// input gradients through it, and so every other kind's gradient and the loss, are the bits of the same
// model with nothing frozen. Checked for GPT-2 and Llama (with q/k norms and an untied head), for -r 0..3,
// and for zb's split backward (model_backward_input, then model_backward_weight).
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model/walk.h"
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/models/llama/llama.h"
#include "tests/unit/step_testlib.h"
#include "tests/unit/testlib.h"

#define MAX_TEST_KINDS 32

typedef struct {
    ModelFamily family;
    KindInfo kinds[MAX_TEST_KINDS];
    ModelShape shape;
    ParamLayout lay;
} FrozenModel;

static void model_init(FrozenModel* m, const char* spec, unsigned long long frozen) {
    if (!shape_from_spec(spec, &m->shape)) fail("test_frozen_walk: the shape's spec %s", spec);
    m->family = *m->shape.family;
    if (m->family.num_kinds > MAX_TEST_KINDS) fail("test_frozen_walk: %d kinds", m->family.num_kinds);
    memcpy(m->kinds, m->family.kinds, (size_t)m->family.num_kinds * sizeof(KindInfo));
    for (int k = 0; k < m->family.num_kinds; k++)
        if (frozen >> k & 1) m->kinds[k].optimizer = OPT_FROZEN;
    m->family.kinds = m->kinds;
    m->shape.family = &m->family;
    layout_build(&m->lay, &m->shape, layout_pad_multiple(1));
}

// One step of m from fixed values (step_testlib.h), drawn in canonical order so that a layout ordering its
// units' tensors otherwise (frozen ones first) holds the same values.
static double frozen_step(const FrozenModel* m, int r, BackwardRun how, float* grads) {
    float *init = xcalloc(m->lay.total, 4), *canonical = xmalloc(m->lay.num_params * 4);
    uint64_t seed = 17;
    for (size_t i = 0; i < m->lay.num_params; i++) canonical[i] = 0.2f * step_unif(&seed);
    for (int i = 0; i < m->lay.num_tensors; i++) {
        const ParamTensor* t = &m->lay.tensors[i];
        for (size_t j = 0; j < t->size; j++) init[t->offset + j] = canonical[tensor_canonical(t, j)];
    }
    double loss = run_step(&m->lay, init, r, how, grads);
    free(init), free(canonical);
    return loss;
}

// Every frozen tensor's gradient is exactly zero (nothing computed into it); every other one is the
// unfrozen model's, bit for bit, and so is the loss.
static int frozen_walk_ok(const FrozenModel* frozen, const FrozenModel* all, int r, BackwardRun how) {
    size_t n = frozen->lay.total;
    float *gf = xcalloc(n, 4), *ga = xcalloc(n, 4);
    double lf = frozen_step(frozen, r, how, gf), la = frozen_step(all, r, how, ga);
    int ok = memcmp(&lf, &la, sizeof(lf)) == 0, any_nonzero_frozen_in_all = 0;
    for (int i = 0; i < frozen->lay.num_tensors; i++) {
        const ParamTensor* t = &frozen->lay.tensors[i];
        const ParamTensor* ta = layout_tensor(&all->lay, t->kind, t->layer);   // frozen tensors come first in a unit
        int is_frozen = !tensor_optimizer(&frozen->lay, t)->updates;
        for (size_t j = 0; j < t->size; j++) {
            float f = gf[t->offset + j], a = ga[ta->offset + j];
            if (is_frozen) ok &= f == 0.0f, any_nonzero_frozen_in_all |= a != 0.0f;
            else ok &= memcmp(&f, &a, sizeof(f)) == 0;
        }
    }
    free(gf), free(ga);
    return ok && any_nonzero_frozen_in_all;   // the unfrozen model does have gradients there
}

static void check_family(TestStats* st, const char* name, const char* spec, unsigned long long frozen) {
    FrozenModel* f = (FrozenModel*)xmalloc(sizeof(FrozenModel));
    FrozenModel* a = (FrozenModel*)xmalloc(sizeof(FrozenModel));
    model_init(f, spec, frozen);
    model_init(a, spec, 0);
    char full[128];
    for (int r = 0; r <= 3; r++) {
        snprintf(full, sizeof(full), "%s_r%d_frozen_get_no_weight_gradient", name, r);
        check_true(st, full, frozen_walk_ok(f, a, r, RUN_FUSED));
    }
    snprintf(full, sizeof(full), "%s_split_backward_frozen_get_no_weight_gradient", name);
    check_true(st, full, frozen_walk_ok(f, a, 0, RUN_SPLIT));
    free(f), free(a);
}

#define BIT(k) (1ull << (k))

int main(void) {
    TestStats st = {0, 0};
    omp_set_num_threads(1);   // tiny matrices: threads would only wait on each other (the bits do not depend on it)
    // GPT-2: the position embedding, the first norm, q|k|v and the MLP's output projection frozen.
    check_family(&st, "gpt2", "L2C64H4V200T16",
                 BIT(GPT2_WPE) | BIT(GPT2_LN1W) | BIT(GPT2_LN1B) | BIT(GPT2_QKVW) | BIT(GPT2_QKVB) | BIT(GPT2_FCPROJW) |
                     BIT(GPT2_FCPROJB));
    // GPT-2 with everything but the final norm frozen (the shape of a LoRA'd base).
    check_family(&st, "gpt2_base", "L2C64H4V200T16", (BIT(GPT2_NUM_KINDS) - 1) & ~(BIT(GPT2_LNFW) | BIT(GPT2_LNFB)));
    // Llama with q/k norms and an untied head: the head frozen under a trained embedding.
    check_family(&st, "llama", "llama:L2,C64,H4,F128,K2,V200,T16,qknorm",
                 BIT(LLAMA_ATTN_NORM) | BIT(LLAMA_WQ) | BIT(LLAMA_WKV) | BIT(LLAMA_Q_NORM) | BIT(LLAMA_K_NORM) |
                     BIT(LLAMA_DOWN) | BIT(LLAMA_HEAD));
    return test_exit(&st);
}
