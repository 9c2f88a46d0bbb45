// zero.c: ZeRO by capabilities (zero.h): what each configuration shards, where it lives, and when it moves.
//
//   allocation      which of params / master / optimizer state / gradients exist, whole or as pieces
//                   (core/zero/pieces.h), in backend or host memory (zero_init and its allocate_*); the
//                   optimizer's buffers as its description names them (optimizer_kind.h), none for a
//                   frozen tensor
//   the walk        whole buffers in place; with shard_grads the gradient slots, each unit's reduce-scatter
//                   running during the next units' backward (core/zero/grad_slots.h); with shard_params the
//                   gathered units and their prefetch (core/zero/param_slots.h)
//   step boundary   zero_begin_step zeroes; zero_reduce_grads reduces what the walk has not and sums the tied
//                   embedding; zero_after_update gathers the parameters sharded state updated
//   the state       the spans the optimizer and the checkpoints see (ModelState), and the whole-model
//                   transfers through the host
#include "zero.h"

#include "base/common.h"
#include <stdio.h>

#include "core/zero/grad_slots.h"
#include "core/zero/onebit_adam.h"
#include "core/zero/param_slots.h"
#include "core/zero/pieces.h"
#include "core/zero/qgz.h"
#include "kernels/host_elem.h"

// The gradient buffers without shard_grads (with it, the walk's rotating slots: grad_slots.h).
typedef struct {
    void* whole;         // without shard_grads: every unit's gradients (dt, Pieces.grad_offset), accumulating
                         // over micro-steps
    void* piece;         // shard_state without shard_grads: (state_elems) dt, this rank's share, reduced
} GradBuffers;

