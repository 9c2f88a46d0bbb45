// rope.c: rotary position embedding on the q and k heads of packed qkv, rotate-half convention (CPU twin).
#include <string.h>

#include "kernels/cpu_common.h"

#define ROPE_MAX_HALF 1024   // D/2 limit: one token's cos and sin live on the stack

// Rotates every q and k head of every token by +a (sign 1, the forward) or -a (sign -1, the backward, the
// transpose); out may alias inp, since each pair (i, i + D/2) is read before it is written. cos and sin depend on
// (t, i) only, so they are computed once per token and shared by its heads.
static void rope_rotate(DType dt, void* out, const void* inp, const float* inv_freq, const int* pos, int B, int T, int NH,
                        int KV, int D, float sign) {
    const int half = D / 2;
    const size_t W = (size_t)(NH + 2 * KV) * D, es = dtype_size(dt);
    if (D % 2 != 0 || half > ROPE_MAX_HALF) fail("rope: head size D=%d must be even and at most %d", D, 2 * ROPE_MAX_HALF);
#pragma omp parallel for schedule(static)
    for (long long bt = 0; bt < (long long)B * T; bt++) {
        float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
        const float t = (float)(pos ? pos[bt] : (int)(bt % T));
        for (int i = 0; i < half; i++) {
            const float a = t * inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sign * sinf(a);
        }
        for (int h = 0; h < NH + KV; h++) {
            const size_t o = (size_t)bt * W + (size_t)h * D;
            for (int i = 0; i < half; i++) {
                const float x1 = ld(inp, o + i, dt), x2 = ld(inp, o + i + half, dt);
                st(out, o + i, x1 * cs[i] - x2 * sn[i], dt);
                st(out, o + i + half, x2 * cs[i] + x1 * sn[i], dt);
            }
        }
        if (out != inp) {
            const size_t v0 = (size_t)bt * W + (size_t)(NH + KV) * D;
            memcpy((char*)out + v0 * es, (const char*)inp + v0 * es, (size_t)KV * D * es);
        }
    }
}

void rope_forward(Backend* be, DType dt, void* out, const void* inp, const float* inv_freq, const int* pos, int B, int T,
                  int NH, int KV, int D) {
    BACKEND_ENTRY(be, out, inp, inv_freq, pos);
    cpu_check_pos(pos, B, T, "rope_forward");
    rope_rotate(dt, out, inp, inv_freq, pos, B, T, NH, KV, D, 1.0f);
}

void rope_backward(Backend* be, DType dt, void* dinp, const void* dout, const float* inv_freq, const int* pos, int B,
                   int T, int NH, int KV, int D) {
    BACKEND_ENTRY(be, dinp, dout, inv_freq, pos);
    cpu_check_pos(pos, B, T, "rope_backward");
    rope_rotate(dt, dinp, dout, inv_freq, pos, B, T, NH, KV, D, -1.0f);
}
