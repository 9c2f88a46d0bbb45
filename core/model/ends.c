// ends.c: the model's ends (block.h): the embedding, the LM head and the loss as steps, the defaults
// written in them, and the walk's calls that pick a family's hook or the default.
//
// All three are vocabulary-parallel under -tp (Megatron's): each rank holds wte's (and an untied head's)
// vocabulary rows [v0, v0 + Vl) (layout_vocab_*), so the logits (N, Vl) are its columns of the whole
// (N, Vp) and no rank ever holds a whole row: the embedding is a sum over the group, the softmax's max,
// normalizer and target logit are all-reduced row scalars, and the head's input gradient a sum of partial
// products.
#include "base/common.h"
#include "core/model/block.h"

// The last block's output (this rank's rows under -sp).
static void* blocks_output(Model* g) {
    return residual_at(g, g->layout->num_blocks);
}

// Under -tp each rank embeds the tokens of its vocabulary rows (zeros for the others; positions added by
// rank 0 only) into every row, and the group adds them: x + 0 is exact, so the sum has encoder_forward's bits in
// fp32. Without position embeddings one rank's lookup is the vocabulary-parallel one over every row.
void embed_step(Model* g, Backend* be, const void* wte, const void* pos) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    size_t NC = (size_t)g->B * g->T * g->shape.C;
    if (!g->tp && pos) {
        encoder_forward(be, g->dt, a->resid, a->tokens, a->pos, wte, pos, g->B, g->T, g->shape.C);
        return;
    }
    if (!g->tp) {
        encoder_forward_vocab(be, g->dt, a->resid, a->tokens, a->pos, wte, NULL, 0, g->shape.Vp, g->B, g->T, g->shape.C);
        return;
    }
    void* all = g->sp ? a->proj : a->resid;   // (N, C); proj is free before the first block
    encoder_forward_vocab(be, g->dt, all, a->tokens, a->pos, wte, lay->tp_rank == 0 ? pos : NULL, layout_vocab_first(lay),
                          layout_vocab_rows(lay), g->B, g->T, g->shape.C);
    if (g->sp) comm_reduce_scatter_sum(g->tp, a->resid, all, (size_t)g->rows * g->shape.C, g->dt);
    else comm_allreduce_sum(g->tp, all, NC, g->dt);
}

void embed_backward_step(Model* g, Backend* be, void* dwte, void* dpos, const void* dout) {
    const ParamLayout* lay = g->layout;
    if (!dwte && !dpos) return;   // frozen embeddings: nothing upstream of them
    if (!dwte) fail("internal: a frozen token embedding with a trained position embedding");
    if (!g->tp && dpos) encoder_backward(be, g->dt, dwte, dpos, dout, g->acts.tokens, g->acts.pos, g->B, g->T, g->shape.C);
    else encoder_backward_vocab(be, g->dt, dwte, dpos, dout, g->acts.tokens, g->acts.pos, layout_vocab_first(lay), layout_vocab_rows(lay),
                                g->B, g->T, g->shape.C);
}

void lm_head_step(Model* g, Backend* be, const void* norm_w, const void* norm_b, const void* head) {
    Activations* a = &g->acts;
    norm_forward(g, be, a->lnf, a->lnf_mean, a->lnf_rstd, blocks_output(g), norm_w, norm_b);
    matmul_forward(be, g->dt, a->logits, NULL, a->lnf, head, NULL, g->B * g->T, g->shape.C, layout_vocab_rows(g->layout));
}

void lm_head_backward_step(Model* g, Backend* be, const void* norm_w, const void* head, void* dnorm_w, void* dnorm_b, void* dhead) {
    Activations* a = &g->acts;
    DType dt = g->dt;
    int N = g->B * g->T, C = g->shape.C;
    // (N, C) d(lnf): under -tp a partial product over this rank's vocabulary columns, which the group adds
    // (a reduce-scatter into each rank's rows under -sp), like a row-parallel projection's output.
    int Vl = layout_vocab_rows(g->layout);
    if (dhead) matmul_backward(be, dt, a->dsmall, dhead, NULL, a->logits, a->lnf, NULL, head, N, C, Vl);
    else matmul_backward_input(be, dt, a->dsmall, a->logits, NULL, head, N, C, Vl);   // frozen
    be_memset0(be, a->dresid, (size_t)g->rows * C * dtype_size(dt));   // the norm's backward accumulates into it
    norm_backward(g, be, a->dresid, dnorm_w, dnorm_b, sum_partials(g, a->dsmall), blocks_output(g), norm_w, a->lnf_mean,
                  a->lnf_rstd);
}

