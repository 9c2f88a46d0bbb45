// estimate.h: --estimate, the memory plan. It runs the trainer's own allocation code (zero.c, walk.c) in
// counting mode (mem_alloc with no backend), so the plan is what a run allocates, not a second formula.
#pragma once
#include "core/run/config.h"
#include "core/model/memory.h"
#include "core/model/model.h"
#include "core/pipeline/pipeline.h"
#include "core/zero/nvme_store.h"

// The bytes one stage's model states (parameters, gradients, master weights, Adam) take on data-parallel
// rank dp_rank of dp under ZeRO stage `zero`, with what cfg says of precision, -offload and -dpu. The policy
// above the orchestration answers it (the trainer passes ZeRO's own allocation code in counting mode), so
// this planner stays below it.
typedef void (*StatePlanner)(MemLedger* mem, const ParamLayout* lay, const Config* cfg, int zero, int dp_rank, int dp);

// Before anything is allocated: this rank's planned host state (-offload) against its share of the host's
// available memory, and its state files (-nvme) against its share of DIR's free space (creating DIR); a
// one-line error when either does not fit. mine: this rank's -nvme files, reused when there from a run before.
void check_room(StatePlanner states, const Config* cfg, const ParamLayout* lay, int dp_rank, int dp, int local_ranks,
                const NvmeConfig* mine);
// Prints the plan for this configuration (what every data-parallel rank allocates), a table across ZeRO
// stages and world sizes, and activation bytes per recompute level; then a one-line JSON record of the
// configuration's plan for scripts. With -gpu-mem, the largest shape of the family that fits, with -lora's
// adapters on each.
void print_memory_plan(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks);

// The heaviest stage's bytes per rank for cfg's layout on `ranks` ranks, on the device and on the host: the
// plan --estimate prints (its plan and plan_stages records), for --autotune's filter.
typedef struct {
    size_t device, host;
} PlanPeak;
PlanPeak plan_peak(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks);
