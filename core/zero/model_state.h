// model_state.h: what the optimizer (optimizer.h) and the checkpoints (checkpoint.h) see of the model
// states this rank holds: working parameters, fp32 master weights, the optimizer's state buffers (as its
// description names them, optimizer_kind.h: AdamW's m and v), reduced gradients. They see spans inside one
// tensor each and act on those, so they stay below the policy that decides which spans a rank holds and
// where they live (ZeRO provides one: zero_model_state in zero.h). Where a buffer lives is the holder's
// business: its users move a span's values with the operations at the end of this file, which know.
#pragma once
#include <string.h>

#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/zero/nvme_store.h"

// The spans a rank updates (the tied embedding's mirror included: it must stay equal to the original),
// counts in the gradient norm (the same without the mirror), or writes to a checkpoint (its share without
// the mirror, cut the same way however the states are held, so that any layout resumes any other). None of
// them holds a frozen tensor (optimizer_kind.h): it is never updated, not in the norm, not in the files.
typedef enum { STATE_UPDATE, STATE_NORM, STATE_CHECKPOINT } StateParts;

// n elements from flat index `flat` of tensor t; every pointer points at the span's start, in the memory
// ModelState.places names for its buffer (NULL for a buffer on disk: `state` addresses it there).
typedef struct {
    const ParamTensor* t;
    OptimizerId optimizer;   // its tensor's kind's (the holder copies it; never a frozen one in a walk)
    size_t flat, n;
    size_t state;            // the index of its first element in the holder's master and state buffers
    void* params;            // working copy, ModelState.dt
    float* master;
    float* opt_state[OPT_MAX_STATE];   // state buffer k of its tensor's optimizer (optimizer_kind.h)
    const void* grad;        // reduced gradient, grad_dt
    DType grad_dt;
} StateSpan;
typedef void (*StateSpanFn)(const StateSpan* s, void* ctx);

// A span's buffers, as the operations below name them: SPAN_MASTER + i (i = 0 .. OPT_MAX_STATE) is the
// optimizer's fp32 buffer i (optimizer_kind.h: 0 the master, 1 + k state buffer k).
typedef enum { SPAN_PARAMS, SPAN_GRAD, SPAN_MASTER } SpanBuffer;
static inline SpanBuffer span_optimizer_buffer(int i) { return (SpanBuffer)(SPAN_MASTER + i); }

// Where a buffer lives: backend memory (the GPU's on the GPU build), host memory (-offload), or files on
// disk that ModelState.disk reads and writes through host buffers (-nvme).
typedef enum { IN_BACKEND, IN_HOST, IN_DISK } Place;

// Where each buffer of every span lives; the master and the optimizer's state always together.
typedef struct {
    Place params, state, grads;
} StatePlaces;

// -offload's staging for the optimizer: two buffers (one computed on while the other's copies run), each
// host memory for `elems` elements of a gradient (4 bytes each at most; none where the gradients are host
// memory already) followed by as many of the working copy (dt; none where it is host memory); buf is NULL
// where neither moves.
typedef struct {
    void* buf;
    size_t elems;
} HostStage;

// A delayed update's host memory (-dpu, delayed_update.h): the gradient of the update in flight (the
// spans' grad_dt) and the working copy it computes (dt), each as many elements as this rank holds state
// for, packed in STATE_UPDATE order; NULL without -dpu.
typedef struct {
    void* grad;
    void* params;
} PendingBuffers;

