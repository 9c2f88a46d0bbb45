// watchdog.h: the hang watchdog behind comm.h's comm_watchdog_start and comm_watchdog_phase, internal to the
// comm layer (comm_mpi.c is its one user; watchdog.c has the protocol).
//
// The contract:
//   - Every wait of comm_mpi.c goes through watchdog_waitall: it completes the requests, like MPI_Waitall.
//     Off (timeout 0, the default), it is MPI_Waitall. On, it polls MPI_Testall and meanwhile answers the
//     other ranks' questions; the same operations either way, so the watchdog never changes a result's bits.
//   - A wait that outlasts the timeout (COMM_WATCHDOG_LONG times it in a long phase) asks every rank what it
//     waits in. A rank silent through the ask window, or every rank answering twice with none moved on (the
//     waits do not match), ends the job: one line on stderr (comm.h gives its forms), after stdio's buffers
//     are flushed, then MPI_Abort. Nothing returns to the caller then.
//   - Its messages travel on a duplicate of the world of its own, so they never meet the program's.
//   - Every MPI return code is checked (mpi_check.h): a failure is a one-line error and exit 1.
//   - It keeps no global state: everything lives in the Watchdog, which the world and every group split
//     from it share, and which only the thread that calls MPI touches.
#pragma once
#include <mpi.h>
#include <stdarg.h>

typedef struct Watchdog Watchdog;

// What a rank waits in, for the watchdog's lines: "all-reduce over the world", "receive from rank 3".
typedef struct {
    const char* op;           // a verb phrase the peers or the group follow: "all-reduce", "receive from", ...
    int peer[4], npeers;      // point-to-point: the group ranks waited on (0: the whole group)
    int group_size;           // the group waited in: its size,
    const int* world_ranks;   // and each of its ranks' world rank (NULL: the ranks are the world's)
} WdWait;

// Collective over world (it duplicates it). Off until watchdog_set_timeout.
Watchdog* watchdog_create(MPI_Comm world);
// After the last wait; a question or answer still on its way is let go.
void watchdog_free(Watchdog* w);
// Seconds, the same on every rank; 0: off.
void watchdog_set_timeout(Watchdog* w, double timeout_s);
double watchdog_timeout(const Watchdog* w);
// What this rank does from now on (comm_watchdog_phase), printf-style.
void watchdog_phase(Watchdog* w, int long_phase, const char* fmt, va_list ap);
// out[r] (size entries) = the world rank of rank r of group, a communicator of the world's ranks.
void watchdog_world_ranks(const Watchdog* w, MPI_Comm group, int size, int* out);
// MPI_Waitall(n, reqs, stats) (stats NULL: ignored), watched; `what` names the call for an error, wt says
// what the rank waits in.
void watchdog_waitall(Watchdog* w, int n, MPI_Request* reqs, MPI_Status* stats, const char* what, WdWait wt);
