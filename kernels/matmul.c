// matmul.c: out = inp @ w^T + bias with the optional fused GELU, and its backward (CPU twin).
//
// All three products go through one blocked GEMM, C (M,Nc) = A (M,K) @ B (K,Nc), where A and B are read
// through strides (so w^T and dout^T need no transposed copy) and any storage type. Operands are packed
// into fp32 tiles first: the 16-bit types are converted once per tile, and the micro-kernel streams
// contiguous memory. Every output element is produced by the same micro-kernel with an fp32 sum over k in
// increasing order, however rows are shared among threads, so results are bit-identical for any thread
// count.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

#if defined(__AVX512F__)
#define VW 16
#define MR 12
#elif defined(__AVX__)
#define VW 8
#define MR 6
#else
#define VW 4
#define MR 6
#endif
#define NR (2 * VW)   // micro-tile: MR rows x NR columns held in 2*MR vector registers
typedef float vf __attribute__((vector_size(VW * sizeof(float))));

// A strided matrix view: element (r, c) is p[r*rs + c*cs], stored as dt.
typedef struct { const void* p; size_t rs, cs; DType dt; } View;

// Called once per micro-tile with the finished fp32 sums c (MR,NR) for rows m0.. and columns j0...
typedef void (*Epilogue)(const void* ctx, int m0, int j0, int mr, int nr, const float* c);

#if defined(__AVX512F__)
#include <immintrin.h>
static inline vf splat(float x) { return (vf)_mm512_set1_ps(x); }
#elif defined(__AVX__)
#include <immintrin.h>
static inline vf splat(float x) { return (vf)_mm256_set1_ps(x); }
#else
static inline vf splat(float x) { return (vf){0} + x; }
#endif

// c (MR,NR) = ap (K,MR) packed A tile @ bp (K,NR) packed B panel.
static void micro_kernel(int K, const float* restrict ap, const float* restrict bp, float* restrict c) {
    vf acc0[MR], acc1[MR];
    for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = (vf){0};
    for (int k = 0; k < K; k++) {
        vf b0 = *(const vf*)(bp + (size_t)k * NR), b1 = *(const vf*)(bp + (size_t)k * NR + VW);
        for (int r = 0; r < MR; r++) {
            vf a = splat(ap[(size_t)k * MR + r]);
            acc0[r] += a * b0;
            acc1[r] += a * b1;
        }
    }
    for (int r = 0; r < MR; r++) {
        memcpy(c + r * NR, &acc0[r], sizeof(vf));
        memcpy(c + r * NR + VW, &acc1[r], sizeof(vf));
    }
}

// Rows m0..m0+MR of A, as (K,MR) fp32; rows past M are zero so the kernel needs no edge case. The loop
// order follows A's unit stride, so a transposed view is read one cache line at a time too.
static void pack_a(float* dst, View a, int m0, int M, int K) {
    int mr = M - m0 < MR ? M - m0 : MR;
    if (mr < MR) memset(dst, 0, sizeof(float) * K * MR);
    if (a.cs == 1) {
        for (int r = 0; r < mr; r++)
            for (int k = 0; k < K; k++) dst[(size_t)k * MR + r] = ld(a.p, (size_t)(m0 + r) * a.rs + k, a.dt);
    } else {
        for (int k = 0; k < K; k++)
            for (int r = 0; r < mr; r++) dst[(size_t)k * MR + r] = ld(a.p, (size_t)(m0 + r) * a.rs + (size_t)k * a.cs, a.dt);
    }
}

