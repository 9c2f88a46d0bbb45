// act_offload.c: see act_offload.h.
#include "core/model/act_offload.h"

#include "base/common.h"

void act_offload_create(ActOffload* o, Backend* be, MemLedger* mem, int on, int blocks, int num_sets, size_t slice_bytes) {
    *o = (ActOffload){.on = on && blocks > 1, .blocks = blocks, .num_sets = num_sets, .slots = act_offload_slots(on, blocks),
                      .slice_bytes = slice_bytes};
    if (!o->on) return;
    for (int s = 0; s < o->slots; s++) {
        o->slot[s] = mem_alloc(be, mem, MEM_ACTIVATIONS, slice_bytes);
        o->coming[s] = -1;
    }
    o->host = (char**)xcalloc((size_t)num_sets, sizeof(char*));
    for (int set = 0; set < num_sets; set++)
        o->host[set] = (char*)mem_alloc_host(be, mem, MEM_HOST_ACTIVATIONS, act_offload_host_bytes(on, blocks, 1, slice_bytes));
    if (!be) return;
    for (int s = 0; s < o->slots; s++) {
        o->down[s] = be_event_create(be);
        o->up[s] = be_event_create(be);
    }
}

void act_offload_destroy(ActOffload* o, Backend* be) {
    if (!o->on) return;
    be_synchronize(be);   // no copy in flight into or out of what is freed
    for (int s = 0; s < o->slots; s++) {
        be_free(be, o->slot[s]);
        be_event_destroy(be, o->down[s]);
        be_event_destroy(be, o->up[s]);
    }
    for (int set = 0; set < o->num_sets; set++) be_host_free(be, o->host[set]);
    free(o->host);
    *o = (ActOffload){0};
}

size_t act_offload_host_bytes(int on, int blocks, int num_sets, size_t slice_bytes) {
    return on && blocks > 1 ? (size_t)num_sets * (size_t)(blocks - 1) * slice_bytes : 0;
}

static void* host_slice(const ActOffload* o, int set, int l) { return o->host[set] + (size_t)(l - 1) * o->slice_bytes; }

// Block l's write of input l + 1 waits for the copy out of that slot (input l - 2's).
void act_offload_before_forward(ActOffload* o, Backend* be, int l) {
    if (act_offload_inner(o, l + 1)) be_stream_wait(be, o->down[act_offload_slot_of(o, l + 1)]);
}

void act_offload_after_forward(ActOffload* o, Backend* be, int set, int l, int keep) {
    if (keep && act_offload_inner(o, l)) be_download_async(be, host_slice(o, set, l), act_offload_slot(o, l), o->slice_bytes, o->down[act_offload_slot_of(o, l)]);
}

// Starts input l of `set` up into its slot, unless it is coming already. Its host slice must hold the
// forward's copy, and the slot must be read out: the host waits for the last copy out of the slot, which
// is that slice's own or a later one (the forward's copies out, in order, are long done by the backward).
static void bring_up(ActOffload* o, Backend* be, int set, int l) {
    int s = act_offload_slot_of(o, l);
    long long id = (long long)set * o->blocks + l;
    if (o->coming[s] == id) return;
    if (o->coming[s] >= 0) fail("internal: block input %lld is still coming into the slot that input %lld needs", o->coming[s], id);
    be_event_synchronize(be, o->down[s]);
    be_upload_async(be, act_offload_slot(o, l), host_slice(o, set, l), o->slice_bytes, o->up[s]);
    o->coming[s] = id;
}

void act_offload_before_backward(ActOffload* o, Backend* be, int set, int l) {
    if (act_offload_inner(o, l)) {
        bring_up(o, be, set, l);
        be_stream_wait(be, o->up[act_offload_slot_of(o, l)]);
        o->coming[act_offload_slot_of(o, l)] = -1;
    }
    if (act_offload_inner(o, l - 1)) bring_up(o, be, set, l - 1);   // input l + 2's slot (3 slots), done with
}
