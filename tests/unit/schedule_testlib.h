// schedule_testlib.h: what the schedule test programs share (test_schedule.c, test_schedule_lists.c,
// test_schedule_split.c): the cases (every P <= MAX_P, m <= MAX_M, V <= MAX_V), building every stage's list,
// one check line per (property, schedule, P) over the grid, and the "catches" harness that breaks one stage's
// list and expects a checker to reject it.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/pipeline/schedule.h"
#include "core/models/gpt2/gpt2.h"
#include "tests/unit/testlib.h"

// GPT-2's LM head in blocks (its family's pipeline cost model) for a shape of channels C, padded vocabulary
// Vp and sequence length T.
static inline double gpt2_head_cost(int Vp, int C, int T) {
    ModelShape s = gpt2_shape(1, C, 1, Vp, 1024);
    s.Vp = Vp;
    return GPT2_FAMILY.head_cost(&s, T);
}

#define MAX_P 8
#define MAX_M 16
#define MAX_V 4

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

typedef struct {
    ScheduleKind kind;
    int P, m, V;
} Case;

// Every stage's schedule for the case; ss has room for MAX_P.
static inline void build_all(Case c, StageSchedule* ss) {
    for (int s = 0; s < c.P; s++) schedule_build(c.kind, c.P, c.m, c.V, s, &ss[s]);
}
static inline void free_all(int P, StageSchedule* ss) {
    for (int s = 0; s < P; s++) schedule_free(&ss[s]);
}

// A deep copy, so a "catches" check can break it without touching the original.
static inline StageSchedule copy_schedule(const StageSchedule* s) {
    StageSchedule c = *s;
    c.actions = xmalloc((size_t)(s->count + 1) * sizeof(Action));
    memcpy(c.actions, s->actions, (size_t)s->count * sizeof(Action));
    return c;
}

static inline int vstage(const StageSchedule* st, int chunk) { return chunk * st->num_stages + st->stage; }

typedef const char* (*PipeCheck)(Case c, const StageSchedule* ss);

// The cases of a schedule, in order: P = 1..8, m = 1..16 and V = 2..4 where interleaving allows (P >= 2,
// P | m), else V = 1. Start from c->P == 0; returns 0 after the last.
static inline int next_case(ScheduleKind kind, Case* c) {
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
static inline void grid_check(TestStats* st, const char* prop, PipeCheck fn) {
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
static inline void catches(TestStats* st, const char* name, Case c, int s, void (*breakit)(StageSchedule*), PipeCheck fn) {
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

static inline int index_of(const StageSchedule* s, ActionKind k, int micro) {
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].kind == k && s->actions[i].micro == micro) return i;
    return -1;
}
// Swap the forwards of micro 0 and 1 (with their comm, by relabelling): forwards out of order.
static inline void break_forward_order(StageSchedule* s) {
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].kind <= ACT_SEND_ACT && s->actions[i].micro <= 1) s->actions[i].micro ^= 1;
}
// Send activation 0 to the wrong peer.
static inline void break_peer(StageSchedule* s) { s->actions[index_of(s, ACT_SEND_ACT, 0)].peer += 1; }