// Columns j0..j0+NR of B, as (K,NR) fp32, zero past Nc.
static void pack_b(float* dst, View b, int j0, int Nc, int K) {
    int nr = Nc - j0 < NR ? Nc - j0 : NR;
    if (nr < NR) memset(dst, 0, sizeof(float) * K * NR);
    if (b.cs == 1 && b.dt == DT_FP32 && nr == NR) {   // rows already contiguous: straight copies
        for (int k = 0; k < K; k++) memcpy(dst + (size_t)k * NR, (const float*)b.p + (size_t)k * b.rs + j0, NR * sizeof(float));
    } else if (b.cs == 1) {
        for (int k = 0; k < K; k++)
            for (int j = 0; j < nr; j++) dst[(size_t)k * NR + j] = ld(b.p, (size_t)k * b.rs + j0 + j, b.dt);
    } else {
        for (int j = 0; j < nr; j++)
            for (int k = 0; k < K; k++) dst[(size_t)k * NR + j] = ld(b.p, (size_t)(j0 + j) * b.cs + (size_t)k * b.rs, b.dt);
    }
}

static void* aligned_or_fail(size_t floats) {
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    void* p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) fail("out of host memory allocating %zu bytes for matmul packing", bytes);
    return p;
}

#define PANEL_BUDGET (32u << 20)   // bytes of packed B at a time: bounds memory for the LM head

// Rows in a block share one packed A (about 256 KiB, to stay in L2 while every panel of B passes by).
static int rows_per_block(int K) {
    int mc = (65536 / (K > 0 ? K : 1)) / MR * MR;
    return mc < MR ? MR : mc > 16 * MR ? 16 * MR : mc;
}

// Columns [j0, j1) of C: B packed once (shared), then row blocks in parallel.
static void gemm_columns(View a, View b, int M, int K, int j0, int j1, Epilogue epi, const void* ctx) {
    int npanels = (j1 - j0 + NR - 1) / NR, mc = rows_per_block(K), nblocks = (M + mc - 1) / mc;
    float* bpack = aligned_or_fail((size_t)npanels * K * NR);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < npanels; p++) pack_b(bpack + (size_t)p * K * NR, b, j0 + p * NR, j1, K);
#pragma omp parallel
    {
        float* apack = aligned_or_fail((size_t)mc * K);
        float c[MR * NR];
#pragma omp for schedule(dynamic, 1)
        for (int blk = 0; blk < nblocks; blk++) {
            int m0 = blk * mc, ntiles = ((M - m0 < mc ? M - m0 : mc) + MR - 1) / MR;
            for (int t = 0; t < ntiles; t++) pack_a(apack + (size_t)t * K * MR, a, m0 + t * MR, M, K);
            for (int p = 0; p < npanels; p++) {
                int jp = j0 + p * NR, nr = j1 - jp < NR ? j1 - jp : NR;
                for (int t = 0; t < ntiles; t++) {
                    int mt = m0 + t * MR, mr = M - mt < MR ? M - mt : MR;
                    micro_kernel(K, apack + (size_t)t * K * MR, bpack + (size_t)p * K * NR, c);
                    epi(ctx, mt, jp, mr, nr, c);
                }
            }
        }
        free(apack);
    }
    free(bpack);
}

static void gemm(View a, View b, int M, int Nc, int K, Epilogue epi, const void* ctx) {
    size_t per_col = (size_t)K * sizeof(float);
    int chunk = (int)(PANEL_BUDGET / (per_col ? per_col : 1)) / NR * NR;
    if (chunk < NR) chunk = NR;
    for (int j0 = 0; j0 < Nc; j0 += chunk) gemm_columns(a, b, M, K, j0, j0 + chunk < Nc ? j0 + chunk : Nc, epi, ctx);
}

// ---------------------------------------------------------------------------------------------------
// Epilogues.

typedef struct { DType dt; void* out; void* pre; const void* bias; int ld; } FwdCtx;

static void epi_forward(const void* vctx, int m0, int j0, int mr, int nr, const float* c) {
    const FwdCtx* x = vctx;
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            size_t o = (size_t)(m0 + r) * x->ld + j0 + j;
            float y = c[r * NR + j] + (x->bias ? ld(x->bias, j0 + j, x->dt) : 0.0f);
            if (x->pre) {
                // GELU of the stored pre-activation, so a recompute with gelu_forward gives the same bits.
                st(x->pre, o, y, x->dt);
                y = gelu_f(round_to(y, x->dt));
            }
            st(x->out, o, y, x->dt);
        }
}

