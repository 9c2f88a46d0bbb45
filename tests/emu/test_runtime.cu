// test_runtime.cu: the emulator's own semantics on small kernels written as CUDA. Built like the project's
// kernels (cuda_to_host.py, then clang++ with the loads and stores instrumented) into build/emu/test_runtime.
//
//   test_runtime CASE     runs one case; prints "ok CASE" or "FAIL CASE: why", or the emulator's fault line
//
// A case that must fault exits through the fault (status 1, one "emulator: ..." line); tests/system/t_emu.sh
// runs every case and checks the line each prints. `test_runtime list` names the cases.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}
template <typename T> static T* dev(size_t n) {
    void* p = NULL;
    check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    check(cudaMemsetAsync(p, 0, n * sizeof(T)), "cudaMemsetAsync");
    return (T*)p;
}
template <typename T> static void down(T* h, const T* d, size_t n) {
    check(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
}
static int verdict(const char* name, bool ok, const char* why) {
    if (ok) printf("ok %s\n", name);
    else printf("FAIL %s: %s\n", name, why);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------
// Barriers and races.
__global__ void block_sum_kernel(float* out, int with_barrier) {
    __shared__ float part[256];
    part[threadIdx.x] = (float)(threadIdx.x + 1);
    if (with_barrier) __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < 256; i++) s += part[i];
        out[blockIdx.x] = s;
    }
}
static int case_barrier_sum() {
    float* d = dev<float>(4);
    block_sum_kernel<<<4, 256>>>(d, 1);
    float h[4];
    down(h, d, 4);
    return verdict("barrier_sum", h[0] == 32896.0f && h[3] == 32896.0f, "the block sum is not 256*257/2");
}
static int case_missing_barrier() {   // must fault: thread 0 reads what the others wrote, with no barrier
    float* d = dev<float>(1);
    block_sum_kernel<<<1, 256>>>(d, 0);
    return verdict("missing_barrier", false, "no race reported");
}

// Lane 0 writes, lane 1 reads: ordered by __syncwarp, a race without it.
__global__ void warp_handoff_kernel(int* out, int with_syncwarp) {
    __shared__ int box[1];
    if (threadIdx.x == 0) box[0] = 42;
    if (with_syncwarp) __syncwarp();
    if (threadIdx.x == 1) out[0] = box[0];
}
static int case_syncwarp_orders() {
    int* d = dev<int>(1);
    warp_handoff_kernel<<<1, 32>>>(d, 1);
    int h;
    down(&h, d, 1);
    return verdict("syncwarp_orders", h == 42, "lane 1 did not see lane 0's write after __syncwarp");
}
static int case_warp_race() {
    int* d = dev<int>(1);
    warp_handoff_kernel<<<1, 32>>>(d, 0);
    return verdict("warp_race", false, "no race reported");
}

// Threads of different warps write one word with no barrier: a race even when they write the same value.
__global__ void write_write_kernel() {
    __shared__ int flag[1];
    if (threadIdx.x % 32 == 0) flag[0] = 1;
}
static int case_write_write_race() {
    write_write_kernel<<<1, 64>>>();
    return verdict("write_write_race", false, "no race reported");
}

// ---------------------------------------------------------------------------------------------------
// Warp collectives.
__global__ void shuffle_kernel(int* out) {
    const int l = threadIdx.x;
    out[0 * 32 + l] = __shfl_xor_sync(0xffffffffu, l, 1);
    out[1 * 32 + l] = __shfl_xor_sync(0xffffffffu, l, 8, 8);      // 8 leaves a segment of 8: own value
    out[2 * 32 + l] = __shfl_sync(0xffffffffu, l * 10, 3, 16);     // lane 3 of each half
    out[3 * 32 + l] = __shfl_up_sync(0xffffffffu, l, 2);
    out[4 * 32 + l] = __shfl_down_sync(0xffffffffu, l, 5, 16);
    out[5 * 32 + l] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
    out[6 * 32 + l] = __any_sync(0xffffffffu, l == 17) + 2 * __all_sync(0xffffffffu, l < 32);
}
static int case_shuffles() {
    int* d = dev<int>(7 * 32);
    shuffle_kernel<<<1, 32>>>(d);
    int h[7 * 32];
    down(h, d, 7 * 32);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        const int want[7] = {l ^ 1, l, (l & 16) * 10 + 30, l >= 2 ? l - 2 : l, (l % 16) + 5 < 16 ? l + 5 : l,
                             (int)ballot, 3};
        for (int k = 0; k < 7; k++)
            if (h[k * 32 + l] != want[k]) {
                char why[128];
                snprintf(why, sizeof(why), "collective %d at lane %d gave %d, PTX says %d", k, l, h[k * 32 + l], want[k]);
                return verdict("shuffles", false, why);
            }
    }
    return verdict("shuffles", true, "");
}

// Half the warp reaches a full-mask shuffle: it can never complete.
__global__ void divergent_shuffle_kernel(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
static int case_mask_mismatch() {
    int* d = dev<int>(32);
    divergent_shuffle_kernel<<<1, 32>>>(d);
    return verdict("mask_mismatch", false, "no deadlock reported");
}
__global__ void bad_width_kernel(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1, 12); }
static int case_bad_width() {
    int* d = dev<int>(32);
    bad_width_kernel<<<1, 32>>>(d);
    return verdict("bad_width", false, "a width of 12 was accepted");
}

