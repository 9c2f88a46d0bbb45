// zero.c: ZeRO by capabilities. See zero.h.
#include "zero.h"

#include "base/common.h"
#include "core/zero/grad_landing.h"
#include "core/util/phase_timer.h"
#include "kernels/host_elem.h"

// The gradient buffers; which exist depends on the capabilities.
typedef struct {
    void* whole;         // without shard_grads: full flat buffer (dt), accumulating over micro-steps
    void* piece;         // shard_state without shard_grads: (state_elems) dt, the reduce-scattered gradient
    float* acc;          // shard_grads: (state_elems) fp32 accumulator; host memory with grads_on_host
    float* piece_f32;    // shard_grads: one piece converted to fp32 before it is added (grads_on_host: the
                         // tied embedding's piece, summed over the pair on the backend)
    GradLanding* landing; // grads_on_host: how each reduced piece comes down and is added (core/zero/grad_landing.h)
} GradBuffers;

// A gradient slot's life (shard_grads). Its reduce-scatter is finished only when the buffer is wanted again,
// so that it runs during the next unit's backward.
typedef enum {
    GRAD_FREE,       // nothing in it the accumulator still needs.
                     // -> FILLING: walk_grads zeroes it for a unit
    GRAD_FILLING,    // the walk adds `unit`'s gradients, over all its requests of the micro-step.
                     // -> REDUCING: walk_grads_done starts the reduce-scatter
    GRAD_REDUCING,   // `unit`'s reduce-scatter is in flight.
                     // -> FREE: finish_grad_slot waits for it and adds this rank's piece to the accumulator
} GradSlotState;

typedef struct {
    void* buf;            // dt, laid out like its unit's parameters
    GradSlotState state;
    int unit;             // GRAD_FILLING, GRAD_REDUCING: whose gradients
    CommHandle flight;    // GRAD_REDUCING: the reduce-scatter
    unsigned long seq;    // start order of its last reduce-scatter: the older of two is finished first
} GradSlot;

// The walk's gradient buffers (shard_grads): two rotating ones for the blocks and the final LayerNorm, and
// one for the embeddings, which the LM head and the encoder both fill.
typedef struct {
    GradSlot slot[2];
    GradSlot emb;
    unsigned long started;   // reduce-scatters started so far: the next one's seq
} UnitGrads;

// A block parameter slot's life (shard_params).
typedef enum {
    PARAMS_FREE,        // nothing in it the walk will ask for.
                        // -> PREFETCHED: prefetch starts the gather of the block the walk will ask for next;
                        // -> HELD: block_params_of starts the gather of a block the walk asks for now
    PARAMS_PREFETCHED,  // `unit`'s gather runs ahead of the walk.
                        // -> HELD: block_params_of, when the walk asks for it;
                        // -> FREE: drop_prefetches, when the buffer is needed or the parameters change
    PARAMS_HELD,        // the walk computes with `unit`, its gather finished by block_params_of.
                        // -> FREE: walk_params_done
} ParamSlotState;

typedef struct {
    void* buf;            // dt, the largest block unit
    ParamSlotState state;
    int unit;             // PARAMS_PREFETCHED, PARAMS_HELD: whose parameters
    CommHandle flight;    // the gather into buf
    BeEvent* uploaded;    // params_on_host: the upload of this rank's piece into buf (gather_start)
} ParamSlot;

// The embeddings and the final LayerNorm (shard_params): small, or shared by the LM head and the encoder, so
// gathered at first use and kept until the parameters change.
enum { RESIDENT_EMB, RESIDENT_FINAL, RESIDENTS };

typedef struct {
    void* buf;            // dt, the unit's padded size
    int gathered;         // since the parameters last changed
    BeEvent* uploaded;    // params_on_host: as ParamSlot's
} Resident;

// The gathered parameters (shard_params), and the block the walk asked for last, from which the direction
// of its next request follows.
typedef struct {
    ParamSlot slot[2];
    Resident resident[RESIDENTS];
    int walk_started, walk_last_block;
} Gathered;

struct Zero {
    ZeroCaps caps;
    Comm* dp;            // data-parallel group; NULL for a single process
    Comm* tied;          // pipeline: stage 0 <-> last stage, summing the embedding and its mirror; else NULL
    int rank, size;      // in the DP group
    DType dt;
    const ParamLayout* lay;
    size_t piece_offset[MAX_UNITS];   // state index of each unit's piece (shard_state)
    size_t state_elems;  // elements of master / m / v held here: the layout's total, or the sum of the pieces
    // Parameters: the full flat buffer, or this rank's pieces with shard_params (host memory with
    // params_on_host); type dt.
    void* params;
    float* master;       // (state_elems) fp32; aliases params where both have the same indexing and type
    float* adam_m;
    float* adam_v;
    GradBuffers grad;
    UnitGrads unit_grads;      // shard_grads
    Gathered gathered;         // shard_params
    float* norm_acc;           // one float of backend scratch
    HostStage stage;           // state_on_host: the optimizer's staging (model_state.h)
    PendingBuffers pending;    // delayed_update: (state_elems) each, host memory
    double host_copy_seconds;  // grads_on_host / params_on_host: the walk's copies since last read
};

ZeroCaps zero_caps(int stage) {
    if (stage < 0 || stage > 3) fail("internal: ZeRO stage %d (0..3)", stage);
    ZeroCaps c = {.shard_state = stage >= 1, .shard_grads = stage >= 2, .shard_params = stage >= 3};
    return c;
}

