// zero.c: ZeRO stages 0-3. See zero.h.
#include "zero.h"

#include "base/common.h"

static size_t xs(const Zero* z) { return dtype_size(z->dt); }
static void* at(void* base, size_t index, size_t elem_bytes) { return (char*)base + index * elem_bytes; }
static const Unit* unit(const Zero* z, int u) { return &z->lay->units[u]; }
static size_t piece(const Zero* z, int u) { return unit(z, u)->padded / (size_t)z->size; }
static int emb_unit(const Zero* z) { return z->lay->emb_unit; }
static int final_unit(const Zero* z) { return z->lay->final_unit; }
static int is_block(const Zero* z, int u) { return u != emb_unit(z) && u != final_unit(z); }

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

static void allocate_grads(Zero* z, Backend* be, MemLedger* mem) {
    size_t total = z->lay->total, x = xs(z);
    if (z->stage < 2) {
        z->grads = mem_alloc(be, mem, MEM_GRADS, total * x);
        if (z->stage == 1) z->grads_piece = pieces_are_whole(z) ? z->grads : mem_alloc(be, mem, MEM_GRADS, z->state_elems * x);
        return;
    }
    size_t block = largest_block_unit(z->lay), max_piece = 0;
    for (int u = 0; u < z->lay->num_units; u++) max_piece = piece(z, u) > max_piece ? piece(z, u) : max_piece;
    z->grad_acc = (float*)mem_alloc(be, mem, MEM_GRADS, z->state_elems * 4);
    z->piece_f32 = (float*)mem_alloc(be, mem, MEM_GRADS, max_piece * 4);
    for (int s = 0; s < 2; s++) {
        z->grad_slot[s] = mem_alloc(be, mem, MEM_GRADS, block * x);
        z->grad_slot_unit[s] = -1;
    }
    if (emb_unit(z) >= 0) z->emb_grads = mem_alloc(be, mem, MEM_GRADS, unit(z, emb_unit(z))->padded * x);
}

static void allocate_params(Zero* z, Backend* be, MemLedger* mem) {
    size_t x = xs(z);
    z->params = mem_alloc(be, mem, MEM_PARAMS, (z->stage == 3 ? z->state_elems : z->lay->total) * x);
    // fp32 parameters are their own master copy where both use the same indexing.
    int alias = z->dt == DT_FP32 && (z->stage == 0 || z->stage == 3 || pieces_are_whole(z));
    z->master = alias ? (float*)z->params : (float*)mem_alloc(be, mem, MEM_MASTER, z->state_elems * 4);
    z->adam_m = (float*)mem_alloc(be, mem, MEM_OPTIMIZER, z->state_elems * 4);
    z->adam_v = (float*)mem_alloc(be, mem, MEM_OPTIMIZER, z->state_elems * 4);
    if (z->stage < 3) return;
    size_t block = largest_block_unit(z->lay);
    for (int s = 0; s < 2; s++) {
        z->param_slot[s] = mem_alloc(be, mem, MEM_PARAMS, block * x);
        z->param_slot_unit[s] = -1;
    }
    if (emb_unit(z) >= 0) z->resident[0] = mem_alloc(be, mem, MEM_PARAMS, unit(z, emb_unit(z))->padded * x);
    if (final_unit(z) >= 0) z->resident[1] = mem_alloc(be, mem, MEM_PARAMS, unit(z, final_unit(z))->padded * x);
}

static void zero_init(Zero* z, Backend* be, MemLedger* mem, const ParamLayout* lay, int stage, Comm* dp, Comm* tied,
                      int rank, int size, DType dt) {
    memset(z, 0, sizeof(*z));
    z->stage = stage;
    z->dp = dp;
    z->tied = tied;
    z->rank = rank;
    z->size = size;
    z->dt = dt;
    z->lay = lay;
    size_t off = 0;
    for (int u = 0; u < lay->num_units; u++) {
        if (lay->units[u].padded % zero_pad_multiple(z->size) != 0)
            fail("internal: unit %d (%zu elements) is not padded for %d ranks", u, lay->units[u].padded, z->size);
        z->piece_offset[u] = off;
        off += piece(z, u);
    }
    z->state_elems = stage == 0 ? lay->total : off;
    allocate_params(z, be, mem);
    allocate_grads(z, be, mem);
    z->norm_acc = (float*)mem_alloc(be, mem, MEM_GRADS, sizeof(float));
}

