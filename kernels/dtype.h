// dtype.h: bit-exact conversions between fp32 and the 16-bit storage types, shared by the CPU twins and
// the CUDA kernels (HD marks them host+device under nvcc). The GPU may use its own intrinsics where they
// give the same bits (__float2bfloat16_rn is round-to-nearest-even too).
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HD __host__ __device__ __forceinline__
#else
#define HD static inline
#endif

HD uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
HD float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// bf16 = the top 16 bits of an fp32; round-to-nearest-even, NaN kept quiet.
HD uint16_t bf16_from_f32(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
HD float f32_from_bf16(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

// Stochastic rounding to bf16: add uniform noise below the kept bits, then truncate. `rand16` is 16 random
// bits; E[result] = x. Used only for parameters after the optimizer step.
HD uint16_t bf16_from_f32_stochastic(float x, uint32_t rand16) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u) return bf16_from_f32(x);   // inf / nan
    uint32_t r = u + (rand16 & 0xffffu);
    if ((r & 0x7f800000u) == 0x7f800000u) return bf16_from_f32(x);   // would overflow to inf
    return (uint16_t)(r >> 16);
}

// IEEE half, round-to-nearest-even, with subnormals and overflow to inf.
HD uint16_t fp16_from_f32(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           // nan
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          // rounds to >= 65520: inf
    if (a < 0x38800000u) {                                            // below 2^-14: subnormal half
        if (a < 0x33000000u) return (uint16_t)sign;                   // below 2^-25: zero
        uint32_t e = a >> 23;
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                                    // 14..24 : (113 - e) + 13
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((a - 0x38000000u) >> 13);                           // rebias exponent 127 -> 15
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
HD float f32_from_fp16(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return f32_from_bits(sign);
        float f = (float)m * (1.0f / 16777216.0f);                    // m * 2^-24
        return sign ? -f : f;
    }
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// A stateless 32-bit hash (lowbias32) for seeded per-element noise: the same on host and device.
HD uint32_t hash_u32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
// Noise for element `index` (a canonical parameter offset, may exceed 2^32) under `seed`.
HD uint32_t element_noise(uint32_t seed, uint64_t index) {
    return hash_u32(seed ^ hash_u32((uint32_t)index ^ hash_u32((uint32_t)(index >> 32) + 0x9e3779b9u)));
}
// LoRA's dropout (kernels.h: lora_dropout): element `index` of a matrix masked under `key` is kept when the top
// 24 bits of its noise, as a fraction in [0, 1) (exact in fp32), are not below p: kept with probability 1 - p
// (to 2^-24), each element independently of the others.
HD int dropout_keeps(uint32_t key, uint64_t index, float p) {
    return (float)(element_noise(key, index) >> 8) * (1.0f / 16777216.0f) >= p;
}
