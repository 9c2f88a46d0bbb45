// test_batch_io.c: core/model/batch_io.c's waits against a model of the GPU's streams.
//
// The CPU backend runs an upload as soon as the main stream waits for it, since its kernels run on the
// host at once; so there a token slot is never still being read when it comes round again, and the model
// runs would pass without the ring's wait. This program links batch_io.c with a backend of its own instead:
// copies run only when the host waits for them (be_event_synchronize, be_synchronize); be_stream_wait only
// records that the main stream's later work comes after a copy, and the test's main_read/main_write stand
// for that later work (they run the copies the main stream waits for, as the GPU would finish them first).
// Each check fails when one wait of batch_io.c is removed.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model/batch_io.h"
#include "tests/unit/testlib.h"

// ---- the model: two copy queues (download, upload), each run in issue order ----
typedef struct {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;
} Copy;

enum { DOWN, UP };
#define MAX_COPIES 256

struct Backend {
    Copy queue[2][MAX_COPIES];
    size_t head[2], tail[2];   // run [head, tail)
    uint64_t issued[2];
    uint64_t main_after[2];    // the main stream's later work runs after these copies
    int host_allocs;           // be_host_alloc calls (page-locking, on a GPU: none may come mid-step)
};

struct BeEvent {
    int q;
    uint64_t seq;
};

static void run_through(Backend* be, int q, uint64_t seq) {
    while (be->head[q] < be->tail[q] && be->queue[q][be->head[q]].seq <= seq) {
        Copy* c = &be->queue[q][be->head[q]++];
        memcpy(c->dst, c->src, c->bytes);
    }
}

static void issue(Backend* be, int q, void* dst, const void* src, size_t bytes, BeEvent* done) {
    if (be->tail[q] == MAX_COPIES) fail("test: more than %d copies", MAX_COPIES);
    be->queue[q][be->tail[q]++] = (Copy){dst, src, bytes, ++be->issued[q]};
    done->q = q;
    done->seq = be->issued[q];
}

void* be_host_alloc(Backend* be, size_t bytes) {
    be->host_allocs++;
    return xcalloc(1, bytes);
}
void be_host_free(Backend* be, void* p) {
    (void)be;
    free(p);
}
BeEvent* be_event_create(Backend* be) {
    (void)be;
    return xcalloc(1, sizeof(BeEvent));
}
void be_event_destroy(Backend* be, BeEvent* ev) {
    (void)be;
    free(ev);
}
void be_download_async(Backend* be, void* dst_host, const void* src, size_t bytes, BeEvent* done) {
    issue(be, DOWN, dst_host, src, bytes, done);
}
void be_upload_async(Backend* be, void* dst, const void* src_host, size_t bytes, BeEvent* done) {
    issue(be, UP, dst, src_host, bytes, done);
}
void be_stream_wait(Backend* be, BeEvent* ev) {
    if (ev->seq > be->main_after[ev->q]) be->main_after[ev->q] = ev->seq;
}
void be_event_synchronize(Backend* be, BeEvent* ev) { run_through(be, ev->q, ev->seq); }
void be_synchronize(Backend* be) {
    run_through(be, DOWN, UINT64_MAX);
    run_through(be, UP, UINT64_MAX);
}

// Main-stream work issued now: it runs after the copies the main stream was told to wait for.
static void main_work(Backend* be) {
    run_through(be, DOWN, be->main_after[DOWN]);
    run_through(be, UP, be->main_after[UP]);
}
static void main_write(Backend* be, float* buf, int n, float base) {
    main_work(be);
    for (int i = 0; i < n; i++) buf[i] = base + 0.1f * (float)i;
}

#define ROWS 6

static double row_sum(float base) {   // what the losses of main_write(base) add up to, in row order
    double s = 0.0;
    for (int i = 0; i < ROWS; i++) s += (double)(base + 0.1f * (float)i);
    return s;
}

