// lora_steps.c: the adapters' forward and backward. See lora_steps.h.
#include "core/model/lora_steps.h"

#include "base/common.h"
#include "core/model/lora.h"

// The widest input or output of the run's targets on this tensor rank, and at least R (the `wide` buffer
// also holds a scaled h).
static size_t widest(const LoraFamily* lf, const ParamLayout* lay) {
    size_t w = (size_t)lf->rank;
    for (int j = 0; j < lf->num_targets; j++) {
        LoraGeometry geo = lora_rank_geometry(lf->base, &lay->shape, lf->target[j], lay->tp_size);
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
    return (2 * N * R + wide_blocks(lf) * N * widest(lf, lay) + R * R) * dtype_size(dt);
}

void lora_work_create(Model* g, Backend* be, MemLedger* mem) {
    const LoraFamily* lf = lora_of(&g->shape);
    if (!lf) return;
    size_t N = (size_t)g->B * g->T, R = (size_t)lf->rank, w = widest(lf, g->layout), e = dtype_size(g->dt);
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
    *a = (Adapter){lf, lora_rank_geometry(lf->base, &g->shape, target, lay->tp_size), g->B * g->T, lf->rank,
                   unit_tensor(lay, b->params, lora_kind_a(lf, j), b->layer, g->dt), unit_tensor(lay, b->params, lora_kind_b(lf, j), b->layer, g->dt),
                   b->grads ? unit_grad_tensor(lay, b->grads, lora_kind_a(lf, j), b->layer, g->dt) : NULL,
                   b->grads ? unit_grad_tensor(lay, b->grads, lora_kind_b(lf, j), b->layer, g->dt) : NULL,
                   lf->dropout > 0.0f && g->acts.training, 0};
    if (a->dropout) a->key = lora_dropout_key(lf, g->acts.position, b->layer, target);
    return 1;
}

// The mask and scale of the adapter's dropout on an (N, in) tensor: its input, or the input's gradient.
// A row-parallel target's input is this tensor rank's columns of the whole (N, in): the mask is drawn at their
// place in the whole, so every layout drops what one rank does.
static void drop(Model* g, Backend* be, const Adapter* a, void* out, const void* in) {
    const ParamLayout* lay = g->layout;
    int shard = a->geo.cut == CUT_COLS && lay->tp_size > 1;
    lora_dropout(be, g->dt, out, in, a->N, a->geo.in, shard ? lay->tp_rank * a->geo.in : 0, shard ? lay->tp_size * a->geo.in : a->geo.in,
                 a->key, a->lf->dropout);
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

// Under -tp a column-parallel target's dh is this rank's part of a sum over the tensor group (its B holds
// the rank's rows), and a row-parallel target's h (its A the rank's columns): summed here, (N, R) each, for
// the whole tensors' gradients (A's and B's respectively), which then agree on every tensor rank. With kv
// heads fewer than tensor ranks each copy of a k or v block carries only its own query heads' gradient: B's
// gradient takes the copies' sum, as the base's weight gradient does (steps.c: sum_kv_copies).
static void sum_over_group(Model* g, const Adapter* a, Cut cut, void* x) {
    if (g->tp && a->geo.cut == cut) comm_allreduce_sum(g->tp, x, (size_t)a->N * a->R, g->dt);
}

// With x the adapter's input (adapter_input: dropped in training with dropout): dA += (scale dblock B)^T x
// (dh, made by the caller); dB += dblock^T (scale x A^T), the scaled h through `wide`, free here.
static void weight_grads(Model* g, Backend* be, const Adapter* a, void* dh, void* dblock, const void* x) {
    DType dt = g->dt;
    sum_over_group(g, a, CUT_ROWS, dh);
    matmul_backward_weight(be, dt, a->dA, NULL, dh, x, a->N, a->geo.in, a->R);
    void* h = dh == g->lora.h ? g->lora.dh : g->lora.h;
    matmul_forward(be, dt, h, NULL, x, a->A, NULL, a->N, a->geo.in, a->R);
    sum_over_group(g, a, CUT_COLS, h);
    if (g->kv_copies && a->geo.heads && a->geo.heads < g->layout->tp_size) {
        if (whole_output(a)) fail("internal: a kv head's copies sum into the fused output itself");
        comm_allreduce_sum(g->kv_copies, dblock, (size_t)a->N * a->geo.out, dt);
    }
    matmul_backward_weight(be, dt, a->dB, NULL, dblock, scaled(g, be, a, h, g->lora.wide), a->N, a->R, a->geo.out);
}

// B: dinp += drop((scale dblock B) A), drop the dropout's mask and scale (its own transpose) or nothing (a
// column-parallel target's: this rank's part of the tensor group's sum, as the base's input gradient is);
// W: weight_grads.
void lora_backward(BlockBackward* c, const BlockRef* b, int target, void* dinp, const void* dout, const void* inp, const void* pre) {
    Model* g = c->g;
    Backend* be = c->be;
    Adapter a;
    if (!adapter_of(g, b, target, &a)) return;
    DType dt = g->dt;
    void* dblock = (void*)dout;
    if (!whole_output(&a)) {
        column_block(g, be, &a, (void*)dout, g->lora.block, 1);
        dblock = g->lora.block;
    }
    matmul_backward_input(be, dt, g->lora.dh, dblock, NULL, a.B, a.N, a.R, a.geo.out);
    void* dh = scaled(g, be, &a, g->lora.dh, g->lora.h);
    if (c->mode != BWD_WEIGHT) {
        size_t n = (size_t)a.N * a.geo.in;
        matmul_backward_input(be, dt, g->lora.wide, dh, NULL, a.A, a.N, a.geo.in, a.R);
        if (a.dropout) drop(g, be, &a, g->lora.wide, g->lora.wide);
        if (pre) gelu_backward(be, dt, g->lora.wide, pre, g->lora.wide, n);
        residual_forward(be, dt, dinp, dinp, g->lora.wide, n);
    }
    if (c->mode != BWD_INPUT) weight_grads(g, be, &a, dh, dblock, adapter_input(g, be, &a, inp));
}
