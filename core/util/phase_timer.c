// phase_timer.c: see phase_timer.h.
#include "core/util/phase_timer.h"

#include <time.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void phase_mark(PhaseTimer* pt, Backend* be, Phase p) {
    if (!pt->on) return;
    be_synchronize(be);
    double now = now_seconds();
    pt->seconds[p] += now - pt->last;
    pt->last = now;
}

const char* phase_name(Phase p) {
    static const char* const names[NUM_PHASES] = {"data", "forward", "backward", "pipeline_wait", "grad_reduce", "optimizer",
                                                         "update_wait"};
    return names[p];
}
