// test_schedule_lists.c: each stage's list of the pipeline schedules (1f1b, interleaved, zb;
// core/pipeline/schedule.h) on its own, exhaustively for P = 1..8 stages, m = 1..16 micro-batches (m < P
// included) and V = 2..4 virtual stages: the order of its compute, its shape (warm-up, interleaving's chunk
// order, zb's bounds), the communication around each compute, and its peak in-flight activations. Each
// property is checked by code written from the spec, not from the generator, and each checker is shown to
// fail on a broken list (the "catches" checks). Beside it: test_schedule.c (the stages together, simulated)
// and test_schedule_split.c (the stage split and the errors).
#include <stdlib.h>
#include <string.h>

#include "tests/unit/schedule_testlib.h"

static int is_zb(const StageSchedule* st) { return st->kind == SCHEDULE_ZB; }
// The backward that sends a gradient upstream: the whole backward, or zb's B.
static ActionKind upstream_backward(const StageSchedule* st) { return is_zb(st) ? ACT_BACKWARD_INPUT : ACT_BACKWARD; }
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

// ---- every stage of a case, for grid_check ----

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

// ---- the checkers catch broken lists ----

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
// zb: run W 0 right after the first forward, before its B.
static void break_w_before_b(StageSchedule* s) {
    int w = index_of(s, ACT_BACKWARD_WEIGHT, 0), f = index_of(s, ACT_FORWARD, 0);
    Action a = s->actions[w];
    memmove(&s->actions[f + 2], &s->actions[f + 1], (size_t)(w - f - 1) * sizeof(Action));
    s->actions[f + 1] = a;
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
    Case c48 = {SCHEDULE_1F1B, 4, 8, 1}, i48 = {SCHEDULE_INTERLEAVED, 4, 8, 2}, z48 = {SCHEDULE_ZB, 4, 8, 1};
    catches(st, "catches_forward_order", c46, 2, break_forward_order, pipe_valid_order);
    catches(st, "catches_extra_warmup", c46, 1, break_warmup, pipe_shape);
    catches(st, "catches_missing_backward", c35, 0, break_drop_last, pipe_valid_order);
    catches(st, "catches_missing_send", c35, 1, break_drop_last, pipe_comm_local);
    catches(st, "catches_wrong_peer", c43, 1, break_peer, pipe_comm_local);
    catches(st, "catches_peak", c48, 0, break_peak, pipe_peak);
    catches(st, "catches_peak_field", c48, 0, break_peak_field, pipe_peak);
    catches(st, "catches_interleaved_order", i48, 1, break_forward_order, pipe_shape);
    catches(st, "catches_zb_w_before_b", z48, 2, break_w_before_b, pipe_valid_order);
    catches(st, "catches_zb_deferral", z48, 1, break_defer_all, pipe_shape);
    catches(st, "catches_zb_deferral_peak", z48, 1, break_defer_all, pipe_peak);
}

int main(void) {
    TestStats st = {0, 0};
    grid_check(&st, "valid_order", pipe_valid_order);
    grid_check(&st, "shape", pipe_shape);
    grid_check(&st, "comm_local", pipe_comm_local);
    grid_check(&st, "peak", pipe_peak);
    test_checkers_catch(&st);
    return test_exit(&st);
}
