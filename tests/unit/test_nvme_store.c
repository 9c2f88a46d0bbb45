// test_nvme_store.c: -nvme's state store (core/zero/nvme_store.h) against plain arrays. Ranges of odd sizes
// (one with a gap before it) cut into chunks of 2048 elements, more chunks than the pool has buffers:
// chunks never written read as zeros; copies in any order through the write-back cache land after a
// flush; a pass that skips a range updates the others in place and leaves it alone; the walk's parameter
// reads return whole units; the files are as large as planned and the pool as charged; a byte changed or a
// file cut behind the store is one line and exit 1 (in a child process); closing removes the files; a
// directory removed behind the store is one warning at the close, any other failure to remove one line and
// exit 1.
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/disk_io.h"
#include "core/util/fs.h"
#include "core/zero/nvme_store.h"
#include "tests/unit/testlib.h"

#define RANGES 3
#define CHUNK 2048
static const size_t BEGIN[RANGES] = {0, 5000, 12000};
static const size_t LEN[RANGES] = {5000, 3 * CHUNK, 3001};
#define TOTAL (12000 + 3001)   // state indices [0, TOTAL), [11144, 12000) in no range
#define PARTS 3                // fp32 buffers per element: the master and AdamW's m, v

typedef struct {
    float f[PARTS][TOTAL];   // master, m, v
    uint16_t p[TOTAL];       // the working copy (2 bytes)
} Ref;

static float* part_of(Ref* r, NvmePart p) { return r->f[p - NVME_MASTER]; }

static int in_range(size_t i) {
    for (int r = 0; r < RANGES; r++)
        if (i >= BEGIN[r] && i < BEGIN[r] + LEN[r]) return 1;
    return 0;
}

// Every element of every range, read back through the cache, equals the reference.
static int matches(NvmeStore* s, Ref* ref) {
    static float got[TOTAL];
    static uint16_t gotp[TOTAL];
    int ok = 1;
    for (int r = 0; r < RANGES; r++) {
        for (NvmePart p = NVME_MASTER; p < NVME_MASTER + PARTS; p++) {
            nvme_copy_out(s, p, BEGIN[r], LEN[r], got);
            ok &= memcmp(got, part_of(ref, p) + BEGIN[r], LEN[r] * 4) == 0;
        }
        nvme_copy_out(s, NVME_PARAMS, BEGIN[r], LEN[r], gotp);
        ok &= memcmp(gotp, ref->p + BEGIN[r], LEN[r] * 2) == 0;
    }
    return ok;
}

// Random copies in random order: parts, lengths that cross chunks and ranges' ends, overwrites.
static void random_copies(NvmeStore* s, Ref* ref, unsigned seed) {
    srand(seed);
    static float vals[TOTAL];
    for (int k = 0; k < 400; k++) {
        int r = rand() % RANGES;
        size_t a = BEGIN[r] + (size_t)rand() % LEN[r], n = 1 + (size_t)rand() % (BEGIN[r] + LEN[r] - a);
        NvmePart p = (NvmePart)(rand() % (1 + PARTS));
        for (size_t i = 0; i < n; i++) vals[i] = (float)rand() / (float)RAND_MAX;
        if (p == NVME_PARAMS) {
            for (size_t i = 0; i < n; i++) ref->p[a + i] = (uint16_t)(vals[i] * 60000);
            nvme_copy_in(s, p, a, n, ref->p + a);
        } else {
            memcpy(part_of(ref, p) + a, vals, n * 4);
            nvme_copy_in(s, p, a, n, vals);
        }
    }
    nvme_flush(s);
}

// A pass over ranges 0 and 2 (range 1's chunks are read ahead and let go): master += grad-like values, the
// working copy set, m and v untouched.
static void pass_skipping_range_1(NvmeStore* s, Ref* ref) {
    nvme_pass_begin(s, 1);
    for (int r = 0; r < RANGES; r += 2)
        for (size_t i = BEGIN[r]; i < BEGIN[r] + LEN[r];) {
            nvme_pass_hold(s, i);
            size_t n = nvme_chunk_left(s, i);
            float* master = (float*)nvme_pass_view(s, NVME_MASTER, i);
            uint16_t* params = (uint16_t*)nvme_pass_view(s, NVME_PARAMS, i);
            for (size_t j = 0; j < n; j++) {
                master[j] += 0.5f;
                params[j] = (uint16_t)(i + j);
                ref->f[0][i + j] += 0.5f;
                ref->p[i + j] = (uint16_t)(i + j);
            }
            i += n;
        }
    nvme_pass_end(s);
}