struct Zero {
    ZeroCaps caps;
    Pieces pieces;       // the layout, the data-parallel group (dp NULL for a single process), dt, and the
                         // state index of each unit's piece (shard_state)
    Comm* tied;          // pipeline: stage 0 <-> last stage, summing the embedding and its mirror; else NULL
    // The master and the optimizer's state cover the elements this rank holds state for: each unit's trained
    // section (model.h: Unit), or with shard_state its piece of it, packed in flat order: unit u's first held
    // element has state index state_base[u] (state_index). Nothing frozen: the state index is the piece index.
    size_t state_elems;
    int any_frozen;         // the layout holds a frozen tensor
    size_t state_base[MAX_UNITS];
    int opt_buffers;        // fp32 buffers per state element: the master and the state (shape_optimizer_buffers)
    // Parameters: the full flat buffer, or this rank's pieces with shard_params (host memory with
    // params_on_host); type dt.
    void* params;
    float* master;       // (state_elems) fp32; aliases params where both have the same indexing and type
    int master_is_params;   // that alias (with the state on disk both are NULL, no alias)
    float* opt_state[OPT_MAX_STATE];   // (state_elems) fp32 each: the first opt_buffers - 1 exist
    GradBuffers grad;          // without shard_grads
    GradSlots grads;           // shard_grads: the walk's slots and the fp32 accumulator of pieces
    ParamSlots gathered;       // shard_params: the walk's gathered parameters
    float* norm_acc;           // one float of backend scratch
    HostStage stage;           // state_on_host: the optimizer's staging (model_state.h)
    PendingBuffers pending;    // delayed_update: (state_elems) each, host memory
    NvmeStore* disk;           // state_on_disk: master and state (and with params_on_disk the pieces) in files
    OnebitBuffers onebit;      // onebit: 1-bit Adam's momentum, errors and local gradient
    int onebit_local;          // after its freeze: the walk keeps the gradient unreduced (zero_onebit_local)
    float onebit_beta1, onebit_loss_scale;   // and the step's beta1 and loss scale
    Qgz qgz;                   // qg: the quantized reduction's error feedback and packets
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

ZeroCaps zero_on_disk(ZeroCaps caps, int on) {
    caps.state_on_disk = on && caps.state_on_host;
    caps.params_on_disk = on && caps.params_on_host;
    return caps;
}

ZeroCaps zero_plusplus(ZeroCaps caps, int hpz, int qw, int qg) {
    caps.hpz = caps.shard_params && hpz > 1 ? hpz : 0;
    caps.qw = caps.shard_params && qw;
    caps.qg = caps.shard_grads && qg;
    return caps;
}

static size_t xs(const Zero* z) { return piece_elem_bytes(&z->pieces); }
static const Unit* unit(const Zero* z, int u) { return &z->pieces.lay->units[u]; }
static size_t piece(const Zero* z, int u) { return piece_len(&z->pieces, u); }
static int emb_unit(const Zero* z) { return z->pieces.lay->emb_unit; }

// The flat elements of unit u whose state this rank holds: its piece of the trained section with
// shard_state, else the whole trained section.
static size_t held_begin(const Zero* z, int u) {
    return z->caps.shard_state ? piece_begin(&z->pieces, u, 1) : section_begin(unit(z, u), 1);
}
static size_t held_len(const Zero* z, int u) { return z->caps.shard_state ? section_piece(&z->pieces, u, 1) : section_len(unit(z, u), 1); }
static size_t frozen_end(const Zero* z, int u) { return section_begin(unit(z, u), 1); }

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static int is_frozen(const Zero* z, const ParamTensor* t) { return !tensor_optimizer(z->pieces.lay, t)->updates; }

// Calls fn for the parts of flat [a, b) inside unit u in its frozen section, then in its trained one.
typedef void (*StretchFn)(Zero* z, int u, size_t a, size_t b, int frozen, void* ctx);

static void for_each_stretch(Zero* z, int u, size_t a, size_t b, StretchFn fn, void* ctx) {
    size_t mid = max_size(a, min_size(b, frozen_end(z, u)));
    if (a < mid) fn(z, u, a, mid, 1, ctx);
    if (mid < b) fn(z, u, mid, b, 0, ctx);
}

// Whether flat [a, b) of unit u reaches into its frozen section.
static int frozen_in(const Zero* z, int u, size_t a, size_t b) { return a < b && a < frozen_end(z, u); }

// Where flat element f of unit u, in this rank's piece with shard_state, is in a buffer of pieces (the
// parameters' with shard_params): its piece's index, else f itself.
static size_t piece_index(const Zero* z, int u, size_t f) {
    if (!z->caps.shard_state) return f;
    int s = f >= frozen_end(z, u);
    return piece_at(&z->pieces, u, s) + (f - piece_begin(&z->pieces, u, s));
}

// Its state index: meaningful for a held element only.
static size_t state_index(const Zero* z, int u, size_t f) { return z->state_base[u] + (f - held_begin(z, u)); }

// state_base of every unit, and the state's elements.
static void index_state(Zero* z) {
    for (int i = 0; i < z->pieces.lay->num_tensors; i++) z->any_frozen |= is_frozen(z, &z->pieces.lay->tensors[i]);
    size_t at = 0;
    for (int u = 0; u < z->pieces.lay->num_units; u++) {
        z->state_base[u] = at;
        at += held_len(z, u);
    }
    z->state_elems = at;
}

static Place place(int on_host, int on_disk) { return on_disk ? IN_DISK : on_host ? IN_HOST : IN_BACKEND; }
static Place state_place(const Zero* z) { return place(z->caps.state_on_host, z->caps.state_on_disk); }
static Place grads_place(const Zero* z) { return place(z->caps.grads_on_host, 0); }
static Place params_place(const Zero* z) { return place(z->caps.params_on_host, z->caps.params_on_disk); }

// The reduced gradient, what the optimizer reads: with shard_state, this rank's share of each unit (indexed
// like the state); otherwise the whole all-reduced buffer (Pieces.grad_offset).
static int reduced_is_piece(const Zero* z) { return z->caps.shard_state; }

static DType reduced_dtype(const Zero* z) { return z->caps.shard_grads ? DT_FP32 : z->pieces.dt; }

static void* reduced_grads(const Zero* z, DType* dt) {
    *dt = reduced_dtype(z);
    if (z->caps.shard_grads) return z->grads.acc;
    return reduced_is_piece(z) ? z->grad.piece : z->grad.whole;
}

// On one rank each unit's piece is the whole unit in its place: piece-indexed state and whole buffers share
// indices, so a piece buffer may be the whole buffer itself.
static int pieces_are_whole(const Zero* z) {
    for (int u = 0; u < z->pieces.lay->num_units; u++)
        if (z->pieces.offset[u] != z->pieces.lay->units[u].offset || piece(z, u) != z->pieces.lay->units[u].padded) return 0;
    return 1;
}

// Whether a pipeline splits this layout's embedding from its LM head (stage 0 holds wte, the last stage its
// mirror; the tied group sums the two): the layout alone says so, so --estimate (no groups) plans the same.
static int embedding_is_tied(const ParamLayout* lay) {
    return lay->shape.tied && lay->emb_unit >= 0 && (lay->emb_mirror || lay->final_unit < 0);
}

// Elements of a whole gradient buffer: every unit's, less the frozen tensors'.
static size_t grads_total(const Zero* z) {
    int last = z->pieces.lay->num_units - 1;
    return last < 0 ? 0 : z->pieces.grad_offset[last] + z->pieces.grad_len[last];
}

static void allocate_grads(Zero* z, Backend* be, MemLedger* mem) {
    size_t total = grads_total(z), x = xs(z);
    GradBuffers* g = &z->grad;
    if (!z->caps.shard_grads) {
        g->whole = mem_alloc(be, mem, MEM_GRADS, total * x);
        if (reduced_is_piece(z)) g->piece = pieces_are_whole(z) ? g->whole : mem_alloc(be, mem, MEM_GRADS, z->state_elems * x);
        return;
    }
    grad_slots_init(&z->grads, be, mem, &z->pieces, z->state_elems, z->caps.grads_on_host, embedding_is_tied(z->pieces.lay),
                    z->caps.onebit);
}

// The optimizer stages a span through host memory this many elements at a time (state_on_host): a fixed
// bound, so the staging buffer does not grow with the model.
#define HOST_STAGE_ELEMS ((size_t)1 << 20)

// The master and the optimizer's state: backend memory in category c, or host memory with state_on_host;
// none with state_on_disk (the store's files hold them).
static float* alloc_state(Zero* z, Backend* be, MemLedger* mem, MemCategory c) {
    size_t bytes = z->state_elems * 4;
    if (z->caps.state_on_disk) return NULL;
    return (float*)(z->caps.state_on_host ? mem_alloc_host(be, mem, MEM_HOST_STATE, bytes) : mem_alloc(be, mem, c, bytes));
}

// The store of state_on_disk, over each unit's range of state indices (its piece with shard_state).
static void open_disk(Zero* z, Backend* be, MemLedger* mem, const NvmeConfig* cfg) {
    if (!z->caps.state_on_disk) return;
    if (!cfg) fail("internal: state on disk without -nvme's directory");
    // A pass writes whole chunks of parameters, which frozen ones would share with updated ones.
    if (z->caps.params_on_disk && z->any_frozen)
        fail("-nvme with -offload 2 -z 3 keeps the parameter pieces on disk, which cannot hold frozen parameters yet");
    const ParamLayout* lay = z->pieces.lay;
    size_t begin[MAX_UNITS], len[MAX_UNITS];
    for (int u = 0; u < lay->num_units; u++) {
        begin[u] = z->state_base[u];
        len[u] = (u + 1 < lay->num_units ? z->state_base[u + 1] : z->state_elems) - z->state_base[u];
    }
    z->disk = nvme_open(be, mem, cfg, begin, len, lay->num_units, z->opt_buffers, xs(z), z->caps.params_on_disk);
}

static void free_in(Backend* be, Place where, void* p) {
    if (!p || where == IN_DISK) return;
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

// Elements of a buffer of this rank's pieces (pieces.h), frozen tensors' included: the sharded parameters.
static size_t pieces_total(const Zero* z) {
    int last = z->pieces.lay->num_units - 1;
    return last < 0 ? 0 : z->pieces.offset[last] + piece(z, last);
}

static void allocate_params(Zero* z, Backend* be, MemLedger* mem, const NvmeConfig* disk) {
    size_t x = xs(z);
    open_disk(z, be, mem, disk);
    if (z->caps.params_on_disk) z->params = NULL;
    else if (z->caps.params_on_host) z->params = mem_alloc_host(be, mem, MEM_HOST_PARAMS, pieces_total(z) * x);
    else z->params = mem_alloc(be, mem, MEM_PARAMS, (z->caps.shard_params ? pieces_total(z) : z->pieces.lay->total) * x);
    // fp32 parameters are their own master copy where both use the same indexing (both whole, both pieces,
    // or pieces that are the whole unit in its place; nothing frozen left out of the state) and the same
    // memory (not with state_on_host).
    int same_indexing = (z->caps.shard_params == z->caps.shard_state || pieces_are_whole(z)) && !z->any_frozen;
    int alias = z->pieces.dt == DT_FP32 && same_indexing && !z->caps.state_on_host;
    z->master = alias ? (float*)z->params : alloc_state(z, be, mem, MEM_MASTER);
    z->master_is_params = alias;
    for (int k = 0; k < z->opt_buffers - 1; k++) z->opt_state[k] = alloc_state(z, be, mem, MEM_OPTIMIZER);
    allocate_host_buffers(z, be, mem);
    if (z->caps.shard_params)
        param_slots_init(&z->gathered, be, mem, &z->pieces, z->params, z->caps.params_on_host, z->caps.params_on_disk,
                         z->caps.params_on_disk ? z->disk : NULL);
}

static void check_caps(ZeroCaps caps) {
    if ((caps.shard_grads && !caps.shard_state) || (caps.shard_params && !caps.shard_grads))
        fail("internal: ZeRO capabilities out of order (state %d, gradients %d, parameters %d)", caps.shard_state,
             caps.shard_grads, caps.shard_params);
    if (caps.delayed_update && !caps.state_on_host) fail("internal: a delayed update needs the state on the host");
    if ((caps.grads_on_host && !(caps.shard_grads && caps.state_on_host)) || (caps.params_on_host && !(caps.shard_params && caps.grads_on_host)))
        fail("internal: offload without its sharding (gradients on host %d, parameters on host %d)", caps.grads_on_host,
             caps.params_on_host);
    if ((caps.state_on_disk && !caps.state_on_host) || (caps.params_on_disk && !(caps.params_on_host && caps.state_on_disk)))
        fail("internal: disk without host offload (state on disk %d, parameters on disk %d)", caps.state_on_disk, caps.params_on_disk);
}

static void zero_init(Zero* z, Backend* be, MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, Comm* dp, Comm* tied,
                      Comm* hpz, int rank, int size, DType dt, const NvmeConfig* disk) {
    check_caps(caps);
    *z = (Zero){.caps = caps, .pieces = {.lay = lay, .dp = dp, .rank = rank, .size = size, .dt = dt}, .tied = tied};
    size_t off = 0;
    for (int u = 0; u < lay->num_units; u++) {
        if (lay->units[u].padded % layout_pad_multiple(z->pieces.size) != 0)
            fail("internal: unit %d (%zu elements) is not padded for %d ranks", u, lay->units[u].padded, z->pieces.size);
        z->pieces.offset[u] = off;
        off += piece(z, u);
    }
    pieces_index_grads(&z->pieces);
    z->opt_buffers = shape_optimizer_buffers(&lay->shape);
    if (z->opt_buffers < 1) fail("internal: every parameter kind is frozen: nothing to train");
    index_state(z);
    allocate_params(z, be, mem, disk);
    if (caps.shard_params) hpz_init(&z->gathered.hpz, be, mem, &z->pieces, caps.hpz, hpz);
    if (caps.qw) {
        qwz_check_ranks(caps.qw, size);
        param_slots_quantize(&z->gathered, be, mem, &z->pieces);
    }
    allocate_grads(z, be, mem);
    if (caps.qg) {
        qgz_check(caps.qg, 2, size);
        qgz_init(&z->qgz, be, mem, &z->pieces);
        z->grads.qgz = &z->qgz;
    }
    if (caps.onebit) onebit_init(&z->onebit, be, mem, &z->pieces, caps.shard_grads);
    z->norm_acc = (float*)mem_alloc(be, mem, MEM_GRADS, sizeof(float));
}

Zero* zero_create(Backend* be, MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, Comm* dp, Comm* tied, Comm* hpz,
                  DType dt, const NvmeConfig* disk) {
    if ((hpz != NULL) != (caps.hpz > 1 && caps.shard_params && dp != NULL))
        fail("internal: the hpz group (%s) disagrees with -hpz %d", hpz ? "present" : "absent", caps.hpz);
    if (lay->emb_unit >= 0 && (tied != NULL) != embedding_is_tied(lay))
        fail("internal: the tied embedding's group (%s) disagrees with the layout", tied ? "present" : "absent");
    Zero* z = (Zero*)xmalloc(sizeof(Zero));
    zero_init(z, be, mem, lay, caps, dp, tied, hpz, dp ? comm_rank(dp) : 0, dp ? comm_size(dp) : 1, dt, disk);
    return z;
}

void zero_plan_rank(MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, int rank, int size, DType dt, const NvmeConfig* disk) {
    if (rank < 0 || rank >= size) fail("internal: planning rank %d of %d", rank, size);
    if (caps.hpz > 1 && size % caps.hpz) caps.hpz = 0;   // --estimate's tables: hpZ on the sizes it divides,
    if (size < 2) caps.qw = caps.qg = 0;                 // qwZ and qgZ where there are collectives
    Zero z;
    zero_init(&z, NULL, mem, lay, caps, NULL, NULL, NULL, rank, size, dt, disk);
}

void zero_plan(MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, int size, DType dt, const NvmeConfig* disk) {
    zero_plan_rank(mem, lay, caps, 0, size, dt, disk);
}

static void settle(Zero* z, Backend* be);

void zero_destroy(Zero* z, Backend* be) {
    settle(z, be);
    GradBuffers* g = &z->grad;
    GradSlots* ug = &z->grads;
    ParamSlots* ga = &z->gathered;
    if (g->piece == g->whole) g->piece = NULL;   // an alias, not an allocation
    void* on_backend[] = {g->whole, g->piece, ug->piece_f32, ug->slot[0].buf, ug->slot[1].buf, ug->edge.buf, ga->slot[0].buf,
                          ga->slot[1].buf, ga->edge[0].buf, ga->edge[1].buf, z->norm_acc};
    for (size_t i = 0; i < sizeof(on_backend) / sizeof(on_backend[0]); i++) free_in(be, IN_BACKEND, on_backend[i]);
    free_in(be, params_place(z), z->params);
    grad_landing_destroy(ug->landing, be);   // before the accumulator it adds into
    free_in(be, grads_place(z), ug->acc);
    for (int k = 0; k < z->opt_buffers - 1; k++) free_in(be, state_place(z), z->opt_state[k]);
    if (!z->master_is_params) free_in(be, state_place(z), z->master);
    free_in(be, IN_HOST, z->stage.buf);
    free_in(be, IN_HOST, z->pending.grad);
    free_in(be, IN_HOST, z->pending.params);
    param_slots_free_host(ga, be);
    hpz_free(&ga->hpz, be);
    param_slots_free_quantized(ga, be);
    nvme_close(z->disk, be);
    if (z->caps.onebit) onebit_free(&z->onebit, be);
    if (z->caps.qg) qgz_free(&z->qgz, be);
    free(z);
}

// ---------------------------------------------------------------------------------------------------
// The walk's parameters and gradients (the ParamStore). Whole buffers are handed out in place. Sharded,
// a unit's parameters are gathered when the walk asks for them and released when it is done: a block's into
// a rotating slot, with the next block's gather prefetched; the embedding and final units' into slots of
// their own (param_slots.h). Sharded gradients go into slots whose reduce-scatters run during the next
// units' backward (grad_slots.h).

static void* walk_params(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_params) return elem_at(z->params, unit(z, u)->offset, xs(z));
    return param_slots_unit(&z->gathered, be, &z->pieces, u);
}

static void walk_prefetch(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (z->caps.shard_params) param_slots_prefetch(&z->gathered, be, &z->pieces, u);
}

static void walk_params_done(void* ctx, int u) {
    Zero* z = (Zero*)ctx;
    if (z->caps.shard_params) param_slots_done(&z->gathered, &z->pieces, u);
}

static void* walk_grads(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_grads) return elem_at(z->grad.whole, z->pieces.grad_offset[u], xs(z));
    return grad_slots_buffer(&z->grads, be, &z->pieces, u);
}

