// optimizer.c: see optimizer.h.
#include "core/zero/optimizer.h"

#include <math.h>
#include <stdlib.h>

#include "base/common.h"
#include "kernels/adamw_host.h"
#include "core/util/rng.h"
#include "core/zero/onebit_adam.h"

// The end of the run of spans from i on with i's gradient dtype: a list call takes one dtype.
static int same_grad_dt(const StateSpan* spans, int i, int n) {
    int j = i + 1;
    while (j < n && spans[j].grad_dt == spans[i].grad_dt) j++;
    return j;
}

// The same with i's optimizer too: an update's list call is one optimizer's.
static int same_update(const StateSpan* spans, int i, int n) {
    int j = i + 1;
    while (j < n && spans[j].grad_dt == spans[i].grad_dt && spans[j].optimizer == spans[i].optimizer) j++;
    return j;
}

// The squares are summed where the gradients are: the same fp32 additions on either side. One list call
// per run of a gradient dtype, so a backend may batch the spans' launches.
static float squares_on_backend(const ModelState* ms, Backend* be) {
    int n;
    StateSpan* spans = state_spans(ms, STATE_NORM, &n);
    const void** x = (const void**)xmalloc(sizeof(void*) * (size_t)(n ? n : 1));
    size_t* len = (size_t*)xmalloc(sizeof(size_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) x[i] = spans[i].grad, len[i] = spans[i].n;
    be_memset0(be, ms->scratch, sizeof(float));
    for (int i = 0, j; i < n; i = j) {
        j = same_grad_dt(spans, i, n);
        sum_squares_spans(be, spans[i].grad_dt, ms->scratch, x + i, len + i, j - i);
    }
    float sum;
    be_download(be, &sum, ms->scratch, sizeof(float));
    free(x), free(len), free(spans);
    return sum;
}

static void add_squares_on_host(const StateSpan* s, void* ctx) {
    *(float*)ctx += (float)sum_squares_host(s->grad_dt, s->grad, s->n);
}

static float squares_on_host(const ModelState* ms) {
    float sum = 0.0f;
    ms->for_each_span(ms->ctx, STATE_NORM, add_squares_on_host, &sum);
    return sum;
}

double grad_global_norm(const ModelState* ms, Backend* be, Comm* tp, Comm* pp) {
    double sum = span_place(ms, SPAN_GRAD) == IN_HOST ? squares_on_host(ms) : squares_on_backend(ms, be);
    if (ms->parts) comm_allreduce_host_sum(ms->parts, &sum, 1);   // the other parts of this stage's units
    if (tp) comm_allreduce_host_sum(tp, &sum, 1);   // the other shards of this stage's blocks
    if (pp) comm_allreduce_host_sum(pp, &sum, 1);   // the other stages' layers
    return sqrt(sum);
}

float grad_clip_scale(double norm, float clip) {
    return (clip > 0.0f && norm > clip) ? (float)(clip / norm) : 1.0f;
}

AdamWArgs adamw_span_args(const AdamWArgs* a, const StateSpan* s) {
    AdamWArgs out = *a;
    if (!s->t->decay) out.weight_decay = 0.0f;
    return out;
}

size_t span_canonical_offset(const StateSpan* s) { return tensor_canonical(s->t, s->flat - s->t->offset); }

// ---------------------------------------------------------------------------------------------------
// Each optimizer's update, where the buffers of its spans are: on the backend over a list of spans of one
// gradient dtype (buffers in backend memory), or on the host over elements [i, i + k) of one span, its fp32
// buffers at buf[b] (host memory, optimizer_kind.h's order: the master, then the state).

typedef struct {
    void (*on_backend)(const ModelState* ms, Backend* be, const StateSpan* spans, int n, const StepArgs* a);
    void (*on_host)(const ModelState* ms, const StateSpan* s, size_t i, size_t k, void* params, const void* grad,
                    float* const* buf, const StepArgs* a);
} OptimizerUpdate;

// AdamW's state: m at opt_state[0], v at opt_state[1].
static AdamWSpan adamw_span(const StateSpan* s, const AdamWArgs* step) {
    AdamWSpan out = {.params = s->params, .master = s->master, .grads = s->grad, .m = s->opt_state[0], .v = s->opt_state[1],
                     .n = s->n, .offset = span_canonical_offset(s), .weight_decay = adamw_span_args(step, s).weight_decay};
    return out;
}

static void adamw_on_backend(const ModelState* ms, Backend* be, const StateSpan* spans, int n, const StepArgs* a) {
    AdamWSpan* list = (AdamWSpan*)xmalloc(sizeof(AdamWSpan) * (size_t)n);
    for (int i = 0; i < n; i++) list[i] = adamw_span(&spans[i], &a->adamw);
    adamw_update_spans(be, ms->dt, spans[0].grad_dt, list, n, &a->adamw);
    free(list);
}

static void adamw_on_host(const ModelState* ms, const StateSpan* s, size_t i, size_t k, void* params, const void* grad,
                          float* const* buf, const StepArgs* a) {
    AdamWArgs x = adamw_span_args(&a->adamw, s);
    adamw_host(params, ms->dt, buf[0], grad, s->grad_dt, buf[1], buf[2], k, span_canonical_offset(s) + i, &x);
}

static const OptimizerUpdate UPDATES[NUM_OPTIMIZERS] = {[OPT_ADAMW] = {adamw_on_backend, adamw_on_host}};

static const OptimizerUpdate ONEBIT_UPDATE = {onebit_update_on_backend, onebit_update_on_host};

// 1-bit Adam past its freeze updates AdamW's spans from the exchanged momentum.
static const OptimizerUpdate* update_of(const StateSpan* s, const StepArgs* a) {
    if (a->onebit.active && s->optimizer == OPT_ADAMW) return &ONEBIT_UPDATE;
    const OptimizerUpdate* u = &UPDATES[s->optimizer];
    if (!u->on_backend) fail("internal: a span of %s parameters to update", optimizer_kind(s->optimizer)->name);
    return u;
}

// One list call per run of a gradient dtype and an optimizer (the working copy's dtype is ms->dt throughout).
static void update_on_backend(const ModelState* ms, Backend* be, const StepArgs* step) {
    int n;
    StateSpan* spans = state_spans(ms, STATE_UPDATE, &n);
    for (int i = 0, j; i < n; i = j) {
        j = same_update(spans, i, n);
        update_of(&spans[i], step)->on_backend(ms, be, spans + i, j - i, step);
    }
    free(spans);
}

// ---------------------------------------------------------------------------------------------------
// State on the host (-offload). The spans go through the two staging buffers a chunk at a time: a chunk's
// reduced gradient comes down (unless it is on the host already), the span's optimizer runs on the host over
// its master and state (AdamW: adamw_host, the CPU twin's own code, so the same bits, each chunk's noise
// keyed by its canonical offsets), and the new working copy goes up (unless it lives on the host: then it is
// written in place). The copies run on the copy stream, so chunk c+1's download and chunk c-1's upload
// overlap chunk c's host update. With the state on disk (-nvme) the same walk is a pass over its chunks
// (model_state.h): a portion never crosses the end of one, and the master and state (and a working copy on
// disk) are read and written in the chunk the pass holds, while the store reads the next chunks and writes
// the last ones back.

typedef struct {
    StateSpan* spans;
    int n;
} SpanList;

static void count_span(const StateSpan* s, void* ctx) { ((SpanList*)ctx)->n++; }
static void list_span(const StateSpan* s, void* ctx) {
    SpanList* l = (SpanList*)ctx;
    l->spans[l->n++] = *s;
}

StateSpan* state_spans(const ModelState* ms, StateParts which, int* n) {
    SpanList l = {NULL, 0};
    ms->for_each_span(ms->ctx, which, count_span, &l);
    l.spans = (StateSpan*)xmalloc(sizeof(StateSpan) * (size_t)(l.n ? l.n : 1));
    l.n = 0;
    ms->for_each_span(ms->ctx, which, list_span, &l);
    *n = l.n;
    return l.spans;
}

typedef struct {
    const StateSpan* s;
    size_t i, k;   // elements [i, i + k) of the span
} Chunk;

typedef struct {
    const ModelState* ms;
    Backend* be;
    size_t chunk;           // elements per chunk: a staging buffer's, or (nothing staged) a whole span
    void* grad[2];          // staging buffer b's gradient part
    void* params[2];        // and its working-copy part
    BeEvent* down[2];       // the download into grad[b]
    BeEvent* up[2];         // the upload from params[b]
} Staging;

// Without staging buffers nothing is copied, and be may be NULL (-dpu's thread).
static Staging staging_open(const ModelState* ms, Backend* be) {
    Staging st = {.ms = ms, .be = be, .chunk = ms->stage.buf ? ms->stage.elems : (size_t)-1};
    if (!ms->stage.buf) return st;
    size_t grad_bytes = span_stage_bytes(ms, SPAN_GRAD, st.chunk * 4);
    size_t params_bytes = span_stage_bytes(ms, SPAN_PARAMS, st.chunk * dtype_size(ms->dt));
    for (int b = 0; b < 2; b++) {
        st.grad[b] = (char*)ms->stage.buf + b * (grad_bytes + params_bytes);
        st.params[b] = (char*)st.grad[b] + grad_bytes;
        st.down[b] = be_event_create(be);
        st.up[b] = be_event_create(be);
    }
    return st;
}

// The host waits for every upload (the copy stream runs them in order, so the last one's event covers
// them all): the main stream's later work sees them, and the next step may rewrite both buffers.
static void staging_close(Staging* st, int last_buffer) {
    if (!st->ms->stage.buf) return;
    if (last_buffer >= 0) span_stage_wait(st->ms, st->be, SPAN_PARAMS, st->up[last_buffer]);
    for (int b = 0; b < 2; b++) {
        be_event_destroy(st->be, st->down[b]);
        be_event_destroy(st->be, st->up[b]);
    }
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// The chunk after c in the order of spans[0 .. n); c.s == NULL at the end. It ends where its span, a
// staging buffer's worth or the disk's chunk ends.
static Chunk next_chunk(const ModelState* ms, const StateSpan* spans, int n, Chunk c, size_t chunk_elems) {
    size_t i = c.i + c.k;
    const StateSpan* s = c.s;
    while (s && i >= s->n) {
        s = s + 1 < spans + n ? s + 1 : NULL;
        i = 0;
    }
    Chunk out = {.s = s, .i = i, .k = s ? min_size(min_size(s->n - i, chunk_elems), state_chunk_left(ms, s->state + i)) : 0};
    return out;
}

static void start_download(Staging* st, const Chunk* c, int b) {
    if (c->s) span_fetch_async(st->ms, st->be, c->s, SPAN_GRAD, c->i, c->k, st->grad[b], st->down[b]);
}

static void update_chunk(Staging* st, const Chunk* c, int b, int reused, const StepArgs* step) {
    const ModelState* ms = st->ms;
    const StateSpan* s = c->s;
    size_t i = c->i;
    span_stage_wait(ms, st->be, SPAN_GRAD, st->down[b]);
    if (reused) span_stage_wait(ms, st->be, SPAN_PARAMS, st->up[b]);   // params[b] is free again
    state_pass_hold(ms, s->state + i);
    void* params = span_host_view(ms, s, SPAN_PARAMS, i, st->params[b]);
    const void* grad = span_host_view(ms, s, SPAN_GRAD, i, st->grad[b]);
    float* buf[1 + OPT_MAX_STATE];
    for (int k = 0; k < optimizer_buffers(optimizer_kind(s->optimizer)); k++)
        buf[k] = (float*)span_host_view(ms, s, span_optimizer_buffer(k), i, NULL);
    update_of(s, step)->on_host(ms, s, i, c->k, params, grad, buf, step);
    span_store_async(ms, st->be, s, SPAN_PARAMS, i, c->k, params, st->up[b]);
}

void optimizer_host_spans(const ModelState* ms, Backend* be, const StateSpan* spans, int n_spans, const StepArgs* step) {
    Staging st = staging_open(ms, be);
    state_pass_begin(ms);
    Chunk c = next_chunk(ms, spans, n_spans, (Chunk){.s = n_spans ? spans : NULL}, st.chunk);
    int b = 0, last = -1;
    start_download(&st, &c, 0);
    for (int n = 0; c.s; n++, b = 1 - b) {
        Chunk next = next_chunk(ms, spans, n_spans, c, st.chunk);
        start_download(&st, &next, 1 - b);   // grad[1 - b] was last read by chunk n - 1's update, done
        update_chunk(&st, &c, b, n >= 2, step);
        last = b;
        c = next;
    }
    staging_close(&st, last);
    state_pass_end(ms);
}

static void update_on_host(const ModelState* ms, Backend* be, const StepArgs* step) {
    int n_spans;
    StateSpan* spans = state_spans(ms, STATE_UPDATE, &n_spans);
    optimizer_host_spans(ms, be, spans, n_spans, step);
    free(spans);
}

StepArgs optimizer_args(const OptimizerStep* o, float grad_scale) {
    Rng r = rng_seeded(o->seed, 0x5eed0000ull + (uint64_t)o->step);
    StepArgs a = {.adamw = {.lr = o->lr,
                            .beta1 = o->beta1,
                            .beta2 = o->beta2,
                            .eps = o->eps,
                            .weight_decay = o->weight_decay,
                            .grad_scale = grad_scale,
                            .step = o->step + 1,
                            .seed = (uint32_t)rng_next_u64(&r)},
                  .onebit = {.active = o->freeze > 0 && o->step >= o->freeze,
                             .loss_scale = o->loss_scale,
                             .corr2 = 1.0f - powf(o->beta2, (float)o->freeze)}};
    return a;
}

void optimizer_step(const ModelState* ms, Backend* be, const OptimizerStep* o, float grad_scale) {
    StepArgs args = optimizer_args(o, grad_scale);
    state_before_host_writes(ms, be);
    // The update runs where the master and the state are: a host update leaves the backend only the copies.
    if (span_place(ms, SPAN_MASTER) != IN_BACKEND) update_on_host(ms, be, &args);
    else update_on_backend(ms, be, &args);
}
