// backend_cpu.c: the CPU backend's memory, synchronization and precision helpers. Backend memory is host
// memory; kernels run synchronously, so the main stream needs no synchronization. Asynchronous copies are
// deferred instead (kernels.h): queued, one queue per direction like the GPU's two copy streams, and run
// only when something waits for them, so waiting for an upload never runs a download and the other way
// round.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

typedef struct {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;   // issue order, from 1
} PendingCopy;

// A copy stream: asynchronous copies not yet run, oldest first.
typedef struct {
    PendingCopy* pending;
    size_t n_pending, cap_pending;
    uint64_t issued;     // seq of the last copy issued
} CopyQueue;

enum { COPY_DOWN, COPY_UP, NUM_COPY_QUEUES };

struct Backend {
    size_t bytes_now;    // live be_malloc'd bytes (payload only)
    size_t bytes_peak;   // high-water mark of bytes_now
    // Locked, because a worker thread may wait for an event (run the copies) while the launch thread issues more.
    pthread_mutex_t copy_lock;
    CopyQueue queues[NUM_COPY_QUEUES];
};

struct BeEvent {
    int queue;      // the direction of the copy it marks
    uint64_t seq;   // the copy this event marks in that queue; 0: none yet
};

// Each allocation is preceded by a header recording its size, so be_free can keep the count without a
// table. 64 bytes keeps the payload aligned for vector loads.
#define ALLOC_HEADER 64

static void check_pthread(int rc, const char* what) {
    if (rc != 0) fail("%s failed: %s", what, strerror(rc));
}

Backend* backend_create(int local_rank) {
    (void)local_rank;
    Backend* be = xcalloc(1, sizeof(Backend));
    check_pthread(pthread_mutex_init(&be->copy_lock, NULL), "pthread_mutex_init");
    return be;
}

void backend_destroy(Backend* be) {
    if (!be) return;
    be_synchronize(be);
    check_pthread(pthread_mutex_destroy(&be->copy_lock), "pthread_mutex_destroy");
    for (int q = 0; q < NUM_COPY_QUEUES; q++) free(be->queues[q].pending);
    free(be);
}

const char* backend_device_name(const Backend* be) {
    (void)be;
    return "cpu";
}

int backend_is_gpu(const Backend* be) {
    (void)be;
    return 0;
}

void* backend_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* backend_comm_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* be_malloc(Backend* be, size_t bytes) {
    size_t total = (bytes + ALLOC_HEADER + ALLOC_HEADER - 1) / ALLOC_HEADER * ALLOC_HEADER;
    if (total < bytes) fail("out of host memory allocating %zu bytes", bytes);
    unsigned char* base = aligned_alloc(ALLOC_HEADER, total);
    if (!base) fail("out of host memory allocating %zu bytes (%zu in use)", bytes, be->bytes_now);
    memcpy(base, &bytes, sizeof bytes);
    be->bytes_now += bytes;
    if (be->bytes_now > be->bytes_peak) be->bytes_peak = be->bytes_now;
    return base + ALLOC_HEADER;
}

void be_free(Backend* be, void* p) {
    if (!p) return;
    be_synchronize(be);   // a queued copy may still read or write p
    unsigned char* base = (unsigned char*)p - ALLOC_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    be->bytes_now -= bytes;
    free(base);
}

void be_memset0(Backend* be, void* p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}

void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src_host, bytes);
}

void be_download(Backend* be, void* dst_host, const void* src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst_host, src, bytes);
}

void be_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
}

// Runs, oldest first, the copies of queue q issued up to and including seq; each copy stream keeps its order.
static void run_copies_through(Backend* be, int q, uint64_t seq) {
    check_pthread(pthread_mutex_lock(&be->copy_lock), "pthread_mutex_lock");
    CopyQueue* cq = &be->queues[q];
    size_t done = 0;
    while (done < cq->n_pending && cq->pending[done].seq <= seq) {
        PendingCopy* c = &cq->pending[done++];
        if (c->bytes) memcpy(c->dst, c->src, c->bytes);
    }
    if (done) {   // (never arithmetic on the queue before its first copy: it is NULL then)
        memmove(cq->pending, cq->pending + done, (cq->n_pending - done) * sizeof(PendingCopy));
        cq->n_pending -= done;
    }
    check_pthread(pthread_mutex_unlock(&be->copy_lock), "pthread_mutex_unlock");
}

static void issue_copy(Backend* be, int q, void* dst, const void* src, size_t bytes, BeEvent* done) {
    check_pthread(pthread_mutex_lock(&be->copy_lock), "pthread_mutex_lock");
    CopyQueue* cq = &be->queues[q];
    if (cq->n_pending == cq->cap_pending) {
        size_t cap = cq->cap_pending ? 2 * cq->cap_pending : 16;
        PendingCopy* p = realloc(cq->pending, cap * sizeof(PendingCopy));
        if (!p) fail("out of host memory queueing an asynchronous copy");
        cq->pending = p;
        cq->cap_pending = cap;
    }
    cq->pending[cq->n_pending++] = (PendingCopy){dst, src, bytes, ++cq->issued};
    // A GPU's copy engine may write dst at any moment from now until the wait; the earliest is the strictest.
    // Poisoned until then, a read of dst before the wait (by the main stream or the host) sees NaNs and -1s,
    // where it would otherwise see the old bytes, often the right ones.
    if (bytes) memset(dst, 0xff, bytes);
    done->queue = q;
    done->seq = cq->issued;
    check_pthread(pthread_mutex_unlock(&be->copy_lock), "pthread_mutex_unlock");
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
    issue_copy(be, COPY_DOWN, dst_host, src, bytes, done);
}

void be_upload_async(Backend* be, void* dst, const void* src_host, size_t bytes, BeEvent* done) {
    issue_copy(be, COPY_UP, dst, src_host, bytes, done);
}

// The main stream's later work runs at once, so "after ev" means: run ev's copy now.
void be_stream_wait(Backend* be, BeEvent* ev) { run_copies_through(be, ev->queue, ev->seq); }

void be_event_synchronize(Backend* be, BeEvent* ev) { run_copies_through(be, ev->queue, ev->seq); }

void be_synchronize(Backend* be) {
    for (int q = 0; q < NUM_COPY_QUEUES; q++) run_copies_through(be, q, UINT64_MAX);
}

size_t be_peak_bytes(const Backend* be) { return be->bytes_peak; }

// The CPU has no pinned memory: host buffers are plain heap memory, outside the backend's byte ledger.
void* be_host_alloc(Backend* be, size_t bytes) {
    (void)be;
    return xmalloc(bytes ? bytes : 1);
}

void be_host_free(Backend* be, void* p) {
    if (!p) return;
    be_synchronize(be);   // a queued copy may still read or write p
    free(p);
}

float dtype_round(float x, DType dt) { return round_to(x, dt); }

void host_to_dtype(void* dst, DType dt, const float* src, size_t n) {
    for (size_t i = 0; i < n; i++) st(dst, i, src[i], dt);
}

void host_from_dtype(float* dst, const void* src, DType dt, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = ld(src, i, dt);
}

void convert(Backend* be, void* dst, DType dst_dt, const void* src, DType src_dt, size_t n) {
    if (dst_dt == src_dt) {
        be_copy(be, dst, src, n * dtype_size(dst_dt));
        return;
    }
    // Widening to fp32 first is exact, so bf16 -> fp16 rounds once, from the true value.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dst, i, ld(src, i, src_dt), dst_dt);
}

int backend_build_is_gpu(void) { return 0; }
