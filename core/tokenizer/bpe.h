/* bpe.h: GPT-2's encoder: pre-tokenization by GPT-2's pattern, then byte-level BPE merges, over the compact
 * merges file scripts/tokenize.py writes (gpt2_merges.bin beside gpt2_tokenizer.bin):
 *     int32 [20240601, 1, n_merges, 0], uint32 byte_id[256], n_merges x uint32 {a, b, merged}
 * Shared by the tokenizer tool (core/tokenizer/gpt2tok.c) and the trainer's -prompt, so both encode alike.
 * Errors end the process with one "error: ..." line (bpe_die). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define GPT2TOK_MAGIC 20240601

typedef struct { uint32_t key, rank, merged; } MergeSlot;   /* key = a << 16 | b; rank UINT32_MAX = empty */
typedef struct {
    uint16_t byte_id[256];
    MergeSlot *slots;
} BpeModel;
typedef struct { uint16_t *v; size_t n, cap; } BpeTokens;
typedef struct BpeWorker BpeWorker;   /* one thread's scratch and piece cache */

void bpe_model_load(BpeModel *m, const char *path);
void bpe_model_free(BpeModel *m);
BpeWorker *bpe_worker_new(const BpeModel *m);
void bpe_worker_free(BpeWorker *w);
/* Appends the ids of text[start, end) to out. The text may go on past end: nonspace_after says whether a
 * non-space follows there (it decides where a whitespace run splits). Returns SIZE_MAX, or the offset of
 * the first byte that is not valid UTF-8 (then nothing is appended). */
size_t bpe_encode_span(BpeWorker *w, const uint8_t *text, size_t start, size_t end, int nonspace_after, BpeTokens *out);
void bpe_tokens_push(BpeTokens *t, uint16_t id);

void bpe_die(const char *label, const char *msg);   /* "error: label: msg", exit 1 */
void *bpe_xmalloc(size_t n);
void *bpe_xrealloc(void *p, size_t n);
