// tokenizer_file.h: a tokenizer file of either kind into bpe.h's model. The kinds:
//   - a Hugging Face tokenizer.json (core/tokenizer/tokenizer_json.c);
//   - the compact merges file scripts/tokenize.py writes for GPT-2 (gpt2_merges.bin beside gpt2_tokenizer.bin):
//       int32 [BPE_MERGES_MAGIC, 1, n_merges, 0], uint32 byte_id[256], n_merges x uint32 {a, b, merged}
//     (GPT-2's pattern, no added tokens, no token table).
#pragma once
#include <stdio.h>

#include "core/tokenizer/bpe.h"

#define BPE_MERGES_MAGIC 20240601

// Whether the tokenizer file f at path (read from its start, and left there) is to be read as a tokenizer.json.
// The binary formats (the compact merges file, llm.c's gpt2_tokenizer.bin) begin with a magic whose first byte
// is above 0x7f; a file that begins, after any spaces, with printable ASCII, or holds nothing else, was meant
// as JSON text, so the JSON reader names what is wrong with it (an empty file, a top level that is not an
// object, where the parse fails) rather than a binary header check.
int tokenizer_file_is_json(FILE* f, const char* path);
// Either kind, told apart by tokenizer_file_is_json; errors end the process with one "error: ..." line.
void tokenizer_file_load(BpeModel* m, const char* path);
