// lora_steps.c: the adapters' forward and backward. See lora_steps.h.
#include "core/model/lora_steps.h"

#include "base/common.h"
#include "core/model/lora.h"

// The widest input or output of the run's targets.
static size_t widest(const LoraFamily* lf, const ModelShape* s) {
    size_t w = 0;
    for (int j = 0; j < lf->num_targets; j++) {
        LoraGeometry geo = lf->base->lora_geometry(s, lf->target[j]);
        w = (size_t)geo.in > w ? (size_t)geo.in : w;
        w = (size_t)geo.out > w ? (size_t)geo.out : w;
    }
    return w;
}

// (N, widest) blocks: two, and with dropout a third for the dropped input.
static size_t wide_blocks(const LoraFamily* lf) { return lf->dropout > 0.0f ? 3 : 2; }

// h and dh (N, R) each, the (N, widest) blocks, and scale * I (R, R).
size_t lora_work_bytes(const ParamLayout* lay, DType dt, int B, int T) {
    const LoraFamily* lf = lora_of(&lay->shape);
    if (!lf) return 0;
    size_t N = (size_t)B * T, R = (size_t)lf->rank;
    return (2 * N * R + wide_blocks(lf) * N * widest(lf, &lay->shape) + R * R) * dtype_size(dt);
}

void lora_work_create(Model* g, Backend* be, MemLedger* mem) {
    const LoraFamily* lf = lora_of(&g->shape);
    if (!lf) return;
    size_t N = (size_t)g->B * g->T, R = (size_t)lf->rank, w = widest(lf, &g->shape), e = dtype_size(g->dt);
    char* at = (char*)mem_alloc(be, mem, MEM_ACTIVATIONS, lora_work_bytes(g->layout, g->dt, g->B, g->T));
    g->lora.h = at, at += N * R * e;
    g->lora.dh = at, at += N * R * e;
    g->lora.block = at, at += N * w * e;
    g->lora.wide = at, at += N * w * e;
    if (lf->dropout > 0.0f) g->lora.dropped = at, at += N * w * e;
    g->lora.scale = at;
    float* s = (float*)xcalloc(R * R, sizeof(float));
    for (size_t i = 0; i < R; i++) s[i * R + i] = lf->scale;
    void* low = xmalloc(R * R * e);
    host_to_dtype(low, g->dt, s, R * R);
    be_upload(be, g->lora.scale, low, R * R * e);
    free(low), free(s);
}

void lora_work_destroy(Model* g, Backend* be) {
    if (g->lora.h) be_free(be, g->lora.h);
}

int lora_adapts(const Model* g, int target) {
    const LoraFamily* lf = lora_of(&g->shape);
    return lf && lora_selected(lf, target) >= 0;
}

typedef struct {
    const LoraFamily* lf;
    LoraGeometry geo;
    int N, R;
    void *A, *B;     // the layer's adapters (parameters)
    void *dA, *dB;   // their gradients (NULL: none wanted)
    int dropout;     // a training forward's (or its backward's) dropout on the input, keyed by `key`
    uint32_t key;
} Adapter;

// Target `target`'s adapters in block b, or 0 when there are none.
static int adapter_of(Model* g, const BlockRef* b, int target, Adapter* a) {
    const LoraFamily* lf = lora_of(&g->shape);
    int j = lf ? lora_selected(lf, target) : -1;
    if (j < 0) return 0;
    const ParamLayout* lay = g->layout;
    *a = (Adapter){lf, lf->base->lora_geometry(&g->shape, target), g->B * g->T, lf->rank,
                   unit_tensor(lay, b->params, lora_kind_a(lf, j), b->layer, g->dt), unit_tensor(lay, b->params, lora_kind_b(lf, j), b->layer, g->dt),
                   b->grads ? unit_grad_tensor(lay, b->grads, lora_kind_a(lf, j), b->layer, g->dt) : NULL,
                   b->grads ? unit_grad_tensor(lay, b->grads, lora_kind_b(lf, j), b->layer, g->dt) : NULL,
                   lf->dropout > 0.0f && g->acts.training, 0};
    if (a->dropout) a->key = lora_dropout_key(lf, g->acts.position, b->layer, target);
    return 1;
}

// The mask and scale of the adapter's dropout on an (N, in) tensor: its input, or the input's gradient.
static void drop(Model* g, Backend* be, const Adapter* a, void* out, const void* in) {
    lora_dropout(be, g->dt, out, in, a->N, a->geo.in, 0, a->geo.in, a->key, a->lf->dropout);
}

