// gpt.c: GPT-2 forward and backward as a walk over units. See gpt.h.
#include "gpt.h"

#include "base/common.h"

static void* slice(void* base, size_t elems_per_layer, int l, DType dt) {
    return (char*)base + (size_t)l * elems_per_layer * dtype_size(dt);
}
static float* fslice(float* base, size_t elems_per_layer, int l) { return base + (size_t)l * elems_per_layer; }

#define NUM_ACTIVATION_BUFFERS (sizeof(Activations) / sizeof(void*))   // Activations holds only pointers

// Which per-layer activations each recompute level keeps for every layer; the others have one slot that
// the forward overwrites layer after layer and the backward refills (block_recompute).
typedef struct {
    int ln;      // ln1, ln2 and their statistics
    int att;     // attention output and its log-sum-exp
    int gelu;    // fch_gelu
    int mid;     // qkv, resid2, fch: everything inside the block but its input
} Keep;

static Keep keep_for(int recompute) {
    Keep k = {recompute < 2, recompute < 2, recompute < 1, recompute < 3};
    return k;
}

// Bytes of each Activations buffer, in the struct's field order, and whether each set has its own copy
// (per_set) or all sets share one. Only the stage's blocks count; the head's buffers exist only on the
// stage with the head, the token ids only on the one with the encoder (its backward reads them).
static void activation_sizes(const ParamLayout* lay, DType dt, int B, int T, int recompute, size_t* bytes, int* per_set) {
    const GPTShape* s = &lay->shape;
    size_t N = (size_t)B * T, C = (size_t)s->C, x = dtype_size(dt), NH = (size_t)s->NH;
    Keep k = keep_for(recompute);
    int head = lay->final_unit >= 0, enc = lay->emb_unit >= 0 && !lay->emb_mirror;
    size_t L = (size_t)lay->num_blocks, Lln = k.ln ? L : 1, Latt = k.att ? L : 1, Lgelu = k.gelu ? L : 1, Lmid = k.mid ? L : 1;
    size_t sizes[] = {
        (L + 1) * N * C * x,                         // resid (block inputs: always kept)
        Lln * N * C * x, Lln * N * 4, Lln * N * 4,   // ln1, ln1_mean, ln1_rstd
        Lmid * N * 3 * C * x,                        // qkv
        Latt * N * C * x,                            // atty
        Latt * N * NH * 4,                           // att_lse
        Lmid * N * C * x,                            // resid2
        Lln * N * C * x, Lln * N * 4, Lln * N * 4,   // ln2, ln2_mean, ln2_rstd
        Lmid * N * 4 * C * x,                        // fch
        Lgelu * N * 4 * C * x,                       // fch_gelu
        head * N * C * x, head * N * 4, head * N * 4,   // lnf, lnf_mean, lnf_rstd
        head * N * (size_t)s->Vp * x,                   // logits
        head * N * 4, enc * N * 4, head * N * 4,        // losses, tokens, targets
        N * C * x, N * C * x, N * C * x,       // proj, dresid, dsmall
        N * 4 * C * x,                         // dbig
        N * NH * 4,                            // att_scratch
    };
    int own[] = {1, k.ln, k.ln, k.ln, k.mid, k.att, k.att, k.mid, k.ln, k.ln, k.ln, k.mid, k.gelu,
                 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    _Static_assert(sizeof(sizes) / sizeof(sizes[0]) == NUM_ACTIVATION_BUFFERS, "one size per Activations field");
    _Static_assert(sizeof(own) / sizeof(own[0]) == NUM_ACTIVATION_BUFFERS, "one flag per Activations field");
    memcpy(bytes, sizes, sizeof(sizes));
    memcpy(per_set, own, sizeof(own));
}

size_t gpt_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int recompute, int num_sets) {
    size_t bytes[NUM_ACTIVATION_BUFFERS], total = 0;
    int per_set[NUM_ACTIVATION_BUFFERS];
    activation_sizes(lay, dt, B, T, recompute, bytes, per_set);
    for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++) total += bytes[i] * (size_t)(per_set[i] ? num_sets : 1);
    return total;
}

