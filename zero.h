// zero.h: ZeRO stages 0-3 over the layer-ordered flat parameter buffer (the table in docs/ARCHITECTURE.md).
//
// Every unit (embeddings, each block, final LayerNorm) is padded to a multiple of 64·N elements, so it
// splits into N equal "pieces", one per rank of the data-parallel group. Rank r's piece of unit u is
// [u.offset + r·piece_u, + piece_u). What a stage shards:
//   stage 0  nothing: full params, grads, master, Adam state; grads all-reduced at the step boundary
//   stage 1  master + Adam state (pieces); grads accumulate in full, reduce-scattered at the boundary;
//            updated params all-gathered after the step
//   stage 2  + grads: each unit's gradient is reduce-scattered as soon as its backward is done, into an
//            fp32 piece accumulator; only two units' gradient buffers (and the embeddings') exist
//   stage 3  + params: a block's params are all-gathered before its forward and again before its
//            backward, into one of two rotating buffers; embeddings and final LayerNorm stay gathered
//            from first use until the parameters change
// Overlap (stages 2-3): a unit's reduce-scatter runs while the next unit's backward computes, and ZeRO-3
// gathers the block the walk will ask for next while the current one computes (zero.c explains when).
// The forward/backward walk (gpt.c) asks for each unit's parameters and gradient buffer through
// zero_params / zero_grads and says when it is done; it never knows the stage.
#pragma once
#include "core/comm.h"
#include "core/memory.h"
#include "core/model.h"

typedef struct {
    int stage;
    Comm* dp;            // data-parallel group; NULL for a single process
    Comm* tied;          // pipeline: stage 0 <-> last stage, summing the embedding and its mirror; else NULL
    int rank, size;      // in the DP group
    DType dt;
    const ParamLayout* lay;
    size_t piece_offset[MAX_UNITS];   // state index of each unit's piece (stages 1-3)
    size_t state_elems;  // elements of master / m / v held here: layout total (stage 0) or sum of pieces
    // Parameters: full flat buffer (stages 0-2) or this rank's pieces (stage 3), type dt.
    void* params;
    float* master;       // (state_elems) fp32; aliases params where both have the same layout and type
    float* adam_m;
    float* adam_v;
    // Gradients.
    void* grads;         // stages 0-1: full flat buffer (dt), accumulating over micro-steps
    void* grads_piece;   // stage 1: (state_elems) dt, the reduce-scattered gradient
    float* grad_acc;     // stages 2-3: (state_elems) fp32 accumulator
    float* piece_f32;    // stages 2-3: one piece converted to fp32 before it is added
    void* grad_slot[2];  // stages 2-3: rotating unit gradient buffers (dt), largest block unit
    int grad_slot_unit[2];
    void* emb_grads;     // stages 2-3: unit 0's gradients (live from the LM head to the encoder)
    int emb_grads_live;
    // Stage 3 gathered parameters.
    void* param_slot[2]; // rotating block buffers
    int param_slot_unit[2];
    void* resident[2];   // unit 0 and unit L+1, gathered until the next update
    int resident_valid;
    float* norm_acc;     // one float of backend scratch
    // Collectives in flight (comm.h's start/wait), overlapping the walk's compute; zero.c says when.
    CommHandle grad_flight[2];        // stages 2-3: reduce-scatter of grad_slot[s], for unit grad_flight_unit[s]
    int grad_flight_unit[2];
    int grad_flight_live[2];
    unsigned long grad_flight_seq[2]; // start order: the older one is finished first
    unsigned long grad_seq;
    CommHandle emb_flight;            // reduce-scatter of emb_grads
    int emb_flight_live;
    CommHandle param_flight[2];       // stage 3: gather into param_slot[s]; a prefetch until the walk asks
    int param_slot_held[2];           // between zero_params and zero_params_done
    int walk_last_block, walk_started;   // the block the walk asked for last (the prefetch direction)
} Zero;

// pad_multiple to pass to layout_build for a DP group of `size` ranks.
static inline size_t zero_pad_multiple(int size) { return (size_t)64 * (size_t)size; }