void zero_create(Zero* z, Backend* be, MemLedger* mem, const ParamLayout* lay, int stage, Comm* dp, Comm* tied, DType dt) {
    zero_init(z, be, mem, lay, stage, dp, tied, dp ? comm_rank(dp) : 0, dp ? comm_size(dp) : 1, dt);
}

void zero_plan(MemLedger* mem, const ParamLayout* lay, int stage, int size, DType dt) {
    Zero z;
    zero_init(&z, NULL, mem, lay, stage, NULL, NULL, 0, size, dt);
}

static void settle(Zero* z, Backend* be);

void zero_destroy(Zero* z, Backend* be) {
    settle(z, be);
    if (z->grads_piece == z->grads) z->grads_piece = NULL;   // an alias, not an allocation
    void* owned[] = {z->params, z->adam_m, z->adam_v, z->grads, z->grads_piece, z->grad_acc, z->piece_f32,
                     z->grad_slot[0], z->grad_slot[1], z->emb_grads, z->param_slot[0], z->param_slot[1],
                     z->resident[0], z->resident[1], z->norm_acc};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++)
        if (owned[i]) be_free(be, owned[i]);
    if ((void*)z->master != z->params) be_free(be, z->master);
    memset(z, 0, sizeof(*z));
}

// ---------------------------------------------------------------------------------------------------
// Parameters for the walk.
//
// ZeRO-3 prefetch: when the walk asks for block l, the gather of the block it will ask for next starts
// into the other buffer, so it runs while l computes: l+1 walking forward, l-1 backward. The direction
// comes from the order of the requests (l after l-1: forward, after l+1: backward); a request after
// neither begins a walk, which starts at an end of this layout's blocks and goes inward. gpt.c's walks
// (and a 1F1B stage's) always cover all the blocks, so every prefetched block is asked for, the bytes
// moved are those of the unprefetched walk (tests/zero_check.py), and zero.c needs no hint from the walk.
// A prefetch nobody asks for would cost a gather, not correctness: it is dropped when its buffer is needed
// and when the parameters change.

static CommHandle no_handle(void) { return (CommHandle){0, 0}; }

// Starts the all-gather of unit u's parameters from every rank's piece into buf (the unit's padded size).
static CommHandle gather_start(Zero* z, Backend* be, int u, void* buf) {
    size_t p = piece(z, u), x = xs(z);
    be_copy(be, at(buf, (size_t)z->rank * p, x), at(z->params, z->piece_offset[u], x), p * x);
    return z->size > 1 ? comm_allgather_start(z->dp, buf, p, z->dt) : no_handle();
}

static void wait_for(Zero* z, CommHandle* h) {
    if (z->size > 1) comm_wait(z->dp, h);
}

static void gather_unit(Zero* z, Backend* be, int u, void* buf) {
    CommHandle h = gather_start(z, be, u, buf);
    wait_for(z, &h);
}

static int find_slot(const int* slot_unit, int u) {
    for (int s = 0; s < 2; s++)
        if (slot_unit[s] == u) return s;
    return -1;
}

static int take_slot(int* slot_unit, int u, const char* what) {
    int s = find_slot(slot_unit, -1);
    if (s < 0) fail("internal: no free %s buffer for unit %d (units %d and %d still held)", what, u, slot_unit[0], slot_unit[1]);
    slot_unit[s] = u;
    return s;
}

// The unit of block l when this layout holds it, else -1.
static int held_block_unit(const Zero* z, int l) {
    return l >= 0 && l < z->lay->shape.L ? z->lay->block_unit[l] : -1;
}

// The block unit the walk will ask for after block unit u, or -1 when that is not certain.
static int next_block_unit(Zero* z, int u) {
    int l = z->lay->first_block + (u - z->lay->block_unit[z->lay->first_block]), dir = 0;
    if (z->walk_started && z->walk_last_block == l - 1) dir = 1;
    else if (z->walk_started && z->walk_last_block == l + 1) dir = -1;
    else if (held_block_unit(z, l - 1) < 0) dir = 1;
    else if (held_block_unit(z, l + 1) < 0) dir = -1;
    z->walk_last_block = l;
    z->walk_started = 1;
    return dir ? held_block_unit(z, l + dir) : -1;
}

