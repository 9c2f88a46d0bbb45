// schedule.c: see schedule.h.
#include "core/pipeline/schedule.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "base/common.h"

// Far more micro-batches than any step uses, and small enough that 7 actions each fit an int.
#define MAX_MICRO (1 << 24)

static void push(StageSchedule* s, ActionKind kind, int micro, int chunk, int peer) {
    s->actions[s->count++] = (Action){kind, micro, chunk, peer};
}

// Virtual stage chunk * P + stage: the neighbours are the next and previous stages around the ring.
static int virtual_stage(const StageSchedule* s, int chunk) { return chunk * s->num_stages + s->stage; }
static int is_first_virtual(const StageSchedule* s, int chunk) { return virtual_stage(s, chunk) == 0; }
static int is_last_virtual(const StageSchedule* s, int chunk) {
    return virtual_stage(s, chunk) == s->num_stages * s->num_chunks - 1;
}
static int prev_stage(const StageSchedule* s) { return (s->stage + s->num_stages - 1) % s->num_stages; }
static int next_stage(const StageSchedule* s) { return (s->stage + 1) % s->num_stages; }

// A forward's (backward = 0) or backward's receive and send, where that neighbour exists; interleaving
// places them apart from the compute.
static void emit_recv(StageSchedule* s, int backward, int micro, int chunk) {
    if (!backward && !is_first_virtual(s, chunk)) push(s, ACT_RECV_ACT, micro, chunk, prev_stage(s));
    if (backward && !is_last_virtual(s, chunk)) push(s, ACT_RECV_GRAD, micro, chunk, next_stage(s));
}
static void emit_send(StageSchedule* s, int backward, int micro, int chunk) {
    if (!backward && !is_last_virtual(s, chunk)) push(s, ACT_SEND_ACT, micro, chunk, next_stage(s));
    if (backward && !is_first_virtual(s, chunk)) push(s, ACT_SEND_GRAD, micro, chunk, prev_stage(s));
}

// "RECV_ACT F SEND_ACT": receive only if a virtual stage feeds this one, send only if one follows.
static void emit_forward(StageSchedule* s, int micro, int chunk) {
    emit_recv(s, 0, micro, chunk);
    push(s, ACT_FORWARD, micro, chunk, -1);
    emit_send(s, 0, micro, chunk);
}

// "RECV_GRAD B SEND_GRAD" (B: the whole backward, or zb's input half): the last virtual stage starts from
// its own loss; the first has no one to send to.
static void emit_backward(StageSchedule* s, ActionKind kind, int micro, int chunk) {
    emit_recv(s, 1, micro, chunk);
    push(s, kind, micro, chunk, -1);
    emit_send(s, 1, micro, chunk);
}

// The peaks the memory plan uses: activation sets live from F to the action that frees them (the backward,
// or zb's W), in all and per chunk, and zb's deferred W's.
static void count_peaks(StageSchedule* s) {
    int live = 0, deferred = 0, live_chunk[MAX_CHUNKS] = {0};
    for (int i = 0; i < s->count; i++) {
        const Action* a = &s->actions[i];
        int d = a->kind == ACT_FORWARD ? 1 : a->kind == ACT_BACKWARD || a->kind == ACT_BACKWARD_WEIGHT ? -1 : 0;
        live += d, live_chunk[a->chunk] += d;
        deferred += a->kind == ACT_BACKWARD_INPUT ? 1 : a->kind == ACT_BACKWARD_WEIGHT ? -1 : 0;
        if (live > s->peak_in_flight) s->peak_in_flight = live;
        if (live_chunk[a->chunk] > s->peak_chunk[a->chunk]) s->peak_chunk[a->chunk] = live_chunk[a->chunk];
        if (deferred > s->peak_deferred) s->peak_deferred = deferred;
    }
}

static void build_1f1b(StageSchedule* s) {
    int P = s->num_stages, m = s->num_micro;
    // Stage s must have P-s-1 micro-batches in the pipe ahead of it before its first backward can arrive:
    // that is how long the gradient of micro 0 takes to come back from the last stage.
    int warmup = P - s->stage - 1 < m ? P - s->stage - 1 : m;
    s->num_warmup = warmup;
    int fwd = 0, bwd = 0;   // next micro-batch to run forward / backward
    for (int i = 0; i < warmup; i++) emit_forward(s, fwd++, 0);
    for (int i = 0; i < m - warmup; i++) {
        emit_forward(s, fwd++, 0);
        emit_backward(s, ACT_BACKWARD, bwd++, 0);
    }
    for (int i = 0; i < warmup; i++) emit_backward(s, ACT_BACKWARD, bwd++, 0);
}

