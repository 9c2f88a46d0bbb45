// harness.c: see harness.h.
#include "tests/fuzz/harness.h"

#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct Harness {
    FILE* real_stderr;
    char* text;   // what the code under test wrote to stderr (open_memstream's buffer)
    size_t text_len;
    char dir[PATH_MAX];   // scratch directory, "" if none
};

static void remove_scratch(const Harness* h) {
    if (!h->dir[0]) return;
    DIR* d = opendir(h->dir);
    if (d) {
        struct dirent* e;
        char p[PATH_MAX * 2];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", h->dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(h->dir);
}

static int one_error_line(const char* s, size_t n) {
    return n > 7 && !strncmp(s, "error: ", 7) && s[n - 1] == '\n' && memchr(s, '\n', n) == s + n - 1 &&
           memchr(s, '\0', n) == NULL;
}

static void check_exit(int status, void* arg) {
    Harness* h = (Harness*)arg;
    fflush(stderr);   // updates h->text / h->text_len
    stderr = h->real_stderr;   // the memory stream stays open: exit() is about to reclaim it
    fwrite(h->text, 1, h->text_len, stderr);
    fflush(stderr);
    remove_scratch(h);
    if (status == 0 || (status == 1 && one_error_line(h->text, h->text_len))) return;
    fprintf(stderr, "fuzz: exit status %d with the output above breaks the contract (0, or 1 after one "
                    "\"error: \" line)\n", status);
    abort();
}

static unsigned char* read_input(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char* buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) {
        fputs("fuzz: out of memory reading the input\n", stderr);
        exit(2);
    }
    *size = n;
    return buf;
}

Harness* harness_begin(int argc, char** argv, int scratch, unsigned char** data, size_t* size) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s INPUT_FILE   (under afl-fuzz: ... -- %s @@)\n", argv[0], argv[0]);
        exit(2);
    }
    *data = read_input(argv[1], size);
    Harness* h = calloc(1, sizeof *h);
    if (!h) exit(2);
    if (scratch) {
        const char* tmp = getenv("TMPDIR");
        snprintf(h->dir, sizeof h->dir, "%s/fuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(h->dir)) {
            perror(h->dir);
            exit(2);
        }
    }
    h->real_stderr = stderr;
    FILE* mem = open_memstream(&h->text, &h->text_len);
    if (!mem) exit(2);
    stderr = mem;   // glibc: stderr is an assignable FILE*; fail() looks it up at call time
    if (on_exit(check_exit, h) != 0) exit(2);
    return h;
}

const char* harness_dir(const Harness* h) { return h->dir; }

void harness_write(const Harness* h, const char* name, const void* bytes, size_t n, char* path) {
    snprintf(path, PATH_MAX, "%s/%s", h->dir, name);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) harness_bug(h, "cannot write %s", path);
}

int harness_split(const unsigned char* data, size_t size, const char* sep, int max, const unsigned char** start,
                  size_t* len) {
    size_t k = strlen(sep);
    int parts = 0;
    const unsigned char* p = data;
    const unsigned char* end = data + size;
    while (parts < max - 1) {
        const unsigned char* hit = memmem(p, (size_t)(end - p), sep, k);
        if (!hit) break;
        start[parts] = p;
        len[parts++] = (size_t)(hit - p);
        p = hit + k;
    }
    start[parts] = p;
    len[parts++] = (size_t)(end - p);
    return parts;
}

void harness_bug(const Harness* h, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stderr);
    fputs("fuzz: reader returned something broken: ", h->real_stderr);
    vfprintf(h->real_stderr, fmt, ap);
    fputc('\n', h->real_stderr);
    va_end(ap);
    abort();
}

int harness_le32(const unsigned char* data, size_t size, size_t off) {
    if (off + 4 > size) return 0;
    return (int)((unsigned)data[off] | (unsigned)data[off + 1] << 8 | (unsigned)data[off + 2] << 16 |
                 (unsigned)data[off + 3] << 24);
}
