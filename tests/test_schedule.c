// test_schedule.c: the pipeline schedules (1f1b, interleaved, zb) and the stage split (core/pipeline/schedule.h),
// exhaustively for P = 1..8 stages, m = 1..16 micro-batches (m < P included) and V = 2..4 virtual stages.
// Each property is checked by code written from the spec, not from the generator, and each checker is
// shown to fail on a broken schedule (the "catches" checks), so a checker that silently accepts everything
// cannot pass.
//
//   ./build/test_schedule                      run the checks
//   ./build/test_schedule print KIND P m [V]   print every stage's schedule (compute, then with
//                                              communication), its bubble and peaks, and the d12 split
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "core/pipeline/schedule.h"
#include "tests/testlib.h"

#define MAX_P 8
#define MAX_M 16
#define MAX_V 4
#define MAX_MSG (MAX_V * MAX_M + 8)

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

typedef struct {
    ScheduleKind kind;
    int P, m, V;
} Case;

// Every stage's schedule for the case; ss has room for MAX_P.
static void build_all(Case c, StageSchedule* ss) {
    for (int s = 0; s < c.P; s++) schedule_build(c.kind, c.P, c.m, c.V, s, &ss[s]);
}
static void free_all(int P, StageSchedule* ss) {
    for (int s = 0; s < P; s++) schedule_free(&ss[s]);
}

// A deep copy, so a "catches" check can break it without touching the original.
static StageSchedule copy_schedule(const StageSchedule* s) {
    StageSchedule c = *s;
    c.actions = xmalloc((size_t)(s->count + 1) * sizeof(Action));
    memcpy(c.actions, s->actions, (size_t)s->count * sizeof(Action));
    return c;
}

static int is_zb(const StageSchedule* st) { return st->kind == SCHEDULE_ZB; }
// The backward that sends a gradient upstream: the whole backward, or zb's B.
static ActionKind upstream_backward(const StageSchedule* st) { return is_zb(st) ? ACT_BACKWARD_INPUT : ACT_BACKWARD; }
static int vstage(const StageSchedule* st, int chunk) { return chunk * st->num_stages + st->stage; }
static int first_v(const StageSchedule* st, int chunk) { return vstage(st, chunk) == 0; }
static int last_v(const StageSchedule* st, int chunk) { return vstage(st, chunk) == st->num_stages * st->num_chunks - 1; }

// ---- per-stage order ----

// Valid for any schedule: per chunk, forwards 0..m-1 in order, backwards 0..m-1 in order after their
// forwards; under zb the B's and the W's each in order, each W after its B; only the schedule's kinds.
static const char* check_valid_order(const StageSchedule* st) {
    int fwd[MAX_CHUNKS] = {0}, bwd[MAX_CHUNKS] = {0}, wgt[MAX_CHUNKS] = {0};
    ActionKind back = upstream_backward(st);
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        if (a->chunk < 0 || a->chunk >= st->num_chunks) return "chunk out of range";
        int c = a->chunk;
        if (a->kind == ACT_FORWARD && a->micro != fwd[c]++) return "forwards out of order";
        if (a->kind == back && a->micro != bwd[c]++) return "backwards out of order";
        if (a->kind == back && a->micro >= fwd[c]) return "backward before its forward";
        if (a->kind == ACT_BACKWARD_WEIGHT && (!is_zb(st) || a->micro != wgt[c]++)) return "weight gradients out of order";
        if (a->kind == ACT_BACKWARD_WEIGHT && a->micro >= bwd[c]) return "weight gradient before its input gradient";
        if (action_is_compute(a->kind) && a->kind != ACT_FORWARD && a->kind != back && a->kind != ACT_BACKWARD_WEIGHT)
            return "a backward kind this schedule does not use";
    }
    for (int c = 0; c < st->num_chunks; c++)
        if (fwd[c] != st->num_micro || bwd[c] != st->num_micro || wgt[c] != (is_zb(st) ? st->num_micro : 0))
            return "not every micro-batch ran every pass";
    return NULL;
}

// The compute letters of a list: F, B (either backward that sends upstream), W.
static int compute_string(const StageSchedule* st, char* out, int cap) {
    int k = 0;
    for (int i = 0; i < st->count && k < cap - 1; i++) {
        ActionKind t = st->actions[i].kind;
        if (action_is_compute(t)) out[k++] = t == ACT_FORWARD ? 'F' : t == ACT_BACKWARD_WEIGHT ? 'W' : 'B';
    }
    out[k] = 0;
    return k;
}

// 1F1B's shape F^w (F B)^(n-w) B^w over n compute pairs with warm-up w.
static const char* check_warmup_shape(const StageSchedule* st, int n, int w) {
    if (st->num_warmup != w) return "num_warmup is not the schedule's warm-up";
    char want[8 * MAX_V * MAX_M + 1], got[8 * MAX_V * MAX_M + 1];
    int k = 0;
    for (int i = 0; i < w; i++) want[k++] = 'F';
    for (int i = 0; i < n - w; i++) want[k++] = 'F', want[k++] = 'B';
    for (int i = 0; i < w; i++) want[k++] = 'B';
    want[k] = 0;
    compute_string(st, got, (int)sizeof got);
    return strcmp(want, got) ? "compute order is not F^w (FB)^(n-w) B^w" : NULL;
}

// Interleaving's order (Megatron): forward k runs chunk (k / P) % V on micro (k / PV) P + k % P, backward
// k the chunks reversed.
static const char* check_interleaved_chunks(const StageSchedule* st) {
    int P = st->num_stages, V = st->num_chunks, f = 0, b = 0;
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        int isf = a->kind == ACT_FORWARD, isb = a->kind == ACT_BACKWARD;
        if (!isf && !isb) continue;
        int k = isf ? f++ : b++, c = k / P % V;
        if (a->micro != k / (P * V) * P + k % P || a->chunk != (isf ? c : V - 1 - c)) return "chunk order is not Megatron's";
    }
    return NULL;
}

// zb's rules (schedule.h): at every point at most min(P - s, m) micro-batches between F and B, at most
// s + 1 W's deferred.
static const char* check_zb_bounds(const StageSchedule* st) {
    int f = 0, b = 0, w = 0, cap = imin(st->num_stages - st->stage, st->num_micro);
    for (int i = 0; i < st->count; i++) {
        ActionKind t = st->actions[i].kind;
        f += t == ACT_FORWARD, b += t == ACT_BACKWARD_INPUT, w += t == ACT_BACKWARD_WEIGHT;
        if (f - b > cap) return "more micro-batches between F and B than 1F1B holds";
        if (b - w > st->stage + 1) return "more deferred W's than s + 1";
    }
    return NULL;
}

