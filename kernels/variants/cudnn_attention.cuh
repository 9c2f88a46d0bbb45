// cudnn_attention.cuh: the cudnn_attention kernel variant (base/gpu_variants.h): causal attention through cuDNN's
// fused SDPA. It replaces the kernel table's attention_forward and attention_backward; a shape, precision or
// pointer cuDNN cannot take goes to the default (kernels/attention.cuh), and the first time a shape does so a
// note on stderr says why. A build without cuDNN refuses the variant when the backend is created.
//
// The graphs themselves are in attention_cudnn_graphs.cuh; here: a plan per shape, built the first time the
// shape is seen and kept, the workspace, and the calls. The backward's row sums go to the scratch the contract
// provides (B*NH*T floats).
//
// Bits: the plans come from engines without cuDNN's NONDETERMINISTIC note where one exists (no atomics: the same
// bits every run); where only an engine with atomics exists, it runs, and a note on stderr says so. cuDNN's
// rounding differs from the CPU twin's within the bf16/fp16 tolerances; fp32 runs never come here (cuDNN's fused
// attention is 16-bit).
// Plans are built once per shape and kept; the workspace is one device buffer, grown to the largest plan's need
// and counted in the backend's bytes.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/attention.cuh"
#ifdef GPT_CUDNN
#include <float.h>

#include "kernels/attention_cudnn_graphs.cuh"

struct SdpaEntry {
    SdpaKey key;
    CudnnPlan plan;   // plan.plan NULL: this shape runs the backend's own kernels
};

struct CudnnAttention {
    cudnnHandle_t handle;
    SdpaEntry* entries;
    int n, cap;
    void* workspace;
    size_t workspace_bytes;
};

static CudnnAttention* cudnn_attention_create(Backend* be) {
    const size_t version = cudnnGetVersion();
    if (version < 90000)
        fail("cudnn_attention: the cuDNN library loaded is %zu.%zu, the variant needs 9.0 or newer", version / 10000,
             version / 100 % 100);
    CudnnAttention* ca = (CudnnAttention*)xcalloc(1, sizeof(CudnnAttention));
    CUDNN_CHECK(cudnnCreate(&ca->handle));
    CUDNN_CHECK(cudnnSetStream(ca->handle, be_stream(be)));
    return ca;
}

static void cudnn_attention_release(Backend* be, void* state) {
    CudnnAttention* ca = (CudnnAttention*)state;
    for (int i = 0; i < ca->n; i++) cudnn_plan_destroy(&ca->entries[i].plan);
    if (ca->workspace) be_device_free(be, ca->workspace, ca->workspace_bytes);
    CUDNN_CHECK(cudnnDestroy(ca->handle));
    free(ca->entries);
    free(ca);
}

// ---------------------------------------------------------------------------------------------------

static bool sdpa_key_equal(const SdpaKey& a, const SdpaKey& b) { return !memcmp(&a, &b, sizeof a); }

// Why this backend's kernels must take the shape without asking cuDNN, or NULL. (The cuDNN versions and shapes
// cuDNN's own frontend refuses for this graph, or works around with a padding mask this graph does not have.)
static const char* sdpa_unsupported(const SdpaKey& k) {
    const size_t version = cudnnGetVersion();
    if (k.dt == DT_FP32) return "fp32 (cuDNN's fused attention is 16-bit)";
    if (!k.aligned) return "a tensor's memory is not 16-byte aligned";
    if (version >= 91000 && version < 91002) return "cuDNN 9.10.0 and 9.10.1 have known faults in 16-bit attention";
    if (k.direction == SDPA_BACKWARD && k.T == 1) return "T = 1 (cuDNN's backward needs two or more)";
    if (k.direction == SDPA_BACKWARD && version <= 91500 && k.T % 128 != 0)
        return "T not a multiple of 128 (cuDNN 9.15 and older)";
    return NULL;
}

static const char* sdpa_direction_name(const SdpaKey& k) { return k.direction == SDPA_FORWARD ? "forward" : "backward"; }

// A plan whose workspace would take more than half the device memory free now is refused: the built-in kernels
// need none, and the allocation would fail the run instead.
static bool sdpa_workspace_fits(const CudnnPlan& plan, char* why, size_t size) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if ((size_t)plan.workspace <= free_b / 2) return true;
    snprintf(why, size, "its workspace of %.2f GiB exceeds half the %.2f GiB free", plan.workspace / 1073741824.0,
             free_b / 1073741824.0);
    return false;
}

// The shape's plan: from an engine without atomics where one exists, else (noted on stderr) one with them; a NULL
// plan (noted too, with the reason) when cuDNN has none or the shape is refused.
static CudnnPlan sdpa_build(CudnnAttention* ca, const SdpaKey& k) {
    CudnnPlan plan = {};
    char why[256] = "";
    const char* refused = sdpa_unsupported(k);
    if (!refused) {
        GraphBuilder g = sdpa_graph(k);
        if (gb_plan(&g, ca->handle, &plan, why, sizeof why) && !sdpa_workspace_fits(plan, why, sizeof why))
            cudnn_plan_destroy(&plan);
        gb_destroy(&g);
        refused = why;
    }
    if (plan.plan && plan.nondeterministic)
        fprintf(stderr, "note: cudnn_attention: %s B=%d T=%d NH=%d KV=%d D=%d %s: no deterministic cuDNN engine; one "
                "with atomics runs it (runs may differ in the last bits)\n", sdpa_direction_name(k), k.B, k.T, k.NH, k.KV,
                k.D, dtype_name((DType)k.dt));
    if (!plan.plan)
        fprintf(stderr, "note: cudnn_attention: %s B=%d T=%d NH=%d KV=%d D=%d %s runs this backend's kernels: %s\n",
                sdpa_direction_name(k), k.B, k.T, k.NH, k.KV, k.D, dtype_name((DType)k.dt), refused);
    return plan;
}

