// checkpoint.h: llm.c model files, and checkpoints that resume bit-for-bit.
//
// A checkpoint is a directory OUT/ckpt_<step> holding model.bin (llm.c format, fp32 master weights),
// state_rank<r>.bin (DP rank r's pieces of the fp32 master, Adam m and v, and the working copy when it is
// not fp32, as spans of canonical = llm.c-order offsets, so another world size or ZeRO stage can re-cut
// them), manifest.json (step, model, batch, topology, precision, seed) and DONE, written last. It is written under a
// temporary name and renamed into place, so a crash mid-write leaves the previous checkpoint intact.
#pragma once
#include "config.h"
#include "grid.h"
#include "loss_scale.h"
#include "zero.h"

#define MODEL_MAGIC 20240326
#define STATE_MAGIC 20261122

// Reads and validates a model file's header and size; returns its shape.
GPTShape model_file_shape(const char* path);
// Model values as host fp32 in the flat layout (layout->total elements, padding zero); caller frees.
float* model_file_read(const ParamLayout* lay, const char* path);   // fp32 version 3 or bf16 version 5
float* model_init(const ParamLayout* lay, unsigned long long seed);   // GPT-2's init, a function of the seed
// Writes host fp32 flat values as an llm.c model file (version 3), or with header = 0 as the bare
// tensors in llm.c's order (the -dump gradients). Whole-model layouts write everything; a pipeline writes
// a file in parts: model_file_create sizes it (zero-filled), then each stage writes its own tensors.
void model_file_write(const ParamLayout* lay, const float* flat, const char* path, int header);
void model_file_create(const GPTShape* s, const char* path, int header);
void model_file_write_part(const ParamLayout* lay, const float* flat, const char* path, int header);

typedef struct {
    int step;                   // optimizer steps taken
    long long tokens_per_step;  // B * T * ga * data-parallel ranks
    unsigned long long seed;
    int ranks;                  // ranks that wrote state files (the world)
    int pp;                     // pipeline stages of the run that wrote it
    LossScaler scaler;          // fp16 loss-scale state, so a resumed run scales exactly as before
} CheckpointInfo;

// Collective over the grid: every rank writes its state file, each stage its part of the model file,
// rank 0 the manifest. Spans of the tied embedding's mirror are left out (stage 0 writes wte).
void checkpoint_save(Zero* z, Backend* be, const Grid* g, const Config* cfg, const CheckpointInfo* info);
// Newest complete checkpoint directory in out_dir into path; returns its step or -1.
int checkpoint_latest(const char* out_dir, char* path, size_t path_size);
// Restores parameters, master weights and Adam state from dir, whatever topology and ZeRO stage wrote it
// (each rank reads every state file and keeps what it owns, seeking past other stages' spans); checks
// the model shape; fills info.
void checkpoint_load(Zero* z, Backend* be, const char* dir, CheckpointInfo* info);
