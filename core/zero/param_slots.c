// param_slots.c: the gathered parameters and their prefetch. See param_slots.h.
#include "core/zero/param_slots.h"

#include "base/common.h"
#include "core/util/phase_timer.h"

// The edge slot serving edge unit u (param_slots.h's edge[]).
static int edge_index(const ParamLayout* lay, int u) { return u == lay->final_unit && edge_units_overlap(lay) ? 1 : 0; }

// Elements of edge slot e: the largest unit it serves (0: none on this layout).
static size_t edge_elems(const ParamLayout* lay, int e) {
    size_t m = 0;
    int units[2] = {lay->emb_unit, lay->final_unit};
    for (int i = 0; i < 2; i++)
        if (units[i] >= 0 && edge_index(lay, units[i]) == e && lay->units[units[i]].padded > m) m = lay->units[units[i]].padded;
    return m;
}

// Allocates slot p's buffer of `elems` (nothing for 0) and with on_disk its buffer for this rank's piece read
// from the disk (host memory).
static void alloc_slot(ParamSlot* p, Backend* be, MemLedger* mem, const Pieces* pc, size_t elems, int on_disk) {
    size_t x = piece_elem_bytes(pc);
    p->unit = -1;
    if (!elems) return;
    p->buf = mem_alloc(be, mem, MEM_PARAMS, elems * x);
    if (on_disk) p->read = nvme_host_alloc(be, mem, MEM_HOST_PARAMS, nvme_params_buffer_bytes(elems / (size_t)pc->size, x), &p->read_raw);
}

void param_slots_init(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, const void* pieces, int on_host, int on_disk,
                      NvmeStore* disk) {
    *g = (ParamSlots){.pieces = pieces, .on_host = on_host, .disk = disk};
    for (int s = 0; s < 2; s++) alloc_slot(&g->slot[s], be, mem, pc, largest_block_unit(pc->lay), on_disk);
    for (int e = 0; e < EDGE_SLOTS; e++) alloc_slot(&g->edge[e], be, mem, pc, edge_elems(pc->lay, e), on_disk);
    if (!on_host || !be) return;
    for (int s = 0; s < 2; s++) g->slot[s].uploaded = be_event_create(be);
    for (int e = 0; e < EDGE_SLOTS; e++)
        if (g->edge[e].buf) g->edge[e].uploaded = be_event_create(be);
}

static void free_slot_host(ParamSlot* p, Backend* be) {
    if (p->uploaded) be_event_destroy(be, p->uploaded);
    if (p->read_raw) be_host_free(be, p->read_raw);
}

// -qw: each slot's room for the packets of the largest unit it takes (qwz.h), charged as gathered parameters.
void param_slots_quantize(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc) {
    g->quantized = 1;
    ParamSlot* slots[2 + EDGE_SLOTS] = {&g->slot[0], &g->slot[1]};
    size_t elems[2 + EDGE_SLOTS] = {largest_block_unit(pc->lay), largest_block_unit(pc->lay)};
    for (int e = 0; e < EDGE_SLOTS; e++) slots[2 + e] = &g->edge[e], elems[2 + e] = edge_elems(pc->lay, e);
    for (int i = 0; i < 2 + EDGE_SLOTS; i++)
        if (elems[i]) slots[i]->packets = mem_alloc(be, mem, MEM_PARAMS, (size_t)pc->size * qwz_packet_bytes(elems[i] / (size_t)pc->size));
}

void param_slots_free_quantized(ParamSlots* g, Backend* be) {
    ParamSlot* slots[2 + EDGE_SLOTS] = {&g->slot[0], &g->slot[1]};
    for (int e = 0; e < EDGE_SLOTS; e++) slots[2 + e] = &g->edge[e];
    for (int i = 0; i < 2 + EDGE_SLOTS; i++)
        if (slots[i]->packets && be) be_free(be, slots[i]->packets), slots[i]->packets = NULL;
}

void param_slots_free_host(ParamSlots* g, Backend* be) {
    for (int s = 0; s < 2; s++) free_slot_host(&g->slot[s], be);
    for (int e = 0; e < EDGE_SLOTS; e++) free_slot_host(&g->edge[e], be);
}

