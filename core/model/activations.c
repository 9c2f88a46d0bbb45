// activations.c: the walk's activation buffers, described once as tables (the walk's own here, each family's
// block's in its BlockOps): how many slices each holds per stage and set, their allocation, the memory plan
// (model_activation_bytes), and where a block finds its slice (residual_at, block_buffer). See activations.h.
#include "core/model/activations.h"

#include <stddef.h>

#include "base/common.h"
#include "core/model/block.h"
#include "core/model/context_layout.h"
#include "core/model/lora_steps.h"

static void* slice(void* base, size_t elems_per_layer, int l, DType dt) {
    return (char*)base + (size_t)l * elems_per_layer * dtype_size(dt);
}

// Which KeptBy tensors a recompute level keeps for every block, and whether the blocks' inputs live in host
// memory (-offload-act: act_offload.h), leaving the stage's input and output alone on the device.
typedef struct {
    int norm, att, act, mid, inputs_on_host;
} Keep;

static Keep keep_for(int recompute, int offload_act) {
    Keep k = {recompute < 2, recompute < 2, recompute < 1, recompute < 3, offload_act};
    return k;
}

static int kept_every_block(KeptBy kept, Keep k) {
    switch (kept) {
        case KEPT_NORM: return k.norm;
        case KEPT_ATT: return k.att;
        case KEPT_ACT: return k.act;
        case KEPT_MID: return k.mid;
        case SCRATCH: return 0;
        default: return 1;
    }
}

size_t width_elems(const ParamLayout* lay, Width w) {
    size_t tp = (size_t)lay->tp_size;
    switch (w) {
        case W_1: return 1;
        case W_C: return (size_t)lay->shape.C;
        case W_NHA: return (size_t)layout_heads(lay);
        case W_KVA_COPIED: return layout_kv_copies(lay) > 1 ? 2 * (size_t)layout_kv_heads(lay) * (size_t)layout_head_size(lay) : 0;
        case W_VPA: return (size_t)layout_vocab_rows(lay);
        case W_VSTAT: return tp > 1 ? 1 + 3 * tp : 0;
        case W_CP_QKV: return context_qkv_width(lay);
        case W_CP_ATT: return context_att_width(lay);
        case W_CP_SEND: return context_send_width(lay);
        case W_CP_RECV: return context_recv_width(lay);
        default: return lay->shape.family->block->width(lay, w);
    }
}

// The walk's own buffers, described once: how many (N, width) slices each holds on this stage, and of what.
typedef enum {
    RESIDUAL,    // L + 1: each of the stage's blocks' input, then the last block's output
    WORK,        // one, shared by the blocks and the activation sets
    HEAD,        // one on the stage with the LM head, none elsewhere
    ENCODER,     // one on the stage with the embedding lookup (its backward reads the tokens)
    UPSTREAM,    // one on a stage without it: one that sends d(input) to an earlier stage
    BLOCKS_MID,  // one per block where the recompute level keeps KEPT_MID tensors, else one shared slot
    BLOCKS_ATT,  // the same for KEPT_ATT
} Extent;

typedef struct {
    size_t field;   // offsetof(Activations, ...)
    Extent extent;
    Width width;    // WORK_WIDTH: the family's BlockOps.work
    Elem elem;
    Rows rows;
} WalkBuffer;

#define WORK_WIDTH ((Width)-1)
#define BUF(name, extent, width, elem) {offsetof(Activations, name), extent, width, elem, ALL_ROWS}
#define OWN(name, extent, width, elem) {offsetof(Activations, name), extent, width, elem, OWN_ROWS}
static const WalkBuffer WALK_BUFFERS[] = {
    OWN(resid, RESIDUAL, W_C, E_DT),
    BUF(lnf, HEAD, W_C, E_DT),
    OWN(lnf_mean, HEAD, W_1, E_F32),
    OWN(lnf_rstd, HEAD, W_1, E_F32),
    BUF(logits, HEAD, W_VPA, E_DT),
    BUF(losses, HEAD, W_1, E_F32),
    BUF(vocab_stats, HEAD, W_VSTAT, E_F32),
    BUF(tokens, ENCODER, W_1, E_I32),
    BUF(targets, HEAD, W_1, E_I32),
    BUF(proj, WORK, W_C, E_DT),
    OWN(dresid, WORK, W_C, E_DT),
    BUF(dsmall, WORK, W_C, E_DT),
    BUF(dbig, WORK, WORK_WIDTH, E_DT),
    BUF(att_scratch, WORK, W_NHA, E_F32),
    BUF(dkv_copied, WORK, W_KVA_COPIED, E_DT),
    OWN(dinput_out, UPSTREAM, W_C, E_DT),
    BUF(qkv_heads, BLOCKS_MID, W_CP_QKV, E_DT),
    BUF(att_heads, BLOCKS_ATT, W_CP_ATT, E_DT),
    BUF(cp_send, WORK, W_CP_SEND, E_DT),
    BUF(cp_recv, WORK, W_CP_RECV, E_DT),
};
#undef BUF
#undef OWN
#define NUM_WALK_BUFFERS (sizeof(WALK_BUFFERS) / sizeof(WALK_BUFFERS[0]))
_Static_assert(NUM_WALK_BUFFERS == offsetof(Activations, block) / sizeof(void*), "one WALK_BUFFERS row per named field");

