// nvme_store.c: see nvme_store.h.
#define _GNU_SOURCE   // O_DIRECT
#include "core/zero/nvme_store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/fs.h"
#include "core/util/phase_timer.h"

// Two workers: a chunk's read and the last chunk's write-back in flight together.
#define IO_WORKERS 2

// A chunk's two regions: its record (the store's `parts` fp32 buffers) in state.bin, its parameters in params.bin.
enum { REC_STATE, REC_PARAMS, REGIONS };

typedef struct {
    size_t state, n;          // state indices [state, state + n)
    long long off[REGIONS];   // where each region starts in its file
    size_t bytes[REGIONS];    // the record: its parts; the parameters padded to the alignment
    size_t part;              // bytes of each fp32 buffer: 4n padded to the alignment
    uint64_t sum[REGIONS];    // each region's checksum as last written
    int written[REGIONS];
} Chunk;

// A pool buffer's life. In a pass: FREE -> READING (its chunk's record on the way in) -> READY -> HELD (the
// optimizer updates it) -> WRITING (on its way out) -> FREE. Between passes a buffer may be CACHED (the
// copies' write-back cache) until the next pass lets it go.
typedef enum { BUF_FREE, BUF_READING, BUF_READY, BUF_HELD, BUF_WRITING, BUF_CACHED } BufState;

typedef struct {
    char* mem;                 // a record (state_cap bytes), then a chunk's parameters (params_cap)
    BufState state;
    int chunk;
    DiskJob job[REGIONS];
    int busy[REGIONS];         // job submitted and not yet accounted for
    int have[REGIONS];         // CACHED: the region holds the chunk's values
    int dirty[REGIONS];        // CACHED: and they changed since it was read or written
    unsigned long long used;   // CACHED: the copy that used it last (eviction order)
} PoolBuf;

struct NvmeStore {
    char dir[PATH_MAX], path[REGIONS][PATH_MAX], lock_path[PATH_MAX];
    char description[2 * PATH_MAX];
    int fd[REGIONS];           // -1 for params.bin without parameters on disk
    int lock_fd;
    Chunk* chunks;
    int num_chunks;
    size_t x;                  // bytes per working parameter
    int parts;                 // fp32 buffers in a record
    int params_on_disk;
    size_t state_cap, params_cap;
    void* pool_raw;
    PoolBuf buf[NVME_BUFFERS];
    DiskIo* io;
    int in_pass, write_params;
    PoolBuf* held;             // the pass's chunk, or NULL
    int next_read;             // the next chunk the pass reads ahead
    double pass_start;
    int cache_dirty;           // some CACHED buffer holds values not yet written
    unsigned long long clock;
    DiskTimes times;
};

static size_t align_up(size_t b) { return (b + DISK_IO_ALIGN - 1) / DISK_IO_ALIGN * DISK_IO_ALIGN; }

// ---------------------------------------------------------------------------------------------------
// Geometry: which chunks, where in the files.

// Cuts each range into chunks of at most chunk_elems elements and places them one after the other in the
// two files (bytes: their sizes); fills chunks unless NULL. Returns the number of chunks.
static int lay_out(size_t chunk_elems, const size_t* begin, const size_t* len, int ranges, int parts, size_t x, Chunk* chunks,
                   long long bytes[REGIONS]) {
    int k = 0;
    bytes[REC_STATE] = bytes[REC_PARAMS] = 0;
    for (int r = 0; r < ranges; r++)
        for (size_t i = 0; i < len[r]; i += chunk_elems, k++) {
            size_t n = len[r] - i < chunk_elems ? len[r] - i : chunk_elems, part = align_up(n * 4);
            Chunk c = {.state = chunks ? begin[r] + i : 0, .n = n, .off = {bytes[REC_STATE], bytes[REC_PARAMS]},
                       .bytes = {(size_t)parts * part, align_up(n * x)}, .part = part};
            if (chunks) chunks[k] = c;
            bytes[REC_STATE] += (long long)c.bytes[REC_STATE];
            bytes[REC_PARAMS] += (long long)c.bytes[REC_PARAMS];
        }
    return k;
}

static size_t largest_chunk(size_t chunk_elems, const size_t* len, int ranges) {
    size_t m = 0;
    for (int r = 0; r < ranges; r++) m = len[r] > m ? len[r] : m;
    return m < chunk_elems ? m : chunk_elems;
}

