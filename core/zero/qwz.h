// qwz.h: ZeRO++'s quantized weight gathers (qwZ, Wang et al. 2023) over shard_params' gathers (param_slots.h).
//
// With -qw 1 a gather over the data-parallel group sends, instead of each rank's piece of a section in the run's
// 16-bit (or fp32) type, its packet: the piece's int8 levels, then one fp32 scale per QWZ_BLOCK elements
// (kernels.h: quantize_blocks, symmetric, scale = absmax / 127). Every rank then dequantizes every packet, its
// own too, into the section, so all ranks compute with the same values, each within absmax / 254 of its
// block's. A piece is a multiple of 64 elements (pieces.h), so blocks start at 64-element steps from the
// section's start whatever the number of ranks: the values do not depend on the data-parallel size. The
// packets travel as 2-byte elements (an all-gather copies bits); a packet is 17/16 bytes per element, against 2
// in bf16 or fp16 and 4 in fp32. The gathers inside an hpz group (hpz.h) copy what a quantized gather made, so
// the backward sees the forward's values; the master weights and the update never see quantization.
#pragma once
#include "base/common.h"
#include "core/zero/pieces.h"

#define QWZ_BLOCK 64
#define QWZ_BITS 8

// -qw needs gathers: one line unless the data-parallel size dp is 2 or more.
static inline void qwz_check_ranks(int qw, int dp) {
    if (qw && dp < 2) fail("-qw 1 quantizes ZeRO-3's parameter gathers: with one data-parallel rank there are none");
}

// One rank's packet for a piece of n elements, and the packets of every rank for all of unit u's sections.
size_t qwz_packet_bytes(size_t n);
size_t qwz_unit_bytes(const Pieces* pc, int u);
// Quantizes this rank's piece of section s of unit u, already at its place in buf (the unit's padded size), into
// its packet in `packets` (qwz_unit_bytes) and starts the all-gather of every rank's packet. Returns its handle.
CommHandle qwz_gather_start(Backend* be, const Pieces* pc, int u, int s, const void* buf, void* packets);
// After that gather's wait: every rank's packet dequantized into section s of buf.
void qwz_unpack(Backend* be, const Pieces* pc, int u, int s, void* buf, const void* packets);
