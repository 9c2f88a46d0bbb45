// nvme_store.h: -nvme DIR, ZeRO-Infinity's optimizer state on disk. A rank's fp32 master and optimizer state
// (the fp32 buffers the optimizer's description names, optimizer_kind.h: AdamW's m and v; and under
// -z 3 -offload 2 its working parameter pieces) live in files of its own directory under DIR instead
// of host memory; what host memory holds of them is a fixed pool of buffers, whatever the model's size.
//
// The state is cut into chunks: each unit's range of state indices (a piece under ZeRO >= 1) in pieces of
// at most -nvme-chunk elements, so a chunk never crosses a unit and a unit's parameters are whole chunks.
// state.bin holds chunk after chunk its master and state buffers, each padded to the I/O alignment so that one
// O_DIRECT transfer moves a chunk's record; params.bin holds the chunks' parameters in the run's dtype.
// Every chunk's checksum is kept in memory as it is written and compared with every read, so a file
// truncated or changed behind the run is one line, never values taken for state. A chunk never written
// reads as zeros.
//
// Three ways in, never at once on the same chunks:
//   a pass    the optimizer's: it holds chunk after chunk in increasing order (nvme_pass_hold) and reads
//             and writes their values in place (nvme_pass_view). The store reads ahead into the free
//             buffers of the pool and writes a chunk back when the pass moves past it, on worker threads:
//             the read of the next chunks and the write-back of the last overlap the update of this one.
//   copies    any range of one buffer to or from host memory (checkpoints, initialization, -dpu's landing),
//             through the pool used as a write-back cache; nvme_flush writes it out, and a pass or a
//             parameter read refuses to start while it holds unwritten values.
//   reads     of a unit's parameter pieces for the walk's gathers (nvme_read_params), into the caller's
//             buffer: they may run on one thread while a pass runs on another (-dpu), since a pass then
//             never writes parameters.
//
// The files are scratch: each run writes them from its model or checkpoint at start-up, never reads what an
// earlier run left, and removes them at the end; a lock in the directory (lock_file) keeps a second run out.
#pragma once
#include <stddef.h>

#include "core/model/memory.h"
#include "core/util/disk_io.h"
#include "kernels/kernels.h"

// What -nvme and -nvme-chunk say, and whose files these are.
typedef struct {
    const char* dir;       // the directory the user gave; this rank's files go into dir/gpt-nvme-rank<r>
    size_t chunk_elems;    // the most elements per chunk: a multiple of NVME_CHUNK_ALIGN
    int rank;              // world rank: names the subdirectory
} NvmeConfig;

#define NVME_CHUNK_DEFAULT ((size_t)1 << 20)
// A chunk of fp32 or 16-bit values is then a whole number of DISK_IO_ALIGN blocks.
#define NVME_CHUNK_ALIGN 2048
// Buffers in the pool: one being updated, one being written back, and reads ahead in the others.
#define NVME_BUFFERS 4

// The parts of a chunk: its parameters, then the optimizer's fp32 buffer i at NVME_MASTER + i (0: the
// master, 1 + k: state buffer k).
typedef enum { NVME_PARAMS, NVME_MASTER } NvmePart;

typedef struct NvmeStore NvmeStore;


// The store for ranges[i] = [begin[i], begin[i] + len[i]) of state indices (sorted, disjoint), each with
// `parts` fp32 buffers (the master and the state), whose working parameters (x bytes each) live on disk too
// when params_on_disk. Charges the pool to host_state
// and the files to disk_state; with be == NULL (zero_plan) it only charges and returns NULL. A full disk, a
// directory in use by another run or one that cannot be written to is a one-line error.
NvmeStore* nvme_open(Backend* be, MemLedger* mem, const NvmeConfig* cfg, const size_t* begin, const size_t* len, int ranges,
                     int parts, size_t x, int params_on_disk);
// Stops the workers, removes the files and frees the pool. Files or a directory already gone (removed
// behind the run, which kept them open) are one warning; any other failure to remove them is an error.
void nvme_close(NvmeStore* s, Backend* be);

// The bytes this rank's files take (the planner's, without a store).
size_t nvme_disk_bytes(const NvmeConfig* cfg, const size_t* len, int ranges, int parts, size_t x, int params_on_disk);
// The disk this rank's files of an earlier run (one that did not end cleanly) take, which nvme_open reuses.
unsigned long long nvme_reusable_bytes(const NvmeConfig* cfg);

// One line saying where the files are and how they are read and written.
const char* nvme_describe(const NvmeStore* s);

// Elements from state index `state` to the end of its chunk.
size_t nvme_chunk_left(const NvmeStore* s, size_t state);

// A pass over the chunks in increasing order. write_params: the pass writes the parameters of the chunks
// it holds (else only the master and the state).
void nvme_pass_begin(NvmeStore* s, int write_params);
// Holds the chunk of state index `state` (at or after the last one held): waits for its read and starts
// writing back the one held before.
void nvme_pass_hold(NvmeStore* s, size_t state);
// Host memory of part p at state index `state`, inside the chunk held.
void* nvme_pass_view(NvmeStore* s, NvmePart p, size_t state);
// Writes back the last chunk and waits for every write.
void nvme_pass_end(NvmeStore* s);

// n elements of part p from state index `state`, to or from host memory (see above).
void nvme_copy_out(NvmeStore* s, NvmePart p, size_t state, size_t n, void* dst);
void nvme_copy_in(NvmeStore* s, NvmePart p, size_t state, size_t n, const void* src);
void nvme_flush(NvmeStore* s);

// Reads the parameters of the whole chunks [state, state + n) into buf (DISK_IO_ALIGN-aligned, at least
// nvme_params_buffer_bytes(n)); returns where element `state` is in buf.
const void* nvme_read_params(NvmeStore* s, size_t state, size_t n, void* buf);
size_t nvme_params_buffer_bytes(size_t n, size_t x);

// Host memory aligned for O_DIRECT, charged to category c (be == NULL: only charged). Free the raw pointer.
void* nvme_host_alloc(Backend* be, MemLedger* mem, MemCategory c, size_t bytes, void** raw);

// The time the passes and copies since the last call spent (a pass's wall time less its waits is the host
// update), and zero it.
DiskTimes nvme_take_times(NvmeStore* s);
