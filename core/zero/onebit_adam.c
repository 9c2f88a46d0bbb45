// onebit_adam.c: see onebit_adam.h. The arithmetic runs on the host over one unit (or span) at a time, its
// buffers copied down and back up: in the CPU build those copies are memcpy; in the GPU build they make it a
// correctness path, with no kernels of its own.
#include "core/zero/onebit_adam.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "core/zero/feedback_file.h"
#include "kernels/dtype.h"
#include "kernels/host_elem.h"

void onebit_init(OnebitBuffers* b, Backend* be, MemLedger* mem, const Pieces* pc, int shard_grads) {
    int last = pc->lay->num_units - 1;
    *b = (OnebitBuffers){.whole = feedback_whole_len(pc),
                         .mine = last < 0 ? 0 : pc->mine_offset[last] + pc->mine_len[last]};
    size_t largest = 0;
    for (int u = 0; u <= last; u++) {
        if (pc->grad_len[u] != (size_t)pc->size * pc->mine_len[u])
            fail("internal: unit %d's gradient (%zu) is not %d chunks of %zu", u, pc->grad_len[u], pc->size, pc->mine_len[u]);
        largest = pc->mine_len[u] > largest ? pc->mine_len[u] : largest;
    }
    b->momentum = (float*)mem_alloc(be, mem, MEM_OPTIMIZER, b->whole * 4);
    b->worker_err = (float*)mem_alloc(be, mem, MEM_OPTIMIZER, b->whole * 4);
    b->server_err = (float*)mem_alloc(be, mem, MEM_OPTIMIZER, b->mine * 4);
    if (shard_grads) b->local = (float*)mem_alloc(be, mem, MEM_GRADS, b->whole * 4);
    size_t words = (size_t)pc->size * onebit_block_words(largest) * 4;
    mem_alloc(NULL, mem, MEM_COMM, 2 * words);   // the scratch's two message buffers, allocated below
    if (be) b->scratch = onebit_scratch(be, pc->size, largest);
}

void onebit_free(OnebitBuffers* b, Backend* be) {
    float* bufs[] = {b->momentum, b->worker_err, b->server_err, b->local};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]) be_free(be, bufs[i]);
    if (b->scratch.send) onebit_scratch_free(&b->scratch, be);
    *b = (OnebitBuffers){0};
}

// ---------------------------------------------------------------------------------------------------
// Checkpoints.

static const FeedbackKind ONEBIT_FILE = {.name = "1-bit Adam", .prefix = "onebit", .magic = "ONEBIT2", .flag = "-opt adam1bit",
                                         .has_chunks = 1};

void onebit_save(const OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir) {
    float* worker = (float*)xmalloc(b->whole * 4 + 4);
    float* server = (float*)xmalloc(b->mine * 4 + 4);
    be_download(be, worker, b->worker_err, b->whole * 4);
    be_download(be, server, b->server_err, b->mine * 4);
    feedback_file_save(&ONEBIT_FILE, pc, dir, worker, server);
    free(worker), free(server);
}

void onebit_load(OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir) {
    float* worker = (float*)xmalloc(b->whole * 4 + 4);
    float* server = (float*)xmalloc(b->mine * 4 + 4);
    int writers = feedback_file_load(&ONEBIT_FILE, pc, dir, worker, server);
    if (writers != pc->size && pc->rank == 0)
        printf("1-bit Adam: the errors of %d ranks resharded for %d: the server chunks recut, each worker error their mean\n", writers, pc->size);
    be_upload(be, b->worker_err, worker, b->whole * 4);
    be_upload(be, b->server_err, server, b->mine * 4);
    b->has_momentum = 0;
    free(worker), free(server);
}

// ---------------------------------------------------------------------------------------------------
// The exchange.

// Whether every element of every rank's local gradient is finite (one host reduction over the group).
static int local_finite(const Pieces* pc, Backend* be, const void* local, DType dt, float* host, size_t whole) {
    size_t x = dtype_size(dt);
    void* raw = xmalloc(whole * x + 1);
    be_download(be, raw, local, whole * x);
    host_from_dtype(host, raw, dt, whole);
    free(raw);
    long long bad = 0;
    for (size_t i = 0; i < whole; i++) bad |= !isfinite(host[i]);
    if (pc->size > 1) comm_allreduce_host_max_i64(pc->dp, &bad, 1);
    return !bad;
}