// Finishes and forgets the gathers the walk has not asked for (parameters about to change, teardown).
static void drop_prefetches(Zero* z) {
    for (int s = 0; s < 2; s++) {
        if (z->param_slot_held[s] || z->param_slot_unit[s] < 0) continue;
        wait_for(z, &z->param_flight[s]);
        z->param_slot_unit[s] = -1;
    }
}

static void prefetch(Zero* z, Backend* be, int u) {
    if (u < 0 || find_slot(z->param_slot_unit, u) >= 0) return;
    int s = find_slot(z->param_slot_unit, -1);
    if (s < 0) return;   // both buffers in use: the walk asks for it later and gathers it then
    z->param_slot_unit[s] = u;
    z->param_flight[s] = gather_start(z, be, u, z->param_slot[s]);
}

static void* block_params_of(Zero* z, Backend* be, int u) {
    int s = find_slot(z->param_slot_unit, u);
    if (s >= 0 && z->param_slot_held[s]) return z->param_slot[s];   // asked again while held: not a step
    if (s < 0) {
        if (find_slot(z->param_slot_unit, -1) < 0) drop_prefetches(z);   // a prefetch nobody asked for
        s = take_slot(z->param_slot_unit, u, "parameter");
        z->param_flight[s] = gather_start(z, be, u, z->param_slot[s]);
    }
    z->param_slot_held[s] = 1;
    prefetch(z, be, next_block_unit(z, u));   // started before the wait below, so MPI progresses both
    wait_for(z, &z->param_flight[s]);
    return z->param_slot[s];
}

void* zero_params(Zero* z, Backend* be, int u) {
    if (z->stage < 3) return at(z->params, unit(z, u)->offset, xs(z));
    if (!is_block(z, u)) {   // small, or shared by the LM head and the encoder: keep until the next update
        int r = u == emb_unit(z) ? 0 : 1;
        if (!(z->resident_valid & (1 << r))) gather_unit(z, be, u, z->resident[r]);
        z->resident_valid |= 1 << r;
        return z->resident[r];
    }
    return block_params_of(z, be, u);
}

void zero_prefetch(Zero* z, Backend* be, int u) {
    if (z->stage == 3 && is_block(z, u)) prefetch(z, be, u);
}

void zero_params_done(Zero* z, int u) {
    if (z->stage < 3 || !is_block(z, u)) return;
    int s = find_slot(z->param_slot_unit, u);
    if (s < 0 || !z->param_slot_held[s]) return;
    z->param_slot_unit[s] = -1;
    z->param_slot_held[s] = 0;
}

// ---------------------------------------------------------------------------------------------------
// Gradients for the walk.
//
// Stages 2-3 overlap: a unit's reduce-scatter starts when the walk is done with its gradients and is
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

// Waits for unit u's reduce-scatter of buf and adds this rank's piece into the fp32 accumulator.
static void reduce_into_accumulator(Zero* z, Backend* be, int u, void* buf, CommHandle* h) {
    size_t p = piece(z, u);
    wait_for(z, h);
    float* acc = z->grad_acc + z->piece_offset[u];
    convert(be, z->piece_f32, DT_FP32, at(buf, (size_t)z->rank * p, xs(z)), z->dt, p);
    residual_forward(be, DT_FP32, acc, acc, z->piece_f32, p);
}

static void finish_grad_slot(Zero* z, Backend* be, int s) {
    if (!z->grad_flight_live[s]) return;
    reduce_into_accumulator(z, be, z->grad_flight_unit[s], z->grad_slot[s], &z->grad_flight[s]);
    z->grad_flight_live[s] = 0;
}

static void finish_emb_grads(Zero* z, Backend* be) {
    if (!z->emb_flight_live) return;
    reduce_into_accumulator(z, be, emb_unit(z), z->emb_grads, &z->emb_flight);
    z->emb_flight_live = 0;
}

