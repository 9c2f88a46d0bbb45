// backend_cuda.cu: the CUDA backend, the one CUDA translation unit. It defines struct Backend, the be_* and
// dtype functions of kernels.h and the accessors of kernels/cuda_backend.cuh, and includes one .cuh per layer
// (whose launchers are the layer functions of kernels.h, extern "C" through kernels.h) and one per kernel
// variant (kernels/variants/). backend_create fills the kernel table once: each op's default and the test
// hooks, then the variants named in GPT_CUDA_VARIANTS.
#include "kernels/cuda_backend.cuh"
#include "base/gpu_variants.h"

#include "kernels/encoder.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/attention.cuh"
#include "kernels/attention_chunk.cuh"
#include "kernels/gelu.cuh"
#include "kernels/lora_dropout.cuh"
#include "kernels/quantize.cuh"
#include "kernels/classifier.cuh"
#include "kernels/adamw.cuh"

#include "kernels/variants/cudnn_attention.cuh"
#include "kernels/variants/bias_grad_epilogue.cuh"
#include "kernels/variants/lt_plan_cache.cuh"
#include "kernels/variants/lt_autotune.cuh"
#include "kernels/variants/norm_one_pass.cuh"
#include "kernels/variants/adamw_multi.cuh"

typedef struct {
    void* ptr;
    size_t bytes;
} Allocation;

typedef struct {
    void (*release)(Backend* be, void* state);
    void* state;
} Release;
#define MAX_RELEASES 8

struct Backend {
    int device;
    cudaDeviceProp prop;
    cudaStream_t stream;            // the main stream: every kernel, copy and memset goes here
    cudaStream_t comm_stream;       // NCCL's collectives (kernels.h); ordered with `stream` by the comm layer
    // be_download_async and be_upload_async: one stream per direction, so the two copy engines run at once;
    // each copy is ordered after `stream` by main_mark.
    cudaStream_t down_stream, up_stream;
    cudaEvent_t main_mark;          // recorded on `stream` before each asynchronous copy
    cublasLtHandle_t lt;
    void* lt_workspace;             // CUBLASLT_WORKSPACE_BYTES
    void* scratch;                  // KERNEL_SCRATCH_BYTES
    size_t bytes_allocated, peak_bytes;
    Allocation* allocs;             // live be_malloc blocks, so be_free knows how many bytes it returns
    int n_allocs, cap_allocs;
    unsigned variants;              // base/gpu_variants.h, from GPT_CUDA_VARIANTS at creation
    KernelTable kernels;            // filled once by backend_create
    Release releases[MAX_RELEASES]; // the variants' state, released by backend_destroy (be_on_destroy)
    int n_releases;
};

// Each variant's registration (kernels/variants/<name>.cuh), in base/gpu_variants.h's order, which is the order
// they run in: a later one overrides an earlier one's entries (lt_autotune those of lt_plan_cache).
static const struct {
    GpuVariant variant;
    VariantRegister register_into;
} VARIANT_REGISTRATIONS[] = {
    {VARIANT_CUDNN_ATTENTION, cudnn_attention_register}, {VARIANT_BIAS_GRAD_EPILOGUE, bias_grad_epilogue_register},
    {VARIANT_LT_PLAN_CACHE, lt_plan_cache_register},     {VARIANT_LT_AUTOTUNE, lt_autotune_register},
    {VARIANT_NORM_ONE_PASS, norm_one_pass_register},     {VARIANT_ADAMW_MULTI, adamw_multi_register},
};
static_assert(sizeof VARIANT_REGISTRATIONS / sizeof *VARIANT_REGISTRATIONS == GPU_VARIANT_COUNT,
              "every kernel variant of base/gpu_variants.h registers itself here");

// Each op's default and the test hooks, then the named variants over them: the one place an op's implementation
// is chosen.
static void kernel_table_fill(Backend* be, unsigned hooks) {
    KernelTable* t = &be->kernels;
    *t = KernelTable{};
    t->attention_forward = attention_forward_default;
    t->attention_backward = attention_backward_default;
    t->matmul_backward_weight = matmul_backward_weight_default;
    t->layernorm_backward = layernorm_backward_default;
    t->rmsnorm_backward = rmsnorm_backward_default;
    t->qk_norm_backward = qk_norm_backward_default;
    t->adamw_update_spans = adamw_update_spans_default;
    t->sum_squares_spans = sum_squares_spans_default;
    t->lt_matmul = lt_matmul_per_call;
    t->fused_epilogues = !(hooks & GPU_HOOK_NO_FUSED_EPILOGUES);
    t->attention_tensor_cores = !(hooks & GPU_HOOK_ATTENTION_SCALAR);
    for (const auto& r : VARIANT_REGISTRATIONS)
        if (be->variants & (unsigned)r.variant) r.register_into(be, t);
}

