// walk.c: the forward and backward walk over units, for any family. See walk.h; a family's block is block.h's.
#include "core/model/walk.h"
#include "core/model/lora_steps.h"

#include <stddef.h>

#include "base/common.h"
#include "core/model/block.h"
#include "core/model/context_layout.h"

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
static void check_buffer_tables(const BlockOps* ops) {
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
static size_t input_bytes(const ParamLayout* lay, DType dt, int B, int T, int sp) {
    return rows_of(lay, B, T, OWN_ROWS, sp) * (size_t)lay->shape.C * dtype_size(dt);
}

size_t model_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int recompute, int offload_act, int num_sets,
                              int num_stash, int sp) {
    const BlockOps* ops = lay->shape.family->block;
    Keep k = keep_for(recompute, offload_act);
    size_t total = (size_t)act_offload_slots(offload_act, lay->num_blocks) * input_bytes(lay, dt, B, T, sp);
    for (size_t i = 0; i < num_buffers(ops); i++) {
        BufferPlan p = plan_buffer(lay, ops, i, k);
        total += plan_bytes(&p, lay, dt, B, T, sp) * (size_t)(p.per_set ? num_sets : 1);
    }
    for (int f = 0; f < ops->num_stash; f++) total += stash_elems(lay, ops, B, T, sp, f) * dtype_size(dt) * (size_t)num_stash;
    if (lay->cp_size > 1) total += (size_t)B * T * sizeof(int);   // cp_pos
    return total + (ops->constants ? ops->constants(&lay->shape, NULL) * sizeof(float) : 0) + lora_work_bytes(lay, dt, B, T);
}

size_t model_host_activation_bytes(const ParamLayout* lay, DType dt, int B, int T, int offload_act, int num_sets, int sp) {
    return act_offload_host_bytes(offload_act, lay->num_blocks, num_sets, input_bytes(lay, dt, B, T, sp));
}

static Keep keep_of(const Model* g) { return keep_for(g->recompute, g->inputs.on); }