static const char* check_shape(const StageSchedule* st) {
    int P = st->num_stages, m = st->num_micro, V = st->num_chunks, s = st->stage;
    if (st->kind == SCHEDULE_1F1B) return check_warmup_shape(st, m, imin(P - s - 1, m));
    if (st->kind == SCHEDULE_INTERLEAVED) {
        const char* why = check_warmup_shape(st, m * V, imin((P - s - 1) * 2 + (V - 1) * P, m * V));
        return why ? why : check_interleaved_chunks(st);
    }
    return check_zb_bounds(st);
}

// Communication around each compute action: F receives its activations from the previous stage and sends
// its output to the next, B receives the gradient from the next stage and sends one to the previous, each
// present exactly when that virtual neighbour exists (stages wrap around with interleaving); W has none.
// The receive comes before the compute and the send after it, in the exchange next to it (1f1b, zb) or,
// under interleaving's rounds of "F B", with at most the round's other compute in between.
static int find_comm(const StageSchedule* st, ActionKind k, int micro, int chunk) {
    for (int i = 0; i < st->count; i++)
        if (st->actions[i].kind == k && st->actions[i].micro == micro && st->actions[i].chunk == chunk) return i;
    return -1;
}
static int computes_between(const StageSchedule* st, int lo, int hi) {
    int n = 0;
    for (int i = lo + 1; i < hi; i++) n += action_is_compute(st->actions[i].kind);
    return n;
}

static const char* check_comm_local(const StageSchedule* st) {
    int P = st->num_stages, prev = (st->stage + P - 1) % P, next = (st->stage + 1) % P, want = 0;
    int slack = st->kind == SCHEDULE_INTERLEAVED;
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        if (a->micro < 0 || a->micro >= st->num_micro) return "micro index out of range";
        if (action_is_compute(a->kind) != (a->peer == -1)) return "compute with a peer, or communication without";
        if ((a->kind == ACT_RECV_ACT || a->kind == ACT_SEND_GRAD) && (first_v(st, a->chunk) || a->peer != prev))
            return "act receive / grad send not with the previous stage (or on virtual stage 0)";
        if ((a->kind == ACT_SEND_ACT || a->kind == ACT_RECV_GRAD) && (last_v(st, a->chunk) || a->peer != next))
            return "act send / grad receive not with the next stage (or on the last virtual stage)";
        if (!action_is_compute(a->kind) || a->kind == ACT_BACKWARD_WEIGHT) continue;
        int fw = a->kind == ACT_FORWARD, has_in = fw ? !first_v(st, a->chunk) : !last_v(st, a->chunk);
        int has_out = fw ? !last_v(st, a->chunk) : !first_v(st, a->chunk);
        int r = find_comm(st, fw ? ACT_RECV_ACT : ACT_RECV_GRAD, a->micro, a->chunk);
        int o = find_comm(st, fw ? ACT_SEND_ACT : ACT_SEND_GRAD, a->micro, a->chunk);
        if (has_in && (r < 0 || r > i || computes_between(st, r, i) > slack))
            return "compute not preceded by the receive of its input";
        if (has_out && (o < i || computes_between(st, i, o) > slack)) return "compute not followed by the send of its output";
        want += has_in + has_out;
    }
    int ncomm = 0;
    for (int i = 0; i < st->count; i++) ncomm += !action_is_compute(st->actions[i].kind);
    return ncomm == want ? NULL : "stray communication actions";
}

// ---- in-flight activations ----

// Recounted from the list: sets live from F to the backward that frees them (W under zb), deferred W's.
static void recount_peaks(const StageSchedule* st, int* sets, int* deferred) {
    int live = 0, def = 0;
    *sets = *deferred = 0;
    for (int i = 0; i < st->count; i++) {
        ActionKind t = st->actions[i].kind;
        live += t == ACT_FORWARD;
        live -= t == (is_zb(st) ? ACT_BACKWARD_WEIGHT : ACT_BACKWARD);
        def += (t == ACT_BACKWARD_INPUT) - (t == ACT_BACKWARD_WEIGHT);
        *sets = imax(*sets, live), *deferred = imax(*deferred, def);
    }
}

// What schedule.h states: 1f1b min(P - s, m); interleaved its warm-up + 1 chunk-micros (at most m V); zb
// min(P + 1, m) sets and min(s + 1, max(1, m - P + s + 1)) deferred W's.
static const char* check_peak(const StageSchedule* st) {
    int P = st->num_stages, m = st->num_micro, V = st->num_chunks, s = st->stage, sets, deferred;
    recount_peaks(st, &sets, &deferred);
    int want_sets = st->kind == SCHEDULE_1F1B ? imin(P - s, m)
                    : st->kind == SCHEDULE_INTERLEAVED ? imin((P - s - 1) * 2 + (V - 1) * P + 1, m * V)
                                                       : imin(P + 1, m);
    int want_deferred = is_zb(st) ? imin(s + 1, imax(1, m - P + s + 1)) : 0;
    if (sets != want_sets) return "peak in-flight activations != the schedule's stated peak";
    if (deferred != want_deferred) return "peak deferred W's != the schedule's stated peak";
    if (st->peak_in_flight != sets || st->peak_deferred != deferred) return "peak fields disagree with the list";
    int chunk_sum = 0;
    for (int c = 0; c < V; c++) chunk_sum += st->peak_chunk[c];
    return chunk_sum >= sets && st->peak_chunk[0] >= 1 ? NULL : "per-chunk peaks cannot hold the stage's peak";
}

// ---- discrete-event simulation ----
//
// Every stage runs its list. A send appends (sender's virtual stage, micro, time) to the FIFO of its link
// (src, dst, kind: activations or gradients) and never blocks (buffered); a receive blocks until its link
// is non-empty, then takes the oldest message, which must come from its virtual neighbour and carry its
// micro: so both ends must list each link's messages in the same order. Compute advances the stage's clock
// by its time, and a receive moves it to the message's send time if later, so the clocks give the ideal
// (no comm cost) timeline. The outcome is the same whichever runnable stage goes first (blocking receives
// on FIFO links are deterministic), which the tests confirm with several policies.

typedef struct { int vs[MAX_MSG], micro[MAX_MSG]; double time[MAX_MSG]; int head, tail; } Link;
typedef struct {
    int P;
    const StageSchedule* ss;
    int pc[MAX_P];
    double clock[MAX_P];
    Link link[2][MAX_P][MAX_P];   // [0 activations, 1 gradients][src][dst]
    double t_f, t_b, t_w;         // F, B (the whole backward, or zb's B), W
} Sim;

typedef enum { STEP_OK, STEP_ERROR } StepResult;

static int is_send(ActionKind k) { return k == ACT_SEND_ACT || k == ACT_SEND_GRAD; }
static int is_grad(ActionKind k) { return k == ACT_SEND_GRAD || k == ACT_RECV_GRAD; }

// The link a send/receive of stage s uses, or NULL if its peer is not a stage.
static Link* link_for(Sim* sim, int s, const Action* a) {
    if (a->peer < 0 || a->peer >= sim->P) return NULL;
    return is_send(a->kind) ? &sim->link[is_grad(a->kind)][s][a->peer] : &sim->link[is_grad(a->kind)][a->peer][s];
}

