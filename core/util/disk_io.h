// disk_io.h: reads and writes of whole buffers at file offsets, run by worker threads so that the caller
// computes while the disk works (-nvme's state store, core/zero/nvme_store.h). Each job moves one buffer
// with pread/pwrite, looping over partial transfers, and checks it: a write records the buffer's checksum,
// a read compares the bytes it got with the checksum the caller expects. Errors are recorded in the job,
// never raised by a worker: the thread that waits for a job reports it, in its own words.
//
// With O_DIRECT (the caller's choice when it opens the file) the buffer, the offset and the length must be
// multiples of DISK_IO_ALIGN.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DISK_IO_ALIGN 4096

typedef struct DiskIo DiskIo;

// Where a stream of jobs spent its time: in reads and writes on the workers, waiting for them on the thread
// that issued them, and that thread's whole wall time for the stream (whose rest is its own work).
typedef struct {
    double read, write, wait, pass;
} DiskTimes;

typedef struct {
    // set by the caller before disk_io_submit
    int fd;
    int write;           // 1: pwrite the buffer, 0: pread into it
    void* buf;
    size_t bytes;
    long long offset;
    int check;           // a read: compare the checksum of what was read with `sum`
    uint64_t sum;        // a write: set to the checksum of what was written; a read: the one expected
    // set by the worker, readable once disk_io_done / disk_io_wait say so
    int done;
    int err;             // errno of the failing call; 0 when the transfer completed
    size_t got;          // bytes transferred (less than `bytes` only on error or end of file)
    int bad_sum;         // a checked read whose bytes do not match `sum`
    double seconds;      // in the system calls and the checksum
} DiskJob;

// Starts `workers` threads. fail_write > 0 makes the fail_write-th write job (counted from here) write half
// its bytes and then fail with ENOSPC, as on a disk that fills up mid-write (tests; 0: never).
DiskIo* disk_io_start(int workers, long long fail_write);
// Waits for every job queued, then stops the workers.
void disk_io_stop(DiskIo* io);

// Queues the job (it must stay in place until done); jobs start in the order queued.
void disk_io_submit(DiskIo* io, DiskJob* job);
// Whether the job has finished (without waiting), and waiting for it.
int disk_io_done(DiskIo* io, DiskJob* job);
void disk_io_wait(DiskIo* io, DiskJob* job);
// Submits and waits.
void disk_io_run(DiskIo* io, DiskJob* job);
// Runs the job on the calling thread instead (never made to fail).
void disk_job_run_here(DiskJob* job);

// The checksum jobs use: a Fletcher-style 64-bit sum over 8-byte words, in eight independent lanes so that
// it vectorizes: cheap enough to check every byte the disk moves without slowing the disk's stream, and a
// change of any word or a swap of two words changes it. bytes must be a multiple of 8.
uint64_t disk_checksum(const void* p, size_t bytes);
