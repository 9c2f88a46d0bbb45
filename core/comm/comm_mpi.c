// comm_mpi.c: comm.h over MPI (OpenMPI).
//
// Device buffers (a GPU backend is attached) are staged through a host buffer: download, MPI on the host,
// upload. That is correct everywhere, including several ranks on one GPU, but not fast. Reduce-scatter and
// all-gather (comm.h's start/wait) use MPI's nonblocking collectives on a private host copy per collective
// in flight, for host and device buffers alike; the synchronous calls are start + wait, so both give the
// same bits (MPI_Ireduce_scatter_block may add in another order than the blocking call would: with 3+
// ranks, sums differ in their last bits from builds before start/wait existed). In a GPU build with
// NCCL, comm_select can hand the bulk collectives (all-reduce, reduce-scatter, all-gather, broadcast) of a
// communicator and the groups split from it to NCCL (core/comm/comm_nccl.c); this file still checks their
// arguments and counts their bytes, so the counters are the same whichever library moves the data.
// The pipeline's exchanges go to NCCL too (ncclSend/ncclRecv in one group) or stay here as MPI_Issend and
// MPI_Irecv: synchronous sends, so that the CPU tests run under NCCL's rendezvous semantics and a schedule
// that would deadlock a GPU deadlocks here too (and the tests' time limits end it).
// Every operation, the blocking ones of comm.h included, is started nonblocking and completed by
// wait_requests, which the hang watchdog (below) watches.
//
// bf16/fp16 sums use our own MPI_Op (fp32 add, one round-to-nearest-even per pairwise reduction), since
// MPI has no 16-bit float types. MPI counts are ints, so every transfer is split into chunks of at most
// max_count elements (INT_MAX; the tests lower it with GPT_COMM_MAX_COUNT to exercise the split).

#include "core/comm/comm.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "core/comm/comm_nccl.h"
#include "base/common.h"
#include "kernels/dtype.h"

// A reduce-scatter or all-gather started and not yet waited for (comm.h's CommHandle names one). The host
// copy, the requests and the event stay with the slot for its next use.
typedef struct {
    uint32_t gen;          // the handle's; 0: the slot is free
    Collective kind;
    void* out;             // where the result goes (all-gather: the buffer)
    const void* in;        // the input (all-gather: the buffer)
    size_t n;              // elements per rank
    DType dt;
    unsigned char* host;   // private copy the MPI call works on (layouts at rs_post / ag_post)
    size_t host_cap;
    MPI_Request* reqs;     // one per chunk
    int nreq, reqs_cap;
    NcclEvent* done;       // NCCL: recorded on the comm stream when the collective has finished
} InFlight;

typedef struct Watchdog Watchdog;

// What a rank waits in, for the watchdog (below): a verb phrase the peers or the group follow.
typedef struct {
    const char* op;           // "all-reduce", "receive from", ...
    const Comm* c;
    int peer[4], npeers;      // point-to-point: the group ranks waited on (0: the whole group)
    double start;
} Wait;

struct Comm {
    MPI_Comm mc;
    int rank, size;
    Watchdog* wd;            // the world's, shared by every group split from it
    int* world_ranks;        // [size]: each rank's world rank, for the watchdog's lines (NULL in the world)
    MPI_Request* oreqs;      // a one-shot operation's requests (its chunks), grown on demand
    MPI_Status* ostats;
    size_t oreqs_cap;
    int local_rank;          // world only
    int local_size;          // world only: ranks on this host
    int host_leader;         // world only: the world rank of this host's lowest rank
    int is_world;
    Backend* be;             // NULL or a CPU backend: buffers are host memory
    MPI_Op op_sum[3];        // by DType; the bf16/fp16 ops are owned by the world, copied into sub-groups
    size_t max_count;        // elements per MPI call
    unsigned char* stage;    // host staging for device buffers, grown on demand
    size_t stage_cap;
    unsigned char* xstage;   // host staging for an exchange's device buffers, grown on demand
    size_t xstage_cap;
    MPI_Request* xreqs;      // an exchange's requests and their statuses, grown on demand
    MPI_Status* xstats;
    size_t xreqs_cap;
    int xpending;            // requests of an exchange of sends still in flight (the first xpending of xreqs)
    Wait xsent;              // what they wait in, for the watchdog
    uint64_t bytes[NUM_COLLECTIVES];
    NcclGroup* nccl;         // non-NULL: the bulk collectives on device buffers go to NCCL
    InFlight flight[COMM_MAX_IN_FLIGHT];
    uint32_t next_gen;
    int poison;              // GPT_COMM_POISON (comm.h)
};

static void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error code %d", rc);
    fail("%s failed: %s", what, msg);
}

// The reduction callbacks get no context pointer, hence one function per type.
static void sum_bf16(void* in, void* inout, int* len, MPI_Datatype* dt) {
    (void)dt;
    const uint16_t* a = in;
    uint16_t* b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_f32(f32_from_bf16(a[i]) + f32_from_bf16(b[i]));
}
static void sum_fp16(void* in, void* inout, int* len, MPI_Datatype* dt) {
    (void)dt;
    const uint16_t* a = in;
    uint16_t* b = inout;
    for (int i = 0; i < *len; i++) b[i] = fp16_from_f32(f32_from_fp16(a[i]) + f32_from_fp16(b[i]));
}

static MPI_Datatype mpi_type(DType dt) { return dt == DT_FP32 ? MPI_FLOAT : MPI_UINT16_T; }
static MPI_Op sum_op(const Comm* c, DType dt) { return dt == DT_FP32 ? MPI_SUM : c->op_sum[dt]; }

static int staged(const Comm* c) { return c->be && backend_is_gpu(c->be); }

// A host buffer of at least `bytes`, grown (never shrunk) on demand; its contents are not kept.
static unsigned char* grown(unsigned char** buf, size_t* cap, size_t bytes) {
    if (bytes > *cap) {
        free(*buf);
        *buf = xmalloc(bytes);
        *cap = bytes;
    }
    return *buf;
}

static unsigned char* stage(Comm* c, size_t bytes) { return grown(&c->stage, &c->stage_cap, bytes); }

