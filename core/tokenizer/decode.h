// decode.h: the trainer's tokenizer, for decoding sampled tokens to text: llm.c's GPT-2 tokenizer file, or a
// Hugging Face tokenizer.json, whose model (core/tokenizer/bpe.h) also encodes -prompt.
//
// llm.c's file: 256 x int32 header [20240328, version, vocab_size, eot_token] (version 1 has no eot field: eot
// is 50256), then per token a uint8 length and that many bytes. Little-endian. A file that tokenizer_file_is_json
// finds to be text is read as a tokenizer.json (core/tokenizer/tokenizer_json.c).
#pragma once
#include <stdio.h>

#include "core/tokenizer/bpe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;

// NULL if the file does not exist (callers then print token ids); one-line error + exit 1 if it exists
// but is malformed (short header, wrong magic, unknown version, bad vocab/eot, truncated, trailing bytes; a
// tokenizer.json that tokenizer_json.c refuses).
Tokenizer* tokenizer_load(const char* path);
// The tokenizer file a run reads: -tk's (given; a one-line error when it does not exist), else what
// scripts/tokenize.py writes beside the training shards, gpt2_tokenizer.bin (llm.c's name) or tokenizer.json
// (both there: a one-line error, since only one was used to encode them). The path may not exist.
void tokenizer_path_for(char* path, size_t size, const char* given, const char* train_pattern);
const char* tokenizer_decode(const Tokenizer* t, int token);   // NUL-terminated bytes; "" for ids out of range
// Writes the token's bytes to out; an id beyond the vocabulary (a model larger than its tokenizer) as
// "<id N>", so that no sampled token goes missing from the text.
void tokenizer_write(const Tokenizer* t, int token, FILE* out);
// Where samples start: llm.c's end-of-text token, or a tokenizer.json's document start (BpeModel.doc_start:
// the token scripts/tokenize.py puts before every document).
int tokenizer_eot(const Tokenizer* t);
// A tokenizer.json's model, which encodes -prompt; NULL for llm.c's file.
const BpeModel* tokenizer_bpe(const Tokenizer* t);
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