static void walk_grads_done(void* ctx, Backend* be, int u) {
    Zero* z = (Zero*)ctx;
    if (!z->caps.shard_grads) return;
    grad_slots_done(&z->grads, &z->pieces, u);
}

static void finish_all_grads(Zero* z, Backend* be) {
    if (z->caps.shard_grads) grad_slots_finish_all(&z->grads, be, &z->pieces);
}

// Nothing of ours left in flight (teardown: the comm layer refuses to free a group that has some).
static void settle(Zero* z, Backend* be) {
    if (z->caps.shard_params) param_slots_drop_prefetches(&z->gathered, &z->pieces);
    finish_all_grads(z, be);
}

// ---------------------------------------------------------------------------------------------------
// Step boundary.

void zero_begin_step(Zero* z, Backend* be) {
    if (z->onebit_local && z->onebit.local) be_memset0(be, z->onebit.local, z->onebit.whole * 4);
    if (!z->caps.shard_grads) be_memset0(be, z->grad.whole, grads_total(z) * xs(z));
    else if (z->caps.grads_on_host) memset(z->grads.acc, 0, z->state_elems * 4);
    else be_memset0(be, z->grads.acc, z->state_elems * 4);
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
        comm_allreduce_sum(z->tied, elem_at(g, z->pieces.grad_offset[u], dtype_size(dt)), z->pieces.grad_len[u], dt);
        return;
    }
    size_t p = z->pieces.mine_len[u];
    if (!p) return;
    float* mine = (float*)elem_at(g, z->pieces.mine_offset[u], dtype_size(dt));
    if (!z->caps.grads_on_host) {
        comm_allreduce_sum(z->tied, mine, p, dt);
        return;
    }
    be_upload(be, z->grads.piece_f32, mine, p * 4);
    comm_allreduce_sum(z->tied, z->grads.piece_f32, p, DT_FP32);
    be_download(be, mine, z->grads.piece_f32, p * 4);
}

