// delayed_update.c: see delayed_update.h.
#include "core/zero/delayed_update.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/adamw_host.h"
#include "core/util/phase_timer.h"

// A span this rank updates and its place in the pending buffers. The spans never change, so they are listed
// once; the thread reads only this list, the host state and the pending buffers.
typedef struct {
    StateSpan span;
    size_t at;
} PendingSpan;

struct DelayedUpdate {
    ModelState ms;
    PendingSpan* spans;
    int num_spans;
    AdamWArgs args;    // of the update in flight
    double seconds;    // the thread's time for it
    pthread_t thread;
    int in_flight;
};

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
    return d;
}

static void* pending_at(void* base, size_t index, DType dt) { return (char*)base + index * dtype_size(dt); }

static void* run_update(void* arg) {
    DelayedUpdate* d = (DelayedUpdate*)arg;
    double t0 = now_seconds();
    for (int i = 0; i < d->num_spans; i++) {
        const StateSpan* s = &d->spans[i].span;
        size_t at = d->spans[i].at;
        AdamWArgs a = adamw_span_args(&d->args, s);
        adamw_host(pending_at(d->ms.pending.params, at, d->ms.dt), d->ms.dt, s->master,
                   pending_at(d->ms.pending.grad, at, s->grad_dt), s->grad_dt, s->m, s->v, s->n, adamw_span_offset(s), &a);
    }
    d->seconds = now_seconds() - t0;
    return NULL;
}

void delayed_update_start(DelayedUpdate* d, Backend* be, const OptimizerStep* o, float grad_scale) {
    if (d->in_flight) fail("internal: a delayed update started while another is in flight");
    for (int i = 0; i < d->num_spans; i++) {
        const StateSpan* s = &d->spans[i].span;
        span_to_host(&d->ms, be, s, SPAN_GRAD, pending_at(d->ms.pending.grad, d->spans[i].at, s->grad_dt));
    }
    d->args = adamw_args(o, grad_scale);
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
    return 1;
}

double delayed_update_seconds(const DelayedUpdate* d) { return d->seconds; }

void delayed_update_destroy(DelayedUpdate* d) {
    if (d->in_flight) wait_update(d);
    free(d->spans);
    free(d);
}
