// comm_mpi.c: comm.h over MPI (OpenMPI).
//
// Device buffers (a GPU backend is attached) are staged through a host buffer: download, MPI on the host,
// upload. That is correct everywhere, including several ranks on one GPU, but not fast. In a GPU build with
// NCCL, comm_select can hand the bulk collectives (all-reduce, reduce-scatter, all-gather, broadcast) of a
// communicator and the groups split from it to NCCL (core/comm_nccl.c); this file still checks their
// arguments and counts their bytes, so the counters are the same whichever library moves the data.
// send/recv stay here, host-staged: their buffered semantics (send returns before the peer receives) are
// what the pipeline schedule relies on, and ncclSend blocks its stream until the peer posts the receive.
//
// bf16/fp16 sums use our own MPI_Op (fp32 add, one round-to-nearest-even per pairwise reduction), since
// MPI has no 16-bit float types. MPI counts are ints, so every transfer is split into chunks of at most
// max_count elements (INT_MAX; the tests lower it with GPT_COMM_MAX_COUNT to exercise the split).
//
// Sends are buffered: comm_send copies the message and returns before the peer receives it, so pipeline
// neighbours may both send before they receive without deadlocking. The copies are freed as the sends
// complete; comm_free / comm_finalize wait for the rest.
#include "core/comm.h"

#include <limits.h>
#include <mpi.h>

#include "core/comm_nccl.h"
#include "core/common.h"
#include "kernels/dtype.h"

typedef struct {
    void* data;          // the message's copy, freed when all its chunks are sent
    MPI_Request* reqs;   // one per chunk
    int nreq;
} PendingSend;

