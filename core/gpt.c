// gpt.c: GPT-2 forward and backward as a walk over units. See gpt.h.
#include "gpt.h"

#include "common.h"

static void* slice(void* base, size_t elems_per_layer, int l, DType dt) {
    return (char*)base + (size_t)l * elems_per_layer * dtype_size(dt);
}
static float* fslice(float* base, size_t elems_per_layer, int l) { return base + (size_t)l * elems_per_layer; }

static void activations_create(Activations* a, Backend* be, MemLedger* mem, const GPTShape* s, DType dt, int B, int T) {
    size_t N = (size_t)B * T, C = (size_t)s->C, L = (size_t)s->L, x = dtype_size(dt);
#define ACT(bytes) mem_alloc(be, mem, MEM_ACTIVATIONS, (bytes))
    a->resid = ACT((L + 1) * N * C * x);
    a->ln1 = ACT(L * N * C * x);
    a->ln1_mean = (float*)ACT(L * N * 4);
    a->ln1_rstd = (float*)ACT(L * N * 4);
    a->qkv = ACT(L * N * 3 * C * x);
    a->atty = ACT(L * N * C * x);
    a->att_lse = (float*)ACT(L * N * (size_t)s->NH * 4);
    a->resid2 = ACT(L * N * C * x);
    a->ln2 = ACT(L * N * C * x);
    a->ln2_mean = (float*)ACT(L * N * 4);
    a->ln2_rstd = (float*)ACT(L * N * 4);
    a->fch = ACT(L * N * 4 * C * x);
    a->fch_gelu = ACT(L * N * 4 * C * x);
    a->lnf = ACT(N * C * x);
    a->lnf_mean = (float*)ACT(N * 4);
    a->lnf_rstd = (float*)ACT(N * 4);
    a->logits = ACT(N * (size_t)s->Vp * x);
    a->losses = (float*)ACT(N * 4);
    a->tokens = (int*)ACT(N * 4);
    a->targets = (int*)ACT(N * 4);
    a->proj = ACT(N * C * x);
    a->dresid = ACT(N * C * x);
    a->dsmall = ACT(N * C * x);
    a->dbig = ACT(N * 4 * C * x);
    a->att_scratch = (float*)ACT(N * (size_t)s->NH * 4);
#undef ACT
}

void gpt_create(GPT* g, Backend* be, const GPTShape* shape, DType dt, int B, int T, size_t pad_multiple) {
    memset(g, 0, sizeof(*g));
    g->shape = *shape;
    g->dt = dt;
    g->B = B;
    g->T = T;
    g->layout = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    layout_build(g->layout, shape, pad_multiple);
    size_t n = g->layout->total;
    g->params = mem_alloc(be, &g->mem, MEM_PARAMS, n * dtype_size(dt));
    g->grads = mem_alloc(be, &g->mem, MEM_GRADS, n * dtype_size(dt));
    g->master = dt == DT_FP32 ? (float*)g->params : (float*)mem_alloc(be, &g->mem, MEM_MASTER, n * 4);
    g->adam_m = (float*)mem_alloc(be, &g->mem, MEM_OPTIMIZER, n * 4);
    g->adam_v = (float*)mem_alloc(be, &g->mem, MEM_OPTIMIZER, n * 4);
    activations_create(&g->acts, be, &g->mem, shape, dt, B, T);
}

void gpt_destroy(GPT* g, Backend* be) {
    void** bufs = (void**)&g->acts;   // Activations holds only backend pointers
    for (size_t i = 0; i < sizeof(Activations) / sizeof(void*); i++) be_free(be, bufs[i]);
    if (g->master != (float*)g->params) be_free(be, g->master);
    be_free(be, g->params);
    be_free(be, g->grads);
    be_free(be, g->adam_m);
    be_free(be, g->adam_v);
    free(g->layout);
    memset(g, 0, sizeof(*g));
}