static void alloc_buffers(Model* g, Backend* be, MemLedger* mem) {
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

// Under -cp every token's position: where this rank's t / cp of each row lie (context_position).
static void create_positions(Model* g, Backend* be, MemLedger* mem) {
    size_t N = (size_t)g->B * g->T;
    int* host = (int*)xmalloc(N * sizeof(int));
    for (size_t i = 0; i < N; i++)
        host[i] = context_position(g->layout->cp_ring, g->layout->cp_size, comm_rank(g->cp), g->T, (int)(i % (size_t)g->T));
    g->cp_pos = (int*)mem_alloc(be, mem, MEM_ACTIVATIONS, N * sizeof(int));
    be_upload(be, g->cp_pos, host, N * sizeof(int));
    free(host);
}

void model_create(Model* g, Backend* be, MemLedger* mem, const ParamLayout* layout, ParamStore store, Comm* tp, Comm* kv_copies,
                  Comm* cp, int sp, DType dt, int B, int T, int recompute, int offload_act, int num_sets, int num_stash, int micro) {
    memset(g, 0, sizeof(*g));
    if ((cp ? comm_size(cp) : 1) != layout->cp_size)
        fail("internal: a layout for %d context ranks on a group of %d", layout->cp_size, cp ? comm_size(cp) : 1);
    int tp_ranks = tp ? comm_size(tp) : 1, copies = kv_copies ? comm_size(kv_copies) : 1;
    if (tp_ranks != layout->tp_size) fail("internal: a layout for %d tensor ranks on a group of %d", layout->tp_size, tp_ranks);
    if (copies != layout_kv_copies(layout)) fail("internal: %d copies of each kv head in the layout, a group of %d", layout_kv_copies(layout), copies);
    if (sp && (!tp || (B * T) % tp_ranks)) fail("internal: sequence parallelism over %d ranks for %d rows", tp_ranks, B * T);
    g->sp = sp && tp;
    g->rows = g->sp ? B * T / layout->tp_size : B * T;
    g->shape = layout->shape;
    g->layout = layout;
    g->ops = layout->shape.family->block;
    g->store = store;
    g->tp = tp;
    g->kv_copies = kv_copies;
    g->cp = cp;
    g->dt = dt;
    g->B = B;
    g->T = T;
    g->recompute = recompute;
    if (num_sets < 1 || num_stash < 0) fail("internal: %d activation sets, %d stash slots on this stage", num_sets, num_stash);
    check_buffer_tables(g->ops);
    g->num_sets = num_sets;
    if (offload_act && recompute < 3) fail("internal: the blocks' inputs offloaded at -r %d (they are all -r 3 keeps)", recompute);
    act_offload_create(&g->inputs, be, mem, offload_act, layout->num_blocks, num_sets, input_bytes(layout, dt, B, T, g->sp));
    g->sets = (Activations*)xcalloc((size_t)num_sets, sizeof(Activations));
    g->num_stash = num_stash;
    g->stash = (WeightGradStash*)xcalloc((size_t)(num_stash ? num_stash : 1), sizeof(WeightGradStash));
    alloc_buffers(g, be, mem);
    size_t nc = g->ops->constants ? g->ops->constants(&g->shape, NULL) : 0;
    if (nc) {
        float* host = (float*)xmalloc(nc * sizeof(float));
        g->ops->constants(&g->shape, host);
        g->constants = (float*)mem_alloc(be, mem, MEM_ACTIVATIONS, nc * sizeof(float));
        be_upload(be, g->constants, host, nc * sizeof(float));
        free(host);
    }
    if (cp) create_positions(g, be, mem);
    if (model_has_encoder(g) || model_has_head(g)) batch_io_create(&g->io, be, B * T, micro);   // the only users
    lora_work_create(g, be, mem);
}

size_t model_document_bytes(const Model* g) { return g->doc_arrays ? (size_t)g->num_sets * 2 * g->B * g->T * sizeof(int) : 0; }

void model_use_documents(Model* g, Backend* be, MemLedger* mem) {
    if (g->doc_arrays) return;
    g->doc_arrays = (int*)mem_alloc(be, mem, MEM_ACTIVATIONS, (size_t)g->num_sets * 2 * g->B * g->T * sizeof(int));
    if (!g->io.rows) batch_io_create(&g->io, be, g->B * g->T, 1);
}

// Set `set`'s pos and doc: the micro-batch's, uploaded; without documents no doc and the positions of
// -cp (NULL without).
static void upload_documents(Model* g, Backend* be, int set, const MicroBatch* mb) {
    Activations* a = &g->sets[set];
    if (!mb->pos || !mb->doc) {
        a->pos = g->cp_pos;
        a->doc = NULL;
        return;
    }
    if (!g->doc_arrays) fail("internal: a micro-batch with documents on a model without model_use_documents");
    size_t N = (size_t)g->B * g->T;
    a->pos = g->doc_arrays + (size_t)set * 2 * N;
    a->doc = a->pos + N;
    batch_io_upload(&g->io, be, a->pos, mb->pos);
    batch_io_upload(&g->io, be, a->doc, mb->doc);
}

void model_destroy(Model* g, Backend* be) {
    batch_io_destroy(&g->io, be);
    if (g->doc_arrays) be_free(be, g->doc_arrays);
    Keep k = keep_of(g);
    for (int set = 0; set < g->num_sets; set++)
        for (size_t i = 0; i < num_buffers(g->ops); i++) {
            void* buf = *buffer_in(&g->sets[set], i);
            if (buf && (set == 0 || plan_buffer(g->layout, g->ops, i, k).per_set)) be_free(be, buf);
        }
    for (int slot = 0; slot < g->num_stash; slot++)
        for (int f = 0; f < g->ops->num_stash; f++) be_free(be, g->stash[slot].field[f]);
    if (g->constants) be_free(be, g->constants);
    if (g->cp_pos) be_free(be, g->cp_pos);
    lora_work_destroy(g, be);
    act_offload_destroy(&g->inputs, be);
    free(g->stash);
    free(g->sets);
    memset(g, 0, sizeof(*g));
}

// Block l's input (l = L: the stage's output) of set a: a slice of resid, or with -offload-act an inner
// one's slot.
static void* input_of(const Model* g, const Activations* a, int l) {
    if (act_offload_inner(&g->inputs, l)) return act_offload_slot(&g->inputs, l);
    int at = g->inputs.on && l == g->layout->num_blocks ? 1 : l;
    return slice(a->resid, (size_t)g->rows * g->shape.C, at, g->dt);
}

void* model_stage_input(Model* g, int set) { return g->sets[set].resid; }
void* model_stage_output(Model* g, int set) { return input_of(g, &g->sets[set], g->layout->num_blocks); }
void* model_boundary_grad(Model* g) { return g->sets[0].dresid; }
size_t model_boundary_bytes(const Model* g) { return (size_t)g->rows * g->shape.C * dtype_size(g->dt); }
void* model_grad_to_send(Model* g, Backend* be) {
    if (!g->sets[0].dinput_out) fail("internal: model_grad_to_send on the stage with the embeddings");
    be_copy(be, g->sets[0].dinput_out, g->sets[0].dresid, model_boundary_bytes(g));
    return g->sets[0].dinput_out;
}

static void use_set(Model* g, int set) {
    if (set < 0 || set >= g->num_sets) fail("internal: activation set %d of %d", set, g->num_sets);
    g->acts = g->sets[set];
}

void* residual_at(Model* g, int l) { return input_of(g, &g->acts, l); }

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
static WeightGradStash stash_of_block(Model* g, int slot, int l) {
    if (slot < 0 || slot >= g->num_stash) fail("internal: stash slot %d of %d", slot, g->num_stash);
    WeightGradStash w = g->stash[slot];
    for (int f = 0; f < g->ops->num_stash; f++)
        w.field[f] = slice(w.field[f], stash_elems(g->layout, g->ops, g->B, g->T, g->sp, f) / (size_t)g->layout->num_blocks, l, g->dt);
    return w;
}

// ---------------------------------------------------------------------------------------------------
// The model's ends (ends.c) in the walk: which units they read, and when those are fetched and released.

void model_logits_to_host(Model* g, Backend* be, int first, int rows, float* out) {
    const ParamLayout* lay = g->layout;
    int V = g->shape.V, Vl = layout_vocab_rows(lay), v0 = layout_vocab_first(lay), real = layout_vocab_real(lay);
    size_t x = dtype_size(g->dt);
    char* raw = (char*)xmalloc((size_t)rows * Vl * x);
    be_download(be, raw, (char*)g->acts.logits + (size_t)first * Vl * x, (size_t)rows * Vl * x);
    if (!g->tp) {
        for (int n = 0; n < rows; n++) host_from_dtype(out + (size_t)n * V, raw + (size_t)n * Vl * x, g->dt, (size_t)V);
        free(raw);
        return;
    }
    // Each rank adds its columns into zeros: every value is one rank's plus exact zeros.
    float* mine = (float*)xmalloc((size_t)(real ? real : 1) * sizeof(float));
    double* row = (double*)xmalloc((size_t)V * sizeof(double));
    for (int n = 0; n < rows; n++) {
        host_from_dtype(mine, raw + (size_t)n * Vl * x, g->dt, (size_t)real);
        for (int v = 0; v < V; v++) row[v] = v >= v0 && v < v0 + real ? (double)mine[v - v0] : 0.0;
        comm_allreduce_host_sum(g->tp, row, V);
        for (int v = 0; v < V; v++) out[(size_t)n * V + v] = (float)row[v];
    }
    free(row);
    free(mine);
    free(raw);
}

// The unit holding the LM head's matrix.
static int head_unit(const Model* g) { return g->shape.tied ? g->layout->emb_unit : final_norm_unit(g->layout); }

// The LM head and the loss: logits, then (with targets) the losses.
static void head_forward(Model* g, Backend* be, const int* targets, float dloss, float* logits_dump) {
    Activations* a = &g->acts;
    int fin = final_norm_unit(g->layout), hu = head_unit(g);
    void* head_base = store_params(&g->store, be, hu);
    ends_head(g, be, (HeadUnits){store_params(&g->store, be, fin), head_base});
    store_params_done(&g->store, fin);
    if (hu != fin) store_params_done(&g->store, hu);
    if (logits_dump) model_logits_to_host(g, be, 0, g->B * g->T, logits_dump);
    if (!targets) return;
    batch_io_upload(&g->io, be, a->targets, targets);
    batch_io_before_losses(&g->io, be);
    ends_loss(g, be, targets, dloss);
    batch_io_queue_losses(&g->io, be, a->losses);
}

double model_take_losses(Model* g, Backend* be) { return batch_io_take_losses(&g->io, be); }

int model_take_token_losses(Model* g, Backend* be, float* out, int room) { return batch_io_take_each(&g->io, be, out, room); }

// The forward of model_forward (training 0) and model_forward_training.
static void forward_walk(Model* g, Backend* be, int set, const MicroBatch* mb, int training, long long position, float dloss,
                         float* logits_dump) {
    const ParamLayout* lay = g->layout;
    if (set < 0 || set >= g->num_sets) fail("internal: activation set %d of %d", set, g->num_sets);
    upload_documents(g, be, set, mb);
    g->sets[set].training = training;
    g->sets[set].position = position;
    use_set(g, set);
    Activations* a = &g->acts;
    if (model_has_encoder(g)) {
        batch_io_upload(&g->io, be, a->tokens, mb->tokens);
        ends_embed(g, be, store_params(&g->store, be, lay->emb_unit));
        if (!model_has_head(g) || head_unit(g) != lay->emb_unit) store_params_done(&g->store, lay->emb_unit);
    }
    for (int i = 0; i < lay->num_blocks; i++) {
        int l = lay->first_block + i, u = unit_of_block(lay, l);
        BlockRef b = {.index = i, .layer = l, .params = store_params(&g->store, be, u)};
        act_offload_before_forward(&g->inputs, be, i);
        g->ops->forward(g, be, &b, 0);
        act_offload_after_forward(&g->inputs, be, set, i, training);
        store_params_done(&g->store, u);
    }
    if (model_has_head(g)) head_forward(g, be, mb->targets, dloss, logits_dump);
}

void model_forward(Model* g, Backend* be, int set, const MicroBatch* mb, float dloss, float* logits_dump) {
    forward_walk(g, be, set, mb, 0, 0, dloss, logits_dump);
}

void model_forward_training(Model* g, Backend* be, int set, const MicroBatch* mb, long long position, float dloss,
                            float* logits_dump) {
    forward_walk(g, be, set, mb, 1, position, dloss, logits_dump);
}

// dlogits -> the gradient of the last block's output, in acts.dresid; the head's and the final norm's
// gradients accumulate. A tied head's gradient buffer (wte's) stays live for the encoder on a one-stage run.
static void head_backward(Model* g, Backend* be) {
    const ParamLayout* lay = g->layout;
    const ParamStore* ps = &g->store;
    int fin = final_norm_unit(lay), hu = head_unit(g);
    void* head_params = store_params(ps, be, hu);
    void* head_grads = store_grads(ps, be, hu);
    HeadUnits params = {store_params(ps, be, fin), head_params}, grads = {store_grads(ps, be, fin), head_grads};
    // The backward needs the last block next: a store that gathers may start now, while the head computes.
    store_prefetch(ps, be, unit_of_block(lay, lay->first_block + lay->num_blocks - 1));
    ends_head_backward(g, be, params, grads);
    store_grads_done(ps, be, fin);
    store_params_done(ps, fin);
    if (hu != fin && !model_has_encoder(g)) {
        store_grads_done(ps, be, hu);
        store_params_done(ps, hu);
    }
}

// The backward walk: the head, the blocks from the last, the embeddings. W walks the blocks only (the
// head's and the embeddings' gradients are B's: small, or on the stage that runs W at once), in the same
// order, so a store that gathers (ZeRO-3) prefetches as it does there, and asks for the parameters too:
// the recompute levels refill what B refilled, and the norm kernels take their weights. slot: B's and W's
// stash slot.
static void backward_walk(Model* g, Backend* be, int set, BackwardMode mode, int slot) {
    const ParamLayout* lay = g->layout;
    const ParamStore* ps = &g->store;
    use_set(g, set);
    if (mode != BWD_WEIGHT && model_has_head(g)) head_backward(g, be);
    for (int i = lay->num_blocks - 1; i >= 0; i--) {
        int l = lay->first_block + i, u = unit_of_block(lay, l), weights = mode != BWD_INPUT;
        BlockRef b = {.index = i, .layer = l, .params = store_params(ps, be, u)};   // one request (a gather) serves both
        act_offload_before_backward(&g->inputs, be, set, i);
        if (g->recompute >= 3) g->ops->forward(g, be, &b, 1);
        else g->ops->recompute(g, be, &b);
        BlockBackward c = {.g = g, .be = be, .mode = mode, .index = i};
        if (mode != BWD_FUSED) c.stash = stash_of_block(g, slot, i);
        if (weights) b.grads = store_grads(ps, be, u);
        g->ops->backward(&c, &b);
        if (weights) store_grads_done(ps, be, u);
        store_params_done(ps, u);
    }
    if (mode == BWD_WEIGHT || !model_has_encoder(g)) return;
    void* demb = store_grads(ps, be, lay->emb_unit);   // still live with a tied head
    ends_embed_backward(g, be, demb);
    store_grads_done(ps, be, lay->emb_unit);
    if (head_unit(g) == lay->emb_unit) store_params_done(ps, lay->emb_unit);
}

void model_backward(Model* g, Backend* be, int set) { backward_walk(g, be, set, BWD_FUSED, -1); }
void model_backward_input(Model* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_INPUT, slot); }
void model_backward_weight(Model* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_WEIGHT, slot); }