typedef struct { DType dt; void* dinp; const void* pre; int ld; } DinpCtx;

static void epi_dinp(const void* vctx, int m0, int j0, int mr, int nr, const float* c) {
    const DinpCtx* x = vctx;
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            size_t o = (size_t)(m0 + r) * x->ld + j0 + j;
            float g = c[r * NR + j];
            st(x->dinp, o, x->pre ? g * gelu_grad_f(ld(x->pre, o, x->dt)) : g, x->dt);
        }
}

typedef struct { DType dt; void* dw; int ld; } DwCtx;

static void epi_dw_accumulate(const void* vctx, int m0, int j0, int mr, int nr, const float* c) {
    const DwCtx* x = vctx;
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            size_t o = (size_t)(m0 + r) * x->ld + j0 + j;
            st(x->dw, o, ld(x->dw, o, x->dt) + c[r * NR + j], x->dt);
        }
}

// ---------------------------------------------------------------------------------------------------

void matmul_forward(Backend* be, DType dt, void* out, void* out_pre_gelu, const void* inp, const void* w,
                    const void* bias, int N, int IC, int OC) {
    BACKEND_ENTRY(be, out, out_pre_gelu, inp, w, bias);
    View a = {inp, (size_t)IC, 1, dt};   // (N,IC)
    View b = {w, 1, (size_t)IC, dt};     // w^T: element (i,o) = w[o*IC + i]
    FwdCtx ctx = {dt, out, out_pre_gelu, bias, OC};
    gemm(a, b, N, OC, IC, epi_forward, &ctx);
}

// dbias (OC) += column sums of dout (N,OC); each column summed by one thread in row order.
static void dbias_accumulate(DType dt, void* dbias, const void* dout, int N, int OC) {
    enum { CH = 64 };
    int nchunks = (OC + CH - 1) / CH;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < nchunks; k++) {
        int o0 = k * CH, o1 = o0 + CH < OC ? o0 + CH : OC;
        float acc[CH] = {0};
        for (int n = 0; n < N; n++)
            for (int o = o0; o < o1; o++) acc[o - o0] += ld(dout, (size_t)n * OC + o, dt);
        for (int o = o0; o < o1; o++) st(dbias, o, ld(dbias, o, dt) + acc[o - o0], dt);
    }
}

void matmul_backward_input(Backend* be, DType dt, void* dinp, const void* dout, const void* inp_pre_gelu, const void* w,
                           int N, int IC, int OC) {
    BACKEND_ENTRY(be, dinp, dout, inp_pre_gelu, w);
    View dout_rows = {dout, (size_t)OC, 1, dt};   // (N,OC)
    View w_rows = {w, (size_t)IC, 1, dt};         // (OC,IC)
    DinpCtx dctx = {dt, dinp, inp_pre_gelu, IC};
    gemm(dout_rows, w_rows, N, IC, OC, epi_dinp, &dctx);
}

void matmul_backward_weight(Backend* be, DType dt, void* dw, void* dbias, const void* dout, const void* inp, int N, int IC,
                            int OC) {
    BACKEND_ENTRY(be, dw, dbias, dout, inp);
    View dout_t = {dout, 1, (size_t)OC, dt};      // dout^T (OC,N)
    View inp_rows = {inp, (size_t)IC, 1, dt};     // (N,IC)
    DwCtx wctx = {dt, dw, IC};
    gemm(dout_t, inp_rows, OC, IC, N, epi_dw_accumulate, &wctx);
    if (dbias) dbias_accumulate(dt, dbias, dout, N, OC);
}

void matmul_backward(Backend* be, DType dt, void* dinp, void* dw, void* dbias, const void* dout,
                     const void* inp, const void* inp_pre_gelu, const void* w, int N, int IC, int OC) {
    BACKEND_ENTRY(be, dinp, dw, dbias, dout, inp, inp_pre_gelu, w);
    matmul_backward_input(be, dt, dinp, dout, inp_pre_gelu, w, N, IC, OC);
    matmul_backward_weight(be, dt, dw, dbias, dout, inp, N, IC, OC);
}
