// report.h: what the trainer tells a person and its log, apart from the per-step line: the layout, each
// rank's memory per category and bytes per collective (gathered to rank 0), the wall-clock breakdown per
// phase, and the FLOPs that MFU is measured against. Rank 0 prints; every rank takes part in the gathers.
#pragma once
#include "core/comm/comm.h"
#include "core/run/config.h"
#include "core/model/walk.h"
#include "core/comm/grid.h"
#include "core/util/logger.h"
#include "core/model/memory.h"
#include "core/model/model.h"
#include "core/util/phase_timer.h"
#include "core/pipeline/pipeline.h"

// A double as JSON: non-finite values (a skipped step's loss or norm) become null, which JSON can express.
const char* json_number(char* buf, size_t size, double x);

// The flat buffer's units (padded elements each), so memory and traffic can be checked against the layout.
void report_layout(Logger* log, const ParamLayout* lay, const Config* cfg, int ranks, int first_step);
// Each rank's bytes per category, and what recompute saves against -r 0.
void report_memory(Logger* log, Comm* world, const MemLedger* mem, const Config* cfg, const Model* chunks, int num_chunks,
                   int first_step);
// Bytes each rank sent per collective (over all its groups) since the last call; then the counters reset.
void report_comm(Logger* log, const Grid* g, int step);
void report_comm_reset(const Grid* g);   // before a step: validation, samples and checkpoints are not its traffic

// Rank 0: the opt-in kernel variants (base/gpu_variants.h) in use, on the console and in the log, so a timing
// names what ran. Nothing when none is.
void report_variants(Logger* log, Backend* be, int first_step);
// Rank 0: the pipeline's schedule, blocks per stage and theoretical bubble (console and log), and a warning
// when -ga leaves most of each step to the bubble. Nothing without a pipeline.
void report_pipeline_plan(Logger* log, const PipelinePlan* plan, int first_step);

// Collective: rank 0 prints and logs its phases and, with a pipeline, each stage's forward, backward and
// waiting time (replica 0's ranks) next to the bubble the plan's schedule predicts.
void report_breakdown(Logger* log, const Grid* g, int step, const PhaseTimer* pt, const PipelinePlan* plan);

// Model FLOPs per token: 6 per parameter (forward + backward matmuls) plus attention's 12·L·C·T.
double model_flops_per_token(const ParamLayout* lay, int T);
// Dense bf16 tensor-core peak of the GPUs we know, from the device name; 0 when unknown (no MFU shown).
double gpu_peak_flops(const Backend* be);
