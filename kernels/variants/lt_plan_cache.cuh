// lt_plan_cache.cuh: the lt_plan_cache kernel variant (base/gpu_variants.h). Each cuBLASLt product's descriptor,
// layouts and algorithm (the heuristic's first, as the default's) are kept per shape, made the first time the
// shape is seen; a later call only binds its bias / aux pointers. It replaces the kernel table's lt_matmul, the
// product every matmul launcher makes (kernels/matmul.cuh). lt_autotune.cuh keeps its plans here too.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/matmul.cuh"

// Everything a call's descriptor, layouts and algorithm depend on. The pointers are not part of it, but their
// alignments are: the heuristic reads the bias and aux pointers' values to learn what alignment it may assume.
// Zeroed before it is filled and free of padding, so two keys compare with memcmp.
typedef struct {
    DType dt;
    int trans_a, trans_b, m, n, k, lda, ldb, ldd;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t bias_type;      // 0 without a bias
    int has_bias, has_aux, beta_zero;
    int64_t aux_ld;                // 0 without aux
    uint32_t al_a, al_b, al_c, al_d, al_bias, al_aux;
} LtKey;
static_assert(sizeof(LtKey) == 14 * 4 + sizeof(int64_t) + 6 * sizeof(uint32_t), "LtKey must have no padding");

// A descriptor and its layouts, with the algorithm chosen for them: one kept per key.
struct LtPlan {
    LtKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int has_algo;                  // 0: cuBLASLt has none, and a kept plan says so without asking again
};

typedef struct {
    void* d;                       // C and D of the real launch
    const void* a;
    const void* b;
    float beta;
} LtOperands;

static LtKey lt_key(DType dt, int trans_a, int trans_b, int m, int n, int k, int lda, int ldb, int ldd,
                    const LtOperands* op, const LtEpilogue* ep) {
    LtKey key;
    memset(&key, 0, sizeof(key));
    key.dt = dt;
    key.trans_a = trans_a, key.trans_b = trans_b;
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.epilogue = ep->epilogue;
    key.has_bias = ep->bias != NULL, key.has_aux = ep->aux != NULL, key.beta_zero = op->beta == 0.0f;
    if (ep->bias) key.bias_type = ep->bias_type, key.al_bias = lt_alignment(ep->bias);
    if (ep->aux) key.aux_ld = ep->aux_ld, key.al_aux = lt_alignment(ep->aux);
    key.al_a = lt_alignment(op->a), key.al_b = lt_alignment(op->b);
    key.al_c = key.al_d = lt_alignment(op->d);   // C and D are one buffer
    return key;
}

// One attribute from a variable, checked where it is set.
#define LT_DESC_SET(desc, attr, var) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &(var), sizeof(var)))
#define LT_PREF_SET(pref, attr, var) CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &(var), sizeof(var)))

static void lt_plan_create(LtPlan* p, const LtKey* key) {
    memset(p, 0, sizeof(*p));
    p->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, opa);
    LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, opb);
    LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, key->epilogue);
    if (key->has_bias) LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, key->bias_type);
    if (key->has_aux) LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key->aux_ld);
    const cudaDataType_t type = lt_type(key->dt);
    const int m = key->m, n = key->n, k = key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, type, key->trans_a ? k : m, key->trans_a ? m : k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, type, key->trans_b ? n : k, key->trans_b ? k : n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, type, m, n, key->ldd));
}

static void lt_plan_destroy(LtPlan* p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

// The only per-call attributes: a kept descriptor otherwise still points at the previous call's vectors.
static void lt_plan_bind(LtPlan* p, const LtEpilogue* ep) {
    if (ep->bias) LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ep->bias);
    if (ep->aux) LT_DESC_SET(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ep->aux);
}

// Up to `want` algorithms, cuBLASLt's estimate of the best first; 0 when it has none for this combination.
static int lt_heuristic(Backend* be, const LtPlan* p, int want, cublasLtMatmulHeuristicResult_t* res) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = CUBLASLT_WORKSPACE_BYTES;
    const LtKey* k = &p->key;
    LT_PREF_SET(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    LT_PREF_SET(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k->al_a);
    LT_PREF_SET(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k->al_b);
    LT_PREF_SET(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k->al_c);
    LT_PREF_SET(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k->al_d);
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(be_cublaslt(be), p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                                             want, res, &found);
    // NOT_SUPPORTED / INVALID_VALUE here mean "no such combination" (seen: BGRADB with an fp32 bias
    // vector and bf16 matrices on the H100); anything else is a real error.
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED && hs != CUBLAS_STATUS_INVALID_VALUE)
        CUBLAS_CHECK(hs);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return hs == CUBLAS_STATUS_SUCCESS ? found : 0;
}