ZeroCaps zero_offload(ZeroCaps caps, int level) {
    if (level < 0 || level > 2) fail("internal: offload level %d (0..2)", level);
    caps.state_on_host = level >= 1;
    caps.grads_on_host = level >= 2 && caps.shard_grads;
    caps.params_on_host = level >= 2 && caps.shard_params;
    return caps;
}

static size_t xs(const Zero* z) { return dtype_size(z->dt); }
static void* at(void* base, size_t index, size_t elem_bytes) { return (char*)base + index * elem_bytes; }
static const Unit* unit(const Zero* z, int u) { return &z->lay->units[u]; }
static size_t piece(const Zero* z, int u) { return unit(z, u)->padded / (size_t)z->size; }
static int emb_unit(const Zero* z) { return z->lay->emb_unit; }
static int final_unit(const Zero* z) { return z->lay->final_unit; }
static int is_block(const Zero* z, int u) { return u != emb_unit(z) && u != final_unit(z); }

static Place place(int on_host) { return on_host ? IN_HOST : IN_BACKEND; }
static Place state_place(const Zero* z) { return place(z->caps.state_on_host); }
static Place grads_place(const Zero* z) { return place(z->caps.grads_on_host); }
static Place params_place(const Zero* z) { return place(z->caps.params_on_host); }

// The reduced gradient, what the optimizer reads: with shard_state, this rank's piece of each unit
// (indexed like the state: a piece); otherwise the whole all-reduced buffer (indexed like the layout).
static int reduced_is_piece(const Zero* z) { return z->caps.shard_state; }

static DType reduced_dtype(const Zero* z) { return z->caps.shard_grads ? DT_FP32 : z->dt; }

static void* reduced_grads(const Zero* z, DType* dt) {
    *dt = reduced_dtype(z);
    if (z->caps.shard_grads) return z->grad.acc;
    return reduced_is_piece(z) ? z->grad.piece : z->grad.whole;
}

// Largest unit other than the embeddings (the rotating buffers hold blocks and the final LayerNorm).
static size_t largest_block_unit(const ParamLayout* lay) {
    size_t m = 0;
    for (int u = 0; u < lay->num_units; u++)
        if (u != lay->emb_unit) m = lay->units[u].padded > m ? lay->units[u].padded : m;
    return m;
}

// On one rank each unit's piece is the whole unit in its place: piece-indexed state and whole buffers share
// indices, so a piece buffer may be the whole buffer itself.
static int pieces_are_whole(const Zero* z) {
    for (int u = 0; u < z->lay->num_units; u++)
        if (z->piece_offset[u] != z->lay->units[u].offset || piece(z, u) != z->lay->units[u].padded) return 0;
    return 1;
}

// Whether a pipeline splits this layout's embedding from its LM head (stage 0 holds wte, the last stage its
// mirror; the tied group sums the two): the layout alone says so, so --estimate (no groups) plans the same.
static int embedding_is_tied(const ParamLayout* lay) {
    return lay->emb_unit >= 0 && (lay->emb_mirror || lay->final_unit < 0);
}

static void allocate_unit_grads(Zero* z, Backend* be, MemLedger* mem) {
    size_t block = largest_block_unit(z->lay), x = xs(z);
    for (int s = 0; s < 2; s++) {
        z->unit_grads.slot[s].buf = mem_alloc(be, mem, MEM_GRADS, block * x);
        z->unit_grads.slot[s].unit = -1;
    }
    if (emb_unit(z) >= 0) z->unit_grads.emb.buf = mem_alloc(be, mem, MEM_GRADS, unit(z, emb_unit(z))->padded * x);
}

static void allocate_grads(Zero* z, Backend* be, MemLedger* mem) {
    size_t total = z->lay->total, x = xs(z);
    GradBuffers* g = &z->grad;
    if (!z->caps.shard_grads) {
        g->whole = mem_alloc(be, mem, MEM_GRADS, total * x);
        if (reduced_is_piece(z)) g->piece = pieces_are_whole(z) ? g->whole : mem_alloc(be, mem, MEM_GRADS, z->state_elems * x);
        return;
    }
    size_t max_piece = 0;
    for (int u = 0; u < z->lay->num_units; u++) max_piece = piece(z, u) > max_piece ? piece(z, u) : max_piece;
    if (z->caps.grads_on_host) {
        g->acc = (float*)mem_alloc_host(be, mem, MEM_HOST_GRADS, z->state_elems * 4);
        g->landing = grad_landing_create(be, mem, z->dt, max_piece);
    } else {
        g->acc = (float*)mem_alloc(be, mem, MEM_GRADS, z->state_elems * 4);
    }
    // The accumulator's additions on the backend; with grads_on_host only the tied embedding's all-reduce.
    if (!z->caps.grads_on_host || embedding_is_tied(z->lay)) g->piece_f32 = (float*)mem_alloc(be, mem, MEM_GRADS, max_piece * 4);
    allocate_unit_grads(z, be, mem);
}

// The optimizer stages a span through host memory this many elements at a time (state_on_host): a fixed
// bound, so the staging buffer does not grow with the model.
#define HOST_STAGE_ELEMS ((size_t)1 << 20)

// Master and Adam state: backend memory in category c, or host memory with state_on_host.
static float* alloc_state(Zero* z, Backend* be, MemLedger* mem, MemCategory c) {
    size_t bytes = z->state_elems * 4;
    return (float*)(z->caps.state_on_host ? mem_alloc_host(be, mem, MEM_HOST_STATE, bytes) : mem_alloc(be, mem, c, bytes));
}