// The virtual stage a received message must come from: the previous one for activations, the next for gradients.
static int expected_sender(const StageSchedule* st, const Action* a) {
    return vstage(st, a->chunk) + (a->kind == ACT_RECV_ACT ? -1 : 1);
}

// Can stage s's next action run now? Compute always can, buffered sends too; receives need a message.
static int can_step(Sim* sim, int s) {
    if (sim->pc[s] >= sim->ss[s].count) return 0;
    const Action* a = &sim->ss[s].actions[sim->pc[s]];
    if (is_send(a->kind)) return 1;
    if (action_is_compute(a->kind)) return 1;
    Link* l = link_for(sim, s, a);
    return l == NULL || l->head < l->tail;   // a bad peer "runs" so that step() reports it
}

static double compute_time(const Sim* sim, ActionKind k) {
    return k == ACT_FORWARD ? sim->t_f : k == ACT_BACKWARD_WEIGHT ? sim->t_w : sim->t_b;
}

static StepResult step(Sim* sim, int s) {
    const StageSchedule* st = &sim->ss[s];
    const Action* a = &st->actions[sim->pc[s]++];
    if (action_is_compute(a->kind)) {
        sim->clock[s] += compute_time(sim, a->kind);
        return STEP_OK;
    }
    Link* l = link_for(sim, s, a);
    if (!l) return STEP_ERROR;
    if (is_send(a->kind)) {
        if (l->tail >= MAX_MSG) return STEP_ERROR;
        l->vs[l->tail] = vstage(st, a->chunk), l->micro[l->tail] = a->micro, l->time[l->tail++] = sim->clock[s];
        return STEP_OK;
    }
    if (l->micro[l->head] != a->micro || l->vs[l->head] != expected_sender(st, a)) return STEP_ERROR;
    if (l->time[l->head] > sim->clock[s]) sim->clock[s] = l->time[l->head];
    l->head++;
    return STEP_OK;
}

// Picks the next stage to advance among the runnable ones: 0 lowest first, 1 highest first, 2 pseudo-random,
// 3 keep running the last stage while it can. Returns -1 when none can run.
static int pick(Sim* sim, int policy, unsigned* rng, int last) {
    int runnable[MAX_P], n = 0;
    for (int s = 0; s < sim->P; s++)
        if (can_step(sim, s)) runnable[n++] = s;
    if (n == 0) return -1;
    if (policy == 1) return runnable[n - 1];
    if (policy == 2) return *rng = *rng * 1103515245u + 12345u, runnable[(*rng >> 16) % (unsigned)n];
    if (policy == 3 && last >= 0 && can_step(sim, last)) return last;
    return runnable[0];
}

typedef struct { double t_f, t_b, t_w; } Times;

// Runs the pipeline to completion or deadlock. Returns NULL if every stage finished with every message
// consumed; *makespan = the latest clock.
static const char* simulate(int P, const StageSchedule* ss, int policy, Times t, double* makespan) {
    Sim* sim = xcalloc(1, sizeof(Sim));
    sim->P = P, sim->ss = ss, sim->t_f = t.t_f, sim->t_b = t.t_b, sim->t_w = t.t_w;
    unsigned rng = 12345u + (unsigned)policy;
    const char* why = NULL;
    for (int s = -1; (s = pick(sim, policy, &rng, s)) >= 0;)
        if (step(sim, s) == STEP_ERROR) { why = "message mismatch or bad peer"; break; }
    *makespan = 0;
    for (int s = 0; s < P && !why; s++) {
        if (sim->pc[s] < ss[s].count) why = "deadlock: a stage is blocked forever";
        for (int d = 0; d < P; d++)
            for (int k = 0; k < 2; k++)
                if (sim->link[k][s][d].head != sim->link[k][s][d].tail) why = "unreceived messages";
        if (sim->clock[s] > *makespan) *makespan = sim->clock[s];
    }
    free(sim);
    return why;
}

// Unit times for the ideal timeline: a backward is twice a forward (split evenly between zb's B and W).
static const Times UNIT_TIMES = {1.0, 2.0, 1.0};

static const char* check_deadlock_free(Case c, const StageSchedule* ss) {
    const Times times[2] = {UNIT_TIMES, {1.0, 0.5, 3.0}};   // the lists' own timeline, and a lopsided one
    for (int policy = 0; policy < 4; policy++)
        for (int i = 0; i < 2; i++) {
            double t;
            const char* why = simulate(c.P, ss, policy, times[i], &t);
            if (why) return why;
        }
    return NULL;
}

// ---- exchanges: the executor's semantics (schedule.h) ----
//
// Each stage walks its list; compute advances its clock; a run of communication actions (an exchange) is
// posted as a whole. A send and its receive complete together, at the later of their posting times, once
// both are posted (rendezvous). An exchange with a receive holds the stage until all of it is complete; one
// of sends only stays pending while the stage computes on, and the stage's next exchange (or the end of its
// list) waits for it before posting (exchanges complete in order). Messages from stage a to stage b pair in
// list order (the k-th send of a to b with the k-th receive of b from a, whatever their kinds), and the
// pairing must give each receive the message it names: the sender's virtual stage, micro and kind. A
// forward must not write the activation set a pending send still reads.

#define MAX_ACTIONS (7 * MAX_M * MAX_V)
typedef struct {
    int P;
    const StageSchedule* ss;
    int partner[MAX_P][MAX_ACTIONS];   // the paired action's index on the peer (comm actions)
    char done[MAX_P][MAX_ACTIONS];
    double posted_at[MAX_P][MAX_ACTIONS], done_at[MAX_P][MAX_ACTIONS];
    int pc[MAX_P];
    int current[MAX_P];                // the exchange at pc once posted, else -1
    int pend_lo[MAX_P], pend_hi[MAX_P];   // a pending exchange of sends, empty if lo == hi
    double clock[MAX_P];
    int one_per_message;               // every message its own exchange, to show the grouping is needed
    int sends_block;                   // exchanges of sends only hold the stage too (NCCL, when collectives
                                       // on the comm stream queue behind them)
    const char* error;
} XSim;

static int exchange_end(const XSim* x, int s, int i) {
    return x->one_per_message ? i + 1 : schedule_exchange_end(&x->ss[s], i);
}

// Pairs the messages from a to b in list order. Returns NULL or why they cannot pair.
static const char* pair_link(XSim* x, int a, int b) {
    const StageSchedule *sa = &x->ss[a], *sb = &x->ss[b];
    int j = 0;
    for (int i = 0; i < sa->count; i++) {
        const Action* snd = &sa->actions[i];
        if (!is_send(snd->kind) || snd->peer != b) continue;
        while (j < sb->count && (is_send(sb->actions[j].kind) || action_is_compute(sb->actions[j].kind) ||
                                 sb->actions[j].peer != a))
            j++;
        if (j == sb->count) return "a message is sent but never received";
        const Action* rcv = &sb->actions[j];
        int same_kind = is_grad(snd->kind) == is_grad(rcv->kind);
        if (!same_kind || snd->micro != rcv->micro || vstage(sa, snd->chunk) != expected_sender(sb, rcv))
            return "list order pairs a send with a receive meant for another message";
        x->partner[a][i] = j, x->partner[b][j] = i, j++;
    }
    for (; j < sb->count; j++)
        if (!is_send(sb->actions[j].kind) && !action_is_compute(sb->actions[j].kind) && sb->actions[j].peer == a)
            return "a receive has no message";
    return NULL;
}

