// threads.c: see threads.h.
#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include "core/util/threads.h"

#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

static int threads_default(int usable, int online, int ranks_on_host) {
    if (usable < online) return usable;   // bound by the launcher
    int n = usable / (ranks_on_host > 1 ? ranks_on_host : 1);
    return n > 1 ? n : 1;
}

int threads_set_for_rank(int ranks_on_host) {
    const char* env = getenv("OMP_NUM_THREADS");
    if (env && *env) return omp_get_max_threads();
    int online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    // Without an answer (more CPUs than cpu_set_t holds), every online core counts as usable.
    int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    if (online < usable) online = usable;
    int n = threads_default(usable > 0 ? usable : 1, online, ranks_on_host);
    omp_set_num_threads(n);
    return n;
}
