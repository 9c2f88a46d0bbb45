// grad_slots.h: the walk's gradient buffers under shard_grads (zero.h), and the reduce-scatters that empty
// them into this rank's fp32 accumulator of pieces.
//
// Two rotating slots hold the blocks' gradients (and a tied head's final norm's: a small unit), one more,
// the edge slot, the embedding unit's, which the LM head and the encoder both fill with a tied head. An
// untied head's final unit, as large as the embedding unit, shares the edge slot: the walk fills it in the
// head's backward and the embedding unit's at the end of the backward, so they never fill it at once. A
// unit's reduce-scatter starts when the walk is done with its gradients (grad_slots_done) and is finished
// (waited for, then added into the accumulator) only when its slot is needed again: two units later for
// the rotating slots; for the edge slot at the embedding unit's request after the untied head's, or the
// next micro-step's; or grad_slots_finish_all at the step boundary. So each unit's reduce-scatter runs
// during the next units' backward (bucket = unit), and a tied embedding's only once both the head's and
// the encoder's contributions are in. A unit's earlier reduce-scatter is always finished before its next
// one starts, so every piece of the accumulator gets its micro-steps' sums added in the same order, with the
// same bits, as when each was finished at once.
#pragma once
#include "core/model/memory.h"
#include "core/zero/grad_landing.h"
#include "core/zero/pieces.h"
#include "core/zero/qgz.h"

// A gradient slot's life. Its reduce-scatter is finished only when the buffer is wanted again, so that it
// runs during the next unit's backward.
typedef enum {
    GRAD_FREE,       // nothing in it the accumulator still needs.
                     // -> FILLING: grad_slots_buffer zeroes it for a unit
    GRAD_FILLING,    // the walk adds `unit`'s gradients, over all its requests of the micro-step.
                     // -> REDUCING: grad_slots_done starts the reduce-scatter
    GRAD_REDUCING,   // `unit`'s reduce-scatter is in flight.
                     // -> FREE: finishing it waits for it and adds this rank's piece to the accumulator
} GradSlotState;

typedef struct {
    void* buf;            // Pieces.dt, laid out like its unit's gradient buffer (Pieces.grad_len)
    GradSlotState state;
    int unit;             // GRAD_FILLING, GRAD_REDUCING: whose gradients
    CommHandle flight;    // GRAD_REDUCING: the reduce-scatter
    unsigned long seq;    // start order of its last reduce-scatter: the older of two is finished first
} GradSlot;

typedef struct {
    GradSlot slot[2];        // rotating: the blocks (and a tied head's final unit)
    GradSlot edge;           // the embedding unit's and an untied head's final unit's
    unsigned long started;   // reduce-scatters started so far: the next one's seq
    float* acc;              // fp32 accumulator of this rank's shares (index Pieces.mine_offset); host memory with on_host
    float* piece_f32;        // backend: one piece converted to fp32 before it is added; with on_host only
                             // allocated for a tied embedding, whose piece zero.c sums over the pair here
    GradLanding* landing;    // on_host: how each reduced piece comes down and is added (grad_landing.h)
    int on_host;             // grads_on_host
    float* local;            // 1-bit Adam after its freeze (core/zero/onebit_adam.h): a unit's slot is added whole
                             // into this backend fp32 buffer (Pieces.grad_offset) instead of reduce-scattered;
                             // NULL otherwise. The slots convert through piece_f32, one chunk at a time.
    Qgz* qgz;                // -qg 1: the units it covers are reduced through it (core/zero/qgz.h), at once, in
                             // place of the reduce-scatter; NULL: the exact reduce-scatter
} GradSlots;

// Allocates the accumulator (acc_elems fp32, on the host with on_host), the landing or the fp32 scratch
// (also with on_host when tied: a pipeline's tied embedding), and the slots, charging mem; with be == NULL
// (zero_plan) it only charges. The slots start GRAD_FREE.
// local_capable: the slots may be switched to `local` (piece_f32 is allocated whatever on_host says).
void grad_slots_init(GradSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, size_t acc_elems, int on_host, int tied,
                     int local_capable);

// The buffer the walk accumulates unit u's gradients in (zeroed when the unit takes it): the edge slot (the
// reduce-scatter in flight there finished first), the rotating one already filling with u, or a newly taken
// one, whose reduce-scatter in flight is finished first (the older of the two if neither is filling).
void* grad_slots_buffer(GradSlots* g, Backend* be, const Pieces* pc, int u);
// The walk is done with unit u's gradients for this micro-step: starts its reduce-scatter.
void grad_slots_done(GradSlots* g, const Pieces* pc, int u);
// Finishes every reduce-scatter in flight, in the order they started (the edge slot's last), and with
// on_host waits until every piece is in the accumulator: afterwards acc holds the reduced sums.
void grad_slots_finish_all(GradSlots* g, Backend* be, const Pieces* pc);
