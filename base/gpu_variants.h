// gpu_variants.h: the CUDA backend's opt-in kernel variants, and its kernel test hooks. A variant is a candidate
// for speed that runs only when named in GPT_CUDA_VARIANTS (comma-separated, read once when a backend is
// created), so one GPU window can check each against the CPU twins (make test-gpu) and time it beside the
// default (make bench). Each lives in kernels/variants/<name>.cuh, which registers it: at backend_create it
// overrides the kernel table's entries for the ops it replaces (kernels/cuda_backend.cuh). A variant becomes the
// default, and leaves this list, only after a GPU run shows it within the tolerances and faster
// (docs/gpu-testing.md). The CPU build has one implementation of each kernel: it accepts the names (so the
// scripts' dry runs take the same rows) and its banner says they change nothing there.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    VARIANT_CUDNN_ATTENTION = 1u << 0,    // attention through cuDNN's fused SDPA graph (kernels/attention_cudnn.cuh)
    VARIANT_BIAS_GRAD_EPILOGUE = 1u << 1, // 16-bit runs: the bias gradient from cuBLASLt's BGRADB epilogue in the
                                          // storage type, instead of two kernels after the weight gradient
    VARIANT_LT_PLAN_CACHE = 1u << 2,      // cuBLASLt descriptors and the heuristic's algorithm kept per shape
    VARIANT_LT_AUTOTUNE = 1u << 3,        // the plan cache, each shape's algorithm timed among the heuristic's top
    VARIANT_NORM_ONE_PASS = 1u << 4,      // LayerNorm / RMSNorm backward: dinp and the weight partials in one pass
    VARIANT_ADAMW_MULTI = 1u << 5,        // AdamW and the gradient norm over all spans in one launch each
} GpuVariant;
#define GPU_VARIANT_COUNT 6

// The set GPT_CUDA_VARIANTS names (0 when unset or empty); an unknown name fails with one line listing the known.
unsigned gpu_variants_from_env(void);
// "cudnn_attention,lt_plan_cache", or "none".
void gpu_variants_describe(unsigned set, char* buf, size_t size);

// The test hooks: each, set to 1 in the environment, sends the CUDA backend's default kernels down the fallback
// path they keep for what their fast path does not take, so make test-gpu checks those paths on shapes that would
// not reach them (tests/gpu/check_kernels.sh's fallback rows). Read once with the variants, at backend_create.
typedef enum {
    GPU_HOOK_NO_FUSED_EPILOGUES = 1u << 0,   // GPT_CUDA_NO_FUSED_EPILOGUES: matmul's plain product, then the GELU /
                                             // bias-gradient kernels, instead of cuBLASLt's epilogues
    GPU_HOOK_ATTENTION_SCALAR = 1u << 1,     // GPT_CUDA_ATTENTION_SCALAR: attention's CUDA-core kernels where its
                                             // tensor-core ones would run
} GpuTestHook;

// The set of hooks the environment turns on.
unsigned gpu_test_hooks_from_env(void);

#ifdef __cplusplus
}
#endif
