// model.h: GPT-2's shape and the layer-ordered flat parameter buffer ("units").
//
// Every parameter lives in one flat buffer ordered by layer: unit 0 = embeddings (wte, wpe), unit 1+l =
// block l (12 tensors), unit L+1 = final LayerNorm. Each unit is contiguous and padded so it splits evenly
// across a data-parallel group: ZeRO-3 gathers a layer with one all-gather, ZeRO-2 reduces one with one
// reduce-scatter, a pipeline stage owns a contiguous range of units. Files use llm.c's order instead
// ("canonical": each of the 16 tensor kinds stacked over layers); the layout maps between the two.
#pragma once
#include <stddef.h>

#include "kernels/kernels.h"

typedef struct {
    int L;      // layers
    int C;      // channels
    int NH;     // heads
    int V;      // vocabulary
    int Vp;     // vocabulary padded to a multiple of 128 (the wte rows beyond V are zero)
    int maxT;   // maximum sequence length (wpe rows)
} GPTShape;

// The 16 tensor kinds, in llm.c's file order.
typedef enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, NUM_PARAM_KINDS
} ParamKind;

typedef struct {
    ParamKind kind;
    int layer;          // block index, or -1 for wte/wpe/lnf
    size_t offset;      // in the flat buffer (elements)
    size_t size;        // elements held here
    // Where they sit in llm.c's file order: runs of `run` contiguous elements, `stride` apart, the first at
    // `canonical`. A tensor held whole is one run (run == stride == size); a tensor-parallel shard of a
    // matrix cut by columns is one run per row (tensor_canonical).
    size_t canonical, run, stride;
    int replica;        // a copy of values another rank of the tensor group writes (tensor_is_copy)
    int group_whole;    // held whole by every rank of a tensor group (tp > 1): rank 0's and its copies
    int decay;          // weight decay applies (2-D tensors: matrices and the two embeddings)
    int unit;           // the unit holding it
} ParamTensor;

// The canonical offset of element i of t.
static inline size_t tensor_canonical(const ParamTensor* t, size_t i) { return t->canonical + i / t->run * t->stride + i % t->run; }
// Elements of t from element i to the end of its run.
static inline size_t tensor_run_left(const ParamTensor* t, size_t i) { return t->run - i % t->run; }
// Calls fn for each stretch of [c, c + count) (canonical offsets) that t holds: its first element's index
// in t, its canonical offset and its length, in canonical order.
typedef void (*TensorRunFn)(const ParamTensor* t, size_t index, size_t canonical, size_t n, void* ctx);
void tensor_overlaps(const ParamTensor* t, size_t c, size_t count, TensorRunFn fn, void* ctx);

typedef struct {
    size_t offset;      // first element in the flat buffer
    size_t size;        // elements holding parameters
    size_t padded;      // size rounded up so the unit splits evenly (>= size)
    int first_tensor;   // index into ParamLayout.tensors
    int num_tensors;
} Unit;

#define MAX_LAYERS 256
#define MAX_MODEL_CHUNKS 8   // = schedule.h's MAX_CHUNKS (pipeline.c checks)
#define MAX_UNITS (MAX_LAYERS + 2)
#define MAX_TENSORS (2 + 12 * MAX_LAYERS + 2)

typedef struct {
    GPTShape shape;
    int tp_rank, tp_size;          // this layout's shard of each block (tensor parallelism; 0, 1 for whole blocks)
    int first_block, num_blocks;   // the blocks this layout holds: all of them, or a pipeline stage's range;
                                   // with interleaving (num_chunks > 1) num_blocks counts every chunk's
    int num_chunks;                // model chunks (virtual pipeline stages) of this layout: 1 but interleaved
    int chunk_first[MAX_MODEL_CHUNKS], chunk_count[MAX_MODEL_CHUNKS];   // chunk c: blocks first .. first + count - 1
    int emb_unit;                  // unit of wte + wpe, or -1 when another stage holds them
    int emb_mirror;                // emb_unit is the last pipeline stage's copy for the tied LM head (below)
    int final_unit;                // unit of the final LayerNorm, or -1
    int block_unit[MAX_LAYERS];    // unit of block l, or -1
    int num_units;
    Unit units[MAX_UNITS];
    int num_tensors;
    ParamTensor tensors[MAX_TENSORS];
    size_t total;        // elements in the flat buffer, padding included
    size_t num_params;   // real parameters held (the canonical count, wte padding rows included as in llm.c;
                         // a stage's own, without the mirror)
} ParamLayout;

