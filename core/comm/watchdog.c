// watchdog.c: the hang watchdog (watchdog.h states its contract; comm.h what the program sees).
//
// Why every wait polls: OpenMPI's blocking calls spin inside MPI until the operation completes, so a rank
// whose peer stopped (SIGSTOP, a frozen host) spins forever and cannot tell anyone anything. Every operation
// of comm_mpi.c is started nonblocking (MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier, MPI_Isend, MPI_Irecv,
// ...) and, with the watchdog on, waited for by polling MPI_Testall (watchdog_waitall); every SERVE_EVERY of
// a wait the rank looks for the other ranks' questions on the watchdog's own communicator (a duplicate of
// the world, so they never meet the program's messages) and answers them. With the watchdog off the requests go to MPI_Waitall: the same
// operations either way, so -wd never changes a result's bits.
//
// Finding the rank that stopped: a wait that outlasts its limit asks every other rank (ASK). A rank inside a
// wait of its own answers within SERVE_EVERY (ANSWER: what it waits in, for how long, and how many waits it
// has entered). Whoever has not answered within the ask window stopped answering: the ranks that wait are
// all polling, so only a stopped or dead process stays silent, or one working outside any wait for longer
// than the timeout plus the window, which is as much a hang as far as the timeout can tell. Whoever answers
// is not missing; when everyone answers, the waiting goes on, and only when a second question a window later
// finds every rank still in the wait it answered from (no wait count moved anywhere) do the ranks wait in
// operations that do not match, a deadlock, which ends the job too.
//
// One line per job: the lowest rank that answered (or this one, when lower) reports. A rank that is not the
// reporter sends it its line (VERDICT); the reporter, which answered from a wait and so is polling, prints
// it and aborts the job. Should the job still be up two windows later (the reporter's wait ended and it has
// not reached another), the rank reports itself.
//
// Long phases: a rank writing a checkpoint or running an evaluation can keep the others waiting far longer
// than a training step does (rank 0 alone writes model.bin, the manifest and DONE, then renames; a slow disk
// or a validation shard on a slow filesystem stretches that), and while it works outside a wait it cannot
// answer, so it looks like a stopped rank. Pausing the clock during such phases would let a rank that stops
// mid-checkpoint hang the job forever, so instead every wait inside a phase the trainer marks long gets
// COMM_WATCHDOG_LONG times the timeout: still bounded, and a generous margin, since the timeout itself must
// already exceed the longest stretch of work between two waits of a training step. Every rank enters such a
// phase at the same step (checkpoints and evaluations are collective), so the waiting ranks know it.
// Start-up and the end of the run are long phases too: rank 0 alone searches and inspects the checkpoint to
// resume, each rank reads its share of it or initializes its part of the model at its own pace, and at the
// end a rank may remove large -nvme files while the others wait in finalize.
//
// NCCL (comm_nccl.c) enqueues its collectives on the GPU and never blocks the host in this layer: a rank
// whose peer stopped blocks in the backend's device synchronization (be_download, be_synchronize) instead,
// so the NCCL path is not watched yet. The loop below takes any readiness test (watch_wait's `ready`) for
// that reason: covering NCCL means polling cudaStreamQuery / cudaEventQuery and ncclCommGetAsyncError
// through it at those synchronizations, and calling ncclCommAbort in end_job before MPI_Abort so that the
// kernels spinning in NCCL let go. Not done: the backend would need a hook into this layer, and no machine
// here has two GPUs to test it on.
#include "core/comm/watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "core/comm/comm.h"
#include "core/comm/mpi_check.h"

enum { WD_ASK = 1, WD_ANSWER, WD_VERDICT };
#define WD_TEXT 256          // what a rank waits in, as text
#define WD_LINE 1024         // the job's last line
#define SERVE_EVERY 0.01     // seconds between looks for questions while waiting

typedef struct {
    int ask;                  // the question it answers
    double waited;            // seconds in its current wait
    unsigned long long ops;   // waits it has entered so far: it moved on when this grows
    char what[WD_TEXT];       // what it waits in
} Answer;

