// pieces.h: how the data-parallel group splits the layout's units into pieces (zero.h explains why each
// unit splits evenly). Rank r's piece of unit u is [u.offset + r·piece_len(u), + piece_len(u)) in the flat
// layout; a buffer that holds only this rank's pieces (sharded state, gradients or parameters) keeps piece u
// at index offset[u]. The rotating gradient slots (grad_slots.h) and the gathered parameters
// (param_slots.h) read it; zero.c fills it once, at zero_create, and never changes it.
#pragma once
#include <stddef.h>

#include "core/comm/comm.h"
#include "core/model/model.h"

typedef struct {
    const ParamLayout* lay;
    Comm* dp;                   // the data-parallel group; NULL for a single process (and for zero_plan)
    int rank, size;             // in the DP group
    DType dt;                   // of the working parameters and the walk's gradients
    size_t offset[MAX_UNITS];   // index of each unit's piece in a buffer of pieces
    // Gradients hold no room for frozen tensors (model.h: unit_grad_len). Unit u's gradient buffer has
    // grad_len[u] elements, at grad_offset[u] in a whole one. This rank's piece of u less its frozen
    // elements, the share of u whose state it holds, is the stretch [mine_first[u], + mine_len[u]) of u's
    // gradient buffer, at mine_offset[u] in a buffer of such shares (indexed like the sharded state). A unit
    // with frozen tensors (has_frozen) splits unevenly, so the group reduces its gradients with an
    // all-reduce rather than a reduce-scatter.
    size_t grad_offset[MAX_UNITS], grad_len[MAX_UNITS];
    size_t mine_first[MAX_UNITS], mine_len[MAX_UNITS], mine_offset[MAX_UNITS];
    int has_frozen[MAX_UNITS];
} Pieces;

static inline void* elem_at(void* base, size_t index, size_t elem_bytes) { return (char*)base + index * elem_bytes; }
static inline size_t piece_len(const Pieces* pc, int u) { return pc->lay->units[u].padded / (size_t)pc->size; }
static inline size_t piece_elem_bytes(const Pieces* pc) { return dtype_size(pc->dt); }

// Waits for a collective started over the group (nothing on one rank).
static inline void pieces_wait(const Pieces* pc, CommHandle* h) {
    if (pc->size > 1) comm_wait(pc->dp, h);
}

// The walk's buffers (grad_slots.h, param_slots.h): two rotating slots take the blocks one after another,
// and the embedding unit and the final unit (the "edge" units) have slots of their own, because an untied
// LM head is as large as wte, two or more blocks' worth: rotating slots sized for it would hold two heads.
static inline int is_edge_unit(const ParamLayout* lay, int u) { return u == lay->emb_unit || u == lay->final_unit; }

// Whether the walk uses the two edge units at the same time: with a tied LM head, whose matrix is wte,
// beside the final norm. With an untied head (the final unit's own) it uses one, then the other (the
// encoder's lookup, then the head), so one buffer serves both in turn.
static inline int edge_units_overlap(const ParamLayout* lay) { return lay->shape.tied; }

// Fills the gradient fields above from the layout, rank and size.
static inline void pieces_index_grads(Pieces* pc) {
    size_t whole = 0, mine = 0;
    for (int u = 0; u < pc->lay->num_units; u++) {
        const Unit* un = &pc->lay->units[u];
        size_t p = piece_len(pc, u), a = un->offset + (size_t)pc->rank * p;
        pc->grad_offset[u] = whole;
        pc->grad_len[u] = unit_grad_len(pc->lay, u);
        pc->has_frozen[u] = pc->grad_len[u] != un->padded;
        pc->mine_first[u] = unit_grad_index(pc->lay, u, a);
        pc->mine_len[u] = unit_grad_index(pc->lay, u, a + p) - pc->mine_first[u];
        pc->mine_offset[u] = mine;
        whole += pc->grad_len[u];
        mine += pc->mine_len[u];
    }
}

// The largest block unit: the size of a rotating slot.
static inline size_t largest_block_unit(const ParamLayout* lay) {
    size_t m = 0;
    for (int u = 0; u < lay->num_units; u++)
        if (!is_edge_unit(lay, u)) m = lay->units[u].padded > m ? lay->units[u].padded : m;
    return m;
}