// Parses -e: "d12" | "d24" | "d36" | "d48" (GPT-2 124M/350M/774M/1558M, maxT 1024, V 50257) or a custom
// "L<layers>C<channels>H<heads>[V<vocab>][T<maxT>]" such as L2C64H4V512T64. Returns 0 if `spec` is
// neither (then it names a model file). Fails on a malformed custom spec.
int shape_from_spec(const char* spec, GPTShape* out);
void shape_validate(const GPTShape* s);   // fails with a one-line error on an impossible shape
size_t param_kind_elems(const GPTShape* s, ParamKind k);   // elements of one layer's tensor of kind k
static inline int param_kind_is_block(ParamKind k) { return k >= P_LN1W && k <= P_FCPROJB; }   // one per block
size_t param_kind_layers(const GPTShape* s, ParamKind k);  // tensors of kind k in the model: L for block kinds, else 1
const char* param_kind_name(ParamKind k);
// Whether -tp can split wte's Vp rows (and the logits' columns) evenly, in multiples of 8 rows per rank so a
// rank's logits rows stay 16-byte aligned in 16-bit types. Vp is a multiple of 128, so tp = 1, 2, 4, 8, 16
// always can: GPT-2's 50304 = 128 * 393 splits up to -tp 16 (and 3, 6, 12, ...).
int shape_splits_vocab(const GPTShape* s, int tp);
// Parameters of the whole model (llm.c's count); SIZE_MAX when it overflows (an untrusted file header's shape).
size_t shape_param_count(const GPTShape* s);

// Units padded to a multiple of `pad_multiple` elements (layout_pad_multiple). layout_build holds the whole
// model; layout_build_stage `chunks` contiguous ranges of blocks (a pipeline stage: one range, or one per
// virtual stage with interleaving), with the embeddings and/or the final LayerNorm. Flat offsets are local
// to the layout; canonical offsets are the model's.
//
// The LM head is tied to wte, so the last pipeline stage needs wte although stage 0 owns it. It holds a
// mirror: a unit built exactly like stage 0's embedding unit (wte and wpe, same padding), so both copies
// split into the same ZeRO pieces, their gradients can be summed piece by piece, and the same AdamW update
// keeps them equal. The mirror's wpe is unused (its gradient stays zero). Checkpoints and the gradient norm
// skip the mirror; loading fills it from wte's canonical offsets like the original.
typedef enum { EMB_NONE, EMB_OWN, EMB_MIRROR } EmbeddingRole;
// The pad_multiple that lets every unit split into `pieces` equal pieces of whole 64-element groups (ZeRO
// cuts each unit into one piece per rank of a data-parallel group).
static inline size_t layout_pad_multiple(int pieces) { return (size_t)64 * (size_t)pieces; }
//
// Tensor parallelism (tp_size > 1) cuts each block as Megatron-LM does: qkv and fc column-parallel (each rank
// holds its heads' rows of q, k and v, and its quarter-hidden rows of fc, with their biases), the attention
// and MLP projections row-parallel (each rank holds the matching columns), and wte by vocabulary rows (rank r
// holds rows [r, r + 1) * Vp / tp: the vocabulary-parallel embedding and LM head; the mirror likewise).
// LayerNorms, the projections' biases, wpe and the final LayerNorm are held whole by every rank of the tensor
// group; rank 0's copies are the ones written (ParamTensor.replica on the others). Fails with a one-line error
// when tp does not split the vocabulary (shape_splits_vocab).
void layout_build(ParamLayout* lay, const GPTShape* s, size_t pad_multiple);
void layout_build_stage(ParamLayout* lay, const GPTShape* s, size_t pad_multiple, const int* first_block, const int* num_blocks,
                        int chunks, EmbeddingRole embeddings, int with_final, int tp_rank, int tp_size);
