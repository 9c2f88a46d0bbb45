// cuda_bf16.h (emulator): __nv_bfloat16 and the conversions the kernels use, with the GPU's rounding:
// round to nearest even, overflow to inf, NaN -> 0x7fff (the quiet NaN CUDA's conversions give). Rounded
// by the host FPU as cuda_fp16.h's halves are (emu_fp::round_abs).
#pragma once
#include <stdint.h>
#include <string.h>

#include "cuda_fp16.h"

namespace emu_fp {

// bfloat16 of x, rounded once: the top half of the float that x rounds to with 8 significant bits.
inline uint16_t bf16_bits_from_double(double x) {
    if (x != x) return kCanonicalNan16;
    const uint16_t sign = __builtin_signbit(x) ? 0x8000u : 0u;
    const double ax = __builtin_fabs(x);
    const int e = binade(ax);
    const double r = ax >= 0x1p128 ? ax : round_abs(ax, (e < -126 ? -126 : e) - 7);   // 7 fraction bits
    if (r >= 0x1p128) return (uint16_t)(sign | 0x7f80u);
    return (uint16_t)(sign | (bits_of((float)r) >> 16));
}
inline uint16_t bf16_bits_from_float(float x) { return bf16_bits_from_double((double)x); }

inline float float_from_bf16_bits(uint16_t b) { return float_of((uint32_t)b << 16); }

}  // namespace emu_fp

struct __nv_bfloat16 {
    __nv_bfloat16() = default;
    // CUDA's conversions from and to float are implicit; these round as __float2bfloat16_rn does.
    __nv_bfloat16(float f) : __x(emu_fp::bf16_bits_from_float(f)) {}
    __nv_bfloat16(double f) : __x(emu_fp::bf16_bits_from_double(f)) {}
    __nv_bfloat16(int i) : __x(emu_fp::bf16_bits_from_double((double)i)) {}
    operator float() const { return emu_fp::float_from_bf16_bits(__x); }

    // Public (CUDA's is protected) so that GCC's -Wclass-memaccess accepts the kernels' memcpy of packs.
    unsigned short __x;
};
static_assert(sizeof(__nv_bfloat16) == 2, "__nv_bfloat16 is 2 bytes");

// As for __half: no arithmetic through float behind the kernels' back.
__nv_bfloat16 operator+(const __nv_bfloat16&, const __nv_bfloat16&) = delete;
__nv_bfloat16 operator-(const __nv_bfloat16&, const __nv_bfloat16&) = delete;
__nv_bfloat16 operator*(const __nv_bfloat16&, const __nv_bfloat16&) = delete;
__nv_bfloat16 operator/(const __nv_bfloat16&, const __nv_bfloat16&) = delete;

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) {
    __nv_bfloat16 h;
    h.__x = b;
    return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __ushort_as_bfloat16(emu_fp::bf16_bits_from_float(f)); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return emu_fp::float_from_bf16_bits(__bfloat16_as_ushort(h)); }
