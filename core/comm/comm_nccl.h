// comm_nccl.h: the NCCL half of comm_mpi.c, internal to the comm layer (the program sees only comm.h).
//
// In a GPU build with NCCL (the Makefile defines GPT_NCCL for comm_mpi.c and links core/comm/comm_nccl.c), a
// Comm chosen for NCCL holds an NcclGroup: an NCCL communicator over the same ranks as its MPI
// communicator, with the same rank numbers, plus the backend's two streams. comm_mpi.c still counts the
// bytes, checks the arguments, keeps the in-flight slots and does everything NCCL does not (barriers,
// host transfers, host scalars).
//
// Every collective is enqueued on the backend's comm stream behind the main stream's work so far (an
// event recorded on main, waited for by comm), and records `done` on the comm stream when it finishes.
// done == NULL: the main stream waits for it at once (the synchronous calls); else nccl_wait does, later.
//
// Without NCCL (the CPU build, a GPU build without NCCL, tests/system/t_comm.sh's direct compile) the functions
// are stubs: comm_select never creates a group there, so they are unreachable.
#pragma once
#include <mpi.h>

#include "core/comm/comm.h"
#include "base/common.h"

typedef struct NcclGroup NcclGroup;
typedef struct NcclEvent NcclEvent;   // a cudaEvent_t

#ifdef GPT_NCCL
// The number of distinct GPUs the ranks of `world` run on (by device UUID, so it also sees through
// CUDA_VISIBLE_DEVICES). Collective over world; every rank gets the same answer.
int nccl_distinct_gpus(MPI_Comm world);
// An NCCL communicator over the ranks of mc (collective over mc), enqueuing on be's comm stream.
NcclGroup* nccl_group_create(MPI_Comm mc, int rank, int size, Backend* be);
void nccl_group_destroy(NcclGroup* g);
NcclEvent* nccl_event_create(void);
void nccl_event_destroy(NcclEvent* e);   // NULL: nothing
// comm.h's semantics; the caller has checked the arguments and counted the bytes. done: see above.
// An exchange (comm.h); with wait_main the main stream waits for it, else nccl_exchange_finish does.
void nccl_exchange(NcclGroup* g, const CommMessage* msgs, int n, int wait_main);
void nccl_exchange_finish(NcclGroup* g);
// comm_exchange_start's: the main stream waits for it at nccl_wait(done).
void nccl_exchange_start(NcclGroup* g, const CommMessage* msgs, int n, NcclEvent* done);
void nccl_allreduce(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done);
void nccl_allreduce_max_f32(NcclGroup* g, float* buf, size_t n, NcclEvent* done);
void nccl_reduce_scatter(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done);
void nccl_allgather(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done);
void nccl_broadcast(NcclGroup* g, void* buf, size_t bytes, int root, NcclEvent* done);
void nccl_alltoall(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done);
// Later work on the main stream waits for `done`; the host does not.
void nccl_wait(NcclGroup* g, NcclEvent* done);
#define NCCL_BUILT 1
#else
#define NCCL_BUILT 0
static inline int nccl_distinct_gpus(MPI_Comm world) {
    (void)world;
    return 0;
}
static inline NcclGroup* nccl_group_create(MPI_Comm mc, int rank, int size, Backend* be) {
    (void)mc, (void)rank, (void)size, (void)be;
    fail("internal: NCCL requested in a build without NCCL");
}
static inline void nccl_group_destroy(NcclGroup* g) { (void)g; }
static inline NcclEvent* nccl_event_create(void) { fail("internal: NCCL event in a build without NCCL"); }
static inline void nccl_event_destroy(NcclEvent* e) { (void)e; }
static inline void nccl_exchange(NcclGroup* g, const CommMessage* msgs, int n, int wait_main) {
    (void)g, (void)msgs, (void)n, (void)wait_main;
}
static inline void nccl_exchange_finish(NcclGroup* g) { (void)g; }
static inline void nccl_exchange_start(NcclGroup* g, const CommMessage* msgs, int n, NcclEvent* done) {
    (void)g, (void)msgs, (void)n, (void)done;
}
static inline void nccl_allreduce(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done) {
    (void)g, (void)buf, (void)n, (void)dt, (void)done;
}
static inline void nccl_allreduce_max_f32(NcclGroup* g, float* buf, size_t n, NcclEvent* done) {
    (void)g, (void)buf, (void)n, (void)done;
}
static inline void nccl_reduce_scatter(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done) {
    (void)g, (void)out, (void)in, (void)n, (void)dt, (void)done;
}
static inline void nccl_allgather(NcclGroup* g, void* buf, size_t n, DType dt, NcclEvent* done) {
    (void)g, (void)buf, (void)n, (void)dt, (void)done;
}
static inline void nccl_broadcast(NcclGroup* g, void* buf, size_t bytes, int root, NcclEvent* done) {
    (void)g, (void)buf, (void)bytes, (void)root, (void)done;
}
static inline void nccl_alltoall(NcclGroup* g, void* out, const void* in, size_t n, DType dt, NcclEvent* done) {
    (void)g, (void)out, (void)in, (void)n, (void)dt, (void)done;
}
static inline void nccl_wait(NcclGroup* g, NcclEvent* done) { (void)g, (void)done; }
#endif
