// param_slots.h: the parameters the walk computes with under shard_params (zero.h), gathered from every
// rank's piece.
//
// Blocks are gathered into two rotating slots: before a block's forward and again before its backward.
// The embeddings and the final LayerNorm are small, or shared by the LM head and the encoder, so each has
// its own buffer (Resident), gathered at first use and kept until the parameters change.
//
// Prefetch: when the walk asks for block l, the gather of the block it will ask for next starts into the
// other slot, so it runs while l computes: l+1 walking forward, l-1 backward. The direction comes from the
// order of the requests (l after l-1: forward, after l+1: backward); a request after neither begins a walk,
// which starts at an end of this layout's blocks and goes inward. walk.c's walks (and a 1F1B stage's)
// always cover all the blocks, so every prefetched block is asked for, the bytes moved are those of the
// unprefetched walk (tests/tools/zero_check.py), and no hint from the walk is needed. A prefetch nobody asks for
// would cost a gather, not correctness: it is dropped when its slot is needed and when the parameters change.
//
// With on_host (params_on_host) the pieces live in host memory: a gather starts by uploading this rank's
// piece on the copy stream. With a disk store (params_on_disk) they live in its file instead: a gather
// first reads the piece into the slot's own host buffer (nvme_read_params), then uploads it from there.
#pragma once
#include "core/model/memory.h"
#include "core/zero/nvme_store.h"
#include "core/zero/pieces.h"

// A block parameter slot's life.
typedef enum {
    PARAMS_FREE,        // nothing in it the walk will ask for.
                        // -> PREFETCHED: a prefetch starts the gather of the block the walk will ask for next;
                        // -> HELD: param_slots_block starts the gather of a block the walk asks for now
    PARAMS_PREFETCHED,  // `unit`'s gather runs ahead of the walk.
                        // -> HELD: param_slots_block, when the walk asks for it;
                        // -> FREE: param_slots_drop_prefetches, when the buffer is needed or the parameters change
    PARAMS_HELD,        // the walk computes with `unit`, its gather finished by param_slots_block.
                        // -> FREE: param_slots_done
} ParamSlotState;

typedef struct {
    void* buf;            // Pieces.dt, the largest block unit
    ParamSlotState state;
    int unit;             // PARAMS_PREFETCHED, PARAMS_HELD: whose parameters
    CommHandle flight;    // the gather into buf
    BeEvent* uploaded;    // on_host: the upload of this rank's piece into buf
    void* read;           // disk: this rank's piece read from the disk, the upload's source
    void* read_raw;       // its allocation
} ParamSlot;

enum { RESIDENT_EMB, RESIDENT_FINAL, RESIDENTS };

typedef struct {
    void* buf;            // Pieces.dt, the unit's padded size
    int gathered;         // since the parameters last changed
    BeEvent* uploaded;    // on_host: as ParamSlot's
    void* read;           // disk: as ParamSlot's
    void* read_raw;
} Resident;

typedef struct {
    ParamSlot slot[2];
    Resident resident[RESIDENTS];
    int walk_started, walk_last_block;   // the block the walk asked for last: the direction of its next request
    const void* pieces;                  // this rank's working pieces (index Pieces.offset), the gathers' source
    int on_host;                         // params_on_host: pieces is host memory
    NvmeStore* disk;                     // params_on_disk: the pieces are in its file instead (pieces NULL)
    double upload_seconds;               // on_host: wall time the walk spent reading and starting uploads; its
                                         // reader resets it
} ParamSlots;

// Allocates the two slots and the residents (charging mem) and, with on_host and a backend, their upload
// events (and with on_disk their read buffers, host memory); with be == NULL (zero_plan) it only charges.
// pieces (NULL with on_disk) and disk (NULL without, and for zero_plan): as ParamSlots', which outlive the slots.
void param_slots_init(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, const void* pieces, int on_host, int on_disk,
                      NvmeStore* disk);
// Frees the events and the host buffers (the backend buffers are the caller's to free).
void param_slots_free_host(ParamSlots* g, Backend* be);

// Block unit u's gathered parameters, for the walk to compute with now (held until param_slots_done): the
// slot already holding or gathering it, else a free one (dropping a prefetch if none is free). Starts the
// prefetch of the block the walk will ask for next before it waits for u's gather.
void* param_slots_block(ParamSlots* g, Backend* be, const Pieces* pc, int u);
// The embeddings' or the final LayerNorm's gathered parameters, gathered now if they changed since last time.
void* param_slots_resident(ParamSlots* g, Backend* be, const Pieces* pc, int u);
// Starts gathering block unit u ahead of the walk, into a free slot; nothing if u < 0, if u is in a slot
// already, or if none is free.
void param_slots_prefetch(ParamSlots* g, Backend* be, const Pieces* pc, int u);
// The walk is done with block unit u for now: its slot is free (nothing unless u is held).
void param_slots_done(ParamSlots* g, int u);
// Finishes and forgets the gathers the walk has not asked for (parameters about to change, teardown).
void param_slots_drop_prefetches(ParamSlots* g, const Pieces* pc);
// The pieces changed (after an update): the residents are gathered again at their next use, and the
// prefetches are dropped.
void param_slots_invalidate(ParamSlots* g, const Pieces* pc);