size_t nvme_disk_bytes(const NvmeConfig* cfg, const size_t* len, int ranges, int parts, size_t x, int params_on_disk) {
    long long bytes[REGIONS];
    lay_out(cfg->chunk_elems, NULL, len, ranges, parts, x, NULL, bytes);
    return (size_t)bytes[REC_STATE] + (params_on_disk ? (size_t)bytes[REC_PARAMS] : 0);
}

size_t nvme_params_buffer_bytes(size_t n, size_t x) { return align_up(n * x); }

// The chunk holding state index `state`.
static int chunk_of(const NvmeStore* s, size_t state) {
    int lo = 0, hi = s->num_chunks - 1;
    while (lo < hi) {   // the first chunk that ends after `state`
        int mid = (lo + hi) / 2;
        if (s->chunks[mid].state + s->chunks[mid].n > state) hi = mid;
        else lo = mid + 1;
    }
    const Chunk* c = &s->chunks[lo];
    if (s->num_chunks == 0 || state < c->state || state >= c->state + c->n) fail("internal: state index %zu is in no chunk", state);
    return lo;
}

size_t nvme_chunk_left(const NvmeStore* s, size_t state) {
    const Chunk* c = &s->chunks[chunk_of(s, state)];
    return c->state + c->n - state;
}

static char* region_mem(const NvmeStore* s, PoolBuf* b, int region) { return b->mem + (region == REC_PARAMS ? s->state_cap : 0); }

// Part p at state index `state` of chunk c, in buffer b.
static char* part_at(const NvmeStore* s, PoolBuf* b, const Chunk* c, NvmePart p, size_t state) {
    size_t i = state - c->state;
    if (p == NVME_PARAMS) return region_mem(s, b, REC_PARAMS) + i * s->x;
    if ((int)(p - NVME_MASTER) >= s->parts) fail("internal: -nvme part %d of a store of %d", (int)(p - NVME_MASTER), s->parts);
    return b->mem + (size_t)(p - NVME_MASTER) * c->part + i * 4;
}

// ---------------------------------------------------------------------------------------------------
// Transfers and their failures.

// A failed transfer in one line: the file, where, and what the user can do. The files are scratch: the
// checkpoints in -o never depend on them.
static void check_job(const NvmeStore* s, int region, int chunk, const DiskJob* j) {
    if (!j->err && j->got == j->bytes && !j->bad_sum) return;
    const char* file = s->path[region];
    const char* after = "checkpoints in -o are not affected: resume from the last one with -y 1";
    if (j->err == ENOSPC || j->err == EDQUOT)
        fail("-nvme: no space left on the filesystem of %s writing chunk %d (%zu bytes at byte %lld): the step stops here, "
             "its state half-written is never read again; %s once there is room", file, chunk, j->bytes, j->offset, after);
    if (j->err)
        fail("-nvme: cannot %s %s (chunk %d, %zu bytes at byte %lld): %s; %s", j->write ? "write" : "read", file, chunk, j->bytes,
             j->offset, strerror(j->err), after);
    if (j->got < j->bytes)
        fail("-nvme: %s ends at byte %lld, inside chunk %d (%zu bytes at byte %lld): it was truncated behind the run; %s", file,
             j->offset + (long long)j->got, chunk, j->bytes, j->offset, after);
    fail("-nvme: %s changed behind the run: chunk %d (%zu bytes at byte %lld) does not match the checksum it was written "
         "with; %s", file, chunk, j->bytes, j->offset, after);
}

static void start_job(NvmeStore* s, PoolBuf* b, int region, int write) {
    const Chunk* c = &s->chunks[b->chunk];
    b->job[region] = (DiskJob){.fd = s->fd[region], .write = write, .buf = region_mem(s, b, region), .bytes = c->bytes[region],
                               .offset = c->off[region], .check = !write, .sum = c->sum[region]};
    b->busy[region] = 1;
    disk_io_submit(s->io, &b->job[region]);
}

// A finished job: checked, and accounted for (a write's checksum becomes the chunk's).
static void finish_job(NvmeStore* s, PoolBuf* b, int region) {
    DiskJob* j = &b->job[region];
    check_job(s, region, b->chunk, j);
    Chunk* c = &s->chunks[b->chunk];
    if (j->write) {
        c->sum[region] = j->sum;
        c->written[region] = 1;
        s->times.write += j->seconds;
    } else {
        s->times.read += j->seconds;
    }
    b->busy[region] = 0;
}

