// cuda_runtime.h (emulated): what the kernels and backend_cuda.cu use of CUDA's runtime, for the host C++
// compiler. Kernels run on the CPU through tests/emu/emu.h; memory, streams and events are the emulator's
// (tests/emu/runtime.cpp). Launches (`k<<<g, b, smem, s>>>(args)`) and __shared__ declarations reach here
// rewritten by tests/emu/cuda_to_host.py, which is why a __shared__ left in the text does not compile.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "library_types.h"
#include "tests/emu/emu.h"
#include "tests/emu/ptx.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ __shared__was_not_rewritten_by_cuda_to_host_py

// ---------------------------------------------------------------------------------------------------
// Vector types and the built-in coordinates.
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef emu::Dim3 uint3;
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(8))) int2 { int x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())
static constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------------
// Barriers, warp collectives, load/store hints.
static inline void __syncthreads() { emu::sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::sync_warp(mask); }

namespace emu {
// Lane `src` of a width-sized segment (as __shfl_sync's PTX: shfl.sync.idx with the segment mask).
template <typename T> T shfl_from(unsigned mask, T v, int width, const char* op, int (*pick)(int lane, int arg, int width), int arg) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fault("%s with width %d: the width must be a power of two from 1 to 32", op, width);
    T all[32];
    warp_gather(mask, op, &v, sizeof(T), all);
    const int src = pick(lane(), arg, width);
    if (!(mask >> src & 1u)) fault("%s reads lane %d, which is not in mask 0x%08x", op, src, mask);
    return all[src];
}
inline int pick_idx(int lane, int src, int width) { return (lane & ~(width - 1)) + (src & (width - 1)); }
inline int pick_xor(int lane, int m, int width) {
    const int d = lane ^ m;
    return (d & ~(width - 1)) == (lane & ~(width - 1)) ? d : lane;   // out of the segment: the lane's own value
}
inline int pick_up(int lane, int d, int width) { return (lane & (width - 1)) >= d ? lane - d : lane; }
inline int pick_down(int lane, int d, int width) { return (lane & (width - 1)) + d < width ? lane + d : lane; }
unsigned vote(unsigned mask, bool pred, const char* op);   // the ballot of the lanes of mask
}  // namespace emu

template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu::shfl_from(mask, v, width, "__shfl_sync", emu::pick_idx, src);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    return emu::shfl_from(mask, v, width, "__shfl_xor_sync", emu::pick_xor, m);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu::shfl_from(mask, v, width, "__shfl_up_sync", emu::pick_up, (int)d);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu::shfl_from(mask, v, width, "__shfl_down_sync", emu::pick_down, (int)d);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) { return emu::vote(mask, pred != 0, "__ballot_sync"); }
static inline int __all_sync(unsigned mask, int pred) { return emu::vote(mask, pred != 0, "__all_sync") == mask; }
static inline int __any_sync(unsigned mask, int pred) { return emu::vote(mask, pred != 0, "__any_sync") != 0; }

// Atomics: one GPU thread runs at a time, so a read-modify-write is atomic as it stands. They are done by
// the runtime (not instrumented): checked for bounds, not raced, as a GPU orders them.
namespace emu {
int atomic_add(int* p, int v);
unsigned atomic_add(unsigned* p, unsigned v);
unsigned long long atomic_add(unsigned long long* p, unsigned long long v);
float atomic_add(float* p, float v);
double atomic_add(double* p, double v);
int atomic_max(int* p, int v);
unsigned atomic_max(unsigned* p, unsigned v);
int atomic_min(int* p, int v);
int atomic_exch(int* p, int v);
int atomic_cas(int* p, int compare, int v);
unsigned long long atomic_cas(unsigned long long* p, unsigned long long compare, unsigned long long v);
}  // namespace emu
template <typename T> static inline T atomicAdd(T* p, T v) { return emu::atomic_add(p, v); }
template <typename T> static inline T atomicMax(T* p, T v) { return emu::atomic_max(p, v); }
template <typename T> static inline T atomicMin(T* p, T v) { return emu::atomic_min(p, v); }
template <typename T> static inline T atomicExch(T* p, T v) { return emu::atomic_exch(p, v); }
template <typename T> static inline T atomicCAS(T* p, T c, T v) { return emu::atomic_cas(p, c, v); }

// Cache hints change nothing a kernel computes: a plain access (checked like any other).
template <typename T> static inline T __ldcs(const T* p) { return *p; }
template <typename T> static inline T __ldg(const T* p) { return *p; }
template <typename T> static inline T __ldcg(const T* p) { return *p; }
template <typename T> static inline void __stcs(T* p, T v) { *p = v; }
template <typename T> static inline void __stcg(T* p, T v) { *p = v; }

uint32_t emu_cvta_generic_to_shared(const void* p);
static inline size_t __cvta_generic_to_shared(const void* p) { return emu_cvta_generic_to_shared(p); }

// Fast-math intrinsics: the emulator computes them as the C library does (glibc itself declares __expf and
// __logf as expf and logf), so it proves the algorithm, not the hardware's approximation.
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// min and max as CUDA's math headers overload them: a signed/unsigned mix compares as unsigned.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
static inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
static inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float max(float a, float b) { return fmaxf(a, b); }

// ---------------------------------------------------------------------------------------------------
// The runtime API.
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInsufficientDriver = 35,
    cudaErrorLaunchOutOfResources = 7,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef struct EmuStream* cudaStream_t;
typedef struct EmuEvent* cudaEvent_t;
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventBlockingSync 0x01

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    int multiProcessorCount;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
    int maxThreadsPerBlock, warpSize;
    int maxThreadsDim[3], maxGridSize[3];
    int l2CacheSize;
};
struct cudaFuncAttributes {
    size_t sharedSizeBytes;
    int maxThreadsPerBlock;
    int maxDynamicSharedSizeBytes;
};

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceGetStreamPriorityRange(int* lowest, int* highest);
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                              cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaDeviceSynchronize();
cudaError_t emu_func_get_attributes(cudaFuncAttributes* a, const void* f);
cudaError_t emu_func_set_max_dynamic_smem(const void* f, int bytes);
template <typename F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F* f) {
    return emu_func_get_attributes(a, (const void*)f);
}
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F* f, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return emu_func_set_max_dynamic_smem((const void*)f, value);
}

// ---------------------------------------------------------------------------------------------------
// Launches: `k<<<grid, block, smem, stream>>>(args)` is rewritten to
// `::emu::Launch("k", grid, block, smem, stream).run(k, args)`. The arguments are converted to the kernel's
// parameter types once, as CUDA copies them to the parameter space, and every thread calls k with them.
namespace emu {
struct KernelCall {
    void (*body)(void* ctx);   // runs the kernel for the current thread
    void* ctx;
};
// Checks the configuration as the device would (an error for cudaGetLastError, not a fault), then runs the
// grid: every block, each block's threads as fibers. Synchronous: streams are in order already.
void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, KernelCall call);

struct Launch {
    const char* name;
    dim3 grid, block;
    size_t smem;
    Launch(const char* n, dim3 g, dim3 b, size_t s = 0, cudaStream_t = 0) : name(n), grid(g), block(b), smem(s) {}
    template <typename... P, typename... A> void run(void (*k)(P...), A&&... args) {
        static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
        struct Ctx {
            void (*k)(P...);
            std::tuple<std::decay_t<P>...> params;
        } ctx{k, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
        KernelCall call{[](void* c) {
                            Ctx* x = (Ctx*)c;
                            std::apply(x->k, x->params);
                        },
                        &ctx};
        launch(name, (const void*)k, grid, block, smem, call);
    }
};
}  // namespace emu
