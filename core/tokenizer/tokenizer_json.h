// tokenizer_json.h: a Hugging Face tokenizer.json into bpe.h's model (tokenizer_json.c says what it accepts).
#pragma once
#include "core/tokenizer/bpe.h"

// Fills m from the file's whole text (NUL-terminated; this takes it over) and ends the process with one
// "error: PATH: ..." line on anything it would not encode as Hugging Face tokenizers does. The caller ends
// with bpe_model_finish.
void tokenizer_json_load(BpeModel* m, const char* path, char* text);
