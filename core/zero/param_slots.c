// param_slots.c: the gathered parameters and their prefetch. See param_slots.h.
#include "core/zero/param_slots.h"

#include "base/common.h"
#include "core/util/phase_timer.h"

static int resident_unit(const ParamLayout* lay, int r) { return r == RESIDENT_EMB ? lay->emb_unit : lay->final_unit; }

// disk: each slot's and resident's buffer for this rank's piece read from the disk (host memory).
static void alloc_read_buffers(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc) {
    size_t x = piece_elem_bytes(pc);
    for (int s = 0; s < 2; s++)
        g->slot[s].read = nvme_host_alloc(be, mem, MEM_HOST_PARAMS, nvme_params_buffer_bytes(largest_block_unit(pc->lay) / (size_t)pc->size, x),
                                          &g->slot[s].read_raw);
    for (int r = 0; r < RESIDENTS; r++) {
        int u = resident_unit(pc->lay, r);
        if (u >= 0) g->resident[r].read = nvme_host_alloc(be, mem, MEM_HOST_PARAMS, nvme_params_buffer_bytes(piece_len(pc, u), x),
                                                          &g->resident[r].read_raw);
    }
}

void param_slots_init(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, const void* pieces, int on_host, int on_disk,
                      NvmeStore* disk) {
    *g = (ParamSlots){.pieces = pieces, .on_host = on_host, .disk = disk};
    size_t block = largest_block_unit(pc->lay), x = piece_elem_bytes(pc);
    const ParamLayout* lay = pc->lay;
    for (int s = 0; s < 2; s++) {
        g->slot[s].buf = mem_alloc(be, mem, MEM_PARAMS, block * x);
        g->slot[s].unit = -1;
    }
    if (lay->emb_unit >= 0) g->resident[RESIDENT_EMB].buf = mem_alloc(be, mem, MEM_PARAMS, lay->units[lay->emb_unit].padded * x);
    if (lay->final_unit >= 0)
        g->resident[RESIDENT_FINAL].buf = mem_alloc(be, mem, MEM_PARAMS, lay->units[lay->final_unit].padded * x);
    if (on_disk) alloc_read_buffers(g, be, mem, pc);
    if (!on_host || !be) return;
    for (int s = 0; s < 2; s++) g->slot[s].uploaded = be_event_create(be);
    for (int r = 0; r < RESIDENTS; r++) g->resident[r].uploaded = be_event_create(be);
}

void param_slots_free_host(ParamSlots* g, Backend* be) {
    for (int s = 0; s < 2; s++) {
        if (g->slot[s].uploaded) be_event_destroy(be, g->slot[s].uploaded);
        if (g->slot[s].read_raw) be_host_free(be, g->slot[s].read_raw);
    }
    for (int r = 0; r < RESIDENTS; r++) {
        if (g->resident[r].uploaded) be_event_destroy(be, g->resident[r].uploaded);
        if (g->resident[r].read_raw) be_host_free(be, g->resident[r].read_raw);
    }
}

// Starts the all-gather of unit u's parameters from every rank's piece into buf (the unit's padded size).
// With on_host this rank's piece goes up on the copy stream (event uploaded), after the main stream's work
// so far, which includes the last reads of buf. On one rank the main stream waits for it only in
// finish_gather, so a prefetched block's upload overlaps the block computing now; with more ranks the
// collective must follow it, and the comm layer orders collectives after the main stream, so the main stream
// waits at once. With a disk the piece is first read into `read`, once the upload that last read it is done.
static CommHandle gather_start(ParamSlots* g, Backend* be, const Pieces* pc, int u, void* buf, BeEvent* uploaded, void* read) {
    size_t p = piece_len(pc, u), x = piece_elem_bytes(pc);
    void* mine = elem_at(buf, (size_t)pc->rank * p, x);
    if (!g->on_host) be_copy(be, mine, elem_at((void*)g->pieces, pc->offset[u], x), p * x);
    else {
        double t0 = now_seconds();
        if (g->disk) be_event_synchronize(be, uploaded);
        const void* src = g->disk ? nvme_read_params(g->disk, pc->offset[u], p, read) : elem_at((void*)g->pieces, pc->offset[u], x);
        be_upload_async(be, mine, src, p * x, uploaded);
        if (pc->size > 1) be_stream_wait(be, uploaded);
        g->upload_seconds += now_seconds() - t0;
    }
    return pc->size > 1 ? comm_allgather_start(pc->dp, buf, p, pc->dt) : comm_no_handle();
}

