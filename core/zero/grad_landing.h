// grad_landing.h: where -offload 2's reduced gradient pieces come down to the host's fp32 accumulator
// without stopping the launch thread.
//
// A piece takes a landing slot. The main stream copies it into the slot's outbox (backend memory; so the
// walk's gradient buffer is free again at once). The copy stream downloads the outbox into the slot's pinned
// landing buffer while the next units compute. A worker thread waits for that download and adds the landing
// buffer into the accumulator. Pieces are added in the order they were queued: the same fp32 additions, in
// the same order, as adding each one at once, so the bits do not change. The launch thread waits only when
// both slots are still busy, and at grad_landing_drain, before anything reads the accumulator.
#pragma once
#include <stddef.h>

#include "core/model/memory.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GRAD_LANDING_SLOTS 2

typedef struct GradLanding GradLanding;

// Slots for pieces of up to max_piece elements of dt: GRAD_LANDING_SLOTS outboxes charged to MEM_GRADS and
// as many landing buffers to MEM_HOST_GRADS. With be == NULL (--estimate) it only charges them: NULL.
GradLanding* grad_landing_create(Backend* be, MemLedger* mem, DType dt, size_t max_piece);
void grad_landing_destroy(GradLanding* g, Backend* be);   // drains first

// Queues acc[0..n) += piece[0..n): piece is backend memory, ordered after the main stream's work so far, and
// may be overwritten by the main stream as soon as this returns; acc is host memory the caller leaves alone
// until grad_landing_drain.
void grad_landing_add(GradLanding* g, Backend* be, float* acc, const void* piece, size_t n);
// Returns when every queued addition is in its accumulator.
void grad_landing_drain(GradLanding* g);
// Seconds the launch thread waited for a slot or a drain since the last call (the part not overlapped).
double grad_landing_wait_seconds(GradLanding* g);

#ifdef __cplusplus
}
#endif
