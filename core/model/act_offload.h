// act_offload.h: -offload-act 1, ZeRO-R's CPU activation checkpointing. Under -r 3 a stage keeps, of each
// micro-batch, only its blocks' inputs (the residual stream between blocks), from which the backward
// recomputes each block. With this, the inner ones (block 1's input to block L-1's, of the stage's L blocks)
// live in host memory: the stage's input (which the pipeline or the embedding fills) and its output (which
// the next stage or the head reads) stay on the device. Block l's input goes down once block l's forward has
// read it, and comes back up one block ahead of the backward that needs it, on the backend's copy streams
// (kernels.h), so on a GPU the copies overlap the blocks' compute.
//
// The device holds three (N, C) slots that the inner inputs take in turn, input l in slot (l - 1) % 3 (as
// many as there are inner inputs, when fewer: the device never holds more than without this): in the
// forward block l reads input l's slot and writes l + 1's while the copy out of l - 1's drains; in the
// backward block l reads its input's slot (and its recomputation rewrites l + 1's) while l - 1's comes up.
// The activation sets of a pipeline share the slots (one set's forward or backward runs at a time) and each
// has its own host slices. The copies move bits unchanged, so a run computes what it computes without them.
#pragma once
#include <stddef.h>

#include "core/model/memory.h"

#define ACT_SLOTS 3

typedef struct {
    int on;
    int blocks;             // the stage's blocks, L
    int num_sets;
    int slots;              // min(ACT_SLOTS, L - 1)
    size_t slice_bytes;     // one block input: (N, C) rows in the run's dtype
    void* slot[ACT_SLOTS];  // device
    char** host;            // [num_sets]: L - 1 slices each, slice l - 1 block l's input (l = 1 .. L-1)
    BeEvent* down[ACT_SLOTS];   // the last copy out of each slot
    BeEvent* up[ACT_SLOTS];     // the last copy into each slot
    long long coming[ACT_SLOTS];   // set * L + l of the input a slot's upload brings, not yet waited for; -1
} ActOffload;

// Whether block input l is an inner one, kept in host memory (with `on`).
static inline int act_offload_inner(const ActOffload* o, int l) { return o->on && l >= 1 && l < o->blocks; }
static inline int act_offload_slot_of(const ActOffload* o, int l) { return (l - 1) % o->slots; }
static inline void* act_offload_slot(const ActOffload* o, int l) { return o->slot[act_offload_slot_of(o, l)]; }
// The device slots act_offload_create allocates for a stage of `blocks` blocks (the memory plan).
static inline int act_offload_slots(int on, int blocks) { return on && blocks > 1 ? (blocks - 1 < ACT_SLOTS ? blocks - 1 : ACT_SLOTS) : 0; }

// Allocates the slots (MEM_ACTIVATIONS) and each set's host slices (MEM_HOST_ACTIVATIONS); nothing unless
// `on` and the stage has an inner input.
void act_offload_create(ActOffload* o, Backend* be, MemLedger* mem, int on, int blocks, int num_sets, size_t slice_bytes);
void act_offload_destroy(ActOffload* o, Backend* be);
// The host bytes act_offload_create allocates (the memory plan).
size_t act_offload_host_bytes(int on, int blocks, int num_sets, size_t slice_bytes);

// The forward: before block l writes block l + 1's input, and after block l has read its input (`keep`: a
// training forward, whose backward will want it; an evaluation's inputs are not copied).
void act_offload_before_forward(ActOffload* o, Backend* be, int l);
void act_offload_after_forward(ActOffload* o, Backend* be, int set, int l, int keep);
// The backward (each walk of it, block L-1 down to 0): before block l's recomputation, its input is in its
// slot, and block l - 1's is on its way up.
void act_offload_before_backward(ActOffload* o, Backend* be, int set, int l);
