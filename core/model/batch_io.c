// batch_io.c: see batch_io.h.
#include "core/model/batch_io.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

void batch_io_create(BatchIO* io, Backend* be, int rows, int loss_slots) {
    if (rows < 1 || loss_slots < 1) fail("internal: batch I/O for %d rows, %d loss slots", rows, loss_slots);
    memset(io, 0, sizeof(*io));
    io->rows = rows;
    for (int i = 0; i < BATCH_IO_UPLOAD_SLOTS; i++) {
        io->up[i] = (int*)be_host_alloc(be, (size_t)rows * sizeof(int));
        io->up_done[i] = be_event_create(be);
    }
    io->cap = loss_slots;
    io->down = (float**)xmalloc((size_t)loss_slots * sizeof(float*));
    io->down_done = (BeEvent**)xmalloc((size_t)loss_slots * sizeof(BeEvent*));
    for (int k = 0; k < loss_slots; k++) {
        io->down[k] = (float*)be_host_alloc(be, (size_t)rows * sizeof(float));
        io->down_done[k] = be_event_create(be);
    }
}

void batch_io_destroy(BatchIO* io, Backend* be) {
    if (!io->rows) return;
    be_synchronize(be);   // no copy still reads or writes a slot
    for (int i = 0; i < BATCH_IO_UPLOAD_SLOTS; i++) {
        be_host_free(be, io->up[i]);
        be_event_destroy(be, io->up_done[i]);
    }
    for (int k = 0; k < io->cap; k++) {
        be_host_free(be, io->down[k]);
        be_event_destroy(be, io->down_done[k]);
    }
    free(io->down);
    free(io->down_done);
    memset(io, 0, sizeof(*io));
}

void batch_io_upload(BatchIO* io, Backend* be, int* dst, const int* src) {
    int i = io->up_next;
    if (io->up_used == BATCH_IO_UPLOAD_SLOTS) be_event_synchronize(be, io->up_done[i]);   // its last upload read it
    else io->up_used++;
    memcpy(io->up[i], src, (size_t)io->rows * sizeof(int));
    be_upload_async(be, dst, io->up[i], (size_t)io->rows * sizeof(int), io->up_done[i]);
    be_stream_wait(be, io->up_done[i]);
    io->up_next = (i + 1) % BATCH_IO_UPLOAD_SLOTS;
}

void batch_io_before_losses(BatchIO* io, Backend* be) {
    if (io->pending) be_stream_wait(be, io->down_done[io->pending - 1]);
}

void batch_io_queue_losses(BatchIO* io, Backend* be, const float* losses) {
    if (io->pending == io->cap) fail("internal: a %dth micro-batch's losses queued, batch I/O holds %d", io->cap + 1, io->cap);
    int k = io->pending++;
    be_download_async(be, io->down[k], losses, (size_t)io->rows * sizeof(float), io->down_done[k]);
}

double batch_io_take_losses(BatchIO* io, Backend* be) {
    double total = 0.0;
    for (int k = 0; k < io->pending; k++) {
        be_event_synchronize(be, io->down_done[k]);
        double sum = 0.0;
        for (int i = 0; i < io->rows; i++) sum += io->down[k][i];
        total += sum;
    }
    io->pending = 0;
    return total;
}

int batch_io_take_each(BatchIO* io, Backend* be, float* out, int room) {
    if (io->pending > room) fail("internal: %d micro-batches' losses queued, room for %d", io->pending, room);
    int n = io->pending;
    for (int k = 0; k < n; k++) {
        be_event_synchronize(be, io->down_done[k]);
        memcpy(out + (size_t)k * io->rows, io->down[k], (size_t)io->rows * sizeof(float));
    }
    io->pending = 0;
    return n;
}
