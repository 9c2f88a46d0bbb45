// test_schedule_split.c: the stage split of the pipeline (pipeline_split, core/pipeline/schedule.h) against
// the optimum found by dynamic programming, for L = 1..48 blocks, P = 1..8 stages and a range of LM head
// costs; the head cost of d12; and the one-line errors (exit 1) of schedule.h's entry points on bad
// arguments. Beside test_schedule.c and test_schedule_lists.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/schedule_testlib.h"

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
    double h = gpt2_head_cost(50304, 768, 1024);
    check_close(st, "head_cost_d12", fabs(h - 77266944.0 / 17301504.0), 1e-12);
    // The smallest shape it accepts, every field 1 (error_head_cost_bad_shape has 0): 2 / (24 + 4).
    check_close(st, "head_cost_smallest_shape", fabs(gpt2_head_cost(1, 1, 1) - 2.0 / 28.0), 1e-15);
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
    case 3: gpt2_head_cost(e->a, e->b, e->c); break;
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
        {"error_head_cost_bad_shape", 3, 50304, 768, 0, 0, "T 0"},
        {"error_interleaved_ga_not_multiple", 4, 4, 6, 2, 0, "-ga divisible by -pp (micro-batches 6, stages 4)"},
        {"error_interleaved_one_stage", 4, 1, 4, 2, 0, "needs a pipeline"},
        {"error_interleaved_one_chunk", 4, 2, 4, 1, 0, "-vp 1 must be 2..8"},
        {"error_interleaved_too_many_chunks", 4, 2, 4, 9, 0, "-vp 9 must be 2..8"},
        {"error_virtual_stages_without_interleaving", 5, 2, 4, 2, 0, "-vp 2: virtual stages need -ps interleaved"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_error(st, &cases[i]);
}

int main(void) {
    TestStats st = {0, 0};
    test_split(&st);
    test_head_cost(&st);
    test_errors(&st);
    return test_exit(&st);
}
