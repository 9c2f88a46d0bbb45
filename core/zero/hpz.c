// hpz.c: see hpz.h.
#include "core/zero/hpz.h"

#include <string.h>

#include "base/common.h"

static size_t secondary_len(const Hpz* h, const Pieces* pc, int u, int s) {
    return section_len(&pc->lay->units[u], s) / (size_t)h->size;
}

// Where this rank's part of section s of unit u sits in the gathered unit (elements from its start).
static size_t part_in_unit(const Hpz* h, const Pieces* pc, int u, int s) {
    const Unit* un = &pc->lay->units[u];
    return section_begin(un, s) - un->offset + (size_t)h->rank * secondary_len(h, pc, u, s);
}

// And in the shard: the frozen section's part, then the trained one's.
static size_t part_in_shard(const Hpz* h, const Pieces* pc, int u, int s) {
    return h->offset[u] + (s ? secondary_len(h, pc, u, 0) : 0);
}

void hpz_init(Hpz* h, Backend* be, MemLedger* mem, const Pieces* pc, int size, Comm* group) {
    *h = (Hpz){.group = group};
    if (size <= 1) return;
    if (pc->size % size) fail("internal: hpz groups of %d ranks in a data-parallel group of %d", size, pc->size);
    if (group && comm_size(group) != size) fail("internal: an hpz group of %d ranks for -hpz %d", comm_size(group), size);
    h->size = size;
    h->rank = group ? comm_rank(group) : 0;
    size_t total = 0;
    for (int u = 0; u < pc->lay->num_units; u++) {
        h->offset[u] = total;
        total += pc->lay->units[u].padded / (size_t)size;
    }
    h->shard = mem_alloc(be, mem, MEM_HPZ_PARAMS, total * piece_elem_bytes(pc));
}

void hpz_free(Hpz* h, Backend* be) {
    if (h->shard && be) be_free(be, h->shard);
    h->shard = NULL;
}

void hpz_gather_start(Hpz* h, Backend* be, const Pieces* pc, int u, void* buf, CommHandle* flight) {
    size_t x = piece_elem_bytes(pc);
    for (int s = 0; s < UNIT_SECTIONS; s++) {
        size_t n = secondary_len(h, pc, u, s);
        flight[s] = comm_no_handle();
        if (!n) continue;
        be_copy(be, elem_at(buf, part_in_unit(h, pc, u, s), x), elem_at(h->shard, part_in_shard(h, pc, u, s), x), n * x);
        size_t at = section_begin(&pc->lay->units[u], s) - pc->lay->units[u].offset;
        flight[s] = comm_allgather_start(h->group, elem_at(buf, at, x), n, pc->dt);
    }
}

void hpz_keep(Hpz* h, Backend* be, const Pieces* pc, int u, const void* buf) {
    size_t x = piece_elem_bytes(pc);
    for (int s = 0; s < UNIT_SECTIONS; s++) {
        size_t n = secondary_len(h, pc, u, s);
        if (n) be_copy(be, elem_at(h->shard, part_in_shard(h, pc, u, s), x), elem_at((void*)buf, part_in_unit(h, pc, u, s), x), n * x);
    }
    h->filled[u] = 1;
}

void hpz_forget(Hpz* h) { memset(h->filled, 0, sizeof h->filled); }
