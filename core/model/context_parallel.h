// context_parallel.h: context parallelism (-cp N) in the walk, DeepSpeed Ulysses' way. The N context ranks of
// a group each hold t/N consecutive positions of every sequence (rank c: [c t/N, (c+1) t/N)), so everything
// outside attention is per token and runs on the rank's own rows unchanged. Attention needs every position:
// an all-to-all turns q|k|v from (b, t/N, every head) into (b, t, heads/N), the existing kernel attends over
// whole sequences of the rank's heads, and a second all-to-all turns its output back to (b, t/N, every head)
// for the output projection. The backward runs the same two exchanges in reverse (d(out), then d(q|k|v)).
// Positions are data: a rank's tokens carry positions c t/N + i (walk.c's per-model pos array), which the
// position embedding (GPT-2's wpe) and RoPE read, so no kernel assumes a row starts at position 0. RoPE runs
// where the block puts it, before the exchange, on the rank's rows at their positions: it acts on each token
// and head alone, so it commutes with the exchange, and leaving it there keeps the exchange wrapped around
// attention alone, the same step in every family.
//
// Heads: each rank takes NH/N query heads and KV/N kv heads; with fewer kv heads than ranks (N a multiple of
// KV) each kv head is copied to the N/KV ranks whose query heads use it, and in the backward its copies'
// gradients are summed (in a fixed order) before they land in the rank's d(q|k|v).
//
// -cpm ring (context_ring.c): the sequence is cut into 2N chunks of t/(2N) positions and rank c holds chunks c
// and 2N-1-c (Megatron's causal load balance: every rank attends as many causal pairs). q, k and v stay on
// their rank; the ranks' k|v travel round the ring (rank c receives from c-1, sends to c+1), each rank's
// queries attending every chunk that passes (attention_chunk_forward, not the chunks wholly in their future)
// and merging the partial results by their log-sum-exp (attention_lse_merge). The backward, from the merged
// output and lse, runs the ring again with a d(k|v) travelling beside each k|v, gathering every rank's share
// (attention_chunk_backward accumulates), and one last hop brings it home.
//
// Documents (-docmask, masked shards) compose with both: a rank's rows carry their tokens' positions in their
// documents (pos, cut as the tokens), and attention gets each query's document start in the whole row (doc,
// which every rank keeps whole: documents are contiguous, so that start alone decides which keys a query sees,
// wherever the keys are). Ulysses attends whole sequences with it; the ring's chunk kernels take its queries'
// starts and drop the keys before them, a pair's rows with no key left merging as nothing.
#pragma once
#include "core/model/block.h"
#include "core/model/context_layout.h"

// Whether N context ranks can share the attention of each of tp tensor ranks (a tensor rank's heads and kv
// heads as above: model.h's layout_heads, layout_kv_heads); why not in `why`.
int context_splits(const ModelShape* s, int tp, int N, char* why, size_t size);


// Attention under -cp: out (this rank's rows, every head) and lse (whole sequences of this rank's heads:
// (B, NH/N, T); the ring's: context_ring_forward) from qkv (this rank's rows). index: the stage's block, whose
// exchanged q|k|v and attention output the backward reads (walk.h: Activations.qkv_heads, att_heads). refill:
// those q|k|v are kept (-r 2's recompute): only the attention and the exchange back run. The ring keeps
// nothing per block: index and refill do not concern it, a refill runs its whole forward.
void context_attention_forward(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv, int refill);
// Its backward: dqkv (this rank's rows) overwritten from dout (this rank's rows); qkv and out are the forward's
// (the ring reads them; Ulysses reads its own exchanged copies).
void context_attention_backward(Model* g, Backend* be, int index, void* dqkv, const void* dout, const void* qkv,
                                const void* out, const float* lse);

// Documents (-docmask, or masked shards): a micro-batch's doc holds the whole rows' document starts (B, t ints,
// in the sequence's positions); its tokens, targets and pos are the rank's rows. Uploads into doc, an activation
// set's (context_doc_width ints per row), what this rank's attention reads: the whole rows for Ulysses, the
// rank's own queries' starts packed as the ring's chunks.
void context_upload_documents(Model* g, Backend* be, int* doc, const int* rows);

// -cpm ring's attention (context_ring.c): out (this rank's rows, every head) and lse ((B, NH, T), T this rank's
// rows in their order) from qkv, this rank's rows; and its backward, dqkv overwritten.
void context_ring_forward(Model* g, Backend* be, void* out, float* lse, const void* qkv);
void context_ring_backward(Model* g, Backend* be, void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse);
