// zero.h: ZeRO over the layer-ordered flat parameter buffer (the table in docs/ARCHITECTURE.md).
//
// Every unit (the embeddings, each block, the final unit: final norm and an untied LM head) is padded to a
// multiple of 64·N elements (layout_pad_multiple in model.h), so it splits into N equal "pieces", one per
// rank of the data-parallel group. Rank r's piece of unit u is [u.offset + r·piece_u, + piece_u). A
// configuration is described by what it shards (ZeroCaps); -z only names one of four (zero_caps). What each
// capability changes:
//   none          full params, grads, master, optimizer state; grads all-reduced at the step boundary
//   shard_state   master + optimizer state are pieces; grads accumulate in full and are reduce-scattered at the
//                 boundary; each rank updates its pieces, then the params are all-gathered
//   shard_grads   each unit's gradient is reduce-scattered as soon as its backward is done, into an fp32
//                 piece accumulator; only the walk's gradient slots exist: two rotating ones for the blocks,
//                 one for the embedding unit (which an untied head's final unit shares)
//   shard_params  params are pieces: each unit is all-gathered when the walk uses it and released after, a
//                 block before its forward and again before its backward into one of two rotating slots,
//                 the embedding and final units into slots of their own (one they share with an untied head),
//                 which keep the gather until another unit needs the slot or the parameters change
//   state_on_host the master + optimizer state held here (whole or pieces) live in host memory; the optimizer
//                 updates them there, one staged chunk of a span at a time (core/zero/optimizer.c)
//   grads_on_host (with shard_grads) the fp32 piece accumulator lives in host memory: each unit's piece comes
//                 down as its reduce-scatter finishes, during the backward, and is added there
//   params_on_host (with shard_params) the working parameter pieces live in host memory: a gather starts by
//                 uploading this rank's piece, and the optimizer writes the new pieces in place
//                 (ZeRO-Infinity's shape: the device holds the walk's buffers, the host the model)
//   state_on_disk (with state_on_host) the master + optimizer state live in files (core/zero/nvme_store.h) that the
//                 optimizer streams through a fixed pool of host buffers; params_on_disk (with params_on_host)
//                 the parameter pieces too, read for each gather (ZeRO-Infinity's NVMe offload)
// The optimizer's state is what the kinds' optimizers describe (core/model/optimizer_kind.h: AdamW's m, v):
// a frozen tensor has no master and no state, so the state covers the held pieces of the units' trained
// sections (model.h: Unit), which split evenly like the frozen ones: every rank holds an equal share of both.
// Overlap (shard_grads, shard_params): a unit's reduce-scatter runs while the next unit's backward
// computes, and the gather of the unit the walk will ask for next runs while the current one computes
// (core/zero/grad_slots.h and core/zero/param_slots.h explain when).
//
// The layers below see ZeRO only through interfaces it fills: the walk (walk.c) through a ParamStore, the
// optimizer and the checkpoints through a ModelState, --estimate through the trainer's StatePlanner around
// zero_plan. Zero itself is private to zero.c.
#pragma once
#include "core/comm/comm.h"
#include "core/comm/host_groups.h"
#include "core/model/memory.h"
#include "core/model/model.h"
#include "core/zero/model_state.h"
#include "core/zero/nvme_store.h"
#include "core/model/param_store.h"

// What is sharded over the data-parallel group, and where the state lives. Each shard_* implies the one
// before it: sharded gradients are reduced into pieces, which only sharded state can consume, and gathered
// parameters need their gradients reduced unit by unit. state_on_host composes with any of them.
typedef struct {
    int shard_state;    // fp32 master weights and the optimizer's state (AdamW's m, v)
    int shard_grads;    // gradients, reduced unit by unit during the backward
    int shard_params;   // working parameters, gathered unit by unit for the walk
    int state_on_host;  // the master and state this rank holds live in (pinned) host memory, where the optimizer
                        // updates them; the reduced gradient comes down and the working copy goes up (-offload)
    int grads_on_host;  // shard_grads and state_on_host: the reduced gradient pieces accumulate on the host
    int params_on_host; // shard_params and grads_on_host: the working parameter pieces live on the host
    int delayed_update; // state_on_host and -dpu: host buffers for the update in flight (model_state.h)
    int state_on_disk;  // state_on_host and -nvme: master and state in files, streamed through host buffers
    int params_on_disk; // params_on_host and state_on_disk: the parameter pieces in a file too
    int hpz;            // shard_params: ranks per secondary group, which gather the backward's parameters from a
                        // secondary shard (ZeRO++'s hpZ, core/zero/hpz.h); 0 or 1: none
    int qw;             // shard_params: the gathers over the data-parallel group send int8 blocks (ZeRO++'s qwZ,
                        // core/zero/qwz.h)
    int qg;             // shard_grads: the gradient reduce-scatter is ZeRO++'s quantized, hierarchical one (qgZ,
                        // core/zero/qgz.h)
    int onebit;         // -opt adam1bit: 1-bit Adam's buffers (core/zero/onebit_adam.h)
} ZeroCaps;

