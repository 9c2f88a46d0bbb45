// steps.c: the layers a family's block is written in, with tensor parallelism built in. See block.h.
#include "core/model/block.h"

#include "base/common.h"
#include "core/model/context_parallel.h"

static void* slice(void* base, size_t elems_per_layer, int l, DType dt) {
    return (char*)base + (size_t)l * elems_per_layer * dtype_size(dt);
}

BlockDims block_dims(const Model* g) {
    const ParamLayout* lay = g->layout;
    BlockDims d = {g->B, g->T, g->B * g->T, g->rows, g->shape.C, layout_attn_channels(lay), layout_mlp_channels(lay),
                   layout_heads(lay), layout_kv_heads(lay), layout_head_size(lay)};
    return d;
}

// ---------------------------------------------------------------------------------------------------
// Tensor parallelism (Megatron's f and g). A row-parallel projection leaves each rank a partial sum of the
// whole (N, C) output, and a column-parallel layer's backward a partial sum of its input's gradient; the
// tensor group adds them: an all-reduce, or with sequence parallelism a reduce-scatter that leaves each rank
// the sum of its own rows, the only ones the norms and residual adds between the parallel layers then
// compute. Their outputs are all-gathered before the next parallel layer needs every row. Without a tensor
// group all of this is nothing.

// This rank's first row in a buffer of all N rows (0 without sequence parallelism).
static size_t own_row(const Model* g) { return g->sp ? (size_t)g->layout->tp_rank * g->rows : 0; }
static void* own_rows(const Model* g, void* all) { return slice(all, (size_t)g->shape.C, (int)own_row(g), g->dt); }

void* sum_partials(Model* g, void* all) {
    size_t NC = (size_t)g->B * g->T * g->shape.C;
    if (!g->tp) return all;
    if (!g->sp) {
        comm_allreduce_sum(g->tp, all, NC, g->dt);
        return all;
    }
    void* mine = own_rows(g, all);
    comm_reduce_scatter_sum(g->tp, mine, all, (size_t)g->rows * g->shape.C, g->dt);
    return mine;
}

void* gather_rows(Model* g, Backend* be, void* all, const void* mine) {
    if (!g->sp) return (void*)mine;
    size_t n = (size_t)g->rows * g->shape.C;
    be_copy(be, own_rows(g, all), mine, n * dtype_size(g->dt));
    comm_allgather(g->tp, all, n, g->dt);
    return all;
}

const void* row_bias(const Model* g, const void* bias) { return g->layout->tp_rank == 0 ? bias : NULL; }

// ---------------------------------------------------------------------------------------------------
// The family's norm over this rank's rows.

static void norm_kernel_forward(Model* g, Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w,
                                const void* b) {
    if (g->shape.family->norm == NORM_RMS)
        rmsnorm_forward(be, g->dt, out, rstd, inp, w, g->rows, g->shape.C, shape_layer_sizes(&g->shape).norm_eps);
    else layernorm_forward(be, g->dt, out, mean, rstd, inp, w, b, g->rows, g->shape.C);
}

static void norm_kernel_backward(Model* g, Backend* be, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                                 const void* w, const float* mean, const float* rstd) {
    if (g->shape.family->norm == NORM_RMS) rmsnorm_backward(be, g->dt, dinp, dw, dout, inp, w, rstd, g->rows, g->shape.C);
    else layernorm_backward(be, g->dt, dinp, dw, db, dout, inp, w, mean, rstd, g->rows, g->shape.C);
}

void norm_forward(Model* g, Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b) {
    norm_kernel_forward(g, be, own_rows(g, out), mean, rstd, inp, w, b);
    if (g->sp) comm_allgather(g->tp, out, (size_t)g->rows * g->shape.C, g->dt);
}

// Under -sp each rank's weight and bias gradients cover its rows only: they are made in scratch (dbig, free
// at every call site), summed over the tensor group, then added.
void norm_backward(Model* g, Backend* be, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                   const float* mean, const float* rstd) {
    DType dt = g->dt;
    size_t C = (size_t)g->shape.C;
    if (!dw) {   // frozen: the kernel's parameter gradients land in scratch, neither summed nor kept
        if (db) fail("internal: a norm bias to train under a frozen weight");
        void* drop = g->acts.dbig;
        be_memset0(be, drop, 2 * C * dtype_size(dt));
        norm_kernel_backward(g, be, dinp, drop, slice(drop, C, 1, dt), dout, inp, w, mean, rstd);
        return;
    }
    if (!g->sp) {
        norm_kernel_backward(g, be, dinp, dw, db, dout, inp, w, mean, rstd);
        return;
    }
    void* sdw = g->acts.dbig;
    void* sdb = db ? slice(g->acts.dbig, C, 1, dt) : NULL;
    size_t n = db ? 2 * C : C;
    be_memset0(be, sdw, n * dtype_size(dt));
    norm_kernel_backward(g, be, dinp, sdw, sdb, dout, inp, w, mean, rstd);
    comm_allreduce_sum(g->tp, sdw, n, dt);
    residual_forward(be, dt, dw, dw, sdw, C);
    if (db) residual_forward(be, dt, db, db, sdb, C);
}

// ---------------------------------------------------------------------------------------------------
// The backward's steps, each written once for the three modes (block.h).

void* grad_of_stream(BlockBackward* c, void* stashed) {
    Model* g = c->g;
    if (c->mode == BWD_WEIGHT) return stashed;
    void* all = gather_rows(g, c->be, g->acts.proj, g->acts.dresid);
    if (c->mode == BWD_FUSED) return all;
    be_copy(c->be, stashed, all, (size_t)g->B * g->T * g->shape.C * dtype_size(g->dt));
    return stashed;
}

