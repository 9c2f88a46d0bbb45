// pieces.h: how the data-parallel group splits the layout's units into pieces (zero.h explains why each
// unit splits evenly). A unit is two sections, frozen and trained (model.h: Unit), and each splits evenly:
// rank r's piece of section s of unit u is [section_begin + r·section_piece, + section_piece) in the flat
// layout, and its piece of the unit is its piece of each section. A buffer that holds only this rank's
// pieces (sharded state, gradients or parameters) keeps unit u's at index offset[u], its frozen section's
// piece then its trained section's (piece_at). The rotating gradient slots (grad_slots.h) and the gathered
// parameters (param_slots.h) read it; zero.c fills it once, at zero_create, and never changes it.
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
    // Gradients hold no room for frozen tensors: unit u's gradient buffer is its trained section
    // (model.h: unit_grad_len), grad_len[u] elements at grad_offset[u] in a whole one. This rank's share of
    // it, whose state it holds, is its piece of the trained section: the stretch [mine_first[u], +
    // mine_len[u]) of u's gradient buffer, at mine_offset[u] in a buffer of such shares (indexed like the
    // sharded state).
    size_t grad_offset[MAX_UNITS], grad_len[MAX_UNITS];
    size_t mine_first[MAX_UNITS], mine_len[MAX_UNITS], mine_offset[MAX_UNITS];
} Pieces;

static inline void* elem_at(void* base, size_t index, size_t elem_bytes) { return (char*)base + index * elem_bytes; }
static inline size_t piece_len(const Pieces* pc, int u) { return pc->lay->units[u].padded / (size_t)pc->size; }
static inline size_t section_piece(const Pieces* pc, int u, int s) { return section_len(&pc->lay->units[u], s) / (size_t)pc->size; }
// The flat index of this rank's piece of section s of unit u, and its index in a buffer of pieces.
static inline size_t piece_begin(const Pieces* pc, int u, int s) {
    return section_begin(&pc->lay->units[u], s) + (size_t)pc->rank * section_piece(pc, u, s);
}
static inline size_t piece_at(const Pieces* pc, int u, int s) { return pc->offset[u] + (s ? section_piece(pc, u, 0) : 0); }
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
        pc->grad_offset[u] = whole;
        pc->grad_len[u] = unit_grad_len(pc->lay, u);
        pc->mine_len[u] = section_piece(pc, u, 1);
        pc->mine_first[u] = (size_t)pc->rank * pc->mine_len[u];
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
