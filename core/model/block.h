// block.h: a family's transformer block as the walk (walk.c) runs it. A family gives its block's activation
// table, its forward (also used to recompute), what each recompute level refills, and its backward as a list
// of steps; this header gives the steps those are written in. Every step is one layer (a matmul, a norm,
// attention) with tensor parallelism built in (Megatron's f and g, sequence parallelism's gathers) and, for
// the backward, written once for the three modes, so the fused backward and zero-bubble's split one cannot
// drift apart and a new block type is a new list of steps, not new modes.
#pragma once
#include "core/model/walk.h"

// ---- the activation table --------------------------------------------------------------------------
// Elements per token of a buffer. The walk's own widths: 1, C, and for the generic steps' scratch the
// rank's query heads NH/tp (W_NHA) and a copied kv head's k|v (W_KVA_COPIED: 2 D, 0 unless the model has
// fewer kv heads than tensor ranks); the head's: VPA, the rank's vocabulary columns (Vp/tp), and VSTAT,
// 1 + 3 tp under -tp (the vocabulary-parallel cross-entropy's row max and every rank's row sums), 0 without;
// under -cp the exchanged q|k|v and attention output, and the work buffers, per token row (context_width), 0
// without.
// A family numbers its own widths from W_FAMILY and gives their sizes in BlockOps.width.
typedef int Width;
enum { W_1, W_C, W_NHA, W_KVA_COPIED, W_VPA, W_VSTAT, W_CP_QKV, W_CP_ATT, W_CP_SEND, W_CP_RECV, W_FAMILY };
// Which recompute levels keep a block's tensor for every block (the others hold one slot that the forward
// overwrites block after block and the backward refills): norms and attention below -r 2, the MLP's
// activation below -r 1, everything inside the block but its input below -r 3. SCRATCH: one slot the
// blocks and the activation sets share (a gradient between two steps).
typedef enum { KEPT_ALWAYS, KEPT_NORM, KEPT_ATT, KEPT_ACT, KEPT_MID, SCRATCH } KeptBy;
typedef enum { E_DT, E_F32, E_I32 } Elem;   // the run's dtype, fp32, int32
typedef enum { ALL_ROWS, OWN_ROWS } Rows;   // OWN_ROWS: this rank's N / tp under sequence parallelism

typedef struct {
    const char* name;
    KeptBy kept;
    Width width;
    Elem elem;
    Rows rows;
} BlockBuffer;

// zb's stash: what a deferred weight-gradient pass (W) needs from its input-gradient pass (B) for each of the
// stage's blocks: the gradients w.r.t. the outputs of the block's parameterized layers.
typedef struct {
    const char* name;
    Width width;
    Rows rows;
} StashField;

// Elements per token of `w` in this layout (0 for W_VSTAT without -tp; a family's: BlockOps.width).
size_t width_elems(const ParamLayout* lay, Width w);
// Block l's (l counts the stage's blocks) slice of block buffer `i`: its own where the recompute level keeps
// the buffer for every block, the shared slot otherwise. As fp32 for the statistics.
void* block_buffer(Model* g, int i, int l);
// The same for a buffer that recompute never drops: the residual stream's block l (0: the stage's input).
void* residual_at(Model* g, int l);
// Under -cp, block l's exchanged q|k|v and attention output (walk.h), kept as -r keeps q|k|v and attention.
void* context_qkv_heads(Model* g, int l);
void* context_att_heads(Model* g, int l);

// ---- the forward's steps -------------------------------------------------------------------------------
// Per rank: C the model's width, CA attention channels in NH query and KV key/value heads of D, CF the MLP's
// hidden width; N rows enter the parallel layers, R = g->rows (N, or N/tp under -sp) the regions between.
typedef struct {
    int B, T, N, R, C, CA, CF, NH, KV, D;
} BlockDims;
BlockDims block_dims(const Model* g);