// Waits for b's transfers (in a pass, the time counts as its wait for the disk).
static void wait_buf(NvmeStore* s, PoolBuf* b) {
    double t0 = now_seconds();
    for (int r = 0; r < REGIONS; r++) {
        if (!b->busy[r]) continue;
        disk_io_wait(s->io, &b->job[r]);
        finish_job(s, b, r);
    }
    if (s->in_pass) s->times.wait += now_seconds() - t0;
}

// Whether b's transfers are done (accounting for them if so), without waiting.
static int buf_done(NvmeStore* s, PoolBuf* b) {
    for (int r = 0; r < REGIONS; r++)
        if (b->busy[r] && !disk_io_done(s->io, &b->job[r])) return 0;
    for (int r = 0; r < REGIONS; r++)
        if (b->busy[r]) finish_job(s, b, r);
    return 1;
}

// ---------------------------------------------------------------------------------------------------
// The pass.

static PoolBuf* buf_in(NvmeStore* s, BufState st) {
    for (int i = 0; i < NVME_BUFFERS; i++)
        if (s->buf[i].state == st) return &s->buf[i];
    return NULL;
}

static void reap_writes(NvmeStore* s) {
    for (int i = 0; i < NVME_BUFFERS; i++)
        if (s->buf[i].state == BUF_WRITING && buf_done(s, &s->buf[i])) s->buf[i].state = BUF_FREE;
}

// A free buffer, waiting for a write-back to finish if every buffer is busy with one.
static PoolBuf* wait_free_buf(NvmeStore* s) {
    for (;;) {
        reap_writes(s);
        PoolBuf* b = buf_in(s, BUF_FREE);
        if (b) return b;
        b = buf_in(s, BUF_WRITING);
        if (!b) fail("internal: no pool buffer to read into");
        wait_buf(s, b);
        b->state = BUF_FREE;
    }
}

// A chunk never written holds zeros: nothing to read. A pass that writes parameters writes the whole region,
// the padding the update skips included: zeros, not what the buffer held before.
static void start_read(NvmeStore* s, PoolBuf* b, int k) {
    b->chunk = k;
    b->state = BUF_READING;
    if (s->write_params) memset(region_mem(s, b, REC_PARAMS), 0, s->chunks[k].bytes[REC_PARAMS]);
    if (s->chunks[k].written[REC_STATE]) start_job(s, b, REC_STATE, 0);
    else memset(b->mem, 0, s->chunks[k].bytes[REC_STATE]);
}

static void read_ahead(NvmeStore* s) {
    reap_writes(s);
    PoolBuf* b;
    while (s->next_read < s->num_chunks && (b = buf_in(s, BUF_FREE)) != NULL) start_read(s, b, s->next_read++);
}

void nvme_pass_begin(NvmeStore* s, int write_params) {
    if (s->in_pass) fail("internal: a pass over the -nvme state started inside another");
    if (s->cache_dirty) fail("internal: a pass over the -nvme state started before copied values were flushed");
    if (write_params && !s->params_on_disk) fail("internal: a pass writes parameters the store does not hold");
    for (int i = 0; i < NVME_BUFFERS; i++)
        if (s->buf[i].state == BUF_CACHED) s->buf[i].state = BUF_FREE;
    s->in_pass = 1;
    s->write_params = write_params;
    s->held = NULL;
    s->next_read = 0;
    s->pass_start = now_seconds();
    read_ahead(s);
}

static void write_back(NvmeStore* s, PoolBuf* b) {
    b->state = BUF_WRITING;
    start_job(s, b, REC_STATE, 1);
    if (s->write_params) start_job(s, b, REC_PARAMS, 1);
}

// Chunks read ahead but passed over (no span of the pass in them: a piece of padding) are let go unwritten.
static void drop_before(NvmeStore* s, int k) {
    for (int i = 0; i < NVME_BUFFERS; i++) {
        PoolBuf* b = &s->buf[i];
        if ((b->state != BUF_READING && b->state != BUF_READY) || b->chunk >= k) continue;
        wait_buf(s, b);
        b->state = BUF_FREE;
    }
}