// Pieces of at most max_count (bytes or elements) that `count` is sent in.
static size_t nchunks(const Comm* c, size_t count) { return count ? (count - 1) / c->max_count + 1 : 1; }
// The length of the piece of `count` that starts at `off` (a multiple of max_count).
static size_t piece(const Comm* c, size_t count, size_t off) {
    return count - off < c->max_count ? count - off : c->max_count;
}

static size_t mul_bytes(size_t a, size_t b, const char* what) {
    if (b && a > SIZE_MAX / b) fail("%s: %zu x %zu bytes overflows", what, a, b);
    return a * b;
}

// The ring-algorithm traffic of comm.h's header, rounded down per call when S does not divide evenly.
static void count(Comm* c, Collective k, size_t bytes) {
    uint64_t n = (uint64_t)c->size, s = bytes;
    if (n <= 1) return;
    switch (k) {
    case COLL_ALLREDUCE: c->bytes[k] += 2 * (n - 1) * s / n; break;
    case COLL_REDUCE_SCATTER:
    case COLL_ALLGATHER: c->bytes[k] += (n - 1) * s / n; break;
    default: c->bytes[k] += s; break;
    }
}

// ---------------------------------------------------------------------------------------------------
// Waits, and the hang watchdog (comm.h).
//
// Why every wait polls: OpenMPI's blocking calls spin inside MPI until the operation completes, so a rank
// whose peer stopped (SIGSTOP, a frozen host) spins forever and cannot tell anyone anything. Every operation
// here is started nonblocking (MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier, MPI_Isend, MPI_Irecv, ...) and, with
// the watchdog on, waited for by polling MPI_Testall; every SERVE_EVERY of a wait the rank looks for the
// other ranks' questions on the watchdog's own communicator (a duplicate of the world, so they never meet
// the program's messages) and answers them. With the watchdog off the requests go to MPI_Waitall: the same
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
//
// NCCL (comm_nccl.c) enqueues its collectives on the GPU and never blocks the host in this layer: a rank
// whose peer stopped blocks in the backend's device synchronization (be_download, be_synchronize) instead,
// so the NCCL path is not watched yet. The loop below takes any readiness test (watch_wait's `ready`) for
// that reason: covering NCCL means polling cudaStreamQuery / cudaEventQuery and ncclCommGetAsyncError
// through it at those synchronizations, and calling ncclCommAbort in end_job before MPI_Abort so that the
// kernels spinning in NCCL let go. Not done: the backend would need a hook into this layer, and no machine
// here has two GPUs to test it on.
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

static int world_rank(const Comm* c, int r) { return c->world_ranks ? c->world_ranks[r] : r; }

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

// "all-reduce over the world (step 12: gradient norm)", "receive from rank 3 (checkpoint at step 20)".
static void describe(const Watchdog* w, const Wait* wt, char* out, size_t size) {
    const Comm* c = wt->c;
    out[0] = 0;
    addf(out, size, "%s", wt->op);
    if (wt->npeers > 0) {
        addf(out, size, " rank%s ", wt->npeers > 1 ? "s" : "");
        for (int i = 0; i < wt->npeers; i++) addf(out, size, "%s%d", i ? ", " : "", world_rank(c, wt->peer[i]));
    } else if (c->size == w->size) {
        addf(out, size, " over the world");
    } else {
        addf(out, size, " over ranks ");
        for (int i = 0; i < c->size && i < 8; i++) addf(out, size, "%s%d", i ? ", " : "", world_rank(c, i));
        if (c->size > 8) addf(out, size, ", ... (%d ranks)", c->size);
    }
    if (w->where[0]) addf(out, size, " (%s)", w->where);
}