// The family's norm (ModelFamily.norm) of this rank's rows of inp into `out`, which then holds every row
// (gathered under -sp). mean: LayerNorm's (RMSNorm has none: NULL); b: LayerNorm's bias.
void norm_forward(Model* g, Backend* be, void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b);
// Its backward over this rank's rows (dinp accumulates); under -sp the parameter gradients of every rank's
// rows are summed over the tensor group first, so every copy of the norm gets the same gradient.
void norm_backward(Model* g, Backend* be, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                   const float* mean, const float* rstd);
// Adds the partial sums in `all` (N, C) over the tensor group; returns where this rank's rows of the sum are.
void* sum_partials(Model* g, void* all);
// Every row of a tensor whose rows are split (-sp): `mine` copied into `all` (N, C), then gathered. Without
// sequence parallelism `mine` is already every row.
void* gather_rows(Model* g, Backend* be, void* all, const void* mine);
// A row-parallel projection's bias, added once, by tensor rank 0, before the sum (NULL on the others).
const void* row_bias(const Model* g, const void* bias);
// Causal self-attention of the rank's rows, out (N, CA) and lse from qkv (N, (NH+2KV)D), as attention_forward;
// under -cp across the context group (context_parallel.h), for the stage's block `index`. The refill is
// -r 2's recompute, from the q|k|v that level keeps.
void attention_forward_step(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv);
void attention_refill_step(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv);

// ---- the backward's steps ----------------------------------------------------------------------------
typedef enum {
    BWD_FUSED,    // input and weight gradients together (model_backward)
    BWD_INPUT,    // zb's B: the input gradients; the output gradients the weight gradients need go to the stash
    BWD_WEIGHT,   // zb's W: the weight gradients, from the stash and the layer inputs still in the set
} BackwardMode;

typedef struct {
    Model* g;
    Backend* be;
    BackwardMode mode;
    int index;               // the stage's block being differentiated (BlockRef.index)
    WeightGradStash stash;   // B and W: the block's slices of the micro-batch's stash slot
} BlockBackward;

// A step's output gradient. grad_of_stream: a parallel layer whose output joins the residual stream: every
// row of dresid. grad_of_partials: a norm's, the tensor group's sum of the partial input gradients the
// column-parallel layer after it left in dsmall. grad_between: where a step leaves the input gradient the
// next step takes: scratch when fused; in B and W the stash field that keeps it for W. In B the first two
// copy into the stash field (their sources are reused before W); in W all three read it.
void* grad_of_stream(BlockBackward* c, void* stashed);     // (N, C)
void* grad_of_partials(BlockBackward* c, void* stashed);   // (R, C)
void* grad_between(BlockBackward* c, void* scratch, void* stashed);
// A linear layer, out (N, OC) = inp (N, IC) . w^T + b. pre: when inp = gelu(pre), the input gradient is
// pre's (the GELU's backward fused in).
void matmul_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* pre, const void* w, void* dw,
                 void* db, int IC, int OC);
// The column-parallel q|k|v projection (OC = (NH + 2 KV) D per rank) as matmul_step, but when the model has
// fewer kv heads than tensor ranks the copies of a kv head sum their gradients w.r.t. it (into dqkv itself)
// before the weight gradient, so every copy is updated by the whole head's gradient and they stay equal.
void qkv_matmul_step(BlockBackward* c, void* dinp, void* dqkv, const void* inp, const void* w, void* dw, void* db);
// A norm of this rank's rows (dinp accumulates).
void norm_step(BlockBackward* c, void* dinp, const void* dout, const void* inp, const void* w, const float* mean,
               const float* rstd, void* dw, void* db);
// Causal self-attention's backward (under -cp through the context group): no parameters, so nothing for W.
void attention_step(BlockBackward* c, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse);

// ---- a family's block ----------------------------------------------------------------------------------
// One block of the stage: its index among the stage's blocks, its layer, its parameters and (backward
// with weight gradients) their gradients, each the base of the block's unit.
typedef struct {
    int index, layer;
    void* params;
    void* grads;
} BlockRef;

