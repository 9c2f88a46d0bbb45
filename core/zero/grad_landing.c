// grad_landing.c: see grad_landing.h.
#include "core/zero/grad_landing.h"

#include <pthread.h>
#include <string.h>

#include "base/common.h"
#include "kernels/host_elem.h"
#include "core/util/phase_timer.h"

#ifdef _OPENMP   // the trainers; the fuzz harnesses build without OpenMP
#include <omp.h>
#endif

typedef struct {
    void* outbox;       // backend memory, max_piece elements of dt
    void* landing;      // pinned host memory, the same size
    BeEvent* arrived;   // the download of outbox into landing
    float* acc;         // where the piece is added, and how many elements
    size_t n;
    int queued;         // taken by a piece not yet added (under lock)
} Slot;

struct GradLanding {
    Backend* be;
    DType dt;
    size_t max_piece;
    int threads;        // the worker's OpenMP threads (worker_threads)
    Slot slots[GRAD_LANDING_SLOTS];
    int next_fill;      // launch thread: the slot the next piece takes
    int next_add;       // worker: the slot it adds next (pieces are added in the order queued)
    int stop;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    pthread_t worker;
    double wait_seconds;
};

static void check_rc(int rc, const char* what) {
    if (rc != 0) fail("-offload 2: %s failed: %s", what, strerror(rc));
}

static void lock(GradLanding* g) { check_rc(pthread_mutex_lock(&g->lock), "pthread_mutex_lock"); }
static void unlock(GradLanding* g) { check_rc(pthread_mutex_unlock(&g->lock), "pthread_mutex_unlock"); }
static void wait_changed(GradLanding* g) { check_rc(pthread_cond_wait(&g->changed, &g->lock), "pthread_cond_wait"); }
static void signal_changed(GradLanding* g) { check_rc(pthread_cond_broadcast(&g->changed), "pthread_cond_broadcast"); }

// Half the rank's OpenMP threads: the launch thread's kernels (CPU) or -dpu's host update run beside the
// worker, and its additions are bound by memory anyway.
static int worker_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads() > 1 ? omp_get_max_threads() / 2 : 1;
#else
    return 1;
#endif
}

static void* add_landed_pieces(void* arg) {
    GradLanding* g = (GradLanding*)arg;
#ifdef _OPENMP
    omp_set_num_threads(g->threads);
#endif
    lock(g);
    for (;;) {
        Slot* s = &g->slots[g->next_add];
        while (!s->queued && !g->stop) wait_changed(g);
        if (!s->queued) break;   // stopping, and nothing left to add
        unlock(g);
        be_event_synchronize(g->be, s->arrived);
        host_accumulate(s->acc, s->landing, g->dt, s->n);
        lock(g);
        s->queued = 0;
        g->next_add = (g->next_add + 1) % GRAD_LANDING_SLOTS;
        signal_changed(g);
    }
    unlock(g);
    return NULL;
}

GradLanding* grad_landing_create(Backend* be, MemLedger* mem, DType dt, size_t max_piece) {
    size_t bytes = max_piece * dtype_size(dt);
    if (!be) {
        for (int i = 0; i < GRAD_LANDING_SLOTS; i++) {
            mem_alloc(NULL, mem, MEM_GRADS, bytes);
            mem_alloc_host(NULL, mem, MEM_HOST_GRADS, bytes);
        }
        return NULL;
    }
    GradLanding* g = (GradLanding*)xcalloc(1, sizeof(GradLanding));
    g->be = be;
    g->dt = dt;
    g->max_piece = max_piece;
    g->threads = worker_threads();
    for (int i = 0; i < GRAD_LANDING_SLOTS; i++) {
        g->slots[i].outbox = mem_alloc(be, mem, MEM_GRADS, bytes);
        g->slots[i].landing = mem_alloc_host(be, mem, MEM_HOST_GRADS, bytes);
        g->slots[i].arrived = be_event_create(be);
    }
    check_rc(pthread_mutex_init(&g->lock, NULL), "pthread_mutex_init");
    check_rc(pthread_cond_init(&g->changed, NULL), "pthread_cond_init");
    check_rc(pthread_create(&g->worker, NULL, add_landed_pieces, g), "starting the gradient landing thread");
    return g;
}

void grad_landing_add(GradLanding* g, Backend* be, float* acc, const void* piece, size_t n) {
    if (n > g->max_piece) fail("internal: a gradient piece of %zu elements for landing slots of %zu", n, g->max_piece);
    Slot* s = &g->slots[g->next_fill];
    double t0 = now_seconds();
    lock(g);
    while (s->queued) wait_changed(g);   // its last piece is added, so that piece's download is done too
    unlock(g);
    g->wait_seconds += now_seconds() - t0;
    size_t bytes = n * dtype_size(g->dt);
    be_copy(be, s->outbox, piece, bytes);
    be_download_async(be, s->landing, s->outbox, bytes, s->arrived);
    lock(g);
    s->acc = acc;
    s->n = n;
    s->queued = 1;
    signal_changed(g);
    unlock(g);
    g->next_fill = (g->next_fill + 1) % GRAD_LANDING_SLOTS;
}

void grad_landing_drain(GradLanding* g) {
    double t0 = now_seconds();
    lock(g);
    for (int i = 0; i < GRAD_LANDING_SLOTS; i++)
        while (g->slots[i].queued) wait_changed(g);
    unlock(g);
    g->wait_seconds += now_seconds() - t0;
}

double grad_landing_wait_seconds(GradLanding* g) {
    double s = g->wait_seconds;
    g->wait_seconds = 0;
    return s;
}

void grad_landing_destroy(GradLanding* g, Backend* be) {
    if (!g) return;
    grad_landing_drain(g);
    lock(g);
    g->stop = 1;
    signal_changed(g);
    unlock(g);
    check_rc(pthread_join(g->worker, NULL), "joining the gradient landing thread");
    check_rc(pthread_cond_destroy(&g->changed), "pthread_cond_destroy");
    check_rc(pthread_mutex_destroy(&g->lock), "pthread_mutex_destroy");
    for (int i = 0; i < GRAD_LANDING_SLOTS; i++) {
        be_free(be, g->slots[i].outbox);
        be_host_free(be, g->slots[i].landing);
        be_event_destroy(be, g->slots[i].arrived);
    }
    free(g);
}