// Whether a send of the watchdog's is still on its way (its request is MPI_REQUEST_NULL once done).
static int in_transit(MPI_Request* r) {
    if (*r == MPI_REQUEST_NULL) return 0;
    int done = 0;
    check(MPI_Test(r, &done, MPI_STATUS_IGNORE), "MPI_Test (watchdog)");
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
static void serve(Watchdog* w, const Wait* wt, double t) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        check(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, w->mc, &flag, &st), "MPI_Iprobe (watchdog)");
        if (!flag) return;
        int from = st.MPI_SOURCE;
        if (st.MPI_TAG == WD_ASK) {
            int id = 0;
            check(MPI_Recv(&id, 1, MPI_INT, from, WD_ASK, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
            if (in_transit(&w->answer_req[from])) continue;   // it has not taken the last answer yet
            Answer* a = &w->answer_out[from];
            a->ask = id;
            a->waited = t - wt->start;
            a->ops = w->ops;
            describe(w, wt, a->what, sizeof a->what);
            check(MPI_Isend(a, (int)sizeof *a, MPI_BYTE, from, WD_ANSWER, w->mc, &w->answer_req[from]), "MPI_Isend (watchdog)");
        } else if (st.MPI_TAG == WD_ANSWER) {
            Answer a;
            check(MPI_Recv(&a, (int)sizeof a, MPI_BYTE, from, WD_ANSWER, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
            a.what[WD_TEXT - 1] = 0;
            if (a.ask == w->ask_id) w->answers[from] = a;   // older ones answer questions already judged
        } else if (st.MPI_TAG == WD_VERDICT) {
            char line[WD_LINE];
            check(MPI_Recv(line, WD_LINE, MPI_CHAR, from, WD_VERDICT, w->mc, MPI_STATUS_IGNORE), "MPI_Recv (watchdog)");
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
        if (r == w->rank || in_transit(&w->ask_req[r])) continue;   // the last question still waits for it
        w->ask_out[r] = w->ask_id;
        check(MPI_Isend(&w->ask_out[r], 1, MPI_INT, r, WD_ASK, w->mc, &w->ask_req[r]), "MPI_Isend (watchdog)");
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
static int judge(Watchdog* w, const Wait* wt, double t, char* line, size_t size) {
    char what[WD_TEXT], missing[WD_LINE / 2] = "";
    describe(w, wt, what, sizeof what);
    int n = 0;
    for (int r = 0; r < w->size; r++)
        if (!answered(w, r)) addf(missing, sizeof missing, "%s%d", n++ ? ", " : "", r);
    line[0] = 0;
    if (n > 0) {
        addf(line, size, "rank%s %s stopped answering: rank %d waited %.1f s in %s", n > 1 ? "s" : "", missing, w->rank,
             t - wt->start, what);
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
         t - wt->start, what);
    for (int r = 0; r < w->size; r++)
        if (r != w->rank) addf(line, size, "; rank %d waits in %s", r, w->answers[r].what);
    return 1;
}

typedef int (*ReadyFn)(void* arg);   // 1 once the operation waited for has completed

// Polls ready() until it says the operation completed, serving the watchdog meanwhile; ends the job when
// the wait outlasts its limit and judge() says so.
static void watch_wait(Watchdog* w, const Wait* wt, ReadyFn ready, void* arg) {
    double window = ask_window(w);
    double deadline = wt->start + w->timeout * (w->long_phase ? COMM_WATCHDOG_LONG : 1);
    double next_serve = wt->start + SERVE_EVERY, answers_by = 0.0, report_at = 0.0;
    char line[WD_LINE] = "";
    w->have_seen = 0;
    while (!ready(arg)) {
        double t = wd_now();
        if (t < next_serve) continue;
        next_serve = t + SERVE_EVERY;
        serve(w, wt, t);
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
        if (!judge(w, wt, t, line, sizeof line)) {
            deadline = t + window;   // everyone answered and something moved: ask again a window later
            continue;
        }
        int reporter = w->rank;
        for (int r = 0; r < w->rank && reporter == w->rank; r++)
            if (answered(w, r)) reporter = r;
        if (reporter == w->rank) end_job(line);
        if (!in_transit(&w->verdict_req)) {
            snprintf(w->verdict_out, sizeof w->verdict_out, "%s", line);
            check(MPI_Isend(w->verdict_out, (int)strlen(w->verdict_out) + 1, MPI_CHAR, reporter, WD_VERDICT, w->mc,
                            &w->verdict_req),
                  "MPI_Isend (watchdog)");
        }
        report_at = t + 2.0 * window;
    }
}

typedef struct {
    int n;
    MPI_Request* reqs;
    MPI_Status* stats;   // NULL: ignored
    const char* what;    // the MPI call, for an error
} Requests;

static int requests_done(void* arg) {
    Requests* r = (Requests*)arg;
    int done = 0;
    check(MPI_Testall(r->n, r->reqs, &done, r->stats ? r->stats : MPI_STATUSES_IGNORE), r->what);
    return done;
}

// MPI_Waitall of c's requests, watched. wt: what the rank waits in (its op and peers; the rest is filled here).
static void wait_requests(Comm* c, int n, MPI_Request* reqs, MPI_Status* stats, const char* what, Wait wt) {
    Watchdog* w = c->wd;
    if (!(w->timeout > 0.0)) {
        check(MPI_Waitall(n, reqs, stats ? stats : MPI_STATUSES_IGNORE), what);
        return;
    }
    w->ops++;
    wt.c = c;
    wt.start = wd_now();
    Requests r = {n, reqs, stats, what};
    watch_wait(w, &wt, requests_done, &r);
}

// Room for a one-shot operation's requests (its chunks).
static MPI_Request* op_requests(Comm* c, size_t n) {
    if (n > INT_MAX) fail("%zu MPI requests are too many for one MPI_Waitall", n);
    if (n > c->oreqs_cap) {
        free(c->oreqs), free(c->ostats);
        c->oreqs = xmalloc(n * sizeof(MPI_Request));
        c->ostats = xmalloc(n * sizeof(MPI_Status));
        c->oreqs_cap = n;
    }
    return c->oreqs;
}

static Watchdog* watchdog_create(MPI_Comm world) {
    Watchdog* w = xcalloc(1, sizeof(Watchdog));
    check(MPI_Comm_dup(world, &w->mc), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(w->mc, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(w->mc, &w->rank), "MPI_Comm_rank");
    check(MPI_Comm_size(w->mc, &w->size), "MPI_Comm_size");
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
static void let_go(MPI_Request* r) {
    if (in_transit(r)) check(MPI_Request_free(r), "MPI_Request_free (watchdog)");
}

static void watchdog_free(Watchdog* w) {
    for (int r = 0; r < w->size; r++) let_go(&w->ask_req[r]), let_go(&w->answer_req[r]);
    let_go(&w->verdict_req);
    check(MPI_Comm_free(&w->mc), "MPI_Comm_free");
    free(w->answers), free(w->seen), free(w->ask_req), free(w->answer_req), free(w->ask_out), free(w->answer_out);
    free(w);
}

void comm_watchdog_start(Comm* world, double timeout_s) {
    if (!world->is_world) fail("comm_watchdog_start: needs the world communicator");
    if (!(timeout_s >= 0.0 && timeout_s <= 1e9)) fail("comm_watchdog_start: timeout %g s outside 0..1e9", timeout_s);
    world->wd->timeout = world->size > 1 ? timeout_s : 0.0;
}

void comm_watchdog_phase(Comm* world, int long_phase, const char* fmt, ...) {
    Watchdog* w = world->wd;
    w->long_phase = long_phase;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->where, sizeof w->where, fmt, ap);
    va_end(ap);
}

static Comm* comm_new(MPI_Comm mc, const char* what) {
    Comm* c = xcalloc(1, sizeof(Comm));
    c->mc = mc;
    check(MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN), what);
    check(MPI_Comm_rank(mc, &c->rank), "MPI_Comm_rank");
    check(MPI_Comm_size(mc, &c->size), "MPI_Comm_size");
    c->max_count = INT_MAX;
    return c;
}

Comm* comm_init_world(int* argc, char*** argv) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_FUNNELED) fail("MPI_Init_thread: this MPI does not provide MPI_THREAD_FUNNELED");
    // Errors on MPI_COMM_WORLD itself (the dup below, op creation) return too, so they get our message.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm mc;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &mc), "MPI_Comm_dup");   // isolates our traffic from any library's
    Comm* c = comm_new(mc, "MPI_Comm_set_errhandler");
    c->is_world = 1;
    c->wd = watchdog_create(mc);
    c->op_sum[DT_FP32] = MPI_SUM;
    check(MPI_Op_create(sum_bf16, 1, &c->op_sum[DT_BF16]), "MPI_Op_create");
    check(MPI_Op_create(sum_fp16, 1, &c->op_sum[DT_FP16]), "MPI_Op_create");

    MPI_Comm node;
    check(MPI_Comm_split_type(mc, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &c->local_rank), "MPI_Comm_rank");
    check(MPI_Comm_size(node, &c->local_size), "MPI_Comm_size");
    c->host_leader = c->rank;   // node rank 0 has the lowest world rank (the split's key)
    check(MPI_Bcast(&c->host_leader, 1, MPI_INT, 0, node), "MPI_Bcast");
    check(MPI_Comm_free(&node), "MPI_Comm_free");

    const char* mx = getenv("GPT_COMM_MAX_COUNT");   // test hook: small chunks exercise the splitting
    if (mx && *mx) {
        char* end;
        long long v = strtoll(mx, &end, 10);
        if (*end || v < 1 || v > INT_MAX) fail("GPT_COMM_MAX_COUNT=%s: expected 1..%d", mx, INT_MAX);
        c->max_count = (size_t)v;
    }
    const char* po = getenv("GPT_COMM_POISON");
    if (po && *po && strcmp(po, "0") && strcmp(po, "1")) fail("GPT_COMM_POISON=%s: expected 0 or 1", po);
    c->poison = po && !strcmp(po, "1");
    return c;
}

void comm_attach_backend(Comm* c, Backend* be) { c->be = be; }

Comm* comm_split(Comm* parent, int color, int key) {
    if (color < 0 && color != COMM_NO_GROUP) fail("comm_split: color %d must be >= 0", color);
    MPI_Comm mc;
    check(MPI_Comm_split(parent->mc, color == COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &mc), "MPI_Comm_split");
    if (color == COMM_NO_GROUP) return NULL;   // MPI_COMM_NULL
    Comm* c = comm_new(mc, "MPI_Comm_set_errhandler");
    c->wd = parent->wd;
    c->world_ranks = xmalloc((size_t)c->size * sizeof(int));   // for the watchdog's lines
    int* mine = xmalloc((size_t)c->size * sizeof(int));
    for (int r = 0; r < c->size; r++) mine[r] = r;
    MPI_Group g, wg;
    check(MPI_Comm_group(c->mc, &g), "MPI_Comm_group");
    check(MPI_Comm_group(c->wd->mc, &wg), "MPI_Comm_group");
    check(MPI_Group_translate_ranks(g, c->size, mine, wg, c->world_ranks), "MPI_Group_translate_ranks");
    check(MPI_Group_free(&g), "MPI_Group_free");
    check(MPI_Group_free(&wg), "MPI_Group_free");
    free(mine);
    c->be = parent->be;
    c->max_count = parent->max_count;
    c->poison = parent->poison;
    for (int i = 0; i < 3; i++) c->op_sum[i] = parent->op_sum[i];
    if (parent->nccl) c->nccl = nccl_group_create(c->mc, c->rank, c->size, c->be);   // collective, like the split
    return c;
}

int comm_rank(const Comm* c) { return c->rank; }
int comm_size(const Comm* c) { return c->size; }
int comm_local_rank(const Comm* world) {
    if (!world->is_world) fail("comm_local_rank: needs the world communicator");
    return world->local_rank;
}
int comm_local_size(const Comm* world) {
    if (!world->is_world) fail("comm_local_size: needs the world communicator");
    return world->local_size;
}
int comm_host_leader(const Comm* world) {
    if (!world->is_world) fail("comm_host_leader: needs the world communicator");
    return world->host_leader;
}

int comm_nccl_built(void) { return NCCL_BUILT; }

const char* comm_kind_name(CommKind k) { return k == COMM_NCCL ? "nccl" : k == COMM_MPI ? "mpi" : "auto"; }

CommKind comm_select(Comm* world, CommKind want) {
    if (!world->is_world) fail("comm_select: needs the world communicator");
    if (world->nccl) fail("comm_select: called twice");
    if (want == COMM_MPI) return COMM_MPI;
    if (!comm_nccl_built() || !staged(world)) {
        if (want == COMM_NCCL)
            fail("-comm nccl: %s", !comm_nccl_built() ? "this binary was built without NCCL" : "needs a GPU backend");
        return COMM_MPI;
    }
    // Every rank sees the same count, so every rank takes the same branch.
    if (world->poison) fail("GPT_COMM_POISON checks the MPI path only; unset it or use -comm mpi");
    int gpus = nccl_distinct_gpus(world->mc);
    if (gpus < world->size) {
        if (want == COMM_NCCL)
            fail("-comm nccl needs one GPU per rank (%d ranks share %d GPU%s); use -comm mpi to share a GPU", world->size,
                 gpus, gpus == 1 ? "" : "s");
        return COMM_MPI;
    }
    world->nccl = nccl_group_create(world->mc, world->rank, world->size, world->be);
    return COMM_NCCL;
}

// In place on host memory, chunked.
static void allreduce_host(Comm* c, void* buf, size_t n, DType dt) {
    size_t es = dtype_size(dt), k = nchunks(c, n);
    MPI_Request* reqs = op_requests(c, k);
    for (size_t i = 0, off = 0; i < k; i++, off += c->max_count)
        check(MPI_Iallreduce(MPI_IN_PLACE, (char*)buf + off * es, (int)piece(c, n, off), mpi_type(dt), sum_op(c, dt), c->mc,
                             &reqs[i]),
              "MPI_Iallreduce");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (all-reduce)", (Wait){.op = "all-reduce"});
}

void comm_allreduce_sum(Comm* c, void* buf, size_t n, DType dt) {
    size_t bytes = mul_bytes(n, dtype_size(dt), "comm_allreduce_sum");
    count(c, COLL_ALLREDUCE, bytes);
    if (n == 0) return;
    // NCCL even on one rank (a copy), so a one-GPU machine exercises every NCCL call.
    if (c->nccl) {
        nccl_allreduce(c->nccl, buf, n, dt, NULL);
        return;
    }
    if (c->size == 1) return;
    if (!staged(c)) {
        allreduce_host(c, buf, n, dt);
        return;
    }
    unsigned char* h = stage(c, bytes);
    be_download(c->be, h, buf, bytes);
    allreduce_host(c, h, n, dt);
    be_upload(c->be, buf, h, bytes);
}

void comm_allreduce_max_f32(Comm* c, float* buf, size_t n) {
    size_t bytes = mul_bytes(n, sizeof(float), "comm_allreduce_max_f32");
    count(c, COLL_ALLREDUCE, bytes);
    if (n == 0) return;
    if (c->nccl) {
        nccl_allreduce_max_f32(c->nccl, buf, n, NULL);
        return;
    }
    if (c->size == 1) return;
    float* h = staged(c) ? (float*)stage(c, bytes) : buf;
    if (h != buf) be_download(c->be, h, buf, bytes);
    size_t k = nchunks(c, n);
    MPI_Request* reqs = op_requests(c, k);
    for (size_t i = 0, off = 0; i < k; i++, off += c->max_count)
        check(MPI_Iallreduce(MPI_IN_PLACE, h + off, (int)piece(c, n, off), MPI_FLOAT, MPI_MAX, c->mc, &reqs[i]),
              "MPI_Iallreduce (max)");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (all-reduce, max)", (Wait){.op = "all-reduce (max)"});
    if (h != buf) be_upload(c->be, buf, h, bytes);
}

// ---------------------------------------------------------------------------------------------------
// Reduce-scatter and all-gather: started, then waited for (the synchronous calls are the two in a row).
// The MPI path always works on the in-flight slot's private host copy: it is what lets the caller's
// buffer be device memory (staging) or be poisoned (GPT_COMM_POISON) while MPI runs, and it keeps one
// code path for every case. The extra copy of a unit per collective is small next to the compute.

static CommHandle no_handle(void) { return (CommHandle){0, 0}; }

static InFlight* flight_take(Comm* c, Collective k, CommHandle* h) {
    for (int i = 0; i < COMM_MAX_IN_FLIGHT; i++) {
        InFlight* f = &c->flight[i];
        if (f->gen) continue;
        if (++c->next_gen == 0) c->next_gen = 1;   // 0 marks a free slot and an empty handle
        f->gen = c->next_gen;
        f->kind = k;
        f->nreq = 0;
        *h = (CommHandle){i, f->gen};
        if (c->nccl && !f->done) f->done = nccl_event_create();
        return f;
    }
    fail("%s: %d collectives already in flight on this group (COMM_MAX_IN_FLIGHT); wait for one first",
         collective_name(k), COMM_MAX_IN_FLIGHT);
}

static unsigned char* flight_host(InFlight* f, size_t bytes) { return grown(&f->host, &f->host_cap, bytes); }

static MPI_Request* flight_reqs(Comm* c, InFlight* f, size_t n) {
    size_t k = nchunks(c, n);
    if (k > INT_MAX) fail("%s: %zu elements is too many chunks", collective_name(f->kind), n);
    if ((int)k > f->reqs_cap) {
        free(f->reqs);
        f->reqs = xmalloc(k * sizeof(MPI_Request));
        f->reqs_cap = (int)k;
    }
    f->nreq = (int)k;
    return f->reqs;
}

// The caller's buffers are backend memory: device memory is staged, host memory copied.
static void from_user(Comm* c, void* host, const void* buf, size_t bytes) {
    if (staged(c)) be_download(c->be, host, buf, bytes);
    else if (bytes) memcpy(host, buf, bytes);
}
static void to_user(Comm* c, void* buf, const void* host, size_t bytes) {
    if (staged(c)) be_upload(c->be, buf, host, bytes);
    else if (bytes) memcpy(buf, host, bytes);
}

// GPT_COMM_POISON: scratch is `bytes` of host memory of the slot's own.
static void poison(Comm* c, void* buf, size_t bytes, unsigned char* scratch) {
    memset(scratch, 0xff, bytes);
    to_user(c, buf, scratch, bytes);
}
// expect NULL: the poison.
static void check_untouched(Comm* c, const InFlight* f, const void* buf, const unsigned char* expect, size_t bytes,
                            unsigned char* scratch) {
    from_user(c, scratch, buf, bytes);
    for (size_t i = 0; i < bytes; i++)
        if (scratch[i] != (expect ? expect[i] : 0xff))
            fail("GPT_COMM_POISON: a buffer of a %s in flight (%zu elements of %s per rank) was written before "
                 "comm_wait (byte %zu)", collective_name(f->kind), f->n, dtype_name(f->dt), i);
}

// Reduce-scatter slot host layout: [input copy (total) | chunk-packed input (total, chunked only) |
// result (slot) | poison scratch (total, poison only)]. A chunk takes the same piece of every rank's slot,
// packed contiguously, since MPI_Ireduce_scatter_block wants the pieces back to back.
static void rs_post(Comm* c, InFlight* f, int chunked) {
    size_t es = dtype_size(f->dt), n = f->n, total = (size_t)c->size * n * es;
    unsigned char* src = f->host + (chunked ? total : 0);
    unsigned char* result = f->host + (chunked ? 2 * total : total);
    MPI_Request* reqs = flight_reqs(c, f, n);
    for (int i = 0; i < f->nreq; i++) {
        size_t off = (size_t)i * c->max_count, m = piece(c, n, off);
        unsigned char* packed = src + (size_t)c->size * off * es;
        for (int k = 0; chunked && k < c->size; k++)
            memcpy(packed + (size_t)k * m * es, f->host + ((size_t)k * n + off) * es, m * es);
        check(MPI_Ireduce_scatter_block(packed, result + off * es, (int)m, mpi_type(f->dt), sum_op(c, f->dt), c->mc,
                                        &reqs[i]),
              "MPI_Ireduce_scatter_block");
    }
}

CommHandle comm_reduce_scatter_sum_start(Comm* c, void* out, const void* in, size_t n, DType dt) {
    size_t es = dtype_size(dt);
    size_t slot = mul_bytes(n, es, "comm_reduce_scatter_sum");
    size_t total = mul_bytes(slot, (size_t)c->size, "comm_reduce_scatter_sum");
    count(c, COLL_REDUCE_SCATTER, total);
    const char* lo = in;
    const char* o = out;
    int in_place = o == lo + (size_t)c->rank * slot;
    if (!in_place && o < lo + total && lo < o + slot)
        fail("comm_reduce_scatter_sum: out overlaps in but is not slot %d (in place)", c->rank);
    CommHandle h = no_handle();
    if (n == 0) return h;
    if (c->nccl) {   // NCCL even on one rank (a copy), so a one-GPU machine exercises every NCCL call
        InFlight* f = flight_take(c, COLL_REDUCE_SCATTER, &h);
        nccl_reduce_scatter(c->nccl, out, in, n, dt, f->done);
        return h;
    }
    if (c->size == 1) {
        if (!in_place) {
            if (staged(c)) be_copy(c->be, out, in, slot);
            else memcpy(out, in, slot);
        }
        return h;
    }
    InFlight* f = flight_take(c, COLL_REDUCE_SCATTER, &h);
    f->out = out, f->in = in, f->n = n, f->dt = dt;
    int chunked = n > c->max_count;
    size_t result = (chunked ? 2 : 1) * total;
    unsigned char* host = flight_host(f, result + slot + (c->poison ? total : 0));
    from_user(c, host, in, total);
    if (c->poison) poison(c, out, slot, host + result + slot);
    rs_post(c, f, chunked);
    return h;
}

// Poison mode: the input must be as it was at start, except the slot the result goes to (in place).
static void rs_finish(Comm* c, InFlight* f) {
    size_t es = dtype_size(f->dt), slot = f->n * es, total = (size_t)c->size * slot;
    unsigned char* result = f->host + (f->n > c->max_count ? 2 : 1) * total;
    if (c->poison) {
        unsigned char* scratch = result + slot;
        for (int k = 0; k < c->size; k++) {
            const char* s = (const char*)f->in + (size_t)k * slot;
            if (s != f->out) check_untouched(c, f, s, f->host + (size_t)k * slot, slot, scratch);
        }
        check_untouched(c, f, f->out, NULL, slot, scratch);
    }
    to_user(c, f->out, result, slot);
}

void comm_reduce_scatter_sum(Comm* c, void* out, const void* in, size_t n, DType dt) {
    CommHandle h = comm_reduce_scatter_sum_start(c, out, in, n, dt);
    comm_wait(c, &h);
}

// All-gather slot host layout: [the gathered buffer (total) | poison scratch (total, poison only)]. In
// place; a chunk takes the same piece of every slot, described by a datatype whose extent is one slot
// (freeing it at once is fine: MPI keeps it alive for the pending operation).
static void ag_post(Comm* c, InFlight* f) {
    size_t es = dtype_size(f->dt), n = f->n;
    MPI_Request* reqs = flight_reqs(c, f, n);
    if (f->nreq == 1) {
        check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f->host, (int)n, mpi_type(f->dt), c->mc, &reqs[0]),
              "MPI_Iallgather");
        return;
    }
    for (int i = 0; i < f->nreq; i++) {
        size_t off = (size_t)i * c->max_count, m = piece(c, n, off);
        MPI_Datatype piece, strided;
        check(MPI_Type_contiguous((int)m, mpi_type(f->dt), &piece), "MPI_Type_contiguous");
        check(MPI_Type_create_resized(piece, 0, (MPI_Aint)(n * es), &strided), "MPI_Type_create_resized");
        check(MPI_Type_commit(&strided), "MPI_Type_commit");
        check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f->host + off * es, 1, strided, c->mc, &reqs[i]),
              "MPI_Iallgather");
        check(MPI_Type_free(&strided), "MPI_Type_free");
        check(MPI_Type_free(&piece), "MPI_Type_free");
    }
}

