// block.c: the Llama block for the walk (core/model/block.h): x + wo(attention(rope(qk_norm(wqkv(norm(x)))))),
// then + down(silu(gate(n)) * up(n)) with n the RMSNorm of that. Under -tp q, k|v and gate|up are
// column-parallel (whole heads and hidden rows per rank; a kv head copied on several ranks when there are
// fewer of them than ranks), wo and down row-parallel.
#include <math.h>

#include "base/common.h"
#include "core/model/block.h"
#include "core/models/llama/llama.h"
#include "core/model/lora_steps.h"

void llama_inv_freq(const ModelShape* s, float* out) {
    LlamaParams p = llama_params(s);
    const Rope* r = &p.rope;
    double two_pi = 2.0 * M_PI;
    for (int i = 0; i < p.D / 2; i++) {
        double f = 1.0 / pow((double)r->theta, 2.0 * i / p.D);
        if (r->scaling == ROPE_LINEAR) f /= r->factor;
        if (r->scaling == ROPE_LLAMA3) {   // Hugging Face's _compute_llama3_parameters
            double wavelen = two_pi / f, low = r->original_max / r->low_freq_factor, high = r->original_max / r->high_freq_factor;
            double smooth = (r->original_max / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            f = wavelen > low ? f / r->factor : wavelen < high ? f : (1.0 - smooth) * f / r->factor + smooth * f;
        }
        out[i] = (float)f;
    }
}

static size_t constants(const ModelShape* s, float* out) {
    if (out) llama_inv_freq(s, out);
    return (size_t)llama_params(s).D / 2;
}

// Its widths beside the walk's (block.h), per tensor rank: attention's NH D / tp channels, q|k|v's
// (NH + 2 KV) D / tp, the MLP's F / tp and gate|up's twice that; with q/k norms only (else 0), q|k|v before
// them and the norms' statistics, one per q and k head.
enum { W_CA = W_FAMILY, W_QKVA, W_FA, W_2FA, W_QKVA_QKN, W_QKNA_QKN };
static size_t width(const ParamLayout* lay, Width w) {
    size_t NH = (size_t)layout_heads(lay), KV = (size_t)layout_kv_heads(lay), D = (size_t)layout_head_size(lay);
    int qk_norm = llama_params(&lay->shape).qk_norm;
    switch (w) {
        case W_CA: return (size_t)layout_attn_channels(lay);
        case W_QKVA: return (NH + 2 * KV) * D;
        case W_FA: return (size_t)layout_mlp_channels(lay);
        case W_2FA: return 2 * (size_t)layout_mlp_channels(lay);
        case W_QKVA_QKN: return qk_norm ? (NH + 2 * KV) * D : 0;
        case W_QKNA_QKN: return qk_norm ? NH + KV : 0;
    }
    fail("internal: the Llama block has no width %d", w);
}

enum {
    NORM1, RSTD1, QKV_RAW, QKV, QK_RSTD, ATTY, LSE, RESID2, NORM2, RSTD2, GU, ACT,   // kept as the level says
    DATTY, DACT, DQKV_RAW,                                                         // scratch
    NUM_BUFFERS
};
static const BlockBuffer BUFFERS[NUM_BUFFERS] = {
    [NORM1] = {"norm1", KEPT_NORM, W_C, E_DT, ALL_ROWS},           // (N, C)  gathered under -sp
    [RSTD1] = {"rstd1", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [QKV_RAW] = {"qkv_raw", KEPT_MID, W_QKVA_QKN, E_DT, ALL_ROWS},  // q|k|v before the q/k norms (with them only)
    [QKV] = {"qkv", KEPT_MID, W_QKVA, E_DT, ALL_ROWS},             // q|k|v as attention reads them: normed, rotated
    [QK_RSTD] = {"qk_rstd", KEPT_MID, W_QKNA_QKN, E_F32, ALL_ROWS},
    [ATTY] = {"atty", KEPT_ATT, W_CA, E_DT, ALL_ROWS},             // (N, NH D / tp)
    [LSE] = {"lse", KEPT_ATT, W_NHA, E_F32, ALL_ROWS},
    [RESID2] = {"resid2", KEPT_MID, W_C, E_DT, OWN_ROWS},
    [NORM2] = {"norm2", KEPT_NORM, W_C, E_DT, ALL_ROWS},
    [RSTD2] = {"rstd2", KEPT_NORM, W_1, E_F32, OWN_ROWS},
    [GU] = {"gate_up", KEPT_MID, W_2FA, E_DT, ALL_ROWS},           // (N, 2F / tp)  gate | up
    [ACT] = {"swiglu", KEPT_ACT, W_FA, E_DT, ALL_ROWS},            // (N, F / tp)
    [DATTY] = {"datty", SCRATCH, W_CA, E_DT, ALL_ROWS},
    [DACT] = {"dswiglu", SCRATCH, W_FA, E_DT, ALL_ROWS},
    [DQKV_RAW] = {"dqkv_raw", SCRATCH, W_QKVA_QKN, E_DT, ALL_ROWS},
};

// zb's stash: the gradients w.r.t. the outputs of the block's parameterized layers.
enum { S_DDOWN, S_DGU, S_DNORM2, S_DWO, S_DQKN, S_DQKV, S_DNORM1, NUM_STASH };
static const StashField STASH[NUM_STASH] = {
    [S_DDOWN] = {"ddown", W_C, ALL_ROWS},    [S_DGU] = {"dgate_up", W_2FA, ALL_ROWS},  [S_DNORM2] = {"dnorm2", W_C, OWN_ROWS},
    [S_DWO] = {"dwo", W_C, ALL_ROWS},        [S_DQKN] = {"dqk_norm", W_QKVA_QKN, ALL_ROWS},
    [S_DQKV] = {"dqkv", W_QKVA, ALL_ROWS},   [S_DNORM1] = {"dnorm1", W_C, OWN_ROWS},
};

// LoRA's targets, in the family's list's order (family.c).
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN };

typedef struct {
    void *attn_norm, *wqkv, *bqkv, *q_norm, *k_norm, *wo, *mlp_norm, *gate_up, *down;
} Params;

// wkv joins wq and bkv joins bq (llama.h), so wq's pointer is the whole q|k|v matrix's, bq's its bias's
// (NULL without biases).
static Params params_at(const Model* g, void* base, int layer, void* (*at)(const ParamLayout*, void*, int, int, DType)) {
#define T(kind) at(g->layout, base, kind, layer, g->dt)
    Params p = {T(LLAMA_ATTN_NORM), T(LLAMA_WQ), T(LLAMA_BQ), T(LLAMA_Q_NORM), T(LLAMA_K_NORM),
                T(LLAMA_WO), T(LLAMA_MLP_NORM), T(LLAMA_GATE_UP), T(LLAMA_DOWN)};
#undef T
    return p;
}

static Params params_in(const Model* g, void* base, int layer) { return params_at(g, base, layer, unit_tensor); }
// Their gradients: NULL for a frozen kind.
static Params grads_in(const Model* g, void* base, int layer) { return params_at(g, base, layer, unit_grad_tensor); }

typedef struct {
    void *x, *norm1, *qkv_raw, *qkv, *atty, *resid2, *norm2, *gu, *act, *out;
    float *rstd1, *qk_rstd, *lse, *rstd2;
} Acts;

static Acts acts_of(Model* g, int l) {
#define A(i) block_buffer(g, i, l)
    Acts v = {residual_at(g, l), A(NORM1), A(QKV_RAW), A(QKV), A(ATTY), A(RESID2), A(NORM2), A(GU), A(ACT),
              residual_at(g, l + 1), A(RSTD1), A(QK_RSTD), A(LSE), A(RSTD2)};
#undef A
    return v;
}

static int has_qk_norm(const Model* g) { return llama_params(&g->shape).qk_norm; }

// q|k|v as attention reads them, from the matmul's output (qkv_raw with q/k norms, qkv itself without).
static void prepare_qkv(Model* g, Backend* be, Params p, Acts v) {
    BlockDims d = block_dims(g);
    LlamaParams lp = llama_params(&g->shape);
    if (lp.qk_norm) qk_norm_forward(be, g->dt, v.qkv, v.qk_rstd, v.qkv_raw, p.q_norm, p.k_norm, d.N, d.NH, d.KV, d.D, lp.eps);
    rope_forward(be, g->dt, v.qkv, v.qkv, g->constants, g->acts.pos, d.B, d.T, d.NH, d.KV, d.D);
}

static void forward(Model* g, Backend* be, const BlockRef* b, int recomputing) {
    DType dt = g->dt;
    BlockDims d = block_dims(g);
    size_t RC = (size_t)d.R * d.C;
    int QKVA = (d.NH + 2 * d.KV) * d.D;
    void* proj = g->acts.proj;
    Params p = params_in(g, b->params, b->layer);
    Acts v = acts_of(g, b->index);
    norm_forward(g, be, v.norm1, NULL, v.rstd1, v.x, p.attn_norm, NULL);
    void* qkv_out = has_qk_norm(g) ? v.qkv_raw : v.qkv;
    matmul_forward(be, dt, qkv_out, NULL, v.norm1, p.wqkv, p.bqkv, d.N, d.C, QKVA);
    for (int t = LORA_Q; t <= LORA_V; t++) lora_forward(g, be, b, t, qkv_out, v.norm1);
    prepare_qkv(g, be, p, v);
    attention_forward_step(g, be, b->index, v.atty, v.lse, v.qkv);
    matmul_forward(be, dt, proj, NULL, v.atty, p.wo, NULL, d.N, d.CA, d.C);
    lora_forward(g, be, b, LORA_O, proj, v.atty);
    residual_forward(be, dt, v.resid2, v.x, sum_partials(g, proj), RC);
    norm_forward(g, be, v.norm2, NULL, v.rstd2, v.resid2, p.mlp_norm, NULL);
    matmul_forward(be, dt, v.gu, NULL, v.norm2, p.gate_up, NULL, d.N, d.C, 2 * d.CF);
    lora_forward(g, be, b, LORA_GATE, v.gu, v.norm2);
    lora_forward(g, be, b, LORA_UP, v.gu, v.norm2);
    swiglu_forward(be, dt, v.act, v.gu, d.N, d.CF);
    if (recomputing) return;
    matmul_forward(be, dt, proj, NULL, v.act, p.down, NULL, d.N, d.CF, d.C);
    lora_forward(g, be, b, LORA_DOWN, proj, v.act);
    residual_forward(be, dt, v.out, v.resid2, sum_partials(g, proj), RC);
}

// -r 1 refills the SwiGLU, -r 2 also attention and the two RMSNorms (-r 3's forward also redoes q|k|v, their
// norms and rotation).
static void recompute(Model* g, Backend* be, const BlockRef* b) {
    BlockDims d = block_dims(g);
    Params p = params_in(g, b->params, b->layer);
    Acts v = acts_of(g, b->index);
    if (g->recompute >= 2) {
        norm_forward(g, be, v.norm1, NULL, v.rstd1, v.x, p.attn_norm, NULL);
        attention_refill_step(g, be, b->index, v.atty, v.lse, v.qkv);
        norm_forward(g, be, v.norm2, NULL, v.rstd2, v.resid2, p.mlp_norm, NULL);
    }
    if (g->recompute >= 1) swiglu_forward(be, g->dt, v.act, v.gu, d.N, d.CF);
}

// The SwiGLU's and RoPE's backward: no parameters, so nothing for W.
static void swiglu_step(BlockBackward* c, void* dgu, const void* dact, const void* gu) {
    if (c->mode == BWD_WEIGHT) return;
    BlockDims d = block_dims(c->g);
    swiglu_backward(c->be, c->g->dt, dgu, dact, gu, d.N, d.CF);
}

static void rope_step(BlockBackward* c, void* dqkv) {
    if (c->mode == BWD_WEIGHT) return;
    BlockDims d = block_dims(c->g);
    rope_backward(c->be, c->g->dt, dqkv, dqkv, c->g->constants, c->g->acts.pos, d.B, d.T, d.NH, d.KV, d.D);
}

// The q/k norms' backward. Each tensor rank normalizes its own heads with the whole weights, so their
// gradients are partial sums over the group: made in scratch (dsmall, free here), summed, then added. B
// drops them; W drops the input gradient (into the dqkv_raw scratch).
static void qk_norm_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, Params p, Params dp,
                         const float* rstd) {
    Model* g = c->g;
    BlockDims d = block_dims(g);
    DType dt = g->dt;
    size_t D = (size_t)d.D;
    void* dw = g->acts.dsmall;   // (2, D): q then k
    be_memset0(c->be, dw, 2 * D * dtype_size(dt));
    void* into = c->mode == BWD_WEIGHT ? block_buffer(g, DQKV_RAW, 0) : dinp;
    qk_norm_backward(c->be, dt, into, dw, (char*)dw + D * dtype_size(dt), dout, inp, p.q_norm, p.k_norm, rstd, d.N, d.NH, d.KV, d.D);
    if (c->mode == BWD_INPUT || !dp.q_norm) return;   // frozen: no weight gradient to keep
    if (g->tp) comm_allreduce_sum(g->tp, dw, 2 * D, dt);
    residual_forward(c->be, dt, dp.q_norm, dp.q_norm, dw, D);
    residual_forward(c->be, dt, dp.k_norm, dp.k_norm, (char*)dw + D * dtype_size(dt), D);
}