static void free_in(Backend* be, Place where, void* p) {
    if (!p) return;
    if (where == IN_HOST) be_host_free(be, p);
    else be_free(be, p);
}

// The optimizer's staging bytes per element (model_state.h): a gradient where it must come down, a working
// value where it must go up.
static size_t stage_elem_bytes(const Zero* z) {
    if (!z->caps.state_on_host) return 0;
    return (z->caps.grads_on_host ? 0 : 4) + (z->caps.params_on_host ? 0 : xs(z));
}

static void allocate_host_buffers(Zero* z, Backend* be, MemLedger* mem) {
    if (z->caps.delayed_update) {
        z->pending.grad = mem_alloc_host(be, mem, MEM_HOST_STATE, z->state_elems * dtype_size(reduced_dtype(z)));
        z->pending.params = mem_alloc_host(be, mem, MEM_HOST_STATE, z->state_elems * xs(z));
    }
    if (stage_elem_bytes(z)) {
        z->stage.elems = z->state_elems < HOST_STAGE_ELEMS ? z->state_elems : HOST_STAGE_ELEMS;
        z->stage.buf = mem_alloc_host(be, mem, MEM_HOST_STATE, 2 * z->stage.elems * stage_elem_bytes(z));
    }
}

static void allocate_gathered(Zero* z, Backend* be, MemLedger* mem) {
    size_t block = largest_block_unit(z->lay), x = xs(z);
    Gathered* g = &z->gathered;
    for (int s = 0; s < 2; s++) {
        g->slot[s].buf = mem_alloc(be, mem, MEM_PARAMS, block * x);
        g->slot[s].unit = -1;
    }
    if (emb_unit(z) >= 0) g->resident[RESIDENT_EMB].buf = mem_alloc(be, mem, MEM_PARAMS, unit(z, emb_unit(z))->padded * x);
    if (final_unit(z) >= 0) g->resident[RESIDENT_FINAL].buf = mem_alloc(be, mem, MEM_PARAMS, unit(z, final_unit(z))->padded * x);
    if (!z->caps.params_on_host || !be) return;
    for (int s = 0; s < 2; s++) g->slot[s].uploaded = be_event_create(be);
    for (int r = 0; r < RESIDENTS; r++) g->resident[r].uploaded = be_event_create(be);
}

static void allocate_params(Zero* z, Backend* be, MemLedger* mem) {
    size_t x = xs(z);
    if (z->caps.params_on_host) z->params = mem_alloc_host(be, mem, MEM_HOST_PARAMS, z->state_elems * x);
    else z->params = mem_alloc(be, mem, MEM_PARAMS, (z->caps.shard_params ? z->state_elems : z->lay->total) * x);
    // fp32 parameters are their own master copy where both use the same indexing (both whole, both pieces,
    // or pieces that are the whole unit in its place) and the same memory (not with state_on_host).
    int same_indexing = z->caps.shard_params == z->caps.shard_state || pieces_are_whole(z);
    int alias = z->dt == DT_FP32 && same_indexing && !z->caps.state_on_host;
    z->master = alias ? (float*)z->params : alloc_state(z, be, mem, MEM_MASTER);
    z->adam_m = alloc_state(z, be, mem, MEM_OPTIMIZER);
    z->adam_v = alloc_state(z, be, mem, MEM_OPTIMIZER);
    allocate_host_buffers(z, be, mem);
    if (z->caps.shard_params) allocate_gathered(z, be, mem);
}

static void check_caps(ZeroCaps caps) {
    if ((caps.shard_grads && !caps.shard_state) || (caps.shard_params && !caps.shard_grads))
        fail("internal: ZeRO capabilities out of order (state %d, gradients %d, parameters %d)", caps.shard_state,
             caps.shard_grads, caps.shard_params);
    if (caps.delayed_update && !caps.state_on_host) fail("internal: a delayed update needs the state on the host");
    if ((caps.grads_on_host && !(caps.shard_grads && caps.state_on_host)) || (caps.params_on_host && !(caps.shard_params && caps.grads_on_host)))
        fail("internal: offload without its sharding (gradients on host %d, parameters on host %d)", caps.grads_on_host,
             caps.params_on_host);
}

static void zero_init(Zero* z, Backend* be, MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, Comm* dp, Comm* tied,
                      int rank, int size, DType dt) {
    check_caps(caps);
    *z = (Zero){.caps = caps, .dp = dp, .tied = tied, .rank = rank, .size = size, .dt = dt, .lay = lay};
    size_t off = 0;
    for (int u = 0; u < lay->num_units; u++) {
        if (lay->units[u].padded % layout_pad_multiple(z->size) != 0)
            fail("internal: unit %d (%zu elements) is not padded for %d ranks", u, lay->units[u].padded, z->size);
        z->piece_offset[u] = off;
        off += piece(z, u);
    }
    z->state_elems = caps.shard_state ? off : lay->total;
    allocate_params(z, be, mem);
    allocate_grads(z, be, mem);
    z->norm_acc = (float*)mem_alloc(be, mem, MEM_GRADS, sizeof(float));
}

Zero* zero_create(Backend* be, MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, Comm* dp, Comm* tied, DType dt) {
    if (lay->emb_unit >= 0 && (tied != NULL) != embedding_is_tied(lay))
        fail("internal: the tied embedding's group (%s) disagrees with the layout", tied ? "present" : "absent");
    Zero* z = (Zero*)xmalloc(sizeof(Zero));
    zero_init(z, be, mem, lay, caps, dp, tied, dp ? comm_rank(dp) : 0, dp ? comm_size(dp) : 1, dt);
    return z;
}