// C is always the real output; D is `dst` (the real output too, except in autotune's timing launches).
static cublasStatus_t lt_launch(Backend* be, const LtPlan* p, const cublasLtMatmulAlgo_t* algo, void* dst,
                                const LtOperands* op) {
    const float alpha = 1.0f;
    return cublasLtMatmul(be_cublaslt(be), p->desc, &alpha, op->a, p->la, op->b, p->lb, &op->beta, op->d, p->ld, dst,
                          p->ld, algo, be_cublaslt_workspace(be), CUBLASLT_WORKSPACE_BYTES, be_stream(be));
}

// The backend's kept plans (the table's lt_plans).
struct LtPlans {
    LtPlan* plans;
    int n, cap;
};

static LtPlan* lt_plan_find(LtPlans* kept, const LtKey* key) {
    for (int i = 0; i < kept->n; i++)
        if (memcmp(&kept->plans[i].key, key, sizeof(*key)) == 0) return &kept->plans[i];
    return NULL;
}

// Valid until the next plan is kept (the array may move).
static LtPlan* lt_plan_keep(LtPlans* kept, const LtPlan* p) {
    if (kept->n == kept->cap) {
        kept->cap = kept->cap ? 2 * kept->cap : 32;
        kept->plans = (LtPlan*)xrealloc(kept->plans, (size_t)kept->cap * sizeof(LtPlan));
    }
    kept->plans[kept->n] = *p;
    return &kept->plans[kept->n++];
}

static void lt_plans_release(Backend* be, void* state) {
    LtPlans* kept = (LtPlans*)state;
    for (int i = 0; i < kept->n; i++) lt_plan_destroy(&kept->plans[i]);
    free(kept->plans);
    free(kept);
}

// The table's kept plans, made by the first of lt_plan_cache and lt_autotune to register.
static void lt_plans_ensure(Backend* be, KernelTable* t) {
    if (t->lt_plans) return;
    t->lt_plans = (LtPlans*)xcalloc(1, sizeof(LtPlans));
    be_on_destroy(be, lt_plans_release, t->lt_plans);
}

// Sets a fresh plan's algorithm (has_algo 0 where cuBLASLt has none).
typedef void (*LtChoose)(Backend* be, LtPlan* p, const LtOperands* op);

// The heuristic's first algorithm, the one the default launches.
static void lt_choose_first(Backend* be, LtPlan* p, const LtOperands* op) {
    cublasLtMatmulHeuristicResult_t res[1];
    p->has_algo = lt_heuristic(be, p, 1, res) > 0;
    if (p->has_algo) p->algo = res[0].algo;
}

// The key's kept plan, made (and its algorithm chosen) the first time. A plan's pointers are bound before its
// algorithm is chosen: the heuristic reads their alignment.
static int lt_matmul_kept_by(LtChoose choose, Backend* be, DType dt, void* d, const void* a, const void* b,
                             int trans_a, int trans_b, int m, int n, int k, int lda, int ldb, int ldd, float beta,
                             const LtEpilogue* ep) {
    const LtOperands op = {d, a, b, beta};
    const LtKey key = lt_key(dt, trans_a, trans_b, m, n, k, lda, ldb, ldd, &op, ep);
    LtPlans* kept = be_kernels(be)->lt_plans;
    LtPlan* p = lt_plan_find(kept, &key);
    if (p) {
        lt_plan_bind(p, ep);
    } else {
        LtPlan fresh;
        lt_plan_create(&fresh, &key);
        lt_plan_bind(&fresh, ep);
        choose(be, &fresh, &op);
        p = lt_plan_keep(kept, &fresh);
    }
    if (p->has_algo) CUBLAS_CHECK(lt_launch(be, p, &p->algo, d, &op));
    return p->has_algo;
}

static int lt_matmul_kept(Backend* be, DType dt, void* d, const void* a, const void* b, int trans_a, int trans_b, int m,
                          int n, int k, int lda, int ldb, int ldd, float beta, const LtEpilogue* ep) {
    return lt_matmul_kept_by(lt_choose_first, be, dt, d, a, b, trans_a, trans_b, m, n, k, lda, ldb, ldd, beta, ep);
}

static void lt_plan_cache_register(Backend* be, KernelTable* t) {
    lt_plans_ensure(be, t);
    t->lt_matmul = lt_matmul_kept;
}
