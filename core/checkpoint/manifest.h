// manifest.h: a checkpoint's manifest.json and DONE. The manifest records what a resume needs besides the
// tensors ("format", step, tokens per step, seed, state files, loss-scale state, model, batch, precision,
// topology, data position, "crc32": every other file's CRC-32, and "run": the recorded hyperparameters,
// run_record.h); DONE, written last, holds the manifest's own CRC-32. Read back with a JSON parser
// (json.h): neither the key order nor the spacing matters.
//
// Formats: 1, before checksums: neither "format" nor "crc32", and an empty DONE; 2: "crc32" and DONE's
// CRC-32, no "format"; 3: the same with "format": 3. Only format 1 resumes unverified: an empty DONE
// beside a manifest of format 2 or 3 is damage.
#pragma once
#include <stdint.h>

#include "core/run/config.h"
#include "core/comm/grid.h"
#include "core/util/json.h"
#include "core/zero/loss_scale.h"
#include "core/zero/model_state.h"
#include "core/checkpoint/run_record.h"

#define MANIFEST_FORMAT 3   // what manifest_write writes; manifest_read reads it and every older one

typedef struct {
    int step;                   // optimizer steps taken
    long long tokens_per_step;  // B * T * ga * data-parallel ranks
    unsigned long long seed;
    DType dt;                   // the working copy's dtype ("precision"), which the state files hold
    int T;                      // the sequence length ("batch"), which cut the data into windows
    int ranks;                  // ranks that wrote state files (the world)
    int pp;                     // pipeline stages of the run that wrote it
    LossScaler scaler;          // fp16 loss-scale state, so a resumed run scales exactly as before
    int has_run;                // 0: a manifest from before the hyperparameters were recorded
    RunRecord run;              // the hyperparameters that define the run (run_record.h)
    int host_dirs;              // written into this many hosts' own directories (node-local -o); 0: one directory
    int checksums;              // 0: format 1, from before checksums: its files cannot be verified
    // A LoRA run's (lora.h): the checkpoint holds adapters.bin instead of model.bin, and the base's identity,
    // -e's model (a shape or a file) and the file's CRC-32 (0 for a shape).
    int has_base;
    char base_model[1024];
    uint32_t base_crc;
} CheckpointInfo;

// Writes path. crcs: [r] state_rank<r>.bin's CRC-32 for each world rank r, [world] model.bin's. host_dirs:
// how many hosts' own directories the checkpoint is written into (node-local -o), 0 for one directory.
void manifest_write(const char* path, const ModelState* ms, const Grid* g, const Config* cfg, const CheckpointInfo* info,
                    int host_dirs, const uint32_t* crcs);
// Writes dir/DONE, holding the CRC-32 of dir/manifest.json.
void manifest_write_done(const char* dir);
// The checkpoint's weights: adapters.bin (lora.h's adapter file) for a LoRA'd shape, else model.bin.
const char* manifest_weights_file(const ModelShape* s);

typedef struct {
    Json json;
    uint64_t hash;   // of the text: hosts compare their copies without sending them
} Manifest;

// Reads dir/manifest.json and fills info from it, checking every field (its step the directory's name) and
// the manifest against DONE: the CRC-32 DONE holds, or an empty DONE only beside a manifest of format 1.
// Without DONE (the caller's concern) nothing is checked against it. 1, or 0 with the problem in why;
// manifest_free either way.
int manifest_read(Manifest* m, const char* dir, CheckpointInfo* info, char* why, size_t why_size);
void manifest_free(Manifest* m);
// dir/name is a regular file and its bytes match the manifest's CRC-32 of it (format 1 records none). 1, or
// 0 with the problem in why.
int manifest_verify_file(const Manifest* m, const char* dir, const char* name, char* why, size_t why_size);
