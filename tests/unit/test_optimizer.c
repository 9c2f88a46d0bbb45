// test_optimizer.c: core/zero/optimizer.c over a model state of its own (a whole L1 layout, each tensor held as
// two spans, the second starting inside it): the gradient norm, the clip scale, the canonical offset that
// keys a span's rounding noise, and AdamW through each of its paths (on the backend; -offload's staging,
// with gradients on the backend in chunks smaller than the spans, or on the host; parameters on the host)
// against the same arithmetic run one element at a time at the canonical offsets. The model runs compare
// the paths with one another (t_offload, t_zero, t_resume), which a wrong norm, clip or noise offset shared
// by all of them passes.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/model/model.h"
#include "core/zero/optimizer.h"
#include "kernels/adamw_host.h"
#include "kernels/kernels.h"
#include "tests/unit/testlib.h"

typedef struct {
    const ParamLayout* lay;
    DType dt;   // of params
    void* params;
    float *master, *m, *v, *grads;
} Fake;

static void fake_spans(void* ctx, StateParts which, StateSpanFn fn, void* fn_ctx) {
    const Fake* f = (const Fake*)ctx;
    (void)which;
    for (int i = 0; i < f->lay->num_tensors; i++) {
        const ParamTensor* t = &f->lay->tensors[i];
        size_t cut[3] = {0, t->size / 2, t->size};
        for (int k = 0; k < 2; k++) {
            size_t flat = t->offset + cut[k];
            StateSpan s = {.t = t, .flat = flat, .n = cut[k + 1] - cut[k], .state = flat,
                           .params = (char*)f->params + flat * dtype_size(f->dt), .master = f->master + flat,
                           .opt_state = {f->m + flat, f->v + flat}, .grad = f->grads + flat, .grad_dt = DT_FP32};
            if (s.n) fn(&s, fn_ctx);
        }
    }
}

