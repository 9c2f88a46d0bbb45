// state_file.h: a checkpoint's state_rank<r>.bin, world rank r's pieces of the fp32 master and the
// optimizer's state (as the optimizer's description names them, optimizer_kind.h: AdamW's m and v), and the
// working copy when it is not fp32, as spans of canonical (llm.c-order) offsets, so that another world
// size, ZeRO stage or pipeline split can re-cut them.
//
// Format: 8 x int64 [20261122, 2, num_params, num_spans, working dtype, world rank, dp, zero stage], then
// per span int64 (canonical offset, count), count fp32 each of its kind's optimizer's buffers (the master,
// then the state: AdamW's master, m and v), and the working copy in its dtype unless fp32. A span never
// crosses a tensor. A frozen kind has no spans: model.bin holds its values, and a file holding state for a
// kind this run keeps frozen is refused.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/comm/comm.h"
#include "core/zero/model_state.h"

#define STATE_MAGIC 20261122

// Writes this rank's file; dp and zero_stage are recorded for whoever reads it (loading needs neither).
// Returns the file's CRC-32.
uint32_t state_file_write(const ModelState* ms, Backend* be, const char* path, int world_rank, int dp, int zero_stage);

// Where a state file's bytes come from: the file itself, or (node-local directories) the rank that reads it,
// through a broadcast that every rank takes part in (f is NULL on the others).
typedef struct {
    FILE* f;
    const char* path;
    Comm* world;   // NULL: read f directly
    int root;
} StateReader;

// Restores what this rank keeps of one state file that passed state_file_inspect.
void state_file_read(const ModelState* ms, Backend* be, StateReader* r);

typedef struct {
    long long start, count;   // canonical offset and length
} Span;

typedef struct {
    Span* items;
    size_t n, cap;
} SpanList;

void span_push(SpanList* l, long long start, long long count);
// state_rank<rank>.bin in dir: its header names this rank, the model's size and the run's dtype; its spans
// lie inside the model's tensors and its bytes end after the last one. The spans go to `all`. 1, or 0 with
// the problem in why.
int state_file_inspect(const char* dir, int rank, const ModelShape* s, long long dt, SpanList* all, char* why, size_t n);
// Together the state files must hold every parameter of shape s exactly once (every one a frozen kind's
// excepted, which they never hold): a missing rank file named in the manifest, a rank file copied over
// another, or a manifest claiming fewer ranks shows as a gap or an overlap. Sorts `all`.
int spans_cover(SpanList* all, const ModelShape* s, int ranks, char* why, size_t n);