void gpt_create(GPT* g, Backend* be, MemLedger* mem, const ParamLayout* layout, Zero* zero, DType dt, int B, int T,
                int recompute, int num_sets) {
    memset(g, 0, sizeof(*g));
    g->shape = layout->shape;
    g->layout = layout;
    g->zero = zero;
    g->dt = dt;
    g->B = B;
    g->T = T;
    g->recompute = recompute;
    if (num_sets < 1 || (gpt_has_head(g) && num_sets != 1)) fail("internal: %d activation sets on this stage", num_sets);
    g->num_sets = num_sets;
    g->sets = (Activations*)xcalloc((size_t)num_sets, sizeof(Activations));
    size_t bytes[NUM_ACTIVATION_BUFFERS];
    int per_set[NUM_ACTIVATION_BUFFERS];
    activation_sizes(layout, dt, B, T, recompute, bytes, per_set);
    for (int k = 0; k < num_sets; k++) {
        void** bufs = (void**)&g->sets[k];
        void** first = (void**)&g->sets[0];
        for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++)
            bufs[i] = k > 0 && !per_set[i] ? first[i] : bytes[i] ? mem_alloc(be, mem, MEM_ACTIVATIONS, bytes[i]) : NULL;
    }
    g->acts = g->sets[0];
}

void gpt_destroy(GPT* g, Backend* be) {
    size_t bytes[NUM_ACTIVATION_BUFFERS];
    int per_set[NUM_ACTIVATION_BUFFERS];
    activation_sizes(g->layout, g->dt, g->B, g->T, g->recompute, bytes, per_set);
    for (int k = 0; k < g->num_sets; k++) {
        void** bufs = (void**)&g->sets[k];
        for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++)
            if (bufs[i] && (k == 0 || per_set[i])) be_free(be, bufs[i]);
    }
    free(g->sets);
    memset(g, 0, sizeof(*g));
}

void* gpt_stage_input(GPT* g, int set) { return g->sets[set].resid; }
void* gpt_stage_output(GPT* g, int set) {
    return slice(g->sets[set].resid, (size_t)g->B * g->T * g->shape.C, g->layout->num_blocks, g->dt);
}
void* gpt_boundary_grad(GPT* g) { return g->sets[0].dresid; }
size_t gpt_boundary_bytes(const GPT* g) { return (size_t)g->B * g->T * g->shape.C * dtype_size(g->dt); }

static void use_set(GPT* g, int set) {
    if (set < 0 || set >= g->num_sets) fail("internal: activation set %d of %d", set, g->num_sets);
    g->acts = g->sets[set];
}

// Block l's activations (l counts the stage's blocks from 0): its own slice where the recompute level keeps
// the tensor, the shared slot otherwise.
typedef struct {
    void *x, *ln1, *qkv, *atty, *resid2, *ln2, *fch, *fch_gelu, *out;
    float *ln1_mean, *ln1_rstd, *att_lse, *ln2_mean, *ln2_rstd;
} BlockActs;

static BlockActs block_acts(GPT* g, int l) {
    Activations* a = &g->acts;
    DType dt = g->dt;
    size_t N = (size_t)g->B * g->T, NC = N * (size_t)g->shape.C, NNH = N * (size_t)g->shape.NH;
    Keep k = keep_for(g->recompute);
    int ln = k.ln ? l : 0, att = k.att ? l : 0, gelu = k.gelu ? l : 0, mid = k.mid ? l : 0;
    BlockActs v = {slice(a->resid, NC, l, dt), slice(a->ln1, NC, ln, dt), slice(a->qkv, 3 * NC, mid, dt),
                   slice(a->atty, NC, att, dt), slice(a->resid2, NC, mid, dt), slice(a->ln2, NC, ln, dt),
                   slice(a->fch, 4 * NC, mid, dt), slice(a->fch_gelu, 4 * NC, gelu, dt), slice(a->resid, NC, l + 1, dt),
                   fslice(a->ln1_mean, N, ln), fslice(a->ln1_rstd, N, ln), fslice(a->att_lse, NNH, att),
                   fslice(a->ln2_mean, N, ln), fslice(a->ln2_rstd, N, ln)};
    return v;
}

