// gpt.c: GPT-2 forward and backward as a walk over units. See gpt.h.
#include "core/model/gpt.h"

#include <stddef.h>

#include "base/common.h"

static void* slice(void* base, size_t elems_per_layer, int l, DType dt) {
    return (char*)base + (size_t)l * elems_per_layer * dtype_size(dt);
}
static float* fslice(float* base, size_t elems_per_layer, int l) { return base + (size_t)l * elems_per_layer; }

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

// Every Activations buffer, described once: how many (N, width) slices it holds on this stage, and of what.
typedef enum {
    RESIDUAL,    // L + 1: each of the stage's blocks' input, then the last block's output
    PER_BLOCK,   // L when the recompute level keeps it for every block (its Keep flag), else one slot
    WORK,        // one, shared by the blocks and the activation sets
    HEAD,        // one on the stage with the LM head, none elsewhere
    ENCODER,     // one on the stage with the embedding lookup (its backward reads the tokens)
    UPSTREAM,    // one on a stage without it: one that sends d(input) to an earlier stage
} Extent;
typedef enum { KEPT_ALWAYS, KEPT_LN, KEPT_ATT, KEPT_GELU, KEPT_MID } KeptBy;
// Elements per token; *A: a tensor rank's share; W_VPA: its vocabulary columns (Vp/tp); W_VSTAT: 1 + 3 tp
// under -tp (the vocabulary-parallel cross-entropy's row max and every rank's row sums), 0 without.
typedef enum { W_1, W_C, W_CA, W_3CA, W_4CA, W_NHA, W_VPA, W_VSTAT } Width;
typedef enum { E_DT, E_F32, E_I32 } Elem;                   // the run's dtype, fp32, int32

typedef enum { ALL_ROWS, OWN_ROWS } Rows;   // OWN_ROWS: this rank's N / tp under sequence parallelism

typedef struct {
    size_t field;   // offsetof(Activations, ...)
    Extent extent;
    KeptBy kept;
    Width width;
    Elem elem;
    Rows rows;
} ActivationBuffer;

#define BUF(name, extent, kept, width, elem) {offsetof(Activations, name), extent, kept, width, elem, ALL_ROWS}
#define OWN(name, extent, kept, width, elem) {offsetof(Activations, name), extent, kept, width, elem, OWN_ROWS}
static const ActivationBuffer BUFFERS[] = {
    OWN(resid, RESIDUAL, KEPT_ALWAYS, W_C, E_DT),
    BUF(ln1, PER_BLOCK, KEPT_LN, W_C, E_DT),
    OWN(ln1_mean, PER_BLOCK, KEPT_LN, W_1, E_F32),
    OWN(ln1_rstd, PER_BLOCK, KEPT_LN, W_1, E_F32),
    BUF(qkv, PER_BLOCK, KEPT_MID, W_3CA, E_DT),
    BUF(atty, PER_BLOCK, KEPT_ATT, W_CA, E_DT),
    BUF(att_lse, PER_BLOCK, KEPT_ATT, W_NHA, E_F32),
    OWN(resid2, PER_BLOCK, KEPT_MID, W_C, E_DT),
    BUF(ln2, PER_BLOCK, KEPT_LN, W_C, E_DT),
    OWN(ln2_mean, PER_BLOCK, KEPT_LN, W_1, E_F32),
    OWN(ln2_rstd, PER_BLOCK, KEPT_LN, W_1, E_F32),
    BUF(fch, PER_BLOCK, KEPT_MID, W_4CA, E_DT),
    BUF(fch_gelu, PER_BLOCK, KEPT_GELU, W_4CA, E_DT),
    BUF(lnf, HEAD, KEPT_ALWAYS, W_C, E_DT),
    OWN(lnf_mean, HEAD, KEPT_ALWAYS, W_1, E_F32),
    OWN(lnf_rstd, HEAD, KEPT_ALWAYS, W_1, E_F32),
    BUF(logits, HEAD, KEPT_ALWAYS, W_VPA, E_DT),
    BUF(losses, HEAD, KEPT_ALWAYS, W_1, E_F32),
    BUF(vocab_stats, HEAD, KEPT_ALWAYS, W_VSTAT, E_F32),
    BUF(tokens, ENCODER, KEPT_ALWAYS, W_1, E_I32),
    BUF(targets, HEAD, KEPT_ALWAYS, W_1, E_I32),
    BUF(proj, WORK, KEPT_ALWAYS, W_C, E_DT),
    OWN(dresid, WORK, KEPT_ALWAYS, W_C, E_DT),
    BUF(dsmall, WORK, KEPT_ALWAYS, W_C, E_DT),
    BUF(dbig, WORK, KEPT_ALWAYS, W_4CA, E_DT),
    BUF(att_scratch, WORK, KEPT_ALWAYS, W_NHA, E_F32),
    OWN(dinput_out, UPSTREAM, KEPT_ALWAYS, W_C, E_DT),
};
#undef BUF
#undef OWN
#define NUM_ACTIVATION_BUFFERS (sizeof(BUFFERS) / sizeof(BUFFERS[0]))
_Static_assert(NUM_ACTIVATION_BUFFERS == sizeof(Activations) / sizeof(void*), "one BUFFERS row per Activations field");

