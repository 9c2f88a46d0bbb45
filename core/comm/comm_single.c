// comm_single.c: comm.h for builds without MPI, a world of one rank. Every collective is the identity
// (copies where out != in) and moves 0 bytes. A multi-rank launch is refused rather than run as N
// independent single-rank jobs, which would train N unsynchronized copies of the model.
#include "core/comm/comm.h"

#include "base/common.h"
#include "core/comm/launcher.h"

struct Comm {
    Backend* be;
    int is_world;
};

Comm* comm_init_world(int* argc, char*** argv) {
    (void)argc;
    (void)argv;
    int n = launcher_ranks();
    if (n > 1) fail("this binary was built without MPI; rebuild with OpenMPI installed to run %d ranks", n);
    Comm* c = xcalloc(1, sizeof(Comm));
    c->is_world = 1;
    return c;
}

void comm_attach_backend(Comm* c, Backend* be) { c->be = be; }

Comm* comm_split(Comm* parent, int color, int key) {
    (void)key;
    if (color < 0 && color != COMM_NO_GROUP) fail("comm_split: color %d must be >= 0", color);
    if (color == COMM_NO_GROUP) return NULL;
    Comm* c = xcalloc(1, sizeof(Comm));
    c->be = parent->be;
    return c;
}

int comm_rank(const Comm* c) {
    (void)c;
    return 0;
}
int comm_size(const Comm* c) {
    (void)c;
    return 1;
}
int comm_local_rank(const Comm* world) {
    if (!world->is_world) fail("comm_local_rank: needs the world communicator");
    return 0;
}
int comm_local_size(const Comm* world) {
    if (!world->is_world) fail("comm_local_size: needs the world communicator");
    return 1;
}
int comm_host_leader(const Comm* world) {
    if (!world->is_world) fail("comm_host_leader: needs the world communicator");
    return 0;
}

int comm_nccl_built(void) { return 0; }
const char* comm_kind_name(CommKind k) { return k == COMM_NCCL ? "nccl" : k == COMM_MPI ? "mpi" : "auto"; }
CommKind comm_select(Comm* world, CommKind want) {
    if (!world->is_world) fail("comm_select: needs the world communicator");
    if (want == COMM_NCCL) fail("-comm nccl: this binary was built without NCCL");
    return COMM_MPI;
}

void comm_allreduce_sum(Comm* c, void* buf, size_t n, DType dt) {
    (void)c, (void)buf, (void)n, (void)dt;
}

void comm_allreduce_max_f32(Comm* c, float* buf, size_t n) { (void)c, (void)buf, (void)n; }

void comm_reduce_scatter_sum(Comm* c, void* out, const void* in, size_t n, DType dt) {
    size_t bytes = n * dtype_size(dt);
    if (out == in || bytes == 0) return;
    const char *o = out, *i = in;
    if (o < i + bytes && i < o + bytes) fail("comm_reduce_scatter_sum: out overlaps in but is not slot 0 (in place)");
    if (c->be) be_copy(c->be, out, in, bytes);
    else memcpy(out, in, bytes);
}

void comm_allgather(Comm* c, void* buf, size_t n, DType dt) {
    (void)c, (void)buf, (void)n, (void)dt;
}

void comm_alltoall(Comm* c, void* out, const void* in, size_t n, DType dt) {
    if (n > SIZE_MAX / dtype_size(dt)) fail("comm_alltoall: %zu x %zu bytes overflows", n, dtype_size(dt));
    size_t bytes = n * dtype_size(dt);
    const char *o = out, *i = in;
    if (bytes && o < i + bytes && i < o + bytes) fail("comm_alltoall: out overlaps in (the all-to-all is out of place)");
    if (bytes == 0) return;
    if (c->be) be_copy(c->be, out, in, bytes);
    else memcpy(out, in, bytes);
}