CommHandle comm_allgather_start(Comm* c, void* buf, size_t n, DType dt) {
    size_t slot = mul_bytes(n, dtype_size(dt), "comm_allgather");
    size_t total = mul_bytes(slot, (size_t)c->size, "comm_allgather");
    count(c, COLL_ALLGATHER, total);
    CommHandle h = no_handle();
    if (n == 0) return h;
    if (c->nccl) {
        InFlight* f = flight_take(c, COLL_ALLGATHER, &h);
        nccl_allgather(c->nccl, buf, n, dt, f->done);
        return h;
    }
    if (c->size == 1) return h;
    InFlight* f = flight_take(c, COLL_ALLGATHER, &h);
    f->out = buf, f->in = buf, f->n = n, f->dt = dt;
    size_t mine = (size_t)c->rank * slot;
    unsigned char* host = flight_host(f, mul_bytes(total, c->poison ? 2 : 1, "comm_allgather"));
    from_user(c, host + mine, (const char*)buf + mine, slot);
    for (int k = 0; c->poison && k < c->size; k++)
        if (k != c->rank) poison(c, (char*)buf + (size_t)k * slot, slot, host + total);
    ag_post(c, f);
    return h;
}

// Poison mode: our own slot as it was, the others still poisoned.
static void ag_finish(Comm* c, InFlight* f) {
    size_t slot = f->n * dtype_size(f->dt), total = (size_t)c->size * slot;
    for (int k = 0; c->poison && k < c->size; k++) {
        const unsigned char* expect = k == c->rank ? f->host + (size_t)k * slot : NULL;
        check_untouched(c, f, (char*)f->out + (size_t)k * slot, expect, slot, f->host + total);
    }
    to_user(c, f->out, f->host, total);
}

