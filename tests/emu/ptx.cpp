// ptx.cpp: the warp cores and per-lane entry points of ptx.h.
#include "ptx.h"

#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "emu.h"

namespace {

const unsigned kFullWarp = 0xffffffffu;

uint16_t half_of(uint32_t reg, int upper) { return (uint16_t)(upper ? reg >> 16 : reg & 0xffffu); }
uint32_t pack_halves(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

float element_value(uint16_t bits, bool bf16) {
    return bf16 ? emu_fp::float_from_bf16_bits(bits) : emu_fp::float_from_half_bits(bits);
}

// A[row][k] from the fragments (layout in ptx.h).
float a_element(const uint32_t a[32][4], int row, int k, bool bf16) {
    const int lane = (row & 7) * 4 + (k & 7) / 2;
    const int reg = (row >> 3) + 2 * (k >> 3);
    return element_value(half_of(a[lane][reg], k & 1), bf16);
}
// B[k][col] from the fragments.
float b_element(const uint32_t b[32][2], int k, int col, bool bf16) {
    const int lane = col * 4 + (k & 7) / 2;
    return element_value(half_of(b[lane][k >> 3], k & 1), bf16);
}

// This lane's shared window address for a 16-byte row, checked as the hardware requires.
unsigned char* shared_row(uint32_t smem_addr, const char* what) {
    if (smem_addr % 16 != 0) emu::fault("%s: shared address 0x%x is not 16-byte aligned", what, smem_addr);
    if ((size_t)smem_addr + 16 > emu::shared_size())
        emu::fault("%s: shared address 0x%x + 16 is past the block's %zu bytes of shared memory", what, smem_addr,
                   emu::shared_size());
    return (unsigned char*)emu::shared_base() + smem_addr;
}

struct MmaOperands {
    uint32_t a[4];
    uint32_t b[2];
};

void mma_lane_entry(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, bool bf16) {
    const MmaOperands mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    MmaOperands all[32];
    emu::warp_gather(kFullWarp, bf16 ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16", &mine, sizeof mine, all);
    uint32_t af[32][4], bf[32][2];
    for (int l = 0; l < 32; l++) {
        memcpy(af[l], all[l].a, sizeof af[l]);
        memcpy(bf[l], all[l].b, sizeof bf[l]);
    }
    const float cin[4] = {c[0], c[1], c[2], c[3]};
    ptx_mma_m16n8k16_lane(af, bf, cin, c, emu::lane(), bf16);
}

void perform_copy(const EmuCpAsyncCopy& cp) {
    unsigned char* dst = (unsigned char*)emu::shared_base() + cp.smem_addr;
    emu::shared_access(dst, 16, true);
    if (cp.src_bytes > 0) {
        emu::global_access(cp.src, (size_t)cp.src_bytes, false);
        memcpy(dst, cp.src, (size_t)cp.src_bytes);
    }
    memset(dst + cp.src_bytes, 0, (size_t)(16 - cp.src_bytes));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Warp cores.

void ptx_mma_m16n8k16_lane(const uint32_t a[32][4], const uint32_t b[32][2], const float c[4], float d[4], int lane,
                           bool bf16) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 16; k++) {
            const float product = a_element(a, row, k, bf16) * b_element(b, k, col, bf16);
            acc = acc + product;
        }
        d[e] = acc;
    }
}

void ptx_mma_m16n8k16_warp(const uint32_t a[32][4], const uint32_t b[32][2], const float c[32][4], float d[32][4],
                           bool bf16) {
    for (int l = 0; l < 32; l++) ptx_mma_m16n8k16_lane(a, b, c[l], d[l], l, bf16);
}

void ptx_ldmatrix_x4_lane(const uint16_t rows[32][8], uint32_t out[4], int lane, bool trans) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; j++) {
        const uint16_t(*m)[8] = rows + 8 * j;   // matrix j: m[row][col]
        out[j] = trans ? pack_halves(m[2 * t][g], m[2 * t + 1][g]) : pack_halves(m[g][2 * t], m[g][2 * t + 1]);
    }
}

void ptx_ldmatrix_x4_rows(const uint16_t rows[32][8], uint32_t out[32][4], bool trans) {
    for (int l = 0; l < 32; l++) ptx_ldmatrix_x4_lane(rows, out[l], l, trans);
}

void ptx_ldmatrix_x4_warp(const unsigned char* smem_base, const uint32_t addr[32], uint32_t out[32][4], bool trans) {
    uint16_t rows[32][8];
    for (int l = 0; l < 32; l++) memcpy(rows[l], smem_base + addr[l], sizeof rows[l]);
    ptx_ldmatrix_x4_rows(rows, out, trans);
}

// ---------------------------------------------------------------------------------------------------
// Per-lane entry points.

uint32_t emu_cvta_generic_to_shared(const void* p) {
    const uintptr_t base = (uintptr_t)emu::shared_base(), at = (uintptr_t)p;
    if (at < base || at - base >= emu::shared_size())
        emu::fault("__cvta_generic_to_shared: %p is not in the block's shared memory (%p, %zu bytes)", p,
                   emu::shared_base(), emu::shared_size());
    return (uint32_t)(at - base);
}

void emu_ptx_ldmatrix_x4(uint32_t* r, uint32_t smem_addr, bool trans) {
    const unsigned char* row = shared_row(smem_addr, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4");
    emu::shared_access(row, 16, false);
    uint16_t mine[8], rows[32][8];
    memcpy(mine, row, sizeof mine);
    emu::warp_gather(kFullWarp, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", mine, sizeof mine, rows);
    ptx_ldmatrix_x4_lane(rows, r, emu::lane(), trans);
}

void emu_ptx_mma_m16n8k16_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    mma_lane_entry(c, a, b0, b1, true);
}
void emu_ptx_mma_m16n8k16_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    mma_lane_entry(c, a, b0, b1, false);
}

void emu_ptx_cp_async_cg16(uint32_t smem_addr, const void* gmem, int src_bytes) {
    shared_row(smem_addr, "cp.async.cg");
    if ((uintptr_t)gmem % 16 != 0) emu::fault("cp.async.cg: global address %p is not 16-byte aligned", gmem);
    if (src_bytes < 0 || src_bytes > 16) emu::fault("cp.async.cg: src-size %d is outside [0, 16]", src_bytes);
    EmuCpAsyncQueue* q = emu_thread_cp_queue();
    q->pending.push_back(EmuCpAsyncCopy{smem_addr, gmem, src_bytes, q->commits});
}

void emu_ptx_cp_async_commit() { emu_thread_cp_queue()->commits++; }

void emu_ptx_cp_async_wait(int n) {
    EmuCpAsyncQueue* q = emu_thread_cp_queue();
    if (n < 0) emu::fault("cp.async.wait_group %d: the count must not be negative", n);
    if (q->commits <= (uint64_t)n) return;
    const uint64_t first_kept = q->commits - (uint64_t)n;   // groups [first_kept, commits] stay pending
    size_t done = 0;
    while (done < q->pending.size() && q->pending[done].group < first_kept) perform_copy(q->pending[done++]);
    q->pending.erase(q->pending.begin(), q->pending.begin() + (ptrdiff_t)done);
}

void emu_ptx_thread_exit() {
    EmuCpAsyncQueue* q = emu_thread_cp_queue();
    const size_t left = q->pending.size();
    q->pending.clear();
    q->commits = 0;
    if (left) emu::fault("thread exited with %zu cp.async copies no cp.async.wait_group covered", left);
}