// Is action i of stage s posted: in its pending exchange, or in the exchange it has posted at pc?
static int posted(const XSim* x, int s, int i) {
    if (x->pend_lo[s] <= i && i < x->pend_hi[s]) return 1;
    return x->current[s] >= 0 && x->current[s] <= i && i < exchange_end(x, s, x->current[s]);
}

// Completes every posted message of s whose partner is posted too; returns 1 if any.
static int match(XSim* x, int s) {
    int moved = 0;
    for (int i = 0; i < x->ss[s].count; i++) {
        if (x->done[s][i] || !posted(x, s, i)) continue;
        int p = x->ss[s].actions[i].peer, j = x->partner[s][i];
        if (!posted(x, p, j)) continue;
        double when = x->posted_at[s][i] > x->posted_at[p][j] ? x->posted_at[s][i] : x->posted_at[p][j];
        x->done[s][i] = x->done[p][j] = 1, x->done_at[s][i] = x->done_at[p][j] = when;
        moved = 1;
    }
    return moved;
}

// All of actions lo .. hi-1 complete? Then the stage's clock moves to the last completion.
static int complete(XSim* x, int s, int lo, int hi) {
    double last = x->clock[s];
    for (int i = lo; i < hi; i++) {
        if (!x->done[s][i]) return 0;
        if (x->done_at[s][i] > last) last = x->done_at[s][i];
    }
    x->clock[s] = last;
    return 1;
}

// A forward into the activation set of a pending send's micro-batch (same chunk) would overwrite what it reads.
static void check_pending_set(XSim* x, int s, const Action* f) {
    const StageSchedule* st = &x->ss[s];
    int K = st->peak_chunk[f->chunk] > 0 ? st->peak_chunk[f->chunk] : 1;
    for (int i = x->pend_lo[s]; i < x->pend_hi[s]; i++) {
        const Action* a = &st->actions[i];
        if (a->kind == ACT_SEND_ACT && a->chunk == f->chunk && a->micro % K == f->micro % K)
            x->error = "a forward overwrites the activations a pending send is reading";
    }
}

// Advances stage s as far as it can; returns 1 if it moved.
static int advance(XSim* x, int s, Times t) {
    const StageSchedule* st = &x->ss[s];
    int moved = match(x, s);
    for (;;) {
        int at_end = x->pc[s] == st->count;
        const Action* a = at_end ? NULL : &st->actions[x->pc[s]];
        if (a && action_is_compute(a->kind)) {
            if (a->kind == ACT_FORWARD) check_pending_set(x, s, a);
            x->clock[s] += a->kind == ACT_FORWARD ? t.t_f : a->kind == ACT_BACKWARD_WEIGHT ? t.t_w : t.t_b;
            x->pc[s]++, moved = 1;
            continue;
        }
        if (x->pend_lo[s] < x->pend_hi[s]) {   // the next exchange, or the end, waits for the pending one
            if (!complete(x, s, x->pend_lo[s], x->pend_hi[s])) break;
            x->pend_lo[s] = x->pend_hi[s] = 0, moved = 1;
        }
        if (at_end) break;
        int lo = x->pc[s], hi = exchange_end(x, s, lo), sends_only = 1;
        if (x->current[s] != lo) {
            x->current[s] = lo, moved = 1;
            for (int i = lo; i < hi; i++) x->posted_at[s][i] = x->clock[s];
            match(x, s);
        }
        for (int i = lo; i < hi; i++) sends_only &= is_send(st->actions[i].kind);
        if (sends_only && !x->sends_block) {
            x->pend_lo[s] = lo, x->pend_hi[s] = hi;
        } else if (!complete(x, s, lo, hi)) {
            break;
        }
        x->current[s] = -1, x->pc[s] = hi, moved = 1;
    }
    return moved;
}

// Runs every stage's list under exchange semantics. NULL if all finish; *makespan = the latest clock.
// mode: 0 exchanges, 1 one exchange per message, 2 exchanges whose sends hold the stage too.
static const char* simulate_exchanges(int P, const StageSchedule* ss, Times t, int mode, double* makespan) {
    XSim* x = xcalloc(1, sizeof(XSim));
    x->P = P, x->ss = ss, x->one_per_message = mode == 1, x->sends_block = mode == 2;
    const char* why = NULL;
    for (int s = 0; s < P; s++) x->current[s] = -1;
    for (int s = 0; s < P && !why; s++) {
        if (ss[s].count > MAX_ACTIONS) why = "list too long for the test";
        for (int i = 0; i < ss[s].count && !why; i++)
            if (!action_is_compute(ss[s].actions[i].kind) && (ss[s].actions[i].peer < 0 || ss[s].actions[i].peer >= P))
                why = "bad peer";
    }
    for (int a = 0; a < P && !why; a++)
        for (int b = 0; b < P && !why; b++) why = a == b ? NULL : pair_link(x, a, b);
    for (int moved = !why; moved && !x->error;) {
        moved = 0;
        for (int s = 0; s < P; s++) moved |= advance(x, s, t);
    }
    if (!why) why = x->error;
    *makespan = 0;
    for (int s = 0; s < P && !why; s++) {
        if (x->pc[s] < ss[s].count || x->pend_lo[s] < x->pend_hi[s]) why = "deadlock: a stage waits forever at an exchange";
        if (x->clock[s] > *makespan) *makespan = x->clock[s];
    }
    free(x);
    return why;
}

static const char* check_exchanges(Case c, const StageSchedule* ss) {
    const Times times[2] = {UNIT_TIMES, {1.0, 0.5, 3.0}};
    for (int mode = 0; mode <= 2; mode += 2)
        for (int i = 0; i < 2; i++) {
            double t;
            const char* why = simulate_exchanges(c.P, ss, times[i], mode, &t);
            if (why) return why;
        }
    return NULL;
}

