// cpu_common.h: element access and small math shared by the CPU twins (private to kernels/*.c).
// Every kernel computes in fp32 and stores through st(), so bf16/fp16 buffers hold exactly the bits the
// GPU would write with round-to-nearest-even.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"

static inline float ld(const void* p, size_t i, DType dt) {
    switch (dt) {
    case DT_BF16: return f32_from_bf16(((const uint16_t*)p)[i]);
    case DT_FP16: return f32_from_fp16(((const uint16_t*)p)[i]);
    default: return ((const float*)p)[i];
    }
}

static inline void st(void* p, size_t i, float x, DType dt) {
    switch (dt) {
    case DT_BF16: ((uint16_t*)p)[i] = bf16_from_f32(x); break;
    case DT_FP16: ((uint16_t*)p)[i] = fp16_from_f32(x); break;
    default: ((float*)p)[i] = x; break;
    }
}

// The value st() would store, as fp32: used where a later computation must see the stored value.
static inline float round_to(float x, DType dt) {
    switch (dt) {
    case DT_BF16: return f32_from_bf16(bf16_from_f32(x));
    case DT_FP16: return f32_from_fp16(fp16_from_f32(x));
    default: return x;
    }
}

// n consecutive elements starting at element `off` into fp32.
static inline void ld_row(float* dst, const void* src, size_t off, size_t n, DType dt) {
    for (size_t i = 0; i < n; i++) dst[i] = ld(src, off + i, dt);
}

#define GELU_SCALE 0.7978845608028654f   // sqrt(2/pi)

static inline float gelu_f(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

static inline float gelu_grad_f(float x) {
    float cube = 0.044715f * x * x * x;
    float t = tanhf(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}
