// memory.h: every backend allocation of the trainer is charged to a category, so each rank can say
// where its bytes went (the log's start-up record, --estimate's check) instead of guessing. Host memory the
// trainer keeps per rank for the model states (-offload) and activations (-offload-act) has categories of its own, counted apart from the
// backend's, and so has the disk that -nvme's state files take: totals are backend bytes.
#pragma once
#include <stddef.h>

#include "kernels/kernels.h"

typedef enum {
    MEM_PARAMS,       // the working copy of the parameters in the run's dtype
    MEM_HPZ_PARAMS,   // -hpz (with -z 3): the secondary shard of the parameters (core/zero/hpz.h)
    MEM_GRADS,        // parameter gradients (and -offload 2's two landing outboxes, core/zero/grad_landing.h)
    MEM_MASTER,       // fp32 master weights (absent for fp32 runs: the parameters are the master)
    MEM_OPTIMIZER,    // the optimizer's state (optimizer_kind.h: AdamW's moments m, v)
    MEM_ACTIVATIONS,  // saved activations, their gradients and kernel scratch
    MEM_COMM,         // communication buffers
    MEM_HOST_STATE,   // host memory (-offload 1): fp32 master, optimizer state and the optimizer's two staging buffers
    MEM_HOST_GRADS,   // host memory (-offload 2, -z >= 2): the fp32 gradient pieces and their two landing buffers
    MEM_HOST_PARAMS,  // host memory (-offload 2, -z 3): the working parameter pieces (with -nvme: the walk's
                      // read buffers for them)
    MEM_HOST_ACTIVATIONS,  // host memory (-offload-act 1): the blocks' inputs the backward recomputes from
    MEM_DISK_STATE,   // disk (-nvme): the files holding the fp32 master, optimizer state (and with -offload 2 -z 3
                      // the parameter pieces); with -nvme, host_state holds the buffer pool they move through
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
// Only charges the ledger: bytes that are not memory (the disk's).
void mem_charge(MemLedger* ledger, MemCategory c, size_t bytes);
typedef enum { MEM_ON_BACKEND, MEM_ON_HOST, MEM_ON_DISK } MemWhere;
MemWhere mem_category_where(MemCategory c);
int mem_category_on_host(MemCategory c);
// Whether a printout shows category c: backend ones always, host ones with -offload, disk ones with -nvme.
int mem_category_shown(MemCategory c, int offload, int disk);
// Bytes of backend memory (every category but the host and disk ones), of host memory, and of disk.
size_t mem_total(const MemLedger* ledger);
size_t mem_host_total(const MemLedger* ledger);
size_t mem_disk_total(const MemLedger* ledger);
// The host memory a new allocation can get without swapping: MemAvailable of /proc/meminfo, or the value of
// GPT_HOST_MEM_AVAILABLE (bytes; the tests' way to play a small host). 0 when neither can be read.
size_t host_memory_available(void);
