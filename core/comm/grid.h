// grid.h: the ranks as a grid of pipeline stages x data-parallel replicas x context ranks x tensor-parallel
// ranks (picotron's process grid; Megatron's order with context parallelism).
//
// World rank = ((stage * replicas + replica) * cp + cp_rank) * tp + tp_rank: a tensor group's ranks are
// neighbours (its collectives, two per block and direction, must stay inside a node), then a context group's
// (four all-to-alls per block), then a stage's replicas (ZeRO's collectives), and world rank 0 is stage 0 of
// replica 0's context rank 0's tensor rank 0. dp_rank = replica * cp + cp_rank counts the data-parallel
// group, which holds the context ranks too: each holds a part of every sequence, so its weight gradients
// are partial sums over tokens, as a replica's are. Groups:
//   tp    the tp ranks of one stage and replica: each holds a shard of every block (model.h); the walk
//         all-reduces the row-parallel projections' outputs and the column-parallel inputs' gradients in it
//   dp    the replicas x context ranks of one stage with the same tensor rank: ZeRO shards and reduces inside it
//   cp    the context ranks of one stage, replica and tensor rank, ordered by position: each holds t / cp of
//         every sequence, and attention's all-to-alls run in it (NULL with cp = 1)
//   pp    the stages of one replica and tensor rank, ordered by stage: activations and gradients flow along it
//   tied  stage 0 and stage pp-1 of one replica and tensor rank: the two copies of the tied embedding sum
//         their gradients over it (NULL with one stage, on the stages in between, and for an untied head)
//   hpz   with -hpz N (ZeRO++'s hierarchical partition, zero.h): N consecutive ranks of the dp group, which gather
//         the parameters of the backward from their secondary shards (NULL without -hpz)
//   qgz   with -qg 1 (ZeRO++'s quantized gradients, core/zero/qgz.h): the dp group split by host
//         (host_groups.h): its intra-host and inter-host groups (NULL without -qg)
//   kv_copies  the tp / KV neighbouring ranks of a tensor group that hold copies of one kv head, when the
//         model has fewer kv heads than -tp: those heads' gradients sum over it (NULL otherwise)
// With one stage, tp = 1 and cp = 1, dp is the world itself; pp is NULL with one stage, tp NULL with tp = 1.
// replicas and replica: which micro-batches a rank reads (the context ranks of one replica read the same).
#pragma once
#include "core/comm/comm.h"
#include "core/comm/host_groups.h"

typedef struct {
    int pp, dp, tp;                 // grid size: stages x (replicas x context ranks) x tensor ranks
    int stage, dp_rank, tp_rank;    // this rank's coordinates
    int cp, cp_rank;                // context ranks per replica, and this rank's (dp_rank % cp)
    int replicas, replica;          // dp / cp, and this rank's (dp_rank / cp)
    Comm* world;
    Comm* dp_group;
    Comm* pp_group;
    Comm* tp_group;
    Comm* cp_group;
    Comm* tied;
    Comm* kv_copies;
    Comm* hpz_group;
    HostGroups qgz;
} Grid;

// Fails with one line unless `ranks` (launched or planned) factor into `stages` equal stages of replicas of
// cp context ranks of tp-rank tensor groups (the model's family checks what tp must divide).
void grid_check(int stages, int tp, int cp, int ranks);
// Collective over world, whose size pipeline_plan has checked with grid_check. tied_head: the LM head is the
// token embedding, so a pipeline's first and last stages form the tied group. kv_copies: tensor ranks per
// kv head (layout_kv_copies; 1 when each rank has kv heads of its own). hpz: -hpz's ranks per hpz group (1:
// none; one line unless it divides dp). qgz: split the dp group by host (-qg 1).
void grid_create(Grid* g, Comm* world, int stages, int tp, int cp, int tied_head, int kv_copies, int hpz, int qgz);
// Fails with one line unless -hpz n (> 1) divides a data-parallel group of dp ranks.
void grid_check_hpz(int n, int dp);
void grid_destroy(Grid* g);   // frees the sub-groups, not the world
// "S stages x R replicas[ x C context ranks][ x T tensor ranks][, hpZ groups of N]" into out.
void grid_describe(const Grid* g, char* out, size_t n);
static inline int grid_first_stage(const Grid* g) { return g->stage == 0; }
static inline int grid_last_stage(const Grid* g) { return g->stage == g->pp - 1; }
