// ptx.h: the PTX instructions the CUDA kernels issue through inline asm (kernels/attention_common.cuh: cp.async,
// ldmatrix, mma.sync), performed by the emulator. Two layers:
//  - warp cores (ptx_*): pure functions from all 32 lanes' operands to all 32 lanes' results, written from
//    the PTX ISA's fragment layouts (section "Matrix Fragments for mma.m16n8k16 with floating point type"
//    and the ldmatrix instruction's description);
//  - per-lane entry points (emu_ptx_*, emu_cvta_*): what a kernel thread calls in place of the asm under
//    GPT_EMU. A warp-wide instruction meets the other lanes through emu::warp_gather, then picks its own
//    results from the warp core.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <vector>

// ---------------------------------------------------------------------------------------------------
// Warp cores.

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: d = a (16x16) * b (16x8) + c, per lane
// l with g = l / 4, t = l % 4 (each 32-bit register holds two 16-bit elements, the lower column or row in
// its low half):
//   a[l][0] = A[g][2t, 2t+1]     a[l][1] = A[g+8][2t, 2t+1]   a[l][2] = A[g][2t+8, 2t+9]   a[l][3] = A[g+8][2t+8, 2t+9]
//   b[l][0] = B[2t, 2t+1][g]     b[l][1] = B[2t+8, 2t+9][g]
//   c[l], d[l] = {X[g][2t], X[g][2t+1], X[g+8][2t], X[g+8][2t+1]}
// Products of 16-bit floats are exact in fp32 (unless they leave fp32's range); each d element is c plus
// the 16 products added one at a time in k order, each addition rounded to nearest even in fp32. The PTX
// ISA leaves the order and intermediate precision of the sum open, so a GPU's last bits may differ.
void ptx_mma_m16n8k16_warp(const uint32_t a[32][4], const uint32_t b[32][2], const float c[32][4], float d[32][4],
                           bool bf16);
// The same for lane `lane` alone: its d from every lane's a and b and its own c.
void ptx_mma_m16n8k16_lane(const uint32_t a[32][4], const uint32_t b[32][2], const float c[4], float d[4], int lane,
                           bool bf16);

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lanes 8j..8j+7 give the addresses of rows 0..7 of
// matrix j (16 bytes each: 8 elements); rows[l] holds the row at lane l's address. Lane l receives in
// out[l][j], with g = l / 4, t = l % 4: M_j[g][2t, 2t+1] (plain), or M_j[2t, 2t+1][g] (.trans: the matrix
// read column-major).
void ptx_ldmatrix_x4_rows(const uint16_t rows[32][8], uint32_t out[32][4], bool trans);
void ptx_ldmatrix_x4_lane(const uint16_t rows[32][8], uint32_t out[4], int lane, bool trans);
// The same reading each row from smem_base + addr[l].
void ptx_ldmatrix_x4_warp(const unsigned char* smem_base, const uint32_t addr[32], uint32_t out[32][4], bool trans);

// ---------------------------------------------------------------------------------------------------
// Per-lane entry points, valid only inside a kernel (they use emu.h). Shared addresses are the 32-bit
// offsets __cvta_generic_to_shared gives.

// __cvta_generic_to_shared: p's offset in the block's shared window; a p outside it is a fault.
uint32_t emu_cvta_generic_to_shared(const void* p);

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 {r[0..3]}, [smem_addr]: smem_addr 16-byte aligned
// and inside the window, else a fault; the row read is recorded as this thread's shared read.
void emu_ptx_ldmatrix_x4(uint32_t* r, uint32_t smem_addr, bool trans);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 {c}, {a[0..3]}, {b0, b1}, {c}.
void emu_ptx_mma_m16n8k16_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
void emu_ptx_mma_m16n8k16_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);

// cp.async: each thread keeps its copies pending until a wait covers their group; a copy is performed
// (src_bytes bytes read from gmem, the rest of the 16 zero-filled) only then, which PTX allows, so a read
// of the destination before the wait sees the old bytes.
struct EmuCpAsyncCopy {
    uint32_t smem_addr;
    const void* src;
    int src_bytes;
    uint64_t group;   // the number of commits the thread had made when it issued the copy
};
struct EmuCpAsyncQueue {
    std::vector<EmuCpAsyncCopy> pending;   // in issue order, so in group order
    uint64_t commits = 0;
};
// Provided by the runtime: the calling thread's queue, empty when the thread starts.
EmuCpAsyncQueue* emu_thread_cp_queue();

// cp.async.cg.shared.global [smem_addr], [gmem], 16, src_bytes: both addresses 16-byte aligned,
// 0 <= src_bytes <= 16, else a fault. src_bytes == 0 reads nothing from gmem.
void emu_ptx_cp_async_cg16(uint32_t smem_addr, const void* gmem, int src_bytes);
// cp.async.commit_group: the copies issued since the last commit form a group (possibly empty).
void emu_ptx_cp_async_commit();
// cp.async.wait_group n: performs every committed group but the n most recent.
void emu_ptx_cp_async_wait(int n);
// The runtime calls this as a kernel thread returns: copies it never waited for are a fault.
void emu_ptx_thread_exit();
