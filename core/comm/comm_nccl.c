// comm_nccl.c: the bulk collectives of comm.h on NCCL, for device buffers (see comm_nccl.h). Plain C on
// the NCCL and CUDA runtime C APIs; linked only into GPU builds with NCCL and MPI.
//
// Bootstrap over MPI: rank 0 of each MPI communicator makes an ncclUniqueId, MPI_Bcast hands it to the
// others, and every rank joins with ncclCommInitRank under its MPI rank. So NCCL ranks are MPI ranks, and a
// comm_split sub-group (a new MPI communicator per color, hence a new id per color) keeps the order its
// key gave it, which the slot layout of reduce-scatter and all-gather depends on.
//
// Streams: every collective, synchronous or not, of every group, runs on the backend's comm stream, so
// this rank's NCCL work executes in the order it was issued (the same order on every rank) and never two
// NCCL kernels at once, which could deadlock. A collective first makes the comm stream wait for an event
// recorded on the main stream (it sees what the kernels before it wrote, and runs after the kernels
// before it stopped reading a buffer it overwrites), then records its own `done` event; the main stream
// waits for that one at once (synchronous calls) or when comm_wait says (asynchronous ones), so compute
// issued in between overlaps the collective. No host synchronization anywhere.
//
// Errors: the communicators are blocking (NCCL's default config), so every call's result is final and
// checked. A rank that dies leaves its peers spinning inside NCCL kernels; mpirun ends the job when the
// rank exits, as with MPI.
#ifndef GPT_NCCL
#define GPT_NCCL   // this file is the implementation the header's stubs stand in for
#endif
#include "core/comm/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

struct NcclGroup {
    ncclComm_t nc;
    int rank, size;
    cudaStream_t main, comm;   // the backend's (owned by it)
    cudaEvent_t ready;         // main's work so far; re-recorded per collective (a wait takes its state then)
    cudaEvent_t sync_done;     // the synchronous collectives' `done`
    cudaEvent_t sends_done;    // an exchange of sends only, which the main stream has not waited for
    int sends_pending;
};

static void nccl_check(ncclResult_t r, ncclComm_t nc, const char* what) {
    if (r == ncclSuccess) return;
    // ncclGetLastError carries the detail (which peer, which transport) that the code alone lacks.
    const char* detail = ncclGetLastError(nc);
    fail("%s failed: %s%s%s", what, ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
}

static void cuda_check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail("%s failed: %s", what, cudaGetErrorString(e));
}

static void mpi_check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error code %d", rc);
    fail("%s failed: %s", what, msg);
}

static ncclDataType_t nccl_type(DType dt) {
    switch (dt) {
    case DT_BF16: return ncclBfloat16;
    case DT_FP16: return ncclFloat16;
    default: return ncclFloat32;
    }
}

static int cmp_uuid(const void* a, const void* b) { return memcmp(a, b, sizeof(cudaUUID_t)); }

int nccl_distinct_gpus(MPI_Comm world) {
    int dev = 0, size = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");   // backend_create made it current
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    mpi_check(MPI_Comm_size(world, &size), "MPI_Comm_size");
    cudaUUID_t* all = xmalloc((size_t)size * sizeof(cudaUUID_t));
    mpi_check(MPI_Allgather(&prop.uuid, (int)sizeof(cudaUUID_t), MPI_BYTE, all, (int)sizeof(cudaUUID_t), MPI_BYTE, world),
              "MPI_Allgather (GPU UUIDs)");
    qsort(all, (size_t)size, sizeof(cudaUUID_t), cmp_uuid);
    int distinct = size > 0;
    for (int i = 1; i < size; i++) distinct += cmp_uuid(&all[i - 1], &all[i]) != 0;
    free(all);
    return distinct;
}