const KernelTable* be_kernels(const Backend* be) { return &be->kernels; }
cudaStream_t be_stream(const Backend* be) { return be->stream; }
cublasLtHandle_t be_cublaslt(const Backend* be) { return be->lt; }
void* be_cublaslt_workspace(const Backend* be) { return be->lt_workspace; }

void* be_scratch(Backend* be, size_t bytes, const char* who) {
    if (bytes > KERNEL_SCRATCH_BYTES)
        fail("%s needs %zu bytes of kernel scratch, the CUDA backend has %zu", who, bytes, (size_t)KERNEL_SCRATCH_BYTES);
    return be->scratch;
}

void be_on_destroy(Backend* be, void (*release)(Backend* be, void* state), void* state) {
    if (be->n_releases == MAX_RELEASES) fail("more than %d kernel variants keep state on the backend", MAX_RELEASES);
    be->releases[be->n_releases++] = Release{release, state};
}

void* be_device_alloc(Backend* be, size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();   // clear the sticky-free allocation error before asking again
        cudaMemGetInfo(&free_b, &total_b);
        fail("out of GPU memory allocating %zu bytes (%s; %zu bytes allocated by this backend, %zu free of %zu "
             "on device %d: %s)", bytes, what, be->bytes_allocated, free_b, total_b, be->device,
             cudaGetErrorString(e));
    }
    be->bytes_allocated += bytes;
    if (be->bytes_allocated > be->peak_bytes) be->peak_bytes = be->bytes_allocated;
    return p;
}

void be_device_free(Backend* be, void* p, size_t bytes) {
    CUDA_CHECK(cudaFree(p));
    be->bytes_allocated -= bytes;
}

// An empty kernel asked for its attributes: CUDA answers with an error when this binary holds no image the
// device can run (no SASS for its architecture and no PTX old enough to JIT), which would otherwise surface
// as "no kernel image is available" at the first launch, deep inside a step.
__global__ void arch_probe_kernel(void) {}

// One line naming the device and what to do, before anything is allocated.
static void check_architecture(const cudaDeviceProp* p) {
    if (p->major < 8)
        fail("%s is sm_%d%d: train_gpt needs sm_80 or newer (bf16 tensor-core instructions); train_gpt_cpu is "
             "the CPU build", p->name, p->major, p->minor);
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, (const void*)arch_probe_kernel);
    if (e != cudaSuccess) {
        cudaGetLastError();   // clear it: the message below is the error
        fail("this train_gpt has no kernels for %s (sm_%d%d): rebuild with make -B train_gpt GPU_ARCHS=\"%d%d\" (%s)",
             p->name, p->major, p->minor, p->major, p->minor, cudaGetErrorString(e));
    }
}

extern "C" {

Backend* backend_create(int local_rank) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    // The usual first-run mistake (the GPU build on a machine without a GPU) gets a message that says so,
    // rather than CUDA's "driver version is insufficient".
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || (e == cudaSuccess && count <= 0))
        fail("no usable CUDA GPU (cudaGetDeviceCount: %s): train_gpt needs an NVIDIA GPU and driver; train_gpt_cpu "
             "is the CPU build", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    CUDA_CHECK(e);
    Backend* be = (Backend*)xcalloc(1, sizeof(Backend));
    be->variants = gpu_variants_from_env();
    const unsigned hooks = gpu_test_hooks_from_env();
    be->device = (local_rank < 0 ? 0 : local_rank) % count;
    CUDA_CHECK(cudaSetDevice(be->device));
    CUDA_CHECK(cudaGetDeviceProperties(&be->prop, be->device));
    check_architecture(&be->prop);
    CUDA_CHECK(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking));
    // NCCL's kernels run on the comm stream at the device's highest priority: a collective that waits behind
    // the main stream's queued kernels for free SMs delays every unit that waits for its result, while the
    // compute it displaces has more queued behind it. (The copy streams use the copy engines, not SMs.)
    int lowest = 0, highest = 0;   // CUDA numbers priorities downwards: highest <= lowest
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&be->comm_stream, cudaStreamNonBlocking, highest));
    CUDA_CHECK(cudaStreamCreateWithFlags(&be->down_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&be->up_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&be->main_mark, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasLtCreate(&be->lt));
    be->lt_workspace = be_device_alloc(be, CUBLASLT_WORKSPACE_BYTES, "cuBLASLt workspace");
    be->scratch = be_device_alloc(be, KERNEL_SCRATCH_BYTES, "kernel scratch");
    kernel_table_fill(be, hooks);
    return be;
}