struct Watchdog {
    MPI_Comm mc;              // a duplicate of the world
    int rank, size;
    double timeout;           // seconds; 0: off
    int long_phase;           // comm_watchdog_phase
    char where[128];
    unsigned long long ops;   // waits entered
    int ask_id;               // this rank's latest question
    int have_seen;            // seen[] holds the wait counts of an earlier question of this wait
    Answer* answers;          // [size]: each rank's latest answer (to the latest question when .ask == ask_id)
    unsigned long long* seen;   // [size]
    MPI_Request* ask_req;     // [size]: a question on its way to each rank, and its payload
    int* ask_out;
    MPI_Request* answer_req;  // [size]: an answer on its way to each rank, and its payload
    Answer* answer_out;
    MPI_Request verdict_req;  // a line on its way to the reporter
    char verdict_out[WD_LINE];
    int handed_over;          // this rank's line went to the reporter, whose abort ends the job
};

static double wd_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) fail("clock_gettime: %s", strerror(errno));
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The window a question waits for its answers: long enough for a loaded host to schedule every waiting rank.
static double ask_window(const Watchdog* w) {
    double x = w->timeout / 5.0;
    return x < 2.0 ? 2.0 : x > 30.0 ? 30.0 : x;
}


// Appends printf-style to the string in out (size bytes), cutting it short when full.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void addf(char* out, size_t size, const char* fmt, ...) {
    size_t n = strlen(out);
    if (n + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, size - n, fmt, ap);
    va_end(ap);
}

static int world_rank(const WdWait* wt, int r) { return wt->world_ranks ? wt->world_ranks[r] : r; }

// "all-reduce over the world (step 12: gradient norm)", "receive from rank 3 (checkpoint at step 20)".
static void describe(const Watchdog* w, const WdWait* wt, char* out, size_t size) {
    out[0] = 0;
    addf(out, size, "%s", wt->op);
    if (wt->npeers > 0) {
        addf(out, size, " rank%s ", wt->npeers > 1 ? "s" : "");
        for (int i = 0; i < wt->npeers; i++) addf(out, size, "%s%d", i ? ", " : "", world_rank(wt, wt->peer[i]));
    } else if (wt->group_size == w->size) {
        addf(out, size, " over the world");
    } else {
        addf(out, size, " over ranks ");
        for (int i = 0; i < wt->group_size && i < 8; i++) addf(out, size, "%s%d", i ? ", " : "", world_rank(wt, i));
        if (wt->group_size > 8) addf(out, size, ", ... (%d ranks)", wt->group_size);
    }
    if (w->where[0]) addf(out, size, " (%s)", w->where);
}

// mpi_check, but once this rank has handed its line to the reporter an MPI failure is the reporter's
// abort reaching it: it leaves without a line of its own, so that the job ends with one.
static void wd_check(const Watchdog* w, int rc, const char* what) {
    if (rc != MPI_SUCCESS && w->handed_over) {
        if (fflush(NULL) != 0) {
        }
        _exit(1);
    }
    mpi_check(rc, what);
}

// Whether a send of the watchdog's is still on its way (its request is MPI_REQUEST_NULL once done).
static int in_transit(const Watchdog* w, MPI_Request* r) {
    if (*r == MPI_REQUEST_NULL) return 0;
    int done = 0;
    wd_check(w, MPI_Test(r, &done, MPI_STATUS_IGNORE), "MPI_Test (watchdog)");
    return !done;
}

static _Noreturn void end_job(const char* line) {
    // What the run printed and logged goes out before the line; a stream that cannot be flushed now is past
    // helping, and the line matters more.
    if (fflush(NULL) != 0) {
    }
    print_error_line("%s", line);
    MPI_Abort(MPI_COMM_WORLD, 1);   // ends every rank of the job; it returns only when MPI itself is broken
    _exit(1);
}