struct BlockOps {
    int num_buffers;
    const BlockBuffer* buffers;   // the block's activations, each stacked over the stage's blocks
    int num_stash;
    const StashField* stash;
    Width work[2];                // dbig's width: the wider of the two (the widest gradient between two steps)
    // Elements per token of the family's widths (w >= W_FAMILY) in this layout: one rank's share under -tp.
    size_t (*width)(const ParamLayout* lay, Width w);
    // Constant fp32 tables the block reads (RoPE's inverse frequencies): their count, and (out != NULL)
    // their values, uploaded once into Model.constants. NULL: none.
    size_t (*constants)(const ModelShape* s, float* out);
    // b's input is residual_at(index), its output residual_at(index + 1). A recomputation (the whole-block
    // level) may stop before the last layer, whose output is already in place.
    void (*forward)(Model* g, Backend* be, const BlockRef* b, int recomputing);
    // Refills what -r 1 and -r 2 did not keep, with the forward's kernels, so the values are the forward's
    // bits. (-r 3 keeps only the block's input: the walk runs forward with recomputing set instead.)
    void (*recompute)(Model* g, Backend* be, const BlockRef* b);
    // dresid holds d(output) on entry and d(input) on exit; gradients accumulate into b->grads (B has none).
    void (*backward)(BlockBackward* c, const BlockRef* b);
};

// ---- the model's ends: the embedding, the LM head and the loss ------------------------------------------
// The defaults, which a family without an EndOps hook gets: the vocabulary-parallel lookup of kind
// ModelFamily.wte; the final norm (final_w, final_b) and a linear head over the vocabulary (wte when tied,
// else ModelFamily.head); the cross-entropy. They are written in the steps below, as a family's own are.

// The two units the head reads (their parameters, or their gradients): the final unit, and the unit holding
// the LM head's matrix (the embedding unit when tied, else the final unit itself).
typedef struct {
    void *final, *head;
} HeadUnits;

struct EndOps {
    // acts.tokens -> residual_at(g, 0) (this rank's rows under -sp), from the embedding unit's parameters.
    void (*embed)(Model* g, Backend* be, void* params);
    // Its backward from d(first block's input), `dout` (every row); gradients accumulate into `grads`.
    void (*embed_backward)(Model* g, Backend* be, void* grads, const void* dout);
    // The last block's output -> acts.logits, keeping what head_backward reads (acts.lnf, its statistics).
    void (*head)(Model* g, Backend* be, HeadUnits params);
    // dlogits (in acts.logits) -> acts.dresid, this rank's rows; the head's gradients accumulate.
    void (*head_backward)(Model* g, Backend* be, HeadUnits params, HeadUnits grads);
    // acts.logits and the targets (host; acts.targets on the device) -> acts.losses; dloss != 0: dlogits
    // (d(dloss * mean loss)) replace the logits.
    void (*loss)(Model* g, Backend* be, const int* targets, float dloss);
};

// The walk's calls: the family's hook, or the default.
void ends_embed(Model* g, Backend* be, void* params);
void ends_embed_backward(Model* g, Backend* be, void* grads);   // from acts.dresid, the embeddings' output gradient
void ends_head(Model* g, Backend* be, HeadUnits params);
void ends_head_backward(Model* g, Backend* be, HeadUnits params, HeadUnits grads);
void ends_loss(Model* g, Backend* be, const int* targets, float dloss);

// The steps. The vocabulary-parallel token embedding (Megatron's): under -tp each rank holds wte's rows
// [v0, v0 + Vp/tp) (layout_vocab_*), embeds the tokens among them, and the tensor group adds the ranks'
// rows. pos: a table of learned position embeddings (maxT, C) added to it (by tensor rank 0), or NULL.
void embed_step(Model* g, Backend* be, const void* wte, const void* pos);
// Its backward: each rank scatters into its own vocabulary rows; dpos (or NULL) is whole on every rank.
void embed_backward_step(Model* g, Backend* be, void* dwte, void* dpos, const void* dout);
// The final norm of the last block's output into acts.lnf, then logits (N, Vp/tp) = lnf . head^T over this
// rank's vocabulary rows of `head`; and the backward of both into acts.dresid.
void lm_head_step(Model* g, Backend* be, const void* norm_w, const void* norm_b, const void* head);
void lm_head_backward_step(Model* g, Backend* be, const void* norm_w, const void* head, void* dnorm_w, void* dnorm_b, void* dhead);
// The cross-entropy over the logits (under -tp over this rank's columns, with the group's max and sums).
void cross_entropy_step(Model* g, Backend* be, const int* targets, float dloss);