void comm_allgather(Comm* c, void* buf, size_t n, DType dt) {
    CommHandle h = comm_allgather_start(c, buf, n, dt);
    comm_wait(c, &h);
}

void comm_wait(Comm* c, CommHandle* h) {
    if (!h->gen) return;
    if (h->slot < 0 || h->slot >= COMM_MAX_IN_FLIGHT || c->flight[h->slot].gen != h->gen)
        fail("internal: comm_wait on a handle that is not in flight on this group");
    InFlight* f = &c->flight[h->slot];
    if (c->nccl) {
        nccl_wait(c->nccl, f->done);
    } else {
        wait_requests(c, f->nreq, f->reqs, NULL, "MPI_Waitall",
                      (Wait){.op = f->kind == COLL_REDUCE_SCATTER ? "reduce-scatter" : "all-gather"});
        if (f->kind == COLL_REDUCE_SCATTER) rs_finish(c, f);
        else ag_finish(c, f);
    }
    f->gen = 0;
    h->gen = 0;
}

static void bcast_host(Comm* c, void* buf, size_t bytes, int root) {
    if (bytes == 0) return;
    size_t k = nchunks(c, bytes);
    MPI_Request* reqs = op_requests(c, k);
    for (size_t i = 0, off = 0; i < k; i++, off += c->max_count)
        check(MPI_Ibcast((char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, root, c->mc, &reqs[i]), "MPI_Ibcast");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (broadcast)",
                  (Wait){.op = c->rank == root ? "broadcast" : "broadcast from", .peer = {root}, .npeers = c->rank != root});
}

