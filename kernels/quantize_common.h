// quantize_common.h: the arithmetic of block quantization shared by the CPU twin (quantize.c) and the CUDA
// kernels (quantize.cuh), so both make the same bits (kernels.h: quantize_blocks).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define QUANT_FN __host__ __device__ static inline
#else
#define QUANT_FN static inline
#endif

QUANT_FN int quant_max(int bits) { return (1 << (bits - 1)) - 1; }
// absmax over a block and whether it held a NaN or an infinity -> the block's scale.
QUANT_FN float quant_scale(float absmax, int nonfinite, int bits) { return nonfinite ? NAN : absmax / (float)quant_max(bits); }
QUANT_FN int quant_level(float x, float scale, int bits) {
    if (!(scale > 0.0f)) return 0;   // an all-zero block, or NaN
    const float q = rintf(x / scale), m = (float)quant_max(bits);
    return (int)(q > m ? m : q < -m ? -m : q);
}
// The nibble of level v (-7..7) as stored, and back.
QUANT_FN uint8_t quant_nibble(int v) { return (uint8_t)(v & 15); }
QUANT_FN int quant_from_nibble(uint8_t b) { return (b & 8) ? (int)(b & 15) - 16 : (int)(b & 15); }
QUANT_FN size_t quant_bytes(size_t n, int bits) { return bits == 4 ? (n + 1) / 2 : n; }