// dbig carries d(gate|up) and then d(q|k|v); the scratch buffers the gradients between the other steps.
static void backward(BlockBackward* c, const BlockRef* b) {
    Model* g = c->g;
    Activations* a = &g->acts;
    void** s = c->stash.field;
    BlockDims d = block_dims(g);
    Params p = params_in(g, b->params, b->layer);
    Params dp = b->grads ? grads_in(g, b->grads, b->layer) : (Params){0};
    Acts v = acts_of(g, b->index);
    // MLP: out = resid2 + down(swiglu(gate_up(norm2(resid2)))).
    void* dact = block_buffer(g, DACT, 0);
    void* ddown = grad_of_stream(c, s[S_DDOWN]);
    matmul_step(c, dact, ddown, v.act, NULL, p.down, dp.down, NULL, d.CF, d.C);
    lora_backward(c, b, LORA_DOWN, dact, ddown, v.act, NULL);
    void* dgu = grad_between(c, a->dbig, s[S_DGU]);
    swiglu_step(c, dgu, dact, v.gu);
    matmul_step(c, a->dsmall, dgu, v.norm2, NULL, p.gate_up, dp.gate_up, NULL, d.C, 2 * d.CF);
    lora_backward(c, b, LORA_GATE, a->dsmall, dgu, v.norm2, NULL);
    lora_backward(c, b, LORA_UP, a->dsmall, dgu, v.norm2, NULL);
    norm_step(c, a->dresid, grad_of_partials(c, s[S_DNORM2]), v.resid2, p.mlp_norm, NULL, v.rstd2, dp.mlp_norm, NULL);
    // Attention: resid2 = x + wo(attention(rope(qk_norm(wqkv(norm1(x)))))).
    void* datty = block_buffer(g, DATTY, 0);
    void* dwo = grad_of_stream(c, s[S_DWO]);
    matmul_step(c, datty, dwo, v.atty, NULL, p.wo, dp.wo, NULL, d.CA, d.C);
    lora_backward(c, b, LORA_O, datty, dwo, v.atty, NULL);
    void* dqkv = grad_between(c, a->dbig, s[has_qk_norm(g) ? S_DQKN : S_DQKV]);   // d(q|k|v as attention read them)
    attention_step(c, dqkv, datty, v.qkv, v.atty, v.lse);
    rope_step(c, dqkv);
    if (has_qk_norm(g)) {
        void* draw = grad_between(c, block_buffer(g, DQKV_RAW, 0), s[S_DQKV]);
        qk_norm_step(c, draw, dqkv, v.qkv_raw, p, dp, v.qk_rstd);
        dqkv = draw;
    }
    qkv_matmul_step(c, a->dsmall, dqkv, v.norm1, p.wqkv, dp.wqkv, dp.bqkv);
    for (int t = LORA_Q; t <= LORA_V; t++) lora_backward(c, b, t, a->dsmall, dqkv, v.norm1, NULL);
    norm_step(c, a->dresid, grad_of_partials(c, s[S_DNORM1]), v.x, p.attn_norm, NULL, v.rstd1, dp.attn_norm, NULL);
}

const BlockOps LLAMA_BLOCK = {
    .num_buffers = NUM_BUFFERS,
    .buffers = BUFFERS,
    .num_stash = NUM_STASH,
    .stash = STASH,
    .work = {W_2FA, W_QKVA},
    .width = width,
    .constants = constants,
    .forward = forward,
    .recompute = recompute,
    .backward = backward,
};