// Starts the all-gathers of unit u's parameters from every rank's piece into buf (the unit's padded size),
// one per section (pieces.h). With on_host this rank's piece goes up on the copy stream (event uploaded),
// after the main stream's work so far, which includes the last reads of buf. On one rank the main stream
// waits for it only in finish_gather, so a prefetched unit's upload overlaps the block computing now; with
// more ranks the collective must follow it, and the comm layer orders collectives after the main stream, so
// the main stream waits at once. With a disk the piece is first read into `read`, once the upload that last
// read it is done.
static void gather_start(ParamSlots* g, Backend* be, const Pieces* pc, int u, void* buf, BeEvent* uploaded, void* read,
                         void* packets, CommHandle* flight) {
    size_t x = piece_elem_bytes(pc);
    for (int s = 0; s < UNIT_SECTIONS; s++) {
        size_t p = section_piece(pc, u, s), at = section_begin(&pc->lay->units[u], s) - pc->lay->units[u].offset;
        flight[s] = comm_no_handle();
        if (!p) continue;
        void* mine = elem_at(buf, at + (size_t)pc->rank * p, x);
        if (!g->on_host) be_copy(be, mine, elem_at((void*)g->pieces, piece_at(pc, u, s), x), p * x);
        else {
            double t0 = now_seconds();
            if (g->disk) be_event_synchronize(be, uploaded);
            const void* src = g->disk ? nvme_read_params(g->disk, piece_at(pc, u, s), p, read) : elem_at((void*)g->pieces, piece_at(pc, u, s), x);
            be_upload_async(be, mine, src, p * x, uploaded);
            if (pc->size > 1) be_stream_wait(be, uploaded);
            g->upload_seconds += now_seconds() - t0;
        }
        if (pc->size > 1 && g->quantized) flight[s] = qwz_gather_start(be, pc, u, s, buf, packets);
        else if (pc->size > 1) flight[s] = comm_allgather_start(pc->dp, elem_at(buf, at, x), p, pc->dt);
    }
}

static void wait_gathers(ParamSlots* g, const Pieces* pc, ParamSlot* p) {
    for (int s = 0; s < UNIT_SECTIONS; s++) {
        if (p->in_hpz) comm_wait(g->hpz.group, &p->flight[s]);
        else pieces_wait(pc, &p->flight[s]);
    }
    p->in_hpz = 0;
}

// The main stream's next work sees the gathered unit (and a gather over the data-parallel group has filled
// the hpz shard).
static void finish_gather(ParamSlots* g, Backend* be, const Pieces* pc, ParamSlot* p) {
    int unpack = g->quantized && !p->in_hpz && pc->size > 1;
    wait_gathers(g, pc, p);
    for (int s = 0; unpack && s < UNIT_SECTIONS; s++)
        if (section_piece(pc, p->unit, s)) qwz_unpack(be, pc, p->unit, s, p->buf, p->packets);
    if (g->on_host && pc->size == 1) be_stream_wait(be, p->uploaded);
    if (p->fills_hpz) hpz_keep(&g->hpz, be, pc, p->unit, p->buf);
    p->fills_hpz = 0;
}

// Unit u's gather: inside the hpz group once its shard holds u (hpz.h), else from every rank's piece.
static void start_param_gather(ParamSlots* g, Backend* be, const Pieces* pc, ParamSlot* p, ParamSlotState state, int u) {
    p->state = state;
    p->unit = u;
    p->fills_hpz = hpz_on(&g->hpz) && !hpz_ready(&g->hpz, u);
    p->in_hpz = hpz_ready(&g->hpz, u);
    if (p->in_hpz) hpz_gather_start(&g->hpz, be, pc, u, p->buf, p->flight);
    else gather_start(g, be, pc, u, p->buf, p->uploaded, p->read, p->packets, p->flight);
}

// A prefetch nobody asked for: finished and forgotten (its upload may still run: the slot's next one queues
// after it, so its gather is not kept, nor its part in the hpz shard).
static void drop_prefetch(ParamSlots* g, const Pieces* pc, ParamSlot* p) {
    if (p->state != PARAMS_PREFETCHED) return;
    wait_gathers(g, pc, p);
    p->state = PARAMS_FREE;
    p->unit = -1;
    p->fills_hpz = 0;
}

// ---------------------------------------------------------------------------------------------------
// The edge units' slots.

static ParamSlot* edge_slot(ParamSlots* g, const ParamLayout* lay, int u) { return &g->edge[edge_index(lay, u)]; }

static void* edge_params(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    ParamSlot* p = edge_slot(g, pc->lay, u);
    int gathering = p->unit == u && p->state == PARAMS_PREFETCHED;
    if (p->unit != u) {
        if (p->state == PARAMS_HELD)
            fail("internal: the walk asks for unit %d while unit %d holds their shared parameter buffer", u, p->unit);
        drop_prefetch(g, pc, p);
        start_param_gather(g, be, pc, p, PARAMS_HELD, u);
        gathering = 1;
    }
    p->state = PARAMS_HELD;
    if (gathering) finish_gather(g, be, pc, p);
    return p->buf;
}

// Into its edge slot when that slot is free and holds no gather of u already.
static void edge_prefetch(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    ParamSlot* p = edge_slot(g, pc->lay, u);
    if (p->unit != u && p->state == PARAMS_FREE) start_param_gather(g, be, pc, p, PARAMS_PREFETCHED, u);
}

// ---------------------------------------------------------------------------------------------------
// The rotating block slots.