void comm_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) fail("comm_broadcast: root %d outside a group of %d", root, c->size);
    if (c->rank == root) count(c, COLL_BROADCAST, bytes);
    if (bytes == 0) return;
    if (c->nccl) {
        nccl_broadcast(c->nccl, buf, bytes, root, NULL);
        return;
    }
    if (c->size == 1) return;
    if (!staged(c)) {
        bcast_host(c, buf, bytes, root);
        return;
    }
    unsigned char* h = stage(c, bytes);
    if (c->rank == root) be_download(c->be, h, buf, bytes);
    bcast_host(c, h, bytes, root);
    if (c->rank != root) be_upload(c->be, buf, h, bytes);
}

static void check_peer(const Comm* c, int peer, const char* what) {
    if (peer < 0 || peer >= c->size || peer == c->rank)
        fail("%s: peer %d is not another rank of this group (rank %d of %d)", what, peer, c->rank, c->size);
}

// Room for an exchange of `nreq` requests.
static void exchange_room(Comm* c, size_t nreq) {
    if (nreq <= c->xreqs_cap) return;
    free(c->xreqs), free(c->xstats);
    c->xreqs = xmalloc(nreq * sizeof(MPI_Request));
    c->xstats = xmalloc(nreq * sizeof(MPI_Status));
    c->xreqs_cap = nreq;
}

