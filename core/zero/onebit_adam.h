// onebit_adam.h: 1-bit Adam (DeepSpeed's OnebitAdam) under every ZeRO stage (-opt adam1bit -freeze S).
//
// Steps 0 .. S-1 are AdamW's, on the same gradient reduction and the same m, v: bit for bit a plain AdamW run.
// From step S on the variance v is frozen and the data-parallel group exchanges momentum instead of
// gradients. Each rank keeps a worker momentum m_w over the whole trained gradient layout (Pieces.grad_offset)
// and folds its own, unreduced gradient into it, m_w = b1 m_w + (1 - b1) g_local; then, unit by unit, the
// compressed all-reduce of core/comm/onebit.h makes every rank's m_w the same approximation of the group's
// mean. Its server chunk of unit u is exactly ZeRO's piece of u on that rank (Pieces.mine_*), so the server
// errors stay sharded like the state, while the worker momentum and the worker errors are whole on every rank:
// what 1-bit Adam costs in memory (backend memory, category optimizer, which --estimate counts). With
// shard_grads (-z 2, 3) the walk's gradient slots, instead of being reduce-scattered, add into one more
// whole fp32 buffer, the local gradient (core/zero/grad_slots.h).
//
// The exchanged momentum reaches the update through the reduced-gradient buffer the update reads anyway
// (its piece with sharded state, whole without), multiplied by the loss scale so the gradient norm and the
// non-finite verdict read it like a gradient; the update divides the scale back out and keeps it as the
// state's m (so a checkpoint's m pieces are the group's momentum, and a resume rebuilds m_w from them by
// summing the ranks' pieces). Where that buffer is 16-bit (-z 0, 1 in bf16, fp16) m_w is rounded to it, so the
// two stay equal. The update itself, per element: w -= lr ((m / c1) / (sqrt(v / c2) + eps) + wd w), c1 =
// 1 - b1^(t+1) as AdamW's, c2 = 1 - b2^S, AdamW's correction at the freeze (the variance stopped there).
// Where v froze at 0 the element never had a gradient before the freeze (a position row past the run's -t, an
// embedding row of a token the data has not used): the compressed momentum still gives it a scale times
// sign(0) = +1, which over sqrt(0) + eps would throw it far, so its Adam term is 0 and only weight decay moves
// it (DeepSpeed asks its users for such a mask, exp_avg_mask; here it is read from v).
//
// A step whose local gradients are not finite on some rank changes nothing: every rank sees it (a host
// reduction), skips the fold and the exchange, and marks its reduced gradient non-finite so the trainer's
// verdict skips the update too (with fp16, the loss scale then shrinks as usual). After the freeze -gc does
// not apply: what is exchanged is momentum, never a gradient whose norm could be clipped.
//
// Checkpoints: m and v are AdamW's state pieces, resharded like any state; the errors go into a file of their
// own per rank, onebit_rank<r>.bin (feedback_file.h: the worker error as the whole-layout section, the server
// error as the chunk section), which any -z and any data-parallel size reads.
#pragma once
#include "core/comm/onebit.h"
#include "core/model/memory.h"
#include "core/zero/model_state.h"
#include "core/zero/optimizer.h"
#include "core/zero/pieces.h"

typedef struct {
    float* momentum;     // m_w: whole gradient layout, fp32, backend memory
    float* worker_err;   // e_w: the same layout
    float* server_err;   // e_s: this rank's chunk of each unit (Pieces.mine_offset)
    float* local;        // shard_grads: this rank's unreduced gradient, whole layout, fp32; else NULL
    size_t whole, mine;  // elements of the whole layout and of this rank's chunks
    int has_momentum;    // m_w holds the momentum (set by the first exchange after the freeze; a resume clears it)
    OnebitScratch scratch;
} OnebitBuffers;

// The buffers (with be == NULL only counted into mem, as zero_plan does).
void onebit_init(OnebitBuffers* b, Backend* be, MemLedger* mem, const Pieces* pc, int shard_grads);
void onebit_free(OnebitBuffers* b, Backend* be);
// The errors into this rank's onebit_rank<r>.bin in checkpoint dir, and back (a resume: the momentum is rebuilt
// from the state at the next exchange).
void onebit_save(const OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir);
void onebit_load(OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir);

// The exchange of step t >= S, in place of the gradient reduction: local is this rank's unreduced gradient
// (whole layout, local_dt; b->local with shard_grads), reduced the buffer the update reads (reduced_dt; its
// pieces when reduced_is_piece). Collective over pc->dp.
void onebit_exchange(OnebitBuffers* b, Backend* be, const Pieces* pc, const ModelState* ms, const void* local, DType local_dt,
                     void* reduced, DType reduced_dt, int reduced_is_piece, float beta1, float loss_scale);

// The update after the freeze, for AdamW's spans (optimizer.c calls it in place of AdamW's).
void onebit_update_on_host(const ModelState* ms, const StateSpan* s, size_t i, size_t k, void* params, const void* grad,
                           float* const* buf, const StepArgs* a);
void onebit_update_on_backend(const ModelState* ms, Backend* be, const StateSpan* spans, int n, const StepArgs* a);
