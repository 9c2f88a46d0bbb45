// gelu.c: GELU (tanh approximation) and the residual add (CPU twins).
#include "kernels/cpu_common.h"

void residual_forward(Backend* be, DType dt, void* out, const void* a, const void* b, size_t n) {
    BACKEND_ENTRY(be, out, a, b);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(out, i, ld(a, i, dt) + ld(b, i, dt), dt);
}

void gelu_forward(Backend* be, DType dt, void* out, const void* inp, size_t n) {
    BACKEND_ENTRY(be, out, inp);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(out, i, gelu_f(ld(inp, i, dt)), dt);
}

void gelu_backward(Backend* be, DType dt, void* dinp, const void* inp, const void* dout, size_t n) {
    BACKEND_ENTRY(be, dinp, inp, dout);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dinp, i, ld(dout, i, dt) * gelu_grad_f(ld(inp, i, dt)), dt);
}