// One transformer block: resid[l] -> resid[l+1].
static void block_forward(GPT* g, Backend* be, int l) {
    const GPTShape* s = &g->shape;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = s->C;
    size_t NC = (size_t)N * C;
    BlockParams p = block_params(g->layout, g->params, l, dt);
    void* x = slice(a->resid, NC, l, dt);
    void* ln1 = slice(a->ln1, NC, l, dt);
    void* qkv = slice(a->qkv, 3 * NC, l, dt);
    void* atty = slice(a->atty, NC, l, dt);
    void* resid2 = slice(a->resid2, NC, l, dt);
    void* ln2 = slice(a->ln2, NC, l, dt);
    void* fch = slice(a->fch, 4 * NC, l, dt);
    void* fch_gelu = slice(a->fch_gelu, 4 * NC, l, dt);

    layernorm_forward(be, dt, ln1, fslice(a->ln1_mean, N, l), fslice(a->ln1_rstd, N, l), x, p.ln1w, p.ln1b, N, C);
    matmul_forward(be, dt, qkv, NULL, ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    attention_forward(be, dt, atty, fslice(a->att_lse, (size_t)N * s->NH, l), qkv, B, T, C, s->NH);
    matmul_forward(be, dt, a->proj, NULL, atty, p.attprojw, p.attprojb, N, C, C);
    residual_forward(be, dt, resid2, x, a->proj, NC);
    layernorm_forward(be, dt, ln2, fslice(a->ln2_mean, N, l), fslice(a->ln2_rstd, N, l), resid2, p.ln2w, p.ln2b, N, C);
    matmul_forward(be, dt, fch_gelu, fch, ln2, p.fcw, p.fcb, N, C, 4 * C);
    matmul_forward(be, dt, a->proj, NULL, fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    residual_forward(be, dt, slice(a->resid, NC, l + 1, dt), resid2, a->proj, NC);
}

// dresid holds d(resid[l+1]) on entry and d(resid[l]) on exit; parameter gradients accumulate.
static void block_backward(GPT* g, Backend* be, int l) {
    const GPTShape* s = &g->shape;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = s->C;
    size_t NC = (size_t)N * C;
    BlockParams p = block_params(g->layout, g->params, l, dt);
    BlockParams dp = block_params(g->layout, g->grads, l, dt);
    void* x = slice(a->resid, NC, l, dt);
    void* ln1 = slice(a->ln1, NC, l, dt);
    void* qkv = slice(a->qkv, 3 * NC, l, dt);
    void* atty = slice(a->atty, NC, l, dt);
    void* resid2 = slice(a->resid2, NC, l, dt);
    void* ln2 = slice(a->ln2, NC, l, dt);
    void* fch = slice(a->fch, 4 * NC, l, dt);
    void* fch_gelu = slice(a->fch_gelu, 4 * NC, l, dt);

    // MLP: resid[l+1] = resid2 + fcproj(gelu(fc(ln2(resid2)))); the residual passes dresid through.
    matmul_backward(be, dt, a->dbig, dp.fcprojw, dp.fcprojb, a->dresid, fch_gelu, fch, p.fcprojw, N, 4 * C, C);
    matmul_backward(be, dt, a->dsmall, dp.fcw, dp.fcb, a->dbig, ln2, NULL, p.fcw, N, C, 4 * C);
    layernorm_backward(be, dt, a->dresid, dp.ln2w, dp.ln2b, a->dsmall, resid2, p.ln2w,
                       fslice(a->ln2_mean, N, l), fslice(a->ln2_rstd, N, l), N, C);
    // Attention: resid2 = x + attproj(attention(qkv(ln1(x)))).
    matmul_backward(be, dt, a->dsmall, dp.attprojw, dp.attprojb, a->dresid, atty, NULL, p.attprojw, N, C, C);
    attention_backward(be, dt, a->dbig, a->att_scratch, a->dsmall, qkv, atty, fslice(a->att_lse, (size_t)N * s->NH, l),
                       B, T, C, s->NH);
    matmul_backward(be, dt, a->dsmall, dp.qkvw, dp.qkvb, a->dbig, ln1, NULL, p.qkvw, N, C, 3 * C);
    layernorm_backward(be, dt, a->dresid, dp.ln1w, dp.ln1b, a->dsmall, x, p.ln1w,
                       fslice(a->ln1_mean, N, l), fslice(a->ln1_rstd, N, l), N, C);
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

double gpt_forward(GPT* g, Backend* be, const int* tokens, const int* targets, float dloss, float* logits_dump) {
    const GPTShape* s = &g->shape;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = s->C;
    OuterParams p = outer_params(g->layout, g->params, dt);
    be_upload(be, a->tokens, tokens, (size_t)N * sizeof(int));
    encoder_forward(be, dt, a->resid, a->tokens, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < s->L; l++) block_forward(g, be, l);
    void* out = slice(a->resid, (size_t)N * C, s->L, dt);
    layernorm_forward(be, dt, a->lnf, a->lnf_mean, a->lnf_rstd, out, p.lnfw, p.lnfb, N, C);
    matmul_forward(be, dt, a->logits, NULL, a->lnf, p.wte, NULL, N, C, s->Vp);   // tied LM head
    if (logits_dump) logits_to_host(g, be, logits_dump);
    if (!targets) return 0.0;
    be_upload(be, a->targets, targets, (size_t)N * sizeof(int));
    classifier_forward(be, dt, a->logits, a->losses, a->targets, N, s->V, s->Vp, dloss, dloss != 0.0f);
    float* losses = (float*)xmalloc((size_t)N * sizeof(float));
    be_download(be, losses, a->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    free(losses);
    return sum / N;
}

void gpt_backward(GPT* g, Backend* be) {
    const GPTShape* s = &g->shape;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int B = g->B, T = g->T, N = B * T, C = s->C;
    OuterParams p = outer_params(g->layout, g->params, dt);
    OuterParams dp = outer_params(g->layout, g->grads, dt);
    void* out = slice(a->resid, (size_t)N * C, s->L, dt);
    matmul_backward(be, dt, a->dsmall, dp.wte, NULL, a->logits, a->lnf, NULL, p.wte, N, C, s->Vp);
    be_memset0(be, a->dresid, (size_t)N * C * dtype_size(dt));   // layernorm_backward accumulates into it
    layernorm_backward(be, dt, a->dresid, dp.lnfw, dp.lnfb, a->dsmall, out, p.lnfw, a->lnf_mean, a->lnf_rstd, N, C);
    for (int l = s->L - 1; l >= 0; l--) block_backward(g, be, l);
    encoder_backward(be, dt, dp.wte, dp.wpe, a->dresid, a->tokens, B, T, C);
}