// Interleaving's k-th forward (or backward) of a stage: groups of P micro-batches per chunk, the chunks in
// order for forwards and reversed for backwards.
static int interleaved_micro(const StageSchedule* s, int k) {
    int P = s->num_stages, V = s->num_chunks;
    return k / (P * V) * P + k % P;
}
static int interleaved_chunk(const StageSchedule* s, int k, int backward) {
    int c = k / s->num_stages % s->num_chunks;
    return backward ? s->num_chunks - 1 - c : c;
}

// Megatron's order, rounds of compute with one exchange between rounds: a round is one forward (warm-up),
// a forward and a backward (steady state) or one backward (cool-down); the exchange after round r sends
// its outputs and receives round r + 1's inputs. Interleaving needs that batching (a stage sends to and
// receives from both neighbours in the same round; with one exchange per compute, as in 1f1b, it
// deadlocks under rendezvous sends from P=2, m=4 on), and it is what the warm-up's factor 2 pays for.
static void build_interleaved(StageSchedule* s) {
    int P = s->num_stages, V = s->num_chunks, total = s->num_micro * V;
    // Megatron's warm-up: enough forwards that the first backward's gradient has come back through the
    // later stages (twice their number: there and back) and every chunk's first group is in flight.
    int warmup = (P - s->stage - 1) * 2 + (V - 1) * P;
    if (warmup > total) warmup = total;
    s->num_warmup = warmup;
    // Round r runs forward r (if r < total), then backward r - warmup (if that is 0 .. total-1).
    for (int r = 0; r <= total + warmup; r++) {
        int f = r < total ? r : -1, b = r >= warmup && r - warmup < total ? r - warmup : -1;
        int pf = r >= 1 && r - 1 < total ? r - 1 : -1, pb = r - 1 >= warmup && r - 1 - warmup < total ? r - 1 - warmup : -1;
        // the exchange before round r: round r - 1's outputs, round r's inputs
        if (pf >= 0) emit_send(s, 0, interleaved_micro(s, pf), interleaved_chunk(s, pf, 0));
        if (pb >= 0) emit_send(s, 1, interleaved_micro(s, pb), interleaved_chunk(s, pb, 1));
        if (f >= 0) emit_recv(s, 0, interleaved_micro(s, f), interleaved_chunk(s, f, 0));
        if (b >= 0) emit_recv(s, 1, interleaved_micro(s, b), interleaved_chunk(s, b, 1));
        if (f >= 0) push(s, ACT_FORWARD, interleaved_micro(s, f), interleaved_chunk(s, f, 0), -1);
        if (b >= 0) push(s, ACT_BACKWARD, interleaved_micro(s, b), interleaved_chunk(s, b, 1), -1);
    }
}

// zb: the greedy pass over the ideal timeline with unit-time F, B and W (schedule.h), run for every stage
// at once, since each stage's choices depend on when its neighbours' messages arrive; `s` keeps its own.
typedef struct {
    int f, b, w;        // forwards, input-gradient backwards and weight-gradient backwards done
    long long free_at;  // the time step at which the stage can start its next action
} ZbStage;

// What stage q runs at time t, or -1 if it waits. ready_f/ready_b: when each micro's input/gradient is there.
static int zb_choice(const ZbStage* st, int q, int P, int m, long long t, const long long* ready_f, const long long* ready_b) {
    int in_flight_cap = P - q < m ? P - q : m;   // 1F1B's bound on micro-batches between F and B
    int deferral_cap = q + 1;                    // deferred W's: the later stages need them to keep B's moving
    if (st->b < st->f && ready_b[st->b] <= t && st->b - st->w < deferral_cap) return ACT_BACKWARD_INPUT;
    if (st->f < m && ready_f[st->f] <= t && st->f - st->b < in_flight_cap) return ACT_FORWARD;
    if (st->w < st->b) return ACT_BACKWARD_WEIGHT;
    return -1;
}