static uint64_t splitmix(uint64_t* s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float unif(uint64_t* s) { return (float)((splitmix(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

typedef struct {
    size_t n;
    float *master, *grads[2];
} Init;

// The state every path starts from: master ~ U(-0.1, 0.1), params its bf16 rounding, m = v = 0.
static void fake_load(Fake* f, const Init* in, int step) {
    memcpy(f->master, in->master, in->n * sizeof(float));
    memset(f->m, 0, in->n * sizeof(float));
    memset(f->v, 0, in->n * sizeof(float));
    host_to_dtype(f->params, f->dt, in->master, in->n);
    memcpy(f->grads, in->grads[step], in->n * sizeof(float));
}

static OptimizerStep opt_step(int step) {
    OptimizerStep o = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 1234, 0, 1.0f};
    return o;
}

// Two steps through optimizer_step under `ms`, the gradients of step s loaded before it.
static void run_steps(const ModelState* ms, Backend* be, Fake* f, const Init* in) {
    fake_load(f, in, 0);
    for (int step = 0; step < 2; step++) {
        memcpy(f->grads, in->grads[step], in->n * sizeof(float));
        OptimizerStep o = opt_step(step);
        optimizer_step(ms, be, &o, 0.5f);
    }
    be_synchronize(be);
}

// The reference: every element of every tensor on its own, at its canonical offset, decay on 2-D tensors.
static void reference_steps(const ParamLayout* lay, Fake* f, const Init* in) {
    fake_load(f, in, 0);
    for (int step = 0; step < 2; step++) {
        memcpy(f->grads, in->grads[step], in->n * sizeof(float));
        OptimizerStep o = opt_step(step);
        AdamWArgs a = optimizer_args(&o, 0.5f).adamw;
        for (int i = 0; i < lay->num_tensors; i++) {
            const ParamTensor* t = &lay->tensors[i];
            AdamWArgs ta = a;
            if (!t->decay) ta.weight_decay = 0.0f;
            for (size_t j = 0; j < t->size; j++) {
                size_t e = t->offset + j;
                adamw_host((uint16_t*)f->params + e, f->dt, f->master + e, f->grads + e, DT_FP32, f->m + e, f->v + e, 1,
                           tensor_canonical(t, j), &ta);
            }
        }
    }
}

static int same_state(const Fake* a, const Fake* b, size_t n) {
    return memcmp(a->params, b->params, n * dtype_size(a->dt)) == 0 && memcmp(a->master, b->master, n * 4) == 0 &&
           memcmp(a->m, b->m, n * 4) == 0 && memcmp(a->v, b->v, n * 4) == 0;
}

static Fake fake_alloc(Backend* be, const ParamLayout* lay, int on_backend) {
    size_t n = lay->total;
    Fake f = {lay, DT_BF16, NULL, NULL, NULL, NULL, NULL};
    if (on_backend) {
        f.params = be_malloc(be, n * 2);
        f.master = be_malloc(be, n * 4), f.m = be_malloc(be, n * 4), f.v = be_malloc(be, n * 4), f.grads = be_malloc(be, n * 4);
    } else {
        f.params = xcalloc(n, 2);
        f.master = xcalloc(n, 4), f.m = xcalloc(n, 4), f.v = xcalloc(n, 4), f.grads = xcalloc(n, 4);
    }
    return f;
}
static void fake_free(Backend* be, Fake* f, int on_backend) {
    void* p[] = {f->params, f->master, f->m, f->v, f->grads};
    for (int i = 0; i < 5; i++)
        if (on_backend) be_free(be, p[i]);
        else free(p[i]);
}

static ModelState fake_state(Fake* f, float* scratch) {
    ModelState ms = {0};
    ms.ctx = f;
    ms.lay = f->lay;
    ms.dt = f->dt;
    ms.scratch = scratch;
    ms.for_each_span = fake_spans;
    return ms;
}

int main(void) {
    TestStats st = {0, 0};
    Backend* be = backend_create(0);
    ModelShape s;
    shape_from_spec("L1C64H4V200T16", &s);   // Vp 256: wte 16384 elements, the largest tensor
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(lay, &s, 64);
    const size_t n = lay->total;
    Init in = {n, xcalloc(n, 4), {xcalloc(n, 4), xcalloc(n, 4)}};
    uint64_t r = 5;
    for (size_t i = 0; i < n; i++) in.master[i] = 0.1f * unif(&r), in.grads[0][i] = unif(&r), in.grads[1][i] = unif(&r);
    float* scratch = be_malloc(be, sizeof(float));

    // The norm: the square root of the sum of squares of every span's gradient, on the backend and on the host.
    Fake dev = fake_alloc(be, lay, 1);
    ModelState ms = fake_state(&dev, scratch);
    fake_load(&dev, &in, 0);
    double ref = 0.0;
    for (int i = 0; i < lay->num_tensors; i++)
        for (size_t j = 0; j < lay->tensors[i].size; j++) ref += (double)in.grads[0][lay->tensors[i].offset + j] * in.grads[0][lay->tensors[i].offset + j];
    ref = sqrt(ref);
    double norm = grad_global_norm(&ms, be, NULL, NULL);
    check_close(&st, "grad_norm_ref", fabs(norm - ref) / ref, 1e-6);
    ms.places.grads = IN_HOST;
    double norm_host = grad_global_norm(&ms, be, NULL, NULL);
    check_true(&st, "grad_norm_host_same_bits", norm_host == norm);

    // The clip scale: clip / norm only when the norm exceeds a positive clip.
    check_true(&st, "clip_scale_above", grad_clip_scale(4.0, 1.0f) == 0.25f);
    check_true(&st, "clip_scale_below_or_at", grad_clip_scale(0.5, 1.0f) == 1.0f && grad_clip_scale(1.0, 1.0f) == 1.0f);
    check_true(&st, "clip_scale_off", grad_clip_scale(4.0, 0.0f) == 1.0f && grad_clip_scale(4.0, -1.0f) == 1.0f);

    // The noise key of a span starting j elements into its tensor: the canonical offset of that element.
    int offsets_ok = 1;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        StateSpan sp = {.t = t, .flat = t->offset + 7, .n = 1, .grad_dt = DT_FP32};
        offsets_ok &= span_canonical_offset(&sp) == tensor_canonical(t, 7) && tensor_canonical(t, 7) == t->canonical + 7;
    }
    check_true(&st, "span_offset_is_canonical", offsets_ok);

    // AdamW, two steps, bf16 parameters (stochastic rounding, keyed by offset), each path against the reference.
    Fake want = fake_alloc(be, lay, 0);
    reference_steps(lay, &want, &in);
    ms = fake_state(&dev, scratch);
    run_steps(&ms, be, &dev, &in);
    check_true(&st, "adamw_step_backend_matches_reference", same_state(&dev, &want, n));
    fake_free(be, &dev, 1);

    Fake host = fake_alloc(be, lay, 0);   // master, m, v on the host; gradients and params "on the backend"
    const size_t chunk = 1000;            // smaller than most spans: several chunks each, both buffers in turn
    void* stage = xmalloc(2 * chunk * (4 + 2));
    ms = fake_state(&host, scratch);
    ms.places.state = IN_HOST, ms.stage = (HostStage){.buf = stage, .elems = chunk};
    run_steps(&ms, be, &host, &in);
    check_true(&st, "adamw_step_offload_staged_matches_reference", same_state(&host, &want, n));
    free(stage);
    stage = xmalloc(2 * chunk * 2);   // -offload 2: the gradients are on the host, only params are staged
    ms.places.grads = IN_HOST, ms.stage.buf = stage;
    run_steps(&ms, be, &host, &in);
    check_true(&st, "adamw_step_offload_grads_on_host_matches_reference", same_state(&host, &want, n));
    free(stage);
    ms.places.params = IN_HOST, ms.stage = (HostStage){.buf = NULL, .elems = 0};   // nothing moves: no staging
    run_steps(&ms, be, &host, &in);
    check_true(&st, "adamw_step_params_on_host_matches_reference", same_state(&host, &want, n));

    fake_free(be, &host, 0);
    fake_free(be, &want, 0);
    free(in.master), free(in.grads[0]), free(in.grads[1]);
    be_free(be, scratch);
    free(lay);
    backend_destroy(be);
    return test_exit(&st);
}