typedef struct {
    void* ctx;
    const ParamLayout* lay;
    DType dt;                // of the working copy
    void* whole_params;      // the working copy in the flat layout where this rank holds all of it, else NULL
    Comm* parts;             // the group whose ranks' STATE_NORM spans are disjoint parts of the same units,
                             // so a sum over spans adds over it; NULL where this rank's cover them all
    float* scratch;          // one fp32 of backend memory for reductions (the norm)
    StatePlaces places;      // read by the operations below only
    NvmeStore* disk;         // where a place is IN_DISK; else NULL
    HostStage stage;
    PendingBuffers pending;
    void (*for_each_span)(void* ctx, StateParts which, StateSpanFn fn, void* fn_ctx);
    // The part of [flat, flat + n) inside tensor t whose master and state this rank holds; 0 if none (a
    // frozen tensor's: it has neither).
    int (*owned_span)(void* ctx, const ParamTensor* t, size_t flat, size_t n, StateSpan* out);
    // Whole-model transfers through host fp32 in the flat layout; collective over the holders of parts.
    // master_to_host gives a frozen tensor's working copy, its only copy; with flat = NULL it only takes
    // part in the gathers.
    void (*set_from_host)(void* ctx, Backend* be, const float* flat);
    void (*master_to_host)(void* ctx, Backend* be, float* flat);
    // The holder's own per-rank file of a checkpoint beside the state files (1-bit Adam's errors,
    // core/zero/onebit_adam.h), written into the checkpoint's directory before its DONE and read back at a
    // resume; NULL where it keeps none.
    void (*save_own)(void* ctx, Backend* be, const char* dir);
    void (*load_own)(void* ctx, Backend* be, const char* dir);
} ModelState;

// ---------------------------------------------------------------------------------------------------
// Moving values in and out of the spans, wherever their buffers live.

// To host memory from memory in `from`, or from host memory to memory in `to` (not IN_DISK: the span
// operations below reach the disk).
static inline void place_to_host(Backend* be, Place from, void* dst_host, const void* src, size_t bytes) {
    if (from == IN_HOST) memcpy(dst_host, src, bytes);
    else be_download(be, dst_host, src, bytes);
}
static inline void place_from_host(Backend* be, Place to, void* dst, const void* src_host, size_t bytes) {
    if (to == IN_HOST) memcpy(dst, src_host, bytes);
    else be_upload(be, dst, src_host, bytes);
}

static inline Place span_place(const ModelState* ms, SpanBuffer b) {
    if (b == SPAN_PARAMS) return ms->places.params;
    return b == SPAN_GRAD ? ms->places.grads : ms->places.state;
}

static inline size_t span_elem_bytes(const ModelState* ms, const StateSpan* s, SpanBuffer b) {
    if (b == SPAN_PARAMS) return dtype_size(ms->dt);
    return b == SPAN_GRAD ? dtype_size(s->grad_dt) : sizeof(float);
}

// Element i of buffer b; the gradient is only ever read through it.
static inline char* span_ptr(const ModelState* ms, const StateSpan* s, SpanBuffer b, size_t i) {
    const void* base = s->params;
    if (b == SPAN_GRAD) base = s->grad;
    else if (b == SPAN_MASTER) base = s->master;
    else if (b > SPAN_MASTER) base = s->opt_state[b - SPAN_MASTER - 1];
    return (char*)base + i * span_elem_bytes(ms, s, b);
}

// The part of a disk store's chunks that holds buffer b (never the gradient: it is not stored there): the
// store keeps the optimizer's buffers in the same order.
static inline NvmePart span_disk_part(SpanBuffer b) {
    return b == SPAN_PARAMS ? NVME_PARAMS : (NvmePart)(NVME_MASTER + (b - SPAN_MASTER));
}

// All n elements of span s's buffer b, to or from host memory.
static inline void span_to_host(const ModelState* ms, Backend* be, const StateSpan* s, SpanBuffer b, void* dst_host) {
    if (span_place(ms, b) == IN_DISK) nvme_copy_out(ms->disk, span_disk_part(b), s->state, s->n, dst_host);
    else place_to_host(be, span_place(ms, b), dst_host, span_ptr(ms, s, b, 0), s->n * span_elem_bytes(ms, s, b));
}
static inline void span_from_host(const ModelState* ms, Backend* be, const StateSpan* s, SpanBuffer b,
                                  const void* src_host) {
    if (span_place(ms, b) == IN_DISK) nvme_copy_in(ms->disk, span_disk_part(b), s->state, s->n, src_host);
    else place_from_host(be, span_place(ms, b), span_ptr(ms, s, b, 0), src_host, s->n * span_elem_bytes(ms, s, b));
}
// After values were written with span_from_host: those bound for the disk are there, not only in its cache
// (before a pass or the walk reads the disk again).
static inline void state_flush(const ModelState* ms) {
    if (ms->disk) nvme_flush(ms->disk);
}

