// hpz.h: ZeRO++'s hierarchical partition (hpZ, Wang et al. 2023) over shard_params' gathers (param_slots.h).
//
// The data-parallel group splits into secondary groups of N consecutive ranks (grid.h: hpz). Each rank keeps
// a secondary shard: 1/N of every unit, its place in the secondary group's share of each section (a
// section's hpz rank h part is [h·len/N, +len/N) of the section, so N ranks of the group hold it whole). A
// unit's first gather after the parameters change goes over the whole data-parallel group, as without hpZ,
// and once it has finished the rank copies its part of the gathered unit into the secondary shard; every
// later gather of that unit until the parameters change (the backward's; with gradient accumulation the
// later micro-steps' forwards too) all-gathers it inside the secondary group from the secondary shards,
// which with N ranks per host never leaves the host. The gathered bits are the same either way: both are
// copies of the same pieces. The shard is backend memory (its category: hpz_params) whatever -offload says,
// and is no part of a checkpoint: the first gather after a resume fills it again. A gather that was started
// and dropped (a prefetch nobody asked for) fills nothing, so that unit's next gather goes wide again.
#pragma once
#include "core/model/memory.h"
#include "core/zero/pieces.h"

typedef struct {
    Comm* group;                     // the secondary group; NULL: hpZ off (and for zero_plan)
    int rank, size;                  // in it (size 0: off)
    void* shard;                     // Pieces.dt: every unit's part, unit u's at offset[u]
    size_t offset[MAX_UNITS];
    unsigned char filled[MAX_UNITS]; // unit u's part holds the current parameters
} Hpz;

// size: ranks per secondary group (0 or 1: off; it must divide pc->size); group: the grid's hpz group (NULL
// for zero_plan, which only charges mem). Charges the shard to MEM_HPZ_PARAMS; with be == NULL allocates nothing.
void hpz_init(Hpz* h, Backend* be, MemLedger* mem, const Pieces* pc, int size, Comm* group);
void hpz_free(Hpz* h, Backend* be);
static inline int hpz_on(const Hpz* h) { return h->size > 1; }
// Whether unit u's next gather can run inside the secondary group.
static inline int hpz_ready(const Hpz* h, int u) { return hpz_on(h) && h->filled[u]; }
// Starts the gathers of unit u inside the secondary group into buf (the unit's padded size), one per section.
void hpz_gather_start(Hpz* h, Backend* be, const Pieces* pc, int u, void* buf, CommHandle* flight);
// After unit u's gather over the data-parallel group finished into buf: keeps this rank's part.
void hpz_keep(Hpz* h, Backend* be, const Pieces* pc, int u, const void* buf);
// The parameters changed: every unit's next gather goes over the data-parallel group.
void hpz_forget(Hpz* h);
