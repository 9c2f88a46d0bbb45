// bpe.h: the byte-level BPE encoder, one for every model it reads:
//   - a Hugging Face tokenizer.json of the byte-level kind (GPT-2, Llama 3, Qwen2), read by
//     core/tokenizer/tokenizer_json.c, which says what it accepts and refuses;
//   - the compact merges file scripts/tokenize.py writes for GPT-2 (gpt2_merges.bin beside gpt2_tokenizer.bin,
//     read by core/tokenizer/tokenizer_file.c, which also tells the two kinds apart).
// This file knows neither format: the loaders fill the model through the functions at its end.
// A text is encoded as Hugging Face tokenizers does. Its added tokens are matched literally (at each position
// the longest; the leftmost first) in two passes: those with "normalized" false in the text as it is, then
// those with "normalized" true in each stretch between them, after the normalizer (NFC, or none) has
// rewritten the stretch, by their own normalized contents. Each becomes its id; each section between them
// is cut into pre-tokens by the model's pattern, and each pre-token's bytes are merged, lowest rank first.
// Token ids are uint32, below 2^24. Shared by the tokenizer tool (core/tokenizer/tokenizer_tool.c) and the trainer
// (-prompt's encoding, the samples' decoding), so all of them encode alike. Errors end the process with one
// "error: ..." line (fail).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BPE_MAX_VOCAB (1u << 24)

// The pre-tokenizer patterns, each a hand-written scanner (bpe.c states the regular expressions).
typedef enum { BPE_PATTERN_GPT2, BPE_PATTERN_LLAMA3, BPE_PATTERN_QWEN2 } BpePattern;

typedef struct {
    uint64_t key;
    uint32_t rank, merged;
} MergeSlot;   // key = a << 32 | b; rank UINT32_MAX: empty
typedef struct {
    const uint8_t* bytes;
    uint32_t len, id;
} BpeAdded;
// Added tokens matched in one pass: v sorted by bytes; those beginning with byte b: v[range[b] .. range[b + 1]).
typedef struct {
    BpeAdded* v;
    uint32_t n;
    uint32_t range[257];
} BpeAddedSet;
typedef struct {
    uint32_t tag, id;
} VocabSlot;   // tag: the bytes' hash's high half; id UINT32_MAX: empty

typedef struct {
    BpePattern pattern;
    int ignore_merges;   // a pre-token that is itself in the vocabulary is that one token
    uint32_t byte_id[256];
    MergeSlot* merges;
    uint32_t merge_mask;   // slots - 1, a power of two minus one
    // The token table: a tokenizer.json's; vocab_size 0 for the compact merges file.
    uint32_t vocab_size;   // every id below it is a token
    uint8_t* bytes;   // every token's bytes, each followed by a NUL
    uint32_t* offset;   // token id's bytes: [offset[id], offset[id + 1] - 1)
    VocabSlot* vocab_slots;   // the model vocabulary's bytes -> id, open addressing
    uint32_t vocab_mask;
    int nfc;   // the normalizer: NFC (1) or none (0)
    BpeAddedSet added;   // "normalized" false: matched first, in the text as it is
    BpeAddedSet added_normalized;   // "normalized" true: matched after normalization, by normalized content
    uint8_t* normalized_bytes;   // their contents in NFC, with the NFC normalizer (else: the token table's)
    int uncut;   // an added_normalized token holds a place where bpe_next_cut would cut
    uint32_t doc_start;   // the token before every document: the BOS, else the end-of-text token
    uint8_t* bmp_class;   // the pattern's class of each character below U+10000 (bpe.c)
} BpeModel;
typedef struct {
    uint32_t* v;
    size_t n, cap;
} BpeTokens;
typedef struct BpeWorker BpeWorker;   // one thread's scratch and piece cache

void bpe_model_free(BpeModel* m);
// The bytes of token id (*len of them, NUL-terminated), or NULL past the token table.
const uint8_t* bpe_token_bytes(const BpeModel* m, uint32_t id, size_t* len);

BpeWorker* bpe_worker_new(const BpeModel* m);
void bpe_worker_free(BpeWorker* w);
// Appends the ids of text[start, end) to out. The text may go on past end: nonspace_after says whether a
// non-space follows there (it decides where a whitespace run splits). Returns SIZE_MAX, or the offset of
// the first byte that is not valid UTF-8 (then nothing is appended).
size_t bpe_encode_span(BpeWorker* w, const uint8_t* text, size_t start, size_t end, int nonspace_after, BpeTokens* out);
// The first added token of the first pass (m->added) in text[from, end): 1 with where it starts (*at), its
// length and id; 0 when none.
int bpe_next_added(const BpeModel* m, const uint8_t* text, size_t from, size_t end, size_t* at, size_t* len,
                   uint32_t* id);
// The first place at or after `from` where text[0, len), a section between first-pass added tokens, may be
// cut into spans that encode alike apart and together (bpe_encode_span's nonspace_after 1 for the first), or
// len when none.
size_t bpe_next_cut(const BpeModel* m, const uint8_t* text, size_t from, size_t len);
void bpe_tokens_push(BpeTokens* t, uint32_t id);

// For the loaders. Merges: a table for n merges, then each pair once (0: the pair is there already).
// Vocabulary: token id's bytes (in the token table) found by bpe_vocab_find (0 from bpe_vocab_add: the same
// bytes have an id already). Added tokens: a set indexed once all are in it (0: two with the same bytes).
void bpe_merges_reserve(BpeModel* m, size_t n);
int bpe_merge_add(BpeModel* m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged);
void bpe_vocab_reserve(BpeModel* m, size_t n);
int bpe_vocab_add(BpeModel* m, uint32_t id);
int64_t bpe_vocab_find(const BpeModel* m, const uint8_t* p, size_t n);
int bpe_added_index(BpeAddedSet* s);
// Last, once the loader has filled the model: the tables derived from it.
void bpe_model_finish(BpeModel* m);