struct Comm {
    MPI_Comm mc;
    int rank, size;
    int local_rank;          // world only
    int is_world;
    Backend* be;             // NULL or a CPU backend: buffers are host memory
    MPI_Op op_sum[3];        // by DType; the bf16/fp16 ops are owned by the world, copied into sub-groups
    size_t max_count;        // elements per MPI call
    unsigned char* stage;    // host staging for device buffers, grown on demand
    size_t stage_cap;
    PendingSend* sends;
    int nsends, sends_cap;
    uint64_t bytes[NUM_COLLECTIVES];
    NcclGroup* nccl;         // non-NULL: the bulk collectives on device buffers go to NCCL
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

static unsigned char* stage(Comm* c, size_t bytes) {
    if (bytes > c->stage_cap) {
        free(c->stage);
        c->stage = xmalloc(bytes);
        c->stage_cap = bytes;
    }
    return c->stage;
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
    c->op_sum[DT_FP32] = MPI_SUM;
    check(MPI_Op_create(sum_bf16, 1, &c->op_sum[DT_BF16]), "MPI_Op_create");
    check(MPI_Op_create(sum_fp16, 1, &c->op_sum[DT_FP16]), "MPI_Op_create");

    MPI_Comm node;
    check(MPI_Comm_split_type(mc, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &c->local_rank), "MPI_Comm_rank");
    check(MPI_Comm_free(&node), "MPI_Comm_free");

    const char* mx = getenv("GPT_COMM_MAX_COUNT");   // test hook: small chunks exercise the splitting
    if (mx && *mx) {
        char* end;
        long long v = strtoll(mx, &end, 10);
        if (*end || v < 1 || v > INT_MAX) fail("GPT_COMM_MAX_COUNT=%s: expected 1..%d", mx, INT_MAX);
        c->max_count = (size_t)v;
    }
    return c;
}

void comm_attach_backend(Comm* c, Backend* be) { c->be = be; }

Comm* comm_split(Comm* parent, int color, int key) {
    if (color < 0) fail("comm_split: color %d must be >= 0", color);
    MPI_Comm mc;
    check(MPI_Comm_split(parent->mc, color, key, &mc), "MPI_Comm_split");
    Comm* c = comm_new(mc, "MPI_Comm_set_errhandler");
    c->be = parent->be;
    c->max_count = parent->max_count;
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
    size_t es = dtype_size(dt);
    for (size_t off = 0; off < n; off += c->max_count) {
        size_t m = n - off < c->max_count ? n - off : c->max_count;
        check(MPI_Allreduce(MPI_IN_PLACE, (char*)buf + off * es, (int)m, mpi_type(dt), sum_op(c, dt), c->mc),
              "MPI_Allreduce");
    }
}

void comm_allreduce_sum(Comm* c, void* buf, size_t n, DType dt) {
    size_t bytes = mul_bytes(n, dtype_size(dt), "comm_allreduce_sum");
    count(c, COLL_ALLREDUCE, bytes);
    if (n == 0) return;
    // NCCL even on one rank (a copy), so a one-GPU machine exercises every NCCL call.
    if (c->nccl) {
        nccl_allreduce(c->nccl, buf, n, dt);
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

// out (n, host) = sum over ranks of slot `rank` of in (size*n, host); out must not overlap in. When a
// chunk is needed, its pieces of every slot are first packed contiguously into tmp.
static void reduce_scatter_host(Comm* c, void* out, const void* in, size_t n, DType dt, unsigned char* tmp) {
    size_t es = dtype_size(dt);
    if (n <= c->max_count) {
        check(MPI_Reduce_scatter_block(in, out, (int)n, mpi_type(dt), sum_op(c, dt), c->mc),
              "MPI_Reduce_scatter_block");
        return;
    }
    for (size_t off = 0; off < n; off += c->max_count) {
        size_t m = n - off < c->max_count ? n - off : c->max_count;
        for (int k = 0; k < c->size; k++)
            memcpy(tmp + (size_t)k * m * es, (const char*)in + ((size_t)k * n + off) * es, m * es);
        check(MPI_Reduce_scatter_block(tmp, (char*)out + off * es, (int)m, mpi_type(dt), sum_op(c, dt), c->mc),
              "MPI_Reduce_scatter_block");
    }
}

void comm_reduce_scatter_sum(Comm* c, void* out, const void* in, size_t n, DType dt) {
    size_t es = dtype_size(dt);
    size_t slot = mul_bytes(n, es, "comm_reduce_scatter_sum");
    size_t total = mul_bytes(slot, (size_t)c->size, "comm_reduce_scatter_sum");
    count(c, COLL_REDUCE_SCATTER, total);
    const char* lo = in;
    const char* mine = lo + (size_t)c->rank * slot;
    const char* o = out;
    int in_place = o == mine;
    if (!in_place && o < lo + total && lo < o + slot)
        fail("comm_reduce_scatter_sum: out overlaps in but is not slot %d (in place)", c->rank);
    if (n == 0) return;
    if (c->nccl) {
        nccl_reduce_scatter(c->nccl, out, in, n, dt);
        return;
    }
    if (c->size == 1) {
        if (!in_place) {
            if (staged(c)) be_copy(c->be, out, in, slot);
            else memcpy(out, in, slot);
        }
        return;
    }
    int chunked = n > c->max_count;
    size_t pack = chunked ? mul_bytes((size_t)c->size, c->max_count * es, "comm_reduce_scatter_sum") : 0;
    if (staged(c)) {
        // [ in (total) | result (slot) | packing ]
        unsigned char* h = stage(c, total + slot + pack);
        be_download(c->be, h, in, total);
        reduce_scatter_host(c, h + total, h, n, dt, h + total + slot);
        be_upload(c->be, out, h + total, slot);
    } else if (in_place || chunked) {
        // MPI_IN_PLACE would leave the result in slot 0, clobbering it; the other slots stay as they were
        // (as NCCL leaves them), so the result goes through the staging buffer instead.
        unsigned char* h = stage(c, slot + pack);
        reduce_scatter_host(c, h, in, n, dt, h + slot);
        memcpy(out, h, slot);
    } else {
        reduce_scatter_host(c, out, in, n, dt, NULL);
    }
}

// In place on host memory. A chunk takes the same piece of every slot, described by a datatype whose
// extent is one slot.
static void allgather_host(Comm* c, void* buf, size_t n, DType dt) {
    size_t es = dtype_size(dt);
    if (n <= c->max_count) {
        check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, mpi_type(dt), c->mc), "MPI_Allgather");
        return;
    }
    for (size_t off = 0; off < n; off += c->max_count) {
        size_t m = n - off < c->max_count ? n - off : c->max_count;
        MPI_Datatype piece, strided;
        check(MPI_Type_contiguous((int)m, mpi_type(dt), &piece), "MPI_Type_contiguous");
        check(MPI_Type_create_resized(piece, 0, (MPI_Aint)(n * es), &strided), "MPI_Type_create_resized");
        check(MPI_Type_commit(&strided), "MPI_Type_commit");
        check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, (char*)buf + off * es, 1, strided, c->mc),
              "MPI_Allgather");
        check(MPI_Type_free(&strided), "MPI_Type_free");
        check(MPI_Type_free(&piece), "MPI_Type_free");
    }
}

void comm_allgather(Comm* c, void* buf, size_t n, DType dt) {
    size_t slot = mul_bytes(n, dtype_size(dt), "comm_allgather");
    size_t total = mul_bytes(slot, (size_t)c->size, "comm_allgather");
    count(c, COLL_ALLGATHER, total);
    if (n == 0) return;
    if (c->nccl) {
        nccl_allgather(c->nccl, buf, n, dt);
        return;
    }
    if (c->size == 1) return;
    if (!staged(c)) {
        allgather_host(c, buf, n, dt);
        return;
    }
    unsigned char* h = stage(c, total);
    size_t mine = (size_t)c->rank * slot;
    be_download(c->be, h + mine, (const char*)buf + mine, slot);
    allgather_host(c, h, n, dt);
    be_upload(c->be, buf, h, total);
}

static void bcast_host(Comm* c, void* buf, size_t bytes, int root) {
    for (size_t off = 0; off < bytes; off += c->max_count) {
        size_t m = bytes - off < c->max_count ? bytes - off : c->max_count;
        check(MPI_Bcast((char*)buf + off, (int)m, MPI_BYTE, root, c->mc), "MPI_Bcast");
    }
}