// schedule.h: without the grouping, rendezvous sends deadlock 1F1B at P=2, m=2 (stage 0 sends act 1
// while stage 1 sends grad 0), while P=1 and m=1 (nothing crosses) still finish; grouped, all three do.
static void test_rendezvous(TestStats* st) {
    const int cases[3][2] = {{2, 2}, {1, 4}, {4, 1}};
    int single[3], grouped[3];
    for (int i = 0; i < 3; i++) {
        StageSchedule ss[MAX_P];
        double t;
        Case c = {SCHEDULE_1F1B, cases[i][0], cases[i][1], 1};
        build_all(c, ss);
        single[i] = simulate_exchanges(c.P, ss, UNIT_TIMES, 1, &t) == NULL;
        grouped[i] = simulate_exchanges(c.P, ss, UNIT_TIMES, 0, &t) == NULL;
        free_all(c.P, ss);
    }
    test_report(st, !single[0] && grouped[0], "rendezvous_ungrouped_deadlocks_P2_m2", "ungrouped finished %g (want 0), grouped %g",
                single[0], grouped[0]);
    test_report(st, single[1] && single[2] && grouped[1] && grouped[2], "rendezvous_fine_P1_or_m1", "P1 m4 %g, P4 m1 %g",
                single[1], single[2]);
}

// The simulated bubble: (step - work) / work per stage, work = m V (t_f + t_b (+ t_w)).
static double simulated_bubble(Case c, const StageSchedule* ss, Times t, const char** why) {
    double step_time;
    *why = simulate(c.P, ss, 0, t, &step_time);
    double work = c.m * c.V * (t.t_f + t.t_b + (c.kind == SCHEDULE_ZB ? t.t_w : 0.0));
    return (step_time - work) / work;
}

// schedule_bubble against the timeline: 1f1b for t_b = t_f and 2 t_f; interleaved with every chunk taking
// 1/V of a stage's time; zb with t_f = t_b = t_w (the times it is built for) when m >= P, and never worse
// than 1F1B with the same total backward otherwise.
static const char* check_bubble(Case c, const StageSchedule* ss) {
    const char* why;
    if (c.kind == SCHEDULE_ZB) {
        Times equal = {1.0, 1.0, 1.0};
        double b = simulated_bubble(c, ss, equal, &why), theory = schedule_bubble(c.kind, c.P, c.m, c.V);
        if (why) return why;
        if (c.m >= c.P && fabs(b - theory) > 1e-12) return printf("# zb P=%d m=%d: %g vs %g\n", c.P, c.m, b, theory), "zb bubble != (P-1)/(3m)";
        if (b > schedule_bubble_fraction(c.P, c.m) + 1e-12) return "zb bubble worse than 1F1B's";
        return NULL;
    }
    const double tbs[2] = {1.0, 2.0};
    for (int i = 0; i < 2; i++) {
        Times t = {1.0 / c.V, tbs[i] / c.V, 0.0};
        double b = simulated_bubble(c, ss, t, &why), theory = schedule_bubble(c.kind, c.P, c.m, c.V);
        if (why) return why;
        if (fabs(b - theory) > 1e-12) {
            printf("# %s P=%d m=%d V=%d t_b=%g: simulated bubble %g, schedule_bubble %g\n", schedule_kind_name(c.kind), c.P,
                   c.m, c.V, tbs[i], b, theory);
            return "bubble fraction != simulated idle / work";
        }
    }
    return NULL;
}

// ---- the grid ----

typedef const char* (*PipeCheck)(Case c, const StageSchedule* ss);

#define PER_STAGE(name, fn)                                               \
    static const char* name(Case c, const StageSchedule* ss) {            \
        for (int s = 0; s < c.P; s++) {                                   \
            const char* why = fn(&ss[s]);                                 \
            if (why) return why;                                          \
        }                                                                 \
        return NULL;                                                      \
    }
PER_STAGE(pipe_valid_order, check_valid_order)
PER_STAGE(pipe_shape, check_shape)
PER_STAGE(pipe_comm_local, check_comm_local)
PER_STAGE(pipe_peak, check_peak)

// The cases of a schedule, in order: P = 1..8, m = 1..16 and V = 2..4 where interleaving allows (P >= 2,
// P | m), else V = 1. Start from c->P == 0; returns 0 after the last.
static int next_case(ScheduleKind kind, Case* c) {
    int lo_v = kind == SCHEDULE_INTERLEAVED ? 2 : 1, hi_v = kind == SCHEDULE_INTERLEAVED ? MAX_V : 1;
    if (c->P == 0) *c = (Case){kind, 1, 1, lo_v - 1};
    for (;;) {
        if (c->V < hi_v) c->V++;
        else if (c->V = lo_v, c->m < MAX_M) c->m++;
        else if (c->m = 1, c->P < MAX_P) c->P++;
        else return 0;
        if (kind != SCHEDULE_INTERLEAVED || (c->P >= 2 && c->m % c->P == 0)) return 1;
    }
}

// One check line per (property, schedule, P), covering every m (and V); a failure names the first case.
static void grid_check(TestStats* st, const char* prop, PipeCheck fn) {
    const ScheduleKind kinds[3] = {SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB};
    for (int k = 0; k < 3; k++) {
        int bad[MAX_P + 1] = {0}, ran[MAX_P + 1] = {0};
        Case c = {0};
        while (next_case(kinds[k], &c)) {
            if (bad[c.P]) continue;
            StageSchedule ss[MAX_P];
            build_all(c, ss);
            const char* why = fn(c, ss);
            if (why) printf("# %s %s P=%d m=%d V=%d: %s\n", prop, schedule_kind_name(c.kind), c.P, c.m, c.V, why), bad[c.P] = c.m;
            ran[c.P]++;
            free_all(c.P, ss);
        }
        for (int P = 1; P <= MAX_P; P++) {
            if (!ran[P]) continue;
            char name[96];
            snprintf(name, sizeof name, "schedule_%s_%s_P%d", schedule_kind_name(kinds[k]), prop, P);
            test_report(st, bad[P] == 0, name, "first failure at m=%g (of %g cases)", bad[P], ran[P]);
        }
    }
}

// ---- the checkers catch broken schedules ----

// Applies `breakit` to stage `s` of the case and expects `fn` to reject the result.
static void catches(TestStats* st, const char* name, Case c, int s, void (*breakit)(StageSchedule*), PipeCheck fn) {
    StageSchedule ss[MAX_P];
    build_all(c, ss);
    StageSchedule orig = ss[s];
    ss[s] = copy_schedule(&orig);
    int ok_before = fn(c, ss) == NULL;
    breakit(&ss[s]);
    int rejected = fn(c, ss) != NULL;
    free(ss[s].actions);
    ss[s] = orig;
    free_all(c.P, ss);
    test_report(st, ok_before && rejected, name, "accepted before breaking %g, rejected after %g", ok_before, rejected);
}

