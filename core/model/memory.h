// memory.h: every backend allocation of the trainer is charged to a category, so each rank can say
// where its bytes went (the log's start-up record, --estimate's check) instead of guessing. Host memory the
// trainer keeps per rank for the model states (-offload) has categories of its own, counted apart from the
// backend's: totals are backend bytes.
#pragma once
#include <stddef.h>

#include "kernels/kernels.h"

typedef enum {
    MEM_PARAMS,       // the working copy of the parameters in the run's dtype
    MEM_GRADS,        // parameter gradients (and -offload 2's two landing outboxes, core/zero/grad_landing.h)
    MEM_MASTER,       // fp32 master weights (absent for fp32 runs: the parameters are the master)
    MEM_OPTIMIZER,    // Adam moments m, v
    MEM_ACTIVATIONS,  // saved activations, their gradients and kernel scratch
    MEM_COMM,         // communication buffers
    MEM_HOST_STATE,   // host memory (-offload 1): fp32 master, Adam m, v and the optimizer's two staging buffers
    MEM_HOST_GRADS,   // host memory (-offload 2, -z >= 2): the fp32 gradient pieces and their two landing buffers
    MEM_HOST_PARAMS,  // host memory (-offload 2, -z 3): the working parameter pieces
    NUM_MEM_CATEGORIES
} MemCategory;

typedef struct {
    size_t bytes[NUM_MEM_CATEGORIES];
} MemLedger;

const char* mem_category_name(MemCategory c);
// be_malloc + charge; zero-filled so no stale memory is ever read. With be == NULL it only charges the
// ledger and returns NULL: --estimate runs the real allocation code without allocating.
void* mem_alloc(Backend* be, MemLedger* ledger, MemCategory c, size_t bytes);
// The same for host memory (be_host_alloc; free with be_host_free), charged to a host category.
void* mem_alloc_host(Backend* be, MemLedger* ledger, MemCategory c, size_t bytes);
int mem_category_on_host(MemCategory c);
// Bytes of backend memory (every category but the host ones), and of host memory.
size_t mem_total(const MemLedger* ledger);
size_t mem_host_total(const MemLedger* ledger);
// The host memory a new allocation can get without swapping: MemAvailable of /proc/meminfo, or the value of
// GPT_HOST_MEM_AVAILABLE (bytes; the tests' way to play a small host). 0 when neither can be read.
size_t host_memory_available(void);
