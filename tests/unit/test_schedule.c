// test_schedule.c: the pipeline schedules (1f1b, interleaved, zb; core/pipeline/schedule.h) run together,
// every stage's list at once, exhaustively for P = 1..8 stages, m = 1..16 micro-batches (m < P included) and
// V = 2..4 virtual stages: a discrete-event simulation with buffered sends (no deadlock, every message
// received as sent), one with the executor's exchanges (rendezvous, in-order completion, the activation sets
// a pending send reads), and the bubble each list gives against schedule_bubble. Each checker is shown to
// fail on a broken schedule (the "catches" checks), so a checker that silently accepts everything cannot
// pass. Beside it: test_schedule_lists.c (each stage's list on its own) and test_schedule_split.c (the stage
// split, the LM head's cost, and the errors).
//
//   ./build/test_schedule                      run the checks
//   ./build/test_schedule print KIND P m [V]   print every stage's schedule (compute, then with
//                                              communication), its bubble and peaks, and the d12 split
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/schedule_testlib.h"

#define MAX_MSG (MAX_V * MAX_M + 8)

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

// ---- the checkers catch broken schedules ----

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

static void test_checkers_catch(TestStats* st) {
    Case c46 = {SCHEDULE_1F1B, 4, 6, 1}, c35 = {SCHEDULE_1F1B, 3, 5, 1}, c43 = {SCHEDULE_1F1B, 4, 3, 1};
    Case c22 = {SCHEDULE_1F1B, 2, 2, 1}, c69 = {SCHEDULE_1F1B, 6, 9, 1}, c48 = {SCHEDULE_1F1B, 4, 8, 1};
    Case i48 = {SCHEDULE_INTERLEAVED, 4, 8, 2}, z48 = {SCHEDULE_ZB, 4, 8, 1}, i24 = {SCHEDULE_INTERLEAVED, 2, 4, 2};
    catches(st, "catches_wrong_peer_sim", c43, 1, break_peer, check_deadlock_free);
    catches(st, "catches_deadlock", c22, 0, break_recv_first, check_deadlock_free);
    catches(st, "catches_deadlock_deep", c69, 3, break_recv_first, check_deadlock_free);
    catches(st, "catches_unreceived_message", c35, 0, break_drop_recv, check_deadlock_free);
    catches(st, "catches_forward_order_link", c46, 2, break_forward_order, check_deadlock_free);
    catches(st, "catches_interleaved_wrong_chunk", i48, 1, break_chunk, check_deadlock_free);
    catches(st, "catches_zb_bubble", z48, 0, break_eager_w, check_bubble);
    catches(st, "catches_exchange_deadlock", c22, 0, break_recv_first, check_exchanges);
    catches(st, "catches_exchange_deadlock_deep", c69, 3, break_recv_first, check_exchanges);
    catches(st, "catches_exchange_unreceived_message", c35, 0, break_drop_recv, check_exchanges);
    catches(st, "catches_exchange_kind_order", i24, 0, break_send_kinds, check_exchanges);
    catches(st, "catches_exchange_pending_set", c48, 0, break_fewer_sets, check_exchanges);
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
    double h = gpt2_head_cost(50304, 768, 1024);
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
    grid_check(&st, "deadlock_free", check_deadlock_free);
    grid_check(&st, "exchanges", check_exchanges);
    grid_check(&st, "bubble", check_bubble);
    test_checkers_catch(&st);
    test_rendezvous(&st);
    return test_exit(&st);
}