static int index_of(const StageSchedule* s, ActionKind k, int micro) {
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].kind == k && s->actions[i].micro == micro) return i;
    return -1;
}
// Swap the forwards of micro 0 and 1 (with their comm, by relabelling): forwards out of order.
static void break_forward_order(StageSchedule* s) {
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].kind <= ACT_SEND_ACT && s->actions[i].micro <= 1) s->actions[i].micro ^= 1;
}
// Left-rotates actions [lo, lo+n) by k.
static void rotate(StageSchedule* s, int lo, int n, int k) {
    Action tmp[8];
    memcpy(tmp, &s->actions[lo], (size_t)k * sizeof(Action));
    memmove(&s->actions[lo], &s->actions[lo + k], (size_t)(n - k) * sizeof(Action));
    memcpy(&s->actions[lo + n - k], tmp, (size_t)k * sizeof(Action));
}
// One more warm-up forward: swap the group of backward 0 (RECV_GRAD B SEND_GRAD) with the forward group
// after it. Needs a middle stage with m - w >= 2.
static void break_warmup(StageSchedule* s) {
    int lo = index_of(s, ACT_BACKWARD, 0) - 1;
    rotate(s, lo, 6, 3);
}
// Drop the last action (a send or a backward), as a generator with an off-by-one would.
static void break_drop_last(StageSchedule* s) { s->count--; }
// Receive the gradient of micro 0 before sending any activation: the classic pipeline deadlock.
static void break_recv_first(StageSchedule* s) {
    int r = index_of(s, ACT_RECV_GRAD, 0);
    Action a = s->actions[r];
    memmove(&s->actions[1], &s->actions[0], (size_t)r * sizeof(Action));
    s->actions[0] = a;
}
// Forget to receive the last gradient: the message is sent but never taken.
static void break_drop_recv(StageSchedule* s) {
    int r = index_of(s, ACT_RECV_GRAD, s->num_micro - 1);
    memmove(&s->actions[r], &s->actions[r + 1], (size_t)(s->count - r - 1) * sizeof(Action));
    s->count--;
}
// Send activation 0 to the wrong peer.
static void break_peer(StageSchedule* s) { s->actions[index_of(s, ACT_SEND_ACT, 0)].peer += 1; }
// Keep one more activation live: move backward 0 (and its comm) to the end.
static void break_peak(StageSchedule* s) {
    int b = index_of(s, ACT_BACKWARD, 0), lo = b - (s->stage < s->num_stages - 1), hi = b + (s->stage > 0);
    Action grp[3];
    int n = hi - lo + 1;
    memcpy(grp, &s->actions[lo], (size_t)n * sizeof(Action));
    memmove(&s->actions[lo], &s->actions[hi + 1], (size_t)(s->count - hi - 1) * sizeof(Action));
    memcpy(&s->actions[s->count - n], grp, (size_t)n * sizeof(Action));
}
static void break_peak_field(StageSchedule* s) { s->peak_in_flight++; }
// Interleaving: the first forward's send claims the wrong chunk (so the next stage gets a message it does
// not expect from that virtual stage).
static void break_chunk(StageSchedule* s) { s->actions[index_of(s, ACT_SEND_ACT, 0)].chunk ^= 1; }
// One activation set too few on the stage: a forward would overwrite a set a pending send still reads.
static void break_fewer_sets(StageSchedule* s) { s->peak_chunk[0] = 1; }
// Swap the first adjacent activation and gradient sends: per-kind links still pair them, NCCL's one
// in-order channel between two ranks (P=2 under interleaving: both go to the same peer) does not.
static void break_send_kinds(StageSchedule* s) {
    for (int i = 0; i + 1 < s->count; i++)
        if (s->actions[i].kind == ACT_SEND_ACT && s->actions[i + 1].kind == ACT_SEND_GRAD) {
            Action a = s->actions[i];
            s->actions[i] = s->actions[i + 1], s->actions[i + 1] = a;
            return;
        }
    fail("internal: no adjacent act and grad sends to swap");
}
// zb: run W 0 right after the first forward, before its B.
static void break_w_before_b(StageSchedule* s) {
    int w = index_of(s, ACT_BACKWARD_WEIGHT, 0), f = index_of(s, ACT_FORWARD, 0);
    Action a = s->actions[w];
    memmove(&s->actions[f + 2], &s->actions[f + 1], (size_t)(w - f - 1) * sizeof(Action));
    s->actions[f + 1] = a;
}
// zb: every W right after its B (and B's send): 1F1B's timeline again, bubble and all.
static void break_eager_w(StageSchedule* s) {
    Action* out = xmalloc((size_t)s->count * sizeof(Action));
    int k = 0;
    for (int i = 0; i < s->count; i++) {
        const Action* a = &s->actions[i];
        if (a->kind == ACT_BACKWARD_WEIGHT) continue;
        out[k++] = *a;
        int b_done = a->kind == ACT_BACKWARD_INPUT && (i + 1 >= s->count || s->actions[i + 1].kind != ACT_SEND_GRAD);
        if (b_done || (a->kind == ACT_SEND_GRAD && s->actions[i - 1].kind == ACT_BACKWARD_INPUT))
            out[k++] = (Action){ACT_BACKWARD_WEIGHT, a->micro, a->chunk, -1};
    }
    memcpy(s->actions, out, (size_t)k * sizeof(Action));
    free(out);
}
// zb: defer every W to the end (the stash the schedule does not plan for).
static void break_defer_all(StageSchedule* s) {
    int n = 0;
    Action* w = xmalloc((size_t)s->count * sizeof(Action));
    for (int i = 0, k = 0; i < s->count; i++)
        if (s->actions[i].kind == ACT_BACKWARD_WEIGHT) w[n++] = s->actions[i];
        else s->actions[k++] = s->actions[i];
    memcpy(&s->actions[s->count - n], w, (size_t)n * sizeof(Action));
    free(w);
}

static void test_checkers_catch(TestStats* st) {
    Case c46 = {SCHEDULE_1F1B, 4, 6, 1}, c35 = {SCHEDULE_1F1B, 3, 5, 1}, c43 = {SCHEDULE_1F1B, 4, 3, 1};
    Case c22 = {SCHEDULE_1F1B, 2, 2, 1}, c69 = {SCHEDULE_1F1B, 6, 9, 1}, c48 = {SCHEDULE_1F1B, 4, 8, 1};
    Case i48 = {SCHEDULE_INTERLEAVED, 4, 8, 2}, z48 = {SCHEDULE_ZB, 4, 8, 1};
    catches(st, "catches_forward_order", c46, 2, break_forward_order, pipe_valid_order);
    catches(st, "catches_extra_warmup", c46, 1, break_warmup, pipe_shape);
    catches(st, "catches_missing_backward", c35, 0, break_drop_last, pipe_valid_order);
    catches(st, "catches_missing_send", c35, 1, break_drop_last, pipe_comm_local);
    catches(st, "catches_wrong_peer", c43, 1, break_peer, pipe_comm_local);
    catches(st, "catches_wrong_peer_sim", c43, 1, break_peer, check_deadlock_free);
    catches(st, "catches_deadlock", c22, 0, break_recv_first, check_deadlock_free);
    catches(st, "catches_deadlock_deep", c69, 3, break_recv_first, check_deadlock_free);
    catches(st, "catches_unreceived_message", c35, 0, break_drop_recv, check_deadlock_free);
    catches(st, "catches_peak", c48, 0, break_peak, pipe_peak);
    catches(st, "catches_peak_field", c48, 0, break_peak_field, pipe_peak);
    catches(st, "catches_forward_order_link", c46, 2, break_forward_order, check_deadlock_free);
    catches(st, "catches_interleaved_wrong_chunk", i48, 1, break_chunk, check_deadlock_free);
    catches(st, "catches_interleaved_order", i48, 1, break_forward_order, pipe_shape);
    catches(st, "catches_zb_w_before_b", z48, 2, break_w_before_b, pipe_valid_order);
    catches(st, "catches_zb_deferral", z48, 1, break_defer_all, pipe_shape);
    catches(st, "catches_zb_deferral_peak", z48, 1, break_defer_all, pipe_peak);
    catches(st, "catches_zb_bubble", z48, 0, break_eager_w, check_bubble);
    Case i24 = {SCHEDULE_INTERLEAVED, 2, 4, 2};
    catches(st, "catches_exchange_deadlock", c22, 0, break_recv_first, check_exchanges);
    catches(st, "catches_exchange_deadlock_deep", c69, 3, break_recv_first, check_exchanges);
    catches(st, "catches_exchange_unreceived_message", c35, 0, break_drop_recv, check_exchanges);
    catches(st, "catches_exchange_kind_order", i24, 0, break_send_kinds, check_exchanges);
    catches(st, "catches_exchange_pending_set", c48, 0, break_fewer_sets, check_exchanges);
}

