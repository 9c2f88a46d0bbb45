// qwz.c: see qwz.h.
#include "core/zero/qwz.h"

#include "base/common.h"

size_t qwz_packet_bytes(size_t n) { return quantized_bytes(n, QWZ_BITS) + quantized_blocks(n, QWZ_BLOCK) * sizeof(float); }

// Where section s's packets start in the unit's: after section 0's.
static size_t section_packets(const Pieces* pc, int u, int s) {
    return s ? (size_t)pc->size * qwz_packet_bytes(section_piece(pc, u, 0)) : 0;
}

size_t qwz_unit_bytes(const Pieces* pc, int u) {
    size_t total = 0;
    for (int s = 0; s < UNIT_SECTIONS; s++) total += (size_t)pc->size * qwz_packet_bytes(section_piece(pc, u, s));
    return total;
}

static size_t section_in_unit(const Pieces* pc, int u, int s) { return section_begin(&pc->lay->units[u], s) - pc->lay->units[u].offset; }

CommHandle qwz_gather_start(Backend* be, const Pieces* pc, int u, int s, const void* buf, void* packets) {
    size_t p = section_piece(pc, u, s), x = piece_elem_bytes(pc), pb = qwz_packet_bytes(p);
    if (p % QWZ_BLOCK || pb % 2) fail("internal: a piece of %zu elements is not whole blocks of %d for qwZ", p, QWZ_BLOCK);
    char* first = (char*)packets + section_packets(pc, u, s);
    char* mine = first + (size_t)pc->rank * pb;
    const void* piece = elem_at((void*)buf, section_in_unit(pc, u, s) + (size_t)pc->rank * p, x);
    quantize_blocks(be, pc->dt, mine, (float*)(mine + quantized_bytes(p, QWZ_BITS)), piece, p, QWZ_BLOCK, QWZ_BITS);
    return comm_allgather_start(pc->dp, first, pb / 2, DT_BF16);
}

void qwz_unpack(Backend* be, const Pieces* pc, int u, int s, void* buf, const void* packets) {
    size_t p = section_piece(pc, u, s), x = piece_elem_bytes(pc), pb = qwz_packet_bytes(p);
    const char* first = (const char*)packets + section_packets(pc, u, s);
    for (int r = 0; r < pc->size; r++) {
        const char* packet = first + (size_t)r * pb;
        dequantize_blocks(be, pc->dt, elem_at(buf, section_in_unit(pc, u, s) + (size_t)r * p, x), packet,
                          (const float*)(packet + quantized_bytes(p, QWZ_BITS)), p, QWZ_BLOCK, QWZ_BITS, 0);
    }
}