static int kept_every_block(KeptBy kept, Keep k) {
    switch (kept) {
        case KEPT_LN: return k.ln;
        case KEPT_ATT: return k.att;
        case KEPT_GELU: return k.gelu;
        case KEPT_MID: return k.mid;
        default: return 1;
    }
}

// Each set has its own copy of what outlives the forward until that micro-batch's backward: the residual
// stream, the per-block tensors kept for every block, the token ids. The rest is shared by the sets.
static int per_set(const ActivationBuffer* b, Keep k) {
    return b->extent == RESIDUAL || b->extent == ENCODER || (b->extent == PER_BLOCK && kept_every_block(b->kept, k));
}

static size_t buffer_bytes(const ActivationBuffer* b, const ParamLayout* lay, DType dt, int B, int T, Keep k, int sp) {
    const GPTShape* s = &lay->shape;
    size_t L = (size_t)lay->num_blocks, C = (size_t)s->C;
    int head = lay->final_unit >= 0, enc = lay->emb_unit >= 0 && !lay->emb_mirror;
    size_t slices = b->extent == RESIDUAL ? L + 1 : b->extent == PER_BLOCK ? (kept_every_block(b->kept, k) ? L : 1)
                    : b->extent == HEAD ? (size_t)head : b->extent == ENCODER ? (size_t)enc
                    : b->extent == UPSTREAM ? (size_t)!enc : 1;
    size_t CA = (size_t)layout_attn_channels(lay);
    size_t width[] = {1, C, CA, 3 * CA, (size_t)layout_mlp_channels(lay), (size_t)layout_heads(lay),
                      (size_t)layout_vocab_rows(lay), lay->tp_size > 1 ? 1 + 3 * (size_t)lay->tp_size : 0};
    size_t elem = b->elem == E_DT ? dtype_size(dt) : 4;
    size_t rows = (size_t)B * (size_t)T / (b->rows == OWN_ROWS && sp ? (size_t)lay->tp_size : 1);
    return slices * rows * width[b->width] * elem;
}

static void** buffer_in(Activations* a, const ActivationBuffer* b) { return (void**)((char*)a + b->field); }

// The table names every field exactly once (the static assert checks only the count).
static void check_buffer_table(void) {
    int seen[NUM_ACTIVATION_BUFFERS] = {0};
    for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++) {
        size_t f = BUFFERS[i].field / sizeof(void*);
        if (BUFFERS[i].field % sizeof(void*) || f >= NUM_ACTIVATION_BUFFERS || seen[f]++)
            fail("internal: gpt.c's BUFFERS table names Activations field %zu twice or not at all", f);
    }
}

// The stash's fields (WeightGradStash, in order): elements of each over the stage's blocks.
#define NUM_STASH_FIELDS (sizeof(WeightGradStash) / sizeof(void*))
static void stash_elems(const ParamLayout* lay, int B, int T, int sp, size_t elems[NUM_STASH_FIELDS]) {
    size_t L = (size_t)lay->num_blocks, N = (size_t)B * (size_t)T, C = (size_t)lay->shape.C;
    size_t R = sp ? N / (size_t)lay->tp_size : N, CA = (size_t)layout_attn_channels(lay), CF = (size_t)layout_mlp_channels(lay);
    size_t per_block[NUM_STASH_FIELDS] = {N * C, N * CF, R * C, N * C, N * 3 * CA, R * C};
    for (size_t f = 0; f < NUM_STASH_FIELDS; f++) elems[f] = L * per_block[f];
}

size_t gpt_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int recompute, int num_sets, int num_stash,
                            int sp) {
    Keep k = keep_for(recompute);
    size_t total = 0, elems[NUM_STASH_FIELDS];
    for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++)
        total += buffer_bytes(&BUFFERS[i], lay, dt, B, T, k, sp) * (size_t)(per_set(&BUFFERS[i], k) ? num_sets : 1);
    stash_elems(lay, B, T, sp, elems);
    for (size_t f = 0; f < NUM_STASH_FIELDS; f++) total += elems[f] * dtype_size(dt) * (size_t)num_stash;
    return total;
}

