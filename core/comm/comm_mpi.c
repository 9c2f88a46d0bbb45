// comm_mpi.c: comm.h over MPI (OpenMPI).
//
// Device buffers (a GPU backend is attached) are staged through a host buffer: download, MPI on the host,
// upload. That is correct everywhere, including several ranks on one GPU, but not fast. Reduce-scatter and
// all-gather (comm.h's start/wait) use MPI's nonblocking collectives on a private host copy per collective
// in flight, for host and device buffers alike; the synchronous calls are start + wait, so both give the
// same bits (MPI_Ireduce_scatter_block may add in another order than the blocking call would: with 3+
// ranks, sums differ in their last bits from builds before start/wait existed). In a GPU build with
// NCCL, comm_select can hand the bulk collectives (all-reduce, reduce-scatter, all-gather, broadcast,
// all-to-all) of a communicator and the groups split from it to NCCL (core/comm/comm_nccl.c); this file still
// checks their arguments and counts their bytes, so the counters are the same whichever library moves the data.
// The pipeline's exchanges go to NCCL too (ncclSend/ncclRecv in one group) or stay here as MPI_Issend and
// MPI_Irecv: synchronous sends, so that the CPU tests run under NCCL's rendezvous semantics and a schedule
// that would deadlock a GPU deadlocks here too (and the tests' time limits end it). A started exchange
// (comm_exchange_start) takes an in-flight slot like the collectives, and posts on the caller's host buffers
// unless they are device memory or poison mode needs a copy.
// Every operation, the blocking ones of comm.h included, is started nonblocking and completed by
// wait_requests, which the hang watchdog (core/comm/watchdog.c) watches.
//
// bf16/fp16 sums use our own MPI_Op (fp32 add, one round-to-nearest-even per pairwise reduction), since
// MPI has no 16-bit float types. MPI counts are ints, so every transfer is split into chunks of at most
// max_count elements (INT_MAX; the tests lower it with GPT_COMM_MAX_COUNT to exercise the split).

#include "core/comm/comm.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>

#include "base/common.h"
#include "core/comm/comm_nccl.h"
#include "core/comm/launcher.h"
#include "core/comm/mpi_check.h"
#include "core/comm/watchdog.h"
#include "kernels/dtype.h"

// A reduce-scatter, all-gather or exchange started and not yet waited for (comm.h's CommHandle names one). The
// host copy, the requests and the event stay with the slot for its next use.
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
    MPI_Status* stats;     // as many: an exchange's receive checks read them
    int nreq, reqs_cap;
    NcclEvent* done;       // NCCL: recorded on the comm stream when the collective has finished
    CommMessage* msgs;     // an exchange's messages (kind COLL_SEND)
    int nmsgs, msgs_cap;
    WdWait xwait;          // what the exchange waits in, for the watchdog
} InFlight;

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
    WdWait xsent;            // what they wait in, for the watchdog
    uint64_t bytes[NUM_COLLECTIVES];
    uint64_t link_bytes[NUM_LINK_CLASSES];
    int host_leader;         // this process's host, as the world rank of its lowest rank (every group)
    long long* hosts;        // [size]: each rank's host_leader, for the link classes (find_hosts)
    int one_host;            // every rank of the group runs on one host
    NcclGroup* nccl;         // non-NULL: the bulk collectives on device buffers go to NCCL
    InFlight flight[COMM_MAX_IN_FLIGHT];
    uint32_t next_gen;
    int poison;              // GPT_COMM_POISON (comm.h)
};

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

// The ring-algorithm traffic of comm.h's header, rounded down per call when S does not divide evenly; a
// collective's bytes in the group's link class.
static void count(Comm* c, Collective k, size_t bytes) {
    uint64_t n = (uint64_t)c->size, s = bytes, sent;
    if (n <= 1) return;
    switch (k) {
    case COLL_ALLREDUCE: sent = 2 * (n - 1) * s / n; break;
    case COLL_REDUCE_SCATTER:
    case COLL_ALLGATHER:
    case COLL_ALLTOALL: sent = (n - 1) * s / n; break;
    default: sent = s; break;
    }
    c->bytes[k] += sent;
    c->link_bytes[c->one_host ? LINK_INTRA_HOST : LINK_CROSS_HOST] += sent;
}

