// rope.cuh: rotary position embedding on the q and k heads of packed qkv, rotate-half convention.
// One thread per (token, channel i < D/2): cos and sin depend on (t, i) only, so each thread computes them once
// (the accurate cosf/sinf, as the CPU twin's libm) and rotates pair (i, i + D/2) of every q and k head of its
// token. Each pair is read before it is written by the one thread that owns it, so out may alias inp.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/qkv_copy.cuh"

template <typename X>
__global__ void rope_kernel(X* out, const X* inp, const float* inv_freq, long long pairs, int T, int heads, int D,
                            size_t W, float sign) {
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= pairs) return;
    const int half = D / 2, i = (int)(g % half);
    const long long bt = g / half;
    const float a = (float)(int)(bt % T) * inv_freq[i];
    const float c = cosf(a), s = sign * sinf(a);
    for (int h = 0; h < heads; h++) {
        const size_t o = (size_t)bt * W + (size_t)h * D + i;
        const float x1 = to_f(inp[o]), x2 = to_f(inp[o + half]);
        out[o] = from_f<X>(x1 * c - x2 * s);
        out[o + half] = from_f<X>(x2 * c + x1 * s);
    }
}

// sign 1: the forward (rotation by +a); -1: the backward (by -a, the transpose).
static void rope_rotate(Backend* be, DType dt, void* out, const void* inp, const float* inv_freq, int B, int T, int NH,
                        int KV, int D, float sign, const char* who) {
    if (D % 2 != 0) fail("%s: head size D=%d must be even", who, D);
    const long long pairs = (long long)B * T * (D / 2);
    if (pairs > 0) {
        const int block = 256;
        DISPATCH_DTYPE(dt, X, {
            rope_kernel<X><<<ceil_div(pairs, block), block, 0, be_stream(be)>>>(
                (X*)out, (const X*)inp, inv_freq, pairs, T, NH + KV, D, (size_t)(NH + 2 * KV) * D, sign);
            LAUNCH_CHECK();
        });
    }
    if (out != inp) qkv_copy_v(be, dt, out, inp, B * T, NH, KV, D);
}

extern "C" void rope_forward(Backend* be, DType dt, void* out, const void* inp, const float* inv_freq, const int* pos,
                             int B, int T, int NH, int KV, int D) {
    if (pos) fail("rope_forward: positions (pos) are not yet supported by the CUDA kernels");
    rope_rotate(be, dt, out, inp, inv_freq, B, T, NH, KV, D, 1.0f, "rope_forward");
}

extern "C" void rope_backward(Backend* be, DType dt, void* dinp, const void* dout, const float* inv_freq,
                              const int* pos, int B, int T, int NH, int KV, int D) {
    if (pos) fail("rope_backward: positions (pos) are not yet supported by the CUDA kernels");
    rope_rotate(be, dt, dinp, dout, inv_freq, B, T, NH, KV, D, -1.0f, "rope_backward");
}