void gpt_create(GPT* g, Backend* be, MemLedger* mem, const ParamLayout* layout, ParamStore store, Comm* tp, int sp, DType dt,
                int B, int T, int recompute, int num_sets, int num_stash, int micro) {
    memset(g, 0, sizeof(*g));
    int tp_ranks = tp ? comm_size(tp) : 1;
    if (tp_ranks != layout->tp_size) fail("internal: a layout for %d tensor ranks on a group of %d", layout->tp_size, tp_ranks);
    if (sp && (!tp || (B * T) % tp_ranks)) fail("internal: sequence parallelism over %d ranks for %d rows", tp_ranks, B * T);
    g->sp = sp && tp;
    g->rows = g->sp ? B * T / layout->tp_size : B * T;
    g->shape = layout->shape;
    g->layout = layout;
    g->store = store;
    g->tp = tp;
    g->dt = dt;
    g->B = B;
    g->T = T;
    g->recompute = recompute;
    if (num_sets < 1 || num_stash < 0) fail("internal: %d activation sets, %d stash slots on this stage", num_sets, num_stash);
    check_buffer_table();
    g->num_sets = num_sets;
    g->sets = (Activations*)xcalloc((size_t)num_sets, sizeof(Activations));
    Keep k = keep_for(recompute);
    for (int set = 0; set < num_sets; set++)
        for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++) {
            const ActivationBuffer* b = &BUFFERS[i];
            size_t bytes = buffer_bytes(b, layout, dt, B, T, k, g->sp);
            *buffer_in(&g->sets[set], b) = set > 0 && !per_set(b, k) ? *buffer_in(&g->sets[0], b)
                                           : bytes ? mem_alloc(be, mem, MEM_ACTIVATIONS, bytes) : NULL;
        }
    g->acts = g->sets[0];
    g->num_stash = num_stash;
    g->stash = (WeightGradStash*)xcalloc((size_t)(num_stash ? num_stash : 1), sizeof(WeightGradStash));
    size_t elems[NUM_STASH_FIELDS];
    stash_elems(layout, B, T, g->sp, elems);
    for (int slot = 0; slot < num_stash; slot++)
        for (size_t f = 0; f < NUM_STASH_FIELDS; f++)
            ((void**)&g->stash[slot])[f] = mem_alloc(be, mem, MEM_ACTIVATIONS, elems[f] * dtype_size(dt));
    if (gpt_has_encoder(g) || gpt_has_head(g)) batch_io_create(&g->io, be, B * T, micro);   // the only users
}

void gpt_destroy(GPT* g, Backend* be) {
    batch_io_destroy(&g->io, be);
    Keep k = keep_for(g->recompute);
    for (int set = 0; set < g->num_sets; set++)
        for (size_t i = 0; i < NUM_ACTIVATION_BUFFERS; i++) {
            void* buf = *buffer_in(&g->sets[set], &BUFFERS[i]);
            if (buf && (set == 0 || per_set(&BUFFERS[i], k))) be_free(be, buf);
        }
    for (int slot = 0; slot < g->num_stash; slot++)
        for (size_t f = 0; f < NUM_STASH_FIELDS; f++) be_free(be, ((void**)&g->stash[slot])[f]);
    free(g->stash);
    free(g->sets);
    memset(g, 0, sizeof(*g));
}

void* gpt_stage_input(GPT* g, int set) { return g->sets[set].resid; }
void* gpt_stage_output(GPT* g, int set) {
    return slice(g->sets[set].resid, (size_t)g->rows * g->shape.C, g->layout->num_blocks, g->dt);
}
void* gpt_boundary_grad(GPT* g) { return g->sets[0].dresid; }
size_t gpt_boundary_bytes(const GPT* g) { return (size_t)g->rows * g->shape.C * dtype_size(g->dt); }
void* gpt_grad_to_send(GPT* g, Backend* be) {
    if (!g->sets[0].dinput_out) fail("internal: gpt_grad_to_send on the stage with the embeddings");
    be_copy(be, g->sets[0].dinput_out, g->sets[0].dresid, gpt_boundary_bytes(g));
    return g->sets[0].dinput_out;
}

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
    const ParamLayout* lay = g->layout;
    size_t N = (size_t)g->B * g->T, R = (size_t)g->rows, C = (size_t)g->shape.C;
    size_t NCA = N * (size_t)layout_attn_channels(lay), NCF = N * (size_t)layout_mlp_channels(lay);
    size_t NNH = N * (size_t)layout_heads(lay);
    Keep k = keep_for(g->recompute);
    int ln = k.ln ? l : 0, att = k.att ? l : 0, gelu = k.gelu ? l : 0, mid = k.mid ? l : 0;
    BlockActs v = {slice(a->resid, R * C, l, dt), slice(a->ln1, N * C, ln, dt), slice(a->qkv, 3 * NCA, mid, dt),
                   slice(a->atty, NCA, att, dt), slice(a->resid2, R * C, mid, dt), slice(a->ln2, N * C, ln, dt),
                   slice(a->fch, NCF, mid, dt), slice(a->fch_gelu, NCF, gelu, dt), slice(a->resid, R * C, l + 1, dt),
                   fslice(a->ln1_mean, R, ln), fslice(a->ln1_rstd, R, ln), fslice(a->att_lse, NNH, att),
                   fslice(a->ln2_mean, R, ln), fslice(a->ln2_rstd, R, ln)};
    return v;
}

// ---------------------------------------------------------------------------------------------------
// Tensor parallelism (Megatron's f and g). A row-parallel projection leaves each rank a partial sum of the
// whole (N, C) output, and a column-parallel layer's backward a partial sum of its input's gradient; the
// tensor group adds them: an all-reduce, or with sequence parallelism a reduce-scatter that leaves each rank
// the sum of its own rows, the only ones the LayerNorms and residual adds between the parallel layers then
// compute. Their outputs are all-gathered before the next parallel layer needs every row. Without a tensor
// group all of this is nothing.