static PoolBuf* read_buf_of(NvmeStore* s, int k) {
    for (int i = 0; i < NVME_BUFFERS; i++)
        if ((s->buf[i].state == BUF_READING || s->buf[i].state == BUF_READY) && s->buf[i].chunk == k) return &s->buf[i];
    return NULL;
}

void nvme_pass_hold(NvmeStore* s, size_t state) {
    int k = chunk_of(s, state);
    if (!s->in_pass) fail("internal: a chunk of the -nvme state held outside a pass");
    if (s->held && s->held->chunk == k) return;
    if (s->held && s->held->chunk > k) fail("internal: a pass went back from chunk %d to %d", s->held->chunk, k);
    if (s->held) write_back(s, s->held);
    s->held = NULL;
    drop_before(s, k);
    PoolBuf* b = read_buf_of(s, k);
    if (!b) {   // not read ahead yet: the reads in between would be of chunks the pass skips
        s->next_read = k + 1;
        b = wait_free_buf(s);
        start_read(s, b, k);
    }
    wait_buf(s, b);
    b->state = BUF_HELD;
    s->held = b;
    read_ahead(s);
}

void* nvme_pass_view(NvmeStore* s, NvmePart p, size_t state) {
    if (!s->held) fail("internal: -nvme state read outside a held chunk");
    const Chunk* c = &s->chunks[s->held->chunk];
    if (state < c->state || state >= c->state + c->n) fail("internal: state index %zu outside the chunk held", state);
    return part_at(s, s->held, c, p, state);
}

void nvme_pass_end(NvmeStore* s) {
    if (!s->in_pass) fail("internal: a pass over the -nvme state ended twice");
    if (s->held) write_back(s, s->held);
    s->held = NULL;
    for (int i = 0; i < NVME_BUFFERS; i++) {
        if (s->buf[i].state == BUF_FREE) continue;
        wait_buf(s, &s->buf[i]);
        s->buf[i].state = BUF_FREE;
    }
    s->times.pass += now_seconds() - s->pass_start;
    s->in_pass = 0;
}

// ---------------------------------------------------------------------------------------------------
// The copies, through the pool as a write-back cache.

static void flush_buf(NvmeStore* s, PoolBuf* b) {
    for (int r = 0; r < REGIONS; r++)
        if (b->dirty[r]) start_job(s, b, r, 1);
    wait_buf(s, b);
    b->dirty[REC_STATE] = b->dirty[REC_PARAMS] = 0;
}

// The cache entry of chunk k: an entry already there, else a free buffer, else the least recently used one
// (written out first if it changed).
static PoolBuf* cache_entry(NvmeStore* s, int k) {
    PoolBuf* victim = NULL;
    for (int i = 0; i < NVME_BUFFERS; i++) {
        PoolBuf* b = &s->buf[i];
        if (b->state == BUF_CACHED && b->chunk == k) return b;
        if (b->state == BUF_FREE) victim = b;
        else if (!victim || (victim->state == BUF_CACHED && b->used < victim->used)) victim = b;
    }
    if (victim->state == BUF_CACHED) flush_buf(s, victim);
    *victim = (PoolBuf){.mem = victim->mem, .state = BUF_CACHED, .chunk = k};
    return victim;
}

static void cache_load(NvmeStore* s, PoolBuf* b, int region) {
    if (b->have[region]) return;
    const Chunk* c = &s->chunks[b->chunk];
    if (c->written[region]) {
        start_job(s, b, region, 0);
        wait_buf(s, b);
    } else {
        memset(region_mem(s, b, region), 0, c->bytes[region]);
    }
    b->have[region] = 1;
}

static void copy_range(NvmeStore* s, NvmePart p, size_t state, size_t n, char* host, int in) {
    int region = p == NVME_PARAMS ? REC_PARAMS : REC_STATE;
    size_t esize = p == NVME_PARAMS ? s->x : 4;
    if (s->in_pass) fail("internal: -nvme state copied during a pass");
    if (region == REC_PARAMS && !s->params_on_disk) fail("internal: parameters copied from a store without them");
    while (n > 0) {
        int k = chunk_of(s, state);
        const Chunk* c = &s->chunks[k];
        size_t m = c->state + c->n - state < n ? c->state + c->n - state : n;
        PoolBuf* b = cache_entry(s, k);
        cache_load(s, b, region);
        b->used = ++s->clock;
        char* at = part_at(s, b, c, p, state);
        if (in) memcpy(at, host, m * esize);
        else memcpy(host, at, m * esize);
        b->dirty[region] |= in;
        s->cache_dirty |= in;
        host += m * esize, state += m, n -= m;
    }
}

