// estimate.h: --estimate, the memory plan. It runs the trainer's own allocation code (zero.c, gpt.c) in
// counting mode (mem_alloc with no backend), so the plan is what a run allocates, not a second formula.
#pragma once
#include "config.h"
#include "memory.h"
#include "model.h"

// Bytes per category one rank would allocate: pipeline stage `stage` of cfg's -pp with `dp` replicas,
// ZeRO stage `zero`, recompute level `recompute` (cfg supplies precision, b, t and ga).
void memory_plan(MemLedger* out, const Config* cfg, const GPTShape* s, int dp, int stage, int zero, int recompute);
// Prints the plan for this configuration, a table across ZeRO stages and world sizes, and activation bytes
// per recompute level; then a one-line JSON record of the configuration's plan for scripts.
void print_memory_plan(const Config* cfg, const GPTShape* s, int ranks);
