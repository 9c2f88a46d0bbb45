// comm.h: collectives over groups of ranks, counting the bytes each rank sends.
//
// Buffers are backend memory (host memory in the CPU build; device memory in the GPU build, which the MPI
// backend stages through the host and the NCCL backend hands to NCCL, see comm_select). Sums of bf16/fp16
// are computed in fp32 and rounded once per pairwise reduction (MPI; NCCL reduces in its own order with its
// own 16-bit arithmetic); every rank of a group gets the same bits. Every failure is a one-line error and
// exit 1; a rank that dies takes the job down (mpirun aborts the others) instead of leaving them waiting, and
// one that stops answering is named by the hang watchdog (comm_watchdog_start), on from comm_init_world.
//
// Byte counts follow the ring algorithms' per-rank traffic, so they are comparable across backends:
// all-reduce of S bytes over N ranks sends 2(N-1)/N * S, reduce-scatter and all-gather of S total bytes
// send (N-1)/N * S, broadcast sends S from the root (0 elsewhere), an exchange the bytes it sends, an
// all-to-all of S bytes per rank (N blocks) the (N-1)/N * S that leave the rank.
//
// The same bytes are also counted per link class (comm_link_bytes): a collective over a group whose ranks
// all run on one host (comm_local_size's host) counts as intra-host, one over a group spanning hosts as
// cross-host, whole (the ring's per-rank count, though some of a ring's hops stay inside a host); a message
// of an exchange by where its peer runs. So a group that never leaves a host sends no cross-host bytes.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_BROADCAST, COLL_SEND, COLL_ALLTOALL, NUM_COLLECTIVES
} Collective;

typedef enum { LINK_INTRA_HOST, LINK_CROSS_HOST, NUM_LINK_CLASSES } LinkClass;

typedef struct Comm Comm;

// The world: initializes MPI (a plain `./train_gpt_cpu` without mpirun is a world of one, an isolated
// singleton that starts no OpenMPI daemon beside it). argc/argv may be NULL. be: the backend whose memory the
// collectives will see (for staging). The hang watchdog is on from here, at COMM_WATCHDOG_DEFAULT in a long
// phase called "start-up", until comm_watchdog_start and comm_watchdog_phase say otherwise: only MPI_Init and
// the watchdog's own communicator come before it.
Comm* comm_init_world(int* argc, char*** argv);
void comm_attach_backend(Comm* c, Backend* be);   // before the first collective on backend memory
// A sub-group: ranks of `parent` with the same color, ordered by key (MPI_Comm_split, which has no
// nonblocking form: the ranks meet in a watched barrier first, so that one stopped before it is named).
// Inherits the backend.
// Collective over parent; a rank passing COMM_NO_GROUP joins none and gets NULL (and no NCCL communicator).
#define COMM_NO_GROUP (-1)
Comm* comm_split(Comm* parent, int color, int key);
int comm_rank(const Comm* c);
int comm_size(const Comm* c);
// Rank among the processes on this host (to pick a GPU), from the world communicator.
int comm_local_rank(const Comm* world);
// How many of the world's ranks run on this host (to share its cores), from the world communicator.
int comm_local_size(const Comm* world);
// The world rank of this host's lowest rank (0 on rank 0's host), from the world communicator: ranks with
// the same value share a host, and that rank speaks for it (node-local run directories, run_dir.h).
int comm_host_leader(const Comm* world);

