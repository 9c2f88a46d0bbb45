// hellaswag.h: a multiple-choice evaluation (HellaSwag, as llm.c's -h runs it) of an evaluation file
// (core/data/eval_file.h) on the model being trained.
//
// Each ending is a row of the (B, T) batch: the context, then the ending, each position's target the next
// token. One forward per B rows (pipeline_forward_token_losses: every layout's forward) gives each token's
// loss; an ending's score is the mean loss over its own tokens, and the prediction is the ending with the
// lowest score (llm.c's acc_norm). Rows of the same example may fall in two forwards, so any -b works.
//
// Contract. Every rank calls with the same file, read with max_len = T. The examples are split over the
// data-parallel replicas in contiguous shares; every rank runs as many forwards as the largest share needs
// (ZeRO-3's gathers are collective over the replicas), padding with rows that are not scored. Under -cp each
// context rank of a replica forwards its positions of the same rows (context_layout.h) and a sum over the
// context group pools the token losses, one rank's at each position. The head stage's first tensor and
// context rank of each replica tallies its share, and one sum over the world gives every rank the counts:
// the same as on one rank, in any layout. Nothing here keeps state between calls or reads a global.
#pragma once
#include "core/comm/grid.h"
#include "core/data/eval_file.h"
#include "core/model/walk.h"
#include "core/pipeline/pipeline.h"

// What the evaluation runs on, lent by the trainer for one call.
typedef struct {
    Pipeline* pipe;
    Model* chunks;                  // this stage's model chunks, as pipeline_forward takes them
    Backend* be;
    const Grid* grid;             // its world carries the counts and the stop flag
    int* inputs;                  // (B*T) host ints, overwritten (the model's B*T/cp under -cp)
    int* targets;                 // (B*T) host ints, overwritten
    int B, T;                     // T: whole rows, as the file was read
    int (*stop_seen)(void);       // this rank's view of a stop request (1: stop), agreed over the world per forward
} EvalRunner;

typedef struct {
    long long correct, total;     // over every replica
} EvalScore;

// -hs FILE for a model of `vocab` tokens at sequence length T: eval_file_read, and an error when no
// example fits T.
void hellaswag_open(EvalFile* ef, const char* path, int vocab, int T);

// Scores every example once. Returns 1 with the counts in *score, or 0 when a stop request came between two
// forwards (every rank leaves at the same one; *score is then not set).
int hellaswag_evaluate(const EvalRunner* r, const EvalFile* ef, EvalScore* score);

// The predicted ending: the lowest of the four mean losses, the first among equals (llm.c's rule).
int hellaswag_predict(const double mean[EVAL_ENDINGS]);