// A message of an exchange: in the link class of the peer's host.
static void count_send(Comm* c, int peer, size_t bytes) {
    c->bytes[COLL_SEND] += bytes;
    c->link_bytes[c->hosts[peer] == c->host_leader ? LINK_INTRA_HOST : LINK_CROSS_HOST] += bytes;
}

// MPI_Waitall of c's requests, watched (watchdog.h). wt: what the rank waits in (its op and peers; the group
// is filled here).
static void wait_requests(Comm* c, int n, MPI_Request* reqs, MPI_Status* stats, const char* what, WdWait wt) {
    wt.group_size = c->size;
    wt.world_ranks = c->world_ranks;
    watchdog_waitall(c->wd, n, reqs, stats, what, wt);
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

void comm_watchdog_start(Comm* world, double timeout_s) {
    if (!world->is_world) fail("comm_watchdog_start: needs the world communicator");
    if (!(timeout_s >= 0.0 && timeout_s <= 1e9)) fail("comm_watchdog_start: timeout %g s outside 0..1e9", timeout_s);
    watchdog_set_timeout(world->wd, world->size > 1 ? timeout_s : 0.0);
}

static void set_phase(Watchdog* w, int long_phase, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    watchdog_phase(w, long_phase, fmt, ap);
    va_end(ap);
}

void comm_watchdog_phase(Comm* world, int long_phase, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    watchdog_phase(world->wd, long_phase, fmt, ap);
    va_end(ap);
}

// This host's ranks (MPI_COMM_TYPE_SHARED). The split has no nonblocking form: a watched barrier first.
static void find_host(Comm* world) {
    comm_barrier(world);
    MPI_Comm node;
    mpi_check(MPI_Comm_split_type(world->mc, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    mpi_check(MPI_Comm_rank(node, &world->local_rank), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(node, &world->local_size), "MPI_Comm_size");
    // The host's lowest world rank is its node rank 0 (the split's key): a translation, no message.
    MPI_Group g, wg;
    int first = 0;
    mpi_check(MPI_Comm_group(node, &g), "MPI_Comm_group");
    mpi_check(MPI_Comm_group(world->mc, &wg), "MPI_Comm_group");
    mpi_check(MPI_Group_translate_ranks(g, 1, &first, wg, &world->host_leader), "MPI_Group_translate_ranks");
    mpi_check(MPI_Group_free(&g), "MPI_Group_free");
    mpi_check(MPI_Group_free(&wg), "MPI_Group_free");
    mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
}

// Every rank's host (comm.h's link classes): one all-reduce of the group's host leaders.
static void find_hosts(Comm* c) {
    c->hosts = xmalloc((size_t)c->size * sizeof(long long));
    for (int r = 0; r < c->size; r++) c->hosts[r] = r == c->rank ? c->host_leader : -1;
    comm_allreduce_host_max_i64(c, c->hosts, c->size);
    c->one_host = 1;
    for (int r = 0; r < c->size; r++) c->one_host &= c->hosts[r] == c->host_leader;
}

static Comm* comm_new(MPI_Comm mc, const char* what) {
    Comm* c = xcalloc(1, sizeof(Comm));
    c->mc = mc;
    mpi_check(MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN), what);
    mpi_check(MPI_Comm_rank(mc, &c->rank), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(mc, &c->size), "MPI_Comm_size");
    c->max_count = INT_MAX;
    return c;
}

Comm* comm_init_world(int* argc, char*** argv) {
    // Started without a launcher, OpenMPI makes this process a singleton and starts a daemon beside it, which
    // only MPI_Comm_spawn (never called here) needs; and its default messaging layer (UCX) probes the network
    // devices, though a world of one sends nothing over them. Those two are most of a one-rank run's start-up:
    // the singleton is isolated and messages with ob1 (its self transport). Settings in the environment win.
    if (!launcher_ranks())
        if (setenv("OMPI_MCA_ess_singleton_isolated", "1", 0) != 0 || setenv("OMPI_MCA_pml", "ob1", 0) != 0)
            fail("setenv of OpenMPI's singleton settings: %s", strerror(errno));
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_FUNNELED) fail("MPI_Init_thread: this MPI does not provide MPI_THREAD_FUNNELED");
    // Errors on MPI_COMM_WORLD itself (the dups below, op creation) return too, so they get our message.
    mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    // The watchdog first: every wait from here to MPI_Finalize is watched, start-up included, where a rank
    // that stops (or never gets this far) would otherwise leave the others waiting with no word. Until the
    // program knows its -wd, the default's, and start-up is long: a rank may read a large checkpoint alone.
    Watchdog* wd = watchdog_create(MPI_COMM_WORLD);
    int world_size;
    mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size");
    watchdog_set_timeout(wd, world_size > 1 ? COMM_WATCHDOG_DEFAULT : 0.0);
    set_phase(wd, 1, "start-up");
    MPI_Comm mc;   // isolates our traffic from any library's
    MPI_Request req;
    mpi_check(MPI_Comm_idup(MPI_COMM_WORLD, &mc, &req), "MPI_Comm_idup");
    watchdog_waitall(wd, 1, &req, NULL, "MPI_Wait (MPI_Comm_idup)", (WdWait){.op = "communicator set-up", .group_size = world_size});
    Comm* c = comm_new(mc, "MPI_Comm_set_errhandler");
    c->is_world = 1;
    c->wd = wd;
    c->op_sum[DT_FP32] = MPI_SUM;
    mpi_check(MPI_Op_create(sum_bf16, 1, &c->op_sum[DT_BF16]), "MPI_Op_create");
    mpi_check(MPI_Op_create(sum_fp16, 1, &c->op_sum[DT_FP16]), "MPI_Op_create");
    find_host(c);
    find_hosts(c);

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
    comm_barrier(parent);   // MPI_Comm_split blocks unwatched: the ranks meet in a watched wait first
    MPI_Comm mc;
    mpi_check(MPI_Comm_split(parent->mc, color == COMM_NO_GROUP ? MPI_UNDEFINED : color, key, &mc), "MPI_Comm_split");
    if (color == COMM_NO_GROUP) return NULL;   // MPI_COMM_NULL
    Comm* c = comm_new(mc, "MPI_Comm_set_errhandler");
    c->wd = parent->wd;
    c->world_ranks = xmalloc((size_t)c->size * sizeof(int));   // for the watchdog's lines
    watchdog_world_ranks(c->wd, c->mc, c->size, c->world_ranks);
    c->be = parent->be;
    c->host_leader = parent->host_leader;
    find_hosts(c);
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
    comm_barrier(world);   // NCCL's set-up blocks unwatched (blocking MPI calls, then NCCL's): the ranks meet first
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
        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, (char*)buf + off * es, (int)piece(c, n, off), mpi_type(dt), sum_op(c, dt), c->mc,
                                 &reqs[i]),
                  "MPI_Iallreduce");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (all-reduce)", (WdWait){.op = "all-reduce"});
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
        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, h + off, (int)piece(c, n, off), MPI_FLOAT, MPI_MAX, c->mc, &reqs[i]),
                  "MPI_Iallreduce (max)");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (all-reduce, max)", (WdWait){.op = "all-reduce (max)"});
    if (h != buf) be_upload(c->be, buf, h, bytes);
}

