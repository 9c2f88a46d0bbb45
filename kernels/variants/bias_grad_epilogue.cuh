// bias_grad_epilogue.cuh: the bias_grad_epilogue kernel variant (base/gpu_variants.h). In 16-bit runs dw and dbias
// come from one cuBLASLt call, BGRADB reducing op(B) = dout over N into a scratch vector in the storage type, then
// one small kernel adds it to dbias (the epilogue overwrites; the contract accumulates). cuBLASLt rejects an fp32
// vector with 16-bit matrices (seen on the H100), which the default asks first. The sum is rounded to 16 bits
// before the add, where the CPU twin adds the fp32 sum and rounds once: within the 16-bit runs' 1e-2 tolerance.
// It replaces the kernel table's matmul_backward_weight; fp32, calls without a bias, the unfused test hook and
// products cuBLASLt has no algorithm for go to the default (kernels/matmul.cuh).
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/matmul.cuh"

// dbias += the storage-type vector BGRADB wrote.
template <typename T>
__global__ void bias_grad_add_kernel(T* dbias, const T* sum, int OC) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < OC) dbias[c] = from_f<T>(to_f(dbias[c]) + to_f(sum[c]));
}

// 0, having launched nothing, where cuBLASLt has no algorithm.
static int bias_grad_epilogue_lowp(Backend* be, DType dt, void* dw, void* dbias, const void* dout, const void* inp,
                                   int N, int IC, int OC) {
    void* sum = be_scratch(be, (size_t)OC * dtype_size(dt), "matmul_backward dbias");
    const LtEpilogue bg = {sum, lt_type(dt), NULL, 0, CUBLASLT_EPILOGUE_BGRADB};
    if (!lt_matmul(be, dt, dw, inp, dout, 0, 1, IC, OC, N, IC, OC, IC, 1.0f, &bg)) return 0;
    DISPATCH_DTYPE(dt, X, {
        bias_grad_add_kernel<X><<<ceil_div(OC, 256), 256, 0, be_stream(be)>>>((X*)dbias, (const X*)sum, OC);
        LAUNCH_CHECK();
    });
    return 1;
}

static void matmul_backward_weight_bias_epilogue(Backend* be, DType dt, void* dw, void* dbias, const void* dout,
                                                 const void* inp, int N, int IC, int OC) {
    if (dbias && be_kernels(be)->fused_epilogues && dt != DT_FP32 &&
        bias_grad_epilogue_lowp(be, dt, dw, dbias, dout, inp, N, IC, OC))
        return;
    matmul_backward_weight_default(be, dt, dw, dbias, dout, inp, N, IC, OC);
}

static void bias_grad_epilogue_register(Backend* be, KernelTable* t) {
    t->matmul_backward_weight = matmul_backward_weight_bias_epilogue;
}
