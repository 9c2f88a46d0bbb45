// column_sums.cuh: the second pass of the deterministic column sums (a bias gradient, RMSNorm's weight gradient):
// the first pass leaves one partial row per slice of rows in scratch, and this adds the partials of each column in
// row order to the column's value (no float atomics: the same bits every run).
#pragma once
#include "kernels/cuda_backend.cuh"

// dbias[c] (OC) += the sum of partial[r][c] over r < RB, in order. One thread per column.
template <typename T>
__global__ void bias_grad_final_kernel(T* dbias, const float* partial, int RB, int OC) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float s = 0.0f;
    for (int r = 0; r < RB; r++) s += partial[(size_t)r * OC + c];
    dbias[c] = from_f<T>(to_f(dbias[c]) + s);
}