static void finish_all_grads(Zero* z, Backend* be) {
    if (z->stage < 2) return;
    int first = z->grad_flight_seq[0] <= z->grad_flight_seq[1] ? 0 : 1;
    finish_grad_slot(z, be, first);
    finish_grad_slot(z, be, 1 - first);
    finish_emb_grads(z, be);
}

// A gradient buffer for unit u: finishes u's previous reduce-scatter if it is still in flight, then takes a
// buffer the walk does not hold, preferring one with nothing in flight, else the older reduce-scatter's.
static int take_grad_slot(Zero* z, Backend* be, int u) {
    for (int s = 0; s < 2; s++)
        if (z->grad_flight_live[s] && z->grad_flight_unit[s] == u) finish_grad_slot(z, be, s);
    int pick = -1;
    for (int s = 0; s < 2; s++) {
        if (z->grad_slot_unit[s] != -1) continue;
        int idle = !z->grad_flight_live[s];
        if (pick < 0 || (idle && z->grad_flight_live[pick]) ||
            (!idle && z->grad_flight_live[pick] && z->grad_flight_seq[s] < z->grad_flight_seq[pick]))
            pick = s;
    }
    if (pick < 0)
        fail("internal: no free gradient buffer for unit %d (units %d and %d still held)", u, z->grad_slot_unit[0],
             z->grad_slot_unit[1]);
    finish_grad_slot(z, be, pick);
    z->grad_slot_unit[pick] = u;
    return pick;
}

void* zero_grads(Zero* z, Backend* be, int u) {
    size_t x = xs(z);
    if (z->stage < 2) return at(z->grads, unit(z, u)->offset, x);
    if (u == emb_unit(z)) {
        finish_emb_grads(z, be);
        if (!z->emb_grads_live) be_memset0(be, z->emb_grads, unit(z, u)->padded * x);
        z->emb_grads_live = 1;
        return z->emb_grads;
    }
    int s = find_slot(z->grad_slot_unit, u);
    if (s >= 0) return z->grad_slot[s];
    s = take_grad_slot(z, be, u);
    be_memset0(be, z->grad_slot[s], unit(z, u)->padded * x);
    return z->grad_slot[s];
}

// Nothing of ours left in flight (teardown: the comm layer refuses to free a group that has some).
static void settle(Zero* z, Backend* be) {
    if (z->stage == 3) drop_prefetches(z);
    finish_all_grads(z, be);
}

void zero_grads_done(Zero* z, Backend* be, int u) {
    if (z->stage < 2) return;
    if (u == emb_unit(z)) {
        z->emb_flight = reduce_start(z, u, z->emb_grads);
        z->emb_flight_live = 1;
        z->emb_grads_live = 0;
        return;
    }
    int s = find_slot(z->grad_slot_unit, u);
    if (s < 0) fail("internal: gradients of unit %d finished but never requested", u);
    z->grad_flight[s] = reduce_start(z, u, z->grad_slot[s]);
    z->grad_flight_unit[s] = u;
    z->grad_flight_live[s] = 1;
    z->grad_flight_seq[s] = ++z->grad_seq;
    z->grad_slot_unit[s] = -1;
}

// ---------------------------------------------------------------------------------------------------
// Step boundary.

void zero_begin_step(Zero* z, Backend* be) {
    if (z->stage < 2) be_memset0(be, z->grads, z->lay->total * xs(z));
    else be_memset0(be, z->grad_acc, z->state_elems * 4);
}

// The embedding unit's reduced gradient (what the optimizer will read for it) and its mirror's have the
// same layout, so one all-reduce over the tied pair sums the LM head's and the encoder's contributions.
static void sum_tied_embedding(Zero* z) {
    int u = emb_unit(z);
    if (!z->tied || u < 0) return;
    if (z->stage == 0) comm_allreduce_sum(z->tied, at(z->grads, unit(z, u)->offset, xs(z)), unit(z, u)->padded, z->dt);
    else if (z->stage == 1) comm_allreduce_sum(z->tied, at(z->grads_piece, z->piece_offset[u], xs(z)), piece(z, u), z->dt);
    else comm_allreduce_sum(z->tied, z->grad_acc + z->piece_offset[u], piece(z, u), DT_FP32);
}

