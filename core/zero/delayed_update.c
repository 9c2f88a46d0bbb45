// delayed_update.c: see delayed_update.h.
#include "core/zero/delayed_update.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/util/phase_timer.h"

// A span this rank updates and its place in the pending buffers. The spans never change, so they are listed
// once; the thread reads only its own list, the state (host memory, or the disk through a pass) and the
// pending buffers.
typedef struct {
    StateSpan span;
    size_t at;
} PendingSpan;

struct DelayedUpdate {
    ModelState ms;
    PendingSpan* spans;
    int num_spans;
    ModelState pending_ms;    // ms with the gradient and the working copy in the pending buffers (host memory)
    StateSpan* pending;       // the spans as the thread sees them: gradient and working copy pointing there
    StepArgs args;     // of the update in flight
    double seconds;    // the thread's time for it
    pthread_t thread;
    int in_flight;
};

static void* pending_at(void* base, size_t index, DType dt) { return (char*)base + index * dtype_size(dt); }

// The thread's view: the same spans, reading the gradient from and writing the working copy to the pending
// buffers, so it needs no backend and the walk's working copy stays as it was until the landing.
static void list_pending(DelayedUpdate* d) {
    d->pending_ms = d->ms;
    d->pending_ms.places.grads = IN_HOST;
    d->pending_ms.places.params = IN_HOST;
    d->pending_ms.stage = (HostStage){0};
    d->pending = (StateSpan*)xmalloc(sizeof(StateSpan) * (size_t)(d->num_spans ? d->num_spans : 1));
    for (int i = 0; i < d->num_spans; i++) {
        StateSpan s = d->spans[i].span;
        s.grad = pending_at(d->ms.pending.grad, d->spans[i].at, s.grad_dt);
        s.params = pending_at(d->ms.pending.params, d->spans[i].at, d->ms.dt);
        d->pending[i] = s;
    }
}

DelayedUpdate* delayed_update_create(const ModelState* ms) {
    if (!ms->pending.grad || !ms->pending.params) fail("internal: a delayed update without its host buffers");
    DelayedUpdate* d = (DelayedUpdate*)xmalloc(sizeof(DelayedUpdate));
    memset(d, 0, sizeof(*d));
    d->ms = *ms;
    StateSpan* spans = state_spans(ms, STATE_UPDATE, &d->num_spans);
    d->spans = (PendingSpan*)xmalloc(sizeof(PendingSpan) * (size_t)(d->num_spans ? d->num_spans : 1));
    size_t at = 0;   // each span's place in the pending buffers: packed in order
    for (int i = 0; i < d->num_spans; i++) {
        d->spans[i] = (PendingSpan){.span = spans[i], .at = at};
        at += spans[i].n;
    }
    free(spans);
    list_pending(d);
    return d;
}

static void* run_update(void* arg) {
    DelayedUpdate* d = (DelayedUpdate*)arg;
    double t0 = now_seconds();
    optimizer_host_spans(&d->pending_ms, NULL, d->pending, d->num_spans, &d->args);
    d->seconds = now_seconds() - t0;
    return NULL;
}

void delayed_update_start(DelayedUpdate* d, Backend* be, const OptimizerStep* o, float grad_scale) {
    if (d->in_flight) fail("internal: a delayed update started while another is in flight");
    for (int i = 0; i < d->num_spans; i++) {
        const StateSpan* s = &d->spans[i].span;
        span_to_host(&d->ms, be, s, SPAN_GRAD, pending_at(d->ms.pending.grad, d->spans[i].at, s->grad_dt));
    }
    d->args = optimizer_args(o, grad_scale);
    int rc = pthread_create(&d->thread, NULL, run_update, d);
    if (rc) fail("-dpu: cannot start the host thread of the delayed update: %s", strerror(rc));
    d->in_flight = 1;
}

static void wait_update(DelayedUpdate* d) {
    int rc = pthread_join(d->thread, NULL);
    if (rc) fail("-dpu: waiting for the delayed update failed: %s", strerror(rc));
    d->in_flight = 0;
}

int delayed_update_finish(DelayedUpdate* d, Backend* be) {
    if (!d->in_flight) return 0;
    wait_update(d);
    state_before_host_writes(&d->ms, be);
    for (int i = 0; i < d->num_spans; i++) {
        const StateSpan* s = &d->spans[i].span;
        span_from_host(&d->ms, be, s, SPAN_PARAMS, pending_at(d->ms.pending.params, d->spans[i].at, d->ms.dt));
    }
    state_flush(&d->ms);
    return 1;
}

double delayed_update_seconds(const DelayedUpdate* d) { return d->seconds; }

void delayed_update_destroy(DelayedUpdate* d) {
    if (d->in_flight) wait_update(d);
    free(d->spans);
    free(d->pending);
    free(d);
}
