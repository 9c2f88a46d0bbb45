// common.c: see common.h.
#include "common.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    exit(1);
}

void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) fail("out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xcalloc(size_t n, size_t size) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fail("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

FILE* xfopen(const char* path, const char* mode) {
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
