// test_lora.c: the LoRA'd family (core/model/lora.h) and the adapters' steps (lora_steps.h), on GPT-2 and
// Llama (q/k norms, kv heads fewer than heads, so q, k and v blocks of different widths), every target on,
// with a nonzero B and a scale other than 1. What must hold:
//   - the family: the base's kinds all frozen, then lora_A.<t> (R, in) and lora_B.<t> (out, R) per target;
//     the planner gives gradients, master and state to the adapters only;
//   - with B = 0 the loss is the base model's bit for bit;
//   - the adapted model is the merged one, W' = W + scale B A: its loss within 1e-5, and the adapters'
//     gradients are those the merged model's weight gradient gives, dB = scale dW' A^T and
//     dA = scale B^T dW' (an independent check: the base path's gradients, folded on the host in double);
//   - -r 1..3 and zb's split backward give -r 0's gradients bit for bit.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model/lora.h"
#include "core/model/walk.h"
#include "core/models/catalog.h"
#include "tests/unit/step_testlib.h"
#include "tests/unit/testlib.h"

typedef struct {
    ModelShape base_shape, shape;
    LoraFamily lf;
    ParamLayout base, lora;
} Fixture;

static Fixture* fixture(const char* spec, int rank, float alpha) {
    Fixture* f = (Fixture*)xcalloc(1, sizeof(Fixture));
    if (!shape_from_spec(spec, &f->base_shape)) fail("test_lora: spec %s", spec);
    LoraOptions o = {rank, alpha, 0, 0.0f, NULL};
    lora_family_build(&f->lf, &f->base_shape, &o);
    f->shape = lora_shape(&f->lf, &f->base_shape);
    layout_build(&f->base, &f->base_shape, layout_pad_multiple(1));
    layout_build(&f->lora, &f->shape, layout_pad_multiple(1));
    return f;
}

static const float* tensor_at(const ParamLayout* lay, const float* flat, int kind, int layer) {
    return flat + layout_tensor(lay, kind, layer)->offset;
}

// Selected target j of layer l in flat values (or gradients): its geometry, A and B, and where the base
// layout holds its weight matrix.
typedef struct {
    LoraGeometry geo;
    const float *A, *B;
    size_t weight;
} Target;
static Target target_of(const Fixture* f, const float* flat, int l, int j) {
    int target = f->lf.target[j];
    return (Target){f->lf.base->lora_geometry(&f->shape, target), tensor_at(&f->lora, flat, lora_kind_a(&f->lf, j), l),
                    tensor_at(&f->lora, flat, lora_kind_b(&f->lf, j), l),
                    layout_tensor(&f->base, f->lf.base->lora_weight_kinds[target], l)->offset};
}

// The LoRA layout's values: the base's (base_vals, in the base layout) and adapters from seed (B = 0 if
// zero_b); merged (base layout) gets W + scale B A.
static void values(const Fixture* f, const float* base_vals, uint64_t seed, int zero_b, float* vals, float* merged) {
    memcpy(merged, base_vals, f->base.total * sizeof(float));
    for (size_t i = 0; i < f->lora.total; i++) vals[i] = 0.0f;
    for (int i = 0; i < f->lora.num_tensors; i++) {
        const ParamTensor* t = &f->lora.tensors[i];
        if (t->kind < f->lf.base->num_kinds) {
            memcpy(vals + t->offset, tensor_at(&f->base, base_vals, t->kind, t->layer), t->size * sizeof(float));
            continue;
        }
        int is_b = (t->kind - f->lf.base->num_kinds) % 2;
        for (size_t j = 0; j < t->size; j++) vals[t->offset + j] = is_b && zero_b ? 0.0f : 0.3f * step_unif(&seed);
    }
    for (int l = 0; l < f->shape.L; l++)
        for (int j = 0; j < f->lf.num_targets; j++) {
            Target t = target_of(f, vals, l, j);
            float* W = merged + t.weight;
            for (int o = 0; o < t.geo.out; o++)
                for (int in = 0; in < t.geo.in; in++) {
                    double s = 0.0;
                    for (int r = 0; r < f->lf.rank; r++) s += (double)t.B[o * f->lf.rank + r] * t.A[r * t.geo.in + in];
                    W[(size_t)(t.geo.col + o) * t.geo.in + in] += (float)(f->lf.scale * s);
                }
        }
}

// The largest difference between the adapters' gradients and those the merged model's weight gradients give,
// relative to the largest of the latter.
static double adapter_grad_error(const Fixture* f, const float* vals, const float* grads, const float* merged_grads) {
    double worst = 0.0, largest = 0.0;
    int R = f->lf.rank;
    for (int l = 0; l < f->shape.L; l++)
        for (int j = 0; j < f->lf.num_targets; j++) {
            Target t = target_of(f, vals, l, j), d = target_of(f, grads, l, j);
            LoraGeometry geo = t.geo;
            const float *A = t.A, *B = t.B, *dA = d.A, *dB = d.B;
            const float* dW = merged_grads + t.weight + (size_t)geo.col * geo.in;
            for (int o = 0; o < geo.out; o++)
                for (int r = 0; r < R; r++) {
                    double want = 0.0;
                    for (int in = 0; in < geo.in; in++) want += (double)dW[(size_t)o * geo.in + in] * A[r * geo.in + in];
                    want *= f->lf.scale;
                    worst = fmax(worst, fabs(want - dB[o * R + r])), largest = fmax(largest, fabs(want));
                }
            for (int r = 0; r < R; r++)
                for (int in = 0; in < geo.in; in++) {
                    double want = 0.0;
                    for (int o = 0; o < geo.out; o++) want += (double)B[o * R + r] * dW[(size_t)o * geo.in + in];
                    want *= f->lf.scale;
                    worst = fmax(worst, fabs(want - dA[r * geo.in + in])), largest = fmax(largest, fabs(want));
                }
        }
    return largest > 0.0 ? worst / largest : 1.0;
}

