// grid.h: the ranks as a grid of pipeline stages x data-parallel replicas (picotron's process grid).
//
// World rank = stage * dp + dp_rank: the ranks of one stage are neighbours (ZeRO's collectives, the
// heaviest traffic, stay inside a node first), and world rank 0 is stage 0 of replica 0. Groups:
//   dp    the dp ranks of one stage: ZeRO shards and reduces inside it
//   pp    the stages of one replica, ordered by stage: activations and gradients flow along it
//   tied  stage 0 and stage pp-1 of one replica: the two copies of the tied embedding sum their
//         gradients over it (NULL with one stage, and on the stages in between)
// With one stage, dp is the world itself and pp is NULL; with one replica, dp is a group of one.
#pragma once
#include "comm.h"

typedef struct {
    int pp, dp;            // grid size: stages x replicas
    int stage, dp_rank;    // this rank's coordinates
    Comm* world;
    Comm* dp_group;
    Comm* pp_group;
    Comm* tied;
} Grid;

// Fails with one line unless `ranks` (launched or planned) factor into `stages` equal stages.
void grid_check(int stages, int ranks);
// Collective over world, whose size pipeline_plan has checked with grid_check.
void grid_create(Grid* g, Comm* world, int stages);
void grid_destroy(Grid* g);   // frees the sub-groups, not the world
static inline int grid_first_stage(const Grid* g) { return g->stage == 0; }
static inline int grid_last_stage(const Grid* g) { return g->stage == g->pp - 1; }
