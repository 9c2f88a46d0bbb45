// bench_nvme.c: -nvme's host update (the optimizer's pass over state on disk, core/zero/nvme_store.h, through
// the trainer's own adamw_host_spans) against the disk it streams through, measured in the same run, and
// against the same update on state in host memory (-offload without -nvme).
//   bench_nvme DIR [N_PARAMS] [fp32|bf16] [CHUNK]
// The disk's floor: the bytes one pass must read (master, m, v) and write (those and the working copy) at
// the sequential bandwidth that O_DIRECT transfers of the pass's own size reach on DIR's disk, two at a
// time as the store moves them: read and write streams measured apart (their times added), and the two
// streams at once (a disk that reads and writes at the same time beats the sum). The parameters live on
// disk too, as under -offload 2 -z 3. One line per measurement, then a JSON summary line.
#define _GNU_SOURCE   // O_DIRECT
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/disk_io.h"
#include "core/util/fs.h"
#include "core/util/phase_timer.h"
#include "core/zero/optimizer.h"

#define PASSES 3
// fp32 buffers per parameter on disk: the master and AdamW's state, as its description names them.
#define ADAMW_PARTS optimizer_buffers(optimizer_kind(OPT_ADAMW))

static float* filled(size_t n, float base) {
    float* p = (float*)xmalloc(n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = base + 1e-7f * (float)(i % 1000);
    return p;
}

// One sequential stream of transfers through a file, two buffers of its own.
typedef struct {
    int fd, write;
    char* buf[2];
    size_t bytes, off;
    DiskJob job[2];
    int busy[2];
} Stream;

// Waits for buffer k's transfer, if any, then starts the next one; returns whether the stream goes on.
static int stream_step(DiskIo* io, Stream* st, int k, size_t io_bytes) {
    DiskJob* j = &st->job[k];
    if (st->busy[k]) {
        disk_io_wait(io, j);
        if (j->err || j->got != j->bytes) fail("bench_nvme: a %s failed: %s", st->write ? "write" : "read", j->err ? strerror(j->err) : "short");
        st->busy[k] = 0;
    }
    if (st->off >= st->bytes) return st->busy[1 - k];
    size_t n = st->bytes - st->off < io_bytes ? st->bytes - st->off : io_bytes;
    *j = (DiskJob){.fd = st->fd, .write = st->write, .buf = st->buf[k], .bytes = (n + 4095) / 4096 * 4096, .offset = (long long)st->off};
    disk_io_submit(io, j);
    st->busy[k] = 1;
    st->off += n;
    return 1;
}

// Seconds for the streams to run together, their transfers taking turns on the workers.
static double run_streams(DiskIo* io, Stream* st, int n, size_t io_bytes) {
    double t0 = now_seconds();
    for (int going = 1, k = 0; going; k = 1 - k) {
        going = 0;
        for (int i = 0; i < n; i++) going |= stream_step(io, &st[i], k, io_bytes);
    }
    return now_seconds() - t0;   // no fdatasync: the pass's O_DIRECT writes are not synced either (scratch files)
}

static int open_direct(const char* dir, const char* name) {
    char path[4096];
    path_join(path, sizeof(path), dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) fail("bench_nvme: cannot create %s with O_DIRECT: %s", path, strerror(errno));
    if (unlink(path) != 0) fail("bench_nvme: cannot remove %s: %s", path, strerror(errno));   // gone when closed
    return fd;
}

typedef struct {
    double write_bw, read_bw;   // bytes per second, each stream alone
    double together;            // seconds to read read_bytes and write write_bytes at once
} DiskSpeed;

// The disk's best over two rounds: a write stream alone, a read stream alone, and the pass's reads and
// writes at once (two files; the workers move two transfers at a time, as the store's do).
static DiskSpeed disk_speed(const char* dir, size_t io_bytes, size_t read_bytes, size_t write_bytes) {
    char* bufs[4];
    for (int b = 0; b < 4; b++) {
        if (posix_memalign((void**)&bufs[b], 4096, io_bytes + 4096) != 0) fail("bench_nvme: out of memory");
        memset(bufs[b], 0x3c, io_bytes + 4096);
    }
    int a = open_direct(dir, "bench-a.bin"), b = open_direct(dir, "bench-b.bin");
    DiskIo* io = disk_io_start(2, 0);
    DiskSpeed best = {0.0, 0.0, 1e30};
    for (int round = 0; round < 2; round++) {
        Stream w = {.fd = a, .write = 1, .buf = {bufs[0], bufs[1]}, .bytes = write_bytes};
        Stream r = {.fd = a, .buf = {bufs[0], bufs[1]}, .bytes = read_bytes};
        Stream both[2] = {{.fd = a, .buf = {bufs[0], bufs[1]}, .bytes = read_bytes},
                          {.fd = b, .write = 1, .buf = {bufs[2], bufs[3]}, .bytes = write_bytes}};
        double wt = run_streams(io, &w, 1, io_bytes), rt = run_streams(io, &r, 1, io_bytes), bt = run_streams(io, both, 2, io_bytes);
        printf("disk round %d: write %.2f GB/s, read %.2f GB/s, both at once %.3f s (%.1f MiB transfers, O_DIRECT)\n", round,
               (double)write_bytes / wt / 1e9, (double)read_bytes / rt / 1e9, bt, (double)io_bytes / (1 << 20));
        best.write_bw = (double)write_bytes / wt > best.write_bw ? (double)write_bytes / wt : best.write_bw;
        best.read_bw = (double)read_bytes / rt > best.read_bw ? (double)read_bytes / rt : best.read_bw;
        best.together = bt < best.together ? bt : best.together;
    }
    disk_io_stop(io);
    if (close(a) != 0 || close(b) != 0) fail("bench_nvme: close: %s", strerror(errno));
    for (int k = 0; k < 4; k++) free(bufs[k]);
    return best;
}

typedef struct {
    ParamTensor t;
    StateSpan span;
    StepArgs args;
} Update;

static void update_of(Update* u, size_t n, float* grads) {
    *u = (Update){.t = {.size = n, .run = n, .stride = n, .decay = 1}};
    u->span = (StateSpan){.t = &u->t, .n = n, .grad = grads, .grad_dt = DT_FP32};
    u->args.adamw = (AdamWArgs){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 1.0f, .seed = 1337};
}

static double median(double* v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v[n / 2];
}

// The pass over state on disk: a first one writes the files, then PASSES timed. Returns the median pass and
// fills its disk times.
static double disk_passes(Backend* be, const char* dir, size_t n, DType dt, size_t chunk, float* grads, DiskTimes* med) {
    MemLedger mem = {{0}};
    NvmeConfig cfg = {.dir = dir, .chunk_elems = chunk};
    size_t begin = 0;
    NvmeStore* s = nvme_open(be, &mem, &cfg, &begin, &n, 1, ADAMW_PARTS, dtype_size(dt), 1);
    printf("%s (pool %.1f MiB of host memory)\n", nvme_describe(s), (double)mem.bytes[MEM_HOST_STATE] / (1 << 20));
    ModelState ms = {.dt = dt, .places = {.params = IN_DISK, .state = IN_DISK, .grads = IN_HOST}, .disk = s};
    Update u;
    update_of(&u, n, grads);
    double pass[PASSES], read[PASSES], write[PASSES], wait[PASSES];
    for (int p = -1; p < PASSES; p++) {
        u.args.adamw.step = p + 2;
        optimizer_host_spans(&ms, NULL, &u.span, 1, &u.args);
        DiskTimes t = nvme_take_times(s);
        if (p < 0) continue;
        pass[p] = t.pass, read[p] = t.read, write[p] = t.write, wait[p] = t.wait;
        printf("nvme pass %d: %.3f s (read %.3f s, write %.3f s on the workers; update %.3f s, waiting for the disk %.3f s)\n", p, t.pass,
               t.read, t.write, t.pass - t.wait, t.wait);
    }
    *med = (DiskTimes){.read = median(read, PASSES), .write = median(write, PASSES), .wait = median(wait, PASSES)};
    nvme_close(s, be);
    return median(pass, PASSES);
}

// The same update on state in host memory.
static double host_passes(size_t n, DType dt, float* grads) {
    float *master = filled(n, 0.1f), *m = filled(n, 0.0f), *v = filled(n, 0.0f);
    void* params = xcalloc(n, dtype_size(dt));
    ModelState ms = {.dt = dt, .places = {.params = IN_HOST, .state = IN_HOST, .grads = IN_HOST}};
    Update u;
    update_of(&u, n, grads);
    u.span.master = master, u.span.opt_state[0] = m, u.span.opt_state[1] = v, u.span.params = params;
    double pass[PASSES];
    for (int p = -1; p < PASSES; p++) {   // the first touches the pages
        u.args.adamw.step = p + 2;
        double t0 = now_seconds();
        optimizer_host_spans(&ms, NULL, &u.span, 1, &u.args);
        if (p >= 0) pass[p] = now_seconds() - t0;
        if (p >= 0) printf("host-memory pass %d: %.3f s\n", p, pass[p]);
    }
    free(master), free(m), free(v), free(params);
    return median(pass, PASSES);
}

int main(int argc, char** argv) {
    if (argc < 2) fail("usage: bench_nvme DIR [N_PARAMS] [fp32|bf16] [CHUNK]");
    const char* dir = argv[1];
    size_t n = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 124475904;   // GPT-2 124M
    DType dt = argc > 3 && !strcmp(argv[3], "bf16") ? DT_BF16 : DT_FP32;
    size_t chunk = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : NVME_CHUNK_DEFAULT;
    if (n == 0 || chunk == 0 || chunk % NVME_CHUNK_ALIGN) fail("bench_nvme: N_PARAMS > 0, CHUNK a multiple of %d", NVME_CHUNK_ALIGN);
    make_dirs(dir);
    Backend* be = backend_create(0);
    NvmeConfig cfg = {.dir = dir, .chunk_elems = chunk};
    size_t rd = nvme_disk_bytes(&cfg, &n, 1, ADAMW_PARTS, dtype_size(dt), 0),
           wr = nvme_disk_bytes(&cfg, &n, 1, ADAMW_PARTS, dtype_size(dt), 1);
    DiskSpeed disk = disk_speed(dir, (size_t)ADAMW_PARTS * ((chunk * 4 + 4095) / 4096 * 4096), rd, wr);
    double apart = (double)rd / disk.read_bw + (double)wr / disk.write_bw;
    float* grads = filled(n, 0.01f);
    DiskTimes t;
    double nvme_s = disk_passes(be, dir, n, dt, chunk, grads, &t), host_s = host_passes(n, dt, grads);
    printf("%zu params (%s), %d threads: the pass reads %.2f GB and writes %.2f GB. The disk: %.2f GB/s read, %.2f GB/s write, "
           "%.3f s for both one after the other, %.3f s at once. nvme pass %.3f s (median): %.0f%% of the disk's sequential "
           "bandwidth (reads and writes apart), %.0f%% of it at once; %.0f M params/s. Host-memory update %.3f s (%.0f M params/s): "
           "the disk's pass takes %.1fx as long\n", n, dtype_name(dt), omp_get_max_threads(), (double)rd / 1e9, (double)wr / 1e9,
           disk.read_bw / 1e9, disk.write_bw / 1e9, apart, disk.together, nvme_s, 100.0 * apart / nvme_s, 100.0 * disk.together / nvme_s,
           (double)n / nvme_s / 1e6, host_s, (double)n / host_s / 1e6, nvme_s / host_s);
    printf("{\"params\": %zu, \"dtype\": \"%s\", \"threads\": %d, \"chunk\": %zu, \"read_bytes\": %zu, \"write_bytes\": %zu, "
           "\"disk_read_gbs\": %.3f, \"disk_write_gbs\": %.3f, \"disk_apart_s\": %.4f, \"disk_together_s\": %.4f, "
           "\"nvme_pass_s\": %.4f, \"nvme_read_s\": %.4f, \"nvme_write_s\": %.4f, \"nvme_wait_s\": %.4f, \"host_pass_s\": %.4f, "
           "\"of_disk_apart\": %.3f, \"of_disk_together\": %.3f}\n",
           n, dtype_name(dt), omp_get_max_threads(), chunk, rd, wr, disk.read_bw / 1e9, disk.write_bw / 1e9, apart, disk.together, nvme_s,
           t.read, t.write, t.wait, host_s, apart / nvme_s, disk.together / nvme_s);
    free(grads);
    backend_destroy(be);
    return 0;
}