void* grad_of_partials(BlockBackward* c, void* stashed) {
    Model* g = c->g;
    if (c->mode == BWD_WEIGHT) return stashed;
    void* sum = sum_partials(g, g->acts.dsmall);
    if (c->mode == BWD_FUSED) return sum;
    be_copy(c->be, stashed, sum, (size_t)g->rows * g->shape.C * dtype_size(g->dt));
    return stashed;
}

// B's kernel writes the stash field directly (no copy: the stash slot is this micro-batch's alone until its W).
void* grad_between(BlockBackward* c, void* scratch, void* stashed) { return c->mode == BWD_FUSED ? scratch : stashed; }

void matmul_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* pre, const void* w, void* dw,
                 void* db, int IC, int OC) {
    Backend* be = c->be;
    DType dt = c->g->dt;
    int N = c->g->B * c->g->T;
    if (!dw) {   // frozen: the input gradient only
        if (db) fail("internal: a bias to train under a frozen matrix");
        if (c->mode != BWD_WEIGHT) matmul_backward_input(be, dt, dinp, dout, pre, w, N, IC, OC);
        return;
    }
    if (c->mode == BWD_FUSED) matmul_backward(be, dt, dinp, dw, db, dout, inp, pre, w, N, IC, OC);
    else if (c->mode == BWD_INPUT) matmul_backward_input(be, dt, dinp, dout, pre, w, N, IC, OC);
    else matmul_backward_weight(be, dt, dw, db, dout, inp, N, IC, OC);
}

// With fewer kv heads than tensor ranks, the ranks holding copies of one kv head each backpropagate only their
// own query heads through it: their gradients w.r.t. that head's k|v columns of q|k|v (N, OC) are summed in
// place over the copies, through a packed (N, 2 D) scratch.
static void sum_kv_copies(Model* g, Backend* be, void* dqkv, int OC) {
    BlockDims d = block_dims(g);
    size_t e = dtype_size(g->dt), width = 2 * (size_t)d.D * e, pitch = (size_t)OC * e;
    char* kv = (char*)dqkv + (size_t)d.NH * d.D * e;   // after this rank's query heads
    be_copy_rows(be, g->acts.dkv_copied, width, kv, pitch, width, (size_t)d.N);
    comm_allreduce_sum(g->kv_copies, g->acts.dkv_copied, (size_t)d.N * 2 * d.D, g->dt);
    be_copy_rows(be, kv, pitch, g->acts.dkv_copied, width, width, (size_t)d.N);
}

void qkv_matmul_step(BlockBackward* c, void* dinp, void* dqkv, const void* inp, const void* w, void* dw, void* db) {
    Model* g = c->g;
    BlockDims d = block_dims(g);
    int OC = (d.NH + 2 * d.KV) * d.D;
    if (!g->kv_copies || !dw) {
        matmul_step(c, dinp, dqkv, inp, NULL, w, dw, db, d.C, OC);
        return;
    }
    // The input gradient takes each rank's own part (the tensor group sums those), the weights' the copies' sum.
    if (c->mode != BWD_WEIGHT) matmul_backward_input(c->be, g->dt, dinp, dqkv, NULL, w, d.N, d.C, OC);
    if (c->mode == BWD_INPUT) return;
    sum_kv_copies(g, c->be, dqkv, OC);
    matmul_backward_weight(c->be, g->dt, dw, db, dqkv, inp, d.N, d.C, OC);
}

// The norm's kernel makes all its gradients at once, so B and W each run it and drop the other's into
// scratch, free here: B the parameter gradients (into dbig, not summed over the group), W the input
// gradient (into dsmall).
void norm_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* w, const float* mean,
               const float* rstd, void* dw, void* db) {
    Model* g = c->g;
    size_t C = (size_t)g->shape.C;
    if (!dw && c->mode == BWD_WEIGHT) return;   // frozen: nothing for W
    if (c->mode == BWD_FUSED) {
        norm_backward(g, c->be, dinp, dw, db, dout, inp, w, mean, rstd);
    } else if (c->mode == BWD_INPUT) {
        void* drop = g->acts.dbig;
        be_memset0(c->be, drop, 2 * C * dtype_size(g->dt));
        norm_kernel_backward(g, c->be, dinp, drop, slice(drop, C, 1, g->dt), dout, inp, w, mean, rstd);
    } else {
        void* drop = g->acts.dsmall;
        be_memset0(c->be, drop, (size_t)g->rows * C * dtype_size(g->dt));
        norm_backward(g, c->be, drop, dw, db, dout, inp, w, mean, rstd);
    }
}

void attention_forward_step(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv) {
    BlockDims d = block_dims(g);
    if (g->cp) context_attention_forward(g, be, index, out, lse, qkv, 0);
    else attention_forward(be, g->dt, out, lse, qkv, g->acts.doc, d.B, d.T, d.NH, d.KV, d.D);
}

void attention_refill_step(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv) {
    BlockDims d = block_dims(g);
    if (g->cp) context_attention_forward(g, be, index, out, lse, qkv, 1);
    else attention_forward(be, g->dt, out, lse, qkv, g->acts.doc, d.B, d.T, d.NH, d.KV, d.D);
}

void attention_step(BlockBackward* c, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse) {
    if (c->mode == BWD_WEIGHT) return;
    if (c->g->cp) {
        context_attention_backward(c->g, c->be, c->index, dqkv, dout, qkv, out, lse);
        return;
    }
    BlockDims d = block_dims(c->g);
    attention_backward(c->be, c->g->dt, dqkv, c->g->acts.att_scratch, dout, qkv, out, lse, c->g->acts.doc, d.B, d.T, d.NH, d.KV, d.D);
}