// Checks that each receive got the message it names: its tag and its size, chunk by chunk.
static void check_received(const Comm* c, const CommMessage* m, const MPI_Status* st, size_t k) {
    for (size_t i = 0; i < k; i++) {
        size_t off = i * c->max_count, want = piece(c, m->bytes, off);
        int got = 0;
        check(MPI_Get_count(&st[i], MPI_BYTE, &got), "MPI_Get_count");
        if (st[i].MPI_TAG != m->tag)
            fail("comm_exchange: from rank %d came message %d where message %d was expected: the two ends list "
                 "their messages in different orders", m->peer, st[i].MPI_TAG, m->tag);
        if ((size_t)got != want)
            fail("comm_exchange: expected %zu bytes from rank %d (message %d), got %d", want, m->peer, m->tag, got);
    }
}

// Two messages of one exchange on overlapping memory would race (a receive writing what a send reads).
static void check_disjoint(const CommMessage* msgs, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            const char *a = msgs[i].buf, *b = msgs[j].buf;
            if (msgs[i].bytes && msgs[j].bytes && a < b + msgs[j].bytes && b < a + msgs[i].bytes)
                fail("comm_exchange: messages %d and %d (tags %d and %d) share memory", j, i, msgs[j].tag, msgs[i].tag);
        }
}

void comm_exchange_finish(Comm* c) {
    if (c->nccl) nccl_exchange_finish(c->nccl);
    if (!c->xpending) return;
    wait_requests(c, c->xpending, c->xreqs, NULL, "MPI_Waitall (sends)", c->xsent);
    c->xpending = 0;
}

// What an exchange waits in: its peers (the first four distinct ones), and whether it sends, receives or both.
static Wait exchange_wait(const CommMessage* msgs, int n) {
    int sends = 0, receives = 0;
    Wait wt = {0};
    for (int i = 0; i < n; i++) {
        sends += msgs[i].send, receives += !msgs[i].send;
        int seen = 0;
        for (int j = 0; j < wt.npeers; j++) seen |= wt.peer[j] == msgs[i].peer;
        if (!seen && wt.npeers < 4) wt.peer[wt.npeers++] = msgs[i].peer;
    }
    wt.op = !receives ? "sends to" : !sends ? "receives from" : "exchange with";
    return wt;
}

void comm_exchange(Comm* c, const CommMessage* msgs, int n) {
    check_disjoint(msgs, n);
    size_t nreq = 0, staged_bytes = 0;
    int receives = 0;
    for (int i = 0; i < n; i++) {
        check_peer(c, msgs[i].peer, msgs[i].send ? "comm_exchange (send)" : "comm_exchange (receive)");
        if (msgs[i].tag < 0 || msgs[i].tag > 32767) fail("comm_exchange: tag %d outside 0..32767", msgs[i].tag);
        if (msgs[i].send) count(c, COLL_SEND, msgs[i].bytes);
        receives += !msgs[i].send;
        nreq += nchunks(c, msgs[i].bytes);
        staged_bytes += msgs[i].bytes;
    }
    if (n == 0) return;
    if (nreq > INT_MAX) fail("comm_exchange: %zu pieces is too many for one MPI_Waitall", nreq);
    comm_exchange_finish(c);   // in order; and the staging and the request array are free again
    if (c->nccl) {
        nccl_exchange(c->nccl, msgs, n, receives > 0);
        return;
    }
    exchange_room(c, nreq);
    unsigned char* host = staged(c) ? grown(&c->xstage, &c->xstage_cap, staged_bytes) : NULL;
    size_t r = 0, off_staged = 0;
    for (int i = 0; i < n; i++) {
        const CommMessage* m = &msgs[i];
        unsigned char* h = host ? host + off_staged : m->buf;
        if (host && m->send && m->bytes) be_download(c->be, h, m->buf, m->bytes);
        off_staged += m->bytes;
        // MPI keeps the messages from one rank to another in order (per communicator), chunks included.
        for (size_t k = 0, nk = nchunks(c, m->bytes); k < nk; k++, r++) {
            size_t off = k * c->max_count, len = piece(c, m->bytes, off);
            if (m->send) check(MPI_Issend(h + off, (int)len, MPI_BYTE, m->peer, m->tag, c->mc, &c->xreqs[r]), "MPI_Issend");
            else check(MPI_Irecv(h + off, (int)len, MPI_BYTE, m->peer, MPI_ANY_TAG, c->mc, &c->xreqs[r]), "MPI_Irecv");
        }
    }
    if (!receives) {
        c->xpending = (int)nreq;
        c->xsent = exchange_wait(msgs, n);   // msgs may be gone when comm_exchange_finish waits
        return;
    }
    wait_requests(c, (int)nreq, c->xreqs, c->xstats, "MPI_Waitall (exchange)", exchange_wait(msgs, n));
    r = 0, off_staged = 0;
    for (int i = 0; i < n; i++) {
        const CommMessage* m = &msgs[i];
        size_t k = nchunks(c, m->bytes);
        if (!m->send) check_received(c, m, &c->xstats[r], k);
        if (host && !m->send && m->bytes) be_upload(c->be, m->buf, host + off_staged, m->bytes);
        r += k, off_staged += m->bytes;
    }
}

