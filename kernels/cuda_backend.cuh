// cuda_backend.cuh: what a kernel file sees of the CUDA backend. struct Backend is kernels/backend_cuda.cu's
// alone; a kernel file reaches it only through these: the main stream, the kernel scratch, cuBLASLt's handle
// and workspace, device memory counted in the backend's bytes, and the kernel table. Every kernels/*.cuh and
// kernels/variants/*.cuh includes this header and what else it uses, and compiles alone (make kernels-alone);
// the cuDNN graph builders (cudnn_graph.cuh, attention_cudnn_graphs.cuh) are host code that needs none of it.
//
// The kernel table: each op a kernel variant can replace is called through it. backend_create fills it once,
// with each op's default (the .cuh of its layer) and the test hooks, then lets every variant named in
// GPT_CUDA_VARIANTS override the entries it replaces (kernels/variants/<name>.cuh, base/gpu_variants.h). A
// launcher never asks which variants are on: it calls its entry, and an entry that does not take a shape hands
// it to the default in code. An op no variant replaces is its kernels.h function.
#pragma once
#include "kernels/cuda_common.cuh"

// Kernel scratch (deterministic reductions' partials, the encoder's sort): separate from the cuBLASLt
// workspace so a launcher can hold scratch across a cuBLASLt call. Work on one stream never overlaps.
#define KERNEL_SCRATCH_BYTES ((size_t)32 << 20)
#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)

struct LtEpilogue;       // kernels/matmul.cuh
struct LtPlans;          // kernels/variants/lt_plan_cache.cuh
struct CudnnAttention;   // kernels/variants/cudnn_attention.cuh

// One cuBLASLt product: column-major D (m,n) = op(A) (m,k) * op(B) (k,n) [+ beta * D], with an epilogue.
// Returns 0, having launched nothing, when cuBLASLt has no algorithm for it (kernels/matmul.cuh).
typedef int (*LtMatmulFn)(Backend* be, DType dt, void* d, const void* a, const void* b, int trans_a, int trans_b,
                          int m, int n, int k, int lda, int ldb, int ldd, float beta, const LtEpilogue* ep);

struct KernelTable {
    // The ops a variant replaces, with kernels.h's signatures; their kernels.h functions call these.
    decltype(&::attention_forward) attention_forward;             // cudnn_attention
    decltype(&::attention_backward) attention_backward;           // cudnn_attention
    decltype(&::matmul_backward_weight) matmul_backward_weight;   // bias_grad_epilogue
    decltype(&::layernorm_backward) layernorm_backward;           // norm_one_pass
    decltype(&::rmsnorm_backward) rmsnorm_backward;               // norm_one_pass
    decltype(&::qk_norm_backward) qk_norm_backward;               // norm_one_pass
    decltype(&::adamw_update_spans) adamw_update_spans;           // adamw_multi
    decltype(&::sum_squares_spans) sum_squares_spans;             // adamw_multi
    // The product every matmul launcher makes: planned per call by default (lt_plan_cache, lt_autotune).
    LtMatmulFn lt_matmul;
    // The test hooks (base/gpu_variants.h), which send the defaults down their fallback paths.
    bool fused_epilogues;          // cuBLASLt's GELU and bias-gradient epilogues; off: GPT_CUDA_NO_FUSED_EPILOGUES=1
    bool attention_tensor_cores;   // attention's tensor-core kernels; off: GPT_CUDA_ATTENTION_SCALAR=1
    // The variants' state, made when one is registered (NULL otherwise) and released with the backend.
    CudnnAttention* cudnn;
    LtPlans* lt_plans;
};

// A variant's registration: overrides its entries of `t` (the backend's table, being filled) and makes its state.
typedef void (*VariantRegister)(Backend* be, KernelTable* t);

const KernelTable* be_kernels(const Backend* be);
cudaStream_t be_stream(const Backend* be);   // every kernel, copy and memset of a launcher goes here
// Scratch of at least `bytes` for one launcher; valid until the next launcher on the stream.
void* be_scratch(Backend* be, size_t bytes, const char* who);
cublasLtHandle_t be_cublaslt(const Backend* be);
void* be_cublaslt_workspace(const Backend* be);   // CUBLASLT_WORKSPACE_BYTES
// Device memory for a library's own use (a workspace), counted in the backend's allocated and peak bytes;
// fails like be_malloc. be_device_free returns it (no stream may still use it) and its count.
void* be_device_alloc(Backend* be, size_t bytes, const char* what);
void be_device_free(Backend* be, void* p, size_t bytes);
// release(be, state) runs in backend_destroy, after every stream has drained, in reverse order of these calls.
void be_on_destroy(Backend* be, void (*release)(Backend* be, void* state), void* state);