void nvme_copy_out(NvmeStore* s, NvmePart p, size_t state, size_t n, void* dst) { copy_range(s, p, state, n, (char*)dst, 0); }
void nvme_copy_in(NvmeStore* s, NvmePart p, size_t state, size_t n, const void* src) { copy_range(s, p, state, n, (char*)src, 1); }

void nvme_flush(NvmeStore* s) {
    for (int i = 0; i < NVME_BUFFERS; i++)
        if (s->buf[i].state == BUF_CACHED) flush_buf(s, &s->buf[i]);
    s->cache_dirty = 0;
}

// ---------------------------------------------------------------------------------------------------
// The walk's parameter reads: on the caller's thread, into its buffer; the pool is not touched.

const void* nvme_read_params(NvmeStore* s, size_t state, size_t n, void* buf) {
    if (s->cache_dirty) fail("internal: -nvme parameters read before copied values were flushed");
    int k0 = chunk_of(s, state), k1 = chunk_of(s, state + n - 1);
    const Chunk *a = &s->chunks[k0], *z = &s->chunks[k1];
    if (a->state != state || z->state + z->n != state + n) fail("internal: a parameter read of part of a chunk");
    DiskJob j = {.fd = s->fd[REC_PARAMS], .buf = buf, .bytes = (size_t)(z->off[REC_PARAMS] - a->off[REC_PARAMS]) + z->bytes[REC_PARAMS],
                 .offset = a->off[REC_PARAMS]};
    disk_job_run_here(&j);
    if (j.err) check_job(s, REC_PARAMS, k0, &j);
    for (int k = k0; k <= k1; k++) {   // each chunk: whole, and as written
        const Chunk* c = &s->chunks[k];
        size_t at = (size_t)(c->off[REC_PARAMS] - a->off[REC_PARAMS]);
        DiskJob one = {.bytes = c->bytes[REC_PARAMS], .offset = c->off[REC_PARAMS]};
        one.got = j.got <= at ? 0 : j.got - at < one.bytes ? j.got - at : one.bytes;
        if (!c->written[REC_PARAMS]) memset((char*)buf + at, 0, one.bytes);
        else if (one.got == one.bytes) one.bad_sum = disk_checksum((char*)buf + at, one.bytes) != c->sum[REC_PARAMS];
        if (c->written[REC_PARAMS]) check_job(s, REC_PARAMS, k, &one);
    }
    return buf;
}

DiskTimes nvme_take_times(NvmeStore* s) {
    DiskTimes t = s->times;
    s->times = (DiskTimes){0};
    return t;
}

const char* nvme_describe(const NvmeStore* s) { return s->description; }

// ---------------------------------------------------------------------------------------------------
// Opening and closing.

void* nvme_host_alloc(Backend* be, MemLedger* mem, MemCategory c, size_t bytes, void** raw) {
    *raw = mem_alloc_host(be, mem, c, bytes + DISK_IO_ALIGN);
    if (!*raw) return NULL;
    return (void*)(((uintptr_t)*raw + DISK_IO_ALIGN - 1) / DISK_IO_ALIGN * DISK_IO_ALIGN);
}

// Writes and reads back one block at offset 0: some filesystems take O_DIRECT at open and refuse the
// transfer. 0 when it works, else the errno of the refusal.
static int direct_refused(int fd, void* block) {
    memset(block, 0, DISK_IO_ALIGN);
    errno = 0;
    if (pwrite(fd, block, DISK_IO_ALIGN, 0) != DISK_IO_ALIGN || pread(fd, block, DISK_IO_ALIGN, 0) != DISK_IO_ALIGN)
        return errno ? errno : EIO;
    return 0;
}