// The first slot free (u = -1), or holding or gathering block unit u; NULL if none.
static ParamSlot* param_slot(ParamSlots* g, int u) {
    for (int s = 0; s < 2; s++) {
        ParamSlot* p = &g->slot[s];
        if (u < 0 ? p->state == PARAMS_FREE : p->state != PARAMS_FREE && p->unit == u) return p;
    }
    return NULL;
}

// The unit of block l when this layout holds it, else -1.
static int held_block_unit(const ParamLayout* lay, int l) {
    return l >= 0 && l < lay->shape.L ? lay->block_unit[l] : -1;
}

// The direction the walk goes at block l, which it asks for now: 1 forward, -1 backward, 0 not certain.
static int walk_direction(ParamSlots* g, const ParamLayout* lay, int l) {
    int dir = 0;
    if (g->walk_started && g->walk_last_block == l - 1) dir = 1;
    else if (g->walk_started && g->walk_last_block == l + 1) dir = -1;
    else if (held_block_unit(lay, l - 1) < 0) dir = 1;
    else if (held_block_unit(lay, l + 1) < 0) dir = -1;
    g->walk_last_block = l;
    g->walk_started = 1;
    return dir;
}

// Starts gathering what the walk will ask for after block l going in direction dir: the next block this
// layout holds; after the model's last block going forward, the head's units (the final unit, and a tied
// head's embedding unit).
static void prefetch_after_block(ParamSlots* g, Backend* be, const Pieces* pc, int l, int dir) {
    const ParamLayout* lay = pc->lay;
    if (!dir) return;
    int next = held_block_unit(lay, l + dir);
    if (next >= 0) {
        param_slots_prefetch(g, be, pc, next);
        return;
    }
    if (dir < 0 || l + 1 != lay->shape.L || lay->final_unit < 0) return;
    param_slots_prefetch(g, be, pc, lay->final_unit);
    if (edge_units_overlap(lay)) param_slots_prefetch(g, be, pc, lay->emb_unit);
}

static void drop_block_prefetches(ParamSlots* g, const Pieces* pc) {
    for (int s = 0; s < 2; s++) drop_prefetch(g, pc, &g->slot[s]);
}

// A free slot for block unit u, which the walk asks for now.
static ParamSlot* take_param_slot(ParamSlots* g, const Pieces* pc, int u) {
    if (!param_slot(g, -1)) drop_block_prefetches(g, pc);   // a prefetch nobody asked for
    ParamSlot* p = param_slot(g, -1);
    if (!p) fail("internal: no free parameter buffer for unit %d (units %d and %d still held)", u, g->slot[0].unit, g->slot[1].unit);
    return p;
}

static void* block_params(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    ParamSlot* p = param_slot(g, u);
    if (p && p->state == PARAMS_HELD) return p->buf;   // asked again while held: not a step
    if (!p) {
        p = take_param_slot(g, pc, u);
        start_param_gather(g, be, pc, p, PARAMS_HELD, u);
    }
    p->state = PARAMS_HELD;
    int l = pc->lay->tensors[pc->lay->units[u].first_tensor].layer;   // the block unit u holds
    prefetch_after_block(g, be, pc, l, walk_direction(g, pc->lay, l));   // started before the wait below, so MPI progresses both
    finish_gather(g, be, pc, p);
    return p->buf;
}

// ---------------------------------------------------------------------------------------------------

void* param_slots_unit(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    return is_edge_unit(pc->lay, u) ? edge_params(g, be, pc, u) : block_params(g, be, pc, u);
}

void param_slots_prefetch(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    if (u < 0) return;
    if (is_edge_unit(pc->lay, u)) {
        edge_prefetch(g, be, pc, u);
        return;
    }
    if (param_slot(g, u)) return;
    ParamSlot* p = param_slot(g, -1);
    if (p) start_param_gather(g, be, pc, p, PARAMS_PREFETCHED, u);   // else the walk gathers it when it asks
}

void param_slots_done(ParamSlots* g, const Pieces* pc, int u) {
    int edge = is_edge_unit(pc->lay, u);
    ParamSlot* p = edge ? edge_slot(g, pc->lay, u) : param_slot(g, u);
    if (!p || p->unit != u || p->state != PARAMS_HELD) return;
    p->state = PARAMS_FREE;
    if (!edge) p->unit = -1;   // an edge slot keeps u's gather (param_slots.h)
}

void param_slots_drop_prefetches(ParamSlots* g, const Pieces* pc) {
    drop_block_prefetches(g, pc);
    for (int e = 0; e < EDGE_SLOTS; e++) drop_prefetch(g, pc, &g->edge[e]);
}

void param_slots_invalidate(ParamSlots* g, const Pieces* pc) {
    param_slots_drop_prefetches(g, pc);
    hpz_forget(&g->hpz);
    for (int e = 0; e < EDGE_SLOTS; e++) {
        if (g->edge[e].state == PARAMS_HELD) fail("internal: the parameters change while the walk holds unit %d", g->edge[e].unit);
        g->edge[e].unit = -1;
    }
}