NcclGroup* nccl_group_create(MPI_Comm mc, int rank, int size, Backend* be) {
    if (!be || !backend_is_gpu(be)) fail("internal: NCCL needs a GPU backend attached");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) nccl_check(ncclGetUniqueId(&id), NULL, "ncclGetUniqueId");
    mpi_check(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mc), "MPI_Bcast (ncclUniqueId)");
    NcclGroup* g = xcalloc(1, sizeof(NcclGroup));
    g->rank = rank;
    g->size = size;
    g->main = (cudaStream_t)backend_stream(be);
    g->comm = (cudaStream_t)backend_comm_stream(be);
    cuda_check(cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_check(cudaEventCreateWithFlags(&g->sync_done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_check(cudaEventCreateWithFlags(&g->sends_done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    nccl_check(ncclCommInitRank(&g->nc, size, id, rank), NULL, "ncclCommInitRank");
    return g;
}

NcclEvent* nccl_event_create(void) {
    cudaEvent_t e;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return (NcclEvent*)e;
}

void nccl_event_destroy(NcclEvent* e) {
    if (e) cuda_check(cudaEventDestroy((cudaEvent_t)e), "cudaEventDestroy");
}

void nccl_wait(NcclGroup* g, NcclEvent* done) {
    cuda_check(cudaStreamWaitEvent(g->main, (cudaEvent_t)done, 0), "cudaStreamWaitEvent (main on comm)");
}

// Brackets each collective: the comm stream waits for main's work so far; afterwards `done` marks the end.
static void begin(NcclGroup* g) {
    cuda_check(cudaEventRecord(g->ready, g->main), "cudaEventRecord (main)");
    cuda_check(cudaStreamWaitEvent(g->comm, g->ready, 0), "cudaStreamWaitEvent (comm on main)");
}
static void end(NcclGroup* g, NcclEvent* done) {
    cudaEvent_t e = done ? (cudaEvent_t)done : g->sync_done;
    cuda_check(cudaEventRecord(e, g->comm), "cudaEventRecord (comm)");
    if (!done) nccl_wait(g, (NcclEvent*)e);
}

void nccl_group_destroy(NcclGroup* g) {
    if (!g) return;
    // The backend may already have destroyed its streams (trainer teardown frees it first), but it
    // synchronized them before: nothing of ours is in flight, and NCCL's finalize waits for its own work.
    nccl_check(ncclCommFinalize(g->nc), g->nc, "ncclCommFinalize");
    nccl_check(ncclCommDestroy(g->nc), NULL, "ncclCommDestroy");
    cuda_check(cudaEventDestroy(g->ready), "cudaEventDestroy");
    cuda_check(cudaEventDestroy(g->sync_done), "cudaEventDestroy");
    cuda_check(cudaEventDestroy(g->sends_done), "cudaEventDestroy");
    free(g);
}

void nccl_allreduce(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done) {
    begin(g);
    nccl_check(ncclAllReduce(buf, buf, n, nccl_type(dt), ncclSum, g->nc, g->comm), g->nc, "ncclAllReduce");
    end(g, done);
}

void nccl_allreduce_max_f32(NcclGroup* g, float* buf, size_t n, NcclEvent* done) {
    begin(g);
    nccl_check(ncclAllReduce(buf, buf, n, ncclFloat32, ncclMax, g->nc, g->comm), g->nc, "ncclAllReduce (max)");
    end(g, done);
}

// NCCL's in-place reduce-scatter is exactly comm.h's: out = in + rank * n, other slots left as they were.
void nccl_reduce_scatter(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done) {
    begin(g);
    nccl_check(ncclReduceScatter(in, out, n, nccl_type(dt), ncclSum, g->nc, g->comm), g->nc, "ncclReduceScatter");
    end(g, done);
}

void nccl_allgather(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done) {
    const char* mine = (const char*)buf + (size_t)g->rank * n * dtype_size(dt);   // in place: NCCL's convention
    begin(g);
    nccl_check(ncclAllGather(mine, buf, n, nccl_type(dt), g->nc, g->comm), g->nc, "ncclAllGather");
    end(g, done);
}

// One group: NCCL posts the sends and receives together, so neighbours that send to each other in the
// same exchange do not wait on each other (schedule.h). Messages between two ranks pair in issue order.
// The comm stream runs the groups in order, so a later exchange, and the main stream's wait for it, come
// after a pending exchange of sends.
void nccl_exchange_finish(NcclGroup* g) {
    if (g->sends_pending) nccl_wait(g, (NcclEvent*)g->sends_done);
    g->sends_pending = 0;
}

static void exchange_group(NcclGroup* g, const CommMessage* msgs, int n) {
    begin(g);
    nccl_check(ncclGroupStart(), g->nc, "ncclGroupStart");
    for (int i = 0; i < n; i++) {
        const CommMessage* m = &msgs[i];
        if (m->send) nccl_check(ncclSend(m->buf, m->bytes, ncclUint8, m->peer, g->nc, g->comm), g->nc, "ncclSend");
        else nccl_check(ncclRecv(m->buf, m->bytes, ncclUint8, m->peer, g->nc, g->comm), g->nc, "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), g->nc, "ncclGroupEnd");
}

void nccl_exchange(NcclGroup* g, const CommMessage* msgs, int n, int wait_main) {
    exchange_group(g, msgs, n);
    end(g, wait_main ? NULL : (NcclEvent*)g->sends_done);
    g->sends_pending = !wait_main;
}

// The main stream runs on (the compute the exchange overlaps) until nccl_wait on `done`.
void nccl_exchange_start(NcclGroup* g, const CommMessage* msgs, int n, NcclEvent* done) {
    exchange_group(g, msgs, n);
    end(g, done);
}

void nccl_broadcast(NcclGroup* g, void* buf, size_t bytes, int root, NcclEvent* done) {
    begin(g);
    nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->nc, g->comm), g->nc, "ncclBroadcast");
    end(g, done);
}

// NCCL has no all-to-all: one group of a send and a receive per peer (itself included), posted together so
// that no pair waits on another; out and in are disjoint (comm_mpi.c checks), as the concurrent copies need.
void nccl_alltoall(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done) {
    size_t block = n * dtype_size(dt);
    begin(g);
    nccl_check(ncclGroupStart(), g->nc, "ncclGroupStart");
    for (int j = 0; j < g->size; j++) {
        nccl_check(ncclSend((const char*)in + (size_t)j * block, n, nccl_type(dt), j, g->nc, g->comm), g->nc, "ncclSend");
        nccl_check(ncclRecv((char*)out + (size_t)j * block, n, nccl_type(dt), j, g->nc, g->comm), g->nc, "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), g->nc, "ncclGroupEnd");
    end(g, done);
}
