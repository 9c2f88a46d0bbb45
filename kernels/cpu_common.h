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

#ifdef _OPENMP
#include <omp.h>
#endif

// Per-thread scratch in a parallel region: the most threads it may have, and this thread's index (1 and 0 in
// a build without OpenMP, such as the fuzzing harnesses').
static inline int cpu_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static inline int cpu_thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// The fenced test build (-DBACKEND_FENCE: build/train_gpt_fenced, tests/system/t_fence.sh) keeps backend memory
// unreadable to the host, as a GPU's device memory is, except while a thread is inside a backend function:
// each one begins with BACKEND_ENTRY(be, its device pointers...), which lifts the fence until it returns and
// fails where one of those pointers (NULL aside) is not backend memory. So host code that touches backend
// memory without be_upload/be_download crashes there, and a kernel given host memory stops with one line,
// where the CPU build would let both pass.
#ifdef BACKEND_FENCE
Backend* be_fence_lift(Backend* be, const void* const* ptrs, size_t n, const char* func);
void be_fence_drop(Backend** be);
#define FENCE_PTRS(...) ((const void* const[]){NULL, ##__VA_ARGS__})
#define BACKEND_ENTRY(be, ...)                                                                       \
    Backend* be_fence_scope __attribute__((cleanup(be_fence_drop))) =                                \
        be_fence_lift(be, FENCE_PTRS(__VA_ARGS__), sizeof(FENCE_PTRS(__VA_ARGS__)) / sizeof(void*), __func__)
#else
#define BACKEND_ENTRY(be, ...) (void)(be)
#endif

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

// silu(x) = x * sigmoid(x); at large |x| exp overflows to inf and both give the limits (0 and x, 0 and 1).
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }
static inline float silu_grad_f(float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

// The documents' arrays (kernels.h: Documents), checked where a kernel takes them: a bad array is a loader's
// bug that would otherwise read out of bounds or silently attend across documents. NULL passes. A row's
// positions run up by one from its first token's and start again at 0 where a document starts; halfway along an
// even row a context rank's second chunk of the sequence (-cpm ring) starts afresh: ahead of the first, or,
// with documents, anywhere in the document it starts in.
static inline void cpu_check_pos(const int* pos, int B, int T, const char* who) {
    for (long long bt = 0; pos && bt < (long long)B * T; bt++) {
        const int t = (int)(bt % T), half = T % 2 == 0 && t == T / 2;
        if (pos[bt] < 0 || (t > 0 && !half && pos[bt] != 0 && pos[bt] != pos[bt - 1] + 1))
            fail("%s: pos %d at row %lld, token %d: %s", who, pos[bt], bt / T, t,
                 pos[bt] < 0 ? "negative" : "neither 0 nor one past the token before it");
    }
}
static inline void cpu_check_doc(const int* doc, int B, int T, const char* who) {
    for (long long bt = 0; doc && bt < (long long)B * T; bt++) {
        const int t = (int)(bt % T), d = doc[bt];
        if (d < 0 || d > t || (d != t && (t == 0 || doc[bt - 1] != d)))
            fail("%s: doc %d at row %lld, token %d: not the start of a contiguous document ending there", who, d,
                 bt / T, t);
    }
}