// What moves backend memory in the bulk collectives (all-reduce, reduce-scatter, all-gather, broadcast,
// all-to-all) and the pipeline's exchanges. Barriers, host transfers and the host scalar reductions always
// go through MPI.
typedef enum { COMM_AUTO, COMM_MPI, COMM_NCCL } CommKind;
int comm_nccl_built(void);   // this binary can use NCCL (a GPU build linked with MPI and NCCL)
// Chooses for the world and every group split from it afterwards. COMM_AUTO: NCCL when it is built, the
// backend is a GPU and every rank has a GPU of its own, else MPI. COMM_NCCL where that does not hold is a
// one-line error (NCCL refuses two ranks on one GPU). Collective over the world with the same `want` on
// every rank; after comm_attach_backend, before comm_split and the first collective. Returns MPI or NCCL.
// With NCCL the collectives run on the backend's comm stream, behind the main stream's work so far, and the
// main stream waits for them (no host blocking; be_download waits), where MPI's return when done.
CommKind comm_select(Comm* world, CommKind want);
const char* comm_kind_name(CommKind k);

// buf (n elements of dt) = elementwise sum over the group, on every rank.
void comm_allreduce_sum(Comm* c, void* buf, size_t n, DType dt);
// buf (n fp32) = elementwise max over the group, on every rank (the vocabulary-parallel cross-entropy's
// row maxima). Counted as an all-reduce.
void comm_allreduce_max_f32(Comm* c, float* buf, size_t n);
// in holds size*n elements (rank k's slot = [k*n, (k+1)*n)); out (n) = the sum over ranks of slot `rank`.
// out may point at in + rank*n (in place).
void comm_reduce_scatter_sum(Comm* c, void* out, const void* in, size_t n, DType dt);
// buf holds size*n elements; each rank contributes its slot [rank*n, (rank+1)*n); afterwards every rank
// has every slot. In place.
void comm_allgather(Comm* c, void* buf, size_t n, DType dt);
// in holds size blocks of n elements, block j going to rank j; out (size*n) gets block i from rank i
// (rank r's out[i] = rank i's in[r]: the exchange that turns a sequence shard of every head into every
// position of a head shard). Out of place: out overlapping in is an error (NCCL's sends and receives run
// concurrently, so in place would race). Every rank passes the same n. Synchronous, like comm_allreduce_sum
// (so nothing is in flight for GPT_COMM_POISON to watch); split into MPI calls as the others are.
void comm_alltoall(Comm* c, void* out, const void* in, size_t n, DType dt);

// Asynchronous reduce-scatter and all-gather, for overlapping ZeRO's collectives with compute: the same
// arguments, results, bits and byte counts as the calls above (which are start + wait). Between start and
// comm_wait the caller must neither read nor write any byte of the buffers (in and out); after comm_wait,
// later work on the backend's main stream sees the result.
//   NCCL            enqueued on the comm stream behind the main stream's work so far; comm_wait makes the
//                   main stream wait for it; the host never blocks.
//   MPI, host       MPI nonblocking collectives on a private host copy of the data (taken at start);
//                   comm_wait completes them (MPI_Waitall) and writes the result into the buffer.
//   MPI, device     the same through host staging: start downloads (waiting for the main stream), comm_wait
//                   uploads. The copies make it a correctness path (several ranks on one GPU), not a fast one.
// At most COMM_MAX_IN_FLIGHT collectives per group are started and not yet waited for; one more is an
// error. Handles are plain values, and the slots behind them are reused, so the step allocates nothing
// once every slot has seen its largest transfer. A zeroed handle stands for nothing in flight; comm_wait
// clears the handle, and waiting on a cleared one returns at once. Handles of one group may be waited for
// in any order; every rank must start the group's collectives in the same order.
//
// Debug hook GPT_COMM_POISON=1 (the MPI path, host or staged device buffers; refused with NCCL): start
// fills what the collective will write with 0xff bytes (a NaN in every dtype) and comm_wait checks that
// nobody wrote into the buffers meanwhile (a one-line error), so reading a result before its wait or
// touching a buffer in flight cannot pass by luck.
#define COMM_MAX_IN_FLIGHT 16
typedef struct {
    int slot;
    uint32_t gen;   // 0: nothing in flight
} CommHandle;
// The cleared handle: no collective in flight (a group of one rank has nothing to start).
static inline CommHandle comm_no_handle(void) { return (CommHandle){.slot = 0, .gen = 0}; }
CommHandle comm_reduce_scatter_sum_start(Comm* c, void* out, const void* in, size_t n, DType dt);
CommHandle comm_allgather_start(Comm* c, void* buf, size_t n, DType dt);
void comm_wait(Comm* c, CommHandle* h);
void comm_broadcast(Comm* c, void* buf, size_t bytes, int root);

