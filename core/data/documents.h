// documents.h: the data loader's document side (dataloader.h): mask files beside the shards, the documents
// they delimit, and their packing into rows (packing.h). Internal to core/data.
#pragma once
#include <stdint.h>

#include "core/data/dataloader.h"

typedef struct {
    char* path;
    long long first;   // offset of this shard's first token in the concatenated stream
    long long ntok;
    uint64_t set;      // the set id of tokenize.py's run that wrote it; 0: none (llm.c's shards)
    int width;         // bytes per token: 2 or 4, by the header's magic; shards of one stream may differ
    char* mask_path;   // X.mask beside X.bin, or NULL (plain shards)
} Shard;

// A packed split: row r holds documents first[r] .. first[r+1]-1, document k being the stream's tokens
// start[k] .. start[k] + len[k] - 1 (len: the tokens kept).
typedef struct {
    long long rows;
    long long* first;   // [rows + 1]
    long long* start;
    int* len;
} Packing;

// Sets each shard's mask_path when X.mask is beside X.bin; returns 1 when every shard has one, 0 when none
// does; some but not all: one-line error.
int documents_find_masks(Shard* shards, int n, const char* pattern);
// Reads every mask file once, checking its header against its shard (magic, version, token count, set id,
// size) and its bytes (only the two bits; DOC_START at every shard's first token, never with TRAINED).
// win_trained (windows entries, NULL for none): labels of each stream window of bt tokens (targets
// 1..bt of window j, stream positions j*bt+1 .. j*bt+bt). pack (NULL for none): the documents packed into
// rows of T (-long: truncate_long), with stats; row_trained receives (malloc'ed) each row's labels.
void documents_scan(const Shard* shards, int n, long long bt, long long windows, long long* win_trained, int T,
                    int truncate_long, Packing* pack, long long** row_trained, PackStats* stats);
void documents_free(Packing* pack);
