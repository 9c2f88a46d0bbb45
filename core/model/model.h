// model.h: the layer-ordered flat parameter buffer ("units") of a model of any family (family.h).
//
// Every parameter lives in one flat buffer ordered by layer: unit 0 = the embedding unit (GPT-2: wte, wpe),
// unit 1+l = block l, unit L+1 = the final unit (the final norm, and an untied LM head). Each unit is
// contiguous and padded so it splits evenly across a data-parallel group: ZeRO-3 gathers a layer with one
// all-gather, ZeRO-2 reduces one with one reduce-scatter, a pipeline stage owns a contiguous range of units.
// Files use llm.c's order instead ("canonical": each of the family's kinds stacked over layers); the layout
// maps between the two.
#pragma once
#include <stddef.h>

#include "core/model/family.h"
#include "kernels/kernels.h"

typedef struct {
    int kind;           // the family's kind (family.h)
    int layer;          // block index, or -1 outside the blocks
    size_t offset;      // in the flat buffer (elements)
    size_t size;        // elements held here
    // Where they sit in llm.c's file order: runs of `run` contiguous elements, `stride` apart, the first at
    // `canonical`. A tensor held whole is one run (run == stride == size); a tensor-parallel shard of a
    // matrix cut by columns is one run per row (tensor_canonical).
    size_t canonical, run, stride;
    int replica;        // a copy of values another rank of the tensor group writes (tensor_is_copy)
    int group_whole;    // held whole by every rank of a tensor group (tp > 1): rank 0's and its copies
    int copies;         // tensor ranks holding these same rows (a kv head shared by tp / KV ranks), or 1;
                        // the first of them writes it, the others are replicas
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

// A unit is two sections, each padded so it splits evenly: its frozen tensors first (optimizer_kind.h's
// frozen kind: LoRA's base), then the trained ones, either possibly empty. ZeRO cuts each section into
// equal pieces (core/zero/pieces.h), so every rank holds an equal share of the trained tensors, whose
// state and gradients are all a unit with frozen tensors has, however few they are beside the frozen ones.
typedef struct {
    size_t offset;      // first element in the flat buffer
    size_t size;        // elements up to the end of its last tensor
    size_t padded;      // size rounded up so the unit splits evenly (>= size)
    size_t frozen;      // the frozen section's length (padded): [offset, offset + frozen); the trained
                        // section is the rest, [offset + frozen, offset + padded)
    int first_tensor;   // index into ParamLayout.tensors
    int num_tensors;
} Unit;

// Section s of unit u (0 the frozen one, 1 the trained one): its first flat element and its length.
static inline size_t section_begin(const Unit* un, int s) { return un->offset + (s ? un->frozen : 0); }
static inline size_t section_len(const Unit* un, int s) { return s ? un->padded - un->frozen : un->frozen; }
#define UNIT_SECTIONS 2

#define MAX_LAYERS 256
#define MAX_MODEL_CHUNKS 8   // = schedule.h's MAX_CHUNKS (pipeline.c checks)
#define MAX_UNITS (MAX_LAYERS + 2)
#define MAX_UNIT_TENSORS 28   // kinds one unit may hold (a LoRA'd Llama block has the most: lora.h)
#define MAX_TENSORS (MAX_UNIT_TENSORS * MAX_UNITS)

typedef struct {
    ModelShape shape;
    int tp_rank, tp_size;          // this layout's shard of each block (tensor parallelism; 0, 1 for whole blocks)
    int cp_size;                   // ranks sharing each sequence (context parallelism; 1 without): the parameters
                                   // are whole, attention's exchange buffers are sized by it
    int cp_ring;                   // -cpm ring: the context ranks pass k|v round a ring (context_parallel.h)
    int first_block, num_blocks;   // the blocks this layout holds: all of them, or a pipeline stage's range;
                                   // with interleaving (num_chunks > 1) num_blocks counts every chunk's
    int num_chunks;                // model chunks (virtual pipeline stages) of this layout: 1 but interleaved
    int chunk_first[MAX_MODEL_CHUNKS], chunk_count[MAX_MODEL_CHUNKS];   // chunk c: blocks first .. first + count - 1
    int emb_unit;                  // the embedding unit, or -1 when another stage holds it
    int emb_mirror;                // emb_unit is the last pipeline stage's copy for the tied LM head (below)
    int final_unit;                // the final unit (final norm, untied head), or -1
    int block_unit[MAX_LAYERS];    // unit of block l, or -1
    int num_units;
    Unit units[MAX_UNITS];
    int num_tensors;
    ParamTensor tensors[MAX_TENSORS];
    size_t total;        // elements in the flat buffer, padding included
    size_t num_params;   // real parameters held (the canonical count, wte padding rows included as in llm.c;
                         // a stage's own, without the mirror)
} ParamLayout;

// The checks every family's shape passes (then the family's own): one-line errors naming the field.
void shape_validate(const ModelShape* s);
size_t param_kind_elems(const ModelShape* s, int k);    // elements of one layer's tensor of kind k
size_t param_kind_layers(const ModelShape* s, int k);   // tensors of kind k in the model: L for block kinds, else 1
const char* param_kind_name(const ModelShape* s, int k);
// Whether -tp can split wte's Vp rows (and the logits' columns) evenly, in multiples of 8 rows per rank so a
// rank's logits rows stay 16-byte aligned in 16-bit types. Vp is a multiple of 128, so tp = 1, 2, 4, 8, 16
// always can: GPT-2's 50304 = 128 * 393 splits up to -tp 16 (and 3, 6, 12, ...).
int shape_splits_vocab(const ModelShape* s, int tp);
// Parameters of the whole model (llm.c's count); SIZE_MAX when it overflows (an untrusted file header's shape).
size_t shape_param_count(const ModelShape* s);
// The parameters without the padded vocabulary rows: the count a model's publisher states.
size_t shape_real_param_count(const ModelShape* s);
// Whether two shapes are the same model, and a one-line description of one (for messages).
int shape_equal(const ModelShape* a, const ModelShape* b);
void shape_describe(const ModelShape* s, char* out, size_t n);
// The vocabulary padded to a multiple of 128, as llm.c pads it. A size no model has (a corrupt header's)
// passes through unpadded, without overflowing, for shape_validate to refuse.
static inline int padded_vocab(int V) { return V > (1 << 30) ? V : (V + 127) / 128 * 128; }

// Units padded to a multiple of `pad_multiple` elements (layout_pad_multiple). layout_build holds the whole
// model; layout_build_stage `chunks` contiguous ranges of blocks (a pipeline stage: one range, or one per
// virtual stage with interleaving), with the embeddings and/or the final LayerNorm. Flat offsets are local
// to the layout; canonical offsets are the model's.
//
// A tied LM head is wte, so the last pipeline stage needs wte although stage 0 owns it. It holds a mirror:
// a unit built exactly like stage 0's embedding unit (GPT-2: wte and wpe, same padding), so both copies
// split into the same ZeRO pieces, their gradients can be summed piece by piece, and the same AdamW update
// keeps them equal. The mirror's other tensors are unused (their gradients stay zero). Checkpoints and the
// gradient norm skip the mirror; loading fills it from wte's canonical offsets like the original. An untied
// head is a tensor of the final unit instead, and nothing is mirrored (layout_needs_mirror).
typedef enum { EMB_NONE, EMB_OWN, EMB_MIRROR } EmbeddingRole;
// The pad_multiple that lets every unit split into `pieces` equal pieces of whole 64-element groups (ZeRO
// cuts each unit into one piece per rank of a data-parallel group).
static inline size_t layout_pad_multiple(int pieces) { return (size_t)64 * (size_t)pieces; }
//
// Tensor parallelism (tp_size > 1) cuts each kind as its family's kind_cut says, as Megatron-LM does: the
// layers that widen the stream column-parallel (each rank holds its heads' rows of q, k and v, its share of
// the MLP's hidden rows), the projections back into it row-parallel (the matching columns), and the embedding
// and an LM head by vocabulary rows (rank r holds rows [r, r + 1) * Vp / tp; the mirror likewise). Norms,
// the projections' biases and GPT-2's wpe are held whole by every rank of the tensor group; rank 0's copies
// are the ones written (ParamTensor.replica on the others). Fails with a one-line error when tp does not
// split the vocabulary (shape_splits_vocab) or the family's widths (ModelFamily.splits_tp).
void layout_build(ParamLayout* lay, const ModelShape* s, size_t pad_multiple);
void layout_build_stage(ParamLayout* lay, const ModelShape* s, size_t pad_multiple, const int* first_block, const int* num_blocks,
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
// The family's LayerSizes of a shape.
static inline LayerSizes shape_layer_sizes(const ModelShape* s) { return s->family->layer_sizes(s); }
// The per-rank widths of a tensor-parallel block: query and key/value heads, attention channels
// (NH * head size / tp: GPT-2's C / tp), the MLP's hidden width (GPT-2's 4C / tp).
static inline int layout_heads(const ParamLayout* lay) { return lay->shape.NH / lay->tp_size; }
// Tensor ranks holding a copy of each kv head: 1, or tp / KV when the model has fewer kv heads than -tp
// (neighbouring ranks: rank r holds kv head r / copies, which all its query heads read).
static inline int shape_kv_copies(const ModelShape* s, int tp) {
    int KV = shape_layer_sizes(s).kv_heads;
    return KV >= tp ? 1 : tp / KV;
}
static inline int layout_kv_copies(const ParamLayout* lay) { return shape_kv_copies(&lay->shape, lay->tp_size); }
static inline int layout_kv_heads(const ParamLayout* lay) {
    return shape_layer_sizes(&lay->shape).kv_heads * layout_kv_copies(lay) / lay->tp_size;
}
static inline int layout_head_size(const ParamLayout* lay) { return shape_layer_sizes(&lay->shape).head_size; }
static inline int layout_attn_channels(const ParamLayout* lay) { return lay->shape.NH * layout_head_size(lay) / lay->tp_size; }
static inline int layout_mlp_channels(const ParamLayout* lay) { return shape_layer_sizes(&lay->shape).mlp / lay->tp_size; }
// Whether a pipeline's last stage needs a mirror of the embedding unit: the LM head is tied to wte.
static inline int layout_needs_mirror(const ModelShape* s) { return s->tied; }
// The vocabulary rows (wte rows, logits columns) a tensor rank holds: [layout_vocab_first, + layout_vocab_rows),
// of which layout_vocab_real are real tokens (< V; the rest is padding).
static inline int layout_vocab_rows(const ParamLayout* lay) { return lay->shape.Vp / lay->tp_size; }
static inline int layout_vocab_first(const ParamLayout* lay) { return lay->tp_rank * layout_vocab_rows(lay); }
static inline int layout_vocab_real(const ParamLayout* lay) {
    int real = lay->shape.V - layout_vocab_first(lay), rows = layout_vocab_rows(lay);
    return real < 0 ? 0 : real > rows ? rows : real;
}
// The tensor of `kind` (block kinds: of block `layer`), or NULL when this layout does not hold it (or this
// shape has none of that kind).
const ParamTensor* layout_tensor(const ParamLayout* lay, int kind, int layer);
static inline int unit_of_block(const ParamLayout* lay, int layer) { return lay->block_unit[layer]; }

// Pointer to tensor t inside a buffer holding its unit (unit_base = the unit's first element, type dt):
// the flat buffer at the unit's offset, or a gathered copy of just that unit (ZeRO-3).
static inline void* tensor_in_unit(const ParamLayout* lay, void* unit_base, const ParamTensor* t, DType dt) {
    return (char*)unit_base + (t->offset - lay->units[t->unit].offset) * dtype_size(dt);
}
// The same for kind `kind` (of block `layer`) in its unit's buffer; NULL when absent.
void* unit_tensor(const ParamLayout* lay, void* unit_base, int kind, int layer, DType dt);
// A unit's gradient buffer is its trained section: the backward makes no weight gradient for a frozen
// tensor, only the input gradient through it. Elements of unit u's gradient buffer (its padding included),
// and the index in it of element f of u (in the trained section).
static inline size_t unit_grad_len(const ParamLayout* lay, int u) { return lay->units[u].padded - lay->units[u].frozen; }
static inline size_t unit_grad_index(const ParamLayout* lay, int u, size_t f) { return f - lay->units[u].offset - lay->units[u].frozen; }
// Where kind `kind` (of block `layer`) is in its unit's gradient buffer; NULL for a frozen kind or an absent one.
void* unit_grad_tensor(const ParamLayout* lay, void* unit_base, int kind, int layer, DType dt);
static inline int final_norm_unit(const ParamLayout* lay) { return lay->final_unit; }

// Host fp32 values for one tensor: its kind's InitRule (family.h), a pure function of (seed, kind, layer).
void init_tensor_values(float* out, const ModelShape* s, const ParamTensor* t, unsigned long long seed);

// The optimizer of kind k and of tensor t (optimizer_kind.h).
static inline const OptimizerKind* kind_optimizer(const ModelShape* s, int k) { return optimizer_kind(kind_info(s, k)->optimizer); }
static inline const OptimizerKind* tensor_optimizer(const ParamLayout* lay, const ParamTensor* t) {
    return kind_optimizer(&lay->shape, t->kind);
}
// The fp32 buffers a holder keeps per updated element: the most any of the model's kinds' optimizers holds
// (master and state; a kind whose optimizer holds fewer leaves the rest unused). 0: every kind is frozen.
static inline int shape_optimizer_buffers(const ModelShape* s) {
    int most = 0;
    for (int k = 0; k < s->family->num_kinds; k++) {
        int b = optimizer_buffers(kind_optimizer(s, k));
        most = b > most ? b : most;
    }
    return most;
}