void backend_destroy(Backend* be) {
    if (!be) return;
    CUDA_CHECK(cudaSetDevice(be->device));
    be_synchronize(be);
    for (int i = be->n_releases - 1; i >= 0; i--) be->releases[i].release(be, be->releases[i].state);
    for (int i = 0; i < be->n_allocs; i++) CUDA_CHECK(cudaFree(be->allocs[i].ptr));
    CUDA_CHECK(cudaFree(be->lt_workspace));
    CUDA_CHECK(cudaFree(be->scratch));
    CUBLAS_CHECK(cublasLtDestroy(be->lt));
    CUDA_CHECK(cudaStreamDestroy(be->stream));
    CUDA_CHECK(cudaStreamDestroy(be->comm_stream));
    CUDA_CHECK(cudaStreamDestroy(be->down_stream));
    CUDA_CHECK(cudaStreamDestroy(be->up_stream));
    CUDA_CHECK(cudaEventDestroy(be->main_mark));
    free(be->allocs);
    free(be);
}

const char* backend_device_name(const Backend* be) { return be->prop.name; }
int backend_is_gpu(const Backend* be) { return 1; }
unsigned backend_variants(const Backend* be) { return be->variants; }
void* backend_stream(Backend* be) { return (void*)be->stream; }
void* backend_comm_stream(Backend* be) { return (void*)be->comm_stream; }

void* be_malloc(Backend* be, size_t bytes) {
    void* p = be_device_alloc(be, bytes, "be_malloc");
    if (be->n_allocs == be->cap_allocs) {
        int cap = be->cap_allocs ? 2 * be->cap_allocs : 64;
        Allocation* a = (Allocation*)realloc(be->allocs, (size_t)cap * sizeof(Allocation));
        if (!a) fail("out of host memory tracking GPU allocations");
        be->allocs = a;
        be->cap_allocs = cap;
    }
    be->allocs[be->n_allocs].ptr = p;
    be->allocs[be->n_allocs].bytes = bytes;
    be->n_allocs++;
    return p;
}

void be_free(Backend* be, void* p) {
    if (!p) return;
    for (int i = 0; i < be->n_allocs; i++) {
        if (be->allocs[i].ptr != p) continue;
        // cudaFree does not wait for our non-blocking streams: kernels or a collective may still use p.
        be_synchronize(be);
        CUDA_CHECK(cudaFree(p));
        be->bytes_allocated -= be->allocs[i].bytes;
        be->allocs[i] = be->allocs[--be->n_allocs];
        return;
    }
    fail("be_free of a pointer that be_malloc did not return (%p)", p);
}

void be_memset0(Backend* be, void* p, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, be->stream)); }

void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, be->stream));
    // The caller may reuse or free its host buffer as soon as we return.
    CUDA_CHECK(cudaStreamSynchronize(be->stream));
}

void be_download(Backend* be, void* dst_host, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, be->stream));
    CUDA_CHECK(cudaStreamSynchronize(be->stream));
}

void be_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, be->stream));
}

void be_copy_rows(Backend* be, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows) {
    if (!rows || !row_bytes) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, be->stream));
}

// The comm and copy streams too: a collective or a copy not yet waited for may still be writing memory.
void be_synchronize(Backend* be) {
    CUDA_CHECK(cudaStreamSynchronize(be->stream));
    CUDA_CHECK(cudaStreamSynchronize(be->comm_stream));
    CUDA_CHECK(cudaStreamSynchronize(be->down_stream));
    CUDA_CHECK(cudaStreamSynchronize(be->up_stream));
}

struct BeEvent {
    cudaEvent_t event;
};

BeEvent* be_event_create(Backend* be) {
    BeEvent* ev = (BeEvent*)xcalloc(1, sizeof(BeEvent));
    // Blocking: a thread waiting for a copy (the landing worker, through a whole backward) sleeps, not spins.
    CUDA_CHECK(cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming | cudaEventBlockingSync));
    return ev;
}

