// backend_cpu.c: the CPU backend's memory, synchronization and precision helpers. Backend memory is host
// memory; kernels run synchronously, so the main stream needs no synchronization. Asynchronous copies are
// deferred instead (kernels.h): queued, one queue per direction like the GPU's two copy streams, and run
// only when something waits for them, so waiting for an upload never runs a download and the other way
// round.
//
// Built with -DBACKEND_FENCE (build/train_gpt_fenced, tests/system/t_fence.sh) it is also a stand-in GPU for the
// host code above it: backend memory comes from one reserved range that no host code can read or write
// except inside this file's and the kernels' functions (BACKEND_ENTRY, cpu_common.h); kernels and copies
// check which side of the fence each pointer is on; an asynchronous copy keeps a GPU's window, in which its
// source must not change and its destination is poison until the host waits; and it reports itself as a
// GPU, so the comm layer stages through the host as it does with one. Same bits as the CPU build, or a
// crash, a one-line error or NaNs where the host code would misbehave on a GPU.
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/gpu_variants.h"
#include "kernels/cpu_common.h"
#ifdef BACKEND_FENCE
#include <sys/mman.h>
#include <unistd.h>
#endif

typedef struct {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;   // issue order, from 1
#ifdef BACKEND_FENCE
    uint64_t src_hash;   // of the source at issue: a GPU may read it any time until the wait, so it must not change
    int ran;             // the main stream has waited for it (be_stream_wait), the host not yet
    void* shadow;        // a download that ran: its bytes, kept from the host until the host waits
#endif
} PendingCopy;

// A copy stream: asynchronous copies not yet run (fenced: or not yet waited for by the host), oldest first.
typedef struct {
    PendingCopy* pending;
    size_t n_pending, cap_pending;
    uint64_t issued;     // seq of the last copy issued
} CopyQueue;

enum { COPY_DOWN, COPY_UP, NUM_COPY_QUEUES };

#ifdef BACKEND_FENCE
// Backend memory behind the fence: allocated upward from base and never reused (test runs are small; a
// freed block's pages go back to the system), readable only while depth > 0.
#define FENCE_RESERVED ((size_t)64 << 30)   // address space only (MAP_NORESERVE)
// The fence moves on every backend call, and mprotect's cost grows with the page-table entries it changes:
// the range is backed by 2 MiB pages where the kernel allows (MADV_HUGEPAGE), and protected in whole ones.
#define FENCE_HUGE ((size_t)2 << 20)
typedef struct {
    pthread_mutex_t lock;   // threads enter and leave backend functions concurrently (the optimizer's worker)
    void* mapping;          // the reservation: FENCE_RESERVED + FENCE_HUGE bytes, base inside it
    unsigned char* base;    // FENCE_HUGE-aligned
    size_t top;             // bytes handed out
    int depth;              // backend functions running, over all threads
} Fence;
#endif

struct Backend {
    size_t bytes_now;    // live be_malloc'd bytes (payload only)
    size_t bytes_peak;   // high-water mark of bytes_now
    // Locked, because a worker thread may wait for an event (run the copies) while the launch thread issues more.
    pthread_mutex_t copy_lock;
    CopyQueue queues[NUM_COPY_QUEUES];
    unsigned variants;   // GPT_CUDA_VARIANTS' names, validated; the CPU build has one kernel each
#ifdef BACKEND_FENCE
    Fence fence;
#endif
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
static void lock(pthread_mutex_t* m) { check_pthread(pthread_mutex_lock(m), "pthread_mutex_lock"); }
static void unlock(pthread_mutex_t* m) { check_pthread(pthread_mutex_unlock(m), "pthread_mutex_unlock"); }

// An allocation's bytes with its header, rounded to the header's alignment.
static size_t alloc_total(size_t bytes) { return (bytes + ALLOC_HEADER + ALLOC_HEADER - 1) / ALLOC_HEADER * ALLOC_HEADER; }

#ifdef BACKEND_FENCE
static void fence_set(Fence* f, int prot) {
    size_t span = (f->top + FENCE_HUGE - 1) / FENCE_HUGE * FENCE_HUGE;   // past top: no pointer reaches it
    if (span && mprotect(f->base, span, prot) != 0) fail("mprotect of the fenced backend memory: %s", strerror(errno));
}

static int behind_fence(Backend* be, const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    return c >= be->fence.base && c < be->fence.base + be->fence.top;
}

Backend* be_fence_lift(Backend* be, const void* const* ptrs, size_t n, const char* func) {
    lock(&be->fence.lock);
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] && !behind_fence(be, ptrs[i])) fail("internal: %s was given host memory (argument %zu) where backend memory belongs", func, i);
    if (be->fence.depth++ == 0) fence_set(&be->fence, PROT_READ | PROT_WRITE);
    unlock(&be->fence.lock);
    return be;
}