// Host memory. Chunked like ag_post: a chunk takes the same piece of every block, described by a datatype
// whose extent is one block, so that MPI's j-th element of it is block j's piece.
static void alltoall_host(Comm* c, void* out, const void* in, size_t n, DType dt) {
    size_t es = dtype_size(dt), k = nchunks(c, n);
    MPI_Request* reqs = op_requests(c, k);
    if (k == 1) {
        mpi_check(MPI_Ialltoall(in, (int)n, mpi_type(dt), out, (int)n, mpi_type(dt), c->mc, &reqs[0]), "MPI_Ialltoall");
    }
    for (size_t i = 0, off = 0; k > 1 && i < k; i++, off += c->max_count) {
        MPI_Datatype part, strided;
        mpi_check(MPI_Type_contiguous((int)piece(c, n, off), mpi_type(dt), &part), "MPI_Type_contiguous");
        mpi_check(MPI_Type_create_resized(part, 0, (MPI_Aint)(n * es), &strided), "MPI_Type_create_resized");
        mpi_check(MPI_Type_commit(&strided), "MPI_Type_commit");
        mpi_check(MPI_Ialltoall((const char*)in + off * es, 1, strided, (char*)out + off * es, 1, strided, c->mc, &reqs[i]),
                  "MPI_Ialltoall");
        mpi_check(MPI_Type_free(&strided), "MPI_Type_free");
        mpi_check(MPI_Type_free(&part), "MPI_Type_free");
    }
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (all-to-all)", (WdWait){.op = "all-to-all"});
}

