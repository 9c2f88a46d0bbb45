// checkpoint.h: llm.c model files, and checkpoints that resume bit-for-bit.
//
// A checkpoint is a directory OUT/ckpt_<step> holding model.bin (llm.c format, fp32 master weights),
// state_rank<r>.bin (this rank's fp32 master, Adam m and v, and the working copy when it is not fp32,
// as spans of canonical = llm.c-order offsets, so a different layout can re-cut them), manifest.json
// (step, model, batch, topology, precision, seed) and DONE, written last. It is written under a
// temporary name and renamed into place, so a crash mid-write leaves the previous checkpoint intact.
#pragma once
#include "config.h"
#include "gpt.h"

#define MODEL_MAGIC 20240326
#define STATE_MAGIC 20261122

// Reads and validates a model file's header; returns its shape.
GPTShape model_file_shape(const char* path);
// Loads a model file (fp32 version 3 or bf16 version 5) into the parameters and master weights.
void model_file_load(GPT* g, Backend* be, const char* path);
// Writes the fp32 master weights as an llm.c model file (version 3).
void model_file_save(GPT* g, Backend* be, const char* path);
// GPT-2 initialization, a pure function of the seed (see init_tensor_values).
void model_init_random(GPT* g, Backend* be, unsigned long long seed);
// Writes a flat buffer (type dt) as fp32 tensors in llm.c order, no header (the -dump gradients).
void write_canonical_f32(GPT* g, Backend* be, const void* flat, DType dt, const char* path);

typedef struct {
    int step;                   // optimizer steps taken
    long long tokens_per_step;  // B * T * ga * data-parallel ranks
    unsigned long long seed;
} CheckpointInfo;

void checkpoint_save(GPT* g, Backend* be, const Config* cfg, const CheckpointInfo* info);
// Newest complete checkpoint directory in out_dir into path (size PATH_MAX); returns its step or -1.
int checkpoint_latest(const char* out_dir, char* path, size_t path_size);
// Restores master, moments and parameters from dir; checks the model shape; fills info.
void checkpoint_load(GPT* g, Backend* be, const char* dir, CheckpointInfo* info);
