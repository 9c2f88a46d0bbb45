// walk.h: a model of any family (family.h) on a backend: its parameter buffers, activations, and the
// forward/backward walk over units. The embedding, the LM head and the loss are the family's or the
// defaults (block.h: EndOps, in ends.c); each block is its family's (block.h). Everything is expressed in
// kernels.h calls, so it is the same on the CPU and the GPU.
#pragma once
#include "core/model/act_offload.h"
#include "core/model/batch_io.h"
#include "core/comm/comm.h"
#include "core/model/memory.h"
#include "core/model/model.h"
#include "core/model/param_store.h"

// Saved activations for one micro-batch of B x T tokens (N = B*T rows): the walk's own, named here, and
// the family's block's (block.h), stacked over the stage's blocks or one slot, as its table says.
#define MAX_BLOCK_BUFFERS 16
#define MAX_STASH_FIELDS 8
typedef struct {
    void* resid;       // (L+1, N, C)  rows; resid[l] = input of block l; resid[L] = output of the last block
                       // (L here and below: the stage's blocks, block l = the stage's l-th); with
                       // -offload-act (2, N, C): resid[0] and resid[L], the others in host memory
                       // (act_offload.h; residual_at finds each)
    // With tensor parallelism (-tp) everything of width C is whole on every rank, except that with sequence
    // parallelism (-sp) resid, dresid and the norms' statistics hold only this rank's N/tp rows (marked
    // "rows"), and lnf is gathered from every rank's rows.
    void* lnf;         // (N, C)
    float* lnf_mean;   // (N)          rows (LayerNorm)
    float* lnf_rstd;   // (N)          rows
    void* logits;      // (N, Vp/tp)   this rank's vocabulary columns; overwritten by dlogits in training
    float* losses;     // (N)
    float* vocab_stats;  // (1 + 3 tp, N)  -tp: the cross-entropy's row max, then every rank's sums; else NULL
    int* tokens;       // (N)
    int* targets;      // (N)
    // Work buffers: projections before the residual add, and the backward's gradients.
    void* proj;        // (N, C)   a partial sum before the tensor group adds it; -sp: a gathered gradient too
    void* dresid;      // (N, C)   rows; gradient of the residual stream, carried down the blocks
    void* dsmall;      // (N, C)
    void* dbig;        // (N, work)  the widest gradient between two of the block's steps (BlockOps.work);
                       //            -sp: between them, a norm's parameter gradients
    float* att_scratch;  // (B, NH/tp, T)
    void* dkv_copied;  // (N, 2 D)  a kv head's gradient, summed over its copies (kv heads fewer than -tp)
    void* dinput_out;  // (N, C)   rows; d(input) on its way upstream (a stage without the embeddings)
    // Context parallelism (-cp N, context_parallel.h; NULL without): q|k|v and attention's output in the
    // exchanged layout, (B, N T, this rank's heads), per block as -r keeps q|k|v and attention; the exchange's
    // send and receive buffers.
    void* qkv_heads;   // (N, W_CP_QKV)
    void* att_heads;   // (N, W_CP_ATT)
    void* cp_send;     // (N, W_CP_SEND)  Ulysses: q|k|v's width; the ring: its packed q, out, dout, dq
    void* cp_recv;     // (N, W_CP_RECV)  Ulysses: as cp_send; the ring: two k|v chunk buffers and their d(k|v)
    void* block[MAX_BLOCK_BUFFERS];   // the family's BlockOps.buffers
    // Documents (kernels.h): each token's position in its document and the row index of its document's first
    // token, (N) ints of the set's micro-batch; NULL: each row is one document from slot 0 (today's kernels).
    // Under -cp pos is the rank's rows' and doc what its attention reads (context_doc_width).
    int* pos;
    int* doc;
    // Whether the set's forward was a training one (model_forward_training) and its micro-batch's position: the
    // backward and the recomputations draw the forward's dropout masks.
    int training;
    long long position;
} Activations;

