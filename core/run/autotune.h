// autotune.h: --autotune, the layout search. Enumerates the layouts of -w ranks (ZeRO stage, -offload, -r,
// -pp with each schedule, -tp and -sp, and every -b x -ga x replicas split of the global batch), keeps those
// the trainer accepts (its own checks, run in forked children so that a refusal ends the child, not the
// search) and whose plan fits -gpu-mem and -host-mem (the planner, estimate.h, in this process), ranks them by
// a cost model, times the cheapest -autotune-trials of them for -autotune-steps steps each (this binary under
// mpirun), prints a table and the fastest's command line, and writes both to autotune.json. Context
// parallelism (-cp) joins the search as one more loop in enumerate() once the trainer has it.
#pragma once
#include "core/run/estimate.h"

// When argv asks for --autotune: runs the search and exits (0 when a layout was timed, else one line and 1);
// otherwise returns at once. Called before MPI starts: the search runs in one process and launches each
// trial itself. resolve: the trainer's reading of -e (a model file's header, a catalog name or a spec), as
// the planner gets the trainer's allocation code: the search stays below the checkpoint files.
typedef ModelShape (*ModelResolver)(const char* model, int* is_spec);
void autotune_if_asked(StatePlanner states, ModelResolver resolve, int argc, char** argv);