void comm_alltoall(Comm* c, void* out, const void* in, size_t n, DType dt) {
    size_t block = mul_bytes(n, dtype_size(dt), "comm_alltoall");
    size_t total = mul_bytes(block, (size_t)c->size, "comm_alltoall");
    const char *o = out, *i = in;
    if (total && o < i + total && i < o + total) fail("comm_alltoall: out overlaps in (the all-to-all is out of place)");
    count(c, COLL_ALLTOALL, total);
    if (n == 0) return;
    if (c->nccl) {   // NCCL even on one rank (a copy), so a one-GPU machine exercises every NCCL call
        nccl_alltoall(c->nccl, out, in, n, dt, NULL);
        return;
    }
    if (c->size == 1) {
        if (staged(c)) be_copy(c->be, out, in, block);
        else memcpy(out, in, block);
        return;
    }
    if (!staged(c)) {
        alltoall_host(c, out, in, n, dt);
        return;
    }
    unsigned char* h = stage(c, mul_bytes(total, 2, "comm_alltoall"));
    be_download(c->be, h, in, total);
    alltoall_host(c, h + total, h, n, dt);
    be_upload(c->be, out, h + total, total);
}

// ---------------------------------------------------------------------------------------------------
// Reduce-scatter and all-gather: started, then waited for (the synchronous calls are the two in a row).
// The MPI path always works on the in-flight slot's private host copy: it is what lets the caller's
// buffer be device memory (staging) or be poisoned (GPT_COMM_POISON) while MPI runs, and it keeps one
// code path for every case. The extra copy of a unit per collective is small next to the compute.

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

// Room for k requests (and their statuses) in the slot.
static MPI_Request* flight_room(InFlight* f, size_t k) {
    if (k > INT_MAX) fail("%s: %zu MPI requests are too many for one MPI_Waitall", collective_name(f->kind), k);
    if ((int)k > f->reqs_cap) {
        free(f->reqs), free(f->stats);
        f->reqs = xmalloc(k * sizeof(MPI_Request));
        f->stats = xmalloc(k * sizeof(MPI_Status));
        f->reqs_cap = (int)k;
    }
    f->nreq = (int)k;
    return f->reqs;
}