// The main stream's next work sees the gathered unit.
static void finish_gather(ParamSlots* g, Backend* be, const Pieces* pc, CommHandle* h, BeEvent* uploaded) {
    pieces_wait(pc, h);
    if (g->on_host && pc->size == 1) be_stream_wait(be, uploaded);
}

void* param_slots_resident(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    Resident* r = &g->resident[u == pc->lay->emb_unit ? RESIDENT_EMB : RESIDENT_FINAL];
    if (!r->gathered) {
        CommHandle h = gather_start(g, be, pc, u, r->buf, r->uploaded, r->read);
        finish_gather(g, be, pc, &h, r->uploaded);
    }
    r->gathered = 1;
    return r->buf;
}

// The first slot free (u = -1), or holding or gathering unit u; NULL if none.
static ParamSlot* param_slot(ParamSlots* g, int u) {
    for (int s = 0; s < 2; s++) {
        ParamSlot* p = &g->slot[s];
        if (u < 0 ? p->state == PARAMS_FREE : p->state != PARAMS_FREE && p->unit == u) return p;
    }
    return NULL;
}

static void start_param_gather(ParamSlots* g, Backend* be, const Pieces* pc, ParamSlot* p, ParamSlotState state, int u) {
    p->state = state;
    p->unit = u;
    p->flight = gather_start(g, be, pc, u, p->buf, p->uploaded, p->read);
}

// The unit of block l when this layout holds it, else -1.
static int held_block_unit(const ParamLayout* lay, int l) {
    return l >= 0 && l < lay->shape.L ? lay->block_unit[l] : -1;
}

// The block unit the walk will ask for after block unit u, or -1 when that is not certain.
static int next_block_unit(ParamSlots* g, const ParamLayout* lay, int u) {
    int l = lay->tensors[lay->units[u].first_tensor].layer, dir = 0;   // the block unit u holds
    if (g->walk_started && g->walk_last_block == l - 1) dir = 1;
    else if (g->walk_started && g->walk_last_block == l + 1) dir = -1;
    else if (held_block_unit(lay, l - 1) < 0) dir = 1;
    else if (held_block_unit(lay, l + 1) < 0) dir = -1;
    g->walk_last_block = l;
    g->walk_started = 1;
    return dir ? held_block_unit(lay, l + dir) : -1;
}

void param_slots_drop_prefetches(ParamSlots* g, const Pieces* pc) {
    for (int s = 0; s < 2; s++) {
        ParamSlot* p = &g->slot[s];
        if (p->state != PARAMS_PREFETCHED) continue;
        pieces_wait(pc, &p->flight);   // its upload may still run: the slot's next one queues after it
        p->state = PARAMS_FREE;
        p->unit = -1;
    }
}

void param_slots_prefetch(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    if (u < 0 || param_slot(g, u)) return;
    ParamSlot* p = param_slot(g, -1);
    if (p) start_param_gather(g, be, pc, p, PARAMS_PREFETCHED, u);   // else the walk gathers it when it asks
}

// A free slot for block unit u, which the walk asks for now.
static ParamSlot* take_param_slot(ParamSlots* g, const Pieces* pc, int u) {
    if (!param_slot(g, -1)) param_slots_drop_prefetches(g, pc);   // a prefetch nobody asked for
    ParamSlot* p = param_slot(g, -1);
    if (!p) fail("internal: no free parameter buffer for unit %d (units %d and %d still held)", u, g->slot[0].unit, g->slot[1].unit);
    return p;
}

void* param_slots_block(ParamSlots* g, Backend* be, const Pieces* pc, int u) {
    ParamSlot* p = param_slot(g, u);
    if (p && p->state == PARAMS_HELD) return p->buf;   // asked again while held: not a step
    if (!p) {
        p = take_param_slot(g, pc, u);
        start_param_gather(g, be, pc, p, PARAMS_HELD, u);
    }
    p->state = PARAMS_HELD;
    param_slots_prefetch(g, be, pc, next_block_unit(g, pc->lay, u));   // started before the wait below, so MPI progresses both
    finish_gather(g, be, pc, &p->flight, p->uploaded);
    return p->buf;
}

void param_slots_done(ParamSlots* g, int u) {
    ParamSlot* p = param_slot(g, u);
    if (!p || p->state != PARAMS_HELD) return;
    p->state = PARAMS_FREE;
    p->unit = -1;
}

void param_slots_invalidate(ParamSlots* g, const Pieces* pc) {
    for (int r = 0; r < RESIDENTS; r++) g->resident[r].gathered = 0;
    param_slots_drop_prefetches(g, pc);
}