// A micro-batch's host inputs: tokens (read by the stage with the embeddings), targets (by the stage with the
// head; NULL: logits only; -1: not a label), and pos and doc (every stage; NULL: each row one document; under
// -cp doc holds the whole rows, context_upload_documents).
typedef struct {
    const int* tokens;
    const int* targets;
    const int* pos;
    const int* doc;
} MicroBatch;

// zb's stash (block.h: StashField): per field, the stage's blocks' slices (L, N or R, width).
typedef struct {
    void* field[MAX_STASH_FIELDS];
} WeightGradStash;

typedef struct {
    ModelShape shape;
    const ParamLayout* layout;   // this rank's units: the whole model, or a pipeline stage's (model.h)
    DType dt;
    int B, T;
    ParamStore store;    // where each unit's parameters and gradients live (param_store.h)
    Comm* tp;            // the tensor group (grid.h), NULL without tensor parallelism
    Comm* kv_copies;     // the tensor ranks holding copies of this rank's kv head (grid.h), or NULL
    Comm* cp;            // the context group (grid.h), NULL without context parallelism; T is then this
                         // rank's share of each sequence, t / cp positions from cp_pos's first
    int* cp_pos;         // (B*T) every token's position in its sequence, under -cp (NULL without)
    int sp;              // sequence parallelism: the regions outside the tensor-parallel layers split by rows
    int rows;            // rows of the "rows" buffers: N, or N / tp with sp
    const BlockOps* ops; // the family's block
    float* constants;    // its constant tables (BlockOps.constants), or NULL
    int recompute;       // 0 keep everything; 1 recompute the MLP's activation; 2 + attention and norms; 3 whole blocks
    ActOffload inputs;   // -offload-act: the blocks' inputs that -r 3 keeps, in host memory (act_offload.h)
    int num_sets;        // activation sets: micro-batches whose forward is done and backward is not (1F1B)
    Activations* sets;   // [num_sets]: the tensors kept per layer are each set's own; the single slots that
                         // recompute refills, the work buffers and the head's buffers are shared
    Activations acts;    // the set of the forward/backward under way
    int num_stash;       // zb's deferred weight gradients at once (0 without zb)
    WeightGradStash* stash;   // [num_stash]
    BatchIO io;          // tokens and targets up, losses down, without stopping the main stream
    int* doc_arrays;     // model_use_documents: [num_sets] x (pos: N ints, doc: context_doc_width N); NULL: none
    struct {
        void *h, *dh, *block, *wide, *dropped, *scale;
    } lora;              // LoRA's work buffers (lora_steps.h); NULL without LoRA (dropped: without dropout)
} Model;

// What the stage runs (the whole model without a pipeline): the embedding lookup, the LM head and loss.
static inline int model_has_encoder(const Model* g) { return g->layout->emb_unit >= 0 && !g->layout->emb_mirror; }
static inline int model_has_head(const Model* g) { return g->layout->final_unit >= 0; }

// Allocates num_sets activation sets and num_stash weight-gradient stash slots for micro-batches of B x T
// over the layout's blocks; parameters and gradients come from `store`. The LM head's buffers (logits) are
// one, shared by the sets: the schedule runs each of that stage's backwards before its next forward.
// micro: the micro-batches of a step, whose losses wait in page-locked slots until the step reads them.
// cp: the context group (layout->cp_size ranks) or NULL; T is then this rank's t / cp positions of each row.
// offload_act: -offload-act (with recompute 3), the inner blocks' inputs in host memory.
void model_create(Model* g, Backend* be, MemLedger* mem, const ParamLayout* layout, ParamStore store, Comm* tp, Comm* kv_copies,
                  Comm* cp, int sp, DType dt, int B, int T, int recompute, int offload_act, int num_sets, int num_stash, int micro);
void model_destroy(Model* g, Backend* be);
// Micro-batches with documents (MicroBatch.pos/doc) will come: each activation set gets device pos and doc
// arrays, and a stage without the embeddings or the head an upload ring too (every block's attention reads them).
void model_use_documents(Model* g, Backend* be, MemLedger* mem);
// The bytes model_use_documents allocated (activations no -r level saves; 0 without documents).
size_t model_document_bytes(const Model* g);
// Activation bytes model_create allocates (for the memory plan), in backend and in host memory; T as
// model_create's.
size_t model_activation_bytes(const ParamLayout* layout, DType dt, int B, int T, int recompute, int offload_act, int num_sets,
                              int num_stash, int sp);