// -z: stage 0 shards nothing, 1 the state, 2 also the gradients, 3 also the parameters. Everything stays in
// backend memory; -offload moves some of it to the host (zero_offload).
ZeroCaps zero_caps(int stage);
// -offload on top of caps: 1 moves the optimizer state to the host, 2 also what the stage shards of the
// gradients and the parameters (grads_on_host with shard_grads, params_on_host with shard_params).
ZeroCaps zero_offload(ZeroCaps caps, int level);
// -nvme on top of -offload: what lives on the host moves to disk, except the gradient pieces.
ZeroCaps zero_on_disk(ZeroCaps caps, int on);
// ZeRO++ on top of shard_params: -hpz's secondary groups of hpz ranks (hpz <= 1: none), -qw's quantized gathers
// (without shard_params: neither); on top of shard_grads, -qg's quantized gradient reduction.
ZeroCaps zero_plusplus(ZeroCaps caps, int hpz, int qw, int qg);

typedef struct Zero Zero;

// dp: the data-parallel group (NULL for a single process). tied: with a pipeline, the group joining this
// replica's first and last stage (grid.h), over which the embedding unit's reduced gradients are summed
// with its mirror's in zero_reduce_grads; NULL otherwise. hpz: with caps.hpz > 1, the grid's hpz group (of
// caps.hpz ranks); NULL otherwise. disk: where and how the state on disk lives
// (state_on_disk; else NULL).
Zero* zero_create(Backend* be, MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, Comm* dp, Comm* tied, Comm* hpz,
                  DType dt, const NvmeConfig* disk);
void zero_destroy(Zero* z, Backend* be);
// The bytes per category zero_create would allocate on rank 0 of `size` ranks, without allocating.
void zero_plan(MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, int size, DType dt, const NvmeConfig* disk);
// The same for rank `rank` (every rank allocates the same: the check of that).
void zero_plan_rank(MemLedger* mem, const ParamLayout* lay, ZeroCaps caps, int rank, int size, DType dt, const NvmeConfig* disk);

// The interfaces below ZeRO; both stay valid until zero_destroy.
ParamStore zero_param_store(Zero* z);
ModelState zero_model_state(Zero* z);

// Step boundary (train_gpt.cu): zero the gradients before the first micro-step; after the last one,
// reduce what the walk has not (all-reduce, or reduce-scatter into pieces with shard_state), then sum the
// tied embedding's gradients with the other stage's copy.
void zero_begin_step(Zero* z, Backend* be);
void zero_reduce_grads(Zero* z, Backend* be);
// 1-bit Adam (onebit caps), before zero_begin_step: on, the step is past its freeze: the walk keeps this
// rank's gradient unreduced and zero_reduce_grads exchanges the momentum (beta1, the loss scale the gradients
// carry) into the reduced-gradient buffer instead (core/zero/onebit_adam.h); off, the reduction as before.
void zero_onebit_local(Zero* z, int on, float beta1, float loss_scale);
// qg caps: the data-parallel group split by host (the grid's qgz groups), before the first step.
void zero_qgz_groups(Zero* z, const HostGroups* groups);
// qg caps: the time the gradient reduction spent quantizing and dequantizing since the last call (-lb).
double zero_quantize_seconds(Zero* z);
// After the optimizer wrote its spans: gather the updated parameters as the capabilities require.
void zero_after_update(Zero* z, Backend* be);
// grads_on_host / params_on_host: wall time spent in the walk copying pieces to and from the host and adding
// them there since the last call (the copies wait for the backend; -lb shows it). 0 without them.
double zero_host_copy_seconds(Zero* z);

// Whole-model transfers through host memory (fp32, flat layout, layout->total elements): set the
// parameters and master weights (initialization, model files); read back the master weights or the
// reduced gradients (model files, -dump). Collective: every rank of the group must call them; a rank
// that passes flat = NULL to a read-back only takes part in the gathers.
void zero_set_from_host(Zero* z, Backend* be, const float* flat);
void zero_master_to_host(Zero* z, Backend* be, float* flat);
void zero_grads_to_host(Zero* z, Backend* be, float* flat);
