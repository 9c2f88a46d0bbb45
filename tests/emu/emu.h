// emu.h: the execution layer that runs the CUDA kernels' own source on the CPU (tests/emu/README.md).
// Kernel code is compiled by the host C++ compiler against the headers in tests/emu/include/ (cuda_runtime.h,
// cuda_bf16.h, cuda_fp16.h, cublasLt.h), which stand in for CUDA's. Each block's threads run as fibers on one
// OS thread: a thread runs until it reaches a barrier or a warp collective, and only then does another run, in
// an order drawn from the launch's seed. __syncthreads and every warp collective are real rendezvous.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace emu {

struct Dim3 {
    unsigned x, y, z;
};

// The calling thread's coordinates, valid only inside a kernel.
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
int lane();          // linear thread index % 32
int warp();          // linear thread index / 32
int linear_tid();    // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)

// A report of something a GPU would fault on or compute wrongly: one line on stderr naming the kernel,
// the block and thread, then the process ends with status 1 (tests run each faulting case in a process of its own).
[[noreturn]] void fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// __syncthreads: every thread of the block that has not exited waits here.
void sync_block();
// __syncwarp(mask): the lanes of mask meet; it orders their shared-memory accesses.
void sync_warp(unsigned mask);
// The warp rendezvous every collective is built on: each lane of `mask` calls it with the same `op` and
// mask, contributing `bytes` bytes from `in`; when all of them have, each receives in `all` the 32 lanes'
// contributions (lane i at all + i * bytes; lanes outside mask are left as they were). A lane of mask that
// has exited, waits at another collective or a barrier, or a lane whose mask differs, is a fault.
void warp_gather(unsigned mask, const char* op, const void* in, size_t bytes, void* all);

// Shared memory: the block's window. Addresses inside it are "shared"; __cvta_generic_to_shared gives the
// offset from its base, as a GPU gives a 32-bit shared-state-space address.
void* shared_base();
size_t shared_size();             // static + dynamic bytes of the current block
void* shared_dynamic(size_t align);   // extern __shared__ arrays: the dynamic part, after the static part
// A static __shared__ array: one per declaration site (`site`, the address of a static object at the site)
// per block, the same address for every thread of the block.
void* shared_static(const void* site, size_t bytes, size_t align);
// Record an access made on the kernel's behalf by the emulator itself (cp.async's copies, ldmatrix's reads):
// race and bounds checks as for the kernel's own loads and stores.
void shared_access(const void* p, size_t bytes, bool write);
// Check a global (device) access made by the emulator on the kernel's behalf: inside a live allocation.
void global_access(const void* p, size_t bytes, bool write);

}  // namespace emu