void comm_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) fail("comm_broadcast: root %d outside a group of %d", root, c->size);
    if (c->rank == root) count(c, COLL_BROADCAST, bytes);
    if (bytes == 0) return;
    if (c->nccl) {
        nccl_broadcast(c->nccl, buf, bytes, root);
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

// Frees the copies of completed sends; with `all`, waits for every pending one.
static void reap_sends(Comm* c, int all) {
    int j = 0;
    for (int i = 0; i < c->nsends; i++) {
        PendingSend* p = &c->sends[i];
        int done = 1;
        if (all) check(MPI_Waitall(p->nreq, p->reqs, MPI_STATUSES_IGNORE), "MPI_Waitall (send)");
        else check(MPI_Testall(p->nreq, p->reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall (send)");
        if (done) {
            free(p->data);
            free(p->reqs);
        } else {
            c->sends[j++] = *p;
        }
    }
    c->nsends = j;
}

static void check_peer(const Comm* c, int peer, const char* what) {
    if (peer < 0 || peer >= c->size || peer == c->rank)
        fail("%s: peer %d is not another rank of this group (rank %d of %d)", what, peer, c->rank, c->size);
}

static size_t nchunks(const Comm* c, size_t bytes) { return bytes ? (bytes - 1) / c->max_count + 1 : 1; }

void comm_send(Comm* c, const void* buf, size_t bytes, int peer, int tag) {
    check_peer(c, peer, "comm_send");
    count(c, COLL_SEND, bytes);
    reap_sends(c, 0);
    if (c->nsends == c->sends_cap) {
        c->sends_cap = c->sends_cap ? 2 * c->sends_cap : 8;
        PendingSend* s = xmalloc((size_t)c->sends_cap * sizeof *s);
        if (c->nsends) memcpy(s, c->sends, (size_t)c->nsends * sizeof *s);
        free(c->sends);
        c->sends = s;
    }
    PendingSend* p = &c->sends[c->nsends++];
    p->data = xmalloc(bytes);
    if (staged(c)) be_download(c->be, p->data, buf, bytes);
    else if (bytes) memcpy(p->data, buf, bytes);
    size_t k = nchunks(c, bytes);
    if (k > INT_MAX) fail("comm_send: %zu bytes is too many chunks", bytes);
    p->nreq = (int)k;
    p->reqs = xmalloc(k * sizeof(MPI_Request));
    // MPI keeps the messages between a pair with one tag in order, so the chunks arrive in sequence.
    for (size_t i = 0; i < k; i++) {
        size_t off = i * c->max_count, m = bytes - off < c->max_count ? bytes - off : c->max_count;
        check(MPI_Isend((char*)p->data + off, (int)m, MPI_BYTE, peer, tag, c->mc, &p->reqs[i]), "MPI_Isend");
    }
}

void comm_recv(Comm* c, void* buf, size_t bytes, int peer, int tag) {
    check_peer(c, peer, "comm_recv");
    reap_sends(c, 0);
    unsigned char* h = staged(c) ? stage(c, bytes) : buf;
    for (size_t i = 0, k = nchunks(c, bytes); i < k; i++) {
        size_t off = i * c->max_count, m = bytes - off < c->max_count ? bytes - off : c->max_count;
        MPI_Status st;
        check(MPI_Recv(h + off, (int)m, MPI_BYTE, peer, tag, c->mc, &st), "MPI_Recv");
        int got = 0;
        check(MPI_Get_count(&st, MPI_BYTE, &got), "MPI_Get_count");
        if ((size_t)got != m)
            fail("comm_recv: expected %zu bytes from rank %d (tag %d), got %d", m, peer, tag, got);
    }
    if (staged(c) && bytes) be_upload(c->be, buf, h, bytes);
}

// Orders host-side work (files written before a DONE marker); device work is ordered by the stream.
void comm_barrier(Comm* c) { check(MPI_Barrier(c->mc), "MPI_Barrier"); }

void comm_allreduce_host_sum(Comm* c, double* xs, int n) {
    if (n > 0) check(MPI_Allreduce(MPI_IN_PLACE, xs, n, MPI_DOUBLE, MPI_SUM, c->mc), "MPI_Allreduce");
}
void comm_allreduce_host_max(Comm* c, double* xs, int n) {
    if (n > 0) check(MPI_Allreduce(MPI_IN_PLACE, xs, n, MPI_DOUBLE, MPI_MAX, c->mc), "MPI_Allreduce");
}

uint64_t comm_bytes_sent(const Comm* c, Collective k) { return (unsigned)k < NUM_COLLECTIVES ? c->bytes[k] : 0; }
void comm_reset_bytes(Comm* c) { memset(c->bytes, 0, sizeof c->bytes); }

const char* collective_name(Collective k) {
    static const char* const names[NUM_COLLECTIVES] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                       "send"};
    return (unsigned)k < NUM_COLLECTIVES ? names[k] : "?";
}

static void release(Comm* c) {
    reap_sends(c, 1);
    nccl_group_destroy(c->nccl);
    free(c->sends);
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
    release(world);
    check(MPI_Finalize(), "MPI_Finalize");
}