void comm_broadcast_host(Comm* c, void* buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) fail("comm_broadcast_host: root %d outside a group of %d", root, c->size);
    if (c->size > 1) bcast_host(c, buf, bytes, root);
}

void comm_send_host(Comm* c, const void* buf, size_t bytes, int peer, int tag) {
    check_peer(c, peer, "comm_send_host");
    size_t k = nchunks(c, bytes);
    MPI_Request* reqs = op_requests(c, k);
    // MPI keeps the chunks in order (messages between two ranks on one communicator do not overtake).
    for (size_t off = 0, i = 0; i < k; i++, off += c->max_count)
        check(MPI_Isend((const char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, peer, tag, c->mc, &reqs[i]), "MPI_Isend");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (send)", (Wait){.op = "send to", .peer = {peer}, .npeers = 1});
}

void comm_recv_host(Comm* c, void* buf, size_t bytes, int peer, int tag) {
    check_peer(c, peer, "comm_recv_host");
    size_t k = nchunks(c, bytes);
    MPI_Request* reqs = op_requests(c, k);
    for (size_t off = 0, i = 0; i < k; i++, off += c->max_count)
        check(MPI_Irecv((char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, peer, tag, c->mc, &reqs[i]), "MPI_Irecv");
    wait_requests(c, (int)k, reqs, c->ostats, "MPI_Waitall (receive)", (Wait){.op = "receive from", .peer = {peer}, .npeers = 1});
    for (size_t off = 0, i = 0; i < k; i++, off += c->max_count) {
        size_t m = piece(c, bytes, off);
        int got = 0;
        check(MPI_Get_count(&c->ostats[i], MPI_BYTE, &got), "MPI_Get_count");
        if ((size_t)got != m) fail("comm_recv_host: expected %zu bytes from rank %d (tag %d), got %d", m, peer, tag, got);
    }
}

// Orders host-side work (files written before a DONE marker); device work is ordered by the stream.
void comm_barrier(Comm* c) {
    MPI_Request req;
    check(MPI_Ibarrier(c->mc, &req), "MPI_Ibarrier");
    wait_requests(c, 1, &req, NULL, "MPI_Wait (barrier)", (Wait){.op = "barrier"});
}

static void allreduce_doubles(Comm* c, double* xs, int n, MPI_Op op, const char* name) {
    if (n <= 0) return;
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, xs, n, MPI_DOUBLE, op, c->mc, &req), "MPI_Iallreduce");
    wait_requests(c, 1, &req, NULL, "MPI_Wait (all-reduce)", (Wait){.op = name});
}
void comm_allreduce_host_sum(Comm* c, double* xs, int n) { allreduce_doubles(c, xs, n, MPI_SUM, "all-reduce"); }
void comm_allreduce_host_max(Comm* c, double* xs, int n) { allreduce_doubles(c, xs, n, MPI_MAX, "all-reduce (max)"); }

uint64_t comm_bytes_sent(const Comm* c, Collective k) { return (unsigned)k < NUM_COLLECTIVES ? c->bytes[k] : 0; }
void comm_reset_bytes(Comm* c) { memset(c->bytes, 0, sizeof c->bytes); }

const char* collective_name(Collective k) {
    static const char* const names[NUM_COLLECTIVES] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                       "send"};
    return (unsigned)k < NUM_COLLECTIVES ? names[k] : "?";
}

static void release(Comm* c) {
    comm_exchange_finish(c);
    for (int i = 0; i < COMM_MAX_IN_FLIGHT; i++) {
        InFlight* f = &c->flight[i];
        if (f->gen) fail("internal: a %s is still in flight when its group is freed", collective_name(f->kind));
        free(f->host);
        free(f->reqs);
        nccl_event_destroy(f->done);
    }
    nccl_group_destroy(c->nccl);
    free(c->world_ranks);
    free(c->oreqs), free(c->ostats);
    free(c->xstage);
    free(c->xreqs), free(c->xstats);
    free(c->stage);
    check(MPI_Comm_free(&c->mc), "MPI_Comm_free");
    free(c);
}

void comm_free(Comm* c) {
    if (!c) return;
    if (c->is_world) fail("comm_free: the world is released by comm_finalize");
    release(c);
}

void comm_finalize(Comm* world) {
    if (!world) return;
    if (!world->is_world) fail("comm_finalize: needs the world communicator");
    check(MPI_Op_free(&world->op_sum[DT_BF16]), "MPI_Op_free");
    check(MPI_Op_free(&world->op_sum[DT_FP16]), "MPI_Op_free");
    // MPI_Finalize waits for every rank without being watched: the ranks meet in a watched barrier first.
    if (world->wd->timeout > 0.0) {
        comm_watchdog_phase(world, 0, "the end of the run");
        comm_barrier(world);
    }
    Watchdog* w = world->wd;
    release(world);
    watchdog_free(w);
    check(MPI_Finalize(), "MPI_Finalize");
}