void zero_reduce_grads(Zero* z, Backend* be) {
    size_t x = xs(z);
    finish_all_grads(z, be);
    if (z->stage == 0 && z->size > 1) comm_allreduce_sum(z->dp, z->grads, z->lay->total, z->dt);
    for (int u = 0; z->stage == 1 && u < z->lay->num_units; u++) {
        void* dst = at(z->grads_piece, z->piece_offset[u], x);
        const void* src = at(z->grads, unit(z, u)->offset, x);
        if (z->size > 1) comm_reduce_scatter_sum(z->dp, dst, src, piece(z, u), z->dt);
        else if (dst != src) be_copy(be, dst, src, piece(z, u) * x);
    }
    sum_tied_embedding(z);
}

// FNV-1a over the bytes of this rank's part of the embedding unit's parameters (working copy).
static uint64_t embedding_hash(Zero* z, Backend* be) {
    int u = emb_unit(z);
    size_t x = xs(z), n = z->stage == 3 ? piece(z, u) : unit(z, u)->padded;
    const void* src = z->stage == 3 ? at(z->params, z->piece_offset[u], x) : at(z->params, unit(z, u)->offset, x);
    unsigned char* host = (unsigned char*)xmalloc(n * x);
    be_download(be, host, src, n * x);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * x; i++) h = (h ^ host[i]) * 1099511628211ull;
    free(host);
    return h;
}

int zero_tied_in_sync(Zero* z, Backend* be) {
    if (!z->tied) return 1;
    uint64_t h = embedding_hash(z, be);
    // The hash as two exact 32-bit halves; equal on both ends iff max == -max(-x) for each.
    double v[4] = {(double)(h >> 32), (double)(h & 0xffffffffu), -(double)(h >> 32), -(double)(h & 0xffffffffu)};
    comm_allreduce_host_max(z->tied, v, 4);
    return v[0] == -v[2] && v[1] == -v[3];
}

void zero_after_update(Zero* z, Backend* be) {
    if (z->stage == 3) z->resident_valid = 0;
    if (z->stage == 3) drop_prefetches(z);
    if ((z->stage != 1 && z->stage != 2) || z->size == 1) return;
    for (int u = 0; u < z->lay->num_units; u++) comm_allgather(z->dp, at(z->params, unit(z, u)->offset, xs(z)), piece(z, u), z->dt);
}

void zero_for_each_part(Zero* z, ZeroParts which, ZeroPartFn fn, void* ctx) {
    for (int u = 0; u < z->lay->num_units; u++) {
        const Unit* un = unit(z, u);
        size_t real_end = un->offset + un->size;
        if (which != ZERO_UPDATE && unit_is_mirror(z->lay, u)) continue;
        if (z->stage == 0 && which != ZERO_CHECKPOINT) {
            fn(z, un->offset, real_end, un->offset, ctx);
            continue;
        }
        size_t begin = un->offset + (size_t)z->rank * piece(z, u);
        size_t end = begin + piece(z, u) < real_end ? begin + piece(z, u) : real_end;
        if (begin < end) fn(z, begin, end, z->stage == 0 ? begin : z->piece_offset[u], ctx);
    }
}

typedef struct {
    ZeroSpanFn fn;
    void* ctx;
} SpanWalk;

static void part_to_spans(Zero* z, size_t begin, size_t end, size_t si, void* ctx) {
    SpanWalk* w = (SpanWalk*)ctx;
    const ParamLayout* lay = z->lay;
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        size_t a = t->offset > begin ? t->offset : begin;
        size_t b = t->offset + t->size < end ? t->offset + t->size : end;
        if (a < b) w->fn(z, t, a, si + (a - begin), b - a, w->ctx);
    }
}

void zero_for_each_span(Zero* z, ZeroParts which, ZeroSpanFn fn, void* ctx) {
    SpanWalk w = {fn, ctx};
    zero_for_each_part(z, which, part_to_spans, &w);
}