// Chunk c of `lay` as a layout of its own for the forward/backward walk: the same units and tensors (so the
// same parameter store serves it), its one range of blocks, the embeddings only on the chunk that runs them
// (the first chunk, or the last for the LM head's mirror) and the final LayerNorm on the last.
void layout_chunk_view(const ParamLayout* lay, int c, ParamLayout* view);
// A unit whose values another unit (on another stage) owns: skipped by checkpoints and the norm.
static inline int unit_is_mirror(const ParamLayout* lay, int u) { return lay->emb_mirror && u == lay->emb_unit; }
// A tensor whose values another rank owns (a mirror's, or a tensor-group copy): skipped by checkpoints and
// the norm, updated like the original so it stays equal.
static inline int tensor_is_copy(const ParamLayout* lay, const ParamTensor* t) { return t->replica || unit_is_mirror(lay, t->unit); }
// The per-rank widths of a tensor-parallel block: heads, attention channels (C/tp), MLP hidden (4C/tp).
static inline int layout_heads(const ParamLayout* lay) { return lay->shape.NH / lay->tp_size; }
static inline int layout_attn_channels(const ParamLayout* lay) { return lay->shape.C / lay->tp_size; }
static inline int layout_mlp_channels(const ParamLayout* lay) { return 4 * lay->shape.C / lay->tp_size; }
// The vocabulary rows (wte rows, logits columns) a tensor rank holds: [layout_vocab_first, + layout_vocab_rows),
// of which layout_vocab_real are real tokens (< V; the rest is padding).
static inline int layout_vocab_rows(const ParamLayout* lay) { return lay->shape.Vp / lay->tp_size; }
static inline int layout_vocab_first(const ParamLayout* lay) { return lay->tp_rank * layout_vocab_rows(lay); }
static inline int layout_vocab_real(const ParamLayout* lay) {
    int real = lay->shape.V - layout_vocab_first(lay), rows = layout_vocab_rows(lay);
    return real < 0 ? 0 : real > rows ? rows : real;
}
// The tensor of `kind` (block kinds: of block `layer`), or NULL when this layout does not hold it.
const ParamTensor* layout_tensor(const ParamLayout* lay, ParamKind kind, int layer);
static inline int unit_of_block(const ParamLayout* lay, int layer) { return lay->block_unit[layer]; }

// Pointer to tensor t inside a buffer holding its unit (unit_base = the unit's first element, type dt):
// the flat buffer at the unit's offset, or a gathered copy of just that unit (ZeRO-3).
static inline void* tensor_in_unit(const ParamLayout* lay, void* unit_base, const ParamTensor* t, DType dt) {
    return (char*)unit_base + (t->offset - lay->units[t->unit].offset) * dtype_size(dt);
}

// One block's parameters (or their gradients), from the base of the block's unit.
typedef struct {
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    void *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} BlockParams;
typedef struct {
    void *wte, *wpe;   // unit 0
} EmbeddingParams;
typedef struct {
    void *lnfw, *lnfb;   // unit L+1
} FinalNormParams;

BlockParams block_params(const ParamLayout* lay, void* unit_base, int layer, DType dt);
EmbeddingParams embedding_params(const ParamLayout* lay, void* unit_base, DType dt);
FinalNormParams final_norm_params(const ParamLayout* lay, void* unit_base, DType dt);
static inline int final_norm_unit(const ParamLayout* lay) { return lay->final_unit; }

// Host fp32 values for one tensor: GPT-2's initialization (std 0.02, residual projections
// 0.02/sqrt(2L), biases 0, LayerNorm weights 1), a pure function of (seed, kind, layer).
void init_tensor_values(float* out, const GPTShape* s, const ParamTensor* t, unsigned long long seed);
