// param_store.h: what the forward/backward walk (walk.c) needs from whoever holds the parameters and the
// gradients, so the walk stays below the policy that decides where they live (ZeRO provides one:
// zero_param_store in zero.h). The walk asks for a unit just before it computes with it and says when it
// is done, so the holder may gather a unit on demand, reduce its gradients as soon as they are complete,
// and overlap either with the walk's compute.
#pragma once
#include "kernels/kernels.h"

typedef struct {
    void* ctx;
    // The unit's parameters (type dt), valid until params_done: tensor t of unit u lives at
    // base + (t.offset - u.offset).
    void* (*params)(void* ctx, Backend* be, int unit);
    void (*params_done)(void* ctx, int unit);
    // Optional hint: the next parameter request will be for `unit`, so its gather may start now. A hinted
    // unit must be asked for before the parameters change, or that gather is spent for nothing.
    void (*prefetch)(void* ctx, Backend* be, int unit);
    // The unit's gradient buffer (type dt, laid out like its parameters less the frozen tensors:
    // unit_grad_tensor, model.h): accumulate into it until grads_done.
    void* (*grads)(void* ctx, Backend* be, int unit);
    void (*grads_done)(void* ctx, Backend* be, int unit);
} ParamStore;

static inline void* store_params(const ParamStore* s, Backend* be, int u) { return s->params(s->ctx, be, u); }
static inline void store_params_done(const ParamStore* s, int u) { s->params_done(s->ctx, u); }
static inline void store_prefetch(const ParamStore* s, Backend* be, int u) { s->prefetch(s->ctx, be, u); }
static inline void* store_grads(const ParamStore* s, Backend* be, int u) { return s->grads(s->ctx, be, u); }
static inline void store_grads_done(const ParamStore* s, Backend* be, int u) { s->grads_done(s->ctx, be, u); }