// Answers the questions that came in, takes the answers to this rank's latest one, and ends the job on a
// reporter's line.
static void serve(Watchdog* w, const WdWait* wt, double start, double t) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        wd_check(w, MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, w->mc, &flag, &st), "MPI_Iprobe (watchdog)");
        if (!flag) return;
        int from = st.MPI_SOURCE;
        if (st.MPI_TAG == WD_ASK) {
            int id = 0;
            wd_check(w, MPI_Recv(&id, 1, MPI_INT, from, WD_ASK, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
            if (in_transit(w, &w->answer_req[from])) continue;   // it has not taken the last answer yet
            Answer* a = &w->answer_out[from];
            a->ask = id;
            a->waited = t - start;
            a->ops = w->ops;
            describe(w, wt, a->what, sizeof a->what);
            wd_check(w, MPI_Isend(a, (int)sizeof *a, MPI_BYTE, from, WD_ANSWER, w->mc, &w->answer_req[from]), "MPI_Isend (watchdog)");
        } else if (st.MPI_TAG == WD_ANSWER) {
            Answer a;
            wd_check(w, MPI_Recv(&a, (int)sizeof a, MPI_BYTE, from, WD_ANSWER, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
            a.what[WD_TEXT - 1] = 0;
            if (a.ask == w->ask_id) w->answers[from] = a;   // older ones answer questions already judged
        } else if (st.MPI_TAG == WD_VERDICT) {
            char line[WD_LINE];
            wd_check(w, MPI_Recv(line, WD_LINE, MPI_CHAR, from, WD_VERDICT, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
            line[WD_LINE - 1] = 0;
            end_job(line);
        } else {
            fail("internal: a watchdog message with tag %d from rank %d", st.MPI_TAG, from);
        }
    }
}

static void ask_all(Watchdog* w) {
    w->ask_id++;
    for (int r = 0; r < w->size; r++) {
        if (r == w->rank || in_transit(w, &w->ask_req[r])) continue;   // the last question still waits for it
        w->ask_out[r] = w->ask_id;
        wd_check(w, MPI_Isend(&w->ask_out[r], 1, MPI_INT, r, WD_ASK, w->mc, &w->ask_req[r]), "MPI_Isend (watchdog)");
    }
}

static int answered(const Watchdog* w, int r) { return r == w->rank || w->answers[r].ask == w->ask_id; }

static int all_answered(const Watchdog* w) {
    for (int r = 0; r < w->size; r++)
        if (!answered(w, r)) return 0;
    return 1;
}

// After a question: 1 with the job's last line in `line` when the job must end; 0 when every rank answered
// and some rank has moved on since the previous question of this wait (or there was none): it goes on.
static int judge(Watchdog* w, const WdWait* wt, double start, double t, char* line, size_t size) {
    char what[WD_TEXT], missing[WD_LINE / 2] = "";
    describe(w, wt, what, sizeof what);
    int n = 0;
    for (int r = 0; r < w->size; r++)
        if (!answered(w, r)) addf(missing, sizeof missing, "%s%d", n++ ? ", " : "", r);
    line[0] = 0;
    if (n > 0) {
        addf(line, size, "rank%s %s stopped answering: rank %d waited %.1f s in %s", n > 1 ? "s" : "", missing, w->rank,
             t - start, what);
        return 1;
    }
    int moved = !w->have_seen;
    for (int r = 0; r < w->size; r++) {
        if (r == w->rank) continue;
        moved |= w->answers[r].ops != w->seen[r];
        w->seen[r] = w->answers[r].ops;
    }
    w->have_seen = 1;
    if (moved) return 0;
    addf(line, size, "every rank answers but none moves on (their waits do not match): rank %d waited %.1f s in %s", w->rank,
         t - start, what);
    for (int r = 0; r < w->size; r++)
        if (r != w->rank) addf(line, size, "; rank %d waits in %s", r, w->answers[r].what);
    return 1;
}

typedef int (*ReadyFn)(void* arg);   // 1 once the operation waited for has completed

// Polls ready() until it says the operation completed, serving the watchdog meanwhile; ends the job when
// the wait outlasts its limit and judge() says so.
static void watch_wait(Watchdog* w, const WdWait* wt, double start, ReadyFn ready, void* arg) {
    double window = ask_window(w);
    double deadline = start + w->timeout * (w->long_phase ? COMM_WATCHDOG_LONG : 1);
    double next_serve = start + SERVE_EVERY, answers_by = 0.0, report_at = 0.0;
    char line[WD_LINE] = "";
    w->have_seen = 0;
    while (!ready(arg)) {
        double t = wd_now();
        if (t < next_serve) continue;
        next_serve = t + SERVE_EVERY;
        serve(w, wt, start, t);
        if (report_at > 0.0) {
            if (t >= report_at) end_job(line);   // the reporter did not end the job: this rank does
            continue;
        }
        if (answers_by == 0.0 && t >= deadline) {
            ask_all(w);
            answers_by = t + window;
        }
        if (answers_by == 0.0 || (t < answers_by && !all_answered(w))) continue;
        answers_by = 0.0;
        if (!judge(w, wt, start, t, line, sizeof line)) {
            deadline = t + window;   // everyone answered and something moved: ask again a window later
            continue;
        }
        int reporter = w->rank;
        for (int r = 0; r < w->rank && reporter == w->rank; r++)
            if (answered(w, r)) reporter = r;
        if (reporter == w->rank) end_job(line);
        if (!in_transit(w, &w->verdict_req)) {
            snprintf(w->verdict_out, sizeof w->verdict_out, "%s", line);
            wd_check(w, MPI_Isend(w->verdict_out, (int)strlen(w->verdict_out) + 1, MPI_CHAR, reporter, WD_VERDICT, w->mc,
                                &w->verdict_req),
                      "MPI_Isend (watchdog)");
        }
        w->handed_over = 1;
        report_at = t + 2.0 * window;
    }
}

typedef struct {
    const Watchdog* w;
    int n;
    MPI_Request* reqs;
    MPI_Status* stats;   // NULL: ignored
    const char* what;    // the MPI call, for an error
} Requests;

static int requests_done(void* arg) {
    Requests* r = (Requests*)arg;
    int done = 0;
    wd_check(r->w, MPI_Testall(r->n, r->reqs, &done, r->stats ? r->stats : MPI_STATUSES_IGNORE), r->what);
    return done;
}

Watchdog* watchdog_create(MPI_Comm world) {
    Watchdog* w = xcalloc(1, sizeof(Watchdog));
    mpi_check(MPI_Comm_dup(world, &w->mc), "MPI_Comm_dup");
    mpi_check(MPI_Comm_set_errhandler(w->mc, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_rank(w->mc, &w->rank), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(w->mc, &w->size), "MPI_Comm_size");
    size_t n = (size_t)w->size;
    w->answers = xcalloc(n, sizeof(Answer));
    w->seen = xcalloc(n, sizeof(unsigned long long));
    w->ask_req = xmalloc(n * sizeof(MPI_Request));
    w->answer_req = xmalloc(n * sizeof(MPI_Request));
    w->ask_out = xcalloc(n, sizeof(int));
    w->answer_out = xcalloc(n, sizeof(Answer));
    for (size_t r = 0; r < n; r++) w->ask_req[r] = w->answer_req[r] = MPI_REQUEST_NULL;
    w->verdict_req = MPI_REQUEST_NULL;
    return w;
}

// A question or answer still on its way at the end goes unwaited for: nobody needs it any more.
static void let_go(const Watchdog* w, MPI_Request* r) {
    if (in_transit(w, r)) mpi_check(MPI_Request_free(r), "MPI_Request_free (watchdog)");
}

void watchdog_free(Watchdog* w) {
    for (int r = 0; r < w->size; r++) let_go(w, &w->ask_req[r]), let_go(w, &w->answer_req[r]);
    let_go(w, &w->verdict_req);
    mpi_check(MPI_Comm_free(&w->mc), "MPI_Comm_free");
    free(w->answers), free(w->seen), free(w->ask_req), free(w->answer_req), free(w->ask_out), free(w->answer_out);
    free(w);
}

void watchdog_set_timeout(Watchdog* w, double timeout_s) { w->timeout = timeout_s; }
double watchdog_timeout(const Watchdog* w) { return w->timeout; }

void watchdog_phase(Watchdog* w, int long_phase, const char* fmt, va_list ap) {
    w->long_phase = long_phase;
    vsnprintf(w->where, sizeof w->where, fmt, ap);
}

void watchdog_world_ranks(const Watchdog* w, MPI_Comm group, int size, int* out) {
    int* mine = xmalloc((size_t)size * sizeof(int));
    for (int r = 0; r < size; r++) mine[r] = r;
    MPI_Group g, wg;
    mpi_check(MPI_Comm_group(group, &g), "MPI_Comm_group");
    mpi_check(MPI_Comm_group(w->mc, &wg), "MPI_Comm_group");
    mpi_check(MPI_Group_translate_ranks(g, size, mine, wg, out), "MPI_Group_translate_ranks");
    mpi_check(MPI_Group_free(&g), "MPI_Group_free");
    mpi_check(MPI_Group_free(&wg), "MPI_Group_free");
    free(mine);
}

void watchdog_waitall(Watchdog* w, int n, MPI_Request* reqs, MPI_Status* stats, const char* what, WdWait wt) {
    if (!(w->timeout > 0.0)) {
        mpi_check(MPI_Waitall(n, reqs, stats ? stats : MPI_STATUSES_IGNORE), what);
        return;
    }
    w->ops++;
    Requests r = {w, n, reqs, stats, what};
    watch_wait(w, &wt, wd_now(), requests_done, &r);
}