// Without shard_grads the walk only accumulated: the whole gradient is reduced now, all-reduced, or unit by
// unit reduce-scattered into the shares that sharded state is updated from.
static void reduce_at_boundary(Zero* z, Backend* be) {
    size_t x = xs(z);
    const Pieces* pc = &z->pieces;
    if (!reduced_is_piece(z)) {
        if (pc->size > 1) comm_allreduce_sum(pc->dp, z->grad.whole, grads_total(z), pc->dt);
        return;
    }
    for (int u = 0; u < pc->lay->num_units; u++) {
        void* dst = elem_at(z->grad.piece, pc->mine_offset[u], x);
        void* src = elem_at(z->grad.whole, pc->grad_offset[u], x);
        if (!pc->mine_len[u]) continue;
        if (pc->size > 1) comm_reduce_scatter_sum(pc->dp, dst, src, pc->mine_len[u], pc->dt);
        else if (dst != src) be_copy(be, dst, src, pc->mine_len[u] * x);
    }
}

// 1-bit Adam past its freeze: the momentum exchange in place of the reduction.
static void onebit_reduce(Zero* z, Backend* be) {
    DType dt;
    void* reduced = reduced_grads(z, &dt);
    const void* local = z->caps.shard_grads ? (const void*)z->onebit.local : z->grad.whole;
    ModelState ms = zero_model_state(z);
    onebit_exchange(&z->onebit, be, &z->pieces, &ms, local, z->caps.shard_grads ? DT_FP32 : z->pieces.dt, reduced, dt,
                    reduced_is_piece(z), z->onebit_beta1, z->onebit_loss_scale);
}