// One rank: the collective is over when start returns, so no handle is ever in flight.
CommHandle comm_reduce_scatter_sum_start(Comm* c, void* out, const void* in, size_t n, DType dt) {
    comm_reduce_scatter_sum(c, out, in, n, dt);
    return (CommHandle){0, 0};
}
CommHandle comm_allgather_start(Comm* c, void* buf, size_t n, DType dt) {
    (void)c, (void)buf, (void)n, (void)dt;
    return (CommHandle){0, 0};
}
void comm_wait(Comm* c, CommHandle* h) {
    (void)c;
    if (h->gen) fail("internal: comm_wait on a handle that is not in flight on this group");
}

void comm_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    (void)buf, (void)bytes;
    if (root != 0) fail("comm_broadcast: root %d outside a group of %d", root, comm_size(c));
}

// One rank never waits for another: nothing to watch.
void comm_watchdog_start(Comm* world, double timeout_s) {
    if (!world->is_world) fail("comm_watchdog_start: needs the world communicator");
    if (!(timeout_s >= 0.0)) fail("comm_watchdog_start: timeout %g s is negative", timeout_s);
}
void comm_watchdog_phase(Comm* world, int long_phase, const char* fmt, ...) { (void)world, (void)long_phase, (void)fmt; }

void comm_exchange_finish(Comm* c) { (void)c; }
void comm_exchange(Comm* c, const CommMessage* msgs, int n) {
    (void)c;
    if (n > 0) fail("comm_exchange: peer %d is not another rank of this group (rank 0 of 1)", msgs[0].peer);
}
CommHandle comm_exchange_start(Comm* c, const CommMessage* msgs, int n) {
    comm_exchange(c, msgs, n);
    return (CommHandle){0, 0};
}

void comm_broadcast_host(Comm* c, void* buf, size_t bytes, int root) {
    (void)buf, (void)bytes;
    if (root != 0) fail("comm_broadcast_host: root %d outside a group of %d", root, comm_size(c));
}
void comm_send_host(Comm* c, const void* buf, size_t bytes, int peer, int tag) {
    (void)c, (void)buf, (void)bytes, (void)tag;
    fail("comm_send_host: peer %d is not another rank of this group (rank 0 of 1)", peer);
}
void comm_recv_host(Comm* c, void* buf, size_t bytes, int peer, int tag) {
    (void)c, (void)buf, (void)bytes, (void)tag;
    fail("comm_recv_host: peer %d is not another rank of this group (rank 0 of 1)", peer);
}

void comm_barrier(Comm* c) { (void)c; }
void comm_allreduce_host_sum(Comm* c, double* xs, int n) { (void)c, (void)xs, (void)n; }
void comm_allreduce_host_max(Comm* c, double* xs, int n) { (void)c, (void)xs, (void)n; }
void comm_allreduce_host_sum_i64(Comm* c, long long* xs, int n) { (void)c, (void)xs, (void)n; }
void comm_allreduce_host_max_i64(Comm* c, long long* xs, int n) { (void)c, (void)xs, (void)n; }

uint64_t comm_bytes_sent(const Comm* c, Collective k) {
    (void)c, (void)k;
    return 0;
}
uint64_t comm_link_bytes(const Comm* c, LinkClass l) {
    (void)c, (void)l;
    return 0;
}
void comm_reset_bytes(Comm* c) { (void)c; }
int comm_on_one_host(const Comm* c) {
    (void)c;
    return 1;
}
const char* link_class_name(LinkClass l) { return l == LINK_INTRA_HOST ? "intra_host" : l == LINK_CROSS_HOST ? "cross_host" : "?"; }

const char* collective_name(Collective k) {
    static const char* const names[NUM_COLLECTIVES] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                       "send", "alltoall"};
    return (unsigned)k < NUM_COLLECTIVES ? names[k] : "?";
}

void comm_free(Comm* c) {
    if (c && c->is_world) fail("comm_free: the world is released by comm_finalize");
    free(c);
}
void comm_finalize(Comm* world) {
    if (world && !world->is_world) fail("comm_finalize: needs the world communicator");
    free(world);
}
