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
int tokenizer_vocab(const Tokenizer* t);
void tokenizer_free(Tokenizer* t);

#ifdef __cplusplus
}
#endif
