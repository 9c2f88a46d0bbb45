// cudnn_graph.cuh: a small layer over cuDNN's backend graph API (cudnn_graph.h), enough to describe a fused
// operation graph (tensors, pointwise ops, reductions, matmuls, reshapes), turn it into an execution plan and run
// it. The graph API is what cuDNN's fused attention is reached through: its engines recognize a graph of plain
// operations as one fused kernel. Included by attention_cudnn_graphs.cuh only (built with cuDNN: -DGPT_CUDNN).
//
// A GraphBuilder owns every descriptor it creates and destroys them with itself; a finished plan (CudnnPlan)
// holds only the execution plan, which cuDNN keeps valid without the graph it came from.
#pragma once
#include <cudnn.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/common.h"

// Building a descriptor fails only on a programming error (a wrong attribute or type): fatal, naming the call.
#define CUDNN_CHECK(call)                                                                                \
    do {                                                                                                 \
        cudnnStatus_t s_ = (call);                                                                       \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                                  \
            fail("cuDNN error at %s:%d: %s (%s)", __FILE__, __LINE__, cudnnGetErrorString(s_), #call);   \
    } while (0)

typedef cudnnBackendDescriptor_t CudnnDesc;

// Dimensions and strides of a 4-d tensor, outermost first, in elements.
struct Dims4 {
    int64_t dim[4], stride[4];
};

#define GRAPH_MAX_DESCS 96
#define GRAPH_MAX_OPS 48
#define GRAPH_FIRST_VIRTUAL_UID 1000   // uids below are the caller's tensors

struct GraphBuilder {
    CudnnDesc owned[GRAPH_MAX_DESCS];
    int n_owned;
    CudnnDesc ops[GRAPH_MAX_OPS];
    int n_ops;
    int64_t next_uid;
};

static CudnnDesc gb_new(GraphBuilder* g, cudnnBackendDescriptorType_t type) {
    if (g->n_owned == GRAPH_MAX_DESCS) fail("cuDNN graph: more than %d descriptors", GRAPH_MAX_DESCS);
    CudnnDesc d;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
    g->owned[g->n_owned++] = d;
    return d;
}

static void cd_set(CudnnDesc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                   const void* value) {
    CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, count, value));
}

static void gb_destroy(GraphBuilder* g) {
    for (int i = 0; i < g->n_owned; i++) CUDNN_CHECK(cudnnBackendDestroyDescriptor(g->owned[i]));
    g->n_owned = g->n_ops = 0;
}

// A tensor: one of the caller's (uid < GRAPH_FIRST_VIRTUAL_UID, 16-byte aligned memory passed at execution),
// a virtual one (an intermediate that lives only inside the fused kernel), or a scalar passed by value.
static CudnnDesc gb_tensor_full(GraphBuilder* g, int64_t uid, cudnnDataType_t type, Dims4 d, bool is_virtual,
                                bool by_value) {
    CudnnDesc t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    cd_set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    cd_set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, d.dim);
    cd_set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, d.stride);
    cd_set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    cd_set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    cd_set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) cd_set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    CUDNN_CHECK(cudnnBackendFinalize(t));
    return t;
}
static CudnnDesc gb_tensor(GraphBuilder* g, int64_t uid, cudnnDataType_t type, Dims4 d) {
    return gb_tensor_full(g, uid, type, d, false, false);
}
static CudnnDesc gb_virtual(GraphBuilder* g, cudnnDataType_t type, Dims4 d) {
    return gb_tensor_full(g, g->next_uid++, type, d, true, false);
}
static CudnnDesc gb_scalar(GraphBuilder* g, int64_t uid) {
    const Dims4 one = {{1, 1, 1, 1}, {1, 1, 1, 1}};
    return gb_tensor_full(g, uid, CUDNN_DATA_FLOAT, one, false, true);
}