// This rank's first row in a buffer of all N rows (0 without sequence parallelism).
static size_t own_row(const GPT* g) { return g->sp ? (size_t)g->layout->tp_rank * g->rows : 0; }
static void* own_rows(const GPT* g, void* all) { return slice(all, (size_t)g->shape.C, (int)own_row(g), g->dt); }

// Adds the partial sums in `all` (N, C) over the tensor group; returns where this rank's rows of the sum are.
static void* sum_partials(GPT* g, void* all) {
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

// Every row of a tensor whose rows are split (-sp): this rank's rows copied into `all` (N, C), then gathered.
// Without sequence parallelism `mine` is already every row.
static void* gather_rows(GPT* g, Backend* be, void* all, const void* mine) {
    if (!g->sp) return (void*)mine;
    size_t n = (size_t)g->rows * g->shape.C;
    be_copy(be, own_rows(g, all), mine, n * dtype_size(g->dt));
    comm_allgather(g->tp, all, n, g->dt);
    return all;
}

// LayerNorm of this rank's rows of inp into `out`, which then holds every row (gathered under -sp).
static void norm_forward(GPT* g, Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w,
                         const void* b) {
    layernorm_forward(be, g->dt, own_rows(g, out), mean, rstd, inp, w, b, g->rows, g->shape.C);
    if (g->sp) comm_allgather(g->tp, out, (size_t)g->rows * g->shape.C, g->dt);
}

// LayerNorm backward over this rank's rows (dinp accumulates). Under -sp each rank's weight and bias
// gradients cover its rows only: they are made in scratch (dbig, free at every call site), summed over the
// tensor group, then added, so every copy of the LayerNorm gets the same gradient.
static void norm_backward(GPT* g, Backend* be, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                          const void* w, const float* mean, const float* rstd) {
    DType dt = g->dt;
    size_t C = (size_t)g->shape.C;
    if (!g->sp) {
        layernorm_backward(be, dt, dinp, dw, db, dout, inp, w, mean, rstd, g->rows, (int)C);
        return;
    }
    void* sdw = g->acts.dbig;
    void* sdb = slice(g->acts.dbig, C, 1, dt);
    be_memset0(be, sdw, 2 * C * dtype_size(dt));
    layernorm_backward(be, dt, dinp, sdw, sdb, dout, inp, w, mean, rstd, g->rows, (int)C);
    comm_allreduce_sum(g->tp, sdw, 2 * C, dt);
    residual_forward(be, dt, dw, dw, sdw, C);
    residual_forward(be, dt, db, db, sdb, C);
}

// A row-parallel projection's bias is added once, by tensor rank 0, before the sum; every rank still
// computes its gradient (the same on all), so every copy gets the same update.
static const void* row_bias(const GPT* g, const void* bias) { return g->layout->tp_rank == 0 ? bias : NULL; }

// Per rank: C the model's width, CA = C/tp attention channels in NH/tp heads, CF = 4C/tp MLP channels; N
// rows enter the parallel layers, R = g->rows (N, or N/tp under -sp) the regions between them.
typedef struct {
    int B, T, N, R, C, CA, CF, NH;
} BlockDims;

static BlockDims block_dims(const GPT* g) {
    const ParamLayout* lay = g->layout;
    BlockDims d = {g->B, g->T, g->B * g->T, g->rows, g->shape.C,
                   layout_attn_channels(lay), layout_mlp_channels(lay), layout_heads(lay)};
    return d;
}

// One transformer block: v.x -> v.out. A recomputation (full recompute level) stops before the MLP's
// output projection: the backward needs everything up to fch_gelu, and v.out is already in place.
static void block_forward(GPT* g, Backend* be, BlockParams p, BlockActs v, int recomputing) {
    DType dt = g->dt;
    BlockDims d = block_dims(g);
    size_t RC = (size_t)d.R * d.C;
    void* proj = g->acts.proj;
    norm_forward(g, be, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b);
    matmul_forward(be, dt, v.qkv, NULL, v.ln1, p.qkvw, p.qkvb, d.N, d.C, 3 * d.CA);
    attention_forward(be, dt, v.atty, v.att_lse, v.qkv, d.B, d.T, d.NH, d.NH, d.CA / d.NH);
    matmul_forward(be, dt, proj, NULL, v.atty, p.attprojw, row_bias(g, p.attprojb), d.N, d.CA, d.C);
    residual_forward(be, dt, v.resid2, v.x, sum_partials(g, proj), RC);
    norm_forward(g, be, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b);
    matmul_forward(be, dt, v.fch_gelu, v.fch, v.ln2, p.fcw, p.fcb, d.N, d.C, d.CF);
    if (recomputing) return;
    matmul_forward(be, dt, proj, NULL, v.fch_gelu, p.fcprojw, row_bias(g, p.fcprojb), d.N, d.CF, d.C);
    residual_forward(be, dt, v.out, v.resid2, sum_partials(g, proj), RC);
}

// Refills what the recompute level did not keep for layer l, with the same kernels as the forward, so the
// values are bit-identical to the ones the forward computed (on the CPU backend; cuBLASLt's fused GELU
// epilogue rounds differently from the separate GELU kernel).
static void block_recompute(GPT* g, Backend* be, BlockParams p, BlockActs v) {
    DType dt = g->dt;
    BlockDims d = block_dims(g);
    if (g->recompute >= 3) {
        block_forward(g, be, p, v, 1);
        return;
    }
    if (g->recompute >= 2) {
        norm_forward(g, be, v.ln1, v.ln1_mean, v.ln1_rstd, v.x, p.ln1w, p.ln1b);
        attention_forward(be, dt, v.atty, v.att_lse, v.qkv, d.B, d.T, d.NH, d.NH, d.CA / d.NH);
        norm_forward(g, be, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid2, p.ln2w, p.ln2b);
    }
    if (g->recompute >= 1) gelu_forward(be, dt, v.fch_gelu, v.fch, (size_t)d.N * d.CF);
}

// ---------------------------------------------------------------------------------------------------
// The block's backward is written once, as its layers' steps from the output back (block_backward), and
// run in one of three modes, so the fused backward and zb's split one cannot drift apart. A step is one
// layer: its op (matmul_step, norm_step, attention_step), where its output gradient comes from
// (grad_of_stream, grad_of_partials, or the step before's input gradient, grad_between), the stash field
// that keeps that gradient for W, its input, its weight and its parameter gradients. Each op is written
// once for the three modes and serves every block type; a new block type is a new list of steps.
typedef enum {
    BWD_FUSED,    // input and weight gradients together (gpt_backward)
    BWD_INPUT,    // zb's B: the input gradients; the output gradients the weight gradients need go to the stash
    BWD_WEIGHT,   // zb's W: the weight gradients, from the stash and the layer inputs still in the set
} BackwardMode;

typedef struct {
    GPT* g;
    Backend* be;
    BackwardMode mode;
    WeightGradStash stash;   // B and W: the block's slices of the micro-batch's stash slot
} BlockBackward;

// The output gradient of a parallel layer whose output joins the residual stream: every row of dresid
// (gathered into proj, free here, under -sp). B copies it into the stash: proj and dresid are reused before W.
static void* grad_of_stream(BlockBackward* c, void* stashed) {   // (N, C)
    GPT* g = c->g;
    if (c->mode == BWD_WEIGHT) return stashed;
    void* all = gather_rows(g, c->be, g->acts.proj, g->acts.dresid);
    if (c->mode == BWD_FUSED) return all;
    be_copy(c->be, stashed, all, (size_t)g->B * g->T * g->shape.C * dtype_size(g->dt));
    return stashed;
}

// A LayerNorm's output gradient: the tensor group's sum of the partial input gradients that the
// column-parallel layer after it left in dsmall. B copies it into the stash, as above.
static void* grad_of_partials(BlockBackward* c, void* stashed) {   // (R, C)
    GPT* g = c->g;
    if (c->mode == BWD_WEIGHT) return stashed;
    void* sum = sum_partials(g, g->acts.dsmall);
    if (c->mode == BWD_FUSED) return sum;
    be_copy(c->be, stashed, sum, (size_t)g->rows * g->shape.C * dtype_size(g->dt));
    return stashed;
}

// Where a step leaves the input gradient that the next step takes as its output gradient: scratch when
// fused; in B and W the stash field that keeps it for W, which B's kernel writes directly (no copy: the
// stash slot is this micro-batch's alone until its W).
static void* grad_between(BlockBackward* c, void* scratch, void* stashed) {
    return c->mode == BWD_FUSED ? scratch : stashed;
}

// A linear layer, out (N, OC) = inp (N, IC) . w^T + b. pre: when inp = gelu(pre), the input gradient is
// pre's (the GELU's backward fused in).
static void matmul_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* pre, const void* w,
                        void* dw, void* db, int IC, int OC) {
    Backend* be = c->be;
    DType dt = c->g->dt;
    int N = c->g->B * c->g->T;
    if (c->mode == BWD_FUSED) matmul_backward(be, dt, dinp, dw, db, dout, inp, pre, w, N, IC, OC);
    else if (c->mode == BWD_INPUT) matmul_backward_input(be, dt, dinp, dout, pre, w, N, IC, OC);
    else matmul_backward_weight(be, dt, dw, db, dout, inp, N, IC, OC);
}

