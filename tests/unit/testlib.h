// testlib.h: the tiny protocol every test program follows. Each check prints one line,
// "ok <name>" or "FAIL <name>: <why>"; tests/run_all.sh counts them. A program exits 1 if any failed.
#pragma once
#include <math.h>
#include <stdio.h>

typedef struct { int passed, failed; } TestStats;

static inline void test_report(TestStats* s, int cond, const char* name, const char* fmt, double a, double b) {
    if (cond) {
        s->passed++;
        printf("ok %s\n", name);
    } else {
        s->failed++;
        printf("FAIL %s: ", name);
        printf(fmt, a, b);
        printf("\n");
    }
    fflush(stdout);
}
// Passes when err is finite and err <= tol. NaN never passes.
static inline void check_close(TestStats* s, const char* name, double err, double tol) {
    test_report(s, isfinite(err) && err <= tol, name, "error %.3e > tolerance %.1e", err, tol);
}
static inline void check_true(TestStats* s, const char* name, int cond) {
    test_report(s, cond, name, "condition false (%g %g)", 0, 0);
}
static inline int test_exit(const TestStats* s) { return s->failed ? 1 : 0; }