// Uploads more than the ring holds, each into its own destination, the caller's buffer reused at once.
static void check_upload_ring(TestStats* ts) {
    Backend* be = xcalloc(1, sizeof(Backend));
    BatchIO io;
    memset(&io, 0xa5, sizeof io);   // batch_io_create sets every field: none may keep what was there
    batch_io_create(&io, be, ROWS, 1);
    enum { N = 2 * BATCH_IO_UPLOAD_SLOTS + 1 };
    int dst[N][ROWS], src[ROWS];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < ROWS; i++) src[i] = 100 * k + i;
        batch_io_upload(&io, be, dst[k], src);
        memset(src, 0xff, sizeof src);   // the caller's buffer is free on return
    }
    be_synchronize(be);
    int bad = 0;
    for (int k = 0; k < N; k++)
        for (int i = 0; i < ROWS; i++) bad += dst[k][i] != 100 * k + i;
    check_true(ts, "upload_ring_slot_waits_for_its_last_copy", bad == 0);
    batch_io_destroy(&io, be);
    free(be);
}

// The main stream's work after an upload sees it, with no host wait in between.
static void check_upload_order(TestStats* ts) {
    Backend* be = xcalloc(1, sizeof(Backend));
    BatchIO io;
    memset(&io, 0xa5, sizeof io);   // batch_io_create sets every field: none may keep what was there
    batch_io_create(&io, be, ROWS, 1);
    int dst[ROWS] = {0}, src[ROWS];
    for (int i = 0; i < ROWS; i++) src[i] = 7 + i;
    batch_io_upload(&io, be, dst, src);
    main_work(be);
    int bad = 0;
    for (int i = 0; i < ROWS; i++) bad += dst[i] != 7 + i;
    check_true(ts, "upload_seen_by_later_main_work", bad == 0);
    batch_io_destroy(&io, be);
    free(be);
}

// Micro-batches whose head writes the one losses buffer in turn: each download must read its own values,
// and the sum comes out as each micro-batch's rows in order, then the micro-batches in order.
static void check_losses(TestStats* ts) {
    Backend* be = xcalloc(1, sizeof(Backend));
    BatchIO io;
    memset(&io, 0xa5, sizeof io);
    enum { MICRO = 5 };
    batch_io_create(&io, be, ROWS, MICRO);   // every slot allocated here, none mid-step
    const int allocated = be->host_allocs;
    float losses[ROWS];
    double want = 0.0;
    for (int m = 0; m < MICRO; m++) {
        batch_io_before_losses(&io, be);
        main_write(be, losses, ROWS, 1.0f + (float)m);
        batch_io_queue_losses(&io, be, losses);
        want += row_sum(1.0f + (float)m);
    }
    double got = batch_io_take_losses(&io, be);
    check_true(ts, "losses_each_download_reads_its_micro_batch", got == want);
    check_true(ts, "losses_queue_empties", batch_io_take_losses(&io, be) == 0.0);
    // A second step reuses the slots.
    batch_io_before_losses(&io, be);
    main_write(be, losses, ROWS, 9.0f);
    batch_io_queue_losses(&io, be, losses);
    check_true(ts, "losses_next_step_reuses_slots", batch_io_take_losses(&io, be) == row_sum(9.0f) && io.cap == MICRO);
    check_true(ts, "losses_slots_allocated_at_creation", be->host_allocs == allocated);
    batch_io_destroy(&io, be);
    free(be);
}

// Per-token losses (a multiple-choice evaluation's scores): each queued micro-batch's own rows, in the order
// queued, and the queue empties.
static void check_each(TestStats* ts) {
    Backend* be = xcalloc(1, sizeof(Backend));
    BatchIO io;
    memset(&io, 0xa5, sizeof io);
    batch_io_create(&io, be, ROWS, 2);
    float losses[ROWS], out[2 * ROWS];
    for (int m = 0; m < 2; m++) {
        batch_io_before_losses(&io, be);
        main_write(be, losses, ROWS, 3.0f + (float)m);
        batch_io_queue_losses(&io, be, losses);
    }
    int n = batch_io_take_each(&io, be, out, 2), bad = 0;
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < ROWS; i++) bad += out[m * ROWS + i] != 3.0f + (float)m + 0.1f * (float)i;
    check_true(ts, "each_row_of_each_micro_batch_in_order", n == 2 && bad == 0);
    check_true(ts, "each_queue_empties", batch_io_take_each(&io, be, out, 2) == 0 && batch_io_take_losses(&io, be) == 0.0);
    batch_io_destroy(&io, be);
    free(be);
}

int main(void) {
    TestStats ts = {0, 0};
    check_upload_ring(&ts);
    check_upload_order(&ts);
    check_losses(&ts);
    check_each(&ts);
    return test_exit(&ts);
}