// A LayerNorm of this rank's rows (dinp accumulates). Its kernel makes all three gradients at once, so B
// and W each run it and drop the other's into scratch, free here: B the parameter gradients (into dbig, not
// summed over the group), W the input gradient (into dsmall).
static void norm_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* w, const float* mean,
                      const float* rstd, void* dw, void* db) {
    GPT* g = c->g;
    size_t C = (size_t)g->shape.C;
    if (c->mode == BWD_FUSED) {
        norm_backward(g, c->be, dinp, dw, db, dout, inp, w, mean, rstd);
    } else if (c->mode == BWD_INPUT) {
        void* drop = g->acts.dbig;
        be_memset0(c->be, drop, 2 * C * dtype_size(g->dt));
        layernorm_backward(c->be, g->dt, dinp, drop, slice(drop, C, 1, g->dt), dout, inp, w, mean, rstd, g->rows, (int)C);
    } else {
        void* drop = g->acts.dsmall;
        be_memset0(c->be, drop, (size_t)g->rows * C * dtype_size(g->dt));
        norm_backward(g, c->be, drop, dw, db, dout, inp, w, mean, rstd);
    }
}

// Causal self-attention, out (N, CA) from qkv (N, 3CA): no parameters, so nothing for W.
static void attention_step(BlockBackward* c, void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse) {
    if (c->mode == BWD_WEIGHT) return;
    BlockDims d = block_dims(c->g);
    attention_backward(c->be, c->g->dt, dqkv, c->g->acts.att_scratch, dout, qkv, out, lse, d.B, d.T, d.NH, d.NH,
                       d.CA / d.NH);
}

