// grid.c: see grid.h.
#include "core/comm/grid.h"

#include <stdio.h>

#include "base/common.h"

void grid_check(int stages, int tp, int cp, int ranks) {
    if (tp < 1) fail("-tp %d: the tensor-parallel degree must be positive", tp);
    if (cp < 1) fail("-cp %d: the context-parallel degree must be positive", cp);
    if (ranks % tp != 0) fail("-tp %d does not divide the %d ranks into tensor groups (launch a multiple of %d ranks)", tp, ranks, tp);
    if (ranks % (tp * cp) != 0)
        fail("-cp %d does not divide the %d ranks into context groups of %d (launch a multiple of %d ranks)", cp, ranks, cp * tp,
             cp * tp);
    if (stages < 1 || ranks % (stages * tp * cp) != 0)
        fail("-pp %d does not divide the %d ranks into equal stages (launch a multiple of %d ranks)", stages, ranks, stages * tp * cp);
}

// Every rank takes part in each split; a rank outside a group joins none (no NCCL communicator of one).
static Comm* split_or_null(Comm* world, int member, int color, int key) {
    return comm_split(world, member ? color : COMM_NO_GROUP, key);
}

void grid_check_hpz(int n, int dp) {
    if (n > 1 && dp % n) fail("-hpz %d does not divide the data-parallel group of %d ranks into secondary groups", n, dp);
}

// The hpz groups: n consecutive ranks of each dp group.
static void split_hpz(Grid* g, int n) {
    grid_check_hpz(n, g->dp);
    int groups_per_stage = g->dp / n;
    int color = (g->stage * g->tp + g->tp_rank) * groups_per_stage + g->dp_rank / n;
    g->hpz_group = comm_split(g->world, color, g->dp_rank % n);
}

void grid_create(Grid* g, Comm* world, int stages, int tp, int cp, int tied_head, int kv_copies, int hpz, int qgz) {
    int rank = comm_rank(world), ranks = comm_size(world);
    if (stages < 1 || tp < 1 || cp < 1 || ranks % (stages * tp * cp) != 0)
        fail("internal: grid of %d stages x cp %d x tp %d on %d ranks (pipeline_plan checks this)", stages, cp, tp, ranks);
    if (kv_copies < 1 || tp % kv_copies != 0) fail("internal: %d copies of each kv head on %d tensor ranks", kv_copies, tp);
    memset(g, 0, sizeof(*g));
    g->world = world;
    g->pp = stages;
    g->tp = tp;
    g->dp = ranks / (stages * tp);
    g->tp_rank = rank % tp;
    g->dp_rank = rank / tp % g->dp;
    g->stage = rank / (tp * g->dp);
    g->cp = cp;
    g->cp_rank = g->dp_rank % cp;
    g->replicas = g->dp / cp;
    g->replica = g->dp_rank / cp;
    if (cp > 1) g->cp_group = comm_split(world, (g->stage * g->replicas + g->replica) * tp + g->tp_rank, g->cp_rank);
    if (hpz > 1) split_hpz(g, hpz);
    // No sub-groups: ZeRO works on the world. With any (a context group too) the data-parallel group is its own,
    // so that the bytes it sends are logged apart from the others' (report.c).
    if (stages == 1 && tp == 1 && cp == 1) {
        g->dp_group = world;
    } else {
        g->dp_group = comm_split(world, g->stage * tp + g->tp_rank, g->dp_rank);
        g->tp_group = split_or_null(world, tp > 1, g->stage * g->dp + g->dp_rank, g->tp_rank);
        g->pp_group = split_or_null(world, stages > 1, g->dp_rank * tp + g->tp_rank, g->stage);
        g->tied = split_or_null(world, stages > 1 && tied_head && (grid_first_stage(g) || grid_last_stage(g)), g->dp_rank * tp + g->tp_rank, g->stage);
        g->kv_copies = split_or_null(world, kv_copies > 1, rank / kv_copies, g->tp_rank);
    }
    if (qgz) g->qgz = host_groups_split(g->dp_group, comm_host_leader(world));
}

void grid_destroy(Grid* g) {
    host_groups_free(&g->qgz);
    comm_free(g->hpz_group);
    if (g->dp_group != g->world) comm_free(g->dp_group);
    comm_free(g->pp_group);
    comm_free(g->tp_group);
    comm_free(g->cp_group);
    comm_free(g->tied);
    comm_free(g->kv_copies);
    memset(g, 0, sizeof(*g));
}

void grid_describe(const Grid* g, char* out, size_t n) {
    int at = snprintf(out, n, "%d stage%s x %d replica%s", g->pp, g->pp > 1 ? "s" : "", g->replicas, g->replicas > 1 ? "s" : "");
    if (g->cp > 1 && at >= 0 && (size_t)at < n) at += snprintf(out + at, n - (size_t)at, " x %d context ranks", g->cp);
    if (g->tp > 1 && at >= 0 && (size_t)at < n) at += snprintf(out + at, n - (size_t)at, " x %d tensor ranks", g->tp);
    if (g->hpz_group && at >= 0 && (size_t)at < n) snprintf(out + at, n - (size_t)at, ", hpZ groups of %d", comm_size(g->hpz_group));
}