void zero_reduce_grads(Zero* z, Backend* be) {
    finish_all_grads(z, be);
    if (z->onebit_local) {
        onebit_reduce(z, be);
        return;
    }
    if (!z->caps.shard_grads) reduce_at_boundary(z, be);
    sum_tied_embedding(z, be);
}

void zero_onebit_local(Zero* z, int on, float beta1, float loss_scale) {
    if (on && !z->caps.onebit) fail("internal: 1-bit Adam's exchange without its buffers");
    z->onebit_local = on;
    z->onebit_beta1 = beta1;
    z->onebit_loss_scale = loss_scale;
    z->grads.local = on ? z->onebit.local : NULL;
}

void zero_qgz_groups(Zero* z, const HostGroups* groups) {
    if (!z->caps.qg) fail("internal: qgZ's groups without -qg");
    qgz_attach(&z->qgz, groups, &z->pieces);
}

double zero_quantize_seconds(Zero* z) { return z->caps.qg ? qgz_take_seconds(&z->qgz) : 0.0; }

double zero_host_copy_seconds(Zero* z) {
    double s = z->gathered.upload_seconds + (z->grads.landing ? grad_landing_wait_seconds(z->grads.landing) : 0.0);
    z->gathered.upload_seconds = 0.0;
    return s;
}