int zero_owned_range(const Zero* z, int u, size_t begin, size_t end, size_t* a, size_t* b, size_t* si) {
    if (z->stage == 0) {
        *a = begin, *b = end, *si = begin;
        return begin < end;
    }
    size_t mine = unit(z, u)->offset + (size_t)z->rank * piece(z, u);
    *a = begin > mine ? begin : mine;
    *b = end < mine + piece(z, u) ? end : mine + piece(z, u);
    *si = z->piece_offset[u] + (*a - mine);
    return *a < *b;
}

const void* zero_grad_source(const Zero* z, size_t flat, size_t state_index, DType* dt) {
    *dt = z->stage >= 2 ? DT_FP32 : z->dt;
    if (z->stage == 0) return at(z->grads, flat, xs(z));
    if (z->stage == 1) return at(z->grads_piece, state_index, xs(z));
    return z->grad_acc + state_index;
}

void* zero_param_dest(const Zero* z, size_t flat, size_t state_index) {
    return at(z->params, z->stage == 3 ? state_index : flat, xs(z));
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
    be_upload(c->be, z->master + si, c->flat + begin, n * 4);
    if ((void*)z->master == z->params) return;
    if (z->stage < 3) return;   // stages 0-2 set the full parameter buffer below
    void* low = xmalloc(n * xs(z));
    host_to_dtype(low, z->dt, c->flat + begin, n);
    be_upload(c->be, at(z->params, si, xs(z)), low, n * xs(z));
    free(low);
}

void zero_set_from_host(Zero* z, Backend* be, const float* flat) {
    SetCtx c = {be, flat};
    zero_for_each_part(z, ZERO_UPDATE, set_part, &c);
    if (z->stage == 3 || (void*)z->master == z->params) return;
    for (int u = 0; u < z->lay->num_units; u++) {   // stages 0-2 hold every parameter
        const Unit* un = unit(z, u);
        void* low = xmalloc(un->size * xs(z));
        host_to_dtype(low, z->dt, flat + un->offset, un->size);
        be_upload(be, at(z->params, un->offset, xs(z)), low, un->size * xs(z));
        free(low);
    }
}

// Gathers a buffer held as pieces (index = state index) into host fp32, flat layout.
static void pieces_to_host(Zero* z, Backend* be, const void* pieces, DType dt, float* flat) {
    size_t x = dtype_size(dt), largest = 0;
    for (int u = 0; u < z->lay->num_units; u++) largest = unit(z, u)->padded > largest ? unit(z, u)->padded : largest;
    void* buf = be_malloc(be, largest * x);   // checkpoint time only, never in the step
    void* host = xmalloc(largest * x);
    for (int u = 0; u < z->lay->num_units; u++) {
        size_t p = piece(z, u);
        be_copy(be, at(buf, (size_t)z->rank * p, x), at((void*)pieces, z->piece_offset[u], x), p * x);
        if (z->size > 1) comm_allgather(z->dp, buf, p, dt);
        if (!flat) continue;
        be_download(be, host, buf, unit(z, u)->size * x);
        host_from_dtype(flat + unit(z, u)->offset, host, dt, unit(z, u)->size);
    }
    free(host);
    be_free(be, buf);
}

// A full flat buffer (stage 0's) into host fp32.
static void full_to_host(Zero* z, Backend* be, const void* full, DType dt, float* flat) {
    size_t x = dtype_size(dt);
    if (!flat) return;
    for (int u = 0; u < z->lay->num_units; u++) {
        const Unit* un = unit(z, u);
        void* host = xmalloc(un->size * x);
        be_download(be, host, at((void*)full, un->offset, x), un->size * x);
        host_from_dtype(flat + un->offset, host, dt, un->size);
        free(host);
    }
}

void zero_master_to_host(Zero* z, Backend* be, float* flat) {
    if (z->stage == 0) full_to_host(z, be, z->master, DT_FP32, flat);
    else pieces_to_host(z, be, z->master, DT_FP32, flat);
}

void zero_grads_to_host(Zero* z, Backend* be, float* flat) {
    if (z->stage == 0) full_to_host(z, be, z->grads, z->dt, flat);
    else if (z->stage == 1) pieces_to_host(z, be, z->grads_piece, z->dt, flat);
    else pieces_to_host(z, be, z->grad_acc, DT_FP32, flat);
}
