// family.h: what a model family is. One ModelFamily describes one architecture completely: its parameter
// kinds (shape, tensor-parallel cut, weight decay, initialization), which unit holds each, its own shape
// parameters and the sizes the generic layers read from them, its block's forward and backward over an
// activation table (block.h) and optionally its own embedding, LM head and loss, its FLOPs and pipeline
// head cost, its named shapes and its model-file fields. The layout, the walk, ZeRO, the pipeline, tensor
// parallelism, checkpoints, --estimate and the report read it; none of them names a family. The families
// themselves live in core/models/, one folder each, listed by core/models/catalog.c.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/model/optimizer_kind.h"

typedef struct ModelFamily ModelFamily;

// A family's own shape parameters (Llama's kv heads, head size, MLP width, RoPE ...), which only its folder
// reads: a fixed block of bytes, so a shape stays one plain value that assignment copies and memcmp
// compares. The family keeps a struct of its own here (family_params_get and _set copy it in and out); it
// must have no padding bytes, so that equal parameters are equal bytes.
#define FAMILY_PARAMS_BYTES 64
typedef struct {
    _Alignas(8) unsigned char bytes[FAMILY_PARAMS_BYTES];
} FamilyParams;

// What every family has and the generic code reads; the rest is the family's (params).
typedef struct {
    const ModelFamily* family;
    int L;        // layers
    int C;        // channels (the residual stream's width)
    int NH;       // query heads
    int V;        // vocabulary
    int Vp;       // vocabulary padded to a multiple of 128 (the embedding rows beyond V are zero)
    int maxT;     // maximum sequence length
    int tied;     // the LM head is the token embedding
    FamilyParams params;
} ModelShape;

static inline void family_params_get(const ModelShape* s, void* out, size_t n) { memcpy(out, s->params.bytes, n); }
static inline void family_params_set(ModelShape* s, const void* in, size_t n) {
    memset(s->params.bytes, 0, sizeof(s->params.bytes));
    memcpy(s->params.bytes, in, n);
}

// The sizes the generic layers read (block.h's steps; the layout's per-rank widths under -tp), which a
// family derives from its shape: its attention's kv heads (NH: multi-head attention; 1: multi-query) and
// head size, its MLP's hidden width, and its norm's epsilon.
typedef struct {
    int kv_heads, head_size, mlp;
    float norm_eps;
} LayerSizes;

// Which unit holds a kind: the embedding unit (the first stage's), one per block, or the final unit (the
// last stage's: the final norm and an untied LM head).
typedef enum { UNIT_EMBEDDING, UNIT_BLOCK, UNIT_FINAL } UnitRole;
// How tensor parallelism cuts a kind: a (rows x cols) row-major matrix (a vector is rows x 1) keeps, per
// rank, a 1/tp share of the rows of each of `sections` equal row blocks (CUT_ROWS: q, k and v are three),
// or of the columns of every row (CUT_COLS); CUT_NONE is held whole by every rank of the tensor group.
// heads: CUT_ROWS' sections are made of this many heads, which are never split (0: any row count). With
// fewer heads than tensor ranks each rank holds one head, a copy shared by tp / heads neighbouring ranks
// (the kv heads of a model with fewer of them than -tp).
typedef enum { CUT_NONE, CUT_ROWS, CUT_COLS } Cut;
typedef struct {
    Cut cut;
    size_t rows, cols, sections, heads;
} TensorCut;
// Initial values: ones (norm weights), zeros (biases), normal with std 0.02, or 0.02 / sqrt(2L) for the
// projections into the residual stream, so its variance stays bounded over the layers; INIT_FAN_IN:
// uniform in [-1/sqrt(cols), 1/sqrt(cols)] (PyTorch's kaiming_uniform_(a=sqrt(5)), as PEFT starts LoRA's A).
typedef enum { INIT_ONES, INIT_ZEROS, INIT_NORMAL, INIT_RESIDUAL, INIT_FAN_IN } InitRule;

typedef struct {
    const char* name;
    UnitRole unit;
    InitRule init;
    int decay;        // weight decay applies (the matrices and embeddings)
    int vocab_rows;   // rows are the padded vocabulary: rows >= V stay zero (the embedding, an LM head)
    // Placed right after the previous kind with no alignment padding between, so the two are one tensor to
    // the kernels (q's rows and k|v's, or their biases: one q|k|v projection).
    int joins_previous;
    OptimizerId optimizer;   // what updates it (optimizer_kind.h): OPT_ADAMW unless the family says otherwise
} KindInfo;

