// attention_cudnn_graphs.cuh: causal attention (forward and backward) as cuDNN operation graphs, the shapes of
// the cudnn_attention variant (kernels/variants/cudnn_attention.cuh). The graphs follow cuDNN's own description of SDPA training
// (the cudnn-frontend's composite SDPA nodes), which cuDNN's engines recognize and run as one fused kernel:
//   forward   S = Q Kᵀ · scale, causal mask (-inf where key > query), P = softmax(S) with
//             stats = max + log(sum exp(S - max)) (= this backend's lse), O = P V
//   backward  sum = rowsum(dO ∘ O); P = exp(S - stats) under the mask; dV = Pᵀ dO; dS = P ∘ (dO Vᵀ - sum) · scale;
//             dK = dSᵀ Q; dQ = dS K
// Grouped-query heads (KV < NH) broadcast K and V over the query heads in the matmuls; dK and dV are the
// query heads' per-head products summed over each group. Q, K, V, dQ, dK, dV are read and written in place in
// packed qkv rows (strides, no copies); lse is the stats tensor (B,NH,T,1). Apart from attention_cudnn.cuh so
// tests/gpu/cudnn_graph_check.cu can build every descriptor without a GPU.
#pragma once
#include "kernels/cudnn_graph.cuh"
#include "kernels/kernels.h"

enum { SDPA_FORWARD = 0, SDPA_BACKWARD = 1 };
// The caller's tensors in both graphs.
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_ONE, UID_DO, UID_DQ, UID_DK, UID_DV, UID_SUM };

struct SdpaKey {
    int direction, dt, B, T, NH, KV, D;
    int aligned;   // every tensor's memory 16-byte aligned (cuDNN's assumption for these graphs)
};

// ---------------------------------------------------------------------------------------------------
// The tensors of one shape: qkv rows hold C3 = (NH + 2KV) D elements, out rows A = NH D.

static Dims4 sdpa_heads(const SdpaKey& k, int heads, int64_t row) {   // (B, heads, T, D) in rows of `row`
    return Dims4{{k.B, heads, k.T, k.D}, {(int64_t)k.T * row, k.D, row, 1}};
}
static Dims4 sdpa_heads_t(const SdpaKey& k, int heads, int64_t row) {   // the same seen as (B, heads, D, T)
    return Dims4{{k.B, heads, k.D, k.T}, {(int64_t)k.T * row, k.D, 1, row}};
}
static Dims4 sdpa_rows(const SdpaKey& k) {   // (B, NH, T, 1): lse and row sums
    return Dims4{{k.B, k.NH, k.T, 1}, {(int64_t)k.NH * k.T, k.T, 1, 1}};
}
static Dims4 sdpa_scores(const SdpaKey& k) {   // (B, NH, T, T)
    const int64_t T = k.T;
    return Dims4{{k.B, k.NH, T, T}, {k.NH * T * T, T * T, T, 1}};
}
static Dims4 sdpa_scores_t(const SdpaKey& k) {   // the scores seen as (B, NH, T_key, T_query)
    const int64_t T = k.T;
    return Dims4{{k.B, k.NH, T, T}, {k.NH * T * T, T * T, 1, T}};
}
static Dims4 sdpa_per_query_head(const SdpaKey& k) {   // (B, NH, T, D), contiguous: dK, dV before the group sum
    const int64_t T = k.T, D = k.D;
    return Dims4{{k.B, k.NH, T, D}, {k.NH * T * D, T * D, D, 1}};
}
static int64_t sdpa_c3(const SdpaKey& k) { return (int64_t)(k.NH + 2 * k.KV) * k.D; }

// s (virtual, fp32 scores) with the keys after each query set to -inf: row index >= column index keeps a score.
static CudnnDesc sdpa_causal_mask(GraphBuilder* g, const SdpaKey& k, CudnnDesc s) {
    const Dims4 d = sdpa_scores(k);
    CudnnDesc row = gb_virtual(g, CUDNN_DATA_INT32, d), col = gb_virtual(g, CUDNN_DATA_INT32, d);
    gb_pointwise_axis(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    gb_pointwise_axis(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    CudnnDesc keep = gb_virtual(g, CUDNN_DATA_BOOLEAN, d);
    gb_pointwise_axis(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    CudnnDesc masked = gb_virtual(g, CUDNN_DATA_FLOAT, d);
    gb_pointwise_axis(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, gb_scalar(g, UID_NEG_INF), keep, masked, -1);
    return masked;
}

// scale · Q Kᵀ (virtual, fp32).
static CudnnDesc sdpa_scaled_scores(GraphBuilder* g, const SdpaKey& k, CudnnDesc q, CudnnDesc kt, CudnnDesc scale) {
    CudnnDesc s = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k)), scaled = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k));
    gb_matmul(g, q, kt, s);
    gb_pointwise(g, CUDNN_POINTWISE_MUL, s, scale, scaled);
    return scaled;
}

