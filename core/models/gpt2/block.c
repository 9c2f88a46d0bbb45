// block.c: GPT-2's block for the walk (core/model/block.h): pre-LayerNorm attention and a GELU MLP, each
// added to the residual stream; qkv and fc column-parallel, the two projections row-parallel under -tp.
#include "base/common.h"
#include "core/model/block.h"
#include "core/models/gpt2/gpt2.h"
#include "core/model/lora_steps.h"

// Its widths beside the walk's (block.h), per tensor rank: attention's C/tp channels, q|k|v's 3C/tp, the
// MLP's 4C/tp.
enum { W_CA = W_FAMILY, W_QKVA, W_FA };
static size_t width(const ParamLayout* lay, Width w) {
    switch (w) {
        case W_CA: return (size_t)layout_attn_channels(lay);
        case W_QKVA: return 3 * (size_t)layout_attn_channels(lay);
        case W_FA: return (size_t)layout_mlp_channels(lay);
    }
    fail("internal: GPT-2's block has no width %d", w);
}

// The block's activations, in BUFFERS' order.
enum { LN1, LN1_MEAN, LN1_RSTD, QKV, ATTY, ATT_LSE, RESID2, LN2, LN2_MEAN, LN2_RSTD, FCH, FCH_GELU, NUM_BUFFERS };
static const BlockBuffer BUFFERS[NUM_BUFFERS] = {
    [LN1] = {"ln1", KEPT_NORM, W_C, E_DT, ALL_ROWS},           // (N, C)   gathered under -sp
    [LN1_MEAN] = {"ln1_mean", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [LN1_RSTD] = {"ln1_rstd", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [QKV] = {"qkv", KEPT_MID, W_QKVA, E_DT, ALL_ROWS},         // (N, 3C/tp)
    [ATTY] = {"atty", KEPT_ATT, W_CA, E_DT, ALL_ROWS},         // (N, C/tp)  attention output before its projection
    [ATT_LSE] = {"att_lse", KEPT_ATT, W_NHA, E_F32, ALL_ROWS}, // (B, NH/tp, T)
    [RESID2] = {"resid2", KEPT_MID, W_C, E_DT, OWN_ROWS},      // x + attention projection
    [LN2] = {"ln2", KEPT_NORM, W_C, E_DT, ALL_ROWS},
    [LN2_MEAN] = {"ln2_mean", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [LN2_RSTD] = {"ln2_rstd", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [FCH] = {"fch", KEPT_MID, W_FA, E_DT, ALL_ROWS},           // (N, 4C/tp)  fc output before GELU
    [FCH_GELU] = {"fch_gelu", KEPT_ACT, W_FA, E_DT, ALL_ROWS},
};

// zb's stash: the gradients w.r.t. the outputs of the block's four matmuls and two LayerNorms.
enum { S_DFCPROJ, S_DFCH, S_DLN2, S_DATTPROJ, S_DQKV, S_DLN1, NUM_STASH };
static const StashField STASH[NUM_STASH] = {
    [S_DFCPROJ] = {"dfcproj", W_C, ALL_ROWS}, [S_DFCH] = {"dfch", W_FA, ALL_ROWS}, [S_DLN2] = {"dln2", W_C, OWN_ROWS},
    [S_DATTPROJ] = {"dattproj", W_C, ALL_ROWS}, [S_DQKV] = {"dqkv", W_QKVA, ALL_ROWS}, [S_DLN1] = {"dln1", W_C, OWN_ROWS},
};

// LoRA's targets, in the family's list's order (family.c).
enum { LORA_QKV, LORA_PROJ, LORA_FC, LORA_FCPROJ };

// One block's parameters (or their gradients), from the base of its unit.
typedef struct {
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    void *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} Params;

static Params params_at(const Model* g, void* base, int layer, void* (*at)(const ParamLayout*, void*, int, int, DType)) {
#define T(kind) at(g->layout, base, kind, layer, g->dt)
    Params p = {T(GPT2_LN1W), T(GPT2_LN1B), T(GPT2_QKVW), T(GPT2_QKVB), T(GPT2_ATTPROJW), T(GPT2_ATTPROJB),
                T(GPT2_LN2W), T(GPT2_LN2B), T(GPT2_FCW), T(GPT2_FCB), T(GPT2_FCPROJW), T(GPT2_FCPROJB)};
#undef T
    return p;
}

static Params params_in(const Model* g, void* base, int layer) { return params_at(g, base, layer, unit_tensor); }
// Their gradients: NULL for a frozen kind.
static Params grads_in(const Model* g, void* base, int layer) { return params_at(g, base, layer, unit_grad_tensor); }

// Block l's activations (l counts the stage's blocks).
typedef struct {
    void *x, *ln1, *qkv, *atty, *resid2, *ln2, *fch, *fch_gelu, *out;
    float *ln1_mean, *ln1_rstd, *att_lse, *ln2_mean, *ln2_rstd;
} Acts;

static Acts acts_of(Model* g, int l) {
#define A(i) block_buffer(g, i, l)
    Acts v = {residual_at(g, l), A(LN1), A(QKV), A(ATTY), A(RESID2), A(LN2), A(FCH), A(FCH_GELU), residual_at(g, l + 1),
              A(LN1_MEAN), A(LN1_RSTD), A(ATT_LSE), A(LN2_MEAN), A(LN2_RSTD)};
#undef A
    return v;
}

// A recomputation (the whole-block level) stops before the MLP's output projection: the backward needs
// everything up to fch_gelu, and the block's output is already in place.
static void forward(Model* g, Backend* be, const BlockRef* b, int recomputing) {
    DType dt = g->dt;
    BlockDims d = block_dims(g);
    size_t RC = (size_t)d.R * d.C;
    void* proj = g->acts.proj;
    Params p = params_in(g, b->params, b->layer);
    Acts v = acts_of(g, b->index);
    norm_forward(g, be, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b);
    matmul_forward(be, dt, v.qkv, NULL, v.ln1, p.qkvw, p.qkvb, d.N, d.C, 3 * d.CA);
    lora_forward(g, be, b, LORA_QKV, v.qkv, v.ln1);
    attention_forward_step(g, be, b->index, v.atty, v.att_lse, v.qkv);
    matmul_forward(be, dt, proj, NULL, v.atty, p.attprojw, row_bias(g, p.attprojb), d.N, d.CA, d.C);
    lora_forward(g, be, b, LORA_PROJ, proj, v.atty);
    residual_forward(be, dt, v.resid2, v.x, sum_partials(g, proj), RC);
    norm_forward(g, be, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b);
    matmul_forward(be, dt, v.fch_gelu, v.fch, v.ln2, p.fcw, p.fcb, d.N, d.C, d.CF);
    if (lora_adapts(g, LORA_FC)) {   // the adapters add before the GELU, which is then redone
        lora_forward(g, be, b, LORA_FC, v.fch, v.ln2);
        gelu_forward(be, dt, v.fch_gelu, v.fch, (size_t)d.N * d.CF);
    }
    if (recomputing) return;
    matmul_forward(be, dt, proj, NULL, v.fch_gelu, p.fcprojw, row_bias(g, p.fcprojb), d.N, d.CF, d.C);
    lora_forward(g, be, b, LORA_FCPROJ, proj, v.fch_gelu);
    residual_forward(be, dt, v.out, v.resid2, sum_partials(g, proj), RC);
}

// -r 1 refills the GELU, -r 2 also attention and the LayerNorms. On the GPU cuBLASLt's fused GELU epilogue
// rounds differently from the separate GELU kernel, so only the CPU backend promises the forward's bits there.
static void recompute(Model* g, Backend* be, const BlockRef* b) {
    DType dt = g->dt;
    BlockDims d = block_dims(g);
    Params p = params_in(g, b->params, b->layer);
    Acts v = acts_of(g, b->index);
    if (g->recompute >= 2) {
        norm_forward(g, be, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b);
        attention_refill_step(g, be, b->index, v.atty, v.att_lse, v.qkv);
        norm_forward(g, be, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b);
    }
    if (g->recompute >= 1) gelu_forward(be, dt, v.fch_gelu, v.fch, (size_t)d.N * d.CF);
}

// dsmall and dbig carry the gradients between the steps.
static void backward(BlockBackward* c, const BlockRef* b) {
    Model* g = c->g;
    Activations* a = &g->acts;
    void** s = c->stash.field;
    BlockDims d = block_dims(g);
    Params p = params_in(g, b->params, b->layer);
    Params dp = b->grads ? grads_in(g, b->grads, b->layer) : (Params){0};
    Acts v = acts_of(g, b->index);
    // MLP: out = resid2 + fcproj(gelu(fc(ln2(resid2)))); the residual passes dresid through.
    void* dfch = grad_between(c, a->dbig, s[S_DFCH]);   // (N, CF), before the GELU
    void* dfcproj = grad_of_stream(c, s[S_DFCPROJ]);
    matmul_step(c, dfch, dfcproj, v.fch_gelu, v.fch, p.fcprojw, dp.fcprojw, dp.fcprojb, d.CF, d.C);
    lora_backward(c, b, LORA_FCPROJ, dfch, dfcproj, v.fch_gelu, v.fch);
    matmul_step(c, a->dsmall, dfch, v.ln2, NULL, p.fcw, dp.fcw, dp.fcb, d.C, d.CF);
    lora_backward(c, b, LORA_FC, a->dsmall, dfch, v.ln2, NULL);
    norm_step(c, a->dresid, grad_of_partials(c, s[S_DLN2]), v.resid2, p.ln2w, v.ln2_mean, v.ln2_rstd, dp.ln2w, dp.ln2b);
    // Attention: resid2 = x + attproj(attention(qkv(ln1(x)))).
    void* dqkv = grad_between(c, a->dbig, s[S_DQKV]);   // (N, 3CA)
    void* dattproj = grad_of_stream(c, s[S_DATTPROJ]);
    matmul_step(c, a->dsmall, dattproj, v.atty, NULL, p.attprojw, dp.attprojw, dp.attprojb, d.CA, d.C);
    lora_backward(c, b, LORA_PROJ, a->dsmall, dattproj, v.atty, NULL);
    attention_step(c, dqkv, a->dsmall, v.qkv, v.atty, v.att_lse);
    matmul_step(c, a->dsmall, dqkv, v.ln1, NULL, p.qkvw, dp.qkvw, dp.qkvb, d.C, 3 * d.CA);
    lora_backward(c, b, LORA_QKV, a->dsmall, dqkv, v.ln1, NULL);
    norm_step(c, a->dresid, grad_of_partials(c, s[S_DLN1]), v.x, p.ln1w, v.ln1_mean, v.ln1_rstd, dp.ln1w, dp.ln1b);
}

const BlockOps GPT2_BLOCK = {
    .num_buffers = NUM_BUFFERS,
    .buffers = BUFFERS,
    .num_stash = NUM_STASH,
    .stash = STASH,
    .work = {W_FA, W_QKVA},   // dfch (N, 4C/tp), dqkv (N, 3C/tp)
    .width = width,
    .forward = forward,
    .recompute = recompute,
    .backward = backward,
};

// Token and learned position embeddings (wte and wpe), added.
static void embed(Model* g, Backend* be, void* params) {
    embed_step(g, be, unit_tensor(g->layout, params, GPT2_WTE, -1, g->dt), unit_tensor(g->layout, params, GPT2_WPE, -1, g->dt));
}

static void embed_backward(Model* g, Backend* be, void* grads, const void* dout) {
    embed_backward_step(g, be, unit_grad_tensor(g->layout, grads, GPT2_WTE, -1, g->dt), unit_grad_tensor(g->layout, grads, GPT2_WPE, -1, g->dt),
                        dout);
}

const EndOps GPT2_ENDS = {.embed = embed, .embed_backward = embed_backward};