// g->acts.dresid holds d(out) on entry and d(x) on exit (this rank's rows under -sp); parameter gradients
// accumulate into dp (B has none). dsmall and dbig carry the gradients between the steps.
static void block_backward(BlockBackward* c, BlockParams p, BlockParams dp, BlockActs v) {
    Activations* a = &c->g->acts;
    WeightGradStash s = c->stash;
    BlockDims d = block_dims(c->g);
    // MLP: out = resid2 + fcproj(gelu(fc(ln2(resid2)))); the residual passes dresid through.
    void* dfch = grad_between(c, a->dbig, s.dfch);   // (N, CF), before the GELU
    matmul_step(c, dfch, grad_of_stream(c, s.dfcproj), v.fch_gelu, v.fch, p.fcprojw, dp.fcprojw, dp.fcprojb, d.CF, d.C);
    matmul_step(c, a->dsmall, dfch, v.ln2, NULL, p.fcw, dp.fcw, dp.fcb, d.C, d.CF);
    norm_step(c, a->dresid, grad_of_partials(c, s.dln2), v.resid2, p.ln2w, v.ln2_mean, v.ln2_rstd, dp.ln2w, dp.ln2b);
    // Attention: resid2 = x + attproj(attention(qkv(ln1(x)))).
    void* dqkv = grad_between(c, a->dbig, s.dqkv);   // (N, 3CA)
    matmul_step(c, a->dsmall, grad_of_stream(c, s.dattproj), v.atty, NULL, p.attprojw, dp.attprojw, dp.attprojb, d.CA, d.C);
    attention_step(c, dqkv, a->dsmall, v.qkv, v.atty, v.att_lse);
    matmul_step(c, a->dsmall, dqkv, v.ln1, NULL, p.qkvw, dp.qkvw, dp.qkvb, d.C, 3 * d.CA);
    norm_step(c, a->dresid, grad_of_partials(c, s.dln1), v.x, p.ln1w, v.ln1_mean, v.ln1_rstd, dp.ln1w, dp.ln1b);
}

// Block l's slices (l counts the stage's blocks) of stash slot `slot`.
static WeightGradStash stash_of_block(GPT* g, int slot, int l) {
    if (slot < 0 || slot >= g->num_stash) fail("internal: stash slot %d of %d", slot, g->num_stash);
    size_t elems[NUM_STASH_FIELDS];
    stash_elems(g->layout, g->B, g->T, g->sp, elems);
    WeightGradStash w = g->stash[slot];
    for (size_t f = 0; f < NUM_STASH_FIELDS; f++)
        ((void**)&w)[f] = slice(((void**)&w)[f], elems[f] / (size_t)g->layout->num_blocks, l, g->dt);
    return w;
}

// ---------------------------------------------------------------------------------------------------
// The vocabulary-parallel embedding, LM head and cross-entropy (Megatron's). Under -tp each rank holds wte's
// vocabulary rows [v0, v0 + Vl) (layout_vocab_*), so the logits (N, Vl) are its columns of the whole (N, Vp)
// and no rank ever holds a whole row: the embedding is a sum over the group, the softmax's max, normalizer
// and target logit are all-reduced row scalars, and the head's input gradient a sum of partial products.

void gpt_logits_to_host(GPT* g, Backend* be, int first, int rows, float* out) {
    const ParamLayout* lay = g->layout;
    int V = g->shape.V, Vl = layout_vocab_rows(lay), v0 = layout_vocab_first(lay), real = layout_vocab_real(lay);
    size_t x = dtype_size(g->dt);
    char* raw = (char*)xmalloc((size_t)rows * Vl * x);
    be_download(be, raw, (char*)g->acts.logits + (size_t)first * Vl * x, (size_t)rows * Vl * x);
    if (!g->tp) {
        for (int n = 0; n < rows; n++) host_from_dtype(out + (size_t)n * V, raw + (size_t)n * Vl * x, g->dt, (size_t)V);
        free(raw);
        return;
    }
    // Each rank adds its columns into zeros: every value is one rank's plus exact zeros.
    float* mine = (float*)xmalloc((size_t)(real ? real : 1) * sizeof(float));
    double* row = (double*)xmalloc((size_t)V * sizeof(double));
    for (int n = 0; n < rows; n++) {
        host_from_dtype(mine, raw + (size_t)n * Vl * x, g->dt, (size_t)real);
        for (int v = 0; v < V; v++) row[v] = v >= v0 && v < v0 + real ? (double)mine[v - v0] : 0.0;
        comm_allreduce_host_sum(g->tp, row, V);
        for (int v = 0; v < V; v++) out[(size_t)n * V + v] = (float)row[v];
    }
    free(row);
    free(mine);
    free(raw);
}

