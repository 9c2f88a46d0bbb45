// test_adamw_spans.c: the list calls of kernels.h (adamw_update_spans, sum_squares_spans) against the per-span
// calls they stand for, bit for bit: spans of odd sizes (an empty one among them) cut from shared buffers
// with gaps, mixed weight decay, noise offsets above 2^32, fp32 (aliasing the master or not), bf16 and fp16
// parameters, fp32 and 16-bit gradients. The CUDA build runs the same comparison in tests/gpu/kernel_check.c.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/kernel_testlib.h"

#define NSPANS 7
static const size_t span_n[NSPANS] = {1, 257, 0, 4099, 33, 70001, 513};
static const float span_wd[NSPANS] = {0.1f, 0.0f, 0.1f, 0.05f, 0.0f, 0.1f, 0.0f};
#define GAP 3   // elements between spans: a list call must touch nothing outside them

typedef struct {
    void* params;   // NULL: the fp32 params alias the master
    float *master, *m, *v;
    void* grads;
    size_t total;
} Buffers;

static size_t spans_total(void) {
    size_t t = 0;
    for (int i = 0; i < NSPANS; i++) t += span_n[i] + GAP;
    return t;
}

// Seeded state: master in (-0.5, 0.5), m small, v positive, params the master's rounding, grads of grad_dt.
static Buffers buffers_new(Backend* be, DType param_dt, DType grad_dt, int alias) {
    Buffers b = {.total = spans_total()};
    Rng r = {17};
    float* h = rand_vec(&r, b.total, 0.5f, DT_FP32);
    b.master = dev_from(be, DT_FP32, h, b.total);
    b.params = alias ? NULL : dev_from(be, param_dt, h, b.total);
    free(h);
    h = rand_vec(&r, b.total, 0.01f, DT_FP32);
    b.m = dev_from(be, DT_FP32, h, b.total);
    for (size_t i = 0; i < b.total; i++) h[i] = 1e-4f + h[i] * h[i];
    b.v = dev_from(be, DT_FP32, h, b.total);
    free(h);
    h = rand_vec(&r, b.total, 0.1f, grad_dt);
    b.grads = dev_from(be, grad_dt, h, b.total);
    free(h);
    return b;
}

static void buffers_free(Backend* be, Buffers* b) {
    void* p[] = {b->params, b->master, b->m, b->v, b->grads};
    for (int i = 0; i < 5; i++) be_free(be, p[i]);
}

// The spans over b: span i at its running offset, its noise key far above 2^32.
static void spans_of(const Buffers* b, DType param_dt, DType grad_dt, AdamWSpan* out) {
    size_t at = 0;
    for (int i = 0; i < NSPANS; i++) {
        void* params = b->params ? (char*)b->params + at * dtype_size(param_dt) : (void*)(b->master + at);
        out[i] = (AdamWSpan){.params = params, .master = b->master + at, .grads = (char*)b->grads + at * dtype_size(grad_dt),
                             .m = b->m + at, .v = b->v + at, .n = span_n[i], .offset = ((size_t)5 << 32) + 3 * at,
                             .weight_decay = span_wd[i]};
        at += span_n[i] + GAP;
    }
}

static AdamWArgs step_args(int step) {
    AdamWArgs a = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.7f,   // not read
                   .grad_scale = 0.5f, .step = step, .seed = 4242u + (uint32_t)step};
    return a;
}

static int same_buffers(const Buffers* a, const Buffers* b, DType param_dt) {
    int ok = same_bits(a->master, b->master, a->total * 4) && same_bits(a->m, b->m, a->total * 4) &&
             same_bits(a->v, b->v, a->total * 4);
    return ok && (!a->params || same_bits(a->params, b->params, a->total * dtype_size(param_dt)));
}

// Two steps each way from the same state; every buffer must end with the same bits.
static void check_adamw(TestStats* s, Backend* be, DType param_dt, DType grad_dt, int alias, const char* name) {
    Buffers one = buffers_new(be, param_dt, grad_dt, alias), list = buffers_new(be, param_dt, grad_dt, alias);
    AdamWSpan so[NSPANS], sl[NSPANS];
    spans_of(&one, param_dt, grad_dt, so);
    spans_of(&list, param_dt, grad_dt, sl);
    for (int step = 1; step <= 2; step++) {
        AdamWArgs a = step_args(step);
        for (int i = 0; i < NSPANS; i++) {
            AdamWArgs ai = a;
            ai.weight_decay = so[i].weight_decay;
            adamw_update(be, so[i].params, param_dt, so[i].master, so[i].grads, grad_dt, so[i].m, so[i].v, so[i].n,
                         so[i].offset, &ai);
        }
        adamw_update_spans(be, param_dt, grad_dt, sl, NSPANS, &a);
    }
    check_true(s, name, same_buffers(&one, &list, param_dt));
    buffers_free(be, &one);
    buffers_free(be, &list);
}

static void check_sum_squares(TestStats* s, Backend* be, DType dt, const char* name) {
    Buffers b = buffers_new(be, DT_FP32, dt, 1);
    AdamWSpan sp[NSPANS];
    spans_of(&b, DT_FP32, dt, sp);
    const void* x[NSPANS];
    size_t n[NSPANS];
    for (int i = 0; i < NSPANS; i++) x[i] = sp[i].grads, n[i] = sp[i].n;
    float* acc = dev_zeros(be, DT_FP32, 2);
    acc[0] = acc[1] = 0.375f;   // both accumulate onto what is there
    for (int i = 0; i < NSPANS; i++) sum_squares(be, dt, &acc[0], x[i], n[i]);
    sum_squares_spans(be, dt, &acc[1], x, n, NSPANS);
    check_true(s, name, same_bits(&acc[0], &acc[1], 4) && acc[1] > 0.375f);
    be_free(be, acc);
    buffers_free(be, &b);
}

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    check_adamw(&s, be, DT_FP32, DT_FP32, 1, "adamw_spans_fp32_alias_same_bits");
    check_adamw(&s, be, DT_FP32, DT_FP32, 0, "adamw_spans_fp32_same_bits");
    check_adamw(&s, be, DT_BF16, DT_FP32, 0, "adamw_spans_bf16_fp32_grads_same_bits");
    check_adamw(&s, be, DT_BF16, DT_BF16, 0, "adamw_spans_bf16_same_bits");
    check_adamw(&s, be, DT_FP16, DT_FP16, 0, "adamw_spans_fp16_same_bits");
    check_sum_squares(&s, be, DT_FP32, "sum_squares_spans_fp32_same_bits");
    check_sum_squares(&s, be, DT_BF16, "sum_squares_spans_bf16_same_bits");
    check_sum_squares(&s, be, DT_FP16, "sum_squares_spans_fp16_same_bits");
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