void zero_plan(MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, int size, DType dt) {
    Zero z;
    zero_init(&z, NULL, mem, lay, caps, NULL, NULL, 0, size, dt);
}

static void settle(Zero* z, Backend* be);

void zero_destroy(Zero* z, Backend* be) {
    settle(z, be);
    GradBuffers* g = &z->grad;
    UnitGrads* ug = &z->unit_grads;
    Gathered* ga = &z->gathered;
    if (g->piece == g->whole) g->piece = NULL;   // an alias, not an allocation
    void* on_backend[] = {g->whole, g->piece, g->piece_f32, ug->slot[0].buf, ug->slot[1].buf, ug->emb.buf, ga->slot[0].buf,
                          ga->slot[1].buf, ga->resident[RESIDENT_EMB].buf, ga->resident[RESIDENT_FINAL].buf, z->norm_acc};
    for (size_t i = 0; i < sizeof(on_backend) / sizeof(on_backend[0]); i++) free_in(be, IN_BACKEND, on_backend[i]);
    free_in(be, params_place(z), z->params);
    grad_landing_destroy(g->landing, be);   // before the accumulator it adds into
    free_in(be, grads_place(z), g->acc);
    free_in(be, state_place(z), z->adam_m);
    free_in(be, state_place(z), z->adam_v);
    if ((void*)z->master != z->params) free_in(be, state_place(z), z->master);
    free_in(be, IN_HOST, z->stage.buf);
    free_in(be, IN_HOST, z->pending.grad);
    free_in(be, IN_HOST, z->pending.params);
    BeEvent* events[] = {ga->slot[0].uploaded, ga->slot[1].uploaded, ga->resident[RESIDENT_EMB].uploaded,
                         ga->resident[RESIDENT_FINAL].uploaded};
    for (int i = 0; i < 4; i++)
        if (events[i]) be_event_destroy(be, events[i]);
    free(z);
}

// ---------------------------------------------------------------------------------------------------
// Parameters for the walk.
//
// Prefetch (shard_params): when the walk asks for block l, the gather of the block it will ask for next
// starts into the other buffer, so it runs while l computes: l+1 walking forward, l-1 backward. The direction
// comes from the order of the requests (l after l-1: forward, after l+1: backward); a request after
// neither begins a walk, which starts at an end of this layout's blocks and goes inward. gpt.c's walks
// (and a 1F1B stage's) always cover all the blocks, so every prefetched block is asked for, the bytes
// moved are those of the unprefetched walk (tests/zero_check.py), and zero.c needs no hint from the walk.
// A prefetch nobody asks for would cost a gather, not correctness: it is dropped when its buffer is needed
// and when the parameters change.

static CommHandle no_handle(void) { return (CommHandle){.slot = 0, .gen = 0}; }

// Starts the all-gather of unit u's parameters from every rank's piece into buf (the unit's padded size).
// With params_on_host this rank's piece goes up on the copy stream (event uploaded), after the main stream's
// work so far, which includes the last reads of buf. On one rank the main stream waits for it only in
// finish_gather, so a prefetched block's upload overlaps the block computing now; with more ranks the
// collective must follow it, and the comm layer orders collectives after the main stream, so the main stream
// waits at once.
static CommHandle gather_start(Zero* z, Backend* be, int u, void* buf, BeEvent* uploaded) {
    size_t p = piece(z, u), x = xs(z);
    void* mine = at(buf, (size_t)z->rank * p, x);
    const void* src = at(z->params, z->piece_offset[u], x);
    if (!z->caps.params_on_host) be_copy(be, mine, src, p * x);
    else {
        double t0 = now_seconds();
        be_upload_async(be, mine, src, p * x, uploaded);
        if (z->size > 1) be_stream_wait(be, uploaded);
        z->host_copy_seconds += now_seconds() - t0;
    }
    return z->size > 1 ? comm_allgather_start(z->dp, buf, p, z->dt) : no_handle();
}

static void wait_for(Zero* z, CommHandle* h) {
    if (z->size > 1) comm_wait(z->dp, h);
}

// The main stream's next work sees the gathered unit.
static void finish_gather(Zero* z, Backend* be, CommHandle* h, BeEvent* uploaded) {
    wait_for(z, h);
    if (z->caps.params_on_host && z->size == 1) be_stream_wait(be, uploaded);
}

static void* resident_params(Zero* z, Backend* be, int u) {
    Resident* r = &z->gathered.resident[u == emb_unit(z) ? RESIDENT_EMB : RESIDENT_FINAL];
    if (!r->gathered) {
        CommHandle h = gather_start(z, be, u, r->buf, r->uploaded);
        finish_gather(z, be, &h, r->uploaded);
    }
    r->gathered = 1;
    return r->buf;
}

// The first slot free (u = -1), or holding or gathering unit u; NULL if none.
static ParamSlot* param_slot(Zero* z, int u) {
    for (int s = 0; s < 2; s++) {
        ParamSlot* p = &z->gathered.slot[s];
        if (u < 0 ? p->state == PARAMS_FREE : p->state != PARAMS_FREE && p->unit == u) return p;
    }
    return NULL;
}

static void start_param_gather(Zero* z, Backend* be, ParamSlot* p, ParamSlotState state, int u) {
    p->state = state;
    p->unit = u;
    p->flight = gather_start(z, be, u, p->buf, p->uploaded);
}

