// activations.h: the walk's side of its activation buffers (activations.c): what walk.c asks of them. The
// families' blocks reach their slices through block.h (residual_at, block_buffer), the planner through walk.h
// (model_activation_bytes).
#pragma once
#include "core/model/walk.h"

// Fails unless the walk's table names every Activations field once and the family's fits.
void activations_check_tables(const BlockOps* ops);
// Every set's buffers and the stash slots of g (its layout, recompute level, -offload-act, sets), charged to
// MEM_ACTIVATIONS; and their release.
void activations_alloc(Model* g, Backend* be, MemLedger* mem);
void activations_free(Model* g, Backend* be);
// Bytes of one block input, (rows, C) in dt.
size_t model_input_bytes(const ParamLayout* lay, DType dt, int B, int T, int sp);
// Block l's input (l = L: the stage's output) of set a: a slice of resid, or with -offload-act an inner one's slot.
void* activation_input(const Model* g, const Activations* a, int l);
// Block l's slices (l counts the stage's blocks) of zb's stash slot `slot`.
WeightGradStash activations_stash_of_block(Model* g, int slot, int l);
