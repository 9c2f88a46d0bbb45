// swiglu.c: SwiGLU, silu(gate) * up, from the packed [gate | up] rows one matmul makes (CPU twin).
#include "kernels/cpu_common.h"

void swiglu_forward(Backend* be, DType dt, void* out, const void* gu, int N, int F) {
    BACKEND_ENTRY(be, out, gu);
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < (long long)N * F; k++) {
        const size_t g = (size_t)(k / F) * 2 * F + (size_t)(k % F);
        st(out, (size_t)k, silu_f(ld(gu, g, dt)) * ld(gu, g + F, dt), dt);
    }
}

// d gate = dout * up * silu'(gate), d up = dout * silu(gate).
void swiglu_backward(Backend* be, DType dt, void* dgu, const void* dout, const void* gu, int N, int F) {
    BACKEND_ENTRY(be, dgu, dout, gu);
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < (long long)N * F; k++) {
        const size_t g = (size_t)(k / F) * 2 * F + (size_t)(k % F);
        const float x = ld(gu, g, dt), d = ld(dout, (size_t)k, dt);
        st(dgu, g, d * ld(gu, g + F, dt) * silu_grad_f(x), dt);
        st(dgu, g + F, d * silu_f(x), dt);
    }
}
