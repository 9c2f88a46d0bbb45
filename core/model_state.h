// model_state.h: what the optimizer (optimizer.h) and the checkpoints (checkpoint.h) see of the model
// states this rank holds: working parameters, fp32 master weights, Adam's m and v, reduced gradients. They
// see spans inside one tensor each and act on those, so they stay below the policy that decides which
// spans a rank holds and where they live (ZeRO provides one: zero_model_state in zero.h).
#pragma once
#include <string.h>

#include "comm.h"
#include "model.h"

// The spans a rank updates (the tied embedding's mirror included: it must stay equal to the original),
// counts in the gradient norm (the same without the mirror), or writes to a checkpoint (its share without
// the mirror, cut the same way however the states are held, so that any layout resumes any other).
typedef enum { STATE_UPDATE, STATE_NORM, STATE_CHECKPOINT } StateParts;

// n elements from flat index `flat` of tensor t; every pointer points at the span's start, into backend
// memory, except where ModelState's *_on_host flags say host memory (master, m, v; grad; params).
typedef struct {
    const ParamTensor* t;
    size_t flat, n;
    void* params;            // working copy, ModelState.dt
    float* master;
    float* m;
    float* v;
    const void* grad;        // reduced gradient, grad_dt
    DType grad_dt;
} StateSpan;
typedef void (*StateSpanFn)(const StateSpan* s, void* ctx);

typedef struct {
    void* ctx;
    const ParamLayout* lay;
    DType dt;                // of the working copy
    void* whole_params;      // the working copy in the flat layout where this rank holds all of it, else NULL
    Comm* parts;             // the group whose ranks' STATE_NORM spans are disjoint parts of the same units,
                             // so a sum over spans adds over it; NULL where this rank's cover them all
    float* scratch;          // one fp32 of backend memory for reductions (the norm)
    int state_on_host;       // master, m and v are host memory (-offload): copy them with memcpy, not be_*
    int grads_on_host;       // the spans' reduced gradients are host memory (-offload 2)
    int params_on_host;      // the spans' working parameters are host memory (-offload 2 with -z 3)
    // With state_on_host, the optimizer's staging: two buffers (one computed on while the other's copies
    // run), each host memory for host_stage_elems elements of a gradient (4 bytes each at most; none with
    // grads_on_host) followed by as many of the working copy (dt; none with params_on_host); NULL where
    // neither moves.
    void* host_stage;
    size_t host_stage_elems;
    // With a delayed update (-dpu, delayed_update.h): host memory for the gradient of the update in flight
    // (the grad_dt of the spans) and the working copy it computes (dt), each as many elements as this rank
    // holds state for, packed in STATE_UPDATE order; NULL otherwise.
    void* pending_grad;
    void* pending_params;
    void (*for_each_span)(void* ctx, StateParts which, StateSpanFn fn, void* fn_ctx);
    // The part of [flat, flat + n) inside tensor t whose master, m and v this rank holds; 0 if none.
    int (*owned_span)(void* ctx, const ParamTensor* t, size_t flat, size_t n, StateSpan* out);
    // Whole-model transfers through host fp32 in the flat layout; collective over the holders of parts.
    // master_to_host with flat = NULL only takes part in the gathers.
    void (*set_from_host)(void* ctx, Backend* be, const float* flat);
    void (*master_to_host)(void* ctx, Backend* be, float* flat);
} ModelState;

// To or from host memory, from or to memory that is host memory where on_host, else the backend's.
static inline void copy_to_host(Backend* be, int on_host, void* dst_host, const void* src, size_t bytes) {
    if (on_host) memcpy(dst_host, src, bytes);
    else be_download(be, dst_host, src, bytes);
}
static inline void copy_from_host(Backend* be, int on_host, void* dst, const void* src_host, size_t bytes) {
    if (on_host) memcpy(dst, src_host, bytes);
    else be_upload(be, dst, src_host, bytes);
}