void be_fence_drop(Backend** be) {
    Fence* f = &(*be)->fence;
    lock(&f->lock);
    if (--f->depth == 0) fence_set(f, PROT_NONE);
    unlock(&f->lock);
}

// A copy's end on the wrong side of the fence is a bug the GPU would show as an illegal address or a
// failed cudaMemcpy.
static void expect_side(Backend* be, const void* p, size_t bytes, int backend, const char* op, const char* end) {
    if (bytes && behind_fence(be, p) != backend)
        fail("internal: %s's %s is %s memory, not %s memory", op, end, backend ? "host" : "backend", backend ? "backend" : "host");
}

static void* fence_alloc(Backend* be, size_t total) {
    Fence* f = &be->fence;
    lock(&f->lock);
    if (total > FENCE_RESERVED - f->top) fail("the fenced backend's %zu reserved bytes are used up", FENCE_RESERVED);
    unsigned char* p = f->base + f->top;
    f->top += total;
    fence_set(f, PROT_READ | PROT_WRITE);   // inside be_malloc: open, like the rest
    unlock(&f->lock);
    return p;
}

// Gives the whole pages inside [p, p + total) back; their addresses stay reserved and are never handed out again.
static void fence_release(unsigned char* p, size_t total) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + total) / page * page;
    if (b > a && madvise((void*)a, b - a, MADV_DONTNEED) != 0) fail("madvise of freed backend memory: %s", strerror(errno));
}
#else
static void expect_side(Backend* be, const void* p, size_t bytes, int backend, const char* op, const char* end) {
    (void)be, (void)p, (void)bytes, (void)backend, (void)op, (void)end;
}
#endif

// A copy's two ends, each backend memory (1) or host memory (0).
static void expect_ends(Backend* be, const void* dst, int dst_backend, const void* src, int src_backend, size_t bytes, const char* op) {
    expect_side(be, dst, bytes, dst_backend, op, "destination");
    expect_side(be, src, bytes, src_backend, op, "source");
}

Backend* backend_create(int local_rank) {
    (void)local_rank;
    Backend* be = xcalloc(1, sizeof(Backend));
    be->variants = gpu_variants_from_env();
    check_pthread(pthread_mutex_init(&be->copy_lock, NULL), "pthread_mutex_init");
#ifdef BACKEND_FENCE
    check_pthread(pthread_mutex_init(&be->fence.lock, NULL), "pthread_mutex_init");
    be->fence.mapping = mmap(NULL, FENCE_RESERVED + FENCE_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (be->fence.mapping == MAP_FAILED) fail("cannot reserve the fenced backend's memory: %s", strerror(errno));
    be->fence.base = (unsigned char*)(((uintptr_t)be->fence.mapping + FENCE_HUGE - 1) / FENCE_HUGE * FENCE_HUGE);
    // Only speed depends on it: a kernel without transparent huge pages says EINVAL and the fence still holds.
    if (madvise(be->fence.base, FENCE_RESERVED, MADV_HUGEPAGE) != 0 && errno != EINVAL)
        fail("madvise(MADV_HUGEPAGE) of the fenced backend's memory: %s", strerror(errno));
#endif
    return be;
}

void backend_destroy(Backend* be) {
    if (!be) return;
    be_synchronize(be);
    check_pthread(pthread_mutex_destroy(&be->copy_lock), "pthread_mutex_destroy");
#ifdef BACKEND_FENCE
    if (munmap(be->fence.mapping, FENCE_RESERVED + FENCE_HUGE) != 0) fail("munmap of the fenced backend's memory: %s", strerror(errno));
    check_pthread(pthread_mutex_destroy(&be->fence.lock), "pthread_mutex_destroy");
#endif
    for (int q = 0; q < NUM_COPY_QUEUES; q++) free(be->queues[q].pending);
    free(be);
}

unsigned backend_variants(const Backend* be) { return be->variants; }

#ifdef BACKEND_FENCE
const char* backend_device_name(const Backend* be) {
    (void)be;
    return "cpu (fenced)";
}

int backend_is_gpu(const Backend* be) {
    (void)be;
    return 1;
}
#else
const char* backend_device_name(const Backend* be) {
    (void)be;
    return "cpu";
}

int backend_is_gpu(const Backend* be) {
    (void)be;
    return 0;
}
#endif

void* backend_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* backend_comm_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* be_malloc(Backend* be, size_t bytes) {
    BACKEND_ENTRY(be);
    size_t total = alloc_total(bytes);
    if (total < bytes) fail("out of host memory allocating %zu bytes", bytes);
#ifdef BACKEND_FENCE
    unsigned char* base = fence_alloc(be, total);
#else
    unsigned char* base = aligned_alloc(ALLOC_HEADER, total);
#endif
    if (!base) fail("out of host memory allocating %zu bytes (%zu in use)", bytes, be->bytes_now);
    memcpy(base, &bytes, sizeof bytes);
    be->bytes_now += bytes;
    if (be->bytes_now > be->bytes_peak) be->bytes_peak = be->bytes_now;
    return base + ALLOC_HEADER;
}

void be_free(Backend* be, void* p) {
    BACKEND_ENTRY(be);
    if (!p) return;
    expect_side(be, p, 1, 1, "be_free", "pointer");
    be_synchronize(be);   // a queued copy may still read or write p
    unsigned char* base = (unsigned char*)p - ALLOC_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    be->bytes_now -= bytes;
#ifdef BACKEND_FENCE
    fence_release(base, alloc_total(bytes));
#else
    free(base);
#endif
}

void be_memset0(Backend* be, void* p, size_t bytes) {
    BACKEND_ENTRY(be);
    expect_side(be, p, bytes, 1, "be_memset0", "buffer");
    if (bytes) memset(p, 0, bytes);
}

void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes) {
    BACKEND_ENTRY(be);
    expect_ends(be, dst, 1, src_host, 0, bytes, "be_upload");
    if (bytes) memcpy(dst, src_host, bytes);
}

