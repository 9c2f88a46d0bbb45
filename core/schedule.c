// schedule.c: see schedule.h.
#include "schedule.h"

#include <math.h>

#include "base/common.h"

// Far more micro-batches than any step uses, and small enough that 6 actions each fit an int.
#define MAX_MICRO (1 << 24)

static void push(StageSchedule* s, ActionKind kind, int micro, int peer) {
    s->actions[s->count++] = (Action){kind, micro, peer};
}

// "RECV_ACT F SEND_ACT": receive only if a stage feeds this one, send only if one follows.
static void emit_forward(StageSchedule* s, int micro) {
    int prev = s->stage - 1, next = s->stage + 1;
    if (prev >= 0) push(s, ACT_RECV_ACT, micro, prev);
    push(s, ACT_FORWARD, micro, -1);
    if (next < s->num_stages) push(s, ACT_SEND_ACT, micro, next);
}

// "RECV_GRAD B SEND_GRAD": the last stage starts backward from its own loss; stage 0 has no one to send to.
static void emit_backward(StageSchedule* s, int micro) {
    int prev = s->stage - 1, next = s->stage + 1;
    if (next < s->num_stages) push(s, ACT_RECV_GRAD, micro, next);
    push(s, ACT_BACKWARD, micro, -1);
    if (prev >= 0) push(s, ACT_SEND_GRAD, micro, prev);
}

// Forwards done minus backwards done, at its highest: the activations this stage must keep at once.
static int peak_in_flight(const StageSchedule* s) {
    int live = 0, peak = 0;
    for (int i = 0; i < s->count; i++) {
        if (s->actions[i].kind == ACT_FORWARD) live++;
        if (s->actions[i].kind == ACT_BACKWARD) live--;
        if (live > peak) peak = live;
    }
    return peak;
}

void schedule_1f1b(int num_stages, int num_micro, int stage, StageSchedule* out) {
    if (num_stages < 1 || num_micro < 1 || num_micro > MAX_MICRO || stage < 0 || stage >= num_stages)
        fail("schedule: bad arguments (stages %d, micro-batches %d, stage %d): need stages >= 1, "
             "1 <= micro-batches <= %d, 0 <= stage < stages", num_stages, num_micro, stage, MAX_MICRO);
    int P = num_stages, m = num_micro, s = stage;
    // Stage s must have P-s-1 micro-batches in the pipe ahead of it before its first backward can arrive:
    // that is how long the gradient of micro 0 takes to come back from the last stage.
    int warmup = P - s - 1 < m ? P - s - 1 : m;
    *out = (StageSchedule){.stage = s, .num_stages = P, .num_micro = m, .num_warmup = warmup};
    out->actions = xmalloc((size_t)6 * (size_t)m * sizeof(Action));   // at most 3 per F and 3 per B
    int fwd = 0, bwd = 0;   // next micro-batch to run forward / backward
    for (int i = 0; i < warmup; i++) emit_forward(out, fwd++);
    for (int i = 0; i < m - warmup; i++) {
        emit_forward(out, fwd++);
        emit_backward(out, bwd++);
    }
    for (int i = 0; i < warmup; i++) emit_backward(out, bwd++);
    out->peak_in_flight = peak_in_flight(out);
}

void schedule_free(StageSchedule* s) {
    free(s->actions);
    s->actions = NULL;
    s->count = 0;
}

double schedule_bubble_fraction(int num_stages, int num_micro) {
    if (num_stages < 1 || num_micro < 1)
        fail("schedule: bad arguments (stages %d, micro-batches %d): both must be >= 1", num_stages, num_micro);
    return (double)(num_stages - 1) / (double)num_micro;
}

const char* schedule_action_name(ActionKind k) {
    switch (k) {
    case ACT_RECV_ACT: return "RECV_ACT";
    case ACT_FORWARD: return "FORWARD";
    case ACT_SEND_ACT: return "SEND_ACT";
    case ACT_RECV_GRAD: return "RECV_GRAD";
    case ACT_BACKWARD: return "BACKWARD";
    case ACT_SEND_GRAD: return "SEND_GRAD";
    }
    return "?";
}

static void print_action(FILE* f, const Action* a) {
    switch (a->kind) {
    case ACT_FORWARD: fprintf(f, "F%d", a->micro); break;
    case ACT_BACKWARD: fprintf(f, "B%d", a->micro); break;
    case ACT_RECV_ACT: fprintf(f, "<%d:%d", a->peer, a->micro); break;
    case ACT_SEND_ACT: fprintf(f, ">%d:%d", a->peer, a->micro); break;
    case ACT_RECV_GRAD: fprintf(f, "<<%d:%d", a->peer, a->micro); break;
    case ACT_SEND_GRAD: fprintf(f, ">>%d:%d", a->peer, a->micro); break;
    }
}

void schedule_print(FILE* f, const StageSchedule* s, int with_comm) {
    fprintf(f, "stage %d:", s->stage);
    for (int i = 0; i < s->count; i++) {
        const Action* a = &s->actions[i];
        if (!with_comm && a->kind != ACT_FORWARD && a->kind != ACT_BACKWARD) continue;
        fputc(' ', f);
        print_action(f, a);
    }
    fputc('\n', f);
}

// ---- split ----

double pipeline_head_cost(int vocab, int channels, int seq_len) {
    if (vocab < 1 || channels < 1 || seq_len < 1)
        fail("pipeline: bad shape for the cost model (V %d, C %d, T %d)", vocab, channels, seq_len);
    double V = vocab, C = channels, T = seq_len;
    return 2.0 * V * C / (24.0 * C * C + 4.0 * T * C);
}

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