// One rung of a family's ladder of shapes for --estimate -gpu-mem: a label for the table and an -e spec.
typedef struct {
    const char* label;
    const char* spec;
} ShapeRung;

// A LoRA target's linear in a block (lora.h): its input width, and the column block [col, col + out) of the
// width-wide output (a fused matmul's: Llama's q|k|v and gate|up; else the whole output) that it adds into.
// cut: how -tp cuts the target's block of its base matrix, as the layer's kind_cut does: CUT_ROWS (a
// column-parallel layer: its output rows, in `sections` equal blocks of `heads` heads each, 0: any row
// count) or CUT_COLS (a row-parallel one: its input columns).
typedef struct {
    int in, out, col, width;
    Cut cut;
    int sections, heads;
} LoraGeometry;

typedef struct BlockOps BlockOps;   // block.h
typedef struct EndOps EndOps;       // block.h
// The norm the blocks and the final norm use: LayerNorm (weight and bias, eps 1e-5) or RMSNorm (weight,
// LayerSizes.norm_eps; statistics in fp32).
typedef enum { NORM_LAYER, NORM_RMS } NormKind;

struct ModelFamily {
    const char* name;   // in messages, run records and -h
    int file_id;        // the model file's header slot 8 (0: GPT-2, as in llm.c's files)
    int num_kinds;
    const KindInfo* kinds;   // in the model file's order: each kind stacked over its layers
    // Elements of one layer's tensor of kind k (0: this shape has none, e.g. an absent optional norm).
    size_t (*kind_elems)(const ModelShape* s, int k);
    TensorCut (*kind_cut)(const ModelShape* s, int k);
    // The kinds the default embedding and head (EndOps) read: the token embedding, the untied LM head
    // (used when !tied), the final norm's weight and bias (b: -1 without a bias).
    int wte, head, final_w, final_b;
    NormKind norm;
    LayerSizes (*layer_sizes)(const ModelShape* s);
    // Reads "spec" as one of the family's named shapes or its custom syntax: 1 and *out filled, 0 when
    // spec is not this family's, a one-line error when it is but is malformed.
    int (*parse_spec)(const char* spec, ModelShape* out);
    // The family's own checks of a shape (after the common ones: shape_validate): one-line errors naming the
    // field. splits_tp: whether -tp tp can cut the blocks; if not, why (a one-line message) in `why`.
    void (*validate)(const ModelShape* s);
    // Appends the family's own parameters to a shape's one-line description (NULL: it has none to show).
    void (*describe)(const ModelShape* s, char* out, size_t n);
    int (*splits_tp)(const ModelShape* s, int tp, char* why, size_t n);
    // Header slots 8.. of the model file (slots 0-7 are llm.c's: magic, version, maxT, V, L, NH, C, Vp).
    void (*header_write)(const ModelShape* s, int32_t* h);
    void (*header_read)(const int32_t* h, ModelShape* s);
    // Training FLOPs per token (forward and backward) at sequence length T, for MFU.
    double (*flops_per_token)(const ModelShape* s, int T);
    // The LM head's and loss's cost in blocks, for the pipeline's split (schedule.h: pipeline_split).
    double (*head_cost)(const ModelShape* s, int T);
    const BlockOps* block;
    const EndOps* ends;   // its own embedding, LM head or loss (block.h); NULL: the defaults for all three
    // The linear layers LoRA may adapt (lora.h), by name in order, and each one's geometry (none: 0, NULL).
    int num_lora_targets;
    const char* const* lora_targets;
    LoraGeometry (*lora_geometry)(const ModelShape* s, int target);
    // Each target's base matrix: the kind whose tensor starts the (width x in) matrix of the target's fused
    // output (Llama's wq, which wkv joins, for q, k and v).
    const int* lora_weight_kinds;
    // The targets' modules as Hugging Face names them, for PEFT adapter folders (lora_peft.h): block l's module
    // is "<lora_hf_blocks>.<l>", each target's "<lora_hf_blocks>.<l>.<lora_hf_modules[target]>".
    const char* lora_hf_blocks;
    const char* const* lora_hf_modules;
    // The shapes "the largest model that fits" is chosen from, smallest first.
    const ShapeRung* ladder;
    int ladder_len;
};

// Kind k's entry, and whether k is one per block.
static inline const KindInfo* kind_info(const ModelShape* s, int k) { return &s->family->kinds[k]; }
static inline int kind_is_block(const ModelShape* s, int k) { return s->family->kinds[k].unit == UNIT_BLOCK; }
