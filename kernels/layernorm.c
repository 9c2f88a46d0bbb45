// layernorm.c: LayerNorm over the last dimension (CPU twin). eps = 1e-5.
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

void layernorm_forward(Backend* be, DType dt, void* out, float* mean, float* rstd, const void* inp,
                       const void* w, const void* b, int N, int C) {
    BACKEND_ENTRY(be, out, mean, rstd, inp, w, b);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        // Two passes in double: the variance never suffers cancellation, and the saved stats are exact
        // to fp32 so the backward and any recompute see the same numbers.
        double s = 0.0, ss = 0.0;
        for (int c = 0; c < C; c++) s += ld(inp, o + c, dt);
        double mu = s / C;
        for (int c = 0; c < C; c++) {
            double d = ld(inp, o + c, dt) - mu;
            ss += d * d;
        }
        float m = (float)mu, r = (float)(1.0 / sqrt(ss / C + 1e-5));
        for (int c = 0; c < C; c++) st(out, o + c, (ld(inp, o + c, dt) - m) * r * ld(w, c, dt) + ld(b, c, dt), dt);
        mean[n] = m;
        rstd[n] = r;
    }
}

// dinp of one row: (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, with dnorm = dout * w.
static void layernorm_row_dinp(DType dt, void* dinp, const void* dout, const void* inp, const void* w,
                               float m, float r, size_t o, int C) {
    float s = 0.0f, sn = 0.0f;
    for (int c = 0; c < C; c++) {
        float dn = ld(dout, o + c, dt) * ld(w, c, dt);
        s += dn;
        sn += dn * (ld(inp, o + c, dt) - m) * r;
    }
    s /= C;
    sn /= C;
    for (int c = 0; c < C; c++) {
        float norm = (ld(inp, o + c, dt) - m) * r;
        float g = (ld(dout, o + c, dt) * ld(w, c, dt) - s - norm * sn) * r;
        st(dinp, o + c, ld(dinp, o + c, dt) + g, dt);
    }
}

#define LN_CHUNK 64   // channels per task of the dw/db column sums

void layernorm_backward(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                        const void* inp, const void* w, const float* mean, const float* rstd, int N, int C) {
    BACKEND_ENTRY(be, dinp, dw, db, dout, inp, w, mean, rstd);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) layernorm_row_dinp(dt, dinp, dout, inp, w, mean[n], rstd[n], (size_t)n * C, C);
    // dw and db are column sums over rows: each channel is summed by one thread in row order, so the bits
    // do not depend on the thread count.
    int nchunks = (C + LN_CHUNK - 1) / LN_CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunks; k++) {
        int c0 = k * LN_CHUNK, c1 = c0 + LN_CHUNK < C ? c0 + LN_CHUNK : C;
        float aw[LN_CHUNK] = {0}, ab[LN_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            size_t o = (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                float d = ld(dout, o + c, dt);
                aw[c - c0] += d * (ld(inp, o + c, dt) - mean[n]) * rstd[n];
                ab[c - c0] += d;
            }
        }
        for (int c = c0; c < c1; c++) {
            st(dw, c, ld(dw, c, dt) + aw[c - c0], dt);
            st(db, c, ld(db, c, dt) + ab[c - c0], dt);
        }
    }
}
