// matmul.cuh: the linear layers through cuBLASLt, with bias / GELU / bias-gradient epilogues.
// Row-major X (rows, cols) is column-major X^T, so out (N,OC) = inp @ w^T is computed as the column-major
// D (OC,N) = (w seen as (IC,OC))^T * (inp seen as (IC,N)). Compute is always fp32
// (CUBLAS_COMPUTE_32F: no TF32, so fp32 runs match the CPU twin to fp32 rounding).
// Where cuBLASLt has no algorithm for an epilogue combination, the launcher says so in code: it runs the
// plain product and a separate kernel (gelu_forward / gelu_backward / the bias-gradient reduction); the
// GPT_CUDA_NO_FUSED_EPILOGUES hook takes those paths everywhere (the table's fused_epilogues).
// Every product goes through the kernel table's lt_matmul: by default lt_matmul_per_call below, which builds a
// call's descriptors and asks the heuristic each time; the lt_plan_cache and lt_autotune variants keep them per
// shape. matmul_backward_weight is the table's entry too (the bias_grad_epilogue variant).
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/column_sums.cuh"

static cudaDataType_t lt_type(DType dt) {
    return dt == DT_FP32 ? CUDA_R_32F : dt == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256-byte alignment unless told.
static uint32_t lt_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

struct LtEpilogue {
    const void* bias;              // epilogue bias input (BIAS epilogues) or bias-gradient output (BGRADB)
    cudaDataType_t bias_type;
    void* aux;                     // GELU_AUX output / DGELU input
    int64_t aux_ld;
    cublasLtEpilogue_t epilogue;
};

// One call's descriptor, layouts and heuristic, made and destroyed with it: the default, as it ran on the GPU
// (kernels/variants/lt_plan_cache.cuh does the same kept per shape; once a GPU run proves it, this goes).
static int lt_matmul_per_call(Backend* be, DType dt, void* d, const void* a, const void* b, int trans_a, int trans_b,
                              int m, int n, int k, int lda, int ldb, int ldd, float beta, const LtEpilogue* ep) {
    const cudaDataType_t type = lt_type(dt);
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep->epilogue,
                                                sizeof(ep->epilogue)));
    if (ep->bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep->bias,
                                                    sizeof(ep->bias)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ep->bias_type,
                                                    sizeof(ep->bias_type)));
    }
    if (ep->aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep->aux,
                                                    sizeof(ep->aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ep->aux_ld,
                                                    sizeof(ep->aux_ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, trans_a ? k : m, trans_a ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, trans_b ? n : k, trans_b ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, type, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = CUBLASLT_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al_a = lt_alignment(a), al_b = lt_alignment(b), al_d = lt_alignment(d);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));

    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    const cublasLtHandle_t lt = be_cublaslt(be);
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    int ok = 0;
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo,
                                    be_cublaslt_workspace(be), ws, be_stream(be)));
        ok = 1;
    } else if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED && hs != CUBLAS_STATUS_INVALID_VALUE) {
        // NOT_SUPPORTED / INVALID_VALUE here mean "no such combination" (seen: BGRADB with an fp32 bias
        // vector and bf16 matrices on the H100); anything else is a real error.
        CUBLAS_CHECK(hs);
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    return ok;
}

// Column-major D (m,n) = op(A) (m,k) * op(B) (k,n) [+ beta * D]. Returns 0 (having launched nothing) when
// cuBLASLt has no algorithm for this combination, so the caller can take its explicit fallback.
static int lt_matmul(Backend* be, DType dt, void* d, const void* a, const void* b, int trans_a, int trans_b, int m,
                     int n, int k, int lda, int ldb, int ldd, float beta, const LtEpilogue* ep) {
    return be_kernels(be)->lt_matmul(be, dt, d, a, b, trans_a, trans_b, m, n, k, lda, ldb, ldd, beta, ep);
}

