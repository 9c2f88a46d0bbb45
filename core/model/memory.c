// memory.c: see memory.h.
#include "core/model/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

static const char* const CATEGORY_NAMES[NUM_MEM_CATEGORIES] = {
    "params", "hpz_params", "grads", "master", "optimizer", "activations", "comm", "host_state", "host_grads", "host_params",
    "host_activations", "disk_state"};

const char* mem_category_name(MemCategory c) { return CATEGORY_NAMES[c]; }

void* mem_alloc(Backend* be, MemLedger* ledger, MemCategory c, size_t bytes) {
    ledger->bytes[c] += bytes;
    if (!be) return NULL;   // planning (--estimate): the same code path, counting only
    void* p = be_malloc(be, bytes);
    be_memset0(be, p, bytes);
    return p;
}

void* mem_alloc_host(Backend* be, MemLedger* ledger, MemCategory c, size_t bytes) {
    if (!mem_category_on_host(c)) fail("internal: memory category %s is not host memory", mem_category_name(c));
    ledger->bytes[c] += bytes;
    if (!be) return NULL;
    void* p = be_host_alloc(be, bytes);
    memset(p, 0, bytes);
    return p;
}

void mem_charge(MemLedger* ledger, MemCategory c, size_t bytes) {
    if (mem_category_where(c) != MEM_ON_DISK) fail("internal: memory category %s is memory, not disk", mem_category_name(c));
    ledger->bytes[c] += bytes;
}

MemWhere mem_category_where(MemCategory c) {
    if (c == MEM_DISK_STATE) return MEM_ON_DISK;
    return c == MEM_HOST_STATE || c == MEM_HOST_GRADS || c == MEM_HOST_PARAMS || c == MEM_HOST_ACTIVATIONS ? MEM_ON_HOST
                                                                                                         : MEM_ON_BACKEND;
}

int mem_category_on_host(MemCategory c) { return mem_category_where(c) == MEM_ON_HOST; }

int mem_category_shown(MemCategory c, int offload, int disk) {
    MemWhere w = mem_category_where(c);
    return w == MEM_ON_BACKEND || (w == MEM_ON_HOST && offload) || (w == MEM_ON_DISK && disk);
}

static size_t sum_where(const MemLedger* ledger, MemWhere where) {
    size_t total = 0;
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++)
        if (mem_category_where((MemCategory)c) == where) total += ledger->bytes[c];
    return total;
}

size_t mem_total(const MemLedger* ledger) { return sum_where(ledger, MEM_ON_BACKEND); }
size_t mem_host_total(const MemLedger* ledger) { return sum_where(ledger, MEM_ON_HOST); }
size_t mem_disk_total(const MemLedger* ledger) { return sum_where(ledger, MEM_ON_DISK); }

size_t host_memory_available(void) {
    const char* forced = getenv("GPT_HOST_MEM_AVAILABLE");
    if (forced && *forced) {
        char* end;
        unsigned long long v = strtoull(forced, &end, 10);
        if (*end || forced[0] == '-') fail("GPT_HOST_MEM_AVAILABLE=%s: expected a byte count", forced);
        return (size_t)v;
    }
    FILE* f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof(line), f) && sscanf(line, "MemAvailable: %llu kB", &kib) != 1) {}
    fclose(f);
    return (size_t)kib * 1024;
}
