// checkpoint.h: checkpoints that resume bit-for-bit, under any topology.
//
// A checkpoint is a directory OUT/ckpt_<step> holding model.bin (llm.c format, fp32 master weights; a -lora
// run's holds adapters.bin instead, the adapters only, and its manifest the base's "model" and CRC-32),
// state_rank<r>.bin (world rank r's pieces of the fp32 master and optimizer state, and the working copy
// when it is not fp32, as spans of canonical = llm.c-order offsets, so another world size, ZeRO stage or pipeline
// split can re-cut them), manifest.json (format, step, tokens per step, seed, state_files, loss-scale
// state, model, batch, precision, topology, data, "crc32": every other file's CRC-32, and "run": the
// recorded hyperparameters, run_record.h) and DONE, written last, holding the manifest's CRC-32. It is
// written as OUT/ckpt_tmp and renamed into place, so a crash mid-write leaves the previous checkpoint
// intact.
#pragma once
#include "core/run/config.h"
#include "core/comm/grid.h"
#include "core/checkpoint/manifest.h"
#include "core/zero/model_state.h"
#include "core/checkpoint/run_dir.h"

// Written into a failure's why when a node-local checkpoint's file is on another host.
#define CHECKPOINT_COPY_HINT "copy the hosts' checkpoint directories onto one shared filesystem, or resume on the hosts that hold them"

// Collective over the grid: every rank writes its state file, each stage its part of the model file,
// rd's managers the manifest, DONE and then the rename of OUT/ckpt_tmp to OUT/ckpt_<step> (its path into
// dir). Spans of the tied embedding's mirror are left out (stage 0 writes wte). With node-local
// directories (run_dir.h) each rank's state file lands in its host's directory, the manifest and DONE in
// every host's, and model.bin in rank 0's only: writers on other hosts send their parts to rank 0.
void checkpoint_save(const ModelState* ms, Backend* be, const Grid* g, const Config* cfg, const RunDir* rd, const CheckpointInfo* info,
                     char* dir, size_t dir_size);

// Copies that must stay bit-identical and that checkpoint_save writes once: the tied embedding's two copies
// (stage 0's and the last stage's mirror, over Grid.tied) and the tensors a tensor group holds whole (over
// Grid.tp_group). Collective over group (1 where it is NULL): whether the spans `pick` selects hold the same
// fp32 masters and working parameters on every rank of it. The group's ranks must hold the same spans of
// the picked tensors (the same layout of them and the same ZeRO pieces), in the same order.
typedef int (*CopyPick)(const ParamTensor* t, const ParamLayout* lay);
int copies_agree(const ModelState* ms, Backend* be, Comm* group, CopyPick pick);
int copy_in_embedding_unit(const ParamTensor* t, const ParamLayout* lay);     // the tied pair's copies
int copy_held_whole_by_group(const ParamTensor* t, const ParamLayout* lay);   // a tensor group's copies
int copy_of_kv_head(const ParamTensor* t, const ParamLayout* lay);            // a kv head's copies (Grid.kv_copies)

// Checks everything a resume relies on without loading or exiting: the manifest's fields (its step the
// directory's name, and against DONE when there is one: manifest_read), model.bin's size, each state
// file's header (the rank its name says, the model's size, the manifest's dtype) and spans, and that the
// state files together hold every parameter exactly once. Returns 1 and fills info, or 0 with the problem
// in why. The files' checksums are checkpoint_find's.
int checkpoint_inspect(const char* dir, const ModelShape* shape, CheckpointInfo* info, char* why, size_t why_size);
// The newest checkpoint in out_dir that is usable: it has DONE, its manifest matches DONE and every file
// its CRC-32 in the manifest (each read once, here), and then it passes checkpoint_inspect. Its path and
// step; -1 when out_dir has no checkpoint at all. A checkpoint whose files do not verify is damaged,
// whatever its headers say: skipped with a warning (when verbose) for the one before. A verified one
// whose model.bin names another shape is another run: a one-line error; so is every one being damaged.
// A checkpoint of manifest format 1 (manifest.h: from before checksums) cannot be verified, so it is
// taken as its files are, with a note naming it (when verbose).
int checkpoint_find(const char* out_dir, const ModelShape* shape, char* path, size_t path_size, int verbose);
// A one-line error when dir's model.bin names another shape: called once its bytes verified, so the header
// is the writer's (another run), not damage. A header that cannot be read is left to the inspection.
void checkpoint_refuse_other_shape(const char* dir, const ModelShape* want);
// The note for a checkpoint that cannot be verified (info->checksums 0), naming dir; nothing otherwise.
void checkpoint_note_unverified(const char* dir, const CheckpointInfo* info);
// Restores parameters, master weights and optimizer state from dir, which passed checkpoint_inspect (info is
// what it filled: nothing is checked twice), whatever topology and ZeRO stage wrote it: each rank reads every
// state file and keeps what it owns, seeking past other stages' spans.
void checkpoint_load(const ModelState* ms, Backend* be, const char* dir, const CheckpointInfo* info);

// Node-local directories (run_dir.h), collective over the world. find: the newest checkpoint complete on
// every host, the same on every rank: DONE and the same manifest in each host's directory, model.bin in at
// least one and each state file in at least one, each verified against its CRC-32 by the lowest rank that
// has it; then, as checkpoint_find, another shape is a one-line error, and the files pass
// checkpoint_inspect's checks (model.bin's size wherever it is, each state file read by its lowest holder,
// the spans together covering every parameter once). Newer ones incomplete or damaged on some host are
// skipped with a warning (when verbose); -1 when no host has a checkpoint; a one-line error when none is
// complete everywhere. load: checkpoint_load's result for any topology, each state file read by that
// lowest rank and broadcast to every rank; model.bin is not needed (the state files hold every value a
// rank keeps).
int checkpoint_find_hosts(const char* out_dir, Comm* world, const ModelShape* shape, char* path, size_t path_size,
                          CheckpointInfo* info, int verbose);
void checkpoint_load_hosts(const ModelState* ms, Backend* be, Comm* world, const char* dir, const CheckpointInfo* info);

// One-line errors unless the checkpoint in dir continues this launch: its recorded hyperparameters against
// this launch's (older manifests record only what may never change: the tokens per step, -t, -seed and -p),
// no -dump, and not past this run's last step; a LoRA run's on its base (the same file's bytes or the same
// shape), whose -e path then goes into info->base_model for checkpoint_load. root: rank 0 prints what -y 2 accepts.
void checkpoint_check_resume(CheckpointInfo* info, const Config* cfg, int max_steps, long long tokens_per_step,
                             const char* dir, int root);
