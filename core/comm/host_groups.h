// host_groups.h: a group's ranks split by host, for hierarchical collectives (ZeRO++'s qgZ, core/zero/qgz.h).
//
// A group of H hosts x L ranks, rank h L + l the l-th of host h, splits into H intra-host groups (host h's L
// ranks, ordered by l) and L inter-host groups (the H ranks with local index l, ordered by h), so a
// collective over an inter-host group is the only one whose messages cross hosts. The hosts are the ones MPI
// reports (comm_host_leader); every host must hold the same number of consecutive ranks of the group, else a
// one-line error. For tests on one machine, the environment variable GPT_RANKS_PER_HOST=L pretends that
// every L consecutive ranks of the group are a host, for this grouping only (the byte counts' link classes
// still follow the real hosts).
#pragma once
#include "core/comm/comm.h"

typedef struct {
    Comm* intra;    // this rank's host's ranks of the group
    Comm* inter;    // the ranks of the group with this rank's local index, one per host
    int per_host;   // L
    int hosts;      // H
} HostGroups;

// Collective over group; host: this rank's comm_host_leader(world).
HostGroups host_groups_split(Comm* group, int host);
void host_groups_free(HostGroups* h);
