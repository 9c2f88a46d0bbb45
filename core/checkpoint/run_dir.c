// run_dir.c: see run_dir.h.
#include "core/checkpoint/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "core/util/fs.h"
#include "core/util/phase_timer.h"

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

// One run per directory: the lock lasts as long as the run (lock_file).
static int take_lock(const char* dir) {
    char path[PATH_MAX];
    path_join(path, sizeof(path), dir, "lock");
    long pid;
    int fd = lock_file(path, &pid);
    if (fd < 0) fail("-o %s is in use by another run (process %ld holds %s); give this run its own -o", dir, pid, path);
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
    const char* logs[] = {"log.jsonl", "tb", "csv"};   // the log and its monitors' copies (core/util/monitors.h)
    for (int i = 0; i < 3; i++) {
        path_join(p, sizeof(p), path, logs[i]);
        remove_path(p);
    }
    sync_dir(path);
}

void run_dir_close(RunDir* rd) {
    if (rd->lock_fd >= 0 && close(rd->lock_fd) != 0) fail("cannot close %s/lock: %s", rd->path, strerror(errno));
    rd->lock_fd = -1;
}

// ---------------------------------------------------------------------------------------------------
// Which directory each rank sees at path (run_dir_setup).

// A name only this start-up uses, so a probe left by a crashed launch is never taken for this one's.
static double start_token(Comm* world) {
    double token = comm_rank(world) == 0 ? (double)getpid() * 1e6 + fmod(now_seconds() * 1e3, 1e6) : -1.0;
    comm_allreduce_host_max(world, &token, 1);
    return token;
}

static int all_ranks(Comm* world, int yes) {
    long long no = yes ? 0 : 1;
    comm_allreduce_host_max_i64(world, &no, 1);
    return no == 0;
}

// Whether this rank sees the file rank 0 creates in path (rank 0 opened path already).
static int sees_root_probe(Comm* world, const char* path, double token) {
    char name[64], p[PATH_MAX];
    snprintf(name, sizeof(name), ".shared_%.0f", token);
    path_join(p, sizeof(p), path, name);
    if (comm_rank(world) == 0) xfclose(xfopen(p, "w"), p);
    comm_barrier(world);
    int seen = path_exists(p);
    comm_barrier(world);
    if (comm_rank(world) == 0) remove_path(p);
    return seen;
}

// How many entries of dir start with prefix; the first one's name into first.
static int count_prefixed(const char* dir, const char* prefix, char* first, size_t size) {
    DIR* d = opendir(dir);
    if (!d) fail("cannot read directory %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent* e;
    while ((errno = 0, e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (n++ == 0) snprintf(first, size, "%s", e->d_name);
    }
    if (errno) fail("cannot read directory %s: %s", dir, strerror(errno));
    closedir(d);
    return n;
}

#define SHARED_BY_SOME "-o %s is shared by some hosts and not by others: use one directory every host mounts, or " \
                       "one that each host has to itself"

// Each host other than rank 0's must see only its own lowest rank's probe at path: two hosts sharing a
// directory while rank 0's host has another would have two managers writing into one.
static void check_private_dirs(Comm* world, const char* path, double token) {
    int rank = comm_rank(world), leader = comm_host_leader(world), manager = rank == leader && leader != 0;
    char prefix[64], name[96], p[PATH_MAX], first[256] = "";
    snprintf(prefix, sizeof(prefix), ".host_%.0f_", token);
    snprintf(name, sizeof(name), "%s%d", prefix, leader);
    path_join(p, sizeof(p), path, name);
    if (manager) {
        make_dirs(path);
        xfclose(xfopen(p, "w"), p);
    }
    comm_barrier(world);
    int n = leader == 0 ? 0 : count_prefixed(path, prefix, first, sizeof(first));
    int ok = all_ranks(world, leader == 0 || (n == 1 && strcmp(first, name) == 0));
    if (manager) remove_path(p);
    if (!ok) fail(SHARED_BY_SOME, path);
}

void run_dir_setup(RunDir* rd, Comm* world, const char* path, RunStart start) {
    int rank = comm_rank(world);
    *rd = (RunDir){.path = path, .lock_fd = -1, .manager = rank == 0, .root_dir = 1, .dirs = 1};
    if (rank == 0) run_dir_open(rd, path, start);
    if (!path || comm_size(world) == 1) return;
    double token = start_token(world);
    int seen = sees_root_probe(world, path, token);
    if (all_ranks(world, seen)) return;
    // Not shared. Rank 0's host sees its own directory; any other rank that does is on a host sharing it.
    int on_root_host = comm_host_leader(world) == 0;
    if (!all_ranks(world, seen == on_root_host)) fail(SHARED_BY_SOME, path);
    check_private_dirs(world, path, token);
    rd->node_local = 1;
    rd->root_dir = on_root_host;
    rd->manager = rank == comm_host_leader(world);
    long long managers = rd->manager;
    comm_allreduce_host_sum_i64(world, &managers, 1);
    rd->dirs = (int)managers;
    if (rd->manager && rank != 0) run_dir_open(rd, path, start);
}
