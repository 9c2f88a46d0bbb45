// cpu_common.h: element access and small math shared by the CPU twins (private to kernels/*.c).
// Every kernel computes in fp32 and stores through st() (host_elem.h), so bf16/fp16 buffers hold exactly the bits the
// GPU would write with round-to-nearest-even.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/host_elem.h"
#include "kernels/kernels.h"

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
