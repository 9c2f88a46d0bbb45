// disk_io.c: see disk_io.h.
#include "core/util/disk_io.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/phase_timer.h"

#define MAX_WORKERS 8

// The queue is a ring of pointers to the callers' jobs; a caller never has more in flight than the store's
// pool allows, far below its size.
#define QUEUE_SIZE 256

struct DiskIo {
    pthread_mutex_t lock;
    pthread_cond_t queued;     // a job was queued, or stop
    pthread_cond_t finished;   // a job finished
    DiskJob* ring[QUEUE_SIZE];
    int head, count;
    int stop;
    long long writes;          // write jobs taken so far (fault injection)
    long long fail_write;
    int workers;
    pthread_t thread[MAX_WORKERS];
};

static void check_rc(int rc, const char* what) {
    if (rc != 0) fail("disk I/O: %s failed: %s", what, strerror(rc));
}
static void lock(DiskIo* io) { check_rc(pthread_mutex_lock(&io->lock), "pthread_mutex_lock"); }
static void unlock(DiskIo* io) { check_rc(pthread_mutex_unlock(&io->lock), "pthread_mutex_unlock"); }

uint64_t disk_checksum(const void* p, size_t bytes) {
    const uint64_t* w = (const uint64_t*)p;
    size_t n = bytes / 8, lanes = n / 8 * 8;
    uint64_t s[8] = {0}, q[8] = {0};
    for (size_t i = 0; i < lanes; i += 8)
        for (int k = 0; k < 8; k++) {
            s[k] += w[i + k];
            q[k] += s[k];
        }
    for (size_t i = lanes; i < n; i++) {   // at most 7 words
        s[i % 8] += w[i];
        q[i % 8] += s[i % 8];
    }
    uint64_t a = 0, b = n;
    for (int k = 0; k < 8; k++) {
        a = a * 0x100000001b3ull + s[k];
        b = b * 0x100000001b3ull + q[k];
    }
    return a ^ (b << 1 | b >> 63);
}

// pread/pwrite until `bytes` moved, an error, or (reading) the end of the file.
static void transfer(DiskJob* j, size_t bytes) {
    char* p = (char*)j->buf;
    while (j->got < bytes) {
        ssize_t r = j->write ? pwrite(j->fd, p + j->got, bytes - j->got, j->offset + (long long)j->got)
                             : pread(j->fd, p + j->got, bytes - j->got, j->offset + (long long)j->got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            j->err = errno;
            return;
        }
        if (r == 0) {   // reading past the end; a write of 0 bytes means no room
            if (j->write) j->err = ENOSPC;
            return;
        }
        j->got += (size_t)r;
    }
}

static void run_job(DiskJob* j, int fail_now) {
    double t0 = now_seconds();
    j->got = 0;
    j->err = 0;
    j->bad_sum = 0;
    if (j->write) {
        j->sum = disk_checksum(j->buf, j->bytes);
        transfer(j, fail_now ? j->bytes / 2 / DISK_IO_ALIGN * DISK_IO_ALIGN : j->bytes);
        if (fail_now && !j->err) j->err = ENOSPC;
    } else {
        transfer(j, j->bytes);
        if (!j->err && j->got == j->bytes && j->check) j->bad_sum = disk_checksum(j->buf, j->bytes) != j->sum;
    }
    j->seconds = now_seconds() - t0;
}

static void* worker(void* arg) {
    DiskIo* io = (DiskIo*)arg;
    lock(io);
    for (;;) {
        while (!io->count && !io->stop) check_rc(pthread_cond_wait(&io->queued, &io->lock), "pthread_cond_wait");
        if (!io->count) break;   // stopping, and nothing left
        DiskJob* j = io->ring[io->head];
        io->head = (io->head + 1) % QUEUE_SIZE;
        io->count--;
        int fail_now = j->write && ++io->writes == io->fail_write;
        unlock(io);
        run_job(j, fail_now);
        lock(io);
        j->done = 1;
        check_rc(pthread_cond_broadcast(&io->finished), "pthread_cond_broadcast");
    }
    unlock(io);
    return NULL;
}

DiskIo* disk_io_start(int workers, long long fail_write) {
    if (workers < 1 || workers > MAX_WORKERS) fail("internal: %d disk I/O workers (1..%d)", workers, MAX_WORKERS);
    DiskIo* io = (DiskIo*)xcalloc(1, sizeof(DiskIo));
    io->fail_write = fail_write;
    io->workers = workers;
    check_rc(pthread_mutex_init(&io->lock, NULL), "pthread_mutex_init");
    check_rc(pthread_cond_init(&io->queued, NULL), "pthread_cond_init");
    check_rc(pthread_cond_init(&io->finished, NULL), "pthread_cond_init");
    for (int i = 0; i < workers; i++) check_rc(pthread_create(&io->thread[i], NULL, worker, io), "starting a disk I/O worker");
    return io;
}

void disk_io_stop(DiskIo* io) {
    if (!io) return;
    lock(io);
    io->stop = 1;
    check_rc(pthread_cond_broadcast(&io->queued), "pthread_cond_broadcast");
    unlock(io);
    for (int i = 0; i < io->workers; i++) check_rc(pthread_join(io->thread[i], NULL), "joining a disk I/O worker");
    check_rc(pthread_cond_destroy(&io->queued), "pthread_cond_destroy");
    check_rc(pthread_cond_destroy(&io->finished), "pthread_cond_destroy");
    check_rc(pthread_mutex_destroy(&io->lock), "pthread_mutex_destroy");
    free(io);
}

void disk_io_submit(DiskIo* io, DiskJob* job) {
    job->done = 0;
    lock(io);
    if (io->count == QUEUE_SIZE) fail("internal: more than %d disk jobs queued", QUEUE_SIZE);
    io->ring[(io->head + io->count) % QUEUE_SIZE] = job;
    io->count++;
    check_rc(pthread_cond_signal(&io->queued), "pthread_cond_signal");
    unlock(io);
}

int disk_io_done(DiskIo* io, DiskJob* job) {
    lock(io);
    int done = job->done;
    unlock(io);
    return done;
}

void disk_io_wait(DiskIo* io, DiskJob* job) {
    lock(io);
    while (!job->done) check_rc(pthread_cond_wait(&io->finished, &io->lock), "pthread_cond_wait");
    unlock(io);
}

void disk_job_run_here(DiskJob* job) {
    run_job(job, 0);
    job->done = 1;
}

void disk_io_run(DiskIo* io, DiskJob* job) {
    disk_io_submit(io, job);
    disk_io_wait(io, job);
}