static void gb_add_op(GraphBuilder* g, CudnnDesc op) {
    if (g->n_ops == GRAPH_MAX_OPS) fail("cuDNN graph: more than %d operations", GRAPH_MAX_OPS);
    CUDNN_CHECK(cudnnBackendFinalize(op));
    g->ops[g->n_ops++] = op;
}

// y = mode(x [, b [, t]]) elementwise, computed in `prec`; b and t broadcast (NULL when the mode takes fewer).
// axis >= 0 only for GEN_INDEX (y = the index along that dimension).
static void gb_pointwise_axis(GraphBuilder* g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, CudnnDesc x, CudnnDesc b,
                              CudnnDesc t, CudnnDesc y, int64_t axis) {
    CudnnDesc pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cd_set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    cd_set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) cd_set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    CUDNN_CHECK(cudnnBackendFinalize(pw));
    CudnnDesc op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    cd_set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    cd_set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) cd_set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) cd_set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    cd_set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_add_op(g, op);
}
static void gb_pointwise(GraphBuilder* g, cudnnPointwiseMode_t mode, CudnnDesc x, CudnnDesc b, CudnnDesc y) {
    gb_pointwise_axis(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
}

// y = the reduction of x onto y's dimensions: over those where y has extent 1, and over groups of x's entries
// where y's extent divides x's (heads (hk g) -> hk).
static void gb_reduction(GraphBuilder* g, cudnnReduceTensorOp_t mode, CudnnDesc x, CudnnDesc y) {
    CudnnDesc r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cd_set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    cd_set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    CUDNN_CHECK(cudnnBackendFinalize(r));
    CudnnDesc op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cd_set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    cd_set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    cd_set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_add_op(g, op);
}

// c (.., M, N) = a (.., M, K) @ b (.., K, N), batched over the leading dimensions (b broadcasts over a's heads
// when it has fewer: grouped-query attention), fp32 accumulation.
static void gb_matmul(GraphBuilder* g, CudnnDesc a, CudnnDesc b, CudnnDesc c) {
    CudnnDesc mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cd_set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    CUDNN_CHECK(cudnnBackendFinalize(mm));
    CudnnDesc op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cd_set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    cd_set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    cd_set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    cd_set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    gb_add_op(g, op);
}

// y = x seen with y's dimensions and strides (a transpose, when the strides swap).
static void gb_reshape(GraphBuilder* g, CudnnDesc x, CudnnDesc y) {
    CudnnDesc op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    cd_set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    cd_set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_add_op(g, op);
}

// ---------------------------------------------------------------------------------------------------
// From a graph to a plan. Whether cuDNN can run a graph is known only here (the graph's finalize, the heuristic's
// engine configurations, each plan's finalize): a status other than success is an answer ("not for this graph"),
// reported through `why`, not an error.

struct CudnnPlan {
    CudnnDesc plan;          // NULL: cuDNN has no engine for the graph
    CudnnDesc config;        // the engine configuration it was made from, kept as long as the plan
    int64_t workspace;       // bytes the plan needs at execution
    bool nondeterministic;   // its engine carries cuDNN's NONDETERMINISTIC note (atomics)
};

static void cudnn_plan_destroy(CudnnPlan* p) {
    if (p->plan) CUDNN_CHECK(cudnnBackendDestroyDescriptor(p->plan));
    if (p->config) CUDNN_CHECK(cudnnBackendDestroyDescriptor(p->config));
    p->plan = p->config = NULL;
}

static bool cudnn_answer(cudnnStatus_t s, const char* what, char* why, size_t size) {
    if (s == CUDNN_STATUS_SUCCESS) return true;
    snprintf(why, size, "%s: %s", what, cudnnGetErrorString(s));
    return false;
}

// Whether the engine behind `cfg` may give different bits from run to run (atomics); an engine whose notes
// cannot be read counts as one that may.
static bool engine_nondeterministic(CudnnDesc cfg) {
    CudnnDesc engine;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return true;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0, count = 0;
    const bool read =
        cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
            CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) == CUDNN_STATUS_SUCCESS;
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
    if (!read) return true;
    for (int64_t i = 0; i < count; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
    return false;
}

// The first of cfgs (best first) that finalizes into a plan, taking only engines without the NONDETERMINISTIC
// note when `deterministic`; the configuration used moves into out (cfgs[i] = NULL).
static bool plan_from_configs(cudnnHandle_t h, CudnnDesc* cfgs, int n, bool deterministic, CudnnPlan* out, char* why,
                              size_t size) {
    for (int i = 0; i < n; i++) {
        const bool nondeterministic = engine_nondeterministic(cfgs[i]);
        if (deterministic && nondeterministic) continue;
        CudnnDesc plan;
        CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
        cd_set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        cd_set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        const cudnnStatus_t s = cudnnBackendFinalize(plan);
        if (s != CUDNN_STATUS_SUCCESS) {
            cudnn_answer(s, "execution plan", why, size);
            CUDNN_CHECK(cudnnBackendDestroyDescriptor(plan));
            continue;
        }
        int64_t got = 0;
        CUDNN_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                             &out->workspace));
        out->plan = plan;
        out->config = cfgs[i];
        out->nondeterministic = nondeterministic;
        cfgs[i] = NULL;
        return true;
    }
    return false;
}

