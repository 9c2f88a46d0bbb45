// quantize.c: block quantization and its inverse (CPU twin; kernels.h: quantize_blocks).
#include "kernels/cpu_common.h"
#include "kernels/quantize_common.h"

size_t quantized_bytes(size_t n, int bits) { return quant_bytes(n, bits); }
size_t quantized_blocks(size_t n, int block) { return (n + (size_t)block - 1) / (size_t)block; }

static void check_args(const char* what, int block, int bits) {
    if (bits != 4 && bits != 8) fail("%s: %d bits (4 or 8)", what, bits);
    if (block < 2 || (bits == 4 && block % 2)) fail("%s: blocks of %d elements (at least 2; even for 4 bits)", what, block);
}

void quantize_blocks(Backend* be, DType dt, void* q, float* scales, const void* x, size_t n, int block, int bits) {
    BACKEND_ENTRY(be, q, scales, x);
    check_args("quantize_blocks", block, bits);
    const long long nb = (long long)quantized_blocks(n, block);
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < nb; k++) {
        const size_t lo = (size_t)k * block, hi = lo + block < n ? lo + block : n;
        float absmax = 0.0f;
        int nonfinite = 0;
        for (size_t i = lo; i < hi; i++) {
            const float a = fabsf(ld(x, i, dt));
            if (!isfinite(a)) nonfinite = 1;
            else if (a > absmax) absmax = a;
        }
        const float s = quant_scale(absmax, nonfinite, bits);
        scales[k] = s;
        if (bits == 8) {
            for (size_t i = lo; i < hi; i++) ((int8_t*)q)[i] = (int8_t)quant_level(ld(x, i, dt), s, bits);
            continue;
        }
        for (size_t i = lo; i < hi; i += 2) {
            const uint8_t low = quant_nibble(quant_level(ld(x, i, dt), s, bits));
            const uint8_t high = i + 1 < hi ? quant_nibble(quant_level(ld(x, i + 1, dt), s, bits)) : 0;
            ((uint8_t*)q)[i / 2] = (uint8_t)(low | high << 4);
        }
    }
}

void dequantize_blocks(Backend* be, DType dt, void* out, const void* q, const float* scales, size_t n, int block,
                       int bits, int add) {
    BACKEND_ENTRY(be, out, q, scales);
    check_args("dequantize_blocks", block, bits);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const int v = bits == 8 ? ((const int8_t*)q)[i] : quant_from_nibble((uint8_t)(((const uint8_t*)q)[i / 2] >> (4 * (i % 2))));
        const float y = (float)v * scales[i / (size_t)block];
        st(out, i, add ? ld(out, i, dt) + y : y, dt);
    }
}