void be_event_destroy(Backend* be, BeEvent* ev) {
    if (!ev) return;
    CUDA_CHECK(cudaEventDestroy(ev->event));
    free(ev);
}

// One copy on a copy stream, after the main stream's work so far.
static void copy_after_main(Backend* be, cudaStream_t copy, void* dst, const void* src, size_t bytes,
                            cudaMemcpyKind kind, BeEvent* done) {
    CUDA_CHECK(cudaEventRecord(be->main_mark, be->stream));
    CUDA_CHECK(cudaStreamWaitEvent(copy, be->main_mark, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copy));
    CUDA_CHECK(cudaEventRecord(done->event, copy));
}

void be_download_async(Backend* be, void* dst_host, const void* src, size_t bytes, BeEvent* done) {
    copy_after_main(be, be->down_stream, dst_host, src, bytes, cudaMemcpyDeviceToHost, done);
}

void be_upload_async(Backend* be, void* dst, const void* src_host, size_t bytes, BeEvent* done) {
    copy_after_main(be, be->up_stream, dst, src_host, bytes, cudaMemcpyHostToDevice, done);
}

void be_stream_wait(Backend* be, BeEvent* ev) { CUDA_CHECK(cudaStreamWaitEvent(be->stream, ev->event, 0)); }

// Any thread: the runtime's current device is per thread, so a worker sets ours before waiting.
void be_event_synchronize(Backend* be, BeEvent* ev) {
    CUDA_CHECK(cudaSetDevice(be->device));
    CUDA_CHECK(cudaEventSynchronize(ev->event));
}
size_t be_peak_bytes(const Backend* be) { return be->peak_bytes; }

// Pinned, so the copies of offloaded state are DMA transfers the GPU can overlap with compute later.
void* be_host_alloc(Backend* be, size_t bytes) {
    void* p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) fail("out of pinned host memory allocating %zu bytes: %s", bytes, cudaGetErrorString(e));
    return p;
}

void be_host_free(Backend* be, void* p) {
    if (!p) return;
    be_synchronize(be);   // no copy on either stream may still read or write it
    CUDA_CHECK(cudaFreeHost(p));
}

// ---------------------------------------------------------------------------------------------------
// Host-side precision helpers: identical to the CPU backend's (both use dtype.h).
float dtype_round(float x, DType dt) {
    switch (dt) {
    case DT_BF16: return f32_from_bf16(bf16_from_f32(x));
    case DT_FP16: return f32_from_fp16(fp16_from_f32(x));
    default: return x;
    }
}

void host_to_dtype(void* dst, DType dt, const float* src, size_t n) {
    switch (dt) {
    case DT_BF16: for (size_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = bf16_from_f32(src[i]); break;
    case DT_FP16: for (size_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = fp16_from_f32(src[i]); break;
    default: memmove(dst, src, n * sizeof(float)); break;
    }
}

void host_from_dtype(float* dst, const void* src, DType dt, size_t n) {
    switch (dt) {
    case DT_BF16: for (size_t i = 0; i < n; i++) dst[i] = f32_from_bf16(((const uint16_t*)src)[i]); break;
    case DT_FP16: for (size_t i = 0; i < n; i++) dst[i] = f32_from_fp16(((const uint16_t*)src)[i]); break;
    default: memmove(dst, src, n * sizeof(float)); break;
    }
}

}   // extern "C"

// ---------------------------------------------------------------------------------------------------
// convert: one element per thread, any alignment (it runs once per checkpoint / step, not per layer).
template <typename Tout, typename Tin>
__global__ void convert_kernel(Tout* dst, const Tin* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<Tout>(to_f(src[i]));
}

extern "C" void convert(Backend* be, void* dst, DType dst_dt, const void* src, DType src_dt, size_t n) {
    if (n == 0) return;
    if (dst_dt == src_dt) {
        if (dst != src) be_copy(be, dst, src, n * dtype_size(dst_dt));
        return;
    }
    const int block = 256;
    const int grid = (int)((n + block - 1) / block < 65536 ? (n + block - 1) / block : 65536);
    DISPATCH_DTYPE(dst_dt, To, DISPATCH_DTYPE(src_dt, Ti, {
        convert_kernel<To, Ti><<<grid, block, 0, be->stream>>>((To*)dst, (const Ti*)src, n);
        LAUNCH_CHECK();
    }));
}

int backend_build_is_gpu(void) { return 1; }