// The unit of block l when this layout holds it, else -1.
static int held_block_unit(const Zero* z, int l) {
    return l >= 0 && l < z->lay->shape.L ? z->lay->block_unit[l] : -1;
}

// The block unit the walk will ask for after block unit u, or -1 when that is not certain.
static int next_block_unit(Zero* z, int u) {
    Gathered* g = &z->gathered;
    int l = z->lay->tensors[unit(z, u)->first_tensor].layer, dir = 0;   // the block unit u holds
    if (g->walk_started && g->walk_last_block == l - 1) dir = 1;
    else if (g->walk_started && g->walk_last_block == l + 1) dir = -1;
    else if (held_block_unit(z, l - 1) < 0) dir = 1;
    else if (held_block_unit(z, l + 1) < 0) dir = -1;
    g->walk_last_block = l;
    g->walk_started = 1;
    return dir ? held_block_unit(z, l + dir) : -1;
}

// Finishes and forgets the gathers the walk has not asked for (parameters about to change, teardown).
static void drop_prefetches(Zero* z) {
    for (int s = 0; s < 2; s++) {
        ParamSlot* p = &z->gathered.slot[s];
        if (p->state != PARAMS_PREFETCHED) continue;
        wait_for(z, &p->flight);   // its upload may still run: the slot's next one queues after it
        p->state = PARAMS_FREE;
        p->unit = -1;
    }
}

static void prefetch(Zero* z, Backend* be, int u) {
    if (u < 0 || param_slot(z, u)) return;
    ParamSlot* p = param_slot(z, -1);
    if (p) start_param_gather(z, be, p, PARAMS_PREFETCHED, u);   // else the walk gathers it when it asks
}

// A free slot for block unit u, which the walk asks for now.
static ParamSlot* take_param_slot(Zero* z, int u) {
    if (!param_slot(z, -1)) drop_prefetches(z);   // a prefetch nobody asked for
    ParamSlot* p = param_slot(z, -1);
    if (!p)
        fail("internal: no free parameter buffer for unit %d (units %d and %d still held)", u, z->gathered.slot[0].unit,
             z->gathered.slot[1].unit);
    return p;
}

static void* block_params_of(Zero* z, Backend* be, int u) {
    ParamSlot* p = param_slot(z, u);
    if (p && p->state == PARAMS_HELD) return p->buf;   // asked again while held: not a step
    if (!p) {
        p = take_param_slot(z, u);
        start_param_gather(z, be, p, PARAMS_HELD, u);
    }
    p->state = PARAMS_HELD;
    prefetch(z, be, next_block_unit(z, u));   // started before the wait below, so MPI progresses both
    finish_gather(z, be, &p->flight, p->uploaded);
    return p->buf;
}

static void* walk_params(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_params) return at(z->params, unit(z, u)->offset, xs(z));
    return is_block(z, u) ? block_params_of(z, be, u) : resident_params(z, be, u);
}

static void walk_prefetch(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (z->caps.shard_params && is_block(z, u)) prefetch(z, be, u);
}

static void walk_params_done(void* ctx, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_params || !is_block(z, u)) return;
    ParamSlot* p = param_slot(z, u);
    if (!p || p->state != PARAMS_HELD) return;
    p->state = PARAMS_FREE;
    p->unit = -1;
}

// ---------------------------------------------------------------------------------------------------
// Gradients for the walk.
//
// shard_grads overlaps: a unit's reduce-scatter starts when the walk is done with its gradients and is
// finished (waited for, then added into the fp32 accumulator) only when its buffer is needed again: two
// units later with the two rotating buffers, the next micro-step for the embeddings, or zero_reduce_grads.
// So each unit's reduce-scatter runs during the next unit's backward (bucket = unit). A unit's earlier
// reduce-scatter is always finished before its next one starts, so every piece of the accumulator gets its
// micro-steps' sums added in the same order, with the same bits, as when each was finished at once.

static CommHandle reduce_start(Zero* z, int u, void* buf) {
    size_t p = piece(z, u);
    if (z->size == 1) return no_handle();
    return comm_reduce_scatter_sum_start(z->dp, at(buf, (size_t)z->rank * p, xs(z)), buf, p, z->dt);
}

// Waits for unit u's reduce-scatter of buf and adds this rank's piece into the fp32 accumulator: on the
// backend, or (grads_on_host) on the host, with the same fp32 additions, once the piece has come down
// (queued: finish_all_grads drains it).
static void reduce_into_accumulator(Zero* z, Backend* be, int u, void* buf, CommHandle* h) {
    size_t p = piece(z, u);
    wait_for(z, h);
    float* acc = z->grad.acc + z->piece_offset[u];
    const void* mine = at(buf, (size_t)z->rank * p, xs(z));
    if (z->caps.grads_on_host) {
        grad_landing_add(z->grad.landing, be, acc, mine, p);
        return;
    }
    convert(be, z->grad.piece_f32, DT_FP32, mine, z->dt, p);
    residual_forward(be, DT_FP32, acc, acc, z->grad.piece_f32, p);
}

static void start_reduce(Zero* z, GradSlot* g, int u) {
    g->flight = reduce_start(z, u, g->buf);
    g->state = GRAD_REDUCING;
    g->unit = u;
    g->seq = ++z->unit_grads.started;
}

