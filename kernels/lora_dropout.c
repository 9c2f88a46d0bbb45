// lora_dropout.c: LoRA's dropout on the adapters' input (CPU twin; kernels.h).
#include "kernels/cpu_common.h"

void lora_dropout(Backend* be, DType dt, void* out, const void* inp, int N, int C, int col0, int width, uint32_t key,
                  float p) {
    BACKEND_ENTRY(be, out, inp);
    const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)n * C + c;
            const uint64_t index = (uint64_t)n * (uint64_t)width + (uint64_t)(col0 + c);
            st(out, i, dropout_keeps(key, index, p) ? ld(inp, i, dt) * scale : 0.0f, dt);
        }
}