// A step that changes nothing: one non-finite element of this rank's reduced buffer makes the group's norm
// non-finite, and the trainer skips the update everywhere.
static void mark_skipped(Backend* be, void* reduced, DType dt) {
    float x[1] = {NAN};
    uint16_t low[1];
    if (dt == DT_FP32) be_upload(be, reduced, x, 4);
    else {
        host_to_dtype(low, dt, x, 1);
        be_upload(be, reduced, low, 2);
    }
}

// The worker's momentum from the state's m, whole on every rank: each rank places the m of the spans it
// holds, and with sharded state the ranks' disjoint placements are summed (x + 0 is exact).
typedef struct {
    const Pieces* pc;
    const ModelState* ms;
    Backend* be;
    float* host;   // whole layout
} MomentumFill;

static void place_span_m(const StateSpan* s, void* ctx) {
    MomentumFill* f = (MomentumFill*)ctx;
    int u = s->t->unit;
    size_t at = f->pc->grad_offset[u] + unit_grad_index(f->pc->lay, u, s->flat);
    span_to_host(f->ms, f->be, s, span_optimizer_buffer(1), f->host + at);
}

static void momentum_from_state(OnebitBuffers* b, Backend* be, const Pieces* pc, const ModelState* ms, int sharded) {
    MomentumFill f = {.pc = pc, .ms = ms, .be = be, .host = (float*)xcalloc(b->whole + 1, sizeof(float))};
    ms->for_each_span(ms->ctx, STATE_UPDATE, place_span_m, &f);
    be_upload(be, b->momentum, f.host, b->whole * 4);
    if (sharded && pc->size > 1) comm_allreduce_sum(pc->dp, b->momentum, b->whole, DT_FP32);
    free(f.host);
    b->has_momentum = 1;
}

// m rounded to what the reduced buffer holds: m' = dt(m ls) / ls, the value the update will divide back out.
static void round_to_reduced(float* m, size_t n, DType dt, float loss_scale, void* low) {
    for (size_t i = 0; i < n; i++) m[i] *= loss_scale;
    if (dt != DT_FP32) {
        host_to_dtype(low, dt, m, n);
        host_from_dtype(m, low, dt, n);
    }
    for (size_t i = 0; i < n; i++) m[i] /= loss_scale;
}

// The padding between and after a unit's tensors has no parameter: its momentum is kept at 0 (the
// compressed exchange would give it +-scale), so the momentum is what the state's m pieces hold, all of it,
// and a resume rebuilds it exactly.
static void zero_padding(const Pieces* pc, int u, float* m, uint8_t* real) {
    const ParamLayout* lay = pc->lay;
    size_t n = pc->grad_len[u];
    memset(real, 0, n);
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (t->unit != u || !tensor_optimizer(lay, t)->updates) continue;
        memset(real + unit_grad_index(lay, u, t->offset), 1, t->size);
    }
    for (size_t i = 0; i < n; i++)
        if (!real[i]) m[i] = 0.0f;
}

typedef struct {
    float *g, *m, *ew, *es;   // host copies of one unit's local gradient, momentum, worker error; its server chunk
    void* low;                // the reduced dtype's staging
} UnitHost;

static void exchange_unit(OnebitBuffers* b, Backend* be, const Pieces* pc, int u, UnitHost* h, void* reduced, DType reduced_dt,
                          int reduced_is_piece, float beta1, float loss_scale) {
    size_t n = pc->grad_len[u], p = pc->mine_len[u], at = pc->grad_offset[u], mine = pc->mine_offset[u];
    if (!n) return;
    float* g = h->g + at;
    be_download(be, h->m, b->momentum + at, n * 4);
    be_download(be, h->ew, b->worker_err + at, n * 4);
    be_download(be, h->es, b->server_err + mine, p * 4);
    for (size_t i = 0; i < n; i++) h->m[i] = beta1 * h->m[i] + (1.0f - beta1) * (g[i] / loss_scale);
    onebit_allreduce(pc->dp, be, &b->scratch, h->m, h->ew, h->es, p);
    zero_padding(pc, u, h->m, h->low);
    round_to_reduced(h->m, n, reduced_dt, loss_scale, h->low);
    be_upload(be, b->momentum + at, h->m, n * 4);
    be_upload(be, b->worker_err + at, h->ew, n * 4);
    be_upload(be, b->server_err + mine, h->es, p * 4);
    // The reduced buffer takes m times the scale: a piece of it (this rank's chunk) or the whole unit.
    const float* src = reduced_is_piece ? h->m + pc->mine_first[u] : h->m;
    size_t len = reduced_is_piece ? p : n, dst = reduced_is_piece ? mine : at;
    float* scaled = g;   // this unit's local gradient is spent: it holds the scaled values
    for (size_t i = 0; i < len; i++) scaled[i] = src[i] * loss_scale;
    host_to_dtype(h->low, reduced_dt, scaled, len);
    be_upload(be, elem_at(reduced, dst, dtype_size(reduced_dt)), h->low, len * dtype_size(reduced_dt));
}

