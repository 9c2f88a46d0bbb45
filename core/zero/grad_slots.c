// grad_slots.c: the rotating gradient slots and their reduce-scatters. See grad_slots.h.
#include "core/zero/grad_slots.h"

#include "base/common.h"

// Whether unit u's gradients go through the edge slot (grad_slots.h): the embedding unit's, and the final
// unit's unless the head is tied (then it is the final norm alone, and rotates like a block).
static int uses_edge_slot(const ParamLayout* lay, int u) {
    return u == lay->emb_unit || (u == lay->final_unit && !edge_units_overlap(lay));
}

// The largest gradient buffer of the units that go through the edge slot (edge = 1) or the rotating ones
// (edge = 0).
static size_t largest_unit(const Pieces* pc, int edge) {
    size_t m = 0;
    for (int u = 0; u < pc->lay->num_units; u++)
        if (uses_edge_slot(pc->lay, u) == edge && pc->grad_len[u] > m) m = pc->grad_len[u];
    return m;
}

void grad_slots_init(GradSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, size_t acc_elems, int on_host, int tied,
                     int local_capable) {
    *g = (GradSlots){.on_host = on_host};
    // The largest share of a unit's reduced gradient this rank adds up: its piece of the trained section
    // (a frozen embedding, the largest unit, has none).
    size_t max_piece = 0, x = piece_elem_bytes(pc);
    for (int u = 0; u < pc->lay->num_units; u++) max_piece = pc->mine_len[u] > max_piece ? pc->mine_len[u] : max_piece;
    if (on_host) {
        g->acc = (float*)mem_alloc_host(be, mem, MEM_HOST_GRADS, acc_elems * 4);
        g->landing = grad_landing_create(be, mem, pc->dt, max_piece);
    } else {
        g->acc = (float*)mem_alloc(be, mem, MEM_GRADS, acc_elems * 4);
    }
    // The accumulator's additions on the backend; with on_host only the tied embedding's all-reduce.
    if (!on_host || tied || local_capable) g->piece_f32 = (float*)mem_alloc(be, mem, MEM_GRADS, max_piece * 4);
    size_t rotating = largest_unit(pc, 0), edge = largest_unit(pc, 1);
    for (int s = 0; s < 2; s++) {
        g->slot[s].buf = mem_alloc(be, mem, MEM_GRADS, rotating * x);
        g->slot[s].unit = -1;
    }
    g->edge.unit = -1;
    if (edge) g->edge.buf = mem_alloc(be, mem, MEM_GRADS, edge * x);
}

// Reduce-scatters unit u's gradient buffer (its trained section) into each rank's share. qgZ's reduction is
// synchronous: its piece is in place when this returns.
static CommHandle reduce_start(const GradSlots* g, const Pieces* pc, int u, void* buf) {
    size_t p = pc->mine_len[u];
    if (pc->size == 1 || !p || g->local) return comm_no_handle();
    if (g->qgz && qgz_covers(pc, u)) {
        qgz_reduce_scatter(g->qgz, pc, u, buf);
        return comm_no_handle();
    }
    return comm_reduce_scatter_sum_start(pc->dp, elem_at(buf, pc->mine_first[u], piece_elem_bytes(pc)), buf, p, pc->dt);
}

// Waits for unit u's reduce-scatter of buf and adds this rank's piece into the fp32 accumulator: on the
// backend, or (on_host) on the host, with the same fp32 additions, once the piece has come down (queued:
// grad_slots_finish_all drains it).
// 1-bit Adam's local gradient: the whole unit, added chunk by chunk through the fp32 scratch.
static void add_to_local(GradSlots* g, Backend* be, const Pieces* pc, int u, const void* buf) {
    size_t p = pc->mine_len[u];
    for (int c = 0; c < pc->size; c++) {
        float* local = g->local + pc->grad_offset[u] + (size_t)c * p;
        convert(be, g->piece_f32, DT_FP32, elem_at((void*)buf, (size_t)c * p, piece_elem_bytes(pc)), pc->dt, p);
        residual_forward(be, DT_FP32, local, local, g->piece_f32, p);
    }
}