#define GRAPH_MAX_CONFIGS 32

// The heuristic's engine configurations for g's operations (mode A, best first, at most GRAPH_MAX_CONFIGS),
// which the caller destroys; 0 (with why) when cuDNN offers none.
static int gb_configs(GraphBuilder* g, cudnnHandle_t h, CudnnDesc* cfgs, char* why, size_t size) {
    CudnnDesc graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    cd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
    if (!cudnn_answer(cudnnBackendFinalize(graph), "operation graph", why, size)) return 0;
    CudnnDesc heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cd_set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    cd_set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (!cudnn_answer(cudnnBackendFinalize(heur), "engine heuristic", why, size)) return 0;
    int64_t n = 0, got = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL));
    if (n > GRAPH_MAX_CONFIGS) n = GRAPH_MAX_CONFIGS;
    for (int64_t i = 0; i < n; i++) CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]));
    if (n > 0) CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs));
    for (int64_t i = got; i < n; i++) CUDNN_CHECK(cudnnBackendDestroyDescriptor(cfgs[i]));
    if (got <= 0) snprintf(why, size, "engine heuristic: no configuration");
    return (int)got;
}

// The graph of g's operations as a plan: from an engine without the NONDETERMINISTIC note where the heuristic
// offers one, else from the first that builds (out->nondeterministic says which); false (with why) when none
// does. g keeps its descriptors; the plan outlives them (cudnn_plan_destroy).
static bool gb_plan(GraphBuilder* g, cudnnHandle_t h, CudnnPlan* out, char* why, size_t size) {
    *out = CudnnPlan{};
    CudnnDesc cfgs[GRAPH_MAX_CONFIGS];
    const int n = gb_configs(g, h, cfgs, why, size);
    const bool ok = plan_from_configs(h, cfgs, n, true, out, why, size) || plan_from_configs(h, cfgs, n, false, out, why, size);
    for (int i = 0; i < n; i++)
        if (cfgs[i]) CUDNN_CHECK(cudnnBackendDestroyDescriptor(cfgs[i]));
    return ok;
}

// One execution of a plan on the handle's stream: the caller's tensors by uid (device pointers, or host
// pointers for scalars passed by value). (Unused by tests/gpu/cudnn_graph_check.cu, which runs no plan.)
[[maybe_unused]] static void cudnn_execute(cudnnHandle_t h, const CudnnPlan* p, int n, const int64_t* uids,
                                           void* const* ptrs, void* workspace) {
    CudnnDesc pack;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    cd_set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    cd_set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    cd_set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    CUDNN_CHECK(cudnnBackendFinalize(pack));
    CUDNN_CHECK(cudnnBackendExecute(h, p->plan, pack));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}