// Sets the working copy of flat elements [flat, flat + n) from host memory wherever this rank holds it:
// all of it where it holds the whole copy (which the state it owns may not cover), else the part `owned`
// (a span of those elements; NULL: none).
static inline void state_params_from_host(const ModelState* ms, Backend* be, size_t flat, size_t n, const StateSpan* owned,
                                          const void* src_host) {
    size_t x = dtype_size(ms->dt);
    if (ms->whole_params) place_from_host(be, ms->places.params, (char*)ms->whole_params + flat * x, src_host, n * x);
    else if (owned) span_from_host(ms, be, owned, SPAN_PARAMS, (const char*)src_host + (owned->flat - flat) * x);
}

// Before the host writes the working copy in place: where that is host memory, the holder's uploads from it
// (zero.c's gathers) run on the copy stream and may still be reading it.
static inline void state_before_host_writes(const ModelState* ms, Backend* be) {
    if (ms->places.params == IN_HOST) be_synchronize(be);
}

// Host access to elements [i, i + n) of a span's buffer, for work overlapped with the copy stream (the
// optimizer's -offload staging): in place where the buffer is host memory, in the disk pass's chunk where
// it is on disk (state_pass_hold), else through `stage`, whose copy runs on the copy stream and records
// `copied`. Only backend buffers are copied or waited for.
static inline size_t span_stage_bytes(const ModelState* ms, SpanBuffer b, size_t bytes) {
    return span_place(ms, b) == IN_BACKEND ? bytes : 0;
}
static inline void* span_host_view(const ModelState* ms, const StateSpan* s, SpanBuffer b, size_t i, void* stage) {
    if (span_place(ms, b) == IN_DISK) return nvme_pass_view(ms->disk, span_disk_part(b), s->state + i);
    return span_place(ms, b) == IN_HOST ? span_ptr(ms, s, b, i) : stage;
}
static inline void span_fetch_async(const ModelState* ms, Backend* be, const StateSpan* s, SpanBuffer b, size_t i, size_t n,
                                    void* stage, BeEvent* copied) {
    if (span_place(ms, b) != IN_BACKEND) return;
    be_download_async(be, stage, span_ptr(ms, s, b, i), n * span_elem_bytes(ms, s, b), copied);
}
static inline void span_store_async(const ModelState* ms, Backend* be, const StateSpan* s, SpanBuffer b, size_t i, size_t n,
                                    const void* stage, BeEvent* copied) {
    if (span_place(ms, b) != IN_BACKEND) return;
    be_upload_async(be, span_ptr(ms, s, b, i), stage, n * span_elem_bytes(ms, s, b), copied);
}
// The host waits for the staged copy recorded in `copied`.
static inline void span_stage_wait(const ModelState* ms, Backend* be, SpanBuffer b, BeEvent* copied) {
    if (span_place(ms, b) == IN_BACKEND) be_event_synchronize(be, copied);
}

// The optimizer's pass over state on disk (nvme_store.h): chunk after chunk in increasing state index,
// each held while its spans are updated in place (span_host_view); nothing where the state is in memory.
// The pass writes the working copy back to disk where it lives there.
static inline void state_pass_begin(const ModelState* ms) {
    if (ms->places.state == IN_DISK) nvme_pass_begin(ms->disk, ms->places.params == IN_DISK);
}
// The elements from state index `state` to where the disk's chunk ends (a portion must not cross it).
static inline size_t state_chunk_left(const ModelState* ms, size_t state) {
    return ms->places.state == IN_DISK ? nvme_chunk_left(ms->disk, state) : (size_t)-1;
}
static inline void state_pass_hold(const ModelState* ms, size_t state) {
    if (ms->places.state == IN_DISK) nvme_pass_hold(ms->disk, state);
}
static inline void state_pass_end(const ModelState* ms) {
    if (ms->places.state == IN_DISK) nvme_pass_end(ms->disk);
}
