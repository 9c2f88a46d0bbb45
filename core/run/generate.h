// generate.h: text from the model, one token at a time. One loop serves -s's training samples, -prompt and
// -chat.
//
// Contract. Every rank calls with the same arguments (`out` aside: rank 0's stdout, NULL elsewhere). Each
// token is one pipeline_forward over (B, T) on every rank; the ranks holding the LM head draw it from its
// logits row (softmax(logits / temperature) over the top k, one uniform from `rng`: every head rank draws the
// same), and one max all-reduce over the world hands the token, with each rank's stop flag, to every rank,
// so all ranks end at the same token. The model sees the last T tokens: the window slides once the text
// outgrows it. Under -cp each context rank feeds the model its positions of the window, and the rank holding
// the last one draws. Nothing here holds state between calls or reads a global; the caller lends what it runs on.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "core/comm/comm.h"
#include "core/model/walk.h"
#include "core/pipeline/pipeline.h"
#include "core/tokenizer/decode.h"

// How the next token is drawn from a row of logits (over the real vocabulary).
typedef struct {
    float temperature;   // 0: the most likely token
    int top_k;           // 0: every token
} Sampling;

// What the loop runs on, lent by the trainer for one call.
typedef struct {
    Pipeline* pipe;
    Model* chunks;                  // this stage's model chunks, as pipeline_forward takes them
    Backend* be;
    Comm* world;                  // every rank: the token's all-reduce
    int* inputs;                  // (B*T) host ids, overwritten: each forward's input
    int B, T;
    const Tokenizer* tokenizer;   // NULL: tokens print as ids
    int (*stop_seen)(void);       // this rank's view of a stop request (1: stop), carried on each token's all-reduce
    Sampling how;
    uint64_t seed;                // -seed: each caller derives its own stream from it
    int cp, cp_rank, cp_ring;     // -cp: the context ranks share each sequence (context_parallel.h); 1, 0, 0 without
} Generator;

// -s: "step <step> | sample: " and up to `count` tokens (at most T-1) after the end-of-text id `eot`, from a
// stream of the seed and the step (the same text on a resumed run). Returns 0 when a stop request ended it
// before its last token (the line then ends " [sample stopped by a signal]").
int generate_sample(const Generator* g, int step, int eot, int count, FILE* out);

// A text as token ids (*n of them, malloc'd), encoded like scripts/tokenize.py does: with the tokenizer.json's
// model, or with the merges file it writes beside llm.c's tokenizer file at tokenizer_path. No token is added
// around the text (a tokenizer.json's added tokens in it, such as <|begin_of_text|>, become their ids). Every
// id must be below V. Fails (one line beginning with `what`, the text's name: "-prompt") without a tokenizer,
// without the merges file, on invalid UTF-8.
int* generate_encode_text(const char* what, const char* text, const Tokenizer* tokenizer, const char* tokenizer_path,
                          int V, int* n);

// -prompt: prints "prompt: n tokens [ids]" and the prompt's text, then `count` tokens after prompt[0..n) as
// they come (flushed one by one; a stop request ends the text at the token that carried it), then
// "ids: [the generated ids]" for scripts.
void generate_from_prompt(const Generator* g, const char* text, const int* prompt, int n, int count, FILE* out);

// -chat: up to `count` tokens after prompt[0..n), from -prompt's stream of the seed, written as they come and
// ended by a newline, stopping at the first token of stop[0..nstop) (not written) or at a stop request. With
// show_ids, also "prompt: n tokens [ids]" before the text and "ids: [the generated ids, a stop token
// included]" after it, for scripts.
void generate_reply(const Generator* g, const int* prompt, int n, int count, const int* stop, int nstop, int show_ids,
                    FILE* out);
