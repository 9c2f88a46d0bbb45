// fs.c: see fs.h.
#include "core/util/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/common.h"

void make_dirs(const char* path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p)) fail("path too long: %s", path);
    for (char* s = p + 1; *s; s++) {   // each parent, then the path itself
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) fail("cannot create directory %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) fail("cannot create directory %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) fail("%s exists and is not a directory", p);
}

// Empties the directory open as dirfd (named path, for messages) and closes it. Entries are reached
// relative to dirfd with O_NOFOLLOW, so a symlink met on the way is unlinked, never entered.
static void empty_dir_at(int dirfd, const char* path) {
    DIR* d = fdopendir(dirfd);
    if (!d) fail("cannot read directory %s: %s", path, strerror(errno));
    struct dirent* e;
    char sub[PATH_MAX];
    while ((errno = 0, e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        path_join(sub, sizeof(sub), path, e->d_name);
        int fd = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            empty_dir_at(fd, sub);
            if (unlinkat(dirfd, e->d_name, AT_REMOVEDIR) != 0) fail("cannot remove %s: %s", sub, strerror(errno));
        } else if (unlinkat(dirfd, e->d_name, 0) != 0) {
            fail("cannot remove %s: %s", sub, strerror(errno));
        }
    }
    if (errno) fail("cannot read directory %s: %s", path, strerror(errno));
    closedir(d);
}

void remove_path(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return;
        fail("cannot inspect %s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {   // a file, or a symlink (to a directory or not): the entry itself goes
        if (unlink(path) != 0) fail("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail("cannot open directory %s: %s", path, strerror(errno));
    empty_dir_at(fd, path);
    if (rmdir(path) != 0) fail("cannot remove %s: %s", path, strerror(errno));
}

int path_exists(const char* path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

void sync_dir(const char* path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail("cannot open directory %s: %s", path, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) fail("cannot sync directory %s: %s", path, strerror(errno));
    if (close(fd) != 0) fail("cannot close directory %s: %s", path, strerror(errno));
}

int regular_file_size(const char* dir, const char* name, long long* size, char* why, size_t why_size) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    struct stat st;
    if (stat(p, &st) != 0) return set_why(why, why_size, errno == ENOENT ? "%s is missing" : "%s: cannot stat", name);
    if (!S_ISREG(st.st_mode)) return set_why(why, why_size, "%s is not a regular file", name);
    *size = (long long)st.st_size;
    return 1;
}

char* read_small_text(const char* dir, const char* name, char* why, size_t why_size) {
    long long n = 0;
    if (!regular_file_size(dir, name, &n, why, why_size)) return NULL;
    if (n <= 0 || n > (1 << 20)) return set_why(why, why_size, "%s has %lld bytes", name, n), NULL;
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    FILE* f = fopen(p, "rb");
    char* text = (char*)xcalloc((size_t)n + 1, 1);
    if (!f || fread(text, 1, (size_t)n, f) != (size_t)n) {
        set_why(why, why_size, "cannot read %s: %s", name, f ? "short read" : strerror(errno));
        free(text);
        text = NULL;
    }
    if (f) fclose(f);
    return text;
}

int lock_file(const char* path, long* holder) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot open %s: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        if (errno != EACCES && errno != EAGAIN) fail("cannot lock %s: %s", path, strerror(errno));
        struct flock other = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        *holder = fcntl(fd, F_GETLK, &other) == 0 && other.l_type != F_UNLCK ? (long)other.l_pid : -1;
        if (close(fd) != 0) fail("cannot close %s: %s", path, strerror(errno));
        return -1;
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) fail("cannot write %s: %s", path, strerror(errno));
    return fd;
}

unsigned long long fs_free_bytes(const char* path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p)) fail("path too long: %s", path);
    struct statvfs st;
    while (statvfs(p, &st) != 0) {
        char* slash = strrchr(p, '/');
        if (errno != ENOENT || !strcmp(p, ".") || !strcmp(p, "/")) fail("cannot inspect the filesystem of %s: %s", path, strerror(errno));
        if (!slash) snprintf(p, sizeof(p), ".");
        else if (slash == p) p[1] = '\0';
        else *slash = '\0';
    }
    if (st.f_blocks == 0) return ~0ull;   // a filesystem without a size (ramfs) reports no blocks at all
    return (unsigned long long)st.f_bavail * st.f_frsize;
}

unsigned long long file_disk_bytes(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) fail("cannot inspect %s: %s", path, strerror(errno));
        return 0;
    }
    return S_ISREG(st.st_mode) ? (unsigned long long)st.st_blocks * 512 : 0;
}