static void build_zb(StageSchedule* s) {
    int P = s->num_stages, m = s->num_micro;
    size_t n = (size_t)P * (size_t)m;
    long long* ready_f = xmalloc(n * sizeof(long long));   // [stage][micro]
    long long* ready_b = xmalloc(n * sizeof(long long));
    for (size_t i = 0; i < n; i++) ready_f[i] = i < (size_t)m ? 0 : LLONG_MAX, ready_b[i] = LLONG_MAX;
    ZbStage* st = xcalloc((size_t)P, sizeof(ZbStage));
    int finished = 0;
    for (long long t = 0; finished < P; t++) {
        if (t > 4LL * (long long)(m + P) + 8) fail("internal: the zb schedule for P=%d, m=%d does not finish", P, m);
        for (int q = 0; q < P; q++) {
            ZbStage* z = &st[q];
            if (z->free_at > t || z->w == m) continue;
            int kind = zb_choice(z, q, P, m, t, ready_f + (size_t)q * m, ready_b + (size_t)q * m);
            if (kind < 0) continue;
            int micro = kind == ACT_FORWARD ? z->f++ : kind == ACT_BACKWARD_INPUT ? z->b++ : z->w++;
            z->free_at = t + 1;
            if (kind == ACT_FORWARD) {   // the last stage's own loss is its gradient
                if (q + 1 < P) ready_f[(size_t)(q + 1) * m + micro] = t + 1;
                else ready_b[(size_t)q * m + micro] = t + 1;
            }
            if (kind == ACT_BACKWARD_INPUT && q > 0) ready_b[(size_t)(q - 1) * m + micro] = t + 1;
            finished += z->w == m;
            if (q != s->stage) continue;
            if (kind == ACT_FORWARD) emit_forward(s, micro, 0);
            else if (kind == ACT_BACKWARD_INPUT) emit_backward(s, ACT_BACKWARD_INPUT, micro, 0);
            else push(s, ACT_BACKWARD_WEIGHT, micro, 0, -1);
            if (kind == ACT_FORWARD && z->b == 0) s->num_warmup = z->f;
        }
    }
    free(st);
    free(ready_b);
    free(ready_f);
}

void schedule_check(ScheduleKind kind, int num_stages, int num_micro, int num_chunks) {
    int P = num_stages, m = num_micro, V = num_chunks;
    if (P < 1 || m < 1 || m > MAX_MICRO)
        fail("schedule: bad arguments (stages %d, micro-batches %d): need stages >= 1, 1 <= micro-batches <= %d", P, m,
             MAX_MICRO);
    if (kind != SCHEDULE_INTERLEAVED && V != 1)
        fail("-vp %d: virtual stages need -ps interleaved (the schedule is %s)", V, schedule_kind_name(kind));
    if (kind != SCHEDULE_INTERLEAVED) return;
    if (P < 2) fail("-ps interleaved needs a pipeline (-pp >= 2)");
    if (V < 2 || V > MAX_CHUNKS) fail("-ps interleaved: -vp %d must be 2..%d virtual stages per rank", V, MAX_CHUNKS);
    if (m % P) fail("-ps interleaved needs -ga divisible by -pp (micro-batches %d, stages %d)", m, P);
}

void schedule_build(ScheduleKind kind, int num_stages, int num_micro, int num_chunks, int stage, StageSchedule* out) {
    schedule_check(kind, num_stages, num_micro, num_chunks);
    if (stage < 0 || stage >= num_stages)
        fail("schedule: bad arguments (stages %d, micro-batches %d, stage %d): need 0 <= stage < stages", num_stages,
             num_micro, stage);
    *out = (StageSchedule){.kind = kind, .stage = stage, .num_stages = num_stages, .num_micro = num_micro,
                           .num_chunks = num_chunks};
    // At most 3 actions per F, 3 per B and 1 per W, for every chunk.
    out->actions = xmalloc((size_t)7 * (size_t)num_micro * (size_t)num_chunks * sizeof(Action));
    if (kind == SCHEDULE_1F1B) build_1f1b(out);
    else if (kind == SCHEDULE_INTERLEAVED) build_interleaved(out);
    else build_zb(out);
    count_peaks(out);
}

void schedule_free(StageSchedule* s) {
    free(s->actions);
    s->actions = NULL;
    s->count = 0;
}