// Opens (creating or emptying) one of the files, with O_DIRECT where the filesystem takes it (EINVAL: it
// does not), else through the page cache. Returns whether O_DIRECT.
static int open_file(NvmeStore* s, int region, int want_direct, void* block) {
    const char* p = s->path[region];
    int flags = O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC;
    int fd = want_direct ? open(p, flags | O_DIRECT, 0600) : -1;
    if (fd < 0 && want_direct && errno != EINVAL) fail("-nvme: cannot create %s: %s", p, strerror(errno));
    int refused = fd >= 0 ? direct_refused(fd, block) : 0;
    if (refused && refused != EINVAL) fail("-nvme: cannot write %s: %s", p, strerror(refused));
    if (refused && close(fd) != 0) fail("-nvme: cannot close %s: %s", p, strerror(errno));
    int direct = fd >= 0 && !refused;
    if (!direct) fd = open(p, flags, 0600);
    if (fd < 0) fail("-nvme: cannot create %s: %s", p, strerror(errno));
    if (ftruncate(fd, 0) != 0) fail("-nvme: cannot empty %s: %s", p, strerror(errno));
    s->fd[region] = fd;
    return direct;
}

// The whole file's blocks now, so that a disk filling up later does not take the blocks a write-back needs.
static void reserve(const NvmeStore* s, int region, long long bytes) {
    if (bytes == 0) return;
    int rc = posix_fallocate(s->fd[region], 0, (off_t)bytes);
    if (rc == ENOSPC || rc == EDQUOT)
        fail("-nvme: no room for %s: it needs %.3f GiB, more than its filesystem has free", s->path[region], (double)bytes / (1 << 30));
    if (rc) fail("-nvme: cannot reserve %lld bytes for %s: %s", bytes, s->path[region], strerror(rc));
}

static void name_files(NvmeStore* s, const NvmeConfig* cfg) {
    char sub[64];
    snprintf(sub, sizeof(sub), "gpt-nvme-rank%d", cfg->rank);
    path_join(s->dir, sizeof(s->dir), cfg->dir, sub);
    path_join(s->path[REC_STATE], sizeof(s->path[REC_STATE]), s->dir, "state.bin");
    path_join(s->path[REC_PARAMS], sizeof(s->path[REC_PARAMS]), s->dir, "params.bin");
    path_join(s->lock_path, sizeof(s->lock_path), s->dir, "lock");
}

unsigned long long nvme_reusable_bytes(const NvmeConfig* cfg) {
    NvmeStore* s = (NvmeStore*)xcalloc(1, sizeof(NvmeStore));
    name_files(s, cfg);
    unsigned long long bytes = file_disk_bytes(s->path[REC_STATE]) + file_disk_bytes(s->path[REC_PARAMS]);
    free(s);
    return bytes;
}

static void take_lock(NvmeStore* s, const NvmeConfig* cfg) {
    make_dirs(s->dir);
    long pid;
    s->lock_fd = lock_file(s->lock_path, &pid);
    if (s->lock_fd < 0)
        fail("-nvme %s is in use by another run (process %ld holds %s); give each run its own -nvme directory", cfg->dir, pid,
             s->lock_path);
}

// A filesystem in memory: its files take host memory, whatever O_DIRECT does there.
static const char* memory_fs(const char* dir) {
    struct statfs st;
    if (statfs(dir, &st) != 0) fail("-nvme: cannot inspect the filesystem of %s: %s", dir, strerror(errno));
    if (st.f_type == TMPFS_MAGIC) return "tmpfs";
    return st.f_type == RAMFS_MAGIC ? "ramfs" : NULL;
}

static void describe(NvmeStore* s, int direct, long long bytes) {
    const char* mem = memory_fs(s->dir);
    snprintf(s->description, sizeof(s->description), "-nvme: state in %s (%.3f GiB per rank), %s%s%s%s", s->dir,
             (double)bytes / (1 << 30), direct ? "O_DIRECT reads and writes" : "buffered reads and writes: its filesystem does not take O_DIRECT, so they go through the page cache",
             mem ? "; note: " : "", mem ? mem : "", mem ? " is memory, so these files take host memory after all" : "");
}

static long long fail_write_from_env(void) {
    const char* v = getenv("GPT_NVME_FAIL_WRITE");
    if (!v || !*v) return 0;
    char* end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || *end || n < 1) fail("GPT_NVME_FAIL_WRITE=%s: expected a positive count of writes", v);
    return n;
}