// ---- split ----

// Stage costs of a split: blocks, plus the head on the last stage.
static double max_stage_cost(int P, const int* nb, double head) {
    double worst = 0;
    for (int s = 0; s < P; s++) {
        double c = nb[s] + (s == P - 1 ? head : 0.0);
        worst = c > worst ? c : worst;
    }
    return worst;
}

// The optimum by dynamic programming over every split (independent of the generator's closed form):
// best[p][l] = the least possible max cost of splitting the first l blocks into p non-empty stages, none
// of them the last; the last stage then takes the remaining blocks.
static double optimum_split(int L, int P, double head) {
    static const double INF = 1e300;
    double best[MAX_P + 1][64 + 1];
    for (int p = 0; p <= P; p++)
        for (int l = 0; l <= L; l++) best[p][l] = p == 0 && l == 0 ? 0 : INF;
    for (int p = 1; p < P; p++)
        for (int l = p; l <= L; l++)
            for (int k = 1; k <= l - (p - 1); k++) {
                double c = best[p - 1][l - k] > k ? best[p - 1][l - k] : k;
                if (c < best[p][l]) best[p][l] = c;
            }
    double opt = INF;
    for (int k = 1; k <= L - (P - 1); k++) {
        double c = best[P - 1][L - k] > k + head ? best[P - 1][L - k] : k + head;
        if (c < opt) opt = c;
    }
    return opt;
}

// Contiguous, in order, non-empty, covering 0..L-1 exactly once.
static int split_is_partition(int L, int P, const int* first, const int* nb) {
    int next = 0;
    for (int s = 0; s < P; s++) {
        if (first[s] != next || nb[s] < 1) return 0;
        next += nb[s];
    }
    return next == L;
}

// The preferences among optimal splits (schedule.h): the last stage takes as many blocks as it can
// without becoming the bottleneck, and the others share the rest evenly, smaller shares first.
static int split_shape_ok(int P, const int* nb, double head, double opt) {
    if (P == 1) return 1;
    for (int s = 0; s + 2 < P; s++)
        if (nb[s + 1] < nb[s]) return 0;
    if (nb[P - 2] > nb[0] + 1) return 0;
    if (nb[P - 2] == 1) return 1;   // no front block left to give the last stage
    // Give the last stage one block from the fullest front stage (the front stays even): that must cost more.
    int more[MAX_P];
    memcpy(more, nb, (size_t)P * sizeof(int));
    more[P - 1]++, more[P - 2]--;
    return max_stage_cost(P, more, head) > opt + 1e-9;
}

static void test_split(TestStats* st) {
    const double heads[] = {0, 0.25, 0.5, 1, 1.5, 2.3, 4.47, 7, 20};
    int nh = (int)(sizeof heads / sizeof heads[0]);
    int partition_ok = 1, optimal_ok = 1, within_one = 1, shape_ok = 1, cases = 0;
    for (int L = 1; L <= 48; L++)
        for (int P = 1; P <= imin(L, MAX_P); P++)
            for (int h = 0; h < nh; h++) {
                int first[MAX_P], nb[MAX_P];
                pipeline_split(L, P, heads[h], first, nb);
                double got = max_stage_cost(P, nb, heads[h]), opt = optimum_split(L, P, heads[h]);
                int part = split_is_partition(L, P, first, nb);
                if ((!part || got > opt + 1e-9) && partition_ok && optimal_ok)
                    printf("# split L=%d P=%d head=%g: partition %d, max cost %g, optimum %g\n", L, P, heads[h], part, got, opt);
                shape_ok &= split_shape_ok(P, nb, heads[h], opt);
                partition_ok &= part, optimal_ok &= got <= opt + 1e-9, within_one &= got <= opt + 1 + 1e-9;
                cases++;
            }
    test_report(st, shape_ok, "split_front_even_lightest_first_last_full", "%g (of %g cases)", shape_ok, cases);
    test_report(st, partition_ok, "split_contiguous_every_block_once", "L=1..48, P=1..8: %g of %g cases", partition_ok, cases);
    test_report(st, within_one, "split_within_one_block_of_optimum", "%g (of %g cases)", within_one, cases);
    test_report(st, optimal_ok, "split_optimal", "%g (of %g cases)", optimal_ok, cases);
}

// d12 (T=1024, Vp=50304): head = 2*50304*768 / (24*768^2 + 4*1024*768) = 77266944 / 17301504.
static void test_head_cost(TestStats* st) {
    double h = pipeline_head_cost(50304, 768, 1024);
    check_close(st, "head_cost_d12", fabs(h - 77266944.0 / 17301504.0), 1e-12);
    // The smallest shape it accepts, every field 1 (error_head_cost_bad_shape has 0): 2 / (24 + 4).
    check_close(st, "head_cost_smallest_shape", fabs(pipeline_head_cost(1, 1, 1) - 2.0 / 28.0), 1e-15);
    int first[4], nb[4];
    pipeline_split(12, 4, h, first, nb);
    // Optimal bottleneck is the last stage (1 block + 4.47): the other 11 blocks go 3,4,4, lightest first.
    check_true(st, "split_d12_4_stages_is_3_4_4_1", nb[0] == 3 && nb[1] == 4 && nb[2] == 4 && nb[3] == 1);
}

// ---- errors: one line on stderr, exit 1 ----

typedef struct { const char* name; int fn, a, b, c; double h; const char* want; } ErrCase;