const char* schedule_kind_name(ScheduleKind k) {
    return k == SCHEDULE_1F1B ? "1f1b" : k == SCHEDULE_INTERLEAVED ? "interleaved" : "zb";
}

int schedule_kind_parse(const char* name, ScheduleKind* out) {
    const ScheduleKind kinds[] = {SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, schedule_kind_name(kinds[i])) == 0) return *out = kinds[i], 1;
    return 0;
}

double schedule_bubble(ScheduleKind kind, int num_stages, int num_micro, int num_chunks) {
    if (num_stages < 1 || num_micro < 1 || num_chunks < 1)
        fail("schedule: bad arguments (stages %d, micro-batches %d, chunks %d): all must be >= 1", num_stages, num_micro,
             num_chunks);
    double P = num_stages, m = num_micro;
    if (kind == SCHEDULE_INTERLEAVED) return (P - 1) / (num_chunks * m);
    if (kind == SCHEDULE_ZB) return (P - 1) / (3 * m);
    return (P - 1) / m;
}

const char* schedule_action_name(ActionKind k) {
    switch (k) {
    case ACT_RECV_ACT: return "RECV_ACT";
    case ACT_FORWARD: return "FORWARD";
    case ACT_SEND_ACT: return "SEND_ACT";
    case ACT_RECV_GRAD: return "RECV_GRAD";
    case ACT_BACKWARD: return "BACKWARD";
    case ACT_SEND_GRAD: return "SEND_GRAD";
    case ACT_BACKWARD_INPUT: return "BACKWARD_INPUT";
    case ACT_BACKWARD_WEIGHT: return "BACKWARD_WEIGHT";
    }
    return "?";
}

static void print_action(FILE* f, const Action* a) {
    const char* pre[] = {"<%d:", "F", ">%d:", "<<%d:", "B", ">>%d:", "B", "W"};
    fprintf(f, pre[a->kind], a->peer);
    fprintf(f, "%d", a->micro);
    if (a->chunk) fprintf(f, ".%d", a->chunk);
}

void schedule_print(FILE* f, const StageSchedule* s, int with_comm) {
    fprintf(f, "stage %d:", s->stage);
    for (int i = 0; i < s->count; i++) {
        const Action* a = &s->actions[i];
        if (!with_comm && !action_is_compute(a->kind)) continue;
        fputc(' ', f);
        print_action(f, a);
    }
    fputc('\n', f);
}

// ---- split ----

// The cost of the slowest stage when the last stage runs n_last blocks and the other P-1 stages share the
// rest as evenly as whole blocks allow (the best they can do: ceil(rest / (P-1)) on the fullest).
static double bottleneck(int L, int P, double head_cost, int n_last) {
    double last = n_last + head_cost;
    if (P == 1) return last;
    int rest = L - n_last;
    int fullest = (rest + P - 2) / (P - 1);
    return last > fullest ? last : fullest;
}

void pipeline_split(int num_layers, int num_stages, double head_cost, int* first_block, int* num_blocks) {
    int L = num_layers, P = num_stages;
    if (P < 1 || L < 1) fail("pipeline: need at least one stage and one layer (stages %d, layers %d)", P, L);
    if (P > L) fail("pipeline: %d stages but only %d layers: every stage needs at least one block", P, L);
    if (!(head_cost >= 0) || !isfinite(head_cost)) fail("pipeline: bad LM head cost %g", head_cost);
    // Only the last stage differs from the others, so the whole choice is how many blocks it gets; the
    // others then split the rest evenly. Ties go to the largest n_last: it leaves the others lighter.
    int n_last = P == 1 ? L : 1;
    for (int n = n_last + 1; n <= L - (P - 1) && P > 1; n++)
        if (bottleneck(L, P, head_cost, n) <= bottleneck(L, P, head_cost, n_last) + 1e-9) n_last = n;
    num_blocks[P - 1] = n_last;
    if (P > 1) {
        // The earliest stages get the smaller share: stage 0 keeps the most activations in flight.
        int rest = L - n_last, q = rest / (P - 1), r = rest % (P - 1);
        for (int s = 0; s < P - 1; s++) num_blocks[s] = q + (s >= P - 1 - r ? 1 : 0);
    }
    for (int s = 0, next = 0; s < P; next += num_blocks[s], s++) first_block[s] = next;
}