// tied: with a pipeline, the group joining this replica's first and last stage (grid.h), over which the
// embedding unit's reduced gradients are summed with its mirror's in zero_reduce_grads; NULL otherwise.
void zero_create(Zero* z, Backend* be, MemLedger* mem, const ParamLayout* lay, int stage, Comm* dp, Comm* tied, DType dt);
void zero_destroy(Zero* z, Backend* be);
// The bytes per category zero_create would allocate on each of `size` ranks, without allocating.
void zero_plan(MemLedger* mem, const ParamLayout* lay, int stage, int size, DType dt);

// Walk interface (gpt.c). Pointers are unit bases: tensor t of unit u lives at base + (t.offset - u.offset).
void* zero_params(Zero* z, Backend* be, int unit);
void zero_params_done(Zero* z, int unit);
// Optional hint: the walk's next parameter request will be `unit`. ZeRO-3 starts gathering that block now
// into a free buffer, so the gather overlaps the work before the request (gpt_backward: the LM head's
// backward before the last block); otherwise it does nothing. zero.c infers the rest of a walk itself. A
// hinted block must be asked for before the parameters change, or its gather's bytes are spent for nothing.
void zero_prefetch(Zero* z, Backend* be, int unit);
void* zero_grads(Zero* z, Backend* be, int unit);        // accumulate into it
void zero_grads_done(Zero* z, Backend* be, int unit);

// Step boundary (train_gpt.cu): zero the gradients before the first micro-step; after the last one,
// reduce them (stage 0 all-reduce, stage 1 reduce-scatter; stages 2-3 already did), then sum the tied
// embedding's gradients with the other stage's copy.
void zero_begin_step(Zero* z, Backend* be);
void zero_reduce_grads(Zero* z, Backend* be);
// After the optimizer wrote its parts: gather the updated parameters as the stage requires.
void zero_after_update(Zero* z, Backend* be);
// With a pipeline: whether this rank's embedding parameters are bit-identical to the tied copy on the
// other end (collective over the tied pair; 1 without one). The copies get the same summed gradients and
// the same update, so a difference is a bug; checkpoints check it.
int zero_tied_in_sync(Zero* z, Backend* be);

// The parts of the flat buffer this rank
//   ZERO_UPDATE      updates: everything (stage 0) or its pieces, the mirror included (it must stay equal);
//   ZERO_NORM        counts in the gradient norm: the same without the mirror (stage 0 counts wte once);
//   ZERO_CHECKPOINT  writes to a checkpoint: always its pieces, so checkpoints look the same for every
//                    stage, without the mirror.
// For each part, the callback gets the flat range and the index of its first element in the state buffers.
typedef enum { ZERO_UPDATE, ZERO_NORM, ZERO_CHECKPOINT } ZeroParts;
typedef void (*ZeroPartFn)(Zero* z, size_t flat_begin, size_t flat_end, size_t state_index, void* ctx);
void zero_for_each_part(Zero* z, ZeroParts which, ZeroPartFn fn, void* ctx);
// The same, split at tensor boundaries: fn gets the tensor, the flat start, the state index and the count.
typedef void (*ZeroSpanFn)(Zero* z, const ParamTensor* t, size_t flat, size_t state_index, size_t n, void* ctx);
void zero_for_each_span(Zero* z, ZeroParts which, ZeroSpanFn fn, void* ctx);
// The part of [begin, end) (inside one unit) that this rank owns for the optimizer: [*a, *b) with state
// index *si; returns 0 when it owns none of it.
int zero_owned_range(const Zero* z, int unit, size_t begin, size_t end, size_t* a, size_t* b, size_t* si);
// Where the optimizer reads the reduced gradient / writes the parameters of state index i.
const void* zero_grad_source(const Zero* z, size_t flat, size_t state_index, DType* dt);
void* zero_param_dest(const Zero* z, size_t flat, size_t state_index);

// Whole-model transfers through host memory (fp32, flat layout, layout->total elements): set the
// parameters and master weights (initialization, model files); read back the master weights or the
// reduced gradients (model files, -dump). Collective: every rank of the group must call them; a rank
// that passes flat = NULL to a read-back only takes part in the gathers.
void zero_set_from_host(Zero* z, Backend* be, const float* flat);
void zero_master_to_host(Zero* z, Backend* be, float* flat);
void zero_grads_to_host(Zero* z, Backend* be, float* flat);
