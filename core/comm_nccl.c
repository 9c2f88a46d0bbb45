// comm_nccl.c: the bulk collectives of comm.h on NCCL, for device buffers (see comm_nccl.h). Plain C on
// the NCCL and CUDA runtime C APIs; linked only into GPU builds with NCCL and MPI.
//
// Bootstrap over MPI: rank 0 of each MPI communicator makes an ncclUniqueId, MPI_Bcast hands it to the
// others, and every rank joins with ncclCommInitRank under its MPI rank. So NCCL ranks are MPI ranks, and a
// comm_split sub-group (a new MPI communicator per color, hence a new id per color) keeps the order its
// key gave it, which the slot layout of reduce-scatter and all-gather depends on.
//
// Stream: every collective is enqueued on the backend's main stream, where every kernel and copy runs.
// That gives the ordering with compute for free (a collective sees what the kernels before it wrote; the
// kernels after it see its result) with no events and no host synchronization, at the price of no overlap
// of communication with compute; a separate comm stream with events is the next step.
//
// Errors: the communicators are blocking (NCCL's default config), so every call's result is final and
// checked. A rank that dies leaves its peers spinning inside NCCL kernels; mpirun ends the job when the
// rank exits, as with MPI.
#ifndef GPT_NCCL
#define GPT_NCCL   // this file is the implementation the header's stubs stand in for
#endif
#include "core/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

struct NcclGroup {
    ncclComm_t nc;
    int rank;
    cudaStream_t stream;   // the backend's main stream (owned by the backend)
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
    g->stream = (cudaStream_t)backend_stream(be);
    nccl_check(ncclCommInitRank(&g->nc, size, id, rank), NULL, "ncclCommInitRank");
    return g;
}

void nccl_group_destroy(NcclGroup* g) {
    if (!g) return;
    // The backend may already have destroyed its stream (trainer teardown frees it first), but it
    // synchronized it before: nothing of ours is in flight, and NCCL's finalize waits for its own work.
    nccl_check(ncclCommFinalize(g->nc), g->nc, "ncclCommFinalize");
    nccl_check(ncclCommDestroy(g->nc), NULL, "ncclCommDestroy");
    free(g);
}

void nccl_allreduce(NcclGroup* g, void* buf, size_t n, DType dt) {
    nccl_check(ncclAllReduce(buf, buf, n, nccl_type(dt), ncclSum, g->nc, g->stream), g->nc, "ncclAllReduce");
}

// NCCL's in-place reduce-scatter is exactly comm.h's: out = in + rank * n, other slots left as they were.
void nccl_reduce_scatter(NcclGroup* g, void* out, const void* in, size_t n, DType dt) {
    nccl_check(ncclReduceScatter(in, out, n, nccl_type(dt), ncclSum, g->nc, g->stream), g->nc, "ncclReduceScatter");
}

void nccl_allgather(NcclGroup* g, void* buf, size_t n, DType dt) {
    const char* mine = (const char*)buf + (size_t)g->rank * n * dtype_size(dt);   // in place: NCCL's convention
    nccl_check(ncclAllGather(mine, buf, n, nccl_type(dt), g->nc, g->stream), g->nc, "ncclAllGather");
}

void nccl_broadcast(NcclGroup* g, void* buf, size_t bytes, int root) {
    nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->nc, g->stream), g->nc, "ncclBroadcast");
}