// Every buffer of a stage: the walk's, then the family's block's (index NUM_WALK_BUFFERS + i: block[i]).
typedef struct {
    size_t slices;   // (N, width) slices on this stage
    int per_set;     // each activation set has its own: it outlives the forward until the set's backward
    Width width;
    Elem elem;
    Rows rows;
} BufferPlan;

static BufferPlan plan_buffer(const ParamLayout* lay, const BlockOps* ops, size_t i, Keep k) {
    size_t L = (size_t)lay->num_blocks;
    if (i >= NUM_WALK_BUFFERS) {
        const BlockBuffer* b = &ops->buffers[i - NUM_WALK_BUFFERS];
        int every = kept_every_block(b->kept, k);
        return (BufferPlan){every ? L : 1, every && b->kept != SCRATCH, b->width, b->elem, b->rows};
    }
    const WalkBuffer* b = &WALK_BUFFERS[i];
    if (b->extent == BLOCKS_MID || b->extent == BLOCKS_ATT) {
        int every = kept_every_block(b->extent == BLOCKS_MID ? KEPT_MID : KEPT_ATT, k);
        return (BufferPlan){every ? L : 1, every, b->width, b->elem, b->rows};
    }
    int head = lay->final_unit >= 0, enc = lay->emb_unit >= 0 && !lay->emb_mirror;
    size_t slices = b->extent == RESIDUAL ? (k.inputs_on_host ? 2 : L + 1) : b->extent == HEAD ? (size_t)head : b->extent == ENCODER ? (size_t)enc
                    : b->extent == UPSTREAM ? (size_t)!enc : 1;
    Width w = b->width;
    if (w == WORK_WIDTH) w = width_elems(lay, ops->work[0]) >= width_elems(lay, ops->work[1]) ? ops->work[0] : ops->work[1];
    return (BufferPlan){slices, b->extent == RESIDUAL || b->extent == ENCODER, w, b->elem, b->rows};
}

static size_t num_buffers(const BlockOps* ops) { return NUM_WALK_BUFFERS + (size_t)ops->num_buffers; }

static size_t rows_of(const ParamLayout* lay, int B, int T, Rows rows, int sp) {
    return (size_t)B * (size_t)T / (rows == OWN_ROWS && sp ? (size_t)lay->tp_size : 1);
}

static size_t plan_bytes(const BufferPlan* p, const ParamLayout* lay, DType dt, int B, int T, int sp) {
    size_t elem = p->elem == E_DT ? dtype_size(dt) : 4;
    return p->slices * rows_of(lay, B, T, p->rows, sp) * width_elems(lay, p->width) * elem;
}

static void** buffer_in(Activations* a, size_t i) {
    return i < NUM_WALK_BUFFERS ? (void**)((char*)a + WALK_BUFFERS[i].field) : &a->block[i - NUM_WALK_BUFFERS];
}

// The walk's table names every named field exactly once, and the family's fits.
void activations_check_tables(const BlockOps* ops) {
    int seen[NUM_WALK_BUFFERS] = {0};
    for (size_t i = 0; i < NUM_WALK_BUFFERS; i++) {
        size_t f = WALK_BUFFERS[i].field / sizeof(void*);
        if (WALK_BUFFERS[i].field % sizeof(void*) || f >= NUM_WALK_BUFFERS || seen[f]++)
            fail("internal: walk.c's WALK_BUFFERS table names Activations field %zu twice or not at all", f);
    }
    if (ops->num_buffers > MAX_BLOCK_BUFFERS || ops->num_stash > MAX_STASH_FIELDS)
        fail("internal: a block of %d buffers and %d stash fields (at most %d and %d)", ops->num_buffers, ops->num_stash,
             MAX_BLOCK_BUFFERS, MAX_STASH_FIELDS);
}

// Stash field f's elements over the stage's blocks.
static size_t stash_elems(const ParamLayout* lay, const BlockOps* ops, int B, int T, int sp, int f) {
    const StashField* s = &ops->stash[f];
    return (size_t)lay->num_blocks * rows_of(lay, B, T, s->rows, sp) * width_elems(lay, s->width);
}

// The bytes of one block input, a slice of resid.
size_t model_input_bytes(const ParamLayout* lay, DType dt, int B, int T, int sp) {
    return rows_of(lay, B, T, OWN_ROWS, sp) * (size_t)lay->shape.C * dtype_size(dt);
}