void onebit_exchange(OnebitBuffers* b, Backend* be, const Pieces* pc, const ModelState* ms, const void* local, DType local_dt,
                     void* reduced, DType reduced_dt, int reduced_is_piece, float beta1, float loss_scale) {
    size_t largest = 0;
    for (int u = 0; u < pc->lay->num_units; u++) largest = pc->grad_len[u] > largest ? pc->grad_len[u] : largest;
    UnitHost h = {.g = (float*)xmalloc((b->whole + 1) * 4), .m = (float*)xmalloc((largest + 1) * 4),
                  .ew = (float*)xmalloc((largest + 1) * 4), .es = (float*)xmalloc((largest + 1) * 4),
                  .low = xmalloc((largest + 1) * 4)};
    if (!local_finite(pc, be, local, local_dt, h.g, b->whole)) mark_skipped(be, reduced, reduced_dt);
    else {
        if (!b->has_momentum) momentum_from_state(b, be, pc, ms, reduced_is_piece);
        for (int u = 0; u < pc->lay->num_units; u++)
            if (!unit_is_mirror(pc->lay, u)) exchange_unit(b, be, pc, u, &h, reduced, reduced_dt, reduced_is_piece, beta1, loss_scale);
    }
    free(h.g), free(h.m), free(h.ew), free(h.es), free(h.low);
}

// ---------------------------------------------------------------------------------------------------
// The update after the freeze.

void onebit_update_on_host(const ModelState* ms, const StateSpan* s, size_t i, size_t k, void* params, const void* grad,
                           float* const* buf, const StepArgs* a) {
    AdamWArgs x = adamw_span_args(&a->adamw, s);
    float corr1 = 1.0f - powf(x.beta1, (float)x.step), corr2 = a->onebit.corr2, ls = a->onebit.loss_scale;
    size_t offset = span_canonical_offset(s) + i;
    float *master = buf[0], *m = buf[1], *v = buf[2];
    for (size_t e = 0; e < k; e++) {
        float mi = ld(grad, e, s->grad_dt) / ls;
        float w = master[e];
        float adam = v[e] > 0.0f ? (mi / corr1) / (sqrtf(v[e] / corr2) + x.eps) : 0.0f;   // the mask: header
        w = w - x.lr * (adam + x.weight_decay * w);
        m[e] = mi;
        master[e] = w;
        if (ms->dt == DT_BF16) ((uint16_t*)params)[e] = bf16_from_f32_stochastic(w, element_noise(x.seed, offset + e) & 0xffffu);
        else st(params, e, w, ms->dt);
    }
}

// Each span's master, state and gradient come down, are updated on the host, and go back up.
void onebit_update_on_backend(const ModelState* ms, Backend* be, const StateSpan* spans, int n, const StepArgs* a) {
    for (int j = 0; j < n; j++) {
        const StateSpan* s = &spans[j];
        size_t bytes = s->n * 4, pbytes = s->n * dtype_size(ms->dt);
        float* host = (float*)xmalloc(3 * bytes + 4);
        void* grad = xmalloc(s->n * dtype_size(s->grad_dt) + 4);
        void* params = xmalloc(pbytes + 4);
        float* buf[3] = {host, host + s->n, host + 2 * s->n};
        be_download(be, buf[0], s->master, bytes);
        be_download(be, buf[2], s->opt_state[1], bytes);
        be_download(be, grad, s->grad, s->n * dtype_size(s->grad_dt));
        onebit_update_on_host(ms, s, 0, s->n, params, grad, buf, a);
        be_upload(be, s->master, buf[0], bytes);
        be_upload(be, s->opt_state[0], buf[1], bytes);
        if (s->params != (void*)s->master) be_upload(be, s->params, params, pbytes);
        free(host), free(grad), free(params);
    }
}

