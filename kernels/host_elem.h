// host_elem.h: typed element access to host memory, in fp32 arithmetic, storing exactly the bits a kernel
// stores (round-to-nearest-even through dtype.h). Shared by the CPU twins (through cpu_common.h) and host
// code that must agree with them bit for bit (the AdamW step of offloaded state, adamw_host.h).
#pragma once
#include <stddef.h>
#include <stdint.h>

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

// acc[i] += x[i] in fp32 over host memory: the same additions as convert + residual_forward on the backend.
static inline void host_accumulate(float* acc, const void* x, DType dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += ld(x, i, dt);
}