static void reduce_into_accumulator(GradSlots* g, Backend* be, const Pieces* pc, int u, void* buf, CommHandle* h) {
    size_t p = pc->mine_len[u];
    pieces_wait(pc, h);
    if (!p) return;
    if (g->local) {
        add_to_local(g, be, pc, u, buf);
        return;
    }
    float* acc = g->acc + pc->mine_offset[u];
    const void* mine = elem_at(buf, pc->mine_first[u], piece_elem_bytes(pc));
    if (g->on_host) {
        grad_landing_add(g->landing, be, acc, mine, p);
        return;
    }
    convert(be, g->piece_f32, DT_FP32, mine, pc->dt, p);
    residual_forward(be, DT_FP32, acc, acc, g->piece_f32, p);
}

static void start_reduce(GradSlots* g, const Pieces* pc, GradSlot* s, int u) {
    s->flight = reduce_start(g, pc, u, s->buf);
    s->state = GRAD_REDUCING;
    s->unit = u;
    s->seq = ++g->started;
}

static void finish_grad_slot(GradSlots* g, Backend* be, const Pieces* pc, GradSlot* s) {
    if (s->state != GRAD_REDUCING) return;
    reduce_into_accumulator(g, be, pc, s->unit, s->buf, &s->flight);
    s->state = GRAD_FREE;
    s->unit = -1;
}

void grad_slots_finish_all(GradSlots* g, Backend* be, const Pieces* pc) {
    int first = g->slot[0].seq <= g->slot[1].seq ? 0 : 1;
    finish_grad_slot(g, be, pc, &g->slot[first]);
    finish_grad_slot(g, be, pc, &g->slot[1 - first]);
    finish_grad_slot(g, be, pc, &g->edge);
    if (g->on_host) grad_landing_drain(g->landing);
}

// The rotating slot filling with unit u's gradients; NULL if none.
static GradSlot* filling_slot(GradSlots* g, int u) {
    GradSlot* slot = g->slot;
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
static GradSlot* take_grad_slot(GradSlots* g, Backend* be, const Pieces* pc, int u) {
    GradSlot* slot = g->slot;
    for (int s = 0; s < 2; s++)
        if (slot[s].state == GRAD_REDUCING && slot[s].unit == u) finish_grad_slot(g, be, pc, &slot[s]);
    GradSlot* pick = NULL;
    for (int s = 0; s < 2; s++)
        if (slot[s].state != GRAD_FILLING && (!pick || better_to_take(&slot[s], pick))) pick = &slot[s];
    if (!pick)
        fail("internal: no free gradient buffer for unit %d (units %d and %d still held)", u, slot[0].unit, slot[1].unit);
    finish_grad_slot(g, be, pc, pick);
    return pick;
}

// The edge slot for unit u: the reduce-scatter in flight there finished first.
static GradSlot* take_edge_slot(GradSlots* g, Backend* be, const Pieces* pc, int u) {
    GradSlot* s = &g->edge;
    if (s->state == GRAD_FILLING && s->unit != u)
        fail("internal: the walk fills unit %d's gradients while unit %d fills their shared buffer", u, s->unit);
    finish_grad_slot(g, be, pc, s);
    return s;
}

// The slot to accumulate unit u's gradients in: the edge slot, the rotating one already filling with u, or
// a newly taken one.
static GradSlot* grad_slot_for(GradSlots* g, Backend* be, const Pieces* pc, int u) {
    if (uses_edge_slot(pc->lay, u)) return take_edge_slot(g, be, pc, u);
    GradSlot* s = filling_slot(g, u);
    return s ? s : take_grad_slot(g, be, pc, u);
}

void* grad_slots_buffer(GradSlots* g, Backend* be, const Pieces* pc, int u) {
    GradSlot* s = grad_slot_for(g, be, pc, u);
    if (s->state == GRAD_FREE) {
        be_memset0(be, s->buf, pc->grad_len[u] * piece_elem_bytes(pc));
        s->state = GRAD_FILLING;
        s->unit = u;
    }
    return s->buf;
}

void grad_slots_done(GradSlots* g, const Pieces* pc, int u) {
    GradSlot* s = uses_edge_slot(pc->lay, u) ? &g->edge : filling_slot(g, u);
    if (!s || s->state != GRAD_FILLING || s->unit != u) fail("internal: gradients of unit %d finished but never requested", u);
    start_reduce(g, pc, s, u);
}
