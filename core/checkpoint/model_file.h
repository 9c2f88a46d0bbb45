// model_file.h: llm.c model files: a 256 x int32 header [20240326, version (3 = fp32, 5 = bf16), maxT, V, L,
// NH, C, Vp, family, the family's fields...], then the family's tensors in its kinds' order, each stacked
// over layers ("canonical" offsets). GPT-2's files are llm.c's: family 0 and nothing after it.
#pragma once
#include <stdio.h>

#include "core/model/model.h"

#define MODEL_MAGIC 20240326

// Reads and validates a model file's header and size; returns its shape.
ModelShape model_file_shape(const char* path);
// A checkpoint's dir/model.bin, without exiting: a regular file of an fp32 model of shape s. 1, or 0 with
// the problem in why.
int model_file_inspect(const char* dir, const ModelShape* s, char* why, size_t why_size);
// The shape a model file's header names, without exiting: 0 when path is not a readable model file.
int model_file_peek_shape(const char* path, ModelShape* shape);
// A one-line error unless the file's shape is the expected one.
void model_file_check_shape(const ModelShape* file, const ModelShape* want, const char* path);
// Positions f at canonical offset c, in elements of elem bytes after `header` bytes.
void model_file_seek(FILE* f, const char* path, size_t header, size_t c, size_t elem);
// Model values as host fp32 in the flat layout (layout->total elements, padding zero); caller frees.
float* model_file_read(const ParamLayout* lay, const char* path);   // fp32 version 3 or bf16 version 5
float* model_init(const ParamLayout* lay, unsigned long long seed);   // the family's init, a function of the seed
// -e's model: a shape (*is_spec 1: shape_from_spec) or a model file's; a one-line error for neither.
ModelShape model_resolve(const char* model, int* is_spec);
// The run's starting values: the family's init (is_spec) or the model file's. A family built on another
// (LoRA, lora.h) reads the base's kinds from the base's file, and its own kinds start from `adapters` (an
// adapter file) when not NULL, else by their init rules.
float* model_start(const ParamLayout* lay, const char* model, int is_spec, unsigned long long seed, const char* adapters);
// Writes host fp32 flat values as an llm.c model file (version 3), or with header = 0 as the bare
// tensors in llm.c's order (the -dump gradients). Whole-model layouts write everything; a pipeline writes
// a file in parts: model_file_create sizes it (zero-filled), then each stage writes its own tensors.
void model_file_write(const ParamLayout* lay, const float* flat, const char* path, int header);
void model_file_create(const ModelShape* s, const char* path, int header);
void model_file_write_part(const ParamLayout* lay, const float* flat, const char* path, int header);