static void finish_grad_slot(Zero* z, Backend* be, GradSlot* g) {
    if (g->state != GRAD_REDUCING) return;
    reduce_into_accumulator(z, be, g->unit, g->buf, &g->flight);
    g->state = GRAD_FREE;
    g->unit = -1;
}

static void finish_all_grads(Zero* z, Backend* be) {
    if (!z->caps.shard_grads) return;
    UnitGrads* ug = &z->unit_grads;
    int first = ug->slot[0].seq <= ug->slot[1].seq ? 0 : 1;
    finish_grad_slot(z, be, &ug->slot[first]);
    finish_grad_slot(z, be, &ug->slot[1 - first]);
    finish_grad_slot(z, be, &ug->emb);
    if (z->caps.grads_on_host) grad_landing_drain(z->grad.landing);
}

// The rotating slot filling with unit u's gradients; NULL if none.
static GradSlot* filling_slot(Zero* z, int u) {
    GradSlot* slot = z->unit_grads.slot;
    for (int s = 0; s < 2; s++)
        if (slot[s].state == GRAD_FILLING && slot[s].unit == u) return &slot[s];
    return NULL;
}

// Whether a is the better slot to take than b: one with nothing in flight, else the older reduce-scatter.
static int better_to_take(const GradSlot* a, const GradSlot* b) {
    return b->state == GRAD_REDUCING && (a->state != GRAD_REDUCING || a->seq < b->seq);
}

// A rotating slot for unit u, GRAD_FREE: finishes u's previous reduce-scatter if it is still in flight,
// then takes the better slot the walk is not filling and finishes its reduce-scatter.
static GradSlot* take_grad_slot(Zero* z, Backend* be, int u) {
    GradSlot* slot = z->unit_grads.slot;
    for (int s = 0; s < 2; s++)
        if (slot[s].state == GRAD_REDUCING && slot[s].unit == u) finish_grad_slot(z, be, &slot[s]);
    GradSlot* pick = NULL;
    for (int s = 0; s < 2; s++)
        if (slot[s].state != GRAD_FILLING && (!pick || better_to_take(&slot[s], pick))) pick = &slot[s];
    if (!pick)
        fail("internal: no free gradient buffer for unit %d (units %d and %d still held)", u, slot[0].unit, slot[1].unit);
    finish_grad_slot(z, be, pick);
    return pick;
}

// The slot to accumulate unit u's gradients in: the embeddings' own (its last reduce-scatter finished
// first), the rotating one already filling with u, or a newly taken one.
static GradSlot* grad_slot_for(Zero* z, Backend* be, int u) {
    if (u == emb_unit(z)) {
        finish_grad_slot(z, be, &z->unit_grads.emb);
        return &z->unit_grads.emb;
    }
    GradSlot* g = filling_slot(z, u);
    return g ? g : take_grad_slot(z, be, u);
}

static void* walk_grads(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_grads) return at(z->grad.whole, unit(z, u)->offset, xs(z));
    GradSlot* g = grad_slot_for(z, be, u);
    if (g->state == GRAD_FREE) {
        be_memset0(be, g->buf, unit(z, u)->padded * xs(z));
        g->state = GRAD_FILLING;
        g->unit = u;
    }
    return g->buf;
}

// Nothing of ours left in flight (teardown: the comm layer refuses to free a group that has some).
static void settle(Zero* z, Backend* be) {
    if (z->caps.shard_params) drop_prefetches(z);
    finish_all_grads(z, be);
}

static void walk_grads_done(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_grads) return;
    GradSlot* g = u == emb_unit(z) ? &z->unit_grads.emb : filling_slot(z, u);
    if (!g) fail("internal: gradients of unit %d finished but never requested", u);
    start_reduce(z, g, u);
}

// ---------------------------------------------------------------------------------------------------
// Step boundary.

void zero_begin_step(Zero* z, Backend* be) {
    if (!z->caps.shard_grads) be_memset0(be, z->grad.whole, z->lay->total * xs(z));
    else if (z->caps.grads_on_host) memset(z->grad.acc, 0, z->state_elems * 4);
    else be_memset0(be, z->grad.acc, z->state_elems * 4);
}

// The embedding unit's reduced gradient (what the optimizer will read for it) and its mirror's have the
// same layout, so one all-reduce over the tied pair sums the LM head's and the encoder's contributions.
// With grads_on_host the piece goes through the backend, where the collectives run.
static void sum_tied_embedding(Zero* z, Backend* be) {
    int u = emb_unit(z);
    if (!z->tied || u < 0) return;
    DType dt;
    void* g = reduced_grads(z, &dt);
    if (!reduced_is_piece(z)) {
        comm_allreduce_sum(z->tied, at(g, unit(z, u)->offset, dtype_size(dt)), unit(z, u)->padded, dt);
        return;
    }
    size_t p = piece(z, u);
    float* mine = (float*)at(g, z->piece_offset[u], dtype_size(dt));
    if (!z->caps.grads_on_host) {
        comm_allreduce_sum(z->tied, mine, p, dt);
        return;
    }
    be_upload(be, z->grad.piece_f32, mine, p * 4);
    comm_allreduce_sum(z->tied, z->grad.piece_f32, p, DT_FP32);
    be_download(be, mine, z->grad.piece_f32, p * 4);
}

