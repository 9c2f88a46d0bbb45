// grid.c: see grid.h.
#include "grid.h"

#include "base/common.h"

void grid_check(int stages, int ranks) {
    if (stages < 1 || ranks % stages != 0)
        fail("-pp %d does not divide the %d ranks into equal stages (launch a multiple of %d ranks)", stages, ranks, stages);
}

void grid_create(Grid* g, Comm* world, int stages) {
    int rank = comm_rank(world), ranks = comm_size(world);
    if (stages < 1 || ranks % stages != 0) fail("internal: grid of %d stages on %d ranks (pipeline_plan checks this)", stages, ranks);
    memset(g, 0, sizeof(*g));
    g->world = world;
    g->pp = stages;
    g->dp = ranks / stages;
    g->stage = rank / g->dp;
    g->dp_rank = rank % g->dp;
    if (stages == 1) {   // no sub-groups: ZeRO works on the world, as without a pipeline
        g->dp_group = world;
        return;
    }
    g->dp_group = comm_split(world, g->stage, g->dp_rank);
    g->pp_group = comm_split(world, g->dp_rank, g->stage);
    // Every rank takes part in the split; the stages in between get a group of one and drop it.
    int tied = grid_first_stage(g) || grid_last_stage(g);
    g->tied = comm_split(world, tied ? g->dp_rank : g->dp + rank, g->stage);
    if (!tied) {
        comm_free(g->tied);
        g->tied = NULL;
    }
}

void grid_destroy(Grid* g) {
    if (g->dp_group != g->world) comm_free(g->dp_group);
    comm_free(g->pp_group);
    comm_free(g->tied);
    memset(g, 0, sizeof(*g));
}