// The embedding of every token into acts.resid (this rank's rows under -sp). Under -tp each rank embeds the
// tokens of its vocabulary rows (zeros for the others; wpe added by rank 0 only) into every row, and the
// group adds them: x + 0 is exact, so the sum has encoder_forward's bits in fp32.
static void embed(GPT* g, Backend* be, EmbeddingParams emb) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    size_t NC = (size_t)g->B * g->T * g->shape.C;
    if (!g->tp) {
        encoder_forward(be, g->dt, a->resid, a->tokens, emb.wte, emb.wpe, g->B, g->T, g->shape.C);
        return;
    }
    void* all = g->sp ? a->proj : a->resid;   // (N, C); proj is free before the first block
    encoder_forward_vocab(be, g->dt, all, a->tokens, emb.wte, lay->tp_rank == 0 ? emb.wpe : NULL, layout_vocab_first(lay),
                          layout_vocab_rows(lay), g->B, g->T, g->shape.C);
    if (g->sp) comm_reduce_scatter_sum(g->tp, a->resid, all, (size_t)g->rows * g->shape.C, g->dt);
    else comm_allreduce_sum(g->tp, all, NC, g->dt);
}

// The embedding's backward from d(input of the first block) (every row, gathered under -sp): each rank
// scatters into its own vocabulary rows only; wpe's gradient is whole on every rank.
static void embed_backward(GPT* g, Backend* be, EmbeddingParams demb, const void* dout) {
    const ParamLayout* lay = g->layout;
    if (!g->tp) encoder_backward(be, g->dt, demb.wte, demb.wpe, dout, g->acts.tokens, g->B, g->T, g->shape.C);
    else encoder_backward_vocab(be, g->dt, demb.wte, demb.wpe, dout, g->acts.tokens, layout_vocab_first(lay),
                                layout_vocab_rows(lay), g->B, g->T, g->shape.C);
}

// The cross-entropy over this rank's logits columns, in three steps with the group's max and sums between
// (kernels.h); every rank ends with the same losses and its own columns' dlogits.
static void vocab_cross_entropy(GPT* g, Backend* be, const int* targets, float dloss) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    int N = g->B * g->T, V = g->shape.V, v0 = layout_vocab_first(lay), Vl = layout_vocab_rows(lay);
    int real = layout_vocab_real(lay);
    for (int n = 0; n < N; n++)   // each kernel sees only its columns, so the range is checked here
        if (targets[n] < 0 || targets[n] >= V) fail("classifier: target %d at row %d outside [0, %d)", targets[n], n, V);
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

// The LM head and the loss: final LayerNorm, logits = lnf . wte^T, then (with targets) the cross-entropy.
static void head_forward(GPT* g, Backend* be, const int* targets, float dloss, float* logits_dump) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    DType dt = g->dt;
    int N = g->B * g->T, C = g->shape.C, fin = final_norm_unit(lay);
    EmbeddingParams emb = embedding_params(lay, store_params(&g->store, be, lay->emb_unit), dt);
    FinalNormParams fn = final_norm_params(lay, store_params(&g->store, be, fin), dt);
    void* out = slice(a->resid, (size_t)g->rows * C, lay->num_blocks, dt);
    norm_forward(g, be, a->lnf, a->lnf_mean, a->lnf_rstd, out, fn.lnfw, fn.lnfb);
    // Tied LM head: (N, Vp/tp) = lnf . (this rank's wte rows)^T.
    matmul_forward(be, dt, a->logits, NULL, a->lnf, emb.wte, NULL, N, C, layout_vocab_rows(lay));
    store_params_done(&g->store, fin);
    store_params_done(&g->store, lay->emb_unit);
    if (logits_dump) gpt_logits_to_host(g, be, 0, N, logits_dump);
    if (!targets) return;
    batch_io_upload(&g->io, be, a->targets, targets);
    batch_io_before_losses(&g->io, be);
    if (g->tp) vocab_cross_entropy(g, be, targets, dloss);
    else classifier_forward(be, dt, a->logits, a->losses, a->targets, N, g->shape.V, g->shape.Vp, dloss, dloss != 0.0f);
    batch_io_queue_losses(&g->io, be, a->losses);
}

double gpt_take_losses(GPT* g, Backend* be) { return batch_io_take_losses(&g->io, be); }