// Bias gradient without cuBLASLt: block (32, BG_ROWS) sums column c over a fixed slice of rows into
// partial[blockIdx.y][c]; bias_grad_final_kernel (column_sums.cuh) adds the RB partials in order.
#define BG_ROWS 8
template <typename T>
__global__ void bias_grad_partial_kernel(float* partial, const T* dout, int N, int OC) {
    __shared__ float s[BG_ROWS][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int RB = gridDim.y;
    float acc = 0.0f;
    if (c < OC)
        for (int n = blockIdx.y * BG_ROWS + threadIdx.y; n < N; n += RB * BG_ROWS) acc += to_f(dout[(size_t)n * OC + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int y = 1; y < BG_ROWS; y++) acc += s[y][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + c] = acc;
    }
}

extern "C" void matmul_forward(Backend* be, DType dt, void* out, void* out_pre_gelu, const void* inp, const void* w,
                               const void* bias, int N, int IC, int OC) {
    LtEpilogue ep = {bias, lt_type(dt), NULL, 0, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT};
    if (out_pre_gelu) {
        if (be_kernels(be)->fused_epilogues) {
            LtEpilogue g = {bias, lt_type(dt), out_pre_gelu, OC,
                            bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX};
            if (lt_matmul(be, dt, out, w, inp, 1, 0, OC, N, IC, IC, IC, OC, 0.0f, &g)) return;
        }
        // Fallback: product (+bias) into out_pre_gelu, then a separate GELU pass.
        if (!lt_matmul(be, dt, out_pre_gelu, w, inp, 1, 0, OC, N, IC, IC, IC, OC, 0.0f, &ep))
            fail("matmul_forward: cuBLASLt has no algorithm for N=%d IC=%d OC=%d (%s)", N, IC, OC, dtype_name(dt));
        gelu_forward(be, dt, out, out_pre_gelu, (size_t)N * OC);
        return;
    }
    if (!lt_matmul(be, dt, out, w, inp, 1, 0, OC, N, IC, IC, IC, OC, 0.0f, &ep))
        fail("matmul_forward: cuBLASLt has no algorithm for N=%d IC=%d OC=%d (%s)", N, IC, OC, dtype_name(dt));
}

extern "C" void matmul_backward_input(Backend* be, DType dt, void* dinp, const void* dout, const void* inp_pre_gelu,
                                      const void* w, int N, int IC, int OC) {
    const bool fuse = be_kernels(be)->fused_epilogues;
    // dinp (N,IC) = dout @ w: column-major D (IC,N) = w as (IC,OC) * dout as (OC,N).
    const LtEpilogue plain = {NULL, CUDA_R_32F, NULL, 0, CUBLASLT_EPILOGUE_DEFAULT};
    int done = 0;
    if (inp_pre_gelu && fuse) {
        const LtEpilogue g = {NULL, CUDA_R_32F, (void*)inp_pre_gelu, IC, CUBLASLT_EPILOGUE_DGELU};
        done = lt_matmul(be, dt, dinp, w, dout, 0, 0, IC, N, OC, IC, OC, IC, 0.0f, &g);
    }
    if (!done) {
        if (!lt_matmul(be, dt, dinp, w, dout, 0, 0, IC, N, OC, IC, OC, IC, 0.0f, &plain))
            fail("matmul_backward: cuBLASLt has no algorithm for dinp, N=%d IC=%d OC=%d (%s)", N, IC, OC,
                 dtype_name(dt));
        // Fallback for the fused GELU backward: multiply by gelu'(pre) in a separate pass.
        if (inp_pre_gelu) gelu_backward(be, dt, dinp, inp_pre_gelu, dinp, (size_t)N * IC);
    }
}

// The table's matmul_backward_weight by default (the bias_grad_epilogue variant's takes 16-bit biased calls).
static void matmul_backward_weight_default(Backend* be, DType dt, void* dw, void* dbias, const void* dout,
                                           const void* inp, int N, int IC, int OC) {
    const bool fuse = be_kernels(be)->fused_epilogues;
    const LtEpilogue plain = {NULL, CUDA_R_32F, NULL, 0, CUBLASLT_EPILOGUE_DEFAULT};
    // dw (OC,IC) += dout^T @ inp: column-major D (IC,OC) = inp as (IC,N) * (dout as (OC,N))^T, beta = 1.
    // With BGRADB the same call also reduces op(B) = dout over N into an fp32 scratch vector, which is then
    // added to dbias (the epilogue overwrites; the contract accumulates).
    float* bias_sum = NULL;
    int done = 0;
    if (dbias && fuse) {
        bias_sum = (float*)be_scratch(be, (size_t)OC * sizeof(float), "matmul_backward dbias");
        const LtEpilogue bg = {bias_sum, CUDA_R_32F, NULL, 0, CUBLASLT_EPILOGUE_BGRADB};
        done = lt_matmul(be, dt, dw, inp, dout, 0, 1, IC, OC, N, IC, OC, IC, 1.0f, &bg);
        if (done) {
            DISPATCH_DTYPE(dt, X, {
                bias_grad_final_kernel<X><<<ceil_div(OC, 256), 256, 0, be_stream(be)>>>((X*)dbias, bias_sum, 1, OC);
                LAUNCH_CHECK();
            });
            return;
        }
    }
    if (!lt_matmul(be, dt, dw, inp, dout, 0, 1, IC, OC, N, IC, OC, IC, 1.0f, &plain))
        fail("matmul_backward: cuBLASLt has no algorithm for dw, N=%d IC=%d OC=%d (%s)", N, IC, OC, dtype_name(dt));
    if (dbias) {
        // Fallback for BGRADB: a deterministic two-pass column sum of dout.
        int RB = ceil_div(N, BG_ROWS * 16);
        const int max_rb = (int)(KERNEL_SCRATCH_BYTES / ((size_t)OC * sizeof(float)));
        if (RB > 64) RB = 64;
        if (RB > max_rb) RB = max_rb;
        if (RB < 1) fail("matmul_backward: OC=%d too large for the bias-gradient scratch", OC);
        float* partial = (float*)be_scratch(be, (size_t)RB * OC * sizeof(float), "matmul_backward dbias");
        DISPATCH_DTYPE(dt, X, {
            bias_grad_partial_kernel<X><<<dim3(ceil_div(OC, 32), RB), dim3(32, BG_ROWS), 0, be_stream(be)>>>(
                partial, (const X*)dout, N, OC);
            LAUNCH_CHECK();
            bias_grad_final_kernel<X><<<ceil_div(OC, 256), 256, 0, be_stream(be)>>>((X*)dbias, partial, RB, OC);
            LAUNCH_CHECK();
        });
    }
}

extern "C" void matmul_backward_weight(Backend* be, DType dt, void* dw, void* dbias, const void* dout, const void* inp,
                                       int N, int IC, int OC) {
    be_kernels(be)->matmul_backward_weight(be, dt, dw, dbias, dout, inp, N, IC, OC);
}

// The same launches as before the split, in the same order.
extern "C" void matmul_backward(Backend* be, DType dt, void* dinp, void* dw, void* dbias, const void* dout,
                                const void* inp, const void* inp_pre_gelu, const void* w, int N, int IC, int OC) {
    matmul_backward_input(be, dt, dinp, dout, inp_pre_gelu, w, N, IC, OC);
    matmul_backward_weight(be, dt, dw, dbias, dout, inp, N, IC, OC);
}
