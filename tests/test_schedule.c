// test_schedule.c: the 1F1B schedule and the stage split (core/schedule.h), exhaustively for P = 1..8
// stages and m = 1..16 micro-batches (m < P included). Each property is checked by code written from the
// spec, not from the generator, and each checker is shown to fail on a broken schedule (the "catches"
// checks), so a checker that silently accepts everything cannot pass.
//
//   ./build/test_schedule              run the checks
//   ./build/test_schedule print P m    print every stage's schedule (compute, then with communication)
//                                      and the d12 split on P stages, for the docs
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "schedule.h"
#include "testlib.h"

#define MAX_P 8
#define MAX_M 16

static int imin(int a, int b) { return a < b ? a : b; }

// Every stage's schedule for (P, m); ss has room for MAX_P.
static void build_all(int P, int m, StageSchedule* ss) {
    for (int s = 0; s < P; s++) schedule_1f1b(P, m, s, &ss[s]);
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

// ---- per-stage order ----

static int is_compute(ActionKind k) { return k == ACT_FORWARD || k == ACT_BACKWARD; }

// Valid for any pipeline schedule: forwards 0..m-1 in order, backwards 0..m-1 in order, B_i after F_i.
// Returns NULL or why not (a static string).
static const char* check_valid_order(const StageSchedule* st) {
    int fwd = 0, bwd = 0;
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        if (a->kind == ACT_FORWARD && a->micro != fwd++) return "forwards out of order";
        if (a->kind == ACT_BACKWARD && a->micro != bwd++) return "backwards out of order";
        if (a->kind == ACT_BACKWARD && a->micro >= fwd) return "backward before its forward";
    }
    if (fwd != st->num_micro || bwd != st->num_micro) return "not every micro-batch ran forward and backward";
    return NULL;
}

// The 1F1B shape: compute string F^w (F B)^(m-w) B^w with w = min(P-s-1, m), i.e. a warm-up of exactly w
// forwards, a steady state that alternates F/B, and a cool-down of w backwards.
static const char* check_1f1b_shape(const StageSchedule* st) {
    int P = st->num_stages, m = st->num_micro, w = imin(P - st->stage - 1, m);
    if (st->num_warmup != w) return "num_warmup != min(P-s-1, m)";
    char want[4 * MAX_M + 1], got[4 * MAX_M + 1];
    int n = 0, k = 0;
    for (int i = 0; i < w; i++) want[n++] = 'F';
    for (int i = 0; i < m - w; i++) want[n++] = 'F', want[n++] = 'B';
    for (int i = 0; i < w; i++) want[n++] = 'B';
    for (int i = 0; i < st->count && k < 4 * MAX_M; i++)
        if (is_compute(st->actions[i].kind)) got[k++] = st->actions[i].kind == ACT_FORWARD ? 'F' : 'B';
    want[n] = got[k] = 0;
    return strcmp(want, got) ? "compute order is not F^w (FB)^(m-w) B^w" : NULL;
}

// Communication around each compute action: F is [RECV_ACT from s-1] F [SEND_ACT to s+1] and B is
// [RECV_GRAD from s+1] B [SEND_GRAD to s-1], the bracketed parts present exactly when that neighbour exists.
static const char* check_comm_local(const StageSchedule* st) {
    int s = st->stage, first = s == 0, last = s == st->num_stages - 1;
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        if (a->micro < 0 || a->micro >= st->num_micro) return "micro index out of range";
        if (is_compute(a->kind) && a->peer != -1) return "compute action with a peer";
        if ((a->kind == ACT_RECV_ACT || a->kind == ACT_SEND_GRAD) && (first || a->peer != s - 1))
            return "act receive / grad send not with stage s-1 (or on stage 0)";
        if ((a->kind == ACT_SEND_ACT || a->kind == ACT_RECV_GRAD) && (last || a->peer != s + 1))
            return "act send / grad receive not with stage s+1 (or on the last stage)";
    }
    // Adjacency: walk compute actions and look at their neighbours.
    for (int i = 0; i < st->count; i++) {
        const Action* a = &st->actions[i];
        if (!is_compute(a->kind)) continue;
        int fw = a->kind == ACT_FORWARD, has_in = fw ? !first : !last, has_out = fw ? !last : !first;
        ActionKind in = fw ? ACT_RECV_ACT : ACT_RECV_GRAD, out = fw ? ACT_SEND_ACT : ACT_SEND_GRAD;
        if (has_in && (i == 0 || st->actions[i - 1].kind != in || st->actions[i - 1].micro != a->micro))
            return "compute not preceded by the receive of its input";
        if (has_out && (i + 1 >= st->count || st->actions[i + 1].kind != out || st->actions[i + 1].micro != a->micro))
            return "compute not followed by the send of its output";
    }
    int ncomm = 0;
    for (int i = 0; i < st->count; i++) ncomm += !is_compute(st->actions[i].kind);
    int want = st->num_micro * (2 * !first + 2 * !last);
    return ncomm == want ? NULL : "stray communication actions";
}