// Point-to-point, for the pipeline (core/pipeline/schedule.h's exchanges): one message of an exchange.
typedef struct {
    int send;      // 1: send buf to peer; 0: receive into buf from peer
    void* buf;     // backend memory, in no other message of the exchange
    size_t bytes;
    int peer;
    int tag;       // 0 .. 32767: names the message for the check below (NCCL has no tags)
} CommMessage;
// Posts the messages together; they complete together. A send completes only once its receive is posted
// (rendezvous, as NCCL's are: nothing is buffered), and the messages from one rank to another pair in the
// order both sides post them, across exchanges, whatever their tags. So the ranks' sequences of exchanges
// must be ones that cannot deadlock under those rules and that list each link's messages alike: the
// schedules of schedule.h, which tests/unit/test_schedule.c proves.
// An exchange that receives is complete when comm_exchange returns (NCCL: for later work on the main
// stream). One of sends only completes in the background, so that the compute after it overlaps the wait
// for the peer (NCCL: unless that compute waits for a collective, which queues behind it on the comm
// stream): the next comm_exchange on the group completes it before posting anything (exchanges complete
// in order, as on NCCL's one comm stream), or comm_exchange_finish does; until then its buffers must not
// be written. MPI (MPI_Issend, MPI_Irecv with any tag): a message that arrives where another was
// expected is a one-line error naming both tags (NCCL would silently deliver it into the wrong buffer); so
// is an exchange whose messages share memory. NCCL: one ncclGroupStart/End on the comm stream behind the
// main stream's work so far; the host never waits.
void comm_exchange(Comm* c, const CommMessage* msgs, int n);
void comm_exchange_finish(Comm* c);   // completes a pending exchange of sends (nothing if there is none)
// The exchange started, so that compute overlaps it (the ring attention's k|v passes): the same messages,
// checks, pairing rules, byte counts and link classes as comm_exchange, completed by comm_wait on the handle
// (receives delivered, sends done; for later work on the main stream with NCCL). Between start and comm_wait
// no byte of a receive's buffer may be read or written, and a send's buffer may be read but not written. It
// first completes a pending exchange of sends, as comm_exchange does; exchanges, started or not, pair in the
// order they are posted. It holds one of the group's COMM_MAX_IN_FLIGHT slots until its wait.
//   NCCL   one ncclGroupStart/End on the comm stream behind the main stream's work so far; comm_wait makes the
//          main stream wait for it; the host never blocks.
//   MPI    MPI_Issend and MPI_Irecv on the buffers themselves (host memory); device memory through the slot's
//          host copy, the sends downloaded at start and the receives uploaded at comm_wait.
// GPT_COMM_POISON=1 (MPI): every buffer goes through the host copy; start fills the receives' buffers with 0xff
// bytes and comm_wait checks that they still hold them and that the sends' buffers hold what they held at
// start (a one-line error naming the message), so reading a receive before its wait cannot pass by luck.
// No messages: the cleared handle.
CommHandle comm_exchange_start(Comm* c, const CommMessage* msgs, int n);
void comm_barrier(Comm* c);
// Host memory, always through MPI (never NCCL, never staged), not counted in the byte totals: what the
// checkpoints move between hosts (file contents, span lists, messages). send blocks until it is received.
void comm_broadcast_host(Comm* c, void* buf, size_t bytes, int root);
void comm_send_host(Comm* c, const void* buf, size_t bytes, int peer, int tag);
void comm_recv_host(Comm* c, void* buf, size_t bytes, int peer, int tag);
// Host scalars (losses, norms, flags): xs[i] = sum over ranks of xs[i]. Not counted in the byte totals
// (a few bytes per step) so the totals compare with the model-size formulas exactly.
void comm_allreduce_host_sum(Comm* c, double* xs, int n);
void comm_allreduce_host_max(Comm* c, double* xs, int n);
// The same for integers (flags, counts, ranks, steps, checksums): exact over all of long long, where a
// double holds integers exactly only up to 2^53. A sum that overflows long long is an error the caller
// must rule out, as in C.
void comm_allreduce_host_sum_i64(Comm* c, long long* xs, int n);
void comm_allreduce_host_max_i64(Comm* c, long long* xs, int n);
// Whether every rank of c passed the same value (a hash of what should be bit-identical across the group).
static inline int comm_all_equal(Comm* c, uint64_t v) {
    // max(x) and max(~x) = ~min(x) (~ never overflows): equal everywhere iff the max is the min.
    long long s = (long long)v, x[2] = {s, ~s};
    comm_allreduce_host_max_i64(c, x, 2);
    return x[0] == ~x[1];
}