static void sdpa_forward_graph(GraphBuilder* g, const SdpaKey& k, cudnnDataType_t io) {
    const int64_t c3 = sdpa_c3(k);
    CudnnDesc q = gb_tensor(g, UID_Q, io, sdpa_heads(k, k.NH, c3)), kt = gb_tensor(g, UID_K, io, sdpa_heads_t(k, k.KV, c3));
    CudnnDesc v = gb_tensor(g, UID_V, io, sdpa_heads(k, k.KV, c3));
    CudnnDesc o = gb_tensor(g, UID_O, io, sdpa_heads(k, k.NH, (int64_t)k.NH * k.D));
    CudnnDesc stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, sdpa_rows(k));
    CudnnDesc s = sdpa_causal_mask(g, k, sdpa_scaled_scores(g, k, q, kt, gb_scalar(g, UID_SCALE)));
    CudnnDesc mx = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_rows(k)), sum = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_rows(k));
    CudnnDesc shifted = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k)), e = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k));
    gb_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, mx);
    gb_pointwise(g, CUDNN_POINTWISE_SUB, s, mx, shifted);
    gb_pointwise(g, CUDNN_POINTWISE_EXP, shifted, NULL, e);
    gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    CudnnDesc log_sum = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_rows(k));
    gb_pointwise(g, CUDNN_POINTWISE_LOG, sum, NULL, log_sum);
    gb_pointwise(g, CUDNN_POINTWISE_ADD, mx, log_sum, stats);
    CudnnDesc p = gb_virtual(g, io, sdpa_scores(k));
    gb_pointwise(g, CUDNN_POINTWISE_DIV, e, sum, p);
    gb_matmul(g, p, v, o);
}

// out (a dK or dV of KV heads) = a @ b, summed over each group of query heads when KV < NH.
static void sdpa_grouped_matmul(GraphBuilder* g, const SdpaKey& k, cudnnDataType_t io, CudnnDesc a, CudnnDesc b, CudnnDesc out) {
    if (k.KV == k.NH) {
        gb_matmul(g, a, b, out);
        return;
    }
    CudnnDesc per_head = gb_virtual(g, io, sdpa_per_query_head(k));
    gb_matmul(g, a, b, per_head);
    gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

static void sdpa_backward_graph(GraphBuilder* g, const SdpaKey& k, cudnnDataType_t io) {
    const int64_t c3 = sdpa_c3(k), a = (int64_t)k.NH * k.D;
    CudnnDesc q = gb_tensor(g, UID_Q, io, sdpa_heads(k, k.NH, c3)), kt = gb_tensor(g, UID_K, io, sdpa_heads_t(k, k.KV, c3));
    CudnnDesc vt = gb_tensor(g, UID_V, io, sdpa_heads_t(k, k.KV, c3));
    CudnnDesc o = gb_tensor(g, UID_O, io, sdpa_heads(k, k.NH, a)), d_o = gb_tensor(g, UID_DO, io, sdpa_heads(k, k.NH, a));
    CudnnDesc stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, sdpa_rows(k));
    CudnnDesc dq = gb_tensor(g, UID_DQ, io, sdpa_heads(k, k.NH, c3)), dk = gb_tensor(g, UID_DK, io, sdpa_heads(k, k.KV, c3));
    CudnnDesc dv = gb_tensor(g, UID_DV, io, sdpa_heads(k, k.KV, c3)), scale = gb_scalar(g, UID_SCALE);
    // sum = rowsum(dO ∘ O), kept in the caller's scratch.
    // (The product's strides are those cuDNN's own description gives this virtual tensor.)
    const Dims4 prod_dims = {{k.B, k.NH, k.T, k.D}, {(int64_t)k.NH * k.T * k.D, (int64_t)k.T * k.D, a, 1}};
    CudnnDesc prod = gb_virtual(g, CUDNN_DATA_FLOAT, prod_dims), rows = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_rows(k));
    CudnnDesc sum = gb_tensor(g, UID_SUM, CUDNN_DATA_FLOAT, sdpa_rows(k));
    gb_pointwise(g, CUDNN_POINTWISE_MUL, d_o, o, prod);
    gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, prod, rows);
    gb_pointwise(g, CUDNN_POINTWISE_MUL, rows, gb_scalar(g, UID_ONE), sum);
    // P = exp(scale · Q Kᵀ - stats) under the mask; dV = Pᵀ dO.
    CudnnDesc centered = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k)), p = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k));
    gb_pointwise(g, CUDNN_POINTWISE_SUB, sdpa_scaled_scores(g, k, q, kt, scale), stats, centered);
    gb_pointwise(g, CUDNN_POINTWISE_EXP, sdpa_causal_mask(g, k, centered), NULL, p);
    CudnnDesc pt = gb_virtual(g, io, sdpa_scores_t(k));
    gb_reshape(g, p, pt);
    sdpa_grouped_matmul(g, k, io, pt, d_o, dv);
    // dS = P ∘ (dO Vᵀ - sum) · scale; dK = dSᵀ Q; dQ = dS K.
    CudnnDesc dp = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k)), dp_c = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k));
    CudnnDesc ds = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k)), ds_s = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_scores(k));
    gb_matmul(g, d_o, vt, dp);
    gb_pointwise(g, CUDNN_POINTWISE_SUB, dp, sum, dp_c);
    gb_pointwise(g, CUDNN_POINTWISE_MUL, dp_c, p, ds);
    gb_pointwise(g, CUDNN_POINTWISE_MUL, ds, scale, ds_s);
    CudnnDesc dst = gb_virtual(g, io, sdpa_scores_t(k));
    gb_reshape(g, ds_s, dst);
    sdpa_grouped_matmul(g, k, io, dst, q, dk);
    CudnnDesc kr = gb_virtual(g, CUDNN_DATA_FLOAT, sdpa_heads(k, k.KV, c3));   // fp32, as cuDNN's description has it
    gb_reshape(g, kt, kr);
    gb_matmul(g, ds_s, kr, dq);
}

// The graph of one shape and direction (k.dt bf16 or fp16); the caller destroys it (gb_destroy).
static GraphBuilder sdpa_graph(const SdpaKey& k) {
    GraphBuilder g = {};
    g.next_uid = GRAPH_FIRST_VIRTUAL_UID;
    const cudnnDataType_t io = k.dt == DT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    if (k.direction == SDPA_FORWARD) sdpa_forward_graph(&g, k, io);
    else sdpa_backward_graph(&g, k, io);
    return g;
}