// ---------------------------------------------------------------------------------------------------
// Memory bounds and launch configurations.
__global__ void copy_kernel(float* dst, const float* src, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) dst[i] = src[i];   // one element too many
}
static int case_global_oob() {
    float* a = dev<float>(100);
    float* b = dev<float>(100);
    copy_kernel<<<1, 128>>>(b, a, 100);
    return verdict("global_oob", false, "no out-of-bounds access reported");
}
__global__ void dynamic_smem_kernel(int* out, int n) {
    extern __shared__ int buf[];
    buf[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = buf[n - 1];
}
static int case_shared_oob() {   // 16 ints of dynamic shared memory, 17 threads write
    int* d = dev<int>(1);
    dynamic_smem_kernel<<<1, 17, 16 * sizeof(int)>>>(d, 16);
    return verdict("shared_oob", false, "no shared-memory overrun reported");
}
static int case_launch_limits() {
    int* d = dev<int>(1);
    dynamic_smem_kernel<<<1, 2048, 64>>>(d, 1);
    const cudaError_t too_many = cudaGetLastError();
    dynamic_smem_kernel<<<1, 32, 100 << 10>>>(d, 1);
    const cudaError_t too_much = cudaGetLastError();
    check(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10), "attr");
    dynamic_smem_kernel<<<1, 32, 100 << 10>>>(d, 32);
    const cudaError_t allowed = cudaGetLastError();
    return verdict("launch_limits", too_many == cudaErrorInvalidConfiguration && too_much == cudaErrorInvalidValue &&
                                        allowed == cudaSuccess,
                   "2048 threads, or 100 KiB of dynamic shared memory without the attribute, was not refused");
}

// ---------------------------------------------------------------------------------------------------
// Order: the last writer wins. The emulator draws the order of the blocks, and of the threads between two
// barriers, from the seed and the launch count, so the winner differs from launch to launch, as it may on a GPU.
__global__ void last_block_kernel(int* out) {
    if (threadIdx.x == 0) out[0] = (int)blockIdx.x;
}
__global__ void last_thread_kernel(int* out) { out[0] = (int)threadIdx.x; }
// Eight launches of k: whether more than one writer won.
static bool several_winners(void (*k)(int*), int blocks, int threads) {
    int* d = dev<int>(1);
    int seen = 0;
    for (int rep = 0; rep < 8; rep++) {
        k<<<blocks, threads>>>(d);
        int h;
        down(&h, d, 1);
        seen |= 1 << (h % 31);
    }
    return __builtin_popcount((unsigned)seen) > 1;
}
static int case_block_order() {
    return verdict("block_order", several_winners(last_block_kernel, 64, 32), "eight launches ran their blocks in one order");
}
static int case_thread_order() {
    return verdict("thread_order", several_winners(last_thread_kernel, 1, 64), "eight launches ran their threads in one order");
}

// Atomics: every thread of every block adds to one shared and one global counter; no race is reported and
// the sums are exact (integers, and floats small enough to add exactly in any order).
__global__ void atomics_kernel(int* total, float* ftotal) {
    __shared__ int count[1];
    if (threadIdx.x == 0) count[0] = 0;
    __syncthreads();
    atomicAdd(&count[0], 1);
    atomicAdd(ftotal, 0.5f);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(total, count[0]);
    atomicMax(total + 1, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}
static int case_atomics() {
    int* d = dev<int>(2);
    float* f = dev<float>(1);
    atomics_kernel<<<8, 96>>>(d, f);
    int h[2];
    float hf;
    down(h, d, 2);
    down(&hf, f, 1);
    return verdict("atomics", h[0] == 768 && h[1] == 767 && hf == 384.0f, "the atomic sums or the maximum are wrong");
}

// Host code reading device memory without a copy: the fence faults, as a GPU's memory would be out of reach.
static int case_host_touch() {
    float* d = dev<float>(4);
    volatile float x = d[1];
    (void)x;
    return verdict("host_touch", false, "host code read device memory");
}

struct Case {
    const char* name;
    int (*run)();
};
static const Case kCases[] = {
    {"barrier_sum", case_barrier_sum},       {"missing_barrier", case_missing_barrier},
    {"syncwarp_orders", case_syncwarp_orders}, {"warp_race", case_warp_race},
    {"write_write_race", case_write_write_race}, {"shuffles", case_shuffles},
    {"mask_mismatch", case_mask_mismatch},   {"bad_width", case_bad_width},
    {"global_oob", case_global_oob},         {"shared_oob", case_shared_oob},
    {"launch_limits", case_launch_limits},   {"block_order", case_block_order},
    {"atomics", case_atomics},               {"host_touch", case_host_touch},
    {"thread_order", case_thread_order},
};

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CASE|list\n", argv[0]);
        return 2;
    }
    for (const Case& c : kCases) {
        if (!strcmp(argv[1], "list")) printf("%s\n", c.name);
        else if (!strcmp(argv[1], c.name)) return c.run();
    }
    if (!strcmp(argv[1], "list")) return 0;
    fprintf(stderr, "test_runtime: no case '%s'\n", argv[1]);
    return 2;
}