// Without shard_grads the walk only accumulated: the whole gradient is reduced now, all-reduced, or
// reduce-scattered unit by unit into the pieces that sharded state is updated from.
static void reduce_at_boundary(Zero* z, Backend* be) {
    size_t x = xs(z);
    if (!reduced_is_piece(z)) {
        if (z->size > 1) comm_allreduce_sum(z->dp, z->grad.whole, z->lay->total, z->dt);
        return;
    }
    for (int u = 0; u < z->lay->num_units; u++) {
        void* dst = at(z->grad.piece, z->piece_offset[u], x);
        const void* src = at(z->grad.whole, unit(z, u)->offset, x);
        if (z->size > 1) comm_reduce_scatter_sum(z->dp, dst, src, piece(z, u), z->dt);
        else if (dst != src) be_copy(be, dst, src, piece(z, u) * x);
    }
}

void zero_reduce_grads(Zero* z, Backend* be) {
    finish_all_grads(z, be);
    if (!z->caps.shard_grads) reduce_at_boundary(z, be);
    sum_tied_embedding(z, be);
}

double zero_host_copy_seconds(Zero* z) {
    double s = z->host_copy_seconds + (z->grad.landing ? grad_landing_wait_seconds(z->grad.landing) : 0.0);
    z->host_copy_seconds = 0.0;
    return s;
}

void zero_after_update(Zero* z, Backend* be) {
    if (z->caps.shard_params) {
        for (int r = 0; r < RESIDENTS; r++) z->gathered.resident[r].gathered = 0;
        drop_prefetches(z);
    }
    // Sharded state over whole parameters: each rank updated its pieces and gathers the others'.
    if (!z->caps.shard_state || z->caps.shard_params || z->size == 1) return;
    for (int u = 0; u < z->lay->num_units; u++) comm_allgather(z->dp, at(z->params, unit(z, u)->offset, xs(z)), piece(z, u), z->dt);
}

// The parts of the flat buffer `which` names (model_state.h), each with the state index of its first
// element: with shard_state this rank's pieces; without, whole units, except that a checkpoint always
// takes pieces, so checkpoints are cut alike whatever the capabilities.
typedef void (*PartFn)(Zero* z, size_t flat_begin, size_t flat_end, size_t state_index, void* ctx);

static void for_each_part(Zero* z, StateParts which, PartFn fn, void* ctx) {
    for (int u = 0; u < z->lay->num_units; u++) {
        const Unit* un = unit(z, u);
        size_t real_end = un->offset + un->size;
        if (which != STATE_UPDATE && unit_is_mirror(z->lay, u)) continue;
        if (!z->caps.shard_state && which != STATE_CHECKPOINT) {
            fn(z, un->offset, real_end, un->offset, ctx);
            continue;
        }
        size_t begin = un->offset + (size_t)z->rank * piece(z, u);
        size_t end = begin + piece(z, u) < real_end ? begin + piece(z, u) : real_end;
        if (begin < end) fn(z, begin, end, z->caps.shard_state ? z->piece_offset[u] : begin, ctx);
    }
}

// The part of [begin, end) (inside one unit) whose state this rank holds: [*a, *b) with state index *si;
// returns 0 when it holds none of it.
static int owned_range(const Zero* z, int u, size_t begin, size_t end, size_t* a, size_t* b, size_t* si) {
    if (!z->caps.shard_state) {
        *a = begin, *b = end, *si = begin;
        return begin < end;
    }
    size_t mine = unit(z, u)->offset + (size_t)z->rank * piece(z, u);
    *a = begin > mine ? begin : mine;
    *b = end < mine + piece(z, u) ? end : mine + piece(z, u);
    *si = z->piece_offset[u] + (*a - mine);
    return *a < *b;
}

// Where the working parameters of flat index `flat` (state index si) live.
static void* param_dest(const Zero* z, size_t flat, size_t si) {
    return at(z->params, z->caps.shard_params ? si : flat, xs(z));
}

static StateSpan span_at(const Zero* z, const ParamTensor* t, size_t flat, size_t si, size_t n) {
    DType grad_dt;
    void* g = reduced_grads(z, &grad_dt);
    StateSpan s = {.t = t,
                   .flat = flat,
                   .n = n,
                   .params = param_dest(z, flat, si),
                   .master = z->master + si,
                   .m = z->adam_m + si,
                   .v = z->adam_v + si,
                   .grad = at(g, reduced_is_piece(z) ? si : flat, dtype_size(grad_dt)),
                   .grad_dt = grad_dt};
    return s;
}

typedef struct {
    StateSpanFn fn;
    void* ctx;
    StateParts which;
} SpanWalk;

// A part's spans: one per canonical run of each tensor inside it (so a span's elements are contiguous in
// llm.c's order), without tensor-group copies except for the update.
static void part_to_spans(Zero* z, size_t begin, size_t end, size_t si, void* ctx) {
    SpanWalk* w = (SpanWalk*)ctx;
    const ParamLayout* lay = z->lay;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (t->replica && w->which != STATE_UPDATE) continue;
        size_t a = t->offset > begin ? t->offset : begin;
        size_t b = t->offset + t->size < end ? t->offset + t->size : end;
        while (a < b) {
            size_t n = tensor_run_left(t, a - t->offset);
            n = n < b - a ? n : b - a;
            StateSpan s = span_at(z, t, a, si + (a - begin), n);
            w->fn(&s, w->ctx);
            a += n;
        }
    }
}

static void state_for_each_span(void* ctx, StateParts which, StateSpanFn fn, void* fn_ctx) {
    SpanWalk w = {.fn = fn, .ctx = fn_ctx, .which = which};
    for_each_part((Zero*)ctx, which, part_to_spans, &w);
}