// One transformer block: v.x -> v.out. A recomputation (full recompute level) stops before the MLP's
// output projection: the backward needs everything up to fch_gelu, and v.out is already in place.
static void block_forward(GPT* g, Backend* be, BlockParams p, BlockActs v, int recomputing) {
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = g->shape.C;
    size_t NC = (size_t)N * C;
    void* proj = g->acts.proj;
    layernorm_forward(be, dt, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b, N, C);
    matmul_forward(be, dt, v.qkv, NULL, v.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    attention_forward(be, dt, v.atty, v.att_lse, v.qkv, B, T, C, g->shape.NH);
    matmul_forward(be, dt, proj, NULL, v.atty, p.attprojw, p.attprojb, N, C, C);
    residual_forward(be, dt, v.resid2, v.x, proj, NC);
    layernorm_forward(be, dt, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b, N, C);
    matmul_forward(be, dt, v.fch_gelu, v.fch, v.ln2, p.fcw, p.fcb, N, C, 4 * C);
    if (recomputing) return;
    matmul_forward(be, dt, proj, NULL, v.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    residual_forward(be, dt, v.out, v.resid2, proj, NC);
}

// Refills what the recompute level did not keep for layer l, with the same kernels as the forward, so the
// values are bit-identical to the ones the forward computed (on the CPU backend; cuBLASLt's fused GELU
// epilogue rounds differently from the separate GELU kernel).
static void block_recompute(GPT* g, Backend* be, BlockParams p, BlockActs v) {
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = g->shape.C;
    if (g->recompute >= 3) {
        block_forward(g, be, p, v, 1);
        return;
    }
    if (g->recompute >= 2) {
        layernorm_forward(be, dt, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b, N, C);
        attention_forward(be, dt, v.atty, v.att_lse, v.qkv, B, T, C, g->shape.NH);
        layernorm_forward(be, dt, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b, N, C);
    }
    if (g->recompute >= 1) gelu_forward(be, dt, v.fch_gelu, v.fch, (size_t)N * 4 * C);
}

// g->acts.dresid holds d(out) on entry and d(x) on exit; parameter gradients accumulate.
static void block_backward(GPT* g, Backend* be, BlockParams p, BlockParams dp, BlockActs v) {
    Activations* a = &g->acts;
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = g->shape.C;
    // MLP: out = resid2 + fcproj(gelu(fc(ln2(resid2)))); the residual passes dresid through.
    matmul_backward(be, dt, a->dbig, dp.fcprojw, dp.fcprojb, a->dresid, v.fch_gelu, v.fch, p.fcprojw, N, 4 * C, C);
    matmul_backward(be, dt, a->dsmall, dp.fcw, dp.fcb, a->dbig, v.ln2, NULL, p.fcw, N, C, 4 * C);
    layernorm_backward(be, dt, a->dresid, dp.ln2w, dp.ln2b, a->dsmall, v.resid2, p.ln2w, v.ln2_mean, v.ln2_rstd, N, C);
    // Attention: resid2 = x + attproj(attention(qkv(ln1(x)))).
    matmul_backward(be, dt, a->dsmall, dp.attprojw, dp.attprojb, a->dresid, v.atty, NULL, p.attprojw, N, C, C);
    attention_backward(be, dt, a->dbig, a->att_scratch, a->dsmall, v.qkv, v.atty, v.att_lse, B, T, C, g->shape.NH);
    matmul_backward(be, dt, a->dsmall, dp.qkvw, dp.qkvb, a->dbig, v.ln1, NULL, p.qkvw, N, C, 3 * C);
    layernorm_backward(be, dt, a->dresid, dp.ln1w, dp.ln1b, a->dsmall, v.x, p.ln1w, v.ln1_mean, v.ln1_rstd, N, C);
}

static void logits_to_host(GPT* g, Backend* be, float* out) {
    int N = g->B * g->T, V = g->shape.V, Vp = g->shape.Vp;
    size_t x = dtype_size(g->dt);
    char* raw = (char*)xmalloc((size_t)N * Vp * x);
    float* row = (float*)xmalloc((size_t)V * sizeof(float));
    be_download(be, raw, g->acts.logits, (size_t)N * Vp * x);
    for (int n = 0; n < N; n++) {
        host_from_dtype(row, raw + (size_t)n * Vp * x, g->dt, (size_t)V);
        memcpy(out + (size_t)n * V, row, (size_t)V * sizeof(float));
    }
    free(row);
    free(raw);
}

// The LM head and the loss: final LayerNorm, logits = lnf . wte^T, then (with targets) the cross-entropy.
static double head_forward(GPT* g, Backend* be, const int* targets, float dloss, float* logits_dump) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int N = g->B * g->T, C = g->shape.C, fin = final_norm_unit(lay);
    EmbeddingParams emb = embedding_params(lay, zero_params(g->zero, be, lay->emb_unit), dt);
    FinalNormParams fn = final_norm_params(lay, zero_params(g->zero, be, fin), dt);
    void* out = slice(a->resid, (size_t)N * C, lay->num_blocks, dt);
    layernorm_forward(be, dt, a->lnf, a->lnf_mean, a->lnf_rstd, out, fn.lnfw, fn.lnfb, N, C);
    matmul_forward(be, dt, a->logits, NULL, a->lnf, emb.wte, NULL, N, C, g->shape.Vp);   // tied LM head
    zero_params_done(g->zero, fin);
    zero_params_done(g->zero, lay->emb_unit);
    if (logits_dump) logits_to_host(g, be, logits_dump);
    if (!targets) return 0.0;
    be_upload(be, a->targets, targets, (size_t)N * sizeof(int));
    classifier_forward(be, dt, a->logits, a->losses, a->targets, N, g->shape.V, g->shape.Vp, dloss, dloss != 0.0f);
    float* losses = (float*)xmalloc((size_t)N * sizeof(float));
    be_download(be, losses, a->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    free(losses);
    return sum;
}

double gpt_forward(GPT* g, Backend* be, int set, const int* tokens, const int* targets, float dloss, float* logits_dump) {
    const ParamLayout* lay = g->layout;
    DType dt = g->dt;
    use_set(g, set);
    Activations* a = &g->acts;
    if (gpt_has_encoder(g)) {
        be_upload(be, a->tokens, tokens, (size_t)g->B * g->T * sizeof(int));
        EmbeddingParams emb = embedding_params(lay, zero_params(g->zero, be, lay->emb_unit), dt);
        encoder_forward(be, dt, a->resid, a->tokens, emb.wte, emb.wpe, g->B, g->T, g->shape.C);
        if (!gpt_has_head(g)) zero_params_done(g->zero, lay->emb_unit);
    }
    for (int i = 0; i < lay->num_blocks; i++) {
        int l = lay->first_block + i, u = unit_of_block(lay, l);
        block_forward(g, be, block_params(lay, zero_params(g->zero, be, u), l, dt), block_acts(g, i), 0);
        zero_params_done(g->zero, u);
    }
    return gpt_has_head(g) ? head_forward(g, be, targets, dloss, logits_dump) : 0.0;
}

// dlogits -> the gradient of the last block's output, in acts.dresid; wte's and the final LayerNorm's
// gradients accumulate. The embedding gradient buffer stays live for the encoder on a one-stage run.
static void head_backward(GPT* g, Backend* be) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    Zero* z = g->zero;
    DType dt = g->dt;
    int N = g->B * g->T, C = g->shape.C, fin = final_norm_unit(lay);
    EmbeddingParams emb = embedding_params(lay, zero_params(z, be, lay->emb_unit), dt);
    EmbeddingParams demb = embedding_params(lay, zero_grads(z, be, lay->emb_unit), dt);
    FinalNormParams fn = final_norm_params(lay, zero_params(z, be, fin), dt);
    FinalNormParams dfn = final_norm_params(lay, zero_grads(z, be, fin), dt);
    // ZeRO-3: start gathering the last block, which the backward needs next, while the head computes.
    zero_prefetch(z, be, unit_of_block(lay, lay->first_block + lay->num_blocks - 1));
    void* out = slice(a->resid, (size_t)N * C, lay->num_blocks, dt);
    matmul_backward(be, dt, a->dsmall, demb.wte, NULL, a->logits, a->lnf, NULL, emb.wte, N, C, g->shape.Vp);
    be_memset0(be, a->dresid, (size_t)N * C * dtype_size(dt));   // layernorm_backward accumulates into it
    layernorm_backward(be, dt, a->dresid, dfn.lnfw, dfn.lnfb, a->dsmall, out, fn.lnfw, a->lnf_mean, a->lnf_rstd, N, C);
    zero_grads_done(z, be, fin);
    zero_params_done(z, fin);
    if (!gpt_has_encoder(g)) {
        zero_grads_done(z, be, lay->emb_unit);
        zero_params_done(z, lay->emb_unit);
    }
}

void gpt_backward(GPT* g, Backend* be, int set) {
    const ParamLayout* lay = g->layout;
    Zero* z = g->zero;
    DType dt = g->dt;
    use_set(g, set);
    Activations* a = &g->acts;
    if (gpt_has_head(g)) head_backward(g, be);
    for (int i = lay->num_blocks - 1; i >= 0; i--) {
        int l = lay->first_block + i, u = unit_of_block(lay, l);
        BlockParams p = block_params(lay, zero_params(z, be, u), l, dt);   // ZeRO-3: one gather serves both
        BlockActs v = block_acts(g, i);
        block_recompute(g, be, p, v);
        block_backward(g, be, p, block_params(lay, zero_grads(z, be, u), l, dt), v);
        zero_grads_done(z, be, u);
        zero_params_done(z, u);
    }
    if (!gpt_has_encoder(g)) return;
    EmbeddingParams demb = embedding_params(lay, zero_grads(z, be, lay->emb_unit), dt);   // still live with the head
    encoder_backward(be, dt, demb.wte, demb.wpe, a->dresid, a->tokens, g->B, g->T, g->shape.C);
    zero_grads_done(z, be, lay->emb_unit);
    zero_params_done(z, lay->emb_unit);
}
