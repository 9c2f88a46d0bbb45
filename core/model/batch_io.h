// batch_io.h: a micro-batch's traffic between the host and the backend, without stopping the main stream.
//
// Tokens and targets go up from a small ring of page-locked slots on the upload copy stream: the caller's
// buffer is free as soon as the call returns (it is copied into a slot), the main stream's later kernels
// wait for the copy, and the host waits only when a slot comes round again, for an upload issued several
// uploads ago. Per-token losses come down on the download copy stream into one page-locked slot per
// micro-batch, and the host adds them once, when the step asks for its loss. A plain upload or download
// would instead wait for every kernel queued so far, three times per micro-batch, leaving the GPU idle
// while the host queues the next ones.
//
// The sums are the ones a synchronous download gave: each micro-batch's losses in row order, in double,
// then the micro-batches in the order their forwards ran. On the CPU backend the copies run only when
// waited for (kernels.h), so a missing wait reads stale bytes there and the tests' bit comparisons see it.
#pragma once
#include "kernels/kernels.h"

#define BATCH_IO_UPLOAD_SLOTS 4

typedef struct {
    int rows;                                   // N = B x T: ints per upload, losses per micro-batch
    int* up[BATCH_IO_UPLOAD_SLOTS];             // page-locked
    BeEvent* up_done[BATCH_IO_UPLOAD_SLOTS];
    int up_next, up_used;
    float** down;                               // [cap] page-locked, rows floats each
    BeEvent** down_done;                        // [cap]
    int pending, cap;                           // micro-batches whose losses are queued, and slots allocated
} BatchIO;

// loss_slots: the most micro-batches whose losses queue before a take (a step's); all are allocated here,
// since page-locking memory mid-step would stall the streams.
void batch_io_create(BatchIO* io, Backend* be, int rows, int loss_slots);
void batch_io_destroy(BatchIO* io, Backend* be);

// dst (backend, rows ints) = src (host): the main stream's later work sees it; src is free on return.
void batch_io_upload(BatchIO* io, Backend* be, int* dst, const int* src);

// Before the main stream overwrites the losses buffer (one per model, shared by the activation sets): it
// waits for the queued downloads, which read it (they run in order, so for the last one).
void batch_io_before_losses(BatchIO* io, Backend* be);
// Queues the download of losses (backend, rows floats), written by the main stream's work so far.
void batch_io_queue_losses(BatchIO* io, Backend* be, const float* losses);
// Waits for the queued downloads and returns the sum of their losses (0 for none); the queue empties.
double batch_io_take_losses(BatchIO* io, Backend* be);
// Waits for the queued downloads and copies their losses, rows floats each in the order they were queued,
// into out (room for `room` micro-batches); returns how many; the queue empties.
int batch_io_take_each(BatchIO* io, Backend* be, float* out, int room);
