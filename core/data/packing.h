// packing.h: documents into rows of T tokens, and each row's per-token positions, document starts and
// targets (docs/ARCHITECTURE.md, "Data order": Documents). Pure functions over host arrays: the data loader
// (dataloader.c) reads the tokens and mask bytes and hands them here; scripts/reference.py implements the same rules.
//
// A mask byte (a .mask file's, one per token): MASK_TRAINED, the prediction of this token from the tokens
// before it in its document is a label; MASK_DOC_START, the token begins a document.
// Per slot t of a row: pos[t] = t - (the index of its document's first token), doc[t] = that index, and
// target[t] = the next token of the same document when that token is a label, else -1.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MASK_TRAINED 1
#define MASK_DOC_START 2

// Best fit: document i (len[i] tokens, 1 <= len[i] <= T) goes into the open row with the smallest free room
// >= len[i], ties to the lowest row index; with none, a new row (rows are numbered in the order they open).
// Fills row_of[i] and at[i] (the slot of its first token: documents sit in the order they were put in, from
// slot 0). Returns the number of rows.
long long packing_best_fit(const int* len, long long n, int T, long long* row_of, int* at);

// One packed row of T slots from its documents' tokens and mask bytes, concatenated from slot 0 (`used`
// tokens; doc_len[k] of document k): tokens beyond `used` are padding (token 0, target -1), one document of
// their own. tok and mask hold `used` entries.
void packing_fill_row(const uint32_t* tok, const uint8_t* mask, const int* doc_len, int ndocs, int T, int* tokens,
                      int* targets, int* pos, int* doc);

// A window of B rows of T tokens of the stream (B*T+1 tokens from raw, mask NULL for plain shards): inputs
// and targets as always, and each row's documents: a token starts one when its mask byte says DOC_START, or
// without masks when it equals doc_token. doc[t] = the last start at or before t in the row (0: none, the row
// opens inside a document). With masks a target whose token is not a label is -1.
void packing_fill_window(const uint32_t* raw, const uint8_t* mask, int doc_token, int B, int T, int* tokens, int* targets,
                         int* pos, int* doc);

#ifdef __cplusplus
}
#endif