// The shape's plan, built the first time it is asked for (NULL plan: not through cuDNN).
static const CudnnPlan* sdpa_plan(CudnnAttention* ca, const SdpaKey& k) {
    for (int i = 0; i < ca->n; i++)
        if (sdpa_key_equal(ca->entries[i].key, k)) return &ca->entries[i].plan;
    if (ca->n == ca->cap) {
        ca->cap = ca->cap ? 2 * ca->cap : 8;
        ca->entries = (SdpaEntry*)realloc(ca->entries, (size_t)ca->cap * sizeof(SdpaEntry));
        if (!ca->entries) fail("out of host memory for cuDNN attention plans");
    }
    SdpaEntry* e = &ca->entries[ca->n++];
    e->key = k;
    e->plan = sdpa_build(ca, k);
    return &e->plan;
}

// The workspace, grown (after the streams drain: kernels may still use the old one) to hold `bytes`.
static void* sdpa_workspace(Backend* be, CudnnAttention* ca, int64_t bytes) {
    if ((size_t)bytes <= ca->workspace_bytes) return ca->workspace;
    if (ca->workspace) {
        be_synchronize(be);
        be_device_free(be, ca->workspace, ca->workspace_bytes);
    }
    ca->workspace = be_device_alloc(be, (size_t)bytes, "cuDNN attention workspace");
    ca->workspace_bytes = (size_t)bytes;
    return ca->workspace;
}

static bool sdpa_aligned(const void* p) { return ((uintptr_t)p & 15) == 0; }

// The plan for this call, or NULL (the default runs it). Every tensor of the call is in qkv, in
// other (out, or dqkv) or in the row-major buffers d1, d2 (the backward's dout and out; NULL in the forward), with
// heads at multiples of D elements, so those base pointers' alignment is the call's.
static const CudnnPlan* sdpa_for_call(Backend* be, int direction, DType dt, int B, int T, int NH, int KV, int D,
                                      const void* qkv, const void* other, const void* d1, const void* d2) {
    const bool aligned = sdpa_aligned(qkv) && sdpa_aligned(other) && sdpa_aligned(d1) && sdpa_aligned(d2) &&
                         ((size_t)D * dtype_size(dt)) % 16 == 0;
    const SdpaKey k = {direction, (int)dt, B, T, NH, KV, D, aligned};
    const CudnnPlan* p = sdpa_plan(be_kernels(be)->cudnn, k);
    return p->plan ? p : NULL;
}

// The masked scores' value: cuDNN before 9.10 wants the lowest float there, later versions -inf (as its frontend).
static float sdpa_mask_value(void) { return cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY; }

// cuDNN's causal mask cannot express documents: a call with doc runs the default's kernels.
static void cudnn_attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, const int* doc, int B,
                                    int T, int NH, int KV, int D) {
    const CudnnPlan* p = doc ? NULL : sdpa_for_call(be, SDPA_FORWARD, dt, B, T, NH, KV, D, qkv, out, NULL, NULL);
    if (!p) {
        attention_forward_default(be, dt, out, lse, qkv, doc, B, T, NH, KV, D);
        return;
    }
    CudnnAttention* ca = be_kernels(be)->cudnn;
    const size_t es = dtype_size(dt);
    float scale = 1.0f / sqrtf((float)D), neg_inf = sdpa_mask_value();
    char* base = (char*)qkv;
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void* ptrs[] = {base, base + (size_t)NH * D * es, base + (size_t)(NH + KV) * D * es, out, lse, &scale, &neg_inf};
    cudnn_execute(ca->handle, p, 7, uids, ptrs, sdpa_workspace(be, ca, p->workspace));
}

static void cudnn_attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                                     const void* out, const float* lse, const int* doc, int B, int T, int NH, int KV,
                                     int D) {
    const CudnnPlan* p = doc ? NULL : sdpa_for_call(be, SDPA_BACKWARD, dt, B, T, NH, KV, D, qkv, dqkv, dout, out);
    if (!p) {
        attention_backward_default(be, dt, dqkv, scratch, dout, qkv, out, lse, doc, B, T, NH, KV, D);
        return;
    }
    CudnnAttention* ca = be_kernels(be)->cudnn;
    const size_t es = dtype_size(dt), k_off = (size_t)NH * D * es, v_off = (size_t)(NH + KV) * D * es;
    float scale = 1.0f / sqrtf((float)D), neg_inf = sdpa_mask_value(), one = 1.0f;
    char *base = (char*)qkv, *dbase = (char*)dqkv;
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV, UID_SUM,
                            UID_SCALE, UID_NEG_INF, UID_ONE};
    void* ptrs[] = {base, base + k_off, base + v_off, (void*)out, (void*)dout, (void*)lse, dbase, dbase + k_off,
                    dbase + v_off, scratch, &scale, &neg_inf, &one};
    cudnn_execute(ca->handle, p, 13, uids, ptrs, sdpa_workspace(be, ca, p->workspace));
}

static void cudnn_attention_register(Backend* be, KernelTable* t) {
    t->cudnn = cudnn_attention_create(be);
    be_on_destroy(be, cudnn_attention_release, t->cudnn);
    t->attention_forward = cudnn_attention_forward;
    t->attention_backward = cudnn_attention_backward;
}

#else

static void cudnn_attention_register(Backend* be, KernelTable* t) {
    fail("GPT_CUDA_VARIANTS names cudnn_attention, but this train_gpt was built without cuDNN (make CUDNN=1 CUDNN_HOME=DIR)");
}

#endif