static void check_family_table(TestStats* st, const char* name, const Fixture* f) {
    const ModelFamily* b = f->lf.base;
    int ok = f->shape.family->num_kinds == b->num_kinds + 2 * b->num_lora_targets;
    for (int k = 0; k < b->num_kinds; k++) ok &= kind_info(&f->shape, k)->optimizer == OPT_FROZEN;
    for (int j = 0; j < f->lf.num_targets; j++) {
        LoraGeometry geo = b->lora_geometry(&f->shape, f->lf.target[j]);
        const KindInfo* a = kind_info(&f->shape, lora_kind_a(&f->lf, j));
        char want[64];
        snprintf(want, sizeof(want), "lora_A.%s", b->lora_targets[f->lf.target[j]]);
        ok &= strcmp(a->name, want) == 0 && a->optimizer == OPT_ADAMW && a->unit == UNIT_BLOCK;
        ok &= param_kind_elems(&f->shape, lora_kind_a(&f->lf, j)) == (size_t)f->lf.rank * geo.in;
        ok &= param_kind_elems(&f->shape, lora_kind_b(&f->lf, j)) == (size_t)geo.out * f->lf.rank;
    }
    char full[128];
    snprintf(full, sizeof(full), "%s_family_frozen_base_then_adapters", name);
    check_true(st, full, ok);
    // The plan: gradients, master and AdamW's m, v of the adapters only (and of the few alignment elements
    // between them and at their section's end, which no tensor holds); a bf16 working copy of everything.
    size_t adapters = 0, unheld = 0;
    for (int u = 0; u < f->lora.num_units; u++) unheld += f->lora.units[u].padded - f->lora.units[u].frozen;
    for (int i = 0; i < f->lora.num_tensors; i++)
        if (f->lora.tensors[i].kind >= b->num_kinds) adapters += f->lora.tensors[i].size;
    unheld -= adapters;
    MemLedger m = {{0}};
    zero_plan(&m, &f->lora, zero_caps(1), 1, DT_BF16, NULL);
    size_t n = adapters + unheld;
    snprintf(full, sizeof(full), "%s_plan_state_and_gradients_of_adapters_only", name);
    check_true(st, full, unheld < adapters / 8 && m.bytes[MEM_MASTER] == 4 * n && m.bytes[MEM_OPTIMIZER] == 8 * n &&
                             m.bytes[MEM_GRADS] == 2 * n + 4 && m.bytes[MEM_PARAMS] == 2 * f->lora.total);
}

static void check_model(TestStats* st, const char* name, const char* spec) {
    Fixture* f = fixture(spec, 4, 8.0f);   // scale 2
    check_family_table(st, name, f);
    float* base_vals = xcalloc(f->base.total, 4);
    uint64_t seed = 99;
    for (size_t i = 0; i < f->base.total; i++) base_vals[i] = 0.2f * step_unif(&seed);
    float *vals = xcalloc(f->lora.total, 4), *merged = xcalloc(f->base.total, 4);
    float *grads = xcalloc(f->lora.total, 4), *again = xcalloc(f->lora.total, 4), *base_grads = xcalloc(f->base.total, 4);
    char full[128];

    values(f, base_vals, 5, 1, vals, merged);
    double base_loss = run_step(&f->base, base_vals, 0, RUN_FUSED, base_grads);
    double zero_b_loss = run_step(&f->lora, vals, 0, RUN_FUSED, grads);
    snprintf(full, sizeof(full), "%s_b_zero_loss_is_the_base_bits", name);
    check_true(st, full, memcmp(&base_loss, &zero_b_loss, sizeof(double)) == 0);

    values(f, base_vals, 5, 0, vals, merged);
    double merged_loss = run_step(&f->base, merged, 0, RUN_FUSED, base_grads);
    double loss = run_step(&f->lora, vals, 0, RUN_FUSED, grads);
    snprintf(full, sizeof(full), "%s_loss_is_the_merged_models", name);
    check_close(st, full, fabs(loss - merged_loss) / fabs(merged_loss), 1e-5);
    snprintf(full, sizeof(full), "%s_adapter_gradients_are_the_merged_models", name);
    check_close(st, full, adapter_grad_error(f, vals, grads, base_grads), 1e-4);
    int nonzero_b = 0;
    for (size_t i = 0; i < f->lora.total; i++) nonzero_b |= grads[i] != 0.0f;
    for (int r = 1; r <= 4; r++) {
        double l = run_step(&f->lora, vals, r == 4 ? 0 : r, r == 4 ? RUN_SPLIT : RUN_FUSED, again);
        if (r == 4) snprintf(full, sizeof(full), "%s_split_backward_same_bits", name);
        else snprintf(full, sizeof(full), "%s_r%d_same_bits", name, r);
        check_true(st, full, nonzero_b && memcmp(&l, &loss, sizeof(l)) == 0 && memcmp(grads, again, f->lora.total * 4) == 0);
    }
    free(base_vals), free(vals), free(merged), free(grads), free(again), free(base_grads), free(f);
}

int main(void) {
    TestStats st = {0, 0};
    omp_set_num_threads(1);   // tiny matrices: threads would only wait on each other (the bits do not depend on it)
    check_model(&st, "gpt2", "L2C64H4V200T16");
    check_model(&st, "llama", "llama:L2,C64,H4,K2,D16,F96,V200,T16,qknorm");
    return test_exit(&st);
}