void be_download(Backend* be, void* dst_host, const void* src, size_t bytes) {
    BACKEND_ENTRY(be);
    expect_ends(be, dst_host, 0, src, 1, bytes, "be_download");
    if (bytes) memcpy(dst_host, src, bytes);
}

void be_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    BACKEND_ENTRY(be);
    expect_ends(be, dst, 1, src, 1, bytes, "be_copy");
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void be_copy_rows(Backend* be, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows) {
    BACKEND_ENTRY(be);
    if (!rows || !row_bytes) return;
    expect_side(be, dst, 1, 1, "be_copy_rows", "destination");
    expect_side(be, src, 1, 1, "be_copy_rows", "source");
    for (size_t r = 0; r < rows; r++) memcpy((char*)dst + r * dst_pitch, (const char*)src + r * src_pitch, row_bytes);
}

#ifdef BACKEND_FENCE
// A GPU's copy engine may read a copy's source and write its destination at any moment between its issue and
// the wait for it, so neither may change in that window: the source keeps its hash from the issue, the
// destination its poison (issue_copy). A wait by the main stream (be_stream_wait) orders later kernels after
// the copy, but tells the host nothing: an upload's host source stays in flight, and a download's host
// destination stays poison, until the host waits (be_event_synchronize, be_synchronize).
static void check_source(const PendingCopy* c, const char* what, const char* window) {
    if (fnv1a(FNV1A_START, c->src, c->bytes) != c->src_hash)
        fail("internal: the source of an asynchronous %s of %zu bytes changed %s: on a GPU that is a race with the "
             "copy engine", what, c->bytes, window);
}

static void check_destination(const PendingCopy* c, const char* what) {
    const unsigned char* d = (const unsigned char*)c->dst;
    for (size_t i = 0; i < c->bytes; i++)
        if (d[i] != 0xff)
            fail("internal: the destination of an asynchronous %s of %zu bytes was written before the host waited for "
                 "it: on a GPU that is a race with the copy engine", what, c->bytes);
}

// After copy i of a queue has landed: where it overlaps a later copy's destination, that one may land any
// time from now on, so the bytes are poison again (and the later copy's check expects them so).
static void repoison_later(CopyQueue* cq, size_t i) {
    const unsigned char* lo = (const unsigned char*)cq->pending[i].dst;
    const unsigned char* hi = lo + cq->pending[i].bytes;
    for (size_t k = i + 1; k < cq->n_pending; k++) {
        unsigned char* a = (unsigned char*)cq->pending[k].dst;
        unsigned char* b = a + cq->pending[k].bytes;
        unsigned char* from = a > lo ? a : (unsigned char*)lo;
        unsigned char* to = b < hi ? b : (unsigned char*)hi;
        if (from < to) memset(from, 0xff, (size_t)(to - from));
    }
}

// The copy as the device sees it: an upload lands; a download's bytes are taken, not yet shown to the host.
static void run_for_device(CopyQueue* cq, size_t i, int q) {
    PendingCopy* c = &cq->pending[i];
    check_source(c, q == COPY_UP ? "upload" : "download", "between its issue and its wait");
    if (q == COPY_UP) {
        check_destination(c, "upload");
        if (c->bytes) memcpy(c->dst, c->src, c->bytes);
        repoison_later(cq, i);
    } else {
        c->shadow = xmalloc(c->bytes ? c->bytes : 1);
        if (c->bytes) memcpy(c->shadow, c->src, c->bytes);
    }
    c->ran = 1;
}

