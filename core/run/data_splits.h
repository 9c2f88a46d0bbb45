// data_splits.h: the trainer's side of documents (core/data/dataloader.h): -docmask's document-start token,
// the validation split read as the training split is, and the start-up lines of a packed split.
#pragma once
#include "core/data/dataloader.h"
#include "core/run/config.h"
#include "core/tokenizer/decode.h"

// -docmask 1: the tokenizer's document-start token (GPT-2's 50256 without a tokenizer file: tok NULL, none at
// tokenizer_path); -1 without -docmask. No such token below V: one-line error.
int data_document_token(const Config* cfg, const Tokenizer* tok, const char* tokenizer_path, int V);
// -j opened with -i's options: both splits document datasets or neither (else one-line error). *batches =
// min(-m, its windows); *trained = the labels in them, which the validation loss divides by (none: error).
DataLoader* data_open_val(const Config* cfg, const DataLoader* train, int dp_rank, int dp, int V, const DataOptions* opt,
                          int* batches, long long* trained);
// -cp: context rank cp_rank of cp keeps its positions of each row train and val (or NULL) read (context_parallel.h:
// [cp_rank t/cp, (cp_rank+1) t/cp), or -cpm ring's two chunks) of tokens, targets and pos; documents' doc whole
// (dataloader_keep_columns). Nothing with cp = 1.
void data_keep_context(const Config* cfg, DataLoader* train, DataLoader* val, int cp, int cp_rank);
// A packed split's counts: documents longer than -t, rows, windows, rows left over (nothing for windows).
void data_print_packing(const DataLoader* train, const DataLoader* val, const Config* cfg);
// Host scratch of B*T ints each, pos and doc too when dl (NULL: none, generation) has documents.
Batch data_batch_create(int B, int T, const DataLoader* dl);
void data_batch_free(Batch* b);
// A document dataset's trained tokens per second: ", N trained tok/s" into text and its log.jsonl fields
// (the step's labels and their rate) appended to json; nothing for plain shards, whose every token trains.
void data_trained_rate(const DataLoader* dl, long long trained, double seconds, char* text, size_t text_size, char* json,
                       size_t json_size);
