// run_record.h: the hyperparameters that define a run, recorded in every checkpoint's manifest so a
// resume can say what changed. Which flags are recorded, under which key and rule, is each row's resume rule
// in core/run/flags.c. Some may never change (the data position and the state files depend on them); a
// change of the others makes the run differ from one launched with the new flags, so a resume refuses it
// unless told (-y 2). A longer -x under a schedule that has not started to decay is fine. -dpu is recorded,
// and with it the cadence of -v, -s and -n, each of which lands the delayed update early.
// Not recorded, because a resume may change them freely: the layout (the world size, -pp, -ps, -vp, -tp, -sp,
// -z, -r, -offload, -comm, the -b/-ga split of the same tokens per step), which changes at most the order in
// which floating-point sums add (results agree to rounding, tests/system/t_resume.sh), and what only observes the
// run (-m, -g, -temp, -topk, -lb, -nf, and -v, -s, -n without -dpu).
#pragma once
#include <stdio.h>

#include "core/run/config.h"
#include "core/util/json.h"

#define RUN_RECORD_KEYS 44   // the rows of flags.c with a resume rule
#define RUN_RECORD_VALUE 1024

typedef struct {
    char value[RUN_RECORD_KEYS][RUN_RECORD_VALUE];   // each formatted the same way when written and compared
    int recorded[RUN_RECORD_KEYS];                   // 0: a key an older manifest lacks (not compared)
} RunRecord;

// The record of this run: cfg with the resolved step count and tokens per step.
void run_record_of(RunRecord* r, const Config* cfg, int max_steps, long long tokens_per_step);
// Writes `"run": {...}` (no trailing comma or newline) to f. A key that a manifest may lack for its default
// (ABSENT_DEFAULT) is left out while it holds the default.
void run_record_write_json(FILE* f, const RunRecord* r, const char* path);
// Reads the "run" object at index run of a parsed manifest: 1, or 0 with the problem in why. A key that
// older manifests lack is left unrecorded, or takes its default where the flag's row says so.
int run_record_read(RunRecord* r, const Json* j, int run, char* why, size_t why_size);
// A resume of checkpoint `ckpt` (at first_step) by a run with cfg and max_steps (its record: now): a
// one-line error for a change of a value that may never change; for any other change unless -y 2
// (cfg->resume == 2) or, for the learning-rate schedule's flags (-x, -l, -u, -q, -k and its options), unless the
// steps already taken keep their rates (and beta1). What is accepted is printed (print: rank 0).
void run_record_check_resume(const RunRecord* saved, const RunRecord* now, const Config* cfg, int max_steps, int first_step,
                             const char* ckpt, int print);