// ---- links between stages ----

// The micro indices of the actions of one kind, in order; returns how many.
static int micros_of(const StageSchedule* st, ActionKind k, int* out) {
    int n = 0;
    for (int i = 0; i < st->count; i++)
        if (st->actions[i].kind == k) out[n++] = st->actions[i].micro;
    return n;
}

// Both ends of a link list the same micro-batches in the same order (so FIFO delivery pairs them right).
static int same_sequence(const StageSchedule* a, ActionKind ka, const StageSchedule* b, ActionKind kb) {
    int x[4 * MAX_M + 8], y[4 * MAX_M + 8];
    int nx = micros_of(a, ka, x), ny = micros_of(b, kb, y);
    return nx == ny && memcmp(x, y, (size_t)nx * sizeof(int)) == 0;
}

static const char* check_links(int P, const StageSchedule* ss) {
    for (int s = 0; s + 1 < P; s++) {
        if (!same_sequence(&ss[s], ACT_SEND_ACT, &ss[s + 1], ACT_RECV_ACT)) return "act sends != next stage's receives";
        if (!same_sequence(&ss[s + 1], ACT_SEND_GRAD, &ss[s], ACT_RECV_GRAD)) return "grad sends != previous stage's receives";
    }
    return NULL;
}

// ---- in-flight activations ----

static int count_peak(const StageSchedule* st) {
    int live = 0, peak = 0;
    for (int i = 0; i < st->count; i++) {
        live += st->actions[i].kind == ACT_FORWARD;
        live -= st->actions[i].kind == ACT_BACKWARD;
        peak = live > peak ? live : peak;
    }
    return peak;
}

static const char* check_peak(const StageSchedule* st) {
    int want = imin(st->num_stages - st->stage, st->num_micro), got = count_peak(st);
    if (got != want) return "peak in-flight activations != min(P-s, m)";
    return st->peak_in_flight == got ? NULL : "peak_in_flight field disagrees with the list";
}

// ---- discrete-event simulation ----
//
// Every stage runs its list. A send appends (micro, time) to its link's FIFO and never blocks (buffered);
// a receive blocks until its link is non-empty, then takes the oldest message, which must be its micro.
// Compute advances the stage's clock by t_f or t_b, and a receive moves it to the message's send time if
// later, so the clocks give the ideal (no comm cost) timeline. act[s] carries activations s -> s+1,
// grad[s] gradients s+1 -> s. The outcome is the same whichever runnable stage goes first (blocking
// receives on FIFO links are deterministic), which the tests confirm with several policies. The rendezvous
// mode models unbuffered sends, to show that the buffering is needed.

typedef struct { int micro[4 * MAX_M + 8]; double time[4 * MAX_M + 8]; int head, tail; } Link;
typedef struct {
    int P;
    const StageSchedule* ss;
    int pc[MAX_P];
    double clock[MAX_P];
    Link act[MAX_P], grad[MAX_P];
    double tf, tb;
    int rendezvous;   // unbuffered sends: a send waits until the peer's next action is its receive
} Sim;

typedef enum { STEP_OK, STEP_ERROR } StepResult;