// Hang watchdog (MPI; nothing to watch in a world of one). Every wait of this layer (collectives, exchanges,
// host transfers, barriers) polls its MPI requests, and meanwhile answers the other ranks' questions. With a
// timeout set, a wait that outlasts it asks every rank what it waits in: a rank that does not answer within a
// few seconds (watchdog.c: the ask window) is one that stopped (SIGSTOP, a frozen host, or work outside any
// wait for longer than the timeout), and the job ends, non-zero, with one line on stderr naming it, the rank
// that waited and what that rank waited in ("error: rank 1 stopped answering: rank 0 waited 30.0 s in
// all-reduce over the world (step 12: gradient norm)"). When every rank answers twice and none has moved on,
// they wait in operations that do not match, and the line lists them. Waits during a long phase (see
// comm_watchdog_phase) get COMM_WATCHDOG_LONG times the timeout. The job ends through MPI_Abort, after the
// line and after stdio's buffers are flushed; a checkpoint it interrupts has no DONE marker, so the previous
// one stays the newest complete one. NCCL's collectives (and its communicators' set-up) never block the
// host in this layer: they are not watched (watchdog.c says what is missing).
#define COMM_WATCHDOG_LONG 10
// The timeout from comm_init_world until comm_watchdog_start: -wd's default.
#define COMM_WATCHDOG_DEFAULT 300.0
// Every rank the same timeout, in seconds; 0: off. A program calls it as soon as it knows its own (the
// ranks may call it at different moments: only the waiting rank's timeout decides when it asks).
void comm_watchdog_start(Comm* world, double timeout_s);
// What this rank is doing from now on, for the watchdog's lines ("step 12: gradient norm", "checkpoint at
// step 20"). long_phase: work that may keep the other ranks waiting far longer than a training step (rank 0
// writing a checkpoint, an evaluation): every rank enters the phase at the same point, so the ones that wait
// know. Cheap (one snprintf); any rank, any time.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void comm_watchdog_phase(Comm* world, int long_phase, const char* fmt, ...);

// Bytes this rank sent through c, per collective, since the last reset.
uint64_t comm_bytes_sent(const Comm* c, Collective k);
// The same bytes by link class (the header says which), since the last reset.
uint64_t comm_link_bytes(const Comm* c, LinkClass l);
void comm_reset_bytes(Comm* c);
const char* collective_name(Collective k);
const char* link_class_name(LinkClass l);   // "intra_host", "cross_host"
// Whether every rank of c runs on one host.
int comm_on_one_host(const Comm* c);

void comm_free(Comm* c);       // a sub-group
void comm_finalize(Comm* world);   // MPI_Finalize; frees the world

#ifdef __cplusplus
}
#endif
