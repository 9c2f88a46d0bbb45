// common.c: see common.h.
#include "base/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// This process's rank as the launcher (OpenMPI, PMIx, PMI/Hydra) announced it, 0 without one. Read from the
// environment because fail() may run before MPI is up, or after it broke.
static int launcher_rank(void) {
    const char* names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char* v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

// An error every rank hits (a bad flag) should be printed once. Rank 0 prints at once and exits non-zero,
// which makes mpirun kill the job while the other ranks wait here; an error only this rank hits is still
// printed when the wait is over. The stop signals go back to their default action first, so mpirun's
// SIGTERM ends the wait instead of counting as a stop request (train_gpt.cu).
static void let_rank0_report_first(void) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    struct timespec left = {2, 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

// One write(2) of the whole line: the ranks' stderr meet in mpirun's, where separate writes interleave.
static void write_error_line(const char* line, size_t len) {
    int fd = fileno(stderr);
    if (fd < 0) {   // a stream without a descriptor: the fuzz harness captures stderr in memory
        fwrite(line, 1, len, stderr);
        return;
    }
    // If stderr is gone there is nowhere left to report that; only an interrupted write is tried again.
    while (write(fd, line, len) < 0 && errno == EINTR) {
    }
}

// prefix, then the message, as one line of at most PIPE_BUF bytes (a pipe takes that in one piece; a longer
// message is cut short), written at once.
static void put_error_line(const char* prefix, const char* fmt, va_list ap) {
    char line[PIPE_BUF];
    int n = snprintf(line, sizeof line, "%s", prefix);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);   // leaves room for the newline
    size_t len = strlen(line);
    line[len++] = '\n';
    write_error_line(line, len);
}

void print_error_line(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_error_line("error: ", fmt, ap);
    va_end(ap);
}

// Linux: the main thread's id is the process id.
static int on_main_thread(void) { return (pid_t)syscall(SYS_gettid) == getpid(); }

void fail(const char* fmt, ...) {
    int rank = launcher_rank();
    if (rank > 0) let_rank0_report_first();
    char prefix[32] = "error: ";
    if (rank > 0) snprintf(prefix, sizeof prefix, "error: rank %d: ", rank);
    va_list ap;
    va_start(ap, fmt);
    put_error_line(prefix, fmt, ap);
    va_end(ap);
    // A helper thread (the gradient landing's worker, -dpu's update) must not run exit's handlers while the
    // main thread may be inside CUDA or MPI: that can hang after the line. It ends the process at once.
    if (!on_main_thread()) {
        fflush(stdout);
        _exit(1);
    }
    exit(1);
}

void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) fail("out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xrealloc(void* p, size_t bytes) {
    p = realloc(p, bytes ? bytes : 1);
    if (!p) fail("out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xcalloc(size_t n, size_t size) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fail("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

// Reading takes regular files only: open(2) of a FIFO waits for a writer, forever for one named by mistake,
// and a directory or a device is never a model, shard or tokenizer. O_NONBLOCK lets the open itself return
// at once; reads block again once the file is known to be regular.
static FILE* open_regular_for_reading(const char* path, const char* mode) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail("cannot open %s (%s): %s", path, mode, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fail("cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s is not a regular file", path);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) fail("cannot set up reading %s: %s", path, strerror(errno));
    FILE* f = fdopen(fd, mode);
    if (!f) fail("cannot open %s (%s): %s", path, mode, strerror(errno));
    return f;
}

FILE* xfopen(const char* path, const char* mode) {
    if (!strcmp(mode, "r") || !strcmp(mode, "rb")) return open_regular_for_reading(path, mode);
    FILE* f = fopen(path, mode);
    if (!f) fail("cannot open %s (%s): %s", path, mode, strerror(errno));
    return f;
}

void xfread(void* dst, size_t size, size_t n, FILE* f, const char* path) {
    size_t got = fread(dst, size, n, f);
    if (got != n) {
        if (ferror(f)) fail("read error in %s: %s", path, strerror(errno));
        fail("%s is truncated (wanted %zu items of %zu bytes, got %zu)", path, n, size, got);
    }
}

void xfwrite(const void* src, size_t size, size_t n, FILE* f, const char* path) {
    if (fwrite(src, size, n, f) != n) fail("write error in %s: %s", path, strerror(errno));
}

int set_why(char* why, size_t size, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return 0;
}

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void flush_stdout(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) fail("cannot write to standard output: %s", strerror(errno));
}

void xfclose(FILE* f, const char* path) {
    if (fflush(f) != 0) fail("write error in %s: %s", path, strerror(errno));
    // fsync only makes sense for files opened for writing; EINVAL/EBADF on read-only streams is fine.
    if (fsync(fileno(f)) != 0 && errno != EINVAL && errno != EBADF && errno != EROFS)
        fail("cannot sync %s: %s", path, strerror(errno));
    if (fclose(f) != 0) fail("cannot close %s: %s", path, strerror(errno));
}

void xfseek(FILE* f, long long off, int whence, const char* path) {
    if (fseeko(f, (off_t)off, whence) != 0) fail("cannot seek in %s: %s", path, strerror(errno));
}

long long file_size(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return (long long)st.st_size;
}

void path_join(char* out, size_t size, const char* dir, const char* name) {
    int n = snprintf(out, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size) fail("path too long: %s/%s", dir, name);
}

void path_beside(char* out, size_t size, const char* path, const char* name) {
    const char* slash = strrchr(path, '/');
    int n = slash ? snprintf(out, size, "%.*s/%s", (int)(slash - path), path, name) : snprintf(out, size, "./%s", name);
    if (n < 0 || (size_t)n >= size) fail("path too long: %s beside %s", name, path);
}
