// lt_autotune.cuh: the lt_autotune kernel variant (base/gpu_variants.h): lt_plan_cache's kept plans, each shape's
// algorithm the fastest of the heuristic's first few, timed once, without changing any result.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/variants/lt_plan_cache.cuh"

#define LT_TUNE_CANDIDATES 8
#define LT_TUNE_WARM 2
#define LT_TUNE_TIMED 5

// 0 as soon as cuBLASLt refuses the algorithm. A refused launch may leave a (non-sticky) launch error behind,
// which belongs to this candidate, not to whichever kernel is checked next; a sticky error survives the clear
// and is fatal at the caller's next CUDA_CHECK.
static int lt_launch_n(Backend* be, const LtPlan* p, const cublasLtMatmulAlgo_t* algo, void* dst,
                       const LtOperands* op, int times) {
    for (int i = 0; i < times; i++) {
        if (lt_launch(be, p, algo, dst, op) != CUBLAS_STATUS_SUCCESS) {
            (void)cudaGetLastError();
            return 0;
        }
    }
    return 1;
}

// Milliseconds per launch after LT_TUNE_WARM untimed ones; -1 when cuBLASLt refuses the algorithm.
static float lt_time(Backend* be, const LtPlan* p, const cublasLtMatmulAlgo_t* algo, void* dst,
                     const LtOperands* op, cudaEvent_t t0, cudaEvent_t t1) {
    if (!lt_launch_n(be, p, algo, dst, op, LT_TUNE_WARM)) return -1.0f;
    CUDA_CHECK(cudaEventRecord(t0, be_stream(be)));
    if (!lt_launch_n(be, p, algo, dst, op, LT_TUNE_TIMED)) return -1.0f;
    CUDA_CHECK(cudaEventRecord(t1, be_stream(be)));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return ms / LT_TUNE_TIMED;
}

// The index of the fastest candidate, or -1 when cuBLASLt refused them all. The choice depends on timings, so
// two runs may pick different algorithms for a shape and differ in bits (within the kernel tolerances); one run
// keeps each shape's algorithm, so it is deterministic.
// The timing launches must leave every result as it was. With beta = 0 they write the real D, which the real
// launch then rewrites whole (as it does the GELU aux and BGRADB vectors); a temporary D that size would add,
// for the LM head, the whole logits buffer to the peak. With beta != 0 they write a temporary D, counted in the
// backend's allocated and peak bytes while it lives, so C (the real output) is only read and is accumulated into
// once, by the real launch.
static int lt_tune(Backend* be, const LtPlan* p, const LtOperands* op, const cublasLtMatmulHeuristicResult_t* cand,
                   int n) {
    const size_t bytes = p->key.beta_zero ? 0 : (size_t)p->key.ldd * p->key.n * dtype_size(p->key.dt);
    void* dst = bytes ? be_device_alloc(be, bytes, "cuBLASLt autotune output") : op->d;
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    int best = -1;
    float best_ms = 0.0f;
    for (int i = 0; i < n; i++) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float ms = lt_time(be, p, &cand[i].algo, dst, op, t0, t1);
        if (ms >= 0.0f && (best < 0 || ms < best_ms)) best = i, best_ms = ms;
    }
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    if (bytes) {
        CUDA_CHECK(cudaStreamSynchronize(be_stream(be)));   // a refused candidate's earlier launches may still run
        be_device_free(be, dst, bytes);
    }
    return best;
}

// The fastest of the heuristic's first LT_TUNE_CANDIDATES algorithms; its only one where it has one.
static void lt_choose_fastest(Backend* be, LtPlan* p, const LtOperands* op) {
    cublasLtMatmulHeuristicResult_t res[LT_TUNE_CANDIDATES];
    const int found = lt_heuristic(be, p, LT_TUNE_CANDIDATES, res);
    const int best = found > 1 ? lt_tune(be, p, op, res, found) : (found > 0 ? 0 : -1);
    p->has_algo = best >= 0;
    if (p->has_algo) p->algo = res[best].algo;
}

static int lt_matmul_tuned(Backend* be, DType dt, void* d, const void* a, const void* b, int trans_a, int trans_b, int m,
                           int n, int k, int lda, int ldb, int ldd, float beta, const LtEpilogue* ep) {
    return lt_matmul_kept_by(lt_choose_fastest, be, dt, d, a, b, trans_a, trans_b, m, n, k, lda, ldb, ldd, beta, ep);
}

// Registered after lt_plan_cache (base/gpu_variants.h's order): with both named, the plans are tuned.
static void lt_autotune_register(Backend* be, KernelTable* t) {
    lt_plans_ensure(be, t);
    t->lt_matmul = lt_matmul_tuned;
}