static int state_owned_span(void* ctx, const ParamTensor* t, size_t flat, size_t n, StateSpan* out) {
    const Zero* z = (const Zero*)ctx;
    size_t a, b, si;
    if (!owned_range(z, t->unit, flat, flat + n, &a, &b, &si)) return 0;
    *out = span_at(z, t, a, si, b - a);
    return 1;
}

// ---------------------------------------------------------------------------------------------------
// Whole-model transfers through the host.

typedef struct {
    Backend* be;
    const float* flat;
} SetCtx;

static void set_part(Zero* z, size_t begin, size_t end, size_t si, void* ctx) {
    SetCtx* c = (SetCtx*)ctx;
    size_t n = end - begin;
    place_from_host(c->be, state_place(z), z->master + si, c->flat + begin, n * 4);
    if ((void*)z->master == z->params) return;
    if (!z->caps.shard_params) return;   // whole parameters are set below
    void* low = xmalloc(n * xs(z));
    host_to_dtype(low, z->dt, c->flat + begin, n);
    place_from_host(c->be, params_place(z), at(z->params, si, xs(z)), low, n * xs(z));
    free(low);
}

void zero_set_from_host(Zero* z, Backend* be, const float* flat) {
    SetCtx c = {.be = be, .flat = flat};
    for_each_part(z, STATE_UPDATE, set_part, &c);
    if (z->caps.shard_params || (void*)z->master == z->params) return;
    for (int u = 0; u < z->lay->num_units; u++) {   // every parameter is held here
        const Unit* un = unit(z, u);
        void* low = xmalloc(un->size * xs(z));
        host_to_dtype(low, z->dt, flat + un->offset, un->size);
        be_upload(be, at(z->params, un->offset, xs(z)), low, un->size * xs(z));
        free(low);
    }
}

// Gathers a buffer held as pieces (index = state index) into host fp32, flat layout.
static void pieces_to_host(Zero* z, Backend* be, const void* pieces, DType dt, Place where, float* flat) {
    size_t x = dtype_size(dt), largest = 0;
    for (int u = 0; u < z->lay->num_units; u++) largest = unit(z, u)->padded > largest ? unit(z, u)->padded : largest;
    void* buf = be_malloc(be, largest * x);   // checkpoint time only, never in the step
    void* host = xmalloc(largest * x);
    for (int u = 0; u < z->lay->num_units; u++) {
        size_t p = piece(z, u);
        void* mine = at(buf, (size_t)z->rank * p, x);
        const void* src = at((void*)pieces, z->piece_offset[u], x);
        if (where == IN_HOST) be_upload(be, mine, src, p * x);   // the gather runs on backend memory
        else be_copy(be, mine, src, p * x);
        if (z->size > 1) comm_allgather(z->dp, buf, p, dt);
        if (!flat) continue;
        be_download(be, host, buf, unit(z, u)->size * x);
        host_from_dtype(flat + unit(z, u)->offset, host, dt, unit(z, u)->size);
    }
    free(host);
    be_free(be, buf);
}

// A whole flat buffer into host fp32.
static void full_to_host(Zero* z, Backend* be, const void* full, DType dt, Place where, float* flat) {
    size_t x = dtype_size(dt);
    if (!flat) return;
    for (int u = 0; u < z->lay->num_units; u++) {
        const Unit* un = unit(z, u);
        void* host = xmalloc(un->size * x);
        const void* src = at((void*)full, un->offset, x);
        place_to_host(be, where, host, src, un->size * x);
        host_from_dtype(flat + un->offset, host, dt, un->size);
        free(host);
    }
}

void zero_master_to_host(Zero* z, Backend* be, float* flat) {
    if (z->caps.shard_state) pieces_to_host(z, be, z->master, DT_FP32, state_place(z), flat);
    else full_to_host(z, be, z->master, DT_FP32, state_place(z), flat);
}

void zero_grads_to_host(Zero* z, Backend* be, float* flat) {
    DType dt;
    const void* g = reduced_grads(z, &dt);
    if (reduced_is_piece(z)) pieces_to_host(z, be, g, dt, grads_place(z), flat);
    else full_to_host(z, be, g, dt, grads_place(z), flat);
}

// ---------------------------------------------------------------------------------------------------
// The interfaces below ZeRO.

ParamStore zero_param_store(Zero* z) {
    ParamStore s = {.ctx = z,
                    .params = walk_params,
                    .params_done = walk_params_done,
                    .prefetch = walk_prefetch,
                    .grads = walk_grads,
                    .grads_done = walk_grads_done};
    return s;
}

static void state_set_from_host(void* z, Backend* be, const float* flat) { zero_set_from_host((Zero*)z, be, flat); }
static void state_master_to_host(void* z, Backend* be, float* flat) { zero_master_to_host((Zero*)z, be, flat); }

ModelState zero_model_state(Zero* z) {
    ModelState s = {.ctx = z,
                    .lay = z->lay,
                    .dt = z->dt,
                    .whole_params = z->caps.shard_params ? NULL : z->params,
                    .parts = reduced_is_piece(z) && z->size > 1 ? z->dp : NULL,
                    .scratch = z->norm_acc,
                    .places = {.params = params_place(z), .state = state_place(z), .grads = grads_place(z)},
                    .stage = z->stage,
                    .pending = z->pending,
                    .for_each_span = state_for_each_span,
                    .owned_span = state_owned_span,
                    .set_from_host = state_set_from_host,
                    .master_to_host = state_master_to_host};
    return s;
}
