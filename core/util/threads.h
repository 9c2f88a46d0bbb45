// threads.h: how many OpenMP threads each rank runs.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// OMP_NUM_THREADS when it is set. Otherwise the cores this rank may run on (its CPU affinity), shared
// among the ranks_on_host ranks of this host, at least 1 each: OpenMP's own default is every core for every
// rank, which oversubscribes a host running several ranks. A rank the launcher bound to fewer cores than
// the host has online keeps all of them: they are its own. Sets the count for the calling thread's parallel
// regions and returns it.
int threads_set_for_rank(int ranks_on_host);

#ifdef __cplusplus
}
#endif