static MPI_Request* flight_reqs(Comm* c, InFlight* f, size_t n) { return flight_room(f, nchunks(c, n)); }

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
        mpi_check(MPI_Ireduce_scatter_block(packed, result + off * es, (int)m, mpi_type(f->dt), sum_op(c, f->dt), c->mc,
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
    CommHandle h = comm_no_handle();
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
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f->host, (int)n, mpi_type(f->dt), c->mc, &reqs[0]),
                  "MPI_Iallgather");
        return;
    }
    for (int i = 0; i < f->nreq; i++) {
        size_t off = (size_t)i * c->max_count, m = piece(c, n, off);
        MPI_Datatype piece, strided;
        mpi_check(MPI_Type_contiguous((int)m, mpi_type(f->dt), &piece), "MPI_Type_contiguous");
        mpi_check(MPI_Type_create_resized(piece, 0, (MPI_Aint)(n * es), &strided), "MPI_Type_create_resized");
        mpi_check(MPI_Type_commit(&strided), "MPI_Type_commit");
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f->host + off * es, 1, strided, c->mc, &reqs[i]),
                  "MPI_Iallgather");
        mpi_check(MPI_Type_free(&strided), "MPI_Type_free");
        mpi_check(MPI_Type_free(&piece), "MPI_Type_free");
    }
}

