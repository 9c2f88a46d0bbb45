// dataloader.h: token shards (llm.c format) read as one concatenated stream, in the data order of docs/ARCHITECTURE.md.
//
// Shard file: 256 x int32 header [magic, version, ntok, set_lo, set_hi, 0...] then ntok tokens, little-endian:
// [20240520, 1, ...] + uint16 tokens (llm.c's GPT-2 shards) or [20240801, 7, ...] + uint32 tokens (llm.c's
// Llama 3 shards, for vocabularies past 65,536). Each shard has its own width, so one glob may hold both.
// set_hi << 32 | set_lo: the set id that scripts/tokenize.py gives all shards of one run (0: none, llm.c's).
// Nothing is read into memory up front: the loader keeps each shard's token offset in the stream and
// reads one window (B*T+1 tokens) per batch with fseeko/fread, across shard boundaries where needed.
//
// Data order: the global window index of (step, micro-step) on DP rank r of N is
//     w = (step*ga + micro)*N + r,   epoch e = w / W,   j = w % W,   W = (ntok - 1) / (B*T).
// Without shuffling the window starts at token j*B*T; with shuffling at perm_e(j)*B*T, where perm_e is a
// Fisher-Yates permutation of 0..W-1 seeded from (seed, e) only. So N ranks at ga=G see exactly the
// windows one rank sees at ga=N*G, in the same order, and resuming at any step is exact.
// A dataset is NAME of NAME_{train,val}_<digits>.bin in one directory; a file of another name (tokenize.py
// --raw's) is a set of its own. tokenize.py switches a new set in with DIR/.tokenize-PID/SWITCHING in place
// (its one line: NAME), so a run killed meanwhile leaves it: a directory of matched shards that holds one
// is refused whatever the set ids say. A .tokenize-PID without the marker (stopped before the switch) is not.
// Every failure (no match, a switch marker, bad header, bad size, shards of one dataset from two sets, too
// few tokens, token >= vocab) is one line + exit 1.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct DataLoader DataLoader;

// Documents (docs/ARCHITECTURE.md, "Data order"): a dataset whose shards have .mask files beside
// them (X.mask beside X.bin: 256 x int32 header [20261129, 1, ntok, set_lo, set_hi, 0...], then one byte per
// token, packing.h's MASK_* bits) is read as documents; plain shards are, with a doc_token, too.
typedef struct {
    int pack;            // -pack 1: a document dataset's rows are whole documents packed best-fit; 0: stream windows
    int truncate_long;   // -long truncate: a document longer than T keeps its first T tokens; 0: left out
    int doc_token;       // -docmask 1 on plain shards: the token that starts a document; -1: plain shards read as today
} DataOptions;

// Host arrays of B*T ints each; pos and doc are filled when the loader has documents (dataloader_has_documents).
typedef struct {
    int* tokens;
    int* targets;   // -1: not a label
    int* pos;
    int* doc;
} Batch;

// What packing made of a document dataset (dataloader_open_documents; zeros for stream windows).
typedef struct {
    long long docs;        // documents in the split
    long long long_docs;   // of them longer than T (left out, or cut with truncate_long)
    long long rows;        // packed rows
    long long rows_left;   // rows past the last whole window of B rows, unused
    long long used;        // tokens of documents in the rows (the rest is padding)
} PackStats;

// Opens every file matching `pattern` (glob(3), sorted by name), validates each header and size.
// rank/world = this rank's DP position; shuffle != 0 visits windows in a seeded random order per epoch
// (identical on every rank); every token read is checked < vocab.
DataLoader* dataloader_open(const char* pattern, int B, int T, int rank, int world, int shuffle, uint64_t seed,
                            int vocab);
// dataloader_open with documents: opt NULL or opt->doc_token < 0 with no mask files is dataloader_open.
// Mask files on some shards but not all, a bad mask file, or a split whose documents fill no window: one
// line + exit 1.
DataLoader* dataloader_open_documents(const char* pattern, int B, int T, int rank, int world, int shuffle, uint64_t seed,
                                      int vocab, const DataOptions* opt);
int dataloader_has_masks(const DataLoader* dl);       // a document dataset: its targets may be -1
int dataloader_has_documents(const DataLoader* dl);   // masks, or a doc_token: batches carry pos and doc
int dataloader_is_packed(const DataLoader* dl);
PackStats dataloader_pack_stats(const DataLoader* dl);
// The micro-batch of (step, ga, micro) on this rank: tokens, targets and, with documents, pos and doc.
void dataloader_read(DataLoader* dl, long long step, int ga, int micro, Batch* b);
// From now on dataloader_read keeps `pieces` (1 or 2) ranges of columns, [first[i], first[i] + count) in
// increasing order, of each of the B rows of tokens, targets and pos, packed into B x (pieces count) (a context
// rank's positions, -cp; two under -cpm ring); dataloader_batch too. doc keeps the whole rows: attention
// compares a query's document start, a position in the whole row, with keys anywhere in it.
#define MAX_KEPT_PIECES 2
void dataloader_keep_columns(DataLoader* dl, int pieces, const int* first, int count);
// The place of that micro-batch in the data order, (step * ga + micro) * world + rank, before any shuffle: the
// same data has the same place under every layout (one rank with -ga n reads what n replicas read).
long long dataloader_position(const DataLoader* dl, long long step, int ga, int micro);
// Labels (targets other than -1) in global window w = (step*ga + micro)*world + rank of the data order,
// and in a whole step: every micro-step on every rank (no communication: the loader knows every rank's
// windows). B*T per window without masks.
long long dataloader_window_trained(DataLoader* dl, long long w);
long long dataloader_step_trained(DataLoader* dl, long long step, int ga);
// Fills inputs[i] = stream[start+i], targets[i] = stream[start+1+i] for i < B*T (int32 host arrays).
void dataloader_batch(DataLoader* dl, long long step, int ga, int micro, int* inputs, int* targets);
long long dataloader_windows_per_epoch(const DataLoader* dl);   // W = (ntok - 1) / (B*T), or packed rows / B
long long dataloader_num_tokens(const DataLoader* dl);
int dataloader_num_shards(const DataLoader* dl);
// Token offset in the stream where the window of (step, ga, micro) starts (what dataloader_batch reads).
long long dataloader_window_start(DataLoader* dl, long long step, int ga, int micro);
void dataloader_close(DataLoader* dl);

#ifdef __cplusplus
}
#endif