// The link a send/receive of stage s uses, or NULL if its peer is not the right neighbour.
static Link* link_for(Sim* sim, int s, const Action* a) {
    switch (a->kind) {
    case ACT_SEND_ACT: return a->peer == s + 1 && s + 1 < sim->P ? &sim->act[s] : NULL;
    case ACT_RECV_ACT: return a->peer == s - 1 && s >= 1 ? &sim->act[s - 1] : NULL;
    case ACT_SEND_GRAD: return a->peer == s - 1 && s >= 1 ? &sim->grad[s - 1] : NULL;
    case ACT_RECV_GRAD: return a->peer == s + 1 && s + 1 < sim->P ? &sim->grad[s] : NULL;
    default: return NULL;
    }
}

// Is the peer's next action the receive matching send a? (For rendezvous sends.)
static int peer_waits_for(const Sim* sim, const Action* a) {
    if (a->peer < 0 || a->peer >= sim->P || sim->pc[a->peer] >= sim->ss[a->peer].count) return 0;
    const Action* r = &sim->ss[a->peer].actions[sim->pc[a->peer]];
    ActionKind want = a->kind == ACT_SEND_ACT ? ACT_RECV_ACT : ACT_RECV_GRAD;
    return r->kind == want && r->micro == a->micro;
}

// Can stage s's next action run now? Compute always can, buffered sends too; receives need a message.
static int can_step(Sim* sim, int s) {
    if (sim->pc[s] >= sim->ss[s].count) return 0;
    const Action* a = &sim->ss[s].actions[sim->pc[s]];
    if (a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD) return !sim->rendezvous || peer_waits_for(sim, a);
    if (a->kind == ACT_FORWARD || a->kind == ACT_BACKWARD) return 1;
    Link* l = link_for(sim, s, a);
    return l == NULL || l->head < l->tail;   // a bad peer "runs" so that step() reports it
}