static int read_params_match(NvmeStore* s, const Ref* ref) {
    int ok = 1;
    for (int r = 0; r < RANGES; r++) {
        void* buf;
        if (posix_memalign(&buf, DISK_IO_ALIGN, nvme_params_buffer_bytes(LEN[r], 2)) != 0) return 0;
        const void* got = nvme_read_params(s, BEGIN[r], LEN[r], buf);
        ok &= memcmp(got, ref->p + BEGIN[r], LEN[r] * 2) == 0;
        free(buf);
    }
    return ok;
}

static long long file_size_of(const char* dir, const char* name) {
    char p[4096];
    snprintf(p, sizeof(p), "%s/gpt-nvme-rank0/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

// The child below ends in fail() with the store's memory still held, which is no leak: it leaves at once,
// before a sanitizer build's exit-time leak check (registered earlier, so run later) can call it one.
static void leave_now(void) { _exit(1); }

// Runs child() in a child process whose stderr is collected: whether it exited with `code` after exactly one
// line of stderr that contains want.
typedef void (*ChildFn)(NvmeStore* s, const char* dir, int how);

static int child_says(ChildFn child, NvmeStore* s, const char* dir, int how, int code, const char* want) {
    int fds[2];
    if (pipe(fds) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        if (dup2(fds[1], 2) < 0 || atexit(leave_now) != 0) _exit(3);
        child(s, dir, how);
        _exit(0);
    }
    close(fds[1]);
    char text[1024] = {0};
    size_t got = 0;
    ssize_t r;
    while ((r = read(fds[0], text + got, sizeof(text) - 1 - got)) > 0) got += (size_t)r;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    int lines = 0;
    for (size_t i = 0; i < got; i++) lines += text[i] == '\n';
    return WIFEXITED(status) && WEXITSTATUS(status) == code && lines == 1 && strstr(text, want) != NULL;
}

// Damages params.bin of s (the parent's store) as `how` says (0: a byte changed, 1: cut short), then reads
// range 0's parameters (on the calling thread: a child has no I/O workers).
static void damage_and_read(NvmeStore* s, const char* dir, int how) {
    char p[4096];
    snprintf(p, sizeof(p), "%s/gpt-nvme-rank0/params.bin", dir);
    int fd = open(p, O_RDWR);
    if (how == 0) {
        unsigned char b = 0x77;
        if (pwrite(fd, &b, 1, 4096 + 17) != 1) _exit(3);   // chunk 1's parameters
    } else if (ftruncate(fd, 6000) != 0) {
        _exit(3);
    }
    void* buf;
    if (posix_memalign(&buf, DISK_IO_ALIGN, nvme_params_buffer_bytes(LEN[0], 2)) != 0) _exit(3);
    nvme_read_params(s, BEGIN[0], LEN[0], buf);
}

// A store of its own in dir (none is given), whose files are taken away behind it (how 0: its whole
// directory removed; 1: state.bin replaced by a directory, which unlink cannot remove), then closed.
static void close_after_removal(NvmeStore* none, const char* dir, int how) {
    (void)none;
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    NvmeConfig cfg = {.dir = dir, .chunk_elems = CHUNK, .rank = 0};
    NvmeStore* s = nvme_open(be, &mem, &cfg, BEGIN, LEN, RANGES, PARTS, 2, 1);
    char p[4096];
    snprintf(p, sizeof(p), "%s/gpt-nvme-rank0", dir);
    if (how == 0) {
        remove_path(p);
    } else {
        snprintf(p, sizeof(p), "%s/gpt-nvme-rank0/state.bin", dir);
        if (unlink(p) != 0 || mkdir(p, 0755) != 0) _exit(3);
    }
    nvme_close(s, be);
}

int main(void) {
    TestStats st = {0, 0};
    char dir[] = "/tmp/nvme-store-test.XXXXXX";
    if (!mkdtemp(dir)) fail("cannot make a temporary directory");
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    NvmeConfig cfg = {.dir = dir, .chunk_elems = CHUNK, .rank = 0};
    NvmeStore* s = nvme_open(be, &mem, &cfg, BEGIN, LEN, RANGES, PARTS, 2, 1);
    Ref* ref = (Ref*)xcalloc(1, sizeof(Ref));

    size_t pool = NVME_BUFFERS * (PARTS * 8192 + 4096) + DISK_IO_ALIGN;
    check_true(&st, "pool_charged_to_host_state", mem.bytes[MEM_HOST_STATE] == pool);
    check_true(&st, "disk_charged_as_planned", mem.bytes[MEM_DISK_STATE] == nvme_disk_bytes(&cfg, LEN, RANGES, PARTS, 2, 1));
    MemLedger plan = {{0}};
    void* raw = &plan;
    check_true(&st, "planning_only_charges", nvme_open(NULL, &plan, &cfg, BEGIN, LEN, RANGES, PARTS, 2, 1) == NULL &&
                                                 nvme_host_alloc(NULL, &plan, MEM_HOST_PARAMS, 100, &raw) == NULL && raw == NULL &&
                                                 plan.bytes[MEM_HOST_STATE] == pool && plan.bytes[MEM_HOST_PARAMS] == 100 + DISK_IO_ALIGN);
    // ranges of 5000 (chunks 2048, 2048, 904), 6144 (3 x 2048) and 3001 (2048, 953): 6 full chunks, whose parts
    // take 8192 bytes, and 2 whose parts are padded to 4096; 8 chunks of parameters, each 4096 bytes at most
    check_true(&st, "files_as_large_as_planned",
               file_size_of(dir, "state.bin") == 6 * PARTS * 8192 + 2 * PARTS * 4096 && file_size_of(dir, "params.bin") == 8 * 4096);
    // A record holds as many parts as the optimizer's description names: the master alone takes a third.
    check_true(&st, "record_parts_as_described", nvme_disk_bytes(&cfg, LEN, RANGES, 1, 2, 0) == 6 * 8192 + 2 * 4096);
    check_true(&st, "chunk_left", nvme_chunk_left(s, 0) == CHUNK && nvme_chunk_left(s, 4100) == 900 && nvme_chunk_left(s, 5000) == CHUNK &&
                                       nvme_chunk_left(s, 14048) == 953);
    check_true(&st, "fresh_chunks_read_zero", matches(s, ref));
    random_copies(s, ref, 7);
    check_true(&st, "copies_in_any_order_land", matches(s, ref));
    pass_skipping_range_1(s, ref);
    check_true(&st, "pass_updates_in_place_and_skips", matches(s, ref));
    DiskTimes t = nvme_take_times(s);
    check_true(&st, "times_taken", t.pass > 0 && t.read > 0 && t.write > 0 && t.wait <= t.pass && nvme_take_times(s).pass == 0);
    check_true(&st, "read_params_whole_units", read_params_match(s, ref));
    random_copies(s, ref, 8);   // a second round over written chunks: read, changed, written again
    pass_skipping_range_1(s, ref);
    check_true(&st, "second_round", matches(s, ref) && read_params_match(s, ref));
    check_true(&st, "changed_file_detected", child_says(damage_and_read, s, dir, 0, 1, "params.bin changed behind the run: chunk 1 "));
    check_true(&st, "truncated_file_detected", child_says(damage_and_read, s, dir, 1, 1, "params.bin ends at byte 6000, inside chunk 1 "));
    nvme_close(s, be);
    char sub[4096];
    snprintf(sub, sizeof(sub), "%s/gpt-nvme-rank0", dir);
    check_true(&st, "close_removes_files", access(sub, F_OK) != 0);
    check_true(&st, "close_warns_when_dir_was_removed",
               child_says(close_after_removal, NULL, dir, 0, 0, "/gpt-nvme-rank0 was removed while the run used it;"));
    check_true(&st, "close_fails_on_other_removal_errors",
               child_says(close_after_removal, NULL, dir, 1, 1, "error: -nvme: cannot remove ") &&
                   (snprintf(sub, sizeof(sub), "%s/gpt-nvme-rank0", dir), remove_path(sub), rmdir(dir) == 0));
    check_true(&st, "a_gap_is_in_no_range", !in_range(11500) && in_range(11143));
    free(ref);
    backend_destroy(be);
    return test_exit(&st);
}