static void open_files(NvmeStore* s, long long bytes[REGIONS]) {
    int direct = open_file(s, REC_STATE, 1, s->buf[0].mem);
    if (s->params_on_disk) open_file(s, REC_PARAMS, direct, s->buf[0].mem);
    reserve(s, REC_STATE, bytes[REC_STATE]);
    if (s->params_on_disk) reserve(s, REC_PARAMS, bytes[REC_PARAMS]);
    describe(s, direct, bytes[REC_STATE] + (s->params_on_disk ? bytes[REC_PARAMS] : 0));
}

NvmeStore* nvme_open(Backend* be, MemLedger* mem, const NvmeConfig* cfg, const size_t* begin, const size_t* len, int ranges,
                     int parts, size_t x, int params_on_disk) {
    if (parts < 1) fail("internal: a -nvme store without a master to hold");
    // At least one element: open_file probes O_DIRECT with a block of the pool, also on a rank whose pieces
    // hold no state (every tensor of its pieces frozen).
    size_t c = largest_chunk(cfg->chunk_elems, len, ranges);
    c = c ? c : 1;
    size_t state_cap = (size_t)parts * align_up(c * 4), params_cap = params_on_disk ? align_up(c * x) : 0;
    void* raw;
    char* pool = (char*)nvme_host_alloc(be, mem, MEM_HOST_STATE, NVME_BUFFERS * (state_cap + params_cap), &raw);
    mem_charge(mem, MEM_DISK_STATE, nvme_disk_bytes(cfg, len, ranges, parts, x, params_on_disk));
    if (!be) return NULL;
    NvmeStore* s = (NvmeStore*)xcalloc(1, sizeof(NvmeStore));
    *s = (NvmeStore){.fd = {-1, -1}, .x = x, .parts = parts, .params_on_disk = params_on_disk, .state_cap = state_cap, .params_cap = params_cap, .pool_raw = raw};
    for (int i = 0; i < NVME_BUFFERS; i++) s->buf[i].mem = pool + (size_t)i * (state_cap + params_cap);
    long long bytes[REGIONS];
    s->num_chunks = lay_out(cfg->chunk_elems, begin, len, ranges, parts, x, NULL, bytes);
    s->chunks = (Chunk*)xcalloc((size_t)(s->num_chunks ? s->num_chunks : 1), sizeof(Chunk));
    lay_out(cfg->chunk_elems, begin, len, ranges, parts, x, s->chunks, bytes);
    name_files(s, cfg);
    take_lock(s, cfg);
    open_files(s, bytes);
    s->io = disk_io_start(IO_WORKERS, fail_write_from_env());
    return s;
}

// Removes one of the store's files or its directory; 1 when it was already gone. Someone removed it behind
// the run: the run kept its files open and finished with its state intact, so that is a warning, not an
// error. Any other failure to clean up is.
static int remove_entry(const char* path, int is_dir) {
    if ((is_dir ? rmdir(path) : unlink(path)) == 0) return 0;
    if (errno == ENOENT) return 1;
    if (is_dir && (errno == ENOTEMPTY || errno == EEXIST)) return 0;   // something of the user's: it stays
    fail("-nvme: cannot remove %s: %s", path, strerror(errno));
}

void nvme_close(NvmeStore* s, Backend* be) {
    if (!s) return;
    if (s->in_pass) fail("internal: the -nvme store closed during a pass");
    disk_io_stop(s->io);
    int gone = 0;
    for (int r = 0; r < REGIONS; r++) {
        if (s->fd[r] < 0) continue;
        if (close(s->fd[r]) != 0) fail("-nvme: cannot close %s: %s", s->path[r], strerror(errno));
        gone |= remove_entry(s->path[r], 0);
    }
    gone |= remove_entry(s->lock_path, 0);
    if (close(s->lock_fd) != 0) fail("-nvme: cannot close %s: %s", s->lock_path, strerror(errno));
    gone |= remove_entry(s->dir, 1);
    // A warning that cannot be written (stderr gone) is not worth failing the finished run for.
    if (gone && fprintf(stderr, "warning: -nvme: %s was removed while the run used it; the run kept its files open, so "
                                "its state and checkpoints are intact\n", s->dir) < 0) {
    }
    be_host_free(be, s->pool_raw);
    free(s->chunks);
    free(s);
}