static StepResult step(Sim* sim, int s) {
    const Action* a = &sim->ss[s].actions[sim->pc[s]++];
    if (a->kind == ACT_FORWARD || a->kind == ACT_BACKWARD) {
        sim->clock[s] += a->kind == ACT_FORWARD ? sim->tf : sim->tb;
        return STEP_OK;
    }
    Link* l = link_for(sim, s, a);
    if (!l) return STEP_ERROR;
    if (a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD) {
        if (l->tail >= 4 * MAX_M + 8) return STEP_ERROR;
        l->micro[l->tail] = a->micro, l->time[l->tail++] = sim->clock[s];
        return STEP_OK;
    }
    if (l->micro[l->head] != a->micro) return STEP_ERROR;
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

// Runs the pipeline to completion or deadlock. Returns NULL if every stage finished with every message
// consumed; *makespan = the latest clock.
static const char* simulate_ex(int P, const StageSchedule* ss, int policy, double tf, double tb, int rendezvous,
                               double* makespan) {
    Sim* sim = xcalloc(1, sizeof(Sim));
    sim->P = P, sim->ss = ss, sim->tf = tf, sim->tb = tb, sim->rendezvous = rendezvous;
    unsigned rng = 12345u + (unsigned)policy;
    const char* why = NULL;
    for (int s = -1; (s = pick(sim, policy, &rng, s)) >= 0;)
        if (step(sim, s) == STEP_ERROR) { why = "message mismatch or bad peer"; break; }
    *makespan = 0;
    for (int s = 0; s < P && !why; s++) {
        if (sim->pc[s] < ss[s].count) why = "deadlock: a stage is blocked forever";
        if (sim->act[s].head != sim->act[s].tail || sim->grad[s].head != sim->grad[s].tail) why = "unreceived messages";
        if (sim->clock[s] > *makespan) *makespan = sim->clock[s];
    }
    free(sim);
    return why;
}

static const char* simulate(int P, const StageSchedule* ss, int policy, double tf, double tb, double* makespan) {
    return simulate_ex(P, ss, policy, tf, tb, 0, makespan);
}

// schedule.h says buffering is what makes the order safe: with rendezvous sends, P=2, m=2 deadlocks (stage 0
// sends act 1 while stage 1 sends grad 0), while P=1 and m=1 (nothing to cross) still finish.
static void test_rendezvous(TestStats* st) {
    int results[3];
    const int cases[3][2] = {{2, 2}, {1, 4}, {4, 1}};
    for (int i = 0; i < 3; i++) {
        StageSchedule ss[MAX_P];
        double t;
        build_all(cases[i][0], cases[i][1], ss);
        results[i] = simulate_ex(cases[i][0], ss, 0, 1, 2, 1, &t) == NULL;
        free_all(cases[i][0], ss);
    }
    test_report(st, !results[0], "rendezvous_sends_deadlock_P2_m2", "finished %g (want 0)", results[0], 0);
    test_report(st, results[1] && results[2], "rendezvous_sends_fine_P1_or_m1", "P1 m4 %g, P4 m1 %g", results[1], results[2]);
}

static const char* check_deadlock_free(int P, const StageSchedule* ss) {
    for (int policy = 0; policy < 4; policy++) {
        double t;
        const char* why = simulate(P, ss, policy, 1.0, 2.0, &t);
        if (why) return why;
    }
    return NULL;
}

// With equal stages the step takes (m + P - 1)(t_f + t_b), so the bubble (idle per stage / useful work per
// stage) is (P - 1)/m: schedule_bubble_fraction must match the simulated timeline, for t_b = t_f and 2 t_f.
static const char* check_bubble(int P, int m, const StageSchedule* ss) {
    const double tbs[2] = {1.0, 2.0};
    for (int i = 0; i < 2; i++) {
        double t;
        if (simulate(P, ss, 0, 1.0, tbs[i], &t)) return "simulation failed";
        double work = m * (1.0 + tbs[i]), sim_bubble = (t - work) / work;
        if (fabs(sim_bubble - schedule_bubble_fraction(P, m)) > 1e-12) {
            printf("# P=%d m=%d t_b=%g: step %g, simulated bubble %g, schedule_bubble_fraction %g\n", P, m, tbs[i],
                   t, sim_bubble, schedule_bubble_fraction(P, m));
            return "bubble fraction != simulated idle / work";
        }
    }
    return NULL;
}

// ---- the grid ----

typedef const char* (*PipeCheck)(int P, int m, const StageSchedule* ss);

#define PER_STAGE(name, fn)                                               \
    static const char* name(int P, int m, const StageSchedule* ss) {      \
        (void)m;                                                          \
        for (int s = 0; s < P; s++) {                                     \
            const char* why = fn(&ss[s]);                                 \
            if (why) return why;                                          \
        }                                                                 \
        return NULL;                                                      \
    }
PER_STAGE(pipe_valid_order, check_valid_order)
PER_STAGE(pipe_1f1b_shape, check_1f1b_shape)
PER_STAGE(pipe_comm_local, check_comm_local)
PER_STAGE(pipe_peak, check_peak)
static const char* pipe_links(int P, int m, const StageSchedule* ss) { return (void)m, check_links(P, ss); }
static const char* pipe_deadlock(int P, int m, const StageSchedule* ss) { return (void)m, check_deadlock_free(P, ss); }

// One check line per (property, P), covering m = 1..16; a failure names the first (P, m) and why.
static void grid_check(TestStats* st, const char* prop, PipeCheck fn) {
    for (int P = 1; P <= MAX_P; P++) {
        int bad_m = 0;
        for (int m = 1; m <= MAX_M && !bad_m; m++) {
            StageSchedule ss[MAX_P];
            build_all(P, m, ss);
            const char* why = fn(P, m, ss);
            if (why) printf("# %s P=%d m=%d: %s\n", prop, P, m, why), bad_m = m;
            free_all(P, ss);
        }
        char name[96];
        snprintf(name, sizeof name, "schedule_%s_P%d_m1-%d", prop, P, MAX_M);
        test_report(st, bad_m == 0, name, "first failure at P=%g m=%g", P, bad_m);
    }
}

// ---- the checkers catch broken schedules ----

// Applies `breakit` to stage `s` of (P, m) and expects `fn` to reject the result.
static void catches(TestStats* st, const char* name, int P, int m, int s, void (*breakit)(StageSchedule*), PipeCheck fn) {
    StageSchedule ss[MAX_P];
    build_all(P, m, ss);
    StageSchedule orig = ss[s];
    ss[s] = copy_schedule(&orig);
    int ok_before = fn(P, m, ss) == NULL;
    breakit(&ss[s]);
    int rejected = fn(P, m, ss) != NULL;
    free(ss[s].actions);
    ss[s] = orig;
    free_all(P, ss);
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

static void test_checkers_catch(TestStats* st) {
    catches(st, "catches_forward_order", 4, 6, 2, break_forward_order, pipe_valid_order);
    catches(st, "catches_extra_warmup", 4, 6, 1, break_warmup, pipe_1f1b_shape);
    catches(st, "catches_missing_backward", 3, 5, 0, break_drop_last, pipe_valid_order);
    catches(st, "catches_missing_send", 3, 5, 1, break_drop_last, pipe_comm_local);
    catches(st, "catches_missing_send_link", 3, 5, 1, break_drop_last, pipe_links);
    catches(st, "catches_wrong_peer", 4, 3, 1, break_peer, pipe_comm_local);
    catches(st, "catches_wrong_peer_sim", 4, 3, 1, break_peer, pipe_deadlock);
    catches(st, "catches_deadlock", 2, 2, 0, break_recv_first, pipe_deadlock);
    catches(st, "catches_deadlock_deep", 6, 9, 3, break_recv_first, pipe_deadlock);
    catches(st, "catches_unreceived_message", 3, 5, 0, break_drop_recv, pipe_deadlock);
    catches(st, "catches_peak", 4, 8, 0, break_peak, pipe_peak);
    catches(st, "catches_peak_field", 4, 8, 0, break_peak_field, pipe_peak);
    catches(st, "catches_forward_order_link", 4, 6, 2, break_forward_order, pipe_links);
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
    int first[4], nb[4];
    pipeline_split(12, 4, h, first, nb);
    // Optimal bottleneck is the last stage (1 block + 4.47): the other 11 blocks go 3,4,4, lightest first.
    check_true(st, "split_d12_4_stages_is_3_4_4_1", nb[0] == 3 && nb[1] == 4 && nb[2] == 4 && nb[3] == 1);
}

// ---- errors: one line on stderr, exit 1 ----

typedef struct { const char* name; int fn, a, b, c; double h; const char* want; } ErrCase;

static void run_error_case(const ErrCase* e) {
    int first[64], nb[64];
    if (e->fn == 0) {
        StageSchedule s;
        schedule_1f1b(e->a, e->b, e->c, &s);
    } else if (e->fn == 1) {
        schedule_bubble_fraction(e->a, e->b);
    } else if (e->fn == 2) {
        pipeline_split(e->a, e->b, e->h, first, nb);
    } else {
        pipeline_head_cost(e->a, e->b, e->c);
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
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_error(st, &cases[i]);
}

// ---- print mode ----

static void print_mode(int P, int m) {
    StageSchedule ss[MAX_P];
    if (P < 1 || P > MAX_P) fail("print: P must be 1..%d", MAX_P);
    build_all(P, m, ss);
    printf("1F1B, P=%d stages, m=%d micro-batches, bubble (P-1)/m = %.3f\n", P, m, schedule_bubble_fraction(P, m));
    for (int s = 0; s < P; s++) schedule_print(stdout, &ss[s], 0);
    printf("with communication (<s act from s, >s act to s, <<s grad from s, >>s grad to s; :micro):\n");
    for (int s = 0; s < P; s++) schedule_print(stdout, &ss[s], 1);
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
    if (argc == 4 && strcmp(argv[1], "print") == 0) {
        print_mode(atoi(argv[2]), atoi(argv[3]));
        return 0;
    }
    TestStats st = {0, 0};
    grid_check(&st, "valid_order", pipe_valid_order);
    grid_check(&st, "1f1b_shape", pipe_1f1b_shape);
    grid_check(&st, "comm_local", pipe_comm_local);
    grid_check(&st, "links_match", pipe_links);
    grid_check(&st, "peak_in_flight", pipe_peak);
    grid_check(&st, "deadlock_free", pipe_deadlock);
    grid_check(&st, "bubble_fraction", check_bubble);
    test_checkers_catch(&st);
    test_rendezvous(&st);
    test_split(&st);
    test_head_cost(&st);
    test_errors(&st);
    return test_exit(&st);
}