size_t model_host_activation_bytes(const ParamLayout* layout, DType dt, int B, int T, int offload_act, int num_sets, int sp);

// Forward of one micro-batch of B x T tokens into activation set `set`. The first stage embeds `tokens`
// (host ints, free again on return); a later stage starts from model_stage_input(g, set), which the caller
// has filled. The stage with the head, given targets, leaves per-token losses in acts.losses and queues
// their download (model_take_losses); if dloss != 0 the logits are replaced by dlogits scaled by dloss, ready
// for model_backward. Without targets: logits only. logits_dump (host, N x V floats) receives the logits
// before the loss when not NULL. The host waits for the device only for logits_dump and when an upload
// slot comes round again (batch_io.h: for the upload issued four before, so a stage with the embeddings
// and the head, two uploads per forward, queues at most about two micro-batches ahead of the device).
void model_forward(Model* g, Backend* be, int set, const MicroBatch* mb, float dloss, float* logits_dump);
// model_forward of a training micro-batch: LoRA's dropout (-lora-dropout) is on, its masks drawn at `position`, the
// micro-batch's place in the data order (dataloader_position). model_forward (validation, evaluation,
// generation) drops nothing.
void model_forward_training(Model* g, Backend* be, int set, const MicroBatch* mb, long long position, float dloss,
                            float* logits_dump);
// The sum of the token losses of every forward with targets since the last call, each micro-batch's in row
// order, then in the order of the forwards (0 on a stage without the head). Waits for their downloads.
double model_take_losses(Model* g, Backend* be);
// The same forwards' per-token losses, B*T floats each in row order, into out (room for `room` of them);
// returns how many forwards had targets (0 on a stage without the head).
int model_take_token_losses(Model* g, Backend* be, float* out, int room);
// Backward of set `set`'s forward (which had dloss != 0); parameter gradients accumulate. The stage with
// the head starts from its dlogits; a stage without it from model_boundary_grad, which the caller has filled
// with d(output). Afterwards a stage without the encoder leaves d(input) in model_boundary_grad.
void model_backward(Model* g, Backend* be, int set);
// zb's halves of model_backward (same inputs, same outputs, same bits): B computes the input gradients
// (everything model_backward does but the blocks' weight gradients) and leaves what those need in stash slot
// `slot`; W, later, computes the blocks' weight gradients from that slot and set `set`, which must still
// hold the micro-batch's activations, and hands each block's gradients to the store (ZeRO's reductions).
// The head's and the embeddings' gradients are B's: they are small, or on the stage that runs W at once.
void model_backward_input(Model* g, Backend* be, int set, int slot);
void model_backward_weight(Model* g, Backend* be, int set, int slot);

// Rows [first, first + rows) of the last forward's logits, their V real columns, into out (host, rows x V
// floats). Under -tp each rank holds Vp/tp columns, so every rank of the tensor group calls it and gets the
// whole rows (summed on the host, where none of the step's traffic is counted).
void model_logits_to_host(Model* g, Backend* be, int first, int rows, float* out);

// The tensors that cross a stage boundary, (B,T,C) of type dt each (this rank's rows of them with -sp): the
// first block's input and the last block's output of a set, and the gradient of either (one buffer: the
// residual stream's gradient).
void* model_stage_input(Model* g, int set);
void* model_stage_output(Model* g, int set);
void* model_boundary_grad(Model* g);
size_t model_boundary_bytes(const Model* g);
// d(input) to send upstream, copied out of model_boundary_grad into a buffer of its own (dinput_out), so that
// the next gradient can arrive in model_boundary_grad while this one travels (one exchange may hold both, and
// a send completes in the background: comm_exchange). Valid until the next call.
void* model_grad_to_send(Model* g, Backend* be);
