// cuda_fp16.h (emulator): __half and the conversions the kernels use, with the GPU's rounding: round to
// nearest even, fp16 subnormals, overflow to inf, NaN -> 0x7fff (the quiet NaN CUDA's conversions give).
// The rounding is done by the host FPU (see emu_fp::round_abs) rather than by kernels/dtype.h's integer
// code, so the comparison of the two in tests/emu/test_ptx.cpp checks one against an independent other.
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "the emulator's fp16/bf16 rounding needs IEEE arithmetic: build without -ffast-math"
#endif

namespace emu_fp {

inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline double double_of(uint64_t u) {
    double x;
    memcpy(&x, &u, 8);
    return x;
}

// ax (>= 0, exactly a double) rounded to the nearest multiple of 2^s, ties to the even multiple. Adding
// 2^(s+52) moves the sum into the binade whose spacing is 2^s, where the FPU's round-to-nearest-even
// rounds it; subtracting 2^(s+52) again is exact. Needs ax < 2^(s+52) and -1022 <= s+52 <= 1023.
inline double round_abs(double ax, int s) {
    const double big = double_of((uint64_t)(s + 52 + 1023) << 52);
    return (ax + big) - big;
}

// The exponent of the binade of a finite |x| (0 and every subnormal double count as -1022; callers clamp it
// far higher).
inline int binade(double ax) {
    uint64_t u;
    memcpy(&u, &ax, 8);
    const int field = (int)((u >> 52) & 0x7ffu);
    return field ? field - 1023 : -1022;
}

const uint16_t kCanonicalNan16 = 0x7fffu;

// IEEE half of x, rounded once (a double converts as exactly as a float does).
inline uint16_t half_bits_from_double(double x) {
    if (x != x) return kCanonicalNan16;
    const uint16_t sign = __builtin_signbit(x) ? 0x8000u : 0u;
    const double ax = __builtin_fabs(x);
    if (ax >= 0x1p16) return (uint16_t)(sign | 0x7c00u);   // beyond the largest finite half's rounding range
    const int e = binade(ax);
    const double r = round_abs(ax, (e < -14 ? -14 : e) - 10);   // 10 fraction bits; subnormal below 2^-14
    if (r > 65504.0) return (uint16_t)(sign | 0x7c00u);
    if (r < 0x1p-14) return (uint16_t)(sign | (uint16_t)(r * 0x1p24));   // a whole number of 2^-24
    const uint32_t rb = bits_of((float)r);
    return (uint16_t)(sign | ((((rb >> 23) - 112u) << 10) | ((rb >> 13) & 0x3ffu)));
}
inline uint16_t half_bits_from_float(float x) { return half_bits_from_double((double)x); }

inline float float_from_half_bits(uint16_t h) {
    const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
    const uint32_t field = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
    if (field == 0x1f) {
        if (frac == 0) return sign * __builtin_inff();
        return float_of(((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | (frac << 13));
    }
    if (field == 0) return sign * (float)frac * 0x1p-24f;
    return sign * (float)(frac | 0x400u) * float_of((field + 127u - 25u) << 23);   // (1.frac) * 2^(field-15)
}

}  // namespace emu_fp

struct __half {
    __half() = default;
    // CUDA's conversions from and to float are implicit; these round as __float2half_rn does.
    __half(float f) : __x(emu_fp::half_bits_from_float(f)) {}
    __half(double f) : __x(emu_fp::half_bits_from_double(f)) {}
    __half(int i) : __x(emu_fp::half_bits_from_double((double)i)) {}
    operator float() const { return emu_fp::float_from_half_bits(__x); }

    // Public (CUDA's is protected) so that GCC's -Wclass-memaccess accepts the kernels' memcpy of packs.
    unsigned short __x;
};
static_assert(sizeof(__half) == 2, "__half is 2 bytes");

// Without these, h1 + h2 would compile to float arithmetic (a float, rounded again where it is stored), not
// CUDA's half arithmetic; the kernels convert explicitly (to_f / from_f), so such a use is a compile error.
__half operator+(const __half&, const __half&) = delete;
__half operator-(const __half&, const __half&) = delete;
__half operator*(const __half&, const __half&) = delete;
__half operator/(const __half&, const __half&) = delete;

inline __half __ushort_as_half(unsigned short b) {
    __half h;
    h.__x = b;
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __float2half_rn(float f) { return __ushort_as_half(emu_fp::half_bits_from_float(f)); }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return emu_fp::float_from_half_bits(__half_as_ushort(h)); }