void zero_after_update(Zero* z, Backend* be) {
    if (z->caps.shard_params) param_slots_invalidate(&z->gathered, &z->pieces);
    // Sharded state over whole parameters: each rank updated its pieces of the trained sections and gathers
    // the others'; a frozen section never changes, so a LoRA step sends the adapters, not the base.
    if (!z->caps.shard_state || z->caps.shard_params || z->pieces.size == 1) return;
    for (int u = 0; u < z->pieces.lay->num_units; u++) {
        size_t p = section_piece(&z->pieces, u, 1);
        if (p) comm_allgather(z->pieces.dp, elem_at(z->params, section_begin(unit(z, u), 1), xs(z)), p, z->pieces.dt);
    }
}

// The parts of the flat buffer `which` names (model_state.h), each inside one section of unit u: with
// shard_state this rank's pieces; without, whole units, except that a checkpoint always takes pieces, so
// checkpoints are cut alike whatever the capabilities.
typedef void (*PartFn)(Zero* z, int u, size_t flat_begin, size_t flat_end, void* ctx);

static void for_each_part(Zero* z, StateParts which, PartFn fn, void* ctx) {
    for (int u = 0; u < z->pieces.lay->num_units; u++) {
        const Unit* un = unit(z, u);
        size_t real_end = un->offset + un->size;
        if (which != STATE_UPDATE && unit_is_mirror(z->pieces.lay, u)) continue;
        if (!z->caps.shard_state && which != STATE_CHECKPOINT) {
            fn(z, u, un->offset, real_end, ctx);
            continue;
        }
        for (int s = 0; s < UNIT_SECTIONS; s++) {
            size_t begin = piece_begin(&z->pieces, u, s), end = min_size(begin + section_piece(&z->pieces, u, s), real_end);
            if (begin < end) fn(z, u, begin, end, ctx);
        }
    }
}

// The part of [begin, end) (inside one unit) whose state this rank holds: [*a, *b); returns 0 when it holds
// none of it.
static int owned_range(const Zero* z, int u, size_t begin, size_t end, size_t* a, size_t* b) {
    size_t mine = held_begin(z, u);
    *a = begin > mine ? begin : mine;
    *b = end < mine + held_len(z, u) ? end : mine + held_len(z, u);
    return *a < *b;
}

// Where the working parameters of flat index `flat` (piece index pi) live (NULL: on disk).
static void* param_dest(const Zero* z, size_t flat, size_t pi) {
    if (z->caps.params_on_disk) return NULL;
    return elem_at(z->params, z->caps.shard_params ? pi : flat, xs(z));
}

static float* state_at(const Zero* z, float* buf, size_t si) { return z->caps.state_on_disk ? NULL : buf + si; }

// Where flat element f of unit u (not frozen) is in a whole gradient buffer.
static size_t grad_index(const Zero* z, int u, size_t f) { return z->pieces.grad_offset[u] + unit_grad_index(z->pieces.lay, u, f); }

// The span of held flat elements [flat, flat + n) of unit u, inside tensor t (NULL for a span the optimizer
// never sees: the whole-model transfers below). Its master and state are meaningful only where none of
// its elements is frozen.
static StateSpan span_at(const Zero* z, const ParamTensor* t, int u, size_t flat, size_t n) {
    StateSpan s = {.t = t,
                   .optimizer = t ? kind_info(&z->pieces.lay->shape, t->kind)->optimizer : OPT_ADAMW,
                   .flat = flat,
                   .n = n,
                   .params = param_dest(z, flat, piece_index(z, u, flat))};
    if (flat < frozen_end(z, u)) return s;   // a frozen section's span: its working copy alone
    DType grad_dt;
    void* g = reduced_grads(z, &grad_dt);
    size_t si = state_index(z, u, flat);
    s.state = si;
    s.master = state_at(z, z->master, si);
    s.grad = elem_at(g, reduced_is_piece(z) ? si : grad_index(z, u, flat), dtype_size(grad_dt));
    s.grad_dt = grad_dt;
    for (int k = 0; k < z->opt_buffers - 1; k++) s.opt_state[k] = state_at(z, z->opt_state[k], si);
    return s;
}

typedef struct {
    StateSpanFn fn;
    void* ctx;
    StateParts which;
} SpanWalk;

