// context_layout.h: where a context rank's positions lie and how wide its context buffers are, pure functions
// of the layout and the rank (context_parallel.h explains the two modes). The walk sizes its buffers and
// places its positions by them, the data and the generation loop cut their rows by them.
#pragma once
#include <stddef.h>

#include "core/model/model.h"

// Where context rank `rank` of N holds its Tl positions of each sequence: context_pieces ranges of Tl / pieces
// positions, piece i from context_piece_start, in that order on the rank's rows. Ulysses: one piece,
// [rank Tl, (rank+1) Tl); ring: chunks rank and 2N-1-rank of Tl / 2 positions each.
static inline int context_pieces(int ring) { return ring ? 2 : 1; }
static inline int context_piece_start(int ring, int N, int rank, int Tl, int piece) {
    if (!ring) return rank * Tl;
    return (piece ? 2 * N - 1 - rank : rank) * (Tl / 2);
}
// The position of the rank's row i (0 <= i < Tl) in its sequence.
static inline int context_position(int ring, int N, int rank, int Tl, int i) {
    int piece = i / (Tl / context_pieces(ring));
    return context_piece_start(ring, N, rank, Tl, piece) + i % (Tl / context_pieces(ring));
}

// Per context rank after Ulysses' exchange: query heads, kv heads, the ranks that hold a copy of each kv head.
typedef struct {
    int NH, KV, copies;
} ContextHeads;
static inline ContextHeads context_heads(const ParamLayout* lay) {
    int N = lay->cp_size, KV = layout_kv_heads(lay);
    ContextHeads h = {layout_heads(lay) / N, KV >= N ? KV / N : 1, KV >= N ? 1 : N / KV};
    return h;
}

// Ints per token row of an activation set's doc array (walk.h: Activations.doc). Documents are contiguous, so a
// query's document start alone decides which keys it sees (kernels.h). Ulysses attends whole sequences after
// its exchange: the whole rows' document starts, cp per row of its own. The ring's chunk kernels compare its
// own queries' starts with each passing key chunk's positions: one, packed as its chunks (context_ring.c).
// Without -cp one.
static inline size_t context_doc_width(const ParamLayout* lay) {
    return lay->cp_size > 1 && !lay->cp_ring ? (size_t)lay->cp_size : 1;
}

// Elements per token row of the walk's context buffers (block.h's W_CP_*), 0 without -cp. Ulysses keeps per
// block the exchanged q|k|v and attention output; the work buffers hold its exchange, or the ring's packed
// chunks: send q, the output, d(output) and dq (4 NH D per row), receive the two k|v chunk buffers and their
// d(k|v) (4 x 2 KV D).
static inline size_t context_qkv_width(const ParamLayout* lay) {
    ContextHeads h = context_heads(lay);
    return lay->cp_size < 2 || lay->cp_ring ? 0 : (size_t)lay->cp_size * (size_t)(h.NH + 2 * h.KV) * (size_t)layout_head_size(lay);
}
static inline size_t context_att_width(const ParamLayout* lay) {
    return lay->cp_size < 2 || lay->cp_ring ? 0 : (size_t)layout_attn_channels(lay);
}
static inline size_t context_send_width(const ParamLayout* lay) {
    if (lay->cp_size < 2) return 0;
    return lay->cp_ring ? 4 * (size_t)layout_heads(lay) * (size_t)layout_head_size(lay) : context_qkv_width(lay);
}
static inline size_t context_recv_width(const ParamLayout* lay) {
    if (lay->cp_size < 2) return 0;
    return lay->cp_ring ? 8 * (size_t)layout_kv_heads(lay) * (size_t)layout_head_size(lay) : context_qkv_width(lay);
}