// Under -tp: three steps with the group's max and sums between (kernels.h); every rank ends with the same
// losses and its own columns' dlogits.
static void vocab_cross_entropy(Model* g, Backend* be, const int* targets, float dloss) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    int N = g->B * g->T, V = g->shape.V, v0 = layout_vocab_first(lay), Vl = layout_vocab_rows(lay);
    int real = layout_vocab_real(lay);
    for (int n = 0; n < N; n++)   // each kernel sees only its columns, so the range is checked here
        if ((targets[n] < 0 && targets[n] != CLASSIFIER_IGNORE) || targets[n] >= V)
            fail("classifier: target %d at row %d outside [0, %d) (and not -1, ignored)", targets[n], n, V);
    int ranks = lay->tp_size;
    float* rowmax = a->vocab_stats;   // (N)
    float* all = a->vocab_stats + N;   // (tp, 3, N): each rank's sum of exp (hi, lo) and target logit
    classifier_vocab_max(be, g->dt, rowmax, a->logits, N, real, Vl);
    comm_allreduce_max_f32(g->tp, rowmax, (size_t)N);
    classifier_vocab_sums(be, g->dt, all + (size_t)lay->tp_rank * 3 * N, a->logits, rowmax, a->targets, v0, N, real, Vl);
    comm_allgather(g->tp, all, 3 * (size_t)N, DT_FP32);   // not a sum: the ranks' normalizers add in double
    classifier_vocab_finish(be, g->dt, a->logits, a->losses, rowmax, all, ranks, a->targets, v0, N, real, Vl, dloss,
                            dloss != 0.0f);
}

void cross_entropy_step(Model* g, Backend* be, const int* targets, float dloss) {
    Activations* a = &g->acts;
    if (g->tp) vocab_cross_entropy(g, be, targets, dloss);
    else classifier_forward(be, g->dt, a->logits, a->losses, a->targets, g->B * g->T, g->shape.V, g->shape.Vp, dloss, dloss != 0.0f);
}

// ---------------------------------------------------------------------------------------------------
// The defaults, over the kinds the family names in ModelFamily.

static void* kind_in(const Model* g, void* unit_base, int kind) { return unit_tensor(g->layout, unit_base, kind, -1, g->dt); }
// Its gradient: NULL for a frozen kind.
static void* grad_in(const Model* g, void* unit_base, int kind) { return unit_grad_tensor(g->layout, unit_base, kind, -1, g->dt); }

// The final norm's weight and bias (NULL without one) and the LM head's matrix (this rank's vocabulary rows).
typedef struct {
    void *norm_w, *norm_b, *head;
} Head;

static Head head_at(const Model* g, HeadUnits u, void* (*at)(const Model*, void*, int)) {
    const ModelFamily* fam = g->shape.family;
    Head h = {at(g, u.final, fam->final_w), fam->final_b >= 0 ? at(g, u.final, fam->final_b) : NULL,
              at(g, u.head, g->shape.tied ? fam->wte : fam->head)};
    return h;
}

static const EndOps* ends_of(const Model* g) { return g->shape.family->ends; }

void ends_embed(Model* g, Backend* be, void* params) {
    const EndOps* e = ends_of(g);
    if (e && e->embed) e->embed(g, be, params);
    else embed_step(g, be, kind_in(g, params, g->shape.family->wte), NULL);
}

void ends_embed_backward(Model* g, Backend* be, void* grads) {
    const void* dout = gather_rows(g, be, g->acts.proj, g->acts.dresid);   // every row of d(input) under -sp
    const EndOps* e = ends_of(g);
    if (e && e->embed_backward) e->embed_backward(g, be, grads, dout);
    else embed_backward_step(g, be, grad_in(g, grads, g->shape.family->wte), NULL, dout);
}

void ends_head(Model* g, Backend* be, HeadUnits params) {
    const EndOps* e = ends_of(g);
    if (e && e->head) {
        e->head(g, be, params);
        return;
    }
    Head h = head_at(g, params, kind_in);
    lm_head_step(g, be, h.norm_w, h.norm_b, h.head);
}

void ends_head_backward(Model* g, Backend* be, HeadUnits params, HeadUnits grads) {
    const EndOps* e = ends_of(g);
    if (e && e->head_backward) {
        e->head_backward(g, be, params, grads);
        return;
    }
    Head h = head_at(g, params, kind_in), dh = head_at(g, grads, grad_in);
    lm_head_backward_step(g, be, h.norm_w, h.head, dh.norm_w, dh.norm_b, dh.head);
}

void ends_loss(Model* g, Backend* be, const int* targets, float dloss) {
    const EndOps* e = ends_of(g);
    if (e && e->loss) e->loss(g, be, targets, dloss);
    else cross_entropy_step(g, be, targets, dloss);
}
