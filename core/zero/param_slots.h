// param_slots.h: the parameters the walk computes with under shard_params (zero.h), gathered from every
// rank's piece.
//
// Every unit is gathered when the walk asks for it and released when the walk says it is done (the
// ParamStore's params_done). Blocks go through two rotating slots: gathered before a block's forward and
// again before its backward. The embedding unit and the final unit (the "edge" units, pieces.h) have slots
// of their own, sized for them: an untied LM head, in the final unit, is as large as wte, and rotating slots
// sized for it would double it. The two edge units share one slot when the walk never uses them at once
// (an untied head: the encoder's lookup is done before the head starts); a tied head uses wte beside the
// final norm, so then each has its own. A released edge slot keeps its gather until another unit takes the
// slot or the parameters change, and a request meanwhile finds it there: an untied head is gathered once
// for its forward and its backward, and a tied head (the embedding unit, whose slot no other unit takes)
// once per step for the encoder's lookup, the head's forward and the head's backward, the walk holding it
// from the lookup to the head's forward (walk.c). Keeping it costs nothing: the slot exists either way.
// Where the untied head's slot is the embedding unit's (one stage holding both), the embedding unit is
// gathered again at each micro-step's lookup.
//
// Prefetch: when the walk asks for block l, the gather of the block it will ask for next starts into the
// other slot, so it runs while l computes: l+1 walking forward, l-1 backward; after the model's last block
// walking forward, the head's units (the final unit, and with a tied head the embedding unit) into their
// edge slots. The direction comes from the order of the requests (l after l-1: forward, after l+1:
// backward); a request after neither begins a walk, which starts at an end of this layout's blocks and goes
// inward. walk.c's walks (and a 1F1B stage's) always cover all the blocks and follow the last block's
// forward with the head, so every prefetched unit is asked for, the bytes moved are those of the
// unprefetched walk (tests/tools/zero_check.py), and no hint from the walk is needed. A prefetch nobody asks
// for would cost a gather, not correctness: it is dropped when its slot is needed and when the parameters
// change. Nothing precedes the embedding unit's lookup in a walk, so its gather is not prefetched.
//
// With on_host (params_on_host) the pieces live in host memory: a gather starts by uploading this rank's
// piece on the copy stream. With a disk store (params_on_disk) they live in its file instead: a gather
// first reads the piece into the slot's own host buffer (nvme_read_params), then uploads it from there.
#pragma once
#include "core/model/memory.h"
#include "core/zero/hpz.h"
#include "core/zero/nvme_store.h"
#include "core/zero/pieces.h"
#include "core/zero/qwz.h"

// A parameter slot's life.
typedef enum {
    PARAMS_FREE,        // nothing in it the walk is using (an edge slot may still hold a unit's gather: `unit`).
                        // -> PREFETCHED: a prefetch starts the gather of the unit the walk will ask for next;
                        // -> HELD: the walk asks for a unit now: its gather starts, or (edge slot) is still there
    PARAMS_PREFETCHED,  // `unit`'s gather runs ahead of the walk.
                        // -> HELD: when the walk asks for it;
                        // -> FREE: param_slots_drop_prefetches, when the buffer is needed or the parameters change
    PARAMS_HELD,        // the walk computes with `unit`, its gather finished.
                        // -> FREE: param_slots_done
} ParamSlotState;

typedef struct {
    void* buf;            // Pieces.dt: the largest block unit, or for an edge slot the largest unit it serves
    ParamSlotState state;
    int unit;             // PARAMS_PREFETCHED, PARAMS_HELD: whose parameters; PARAMS_FREE: in an edge slot, the
                          // unit whose finished gather it still holds, until the parameters change; else -1
    CommHandle flight[UNIT_SECTIONS];   // the gathers into buf, one per section
    int fills_hpz;        // they run over the data-parallel group and, once finished, fill the hpz shard
    int in_hpz;           // they run inside the hpz group, from its shard
    void* packets;        // -qw: every rank's quantized pieces of the unit, gathered (qwz.h)
    BeEvent* uploaded;    // on_host: the upload of this rank's piece into buf
    void* read;           // disk: this rank's piece read from the disk, the upload's source
    void* read_raw;       // its allocation
} ParamSlot;

// edge[0] serves the embedding unit and an untied final unit; edge[1] the final unit beside a tied head.
enum { EDGE_SLOTS = 2 };

typedef struct {
    ParamSlot slot[2];                   // rotating: the blocks
    ParamSlot edge[EDGE_SLOTS];          // the edge units' (buf NULL where this layout needs none)
    int walk_started, walk_last_block;   // the block the walk asked for last: the direction of its next request
    const void* pieces;                  // this rank's working pieces (index Pieces.offset), the gathers' source
    int on_host;                         // params_on_host: pieces is host memory
    NvmeStore* disk;                     // params_on_disk: the pieces are in its file instead (pieces NULL)
    double upload_seconds;               // on_host: wall time the walk spent reading and starting uploads; its
                                         // reader resets it
    Hpz hpz;                             // -hpz: the secondary shard the later gathers come from (hpz.h)
    int quantized;                       // -qw: the gathers over the data-parallel group send packets (qwz.h)
} ParamSlots;

// Allocates the rotating and the edge slots (charging mem) and, with on_host and a backend, their upload
// events (and with on_disk their read buffers, host memory); with be == NULL (zero_plan) it only charges.
// pieces (NULL with on_disk) and disk (NULL without, and for zero_plan): as ParamSlots', which outlive the slots.
void param_slots_init(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc, const void* pieces, int on_host, int on_disk,
                      NvmeStore* disk);
// Frees the events and the host buffers (the backend buffers are the caller's to free).
void param_slots_free_host(ParamSlots* g, Backend* be);
// -qw: allocates each slot's packets (charging mem; with be == NULL only charges), and frees them.
void param_slots_quantize(ParamSlots* g, Backend* be, MemLedger* mem, const Pieces* pc);
void param_slots_free_quantized(ParamSlots* g, Backend* be);

// Unit u's gathered parameters, for the walk to compute with now (held until param_slots_done). A block:
// the slot already holding or gathering it, else a free one (dropping a prefetch if none is free); the
// prefetch of what the walk will ask for next starts before it waits for u's gather. An edge unit: its
// edge slot, gathered now unless the slot still holds or is gathering u.
void* param_slots_unit(ParamSlots* g, Backend* be, const Pieces* pc, int u);
// Starts gathering unit u ahead of the walk, into a free slot; nothing if u < 0, if u is in a slot
// already, or if none is free.
void param_slots_prefetch(ParamSlots* g, Backend* be, const Pieces* pc, int u);
// The walk is done with unit u for now: its slot is free (nothing unless u is held).
void param_slots_done(ParamSlots* g, const Pieces* pc, int u);
// Finishes and forgets the gathers the walk has not asked for (parameters about to change, teardown).
void param_slots_drop_prefetches(ParamSlots* g, const Pieces* pc);
// The pieces changed (after an update): the edge slots forget what they hold, and the prefetches are dropped.
void param_slots_invalidate(ParamSlots* g, const Pieces* pc);