static void finish_for_host(CopyQueue* cq, size_t i, int q) {
    PendingCopy* c = &cq->pending[i];
    if (q == COPY_UP) {
        check_source(c, "upload", "after the main stream waited for it but before the host did");
        return;
    }
    check_destination(c, "download");
    if (c->bytes) memcpy(c->dst, c->shadow, c->bytes);
    free(c->shadow);
    repoison_later(cq, i);
}
#endif

// Runs, oldest first, the copies of queue q issued up to and including seq; each copy stream keeps its order.
// host_waits: the host waits for them, not only the main stream (which the CPU build cannot tell apart: it
// runs them either way).
static void run_copies_through(Backend* be, int q, uint64_t seq, int host_waits) {
    lock(&be->copy_lock);
    CopyQueue* cq = &be->queues[q];
    size_t n = 0;
    for (; n < cq->n_pending && cq->pending[n].seq <= seq; n++) {
#ifdef BACKEND_FENCE
        if (!cq->pending[n].ran) run_for_device(cq, n, q);
        if (host_waits) finish_for_host(cq, n, q);
#else
        PendingCopy* c = &cq->pending[n];
        if (c->bytes) memcpy(c->dst, c->src, c->bytes);
#endif
    }
#ifdef BACKEND_FENCE
    size_t done = host_waits ? n : 0;   // ran for the main stream; the host has yet to wait
#else
    size_t done = n;
    (void)host_waits;
#endif
    if (done) {   // (never arithmetic on the queue before its first copy: it is NULL then)
        memmove(cq->pending, cq->pending + done, (cq->n_pending - done) * sizeof(PendingCopy));
        cq->n_pending -= done;
    }
    unlock(&be->copy_lock);
}

static void issue_copy(Backend* be, int q, void* dst, const void* src, size_t bytes, BeEvent* done) {
    lock(&be->copy_lock);
    CopyQueue* cq = &be->queues[q];
    if (cq->n_pending == cq->cap_pending) {
        size_t cap = cq->cap_pending ? 2 * cq->cap_pending : 16;
        PendingCopy* p = realloc(cq->pending, cap * sizeof(PendingCopy));
        if (!p) fail("out of host memory queueing an asynchronous copy");
        cq->pending = p;
        cq->cap_pending = cap;
    }
    cq->pending[cq->n_pending++] = (PendingCopy){.dst = dst, .src = src, .bytes = bytes, .seq = ++cq->issued};
#ifdef BACKEND_FENCE
    cq->pending[cq->n_pending - 1].src_hash = fnv1a(FNV1A_START, src, bytes);
#endif
    // A GPU's copy engine may write dst at any moment from now until the wait; the earliest is the strictest.
    // Poisoned until then, a read of dst before the wait (by the main stream or the host) sees NaNs and -1s,
    // where it would otherwise see the old bytes, often the right ones.
    if (bytes) memset(dst, 0xff, bytes);
    done->queue = q;
    done->seq = cq->issued;
    unlock(&be->copy_lock);
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
    BACKEND_ENTRY(be);
    expect_ends(be, dst_host, 0, src, 1, bytes, "be_download_async");
    issue_copy(be, COPY_DOWN, dst_host, src, bytes, done);
}

void be_upload_async(Backend* be, void* dst, const void* src_host, size_t bytes, BeEvent* done) {
    BACKEND_ENTRY(be);
    expect_ends(be, dst, 1, src_host, 0, bytes, "be_upload_async");
    issue_copy(be, COPY_UP, dst, src_host, bytes, done);
}

// The main stream's later work runs at once, so "after ev" means: run ev's copy now.
void be_stream_wait(Backend* be, BeEvent* ev) {
    BACKEND_ENTRY(be);
    run_copies_through(be, ev->queue, ev->seq, 0);
}

void be_event_synchronize(Backend* be, BeEvent* ev) {
    BACKEND_ENTRY(be);
    run_copies_through(be, ev->queue, ev->seq, 1);
}

void be_synchronize(Backend* be) {
    BACKEND_ENTRY(be);
    for (int q = 0; q < NUM_COPY_QUEUES; q++) run_copies_through(be, q, UINT64_MAX, 1);
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
    BACKEND_ENTRY(be, dst, src);
    if (dst_dt == src_dt) {
        be_copy(be, dst, src, n * dtype_size(dst_dt));
        return;
    }
    // Widening to fp32 first is exact, so bf16 -> fp16 rounds once, from the true value.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dst, i, ld(src, i, src_dt), dst_dt);
}

int backend_build_is_gpu(void) { return 0; }
