// run_dir.h: the output directory (-o) of one run. It holds log.jsonl, the checkpoints ckpt_<step>/ and
// `lock`; rank 0 opens it before anything is written, so two runs never share one directory and a fresh
// run never mixes its log and checkpoints with an earlier run's.
#pragma once
#include <stddef.h>

typedef enum {
    RUN_FRESH,        // refuse a directory that holds a run (a log.jsonl or a ckpt_* entry)
    RUN_START_OVER,   // delete an earlier run's log and checkpoints first (-ow 1)
    RUN_RESUME,       // keep them: the trainer continues from the newest complete checkpoint (-y)
} RunStart;

typedef struct {
    const char* path;   // NULL without -o
    int lock_fd;        // the open DIR/lock while this process holds it, else -1
} RunDir;

// Creates path with its parents, takes the lock for the run's lifetime (one-line error naming the
// holder's pid when another run has it), removes a stale ckpt_tmp (a crash mid-checkpoint, possibly
// from a full disk), then applies `start`. path NULL: nothing (rd->path = NULL).
void run_dir_open(RunDir* rd, const char* path, RunStart start);
void run_dir_close(RunDir* rd);   // releases the lock

// Checkpoint entries: DIR/ckpt_<step, 6 digits>. The newest-first steps of the entries of that form in
// dir (complete or not); returns how many, *steps malloc'ed (NULL when none); the caller frees it.
int run_dir_checkpoints(const char* dir, int** steps);
void run_dir_checkpoint_path(char* out, size_t size, const char* dir, int step);
// The step a checkpoint directory's name says (ckpt_000042 -> 42), or -1 when the name is not of that form.
int run_dir_step_of(const char* path);
