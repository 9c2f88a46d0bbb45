// run_dir.c: see run_dir.h.
#include "run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "fs.h"

int run_dir_step_of(const char* path) {
    const char* name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (strncmp(name, "ckpt_", 5) != 0) return -1;
    const char* digits = name + 5;
    size_t n = strlen(digits);
    if (n < 6 || n > 10 || strspn(digits, "0123456789") != n) return -1;   // ckpt_tmp, ckpt_old, ckpt_3x
    long long step = strtoll(digits, NULL, 10);
    return step <= INT_MAX ? (int)step : -1;
}

void run_dir_checkpoint_path(char* out, size_t size, const char* dir, int step) {
    char name[32];
    snprintf(name, sizeof(name), "ckpt_%06d", step);
    path_join(out, size, dir, name);
}

static int newest_first(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x < y) - (x > y);
}

int run_dir_checkpoints(const char* dir, int** steps) {
    *steps = NULL;
    DIR* d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fail("cannot read directory %s: %s", dir, strerror(errno));
    }
    int n = 0, cap = 0;
    struct dirent* e;
    while ((errno = 0, e = readdir(d)) != NULL) {
        int step = run_dir_step_of(e->d_name);
        if (step < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int* grown = (int*)realloc(*steps, (size_t)cap * sizeof(int));
            if (!grown) fail("out of host memory listing %s", dir);
            *steps = grown;
        }
        (*steps)[n++] = step;
    }
    if (errno) fail("cannot read directory %s: %s", dir, strerror(errno));
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof(int), newest_first);
    return n;
}

// fcntl locks (not flock) so the lock also holds on NFS; released when the process ends, however it ends.
static int take_lock(const char* dir) {
    char path[PATH_MAX];
    path_join(path, sizeof(path), dir, "lock");
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot open %s: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        if (errno != EACCES && errno != EAGAIN) fail("cannot lock %s: %s", path, strerror(errno));
        struct flock holder = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        long pid = fcntl(fd, F_GETLK, &holder) == 0 && holder.l_type != F_UNLCK ? (long)holder.l_pid : -1;
        fail("-o %s is in use by another run (process %ld holds %s); give this run its own -o", dir, pid, path);
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) fail("cannot write %s: %s", path, strerror(errno));
    return fd;
}

void run_dir_open(RunDir* rd, const char* path, RunStart start) {
    rd->path = path;
    rd->lock_fd = -1;
    if (!path) return;
    make_dirs(path);
    rd->lock_fd = take_lock(path);
    char p[PATH_MAX];
    path_join(p, sizeof(p), path, "ckpt_tmp");
    remove_path(p);
    path_join(p, sizeof(p), path, "ckpt_old");
    remove_path(p);
    if (start == RUN_RESUME) return;
    int* steps;
    int n = run_dir_checkpoints(path, &steps);
    path_join(p, sizeof(p), path, "log.jsonl");
    int has_log = path_exists(p);
    if (start == RUN_FRESH && (n > 0 || has_log)) {
        char held[96];
        if (n) snprintf(held, sizeof(held), "%d checkpoint%s, the newest ckpt_%06d", n, n == 1 ? "" : "s", steps[0]);
        else snprintf(held, sizeof(held), "a log.jsonl, no checkpoint");
        free(steps);
        fail("-o %s holds an earlier run (%s); resume it with -y 1, start over with -ow 1 (deletes its log and "
             "checkpoints), or choose another -o", path, held);
    }
    for (int i = 0; i < n; i++) {
        run_dir_checkpoint_path(p, sizeof(p), path, steps[i]);
        remove_path(p);
    }
    free(steps);
    path_join(p, sizeof(p), path, "log.jsonl");
    remove_path(p);
    sync_dir(path);
}

void run_dir_close(RunDir* rd) {
    if (rd->lock_fd >= 0 && close(rd->lock_fd) != 0) fail("cannot close %s/lock: %s", rd->path, strerror(errno));
    rd->lock_fd = -1;
}
