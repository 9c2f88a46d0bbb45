// lora.h: low-rank adapters (LoRA). A LoRA'd family is built at run start from a base family and the LoRA
// options: its kinds are the base's, every one frozen (optimizer_kind.h), then per target t of the
// family's list (GPT-2: qkv, proj, fc, fcproj; Llama: q, k, v, o, gate, up, down) that the run selects,
// lora_A.<t> (R, IC_t) and lora_B.<t> (OC_t, R), trained with AdamW, one per block. The target's linear
// out (N, OC_t) = x (N, IC_t) W_t^T becomes out += scale * (x A^T) B^T, scale = alpha / R (rsLoRA: alpha /
// sqrt(R)); A starts uniform in [-1/sqrt(IC_t), 1/sqrt(IC_t)], B at zero, so step 0 is the base model's.
// The layout, ZeRO, the walk and --estimate see it as any family: only the blocks call the hooks below.
#pragma once
#include "core/model/model.h"

#define LORA_MAX_TARGETS 8
#define LORA_MAX_KINDS 32
#define LORA_KIND_NAME 24

typedef struct {
    int rank;              // R >= 1 (0: no LoRA)
    float alpha;           // scale alpha / R (rslora: alpha / sqrt(R)); <= 0: R (scale 1)
    int rslora;
    float dropout;         // on the adapters' input, in [0, 1)
    const char* targets;   // comma-separated target names; NULL or "": every target of the family
} LoraOptions;

typedef struct {
    ModelFamily family;   // first: a ModelShape's family pointer is this struct's
    const ModelFamily* base;
    KindInfo kinds[LORA_MAX_KINDS];
    char kind_names[LORA_MAX_KINDS][LORA_KIND_NAME];
    char name[32];
    int rank;
    float alpha, scale, dropout;
    int rslora;
    uint64_t seed;                      // the dropout masks': the run's -seed, which the run sets after the build
    int num_targets;                    // the selected targets, in the family's order
    int target[LORA_MAX_TARGETS];       // each one's index in the family's list
    unsigned target_bits;               // bit i: target i of the family's list is selected
} LoraFamily;

// Builds lf from the base shape and the options; a one-line error for an unknown target, a repeated one,
// a rank of 0 or larger than a target's layer, or a dropout outside [0, 1).
void lora_family_build(LoraFamily* lf, const ModelShape* base, const LoraOptions* o);
// The base shape with lf's family (lf must outlive it).
ModelShape lora_shape(const LoraFamily* lf, const ModelShape* base);
// The largest rank the options' targets allow on base (the smaller side of their smallest layer).
int lora_max_rank(const ModelShape* base, const LoraOptions* o);
// With o->rank: lora_family_build into lf, then lora_shape; else base itself.
ModelShape lora_apply(LoraFamily* lf, ModelShape base, const LoraOptions* o);
// The shape's LoRA'd family, or NULL for a family of its own.
const LoraFamily* lora_of(const ModelShape* s);
// The base family's shape of a LoRA'd one (itself otherwise): what the model file holds.
ModelShape lora_base_shape(const ModelShape* s);
// The kinds of the adapters of selected target j (0 .. num_targets-1): A, then B.
static inline int lora_kind_a(const LoraFamily* lf, int j) { return lf->base->num_kinds + 2 * j; }
static inline int lora_kind_b(const LoraFamily* lf, int j) { return lf->base->num_kinds + 2 * j + 1; }
// The adapter file (docs/formats.md): 256 int32 [LORA_FILE_MAGIC, 1, R, targets, L, target bits, alpha x 1000,
// rslora], then per layer and selected target A (R, in) and B (out, R), fp32 row-major: whole adapters at
// any -tp or -pp. Reads the part of path's adapters that lay holds (a stage's layers, a tensor rank's
// shards and copies) into flat (the layout's values), after one-line errors naming any difference from the
// run's LoRA (a PEFT adapter folder is lora_peft.h's).
#define LORA_FILE_MAGIC 20261130
void lora_read_adapters(const char* path, const ParamLayout* lay, float* flat);
// Writing one (a checkpoint's adapters.bin): its header, sized (zeros), then each writer's part in place:
// the adapters lay holds but its copies (another rank writes those).
void lora_adapter_file_create(const char* path, const ModelShape* s);
void lora_write_adapter_part(const char* path, const ParamLayout* lay, const float* flat);
long long lora_adapter_file_bytes(const ModelShape* s);
// Places adapter tensor t's whole values (all its rows and columns, as the adapter file holds them) into
// flat at the part the layout holds: the rows or columns of a tensor rank's shard, or all of them.
void lora_place_whole(const ParamLayout* lay, const ParamTensor* t, const float* whole, float* flat);
// Target `target`'s geometry on each of tp tensor ranks: a column-parallel target's rows of its block and
// where they sit in the rank's fused output, a row-parallel target's share of its input columns.
LoraGeometry lora_rank_geometry(const ModelFamily* base, const ModelShape* s, int target, int tp);
// The selected index of family target i, or -1 when the run does not adapt it.
int lora_selected(const LoraFamily* lf, int target);
// The key of the dropout mask on one adapter's input in training (kernels.h: lora_dropout): a hash of the run's
// seed, the micro-batch's position in the data order (dataloader_position: the same data has the same position
// under every layout), the layer and the target (its index in the family's list). A recomputation, a split
// backward, any layout and scripts/reference.py draw the same mask.
uint32_t lora_dropout_key(const LoraFamily* lf, long long position, int layer, int target);
