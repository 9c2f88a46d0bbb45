// memory.c: see memory.h.
#include "memory.h"

static const char* const CATEGORY_NAMES[NUM_MEM_CATEGORIES] = {
    "params", "grads", "master", "optimizer", "activations", "comm"};

const char* mem_category_name(MemCategory c) { return CATEGORY_NAMES[c]; }

void* mem_alloc(Backend* be, MemLedger* ledger, MemCategory c, size_t bytes) {
    ledger->bytes[c] += bytes;
    if (!be) return NULL;   // planning (--estimate): the same code path, counting only
    void* p = be_malloc(be, bytes);
    be_memset0(be, p, bytes);
    return p;
}

size_t mem_total(const MemLedger* ledger) {
    size_t total = 0;
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) total += ledger->bytes[c];
    return total;
}