// fn: 0 1f1b (P, m, stage), 1 bubble (P, m), 2 split (L, P, head), 3 head cost (V, C, T), 4 interleaved
// (P, m, V), 5 zb with V virtual stages (P, m, V).
static void run_error_case(const ErrCase* e) {
    int first[64], nb[64];
    StageSchedule s;
    switch (e->fn) {
    case 0: schedule_1f1b(e->a, e->b, e->c, &s); break;
    case 1: schedule_bubble_fraction(e->a, e->b); break;
    case 2: pipeline_split(e->a, e->b, e->h, first, nb); break;
    case 3: pipeline_head_cost(e->a, e->b, e->c); break;
    case 4: schedule_build(SCHEDULE_INTERLEAVED, e->a, e->b, e->c, 0, &s); break;
    default: schedule_build(SCHEDULE_ZB, e->a, e->b, e->c, 0, &s); break;
    }
}

static void check_error(TestStats* st, const ErrCase* e) {
    char errpath[] = "/tmp/test_schedule_errXXXXXX";
    int fd = mkstemp(errpath);
    if (fd < 0) fail("mkstemp failed");
    close(fd);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        if (!freopen(errpath, "w", stderr)) _exit(99);
        run_error_case(e);
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) fail("waitpid failed");
    char msg[1024] = {0};
    FILE* f = xfopen(errpath, "r");
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    unlink(errpath);
    char* nl = strchr(msg, '\n');
    int one_line = n > 0 && nl == msg + n - 1 && strncmp(msg, "error: ", 7) == 0;
    int exit1 = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    int named = strstr(msg, e->want) != NULL;
    if (!(one_line && exit1 && named)) printf("# %s: status %d, stderr: %s\n", e->name, status, msg);
    test_report(st, one_line && exit1 && named, e->name, "one line, exit 1 and naming it: %g / %g", one_line, exit1 && named);
}

static void test_errors(TestStats* st) {
    const ErrCase cases[] = {
        {"error_zero_stages", 0, 0, 4, 0, 0, "stages 0"},
        {"error_zero_micro", 0, 4, 0, 0, 0, "micro-batches 0"},
        {"error_stage_too_big", 0, 4, 4, 4, 0, "stage 4"},
        {"error_stage_negative", 0, 4, 4, -1, 0, "stage -1"},
        {"error_bubble_zero_micro", 1, 4, 0, 0, 0, "micro-batches 0"},
        {"error_split_more_stages_than_layers", 2, 4, 5, 0, 1.0, "5 stages but only 4 layers"},
        {"error_split_zero_stages", 2, 4, 0, 0, 1.0, "stages 0"},
        {"error_split_negative_head", 2, 12, 4, 0, -1.0, "head cost -1"},
        {"error_head_cost_bad_shape", 3, 50304, 0, 1024, 0, "C 0"},
        {"error_interleaved_ga_not_multiple", 4, 4, 6, 2, 0, "-ga divisible by -pp (micro-batches 6, stages 4)"},
        {"error_interleaved_one_stage", 4, 1, 4, 2, 0, "needs a pipeline"},
        {"error_interleaved_one_chunk", 4, 2, 4, 1, 0, "-vp 1 must be 2..8"},
        {"error_interleaved_too_many_chunks", 4, 2, 4, 9, 0, "-vp 9 must be 2..8"},
        {"error_virtual_stages_without_interleaving", 5, 2, 4, 2, 0, "-vp 2: virtual stages need -ps interleaved"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_error(st, &cases[i]);
}

// ---- print mode ----

static void print_mode(const char* kind_name, int P, int m, int V) {
    ScheduleKind kind;
    if (!schedule_kind_parse(kind_name, &kind)) fail("print: unknown schedule %s (1f1b, interleaved or zb)", kind_name);
    if (P < 1 || P > MAX_P) fail("print: P must be 1..%d", MAX_P);
    StageSchedule ss[MAX_P];
    Case c = {kind, P, m, V};
    build_all(c, ss);
    printf("%s, P=%d stages, m=%d micro-batches, V=%d: bubble %.3f\n", kind_name, P, m, V, schedule_bubble(kind, P, m, V));
    for (int s = 0; s < P; s++) schedule_print(stdout, &ss[s], 0);
    printf("with communication (<s act from s, >s act to s, <<s grad from s, >>s grad to s; :micro[.chunk]):\n");
    for (int s = 0; s < P; s++) schedule_print(stdout, &ss[s], 1);
    for (int s = 0; s < P; s++)
        printf("stage %d: warm-up %d, peak activation sets %d, peak deferred W's %d\n", s, ss[s].num_warmup,
               ss[s].peak_in_flight, ss[s].peak_deferred);
    double buffered, exchanged, blocking = 0, work = m * V * (UNIT_TIMES.t_f + UNIT_TIMES.t_b + (kind == SCHEDULE_ZB ? UNIT_TIMES.t_w : 0.0));
    Times unit = UNIT_TIMES;
    if (kind != SCHEDULE_ZB) unit.t_w = 0.0;
    const char* why = simulate(P, ss, 0, unit, &buffered);
    if (!why) why = simulate_exchanges(P, ss, unit, 0, &exchanged);
    if (!why) why = simulate_exchanges(P, ss, unit, 2, &blocking);
    if (why) printf("simulation: %s\n", why);
    else printf("simulated bubble (t_f 1, t_b 2%s): buffered sends %.3f, exchanges %.3f, exchanges whose sends hold "
                "the stage %.3f\n", kind == SCHEDULE_ZB ? " as B 1 + W 1" : "", (buffered - work) / work,
                (exchanged - work) / work, (blocking - work) / work);
    free_all(P, ss);
    double h = pipeline_head_cost(50304, 768, 1024);
    int first[MAX_P], nb[MAX_P];
    pipeline_split(12, P, h, first, nb);
    printf("d12 (L=12, C=768, T=1024, Vp=50304; LM head = %.3f blocks) on %d stages:\n", h, P);
    for (int s = 0; s < P; s++)
        printf("  stage %d: blocks %2d..%2d (%d)%s%s, cost %.2f blocks\n", s, first[s], first[s] + nb[s] - 1, nb[s],
               s == 0 ? " + embeddings" : "", s == P - 1 ? " + final LayerNorm, LM head, loss" : "",
               nb[s] + (s == P - 1 ? h : 0.0));
}

int main(int argc, char** argv) {
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "print") == 0) {
        print_mode(argv[2], atoi(argv[3]), atoi(argv[4]), argc == 6 ? atoi(argv[5]) : 1);
        return 0;
    }
    TestStats st = {0, 0};
    grid_check(&st, "valid_order", pipe_valid_order);
    grid_check(&st, "shape", pipe_shape);
    grid_check(&st, "comm_local", pipe_comm_local);
    grid_check(&st, "peak", pipe_peak);
    grid_check(&st, "deadlock_free", check_deadlock_free);
    grid_check(&st, "exchanges", check_exchanges);
    grid_check(&st, "bubble", check_bubble);
    test_checkers_catch(&st);
    test_rendezvous(&st);
    test_split(&st);
    test_head_cost(&st);
    test_errors(&st);
    return test_exit(&st);
}
