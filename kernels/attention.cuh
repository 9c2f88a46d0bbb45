// attention.cuh: causal self-attention with grouped-query heads, forward and backward: the kernel table's entries
// (the cudnn_attention variant replaces them: kernels/variants/cudnn_attention.cuh) and their default, which runs
// this backend's own kernels. Of those, attention_path alone chooses, by shape, precision and alignment: the
// multi-head kernels (attention_mha.cuh) or the grouped-query ones (attention_gqa.cuh), each on CUDA cores (any
// head size and storage type) or tensor cores (16-bit storage, 16-byte aligned rows, head size 64, or 128 on the
// grouped kernels). The GPT_CUDA_ATTENTION_SCALAR test hook (the table's attention_tensor_cores) keeps every
// call on CUDA cores.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/attention_mha.cuh"
#include "kernels/attention_gqa.cuh"

enum AttentionPath { ATT_MHA_CUDA_CORES, ATT_MHA_TENSOR_CORES, ATT_GQA_CUDA_CORES, ATT_GQA_TENSOR_CORES };

// The default's one choice of kernels. `aligned`: every tensor of the call 16-byte aligned.
static AttentionPath attention_path(const KernelTable* t, DType dt, int NH, int KV, int D, bool aligned) {
    const bool tc = t->attention_tensor_cores && dt != DT_FP32 && aligned;
    if (KV != NH) return tc && (D == 64 || D == 128) ? ATT_GQA_TENSOR_CORES : ATT_GQA_CUDA_CORES;
    if (tc && D == 64) return ATT_MHA_TENSOR_CORES;
    if (tc && D == 128) return ATT_GQA_TENSOR_CORES;   // multi-head is the grouped layout with groups of one
    return ATT_MHA_CUDA_CORES;
}

// Run `body` with T bound to the C++ type of a 16-bit DType (the tensor-core kernels' only storage types).
#define DISPATCH_16BIT(dt, T, ...)                                                                       \
    do {                                                                                                 \
        if ((dt) == DT_BF16) { typedef __nv_bfloat16 T; __VA_ARGS__; }                                   \
        else { typedef __half T; __VA_ARGS__; }                                                          \
    } while (0)

static void attention_forward_default(Backend* be, DType dt, void* out, float* lse, const void* qkv, const int* doc,
                                      int B, int T, int NH, int KV, int D) {
    if (doc) fail("attention_forward: documents (doc) are not yet supported by the CUDA kernels");
    const int G = attention_lane_group(D), C = NH * D;
    const GqaShape sh{T, NH, KV, D};
    switch (attention_path(be_kernels(be), dt, NH, KV, D, aligned16(out) && aligned16(qkv))) {
    case ATT_GQA_TENSOR_CORES: DISPATCH_16BIT(dt, X, gqa_forward_tc_hd<X>(be, out, lse, qkv, B, sh)); break;
    case ATT_GQA_CUDA_CORES:
        DISPATCH_DTYPE(dt, X, gqa_forward_cuda_core<X>(be, (X*)out, lse, (const X*)qkv, B, sh, G));
        break;
    case ATT_MHA_TENSOR_CORES:
        DISPATCH_16BIT(dt, X, fa_forward<X, FA_WARPS>(be, (X*)out, lse, (const X*)qkv, B, T, C, NH));
        break;
    case ATT_MHA_CUDA_CORES:
        DISPATCH_DTYPE(dt, X, mha_forward_cuda_core<X>(be, (X*)out, lse, (const X*)qkv, B, T, C, NH, G));
        break;
    }
}

// The tensor-core kernels compute D = rowsum(dout * out) themselves; the CUDA-core ones in a kernel of their own.
static void attention_backward_default(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout,
                                       const void* qkv, const void* out, const float* lse, const int* doc, int B, int T,
                                       int NH, int KV, int hs) {
    if (doc) fail("attention_backward: documents (doc) are not yet supported by the CUDA kernels");
    const int G = attention_lane_group(hs), C = NH * hs;
    const GqaShape sh{T, NH, KV, hs};
    float* D = scratch;   // (B,NH,T)
    const bool aligned = aligned16(dqkv) && aligned16(dout) && aligned16(qkv) && aligned16(out);
    switch (attention_path(be_kernels(be), dt, NH, KV, hs, aligned)) {
    case ATT_GQA_TENSOR_CORES:
        DISPATCH_16BIT(dt, X, gqa_backward_tc_hd<X>(be, dqkv, D, dout, qkv, out, lse, B, sh));
        break;
    case ATT_GQA_CUDA_CORES:
        DISPATCH_DTYPE(dt, X, gqa_backward_cuda_core<X>(be, (X*)dqkv, D, (const X*)dout, (const X*)qkv, (const X*)out,
                                                         lse, B, sh, G));
        break;
    case ATT_MHA_TENSOR_CORES:
        DISPATCH_16BIT(dt, X, fa_backward<X, FA_WARPS>(be, (X*)dqkv, D, (const X*)dout, (const X*)qkv, (const X*)out,
                                                       lse, B, T, C, NH));
        break;
    case ATT_MHA_CUDA_CORES:
        DISPATCH_DTYPE(dt, X, mha_backward_cuda_core<X>(be, (X*)dqkv, D, (const X*)dout, (const X*)qkv, (const X*)out,
                                                         lse, B, T, C, NH, G));
        break;
    }
}

extern "C" void attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, const int* doc, int B,
                                  int T, int NH, int KV, int D) {
    attention_check_shape(NH, KV, D, "attention_forward");
    be_kernels(be)->attention_forward(be, dt, out, lse, qkv, doc, B, T, NH, KV, D);
}

extern "C" void attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                                   const void* out, const float* lse, const int* doc, int B, int T, int NH, int KV,
                                   int hs) {
    attention_check_shape(NH, KV, hs, "attention_backward");
    be_kernels(be)->attention_backward(be, dt, dqkv, scratch, dout, qkv, out, lse, doc, B, T, NH, KV, hs);
}
