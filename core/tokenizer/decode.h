// tokenizer.h: llm.c's GPT-2 tokenizer file, for decoding sampled tokens to text (no encoding).
//
// File: 256 x int32 header [20240328, version, vocab_size, eot_token] (version 1 has no eot field: eot is
// 50256), then per token a uint8 length and that many bytes. Little-endian.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;

// NULL if the file does not exist (callers then print token ids); one-line error + exit 1 if it exists
// but is malformed (short header, wrong magic, unknown version, bad vocab/eot, truncated, trailing bytes).
Tokenizer* tokenizer_load(const char* path);
const char* tokenizer_decode(const Tokenizer* t, int token);   // NUL-terminated bytes; "" for ids out of range
// Writes the token's bytes to out; an id beyond the vocabulary (a model larger than its tokenizer) as
// "<id N>", so that no sampled token goes missing from the text.
void tokenizer_write(const Tokenizer* t, int token, FILE* out);
int tokenizer_eot(const Tokenizer* t);
// GPT-2's end-of-text id: version 1 files' (which do not record one), and the fallback below.
#define GPT2_EOT 50256
// The end-of-text id a model of V tokens starts its samples from: the tokenizer's; without a tokenizer file
// (t NULL) GPT-2's, or the last id of a smaller vocabulary. Only the fallback is sure to be below V.
int tokenizer_eot_or_gpt2(const Tokenizer* t, int V);
int tokenizer_vocab(const Tokenizer* t);
void tokenizer_free(Tokenizer* t);

#ifdef __cplusplus
}
#endif