void gpt_forward(GPT* g, Backend* be, int set, const int* tokens, const int* targets, float dloss, float* logits_dump) {
    const ParamLayout* lay = g->layout;
    DType dt = g->dt;
    use_set(g, set);
    Activations* a = &g->acts;
    if (gpt_has_encoder(g)) {
        batch_io_upload(&g->io, be, a->tokens, tokens);
        EmbeddingParams emb = embedding_params(lay, store_params(&g->store, be, lay->emb_unit), dt);
        embed(g, be, emb);
        if (!gpt_has_head(g)) store_params_done(&g->store, lay->emb_unit);
    }
    for (int i = 0; i < lay->num_blocks; i++) {
        int l = lay->first_block + i, u = unit_of_block(lay, l);
        block_forward(g, be, block_params(lay, store_params(&g->store, be, u), l, dt), block_acts(g, i), 0);
        store_params_done(&g->store, u);
    }
    if (gpt_has_head(g)) head_forward(g, be, targets, dloss, logits_dump);
}

// dlogits -> the gradient of the last block's output, in acts.dresid; wte's and the final LayerNorm's
// gradients accumulate. The embedding gradient buffer stays live for the encoder on a one-stage run.
static void head_backward(GPT* g, Backend* be) {
    const ParamLayout* lay = g->layout;
    Activations* a = &g->acts;
    const ParamStore* ps = &g->store;
    DType dt = g->dt;
    int N = g->B * g->T, C = g->shape.C, fin = final_norm_unit(lay);
    EmbeddingParams emb = embedding_params(lay, store_params(ps, be, lay->emb_unit), dt);
    EmbeddingParams demb = embedding_params(lay, store_grads(ps, be, lay->emb_unit), dt);
    FinalNormParams fn = final_norm_params(lay, store_params(ps, be, fin), dt);
    FinalNormParams dfn = final_norm_params(lay, store_grads(ps, be, fin), dt);
    // The backward needs the last block next: a store that gathers may start now, while the head computes.
    store_prefetch(ps, be, unit_of_block(lay, lay->first_block + lay->num_blocks - 1));
    void* out = slice(a->resid, (size_t)g->rows * C, lay->num_blocks, dt);
    // (N, C) d(lnf): under -tp a partial product over this rank's vocabulary columns, which the group adds
    // (a reduce-scatter into each rank's rows under -sp), like a row-parallel projection's output.
    matmul_backward(be, dt, a->dsmall, demb.wte, NULL, a->logits, a->lnf, NULL, emb.wte, N, C, layout_vocab_rows(lay));
    be_memset0(be, a->dresid, (size_t)g->rows * C * dtype_size(dt));   // layernorm_backward accumulates into it
    norm_backward(g, be, a->dresid, dfn.lnfw, dfn.lnfb, sum_partials(g, a->dsmall), out, fn.lnfw, a->lnf_mean, a->lnf_rstd);
    store_grads_done(ps, be, fin);
    store_params_done(ps, fin);
    if (!gpt_has_encoder(g)) {
        store_grads_done(ps, be, lay->emb_unit);
        store_params_done(ps, lay->emb_unit);
    }
}

// The backward walk: the head, the blocks from the last, the embeddings. W walks the blocks only (the
// head's and the embeddings' gradients are B's: small, or on the stage that runs W at once), in the same
// order, so a store that gathers (ZeRO-3) prefetches as it does there, and asks for the parameters too:
// the recompute levels refill what B refilled, and the LayerNorm kernel takes its weight. slot: B's and
// W's stash slot.
static void backward_walk(GPT* g, Backend* be, int set, BackwardMode mode, int slot) {
    const ParamLayout* lay = g->layout;
    const ParamStore* ps = &g->store;
    DType dt = g->dt;
    use_set(g, set);
    Activations* a = &g->acts;
    if (mode != BWD_WEIGHT && gpt_has_head(g)) head_backward(g, be);
    for (int i = lay->num_blocks - 1; i >= 0; i--) {
        int l = lay->first_block + i, u = unit_of_block(lay, l), weights = mode != BWD_INPUT;
        BlockParams p = block_params(lay, store_params(ps, be, u), l, dt);   // one request (a gather) serves both
        BlockActs v = block_acts(g, i);
        block_recompute(g, be, p, v);
        BlockBackward c = {.g = g, .be = be, .mode = mode};
        if (mode != BWD_FUSED) c.stash = stash_of_block(g, slot, i);
        block_backward(&c, p, weights ? block_params(lay, store_grads(ps, be, u), l, dt) : (BlockParams){0}, v);
        if (weights) store_grads_done(ps, be, u);
        store_params_done(ps, u);
    }
    if (mode == BWD_WEIGHT || !gpt_has_encoder(g)) return;
    EmbeddingParams demb = embedding_params(lay, store_grads(ps, be, lay->emb_unit), dt);   // still live with the head
    embed_backward(g, be, demb, gather_rows(g, be, a->proj, a->dresid));
    store_grads_done(ps, be, lay->emb_unit);
    store_params_done(ps, lay->emb_unit);
}

void gpt_backward(GPT* g, Backend* be, int set) { backward_walk(g, be, set, BWD_FUSED, -1); }
void gpt_backward_input(GPT* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_INPUT, slot); }
void gpt_backward_weight(GPT* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_WEIGHT, slot); }