CommHandle comm_allgather_start(Comm* c, void* buf, size_t n, DType dt) {
    size_t slot = mul_bytes(n, dtype_size(dt), "comm_allgather");
    size_t total = mul_bytes(slot, (size_t)c->size, "comm_allgather");
    count(c, COLL_ALLGATHER, total);
    CommHandle h = comm_no_handle();
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

static void exchange_done(Comm* c, InFlight* f);

void comm_wait(Comm* c, CommHandle* h) {
    if (!h->gen) return;
    if (h->slot < 0 || h->slot >= COMM_MAX_IN_FLIGHT || c->flight[h->slot].gen != h->gen)
        fail("internal: comm_wait on a handle that is not in flight on this group");
    InFlight* f = &c->flight[h->slot];
    if (c->nccl) {
        nccl_wait(c->nccl, f->done);
    } else if (f->kind == COLL_SEND) {
        wait_requests(c, f->nreq, f->reqs, f->stats, "MPI_Waitall (exchange)", f->xwait);
        exchange_done(c, f);
    } else {
        wait_requests(c, f->nreq, f->reqs, NULL, "MPI_Waitall",
                      (WdWait){.op = f->kind == COLL_REDUCE_SCATTER ? "reduce-scatter" : "all-gather"});
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
        mpi_check(MPI_Ibcast((char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, root, c->mc, &reqs[i]), "MPI_Ibcast");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (broadcast)",
                  (WdWait){.op = c->rank == root ? "broadcast" : "broadcast from", .peer = {root}, .npeers = c->rank != root});
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
        mpi_check(MPI_Get_count(&st[i], MPI_BYTE, &got), "MPI_Get_count");
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
static WdWait exchange_wait(const CommMessage* msgs, int n) {
    int sends = 0, receives = 0;
    WdWait wt = {0};
    for (int i = 0; i < n; i++) {
        sends += msgs[i].send, receives += !msgs[i].send;
        int seen = 0;
        for (int j = 0; j < wt.npeers; j++) seen |= wt.peer[j] == msgs[i].peer;
        if (!seen && wt.npeers < 4) wt.peer[wt.npeers++] = msgs[i].peer;
    }
    wt.op = !receives ? "sends to" : !sends ? "receives from" : "exchange with";
    return wt;
}

// What an exchange's messages come to, once checked (the rules of comm_exchange) and their sends counted.
typedef struct {
    size_t nreq;      // MPI requests: every message's pieces
    size_t bytes;     // every message's bytes (the host copy's size)
    size_t largest;   // the largest message's
    int receives;
} ExchangeSize;

static ExchangeSize exchange_checked(Comm* c, const CommMessage* msgs, int n) {
    check_disjoint(msgs, n);
    ExchangeSize z = {0};
    for (int i = 0; i < n; i++) {
        check_peer(c, msgs[i].peer, msgs[i].send ? "comm_exchange (send)" : "comm_exchange (receive)");
        if (msgs[i].tag < 0 || msgs[i].tag > 32767) fail("comm_exchange: tag %d outside 0..32767", msgs[i].tag);
        if (msgs[i].send) count_send(c, msgs[i].peer, msgs[i].bytes);
        z.receives += !msgs[i].send;
        z.nreq += nchunks(c, msgs[i].bytes);
        z.bytes += msgs[i].bytes;
        if (msgs[i].bytes > z.largest) z.largest = msgs[i].bytes;
    }
    if (z.nreq > INT_MAX) fail("comm_exchange: %zu pieces is too many for one MPI_Waitall", z.nreq);
    return z;
}

// Posts every message's pieces into reqs (MPI_Issend, MPI_Irecv): on the buffers themselves (host NULL), or on
// host, each message at its offset there, the sends copied in first.
static void post_messages(Comm* c, const CommMessage* msgs, int n, unsigned char* host, MPI_Request* reqs) {
    size_t r = 0, off_host = 0;
    for (int i = 0; i < n; i++) {
        const CommMessage* m = &msgs[i];
        unsigned char* h = host ? host + off_host : m->buf;
        if (host && m->send && m->bytes) from_user(c, h, m->buf, m->bytes);
        off_host += m->bytes;
        // MPI keeps the messages from one rank to another in order (per communicator), chunks included.
        for (size_t k = 0, nk = nchunks(c, m->bytes); k < nk; k++, r++) {
            size_t off = k * c->max_count, len = piece(c, m->bytes, off);
            if (m->send) mpi_check(MPI_Issend(h + off, (int)len, MPI_BYTE, m->peer, m->tag, c->mc, &reqs[r]), "MPI_Issend");
            else mpi_check(MPI_Irecv(h + off, (int)len, MPI_BYTE, m->peer, MPI_ANY_TAG, c->mc, &reqs[r]), "MPI_Irecv");
        }
    }
}

// Once the requests are complete: each receive got the message it names, and lands in its buffer from host
// (NULL: it is there already).
static void deliver(Comm* c, const CommMessage* msgs, int n, const unsigned char* host, const MPI_Status* st) {
    size_t r = 0, off_host = 0;
    for (int i = 0; i < n; i++) {
        const CommMessage* m = &msgs[i];
        size_t k = nchunks(c, m->bytes);
        if (!m->send) check_received(c, m, &st[r], k);
        if (host && !m->send && m->bytes) to_user(c, m->buf, host + off_host, m->bytes);
        r += k, off_host += m->bytes;
    }
}

void comm_exchange(Comm* c, const CommMessage* msgs, int n) {
    ExchangeSize z = exchange_checked(c, msgs, n);
    if (n == 0) return;
    comm_exchange_finish(c);   // in order; and the staging and the request array are free again
    if (c->nccl) {
        nccl_exchange(c->nccl, msgs, n, z.receives > 0);
        return;
    }
    exchange_room(c, z.nreq);
    unsigned char* host = staged(c) ? grown(&c->xstage, &c->xstage_cap, z.bytes) : NULL;
    post_messages(c, msgs, n, host, c->xreqs);
    if (!z.receives) {
        c->xpending = (int)z.nreq;
        c->xsent = exchange_wait(msgs, n);   // msgs may be gone when comm_exchange_finish waits
        return;
    }
    wait_requests(c, (int)z.nreq, c->xreqs, c->xstats, "MPI_Waitall (exchange)", exchange_wait(msgs, n));
    deliver(c, msgs, n, host, c->xstats);
}

// A started exchange works on its slot's host copy for device memory, and for every buffer in poison mode.
static int exchange_copied(const Comm* c) { return staged(c) || c->poison; }

// Slot host layout: [each message's copy, in order (bytes) | poison scratch (largest, poison only)].
CommHandle comm_exchange_start(Comm* c, const CommMessage* msgs, int n) {
    ExchangeSize z = exchange_checked(c, msgs, n);
    CommHandle h = comm_no_handle();
    if (n == 0) return h;
    comm_exchange_finish(c);   // in order, as comm_exchange
    InFlight* f = flight_take(c, COLL_SEND, &h);
    if (c->nccl) {
        nccl_exchange_start(c->nccl, msgs, n, f->done);
        return h;
    }
    if (n > f->msgs_cap) {
        free(f->msgs);
        f->msgs = xmalloc((size_t)n * sizeof(CommMessage));
        f->msgs_cap = n;
    }
    memcpy(f->msgs, msgs, (size_t)n * sizeof(CommMessage));
    f->nmsgs = n;
    f->xwait = exchange_wait(msgs, n);
    unsigned char* host = exchange_copied(c) ? flight_host(f, z.bytes + (c->poison ? z.largest : 0) + 1) : NULL;
    post_messages(c, f->msgs, n, host, flight_room(f, z.nreq));
    for (int i = 0; c->poison && i < n; i++)
        if (!msgs[i].send && msgs[i].bytes) poison(c, msgs[i].buf, msgs[i].bytes, host + z.bytes);
    return h;
}

// Poison mode: a receive's buffer still all poison, a send's as it was at start.
static void exchange_untouched(Comm* c, const CommMessage* m, const unsigned char* sent, unsigned char* scratch) {
    from_user(c, scratch, m->buf, m->bytes);
    for (size_t i = 0; i < m->bytes; i++)
        if (scratch[i] != (m->send ? sent[i] : 0xff))
            fail("GPT_COMM_POISON: the buffer of message %d (%zu bytes, a %s rank %d) of an exchange in flight was "
                 "written before comm_wait (byte %zu)", m->tag, m->bytes, m->send ? "send to" : "receive from", m->peer, i);
}

static void exchange_done(Comm* c, InFlight* f) {
    unsigned char* host = exchange_copied(c) ? f->host : NULL;
    size_t total = 0;
    for (int i = 0; i < f->nmsgs; i++) total += f->msgs[i].bytes;
    for (size_t i = 0, off = 0; c->poison && i < (size_t)f->nmsgs; off += f->msgs[i++].bytes)
        exchange_untouched(c, &f->msgs[i], host + off, host + total);
    deliver(c, f->msgs, f->nmsgs, host, f->stats);
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
        mpi_check(MPI_Isend((const char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, peer, tag, c->mc, &reqs[i]), "MPI_Isend");
    wait_requests(c, (int)k, reqs, NULL, "MPI_Waitall (send)", (WdWait){.op = "send to", .peer = {peer}, .npeers = 1});
}

void comm_recv_host(Comm* c, void* buf, size_t bytes, int peer, int tag) {
    check_peer(c, peer, "comm_recv_host");
    size_t k = nchunks(c, bytes);
    MPI_Request* reqs = op_requests(c, k);
    for (size_t off = 0, i = 0; i < k; i++, off += c->max_count)
        mpi_check(MPI_Irecv((char*)buf + off, (int)piece(c, bytes, off), MPI_BYTE, peer, tag, c->mc, &reqs[i]), "MPI_Irecv");
    wait_requests(c, (int)k, reqs, c->ostats, "MPI_Waitall (receive)", (WdWait){.op = "receive from", .peer = {peer}, .npeers = 1});
    for (size_t off = 0, i = 0; i < k; i++, off += c->max_count) {
        size_t m = piece(c, bytes, off);
        int got = 0;
        mpi_check(MPI_Get_count(&c->ostats[i], MPI_BYTE, &got), "MPI_Get_count");
        if ((size_t)got != m) fail("comm_recv_host: expected %zu bytes from rank %d (tag %d), got %d", m, peer, tag, got);
    }
}

// Orders host-side work (files written before a DONE marker); device work is ordered by the stream.
void comm_barrier(Comm* c) {
    MPI_Request req;
    mpi_check(MPI_Ibarrier(c->mc, &req), "MPI_Ibarrier");
    wait_requests(c, 1, &req, NULL, "MPI_Wait (barrier)", (WdWait){.op = "barrier"});
}

// n host scalars of `type`, in place.
static void allreduce_scalars(Comm* c, void* xs, int n, MPI_Datatype type, MPI_Op op, const char* name) {
    if (n <= 0) return;
    MPI_Request req;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, xs, n, type, op, c->mc, &req), "MPI_Iallreduce");
    wait_requests(c, 1, &req, NULL, "MPI_Wait (all-reduce)", (WdWait){.op = name});
}
void comm_allreduce_host_sum(Comm* c, double* xs, int n) { allreduce_scalars(c, xs, n, MPI_DOUBLE, MPI_SUM, "all-reduce"); }
void comm_allreduce_host_max(Comm* c, double* xs, int n) { allreduce_scalars(c, xs, n, MPI_DOUBLE, MPI_MAX, "all-reduce (max)"); }
void comm_allreduce_host_sum_i64(Comm* c, long long* xs, int n) {
    allreduce_scalars(c, xs, n, MPI_LONG_LONG, MPI_SUM, "all-reduce");
}
void comm_allreduce_host_max_i64(Comm* c, long long* xs, int n) {
    allreduce_scalars(c, xs, n, MPI_LONG_LONG, MPI_MAX, "all-reduce (max)");
}

uint64_t comm_bytes_sent(const Comm* c, Collective k) { return (unsigned)k < NUM_COLLECTIVES ? c->bytes[k] : 0; }
uint64_t comm_link_bytes(const Comm* c, LinkClass l) { return (unsigned)l < NUM_LINK_CLASSES ? c->link_bytes[l] : 0; }
void comm_reset_bytes(Comm* c) {
    memset(c->bytes, 0, sizeof c->bytes);
    memset(c->link_bytes, 0, sizeof c->link_bytes);
}
int comm_on_one_host(const Comm* c) { return c->one_host; }
const char* link_class_name(LinkClass l) { return l == LINK_INTRA_HOST ? "intra_host" : l == LINK_CROSS_HOST ? "cross_host" : "?"; }

const char* collective_name(Collective k) {
    static const char* const names[NUM_COLLECTIVES] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                       "send", "alltoall"};
    return (unsigned)k < NUM_COLLECTIVES ? names[k] : "?";
}

static void release(Comm* c) {
    comm_exchange_finish(c);
    for (int i = 0; i < COMM_MAX_IN_FLIGHT; i++) {
        InFlight* f = &c->flight[i];
        if (f->gen) fail("internal: a %s is still in flight when its group is freed", collective_name(f->kind));
        free(f->host);
        free(f->reqs), free(f->stats);
        free(f->msgs);
        nccl_event_destroy(f->done);
    }
    nccl_group_destroy(c->nccl);
    free(c->world_ranks);
    free(c->hosts);
    free(c->oreqs), free(c->ostats);
    free(c->xstage);
    free(c->xreqs), free(c->xstats);
    free(c->stage);
    mpi_check(MPI_Comm_free(&c->mc), "MPI_Comm_free");
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
    mpi_check(MPI_Op_free(&world->op_sum[DT_BF16]), "MPI_Op_free");
    mpi_check(MPI_Op_free(&world->op_sum[DT_FP16]), "MPI_Op_free");
    // MPI_Finalize waits for every rank without being watched: the ranks meet in a watched barrier first.
    if (watchdog_timeout(world->wd) > 0.0) {
        comm_watchdog_phase(world, 1, "the end of the run");
        comm_barrier(world);
    }
    Watchdog* w = world->wd;
    release(world);
    watchdog_free(w);
    mpi_check(MPI_Finalize(), "MPI_Finalize");
}
