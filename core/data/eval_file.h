// eval_file.h: llm.c's multiple-choice evaluation file (HellaSwag, written by scripts/prepare_hellaswag.py):
// examples of one context and four endings, one of them right. docs/formats.md has the layout:
//   256 x int32 header [20240522, version, examples, longest example in bytes], then per example a stream of
//   elements <START 0xFF..><bytes><index><label><4><n><context tokens>, then 4 x <n><ending tokens>;
//   version 1 (llm.c's): uint16 elements; version 2 (vocabularies past 65,535 tokens): uint32 elements.
// The whole file is checked when it is read: the header, every example's fields (index in order, label
// 0..3, four endings, no empty context or ending, its byte count), no bytes after the last example, every
// token below the model's vocabulary. Each problem is one line naming the file and the example, and exit 1.
#pragma once

#define EVAL_MAGIC 20240522
#define EVAL_ENDINGS 4

typedef struct {
    int label;                    // 0..3: the right ending
    int context;                  // its tokens
    int ending[EVAL_ENDINGS];     // each ending's tokens
    long long first;              // where its tokens start in EvalFile.tokens: the context, then each ending
} EvalExample;

typedef struct {
    int count;                    // examples kept
    int dropped;                  // examples whose context and longest ending exceed max_len tokens
    int width;                    // bytes per element in the file: 2 or 4
    EvalExample* examples;        // [count], in the file's order
    int* tokens;
} EvalFile;

// Reads and checks `path` whole; keeps the examples whose context plus longest ending fits max_len tokens,
// counting the others in `dropped`. Every token of every example must be below `vocab`.
void eval_file_read(EvalFile* ef, const char* path, int vocab, int max_len);
void eval_file_free(EvalFile* ef);

// Example e's context (ending < 0) or ending `ending`: its tokens and, in *n, how many.
const int* eval_example_tokens(const EvalFile* ef, const EvalExample* e, int ending, int* n);