size_t model_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int recompute, int offload_act, int num_sets,
                              int num_stash, int sp) {
    const BlockOps* ops = lay->shape.family->block;
    Keep k = keep_for(recompute, offload_act);
    size_t total = (size_t)act_offload_slots(offload_act, lay->num_blocks) * model_input_bytes(lay, dt, B, T, sp);
    for (size_t i = 0; i < num_buffers(ops); i++) {
        BufferPlan p = plan_buffer(lay, ops, i, k);
        total += plan_bytes(&p, lay, dt, B, T, sp) * (size_t)(p.per_set ? num_sets : 1);
    }
    for (int f = 0; f < ops->num_stash; f++) total += stash_elems(lay, ops, B, T, sp, f) * dtype_size(dt) * (size_t)num_stash;
    if (lay->cp_size > 1) total += (size_t)B * T * sizeof(int);   // cp_pos
    return total + (ops->constants ? ops->constants(&lay->shape, NULL) * sizeof(float) : 0) + lora_work_bytes(lay, dt, B, T);
}

size_t model_host_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int offload_act, int num_sets, int sp) {
    return act_offload_host_bytes(offload_act, lay->num_blocks, num_sets, model_input_bytes(lay, dt, B, T, sp));
}

static Keep keep_of(const Model* g) { return keep_for(g->recompute, g->inputs.on); }

void activations_alloc(Model* g, Backend* be, MemLedger* mem) {
    Keep k = keep_of(g);
    for (int set = 0; set < g->num_sets; set++)
        for (size_t i = 0; i < num_buffers(g->ops); i++) {
            BufferPlan p = plan_buffer(g->layout, g->ops, i, k);
            size_t bytes = plan_bytes(&p, g->layout, g->dt, g->B, g->T, g->sp);
            *buffer_in(&g->sets[set], i) = set > 0 && !p.per_set ? *buffer_in(&g->sets[0], i)
                                           : bytes ? mem_alloc(be, mem, MEM_ACTIVATIONS, bytes) : NULL;
        }
    g->acts = g->sets[0];
    for (int slot = 0; slot < g->num_stash; slot++)
        for (int f = 0; f < g->ops->num_stash; f++)
            g->stash[slot].field[f] =
                mem_alloc(be, mem, MEM_ACTIVATIONS, stash_elems(g->layout, g->ops, g->B, g->T, g->sp, f) * dtype_size(g->dt));
}

// Block l's input (l = L: the stage's output) of set a: a slice of resid, or with -offload-act an inner
// one's slot.
void* activation_input(const Model* g, const Activations* a, int l) {
    if (act_offload_inner(&g->inputs, l)) return act_offload_slot(&g->inputs, l);
    int at = g->inputs.on && l == g->layout->num_blocks ? 1 : l;
    return slice(a->resid, (size_t)g->rows * g->shape.C, at, g->dt);
}

void* residual_at(Model* g, int l) { return activation_input(g, &g->acts, l); }

void* block_buffer(Model* g, int i, int l) {
    const BlockBuffer* b = &g->ops->buffers[i];
    size_t per_block = rows_of(g->layout, g->B, g->T, b->rows, g->sp) * width_elems(g->layout, b->width);
    int at = kept_every_block(b->kept, keep_of(g)) ? l : 0;
    return (char*)g->acts.block[i] + (size_t)at * per_block * (b->elem == E_DT ? dtype_size(g->dt) : 4);
}

// Block l's slice of a walk buffer kept per block where the recompute level keeps `kept`.
static void* kept_slice(Model* g, void* base, KeptBy kept, Width w, int l) {
    int at = kept_every_block(kept, keep_of(g)) ? l : 0;
    return (char*)base + (size_t)at * (size_t)g->B * g->T * width_elems(g->layout, w) * dtype_size(g->dt);
}

void* context_qkv_heads(Model* g, int l) { return kept_slice(g, g->acts.qkv_heads, KEPT_MID, W_CP_QKV, l); }
void* context_att_heads(Model* g, int l) { return kept_slice(g, g->acts.att_heads, KEPT_ATT, W_CP_ATT, l); }

// Block l's slices (l counts the stage's blocks) of stash slot `slot`.
WeightGradStash activations_stash_of_block(Model* g, int slot, int l) {
    if (slot < 0 || slot >= g->num_stash) fail("internal: stash slot %d of %d", slot, g->num_stash);
    WeightGradStash w = g->stash[slot];
    for (int f = 0; f < g->ops->num_stash; f++)
        w.field[f] = slice(w.field[f], stash_elems(g->layout, g->ops, g->B, g->T, g->sp, f) / (size_t)g->layout->num_blocks, l, g->dt);
    return w;
}


void activations_free(Model* g, Backend* be) {
    Keep k = keep_of(g);
    for (int set = 0; set < g->num_sets; set++)
        for (size_t i = 0; i < num_buffers(g->ops); i++) {
            void* buf = *buffer_in(&g->sets[set], i);
            if (buf && (set == 0 || plan_buffer(g->layout, g->ops, i, k).per_set)) be_free(be, buf);
        }
    for (int slot = 0; slot < g->num_stash; slot++)
        for (int f = 0; f < g->ops->num_stash; f++) be_free(be, g->stash[slot].field[f]);
}
