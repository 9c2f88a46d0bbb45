// run_dir.h: the output directory (-o) of one run. It holds log.jsonl, the checkpoints ckpt_<step>/ and
// `lock`; it is opened before anything is written, so two runs never share one directory and a fresh
// run never mixes its log and checkpoints with an earlier run's.
//
// On several hosts -o is either one directory every host sees (a shared filesystem: rank 0 manages it) or
// node-local: each host has its own directory at that path, and the lowest rank of each host manages that
// host's (its lock, its stale temporaries, the manifest, DONE and the rename of each checkpoint). Every
// rank writes its state file into its own host's directory; model.bin and log.jsonl exist only in rank 0's.
#pragma once
#include <stddef.h>

#include "core/comm/comm.h"

typedef enum {
    RUN_FRESH,        // refuse a directory that holds a run (a log.jsonl or a ckpt_* entry)
    RUN_START_OVER,   // delete an earlier run's log and checkpoints first (-ow 1)
    RUN_RESUME,       // keep them: the trainer continues from the newest complete checkpoint (-y)
} RunStart;

typedef struct {
    const char* path;   // NULL without -o
    int lock_fd;        // the open DIR/lock while this process holds it, else -1
    int node_local;     // each host has its own directory at path (no shared filesystem)
    int manager;        // this rank manages its directory: rank 0, or with node_local its host's lowest rank
    int root_dir;       // this rank's directory is rank 0's (every rank's unless node_local)
    int dirs;           // how many directories the run writes into: hosts with node_local, else 1
} RunDir;

// Collective over the world, before anything is written: rank 0 opens path (run_dir_open); with more than
// one rank, a file rank 0 leaves there tells whether every rank sees the same directory. If not, and the
// ranks that do not see it are exactly those on other hosts, each of those hosts' lowest rank opens its own
// directory the same way (node_local); a directory shared by some hosts but not all is a one-line error.
void run_dir_setup(RunDir* rd, Comm* world, const char* path, RunStart start);

// One manager's part of run_dir_setup: creates path with its parents, takes the lock for the run's
// lifetime (one-line error naming the holder's pid when another run has it), removes a stale ckpt_tmp (a
// crash mid-checkpoint, possibly from a full disk), then applies `start`. path NULL: nothing.
void run_dir_open(RunDir* rd, const char* path, RunStart start);
void run_dir_close(RunDir* rd);   // releases the lock

// Checkpoint entries: DIR/ckpt_<step, 6 digits>. The newest-first steps of the entries of that form in
// dir (complete or not); returns how many, *steps malloc'ed (NULL when none); the caller frees it.
int run_dir_checkpoints(const char* dir, int** steps);
void run_dir_checkpoint_path(char* out, size_t size, const char* dir, int step);
// The step a checkpoint directory's name says (ckpt_000042 -> 42), or -1 when the name is not of that form.
int run_dir_step_of(const char* path);