// What the adapter multiplies: its input, or in training with dropout the dropped input (in lora.dropped).
static const void* adapter_input(Model* g, Backend* be, const Adapter* a, const void* inp) {
    if (!a->dropout) return inp;
    drop(g, be, a, g->lora.dropped, inp);
    return g->lora.dropped;
}

// x (N, R) scaled in place through the scratch dh-sized buffer `spare`: spare = x (s I)^T, exact per element
// but for the one rounding of the product; nothing at scale 1.
static void* scaled(Model* g, Backend* be, const Adapter* a, void* x, void* spare) {
    if (a->lf->scale == 1.0f) return x;
    matmul_forward(be, g->dt, spare, NULL, x, g->lora.scale, NULL, a->N, a->R, a->R);
    return spare;
}

// The column block [col, col + out) of a (N, width) buffer into (N, out) `narrow`, or back (to_narrow = 0).
static void column_block(Model* g, Backend* be, const Adapter* a, void* wide, void* narrow, int to_narrow) {
    size_t e = dtype_size(g->dt), pitch = (size_t)a->geo.width * e, row = (size_t)a->geo.out * e;
    char* at = (char*)wide + (size_t)a->geo.col * e;
    if (to_narrow) be_copy_rows(be, narrow, row, at, pitch, row, (size_t)a->N);
    else be_copy_rows(be, at, pitch, narrow, row, row, (size_t)a->N);
}

static int whole_output(const Adapter* a) { return a->geo.col == 0 && a->geo.out == a->geo.width; }

void lora_forward(Model* g, Backend* be, const BlockRef* b, int target, void* out, const void* inp) {
    Adapter a;
    if (!adapter_of(g, b, target, &a)) return;
    DType dt = g->dt;
    size_t n = (size_t)a.N * a.geo.out;
    matmul_forward(be, dt, g->lora.h, NULL, adapter_input(g, be, &a, inp), a.A, NULL, a.N, a.geo.in, a.R);
    void* h = scaled(g, be, &a, g->lora.h, g->lora.dh);
    matmul_forward(be, dt, g->lora.block, NULL, h, a.B, NULL, a.N, a.R, a.geo.out);
    if (whole_output(&a)) {
        residual_forward(be, dt, out, out, g->lora.block, n);
        return;
    }
    column_block(g, be, &a, out, g->lora.wide, 1);
    residual_forward(be, dt, g->lora.wide, g->lora.wide, g->lora.block, n);
    column_block(g, be, &a, out, g->lora.wide, 0);
}

// With x the adapter's input (adapter_input): W: dB += dblock^T (scale h), h = x A^T; dA += (scale dblock B)^T x.
// B: dinp += drop((scale dblock B) A), drop the dropout's mask and scale (its own transpose), or nothing.
void lora_backward(BlockBackward* c, const BlockRef* b, int target, void* dinp, const void* dout, const void* inp, const void* pre) {
    Model* g = c->g;
    Backend* be = c->be;
    Adapter a;
    if (!adapter_of(g, b, target, &a)) return;
    DType dt = g->dt;
    const void* dblock = dout;
    if (!whole_output(&a)) {
        column_block(g, be, &a, (void*)dout, g->lora.block, 1);
        dblock = g->lora.block;
    }
    const void* x = c->mode != BWD_INPUT ? adapter_input(g, be, &a, inp) : NULL;
    if (x) {
        matmul_forward(be, dt, g->lora.h, NULL, x, a.A, NULL, a.N, a.geo.in, a.R);
        matmul_backward_weight(be, dt, a.dB, NULL, dblock, scaled(g, be, &a, g->lora.h, g->lora.dh), a.N, a.R, a.geo.out);
    }
    matmul_backward_input(be, dt, g->lora.dh, dblock, NULL, a.B, a.N, a.R, a.geo.out);
    void* dh = scaled(g, be, &a, g->lora.dh, g->lora.h);
    if (x) matmul_backward_weight(be, dt, a.dA, NULL, dh, x, a.N, a.geo.in, a.R);
    if (c->mode == BWD_WEIGHT) return;
    size_t n = (size_t)a.N * a.geo.in;
    matmul_backward_input(be, dt, g->lora.wide, dh, NULL, a.A, a.N, a.geo.in, a.R);
    if (a.dropout) drop(g, be, &a, g->lora.wide, g->lora.wide);
    if (pre) gelu_backward(be, dt, g->lora.wide, pre, g->lora.wide, n);
    residual_forward(be, dt, dinp, dinp, g->lora.wide, n);
}