// A part's spans: one per canonical run of each tensor inside it (so a span's elements are contiguous in
// llm.c's order), without tensor-group copies except for the update, and never a frozen tensor's.
static void part_to_spans(Zero* z, int u, size_t begin, size_t end, void* ctx) {
    SpanWalk* w = (SpanWalk*)ctx;
    const ParamLayout* lay = z->pieces.lay;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if ((t->replica && w->which != STATE_UPDATE) || is_frozen(z, t)) continue;
        size_t a = t->offset > begin ? t->offset : begin;
        size_t b = t->offset + t->size < end ? t->offset + t->size : end;
        while (a < b) {
            size_t n = tensor_run_left(t, a - t->offset);
            n = n < b - a ? n : b - a;
            StateSpan s = span_at(z, t, u, a, n);
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
    size_t a, b;
    if (is_frozen(z, t) || !owned_range(z, t->unit, flat, flat + n, &a, &b)) return 0;
    *out = span_at(z, t, t->unit, a, b - a);
    return 1;
}

// ---------------------------------------------------------------------------------------------------
// Whole-model transfers through the host.

typedef struct {
    Backend* be;
    const float* flat;
} SetCtx;

// The master of a stretch that has one (a frozen one's working copy is set with the others' below).
static void set_master(Zero* z, int u, size_t a, size_t b, int frozen, void* ctx) {
    if (frozen) return;
    SetCtx* c = (SetCtx*)ctx;
    ModelState ms = zero_model_state(z);
    StateSpan s = span_at(z, NULL, u, a, b - a);
    span_from_host(&ms, c->be, &s, SPAN_MASTER, c->flat + a);
}

// Sets master (and parameter pieces) wherever they live, through the span operations (model_state.h).
static void set_part(Zero* z, int u, size_t begin, size_t end, void* ctx) {
    SetCtx* c = (SetCtx*)ctx;
    ModelState ms = zero_model_state(z);
    for_each_stretch(z, u, begin, end, set_master, c);
    if (z->master_is_params || !z->caps.shard_params) return;   // whole parameters are set below
    StateSpan s = span_at(z, NULL, u, begin, end - begin);
    void* low = xmalloc(s.n * xs(z));
    host_to_dtype(low, z->pieces.dt, c->flat + begin, s.n);
    span_from_host(&ms, c->be, &s, SPAN_PARAMS, low);
    free(low);
}

static void set_whole_params(Zero* z, Backend* be, const float* flat) {
    for (int u = 0; u < z->pieces.lay->num_units; u++) {   // every parameter is held here
        const Unit* un = unit(z, u);
        void* low = xmalloc(un->size * xs(z));
        host_to_dtype(low, z->pieces.dt, flat + un->offset, un->size);
        be_upload(be, elem_at(z->params, un->offset, xs(z)), low, un->size * xs(z));
        free(low);
    }
}

void zero_set_from_host(Zero* z, Backend* be, const float* flat) {
    if (z->caps.shard_params) param_slots_invalidate(&z->gathered, &z->pieces);
    SetCtx c = {.be = be, .flat = flat};
    for_each_part(z, STATE_UPDATE, set_part, &c);
    if (!z->caps.shard_params && !z->master_is_params) set_whole_params(z, be, flat);
    if (z->disk) nvme_flush(z->disk);
}

typedef struct {
    Backend* be;
    size_t first;   // the flat index of host[0]
    float* host;
} MasterCtx;

// A stretch's master into host fp32, or a frozen one's working copy, its only copy.
static void master_stretch_to_host(Zero* z, int u, size_t a, size_t b, int frozen, void* ctx) {
    MasterCtx* c = (MasterCtx*)ctx;
    ModelState ms = zero_model_state(z);
    StateSpan s = span_at(z, NULL, u, a, b - a);
    float* dst = c->host + (a - c->first);
    if (!frozen) {
        span_to_host(&ms, c->be, &s, SPAN_MASTER, dst);
        return;
    }
    void* low = xmalloc(s.n * xs(z));
    span_to_host(&ms, c->be, &s, SPAN_PARAMS, low);
    host_from_dtype(dst, low, z->pieces.dt, s.n);
    free(low);
}

typedef struct {
    Backend* be;
    size_t first;   // the flat element at host[0]
    void* host;     // the reduced gradient's type
    size_t elem_bytes;
} GradCtx;

// A stretch's reduced gradient into host memory, or a frozen one's zeros (it has none).
static void grad_stretch_to_host(Zero* z, int u, size_t a, size_t b, int frozen, void* ctx) {
    GradCtx* c = (GradCtx*)ctx;
    void* dst = elem_at(c->host, a - c->first, c->elem_bytes);
    if (frozen) {
        memset(dst, 0, (b - a) * c->elem_bytes);
        return;
    }
    ModelState ms = zero_model_state(z);
    StateSpan s = span_at(z, NULL, u, a, b - a);
    span_to_host(&ms, c->be, &s, SPAN_GRAD, dst);
}

// Held flat elements [a, a + n) of unit u of buffer b (the master as fp32, or the reduced gradient in
// dt) into host memory, a frozen tensor's working copy standing in for the master it lacks, zeros for the
// gradient it lacks.
static void held_to_host(Zero* z, Backend* be, SpanBuffer b, int u, size_t a, size_t n, void* host) {
    ModelState ms = zero_model_state(z);
    if (b == SPAN_MASTER && frozen_in(z, u, a, a + n)) {
        MasterCtx c = {.be = be, .first = a, .host = (float*)host};
        for_each_stretch(z, u, a, a + n, master_stretch_to_host, &c);
        return;
    }
    if (b == SPAN_GRAD && frozen_in(z, u, a, a + n)) {
        GradCtx c = {.be = be, .first = a, .host = host, .elem_bytes = dtype_size(reduced_dtype(z))};
        for_each_stretch(z, u, a, a + n, grad_stretch_to_host, &c);
        return;
    }
    StateSpan s = span_at(z, NULL, u, a, n);
    span_to_host(&ms, be, &s, b, host);
}

// Gathers buffer b (master or reduced gradients, of type dt), held as pieces, into host fp32 in the flat
// layout, section by section. Where the pieces are not backend memory (or a frozen tensor's working copy stands in for the
// master) they go up first: the gather runs on backend memory.
static void pieces_to_host(Zero* z, Backend* be, SpanBuffer b, DType dt, float* flat) {
    ModelState ms = zero_model_state(z);
    size_t x = dtype_size(dt), largest = 0;
    for (int u = 0; u < z->pieces.lay->num_units; u++) largest = unit(z, u)->padded > largest ? unit(z, u)->padded : largest;
    void* buf = be_malloc(be, largest * x);   // checkpoint time only, never in the step
    void* host = xmalloc(largest * x);
    for (int u = 0; u < z->pieces.lay->num_units; u++)
        for (int sec = 0; sec < UNIT_SECTIONS; sec++) {
            const Unit* un = unit(z, u);
            size_t p = section_piece(&z->pieces, u, sec), first = piece_begin(&z->pieces, u, sec), begin = section_begin(un, sec);
            if (!p) continue;
            void* mine = elem_at(buf, (size_t)z->pieces.rank * p, x);
            StateSpan s = span_at(z, NULL, u, first, p);
            if (span_place(&ms, b) == IN_BACKEND && sec == 1)
                be_copy(be, mine, span_ptr(&ms, &s, b, 0), p * x);
            else {
                held_to_host(z, be, b, u, first, p, host);
                be_upload(be, mine, host, p * x);
            }
            if (z->pieces.size > 1) comm_allgather(z->pieces.dp, buf, p, dt);
            size_t n = min_size(section_len(un, sec), un->offset + un->size - begin);   // to the unit's last tensor
            if (!flat) continue;
            be_download(be, host, buf, n * x);
            host_from_dtype(flat + begin, host, dt, n);
        }
    free(host);
    be_free(be, buf);
}

// Buffer b held whole (indexed like the layout) into host fp32.
static void full_to_host(Zero* z, Backend* be, SpanBuffer b, DType dt, float* flat) {
    if (!flat) return;
    for (int u = 0; u < z->pieces.lay->num_units; u++) {
        const Unit* un = unit(z, u);
        void* host = xmalloc(un->size * dtype_size(dt));
        held_to_host(z, be, b, u, un->offset, un->size, host);
        host_from_dtype(flat + un->offset, host, dt, un->size);
        free(host);
    }
}

void zero_master_to_host(Zero* z, Backend* be, float* flat) {
    if (z->caps.shard_state) pieces_to_host(z, be, SPAN_MASTER, DT_FP32, flat);
    else full_to_host(z, be, SPAN_MASTER, DT_FP32, flat);
}

void zero_grads_to_host(Zero* z, Backend* be, float* flat) {
    DType dt = reduced_dtype(z);
    if (reduced_is_piece(z)) pieces_to_host(z, be, SPAN_GRAD, dt, flat);
    else full_to_host(z, be, SPAN_GRAD, dt, flat);
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

// The holders' own per-rank files (feedback_file.h): 1-bit Adam's errors and qgZ's.
static void state_save_own(void* ctx, Backend* be, const char* dir) {
    Zero* z = (Zero*)ctx;
    if (z->caps.onebit) onebit_save(&z->onebit, be, &z->pieces, dir);
    if (z->caps.qg) qgz_save(&z->qgz, be, &z->pieces, dir);
}
static void state_load_own(void* ctx, Backend* be, const char* dir) {
    Zero* z = (Zero*)ctx;
    if (z->caps.onebit) onebit_load(&z->onebit, be, &z->pieces, dir);
    if (z->caps.qg) qgz_load(&z->qgz, be, &z->pieces, dir);
}

ModelState zero_model_state(Zero* z) {
    ModelState s = {.ctx = z,
                    .lay = z->pieces.lay,
                    .dt = z->pieces.dt,
                    .whole_params = z->caps.shard_params ? NULL : z->params,
                    .parts = reduced_is_piece(z) && z->pieces.size > 1 ? z->pieces.dp : NULL,
                    .scratch = z->norm_acc,
                    .places = {.params = params_place(z), .state = state_place(z), .grads = grads_place(z)},
                    .disk = z->disk,
                    .stage = z->stage,
                    .pending = z->pending,
                    .for_each_span = state_for_each_span,
                    .owned_span = state_owned_span,
                    .set_from_host = state_set_from_host,
                    .master_to_host = state_master_to_host,
                    .save_own = z->caps.onebit || z->caps.qg ? state_save_own : NULL,
                    .load_own = z->caps.onebit || z->caps.qg ? state_load_own : NULL};
    return s;
}
