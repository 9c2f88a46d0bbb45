// runtime.cpp: the emulator's GPU. A launch runs its blocks one after another, in an order drawn from the seed;
// a block's threads are fibers (fiber.h) that run one at a time until they reach __syncthreads, a warp
// collective or their end. Shared memory is a window per block with a shadow that records, per byte, who
// last wrote and read it since the last barrier, so a missing barrier is reported as a race; device memory
// is an arena of allocations whose every access from a kernel is checked to lie inside a live one.
//
// The kernels' translation unit is compiled with clang's -fsanitize-coverage=edge,trace-loads,trace-stores, which
// calls __sanitizer_cov_load<N> / __sanitizer_cov_store<N> before every load and store: those are the checks.
// This file is not instrumented.
//
// State: like CUDA's runtime, the emulated device is one per process (device()); what a running block needs
// is reached through the calling OS thread's current execution (tls_exec).
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "tests/emu/device.h"
#include "tests/emu/fiber.h"
#include "tests/emu/ptx.h"

namespace emu {

// ---------------------------------------------------------------------------------------------------
// Limits of the emulated device (an sm_90-class part).
static const size_t kStaticSmemMax = 48 << 10;     // static __shared__ per block
static const size_t kDefaultDynSmem = 48 << 10;    // dynamic without cudaFuncAttributeMaxDynamicSharedMemorySize
static const size_t kSmemOptin = 227 << 10;        // the most a block may have
static const size_t kSmemWindow = kSmemOptin + (48 << 10);
static const int kMaxThreads = 1024;
static const size_t kStackBytes = 256 << 10;       // each GPU thread's fiber stack
static const size_t kArenaBytes = (size_t)64 << 30;   // address space only
static const size_t kPage = 4096;
static const size_t kMaxGather = 64;               // bytes a lane contributes to one warp collective

enum ThreadState { READY, AT_BARRIER, AT_WARP, DONE };

struct GpuThread {
    Fiber fiber;
    Dim3 idx;
    int linear;
    ThreadState state;
    const void* in;   // its contribution to the pending warp collective
    void* all;        // where it receives the warp's contributions
    EmuCpAsyncQueue cp_async;
};

struct WarpOp {
    const char* op;   // NULL: none pending
    unsigned mask, arrived;
    size_t bytes;
    bool orders_memory;   // __syncwarp: orders the lanes' shared-memory accesses
};

// Per byte of shared memory, since the barrier numbered `epoch`: the last writer and reader (thread + 1;
// kMany: several), and the warp's __syncwarp count when they accessed it.
static const uint16_t kMany = 0xffff;
struct Shadow {
    uint32_t epoch;
    uint16_t writer, reader;
    uint32_t writer_wsync, reader_wsync;
    uint8_t reader_warp;   // the warp of the readers, or kManyWarps
    uint8_t pad[3];
};
static const uint8_t kManyWarps = 0xff;

struct SharedSite {
    const void* site;
    size_t offset;
};

struct Exec {
    const char* kernel;
    Dim3 grid_d, block_d, bidx;
    KernelCall call;
    std::vector<GpuThread> threads;
    std::vector<int> runnable;
    GpuThread* cur;
    void* sched_sp;
    uint64_t rng;
    uint32_t epoch;
    uint32_t wsync[32];
    WarpOp warp_ops[32];
    unsigned exited[32];   // per warp, the lanes that have returned
    unsigned char* smem;   // the window
    Shadow* shadow;
    size_t dyn_bytes, static_used;
    std::vector<SharedSite> sites;
};

static thread_local Exec* tls_exec;

struct Alloc {
    uintptr_t start;
    size_t bytes;
    bool live;
};

struct Device {
    std::mutex lock;
    unsigned char* arena;
    size_t arena_top;
    std::vector<Alloc> allocs;   // by start: the arena grows upwards and never reuses an address
    size_t bytes_live;
    std::map<const void*, int> max_dyn_smem;
    unsigned char* stacks;       // kMaxThreads fiber stacks, each with a guard page below it
    unsigned char* smem;
    Shadow* shadow;
    uint32_t epoch_counter;
    uint64_t seed, launches;
    int fence_depth;             // FenceLifts held: the arena is open while it is > 0
    std::atomic<uint64_t> frees; // allocations freed so far: a thread's cached allocation is valid while unchanged
};

// The allocation a thread's last device access fell in: most accesses fall in the same one, and checking
// them against it needs no lock.
struct LastAlloc {
    uintptr_t start, end;
    uint64_t frees;
};
static thread_local LastAlloc tls_last_alloc;

static thread_local cudaError_t tls_last_error = cudaSuccess;

static void* map_or_die(size_t bytes, int prot, const char* what) {
    void* p = mmap(NULL, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "emulator: cannot map %zu bytes for %s: %s\n", bytes, what, strerror(errno));
        exit(1);
    }
    return p;
}

static void install_segv_handler();

static Device& device() {
    static Device* d = [] {
        Device* x = new Device();
        x->arena = (unsigned char*)map_or_die(kArenaBytes, PROT_NONE, "device memory");
        const size_t slot = kStackBytes + kPage;
        x->stacks = (unsigned char*)map_or_die(slot * kMaxThreads, PROT_READ | PROT_WRITE, "thread stacks");
        for (int i = 0; i < kMaxThreads; i++)
            if (mprotect(x->stacks + i * slot, kPage, PROT_NONE) != 0) {
                fprintf(stderr, "emulator: mprotect of a stack guard: %s\n", strerror(errno));
                exit(1);
            }
        x->smem = (unsigned char*)map_or_die(kSmemWindow, PROT_READ | PROT_WRITE, "shared memory");
        x->shadow = (Shadow*)map_or_die(kSmemWindow * sizeof(Shadow), PROT_READ | PROT_WRITE, "shared memory shadow");
        const char* s = getenv("EMU_SEED");
        x->seed = s ? strtoull(s, NULL, 10) : 1;
        install_segv_handler();
        return x;
    }();
    return *d;
}

static uint64_t next_rand(uint64_t* s) {   // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------------
// Faults: one line naming where, then exit(1).
static int where(char* buf, size_t n) {
    Exec* x = tls_exec;
    if (!x) return snprintf(buf, n, "emulator: ");
    if (!x->cur)
        return snprintf(buf, n, "emulator: %s block (%u,%u,%u): ", x->kernel, x->bidx.x, x->bidx.y, x->bidx.z);
    return snprintf(buf, n, "emulator: %s block (%u,%u,%u) thread (%u,%u,%u): ", x->kernel, x->bidx.x, x->bidx.y,
                    x->bidx.z, x->cur->idx.x, x->cur->idx.y, x->cur->idx.z);
}

void fault(const char* fmt, ...) {
    char buf[1024];
    int k = where(buf, sizeof(buf));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + k, sizeof(buf) - (size_t)k, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf);
    fflush(stderr);
    _exit(1);
}

static void on_segv(int sig, siginfo_t* si, void*) {
    char buf[512];
    int k = where(buf, sizeof(buf));
    const Device& d = device();
    if ((uintptr_t)si->si_addr - (uintptr_t)d.arena < kArenaBytes && !tls_exec)
        snprintf(buf + k, sizeof(buf) - (size_t)k, "host code touched device memory at %p (device memory is fenced from "
                 "the host, as on a GPU: copy it with cudaMemcpy)\n", si->si_addr);
    else
        snprintf(buf + k, sizeof(buf) - (size_t)k,
                 "segmentation fault at %p (a freed or unmapped address, or a GPU thread's stack overflow)\n", si->si_addr);
    if (write(2, buf, strlen(buf)) < 0) _exit(1);
    _exit(1);
}

static void install_segv_handler() {
    static char altstack[64 << 10];
    stack_t ss = {};
    ss.ss_sp = altstack;
    ss.ss_size = sizeof(altstack);
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGSEGV, &sa, NULL) != 0 || sigaction(SIGBUS, &sa, NULL) != 0) {
        fprintf(stderr, "emulator: cannot install the segmentation fault handler: %s\n", strerror(errno));
        exit(1);
    }
}

// ---------------------------------------------------------------------------------------------------
// Coordinates.
static Exec& exec_or_fault(const char* what) {
    if (!tls_exec || !tls_exec->cur) fault("%s used outside a kernel", what);
    return *tls_exec;
}
const Dim3& thread_idx() { return exec_or_fault("threadIdx").cur->idx; }
const Dim3& block_idx() { return exec_or_fault("blockIdx").bidx; }
const Dim3& block_dim() { return exec_or_fault("blockDim").block_d; }
const Dim3& grid_dim() { return exec_or_fault("gridDim").grid_d; }
int linear_tid() { return exec_or_fault("a thread index").cur->linear; }
int lane() { return linear_tid() % 32; }
int warp() { return linear_tid() / 32; }

// ---------------------------------------------------------------------------------------------------
// The scheduler.
static void yield_to_scheduler(Exec& x, ThreadState s) {
    GpuThread* t = x.cur;
    t->state = s;
    emu_fiber_switch(&t->fiber.sp, x.sched_sp);
}

static void make_ready(Exec& x, GpuThread* t) {
    t->state = READY;
    x.runnable.push_back(t->linear);
}

void sync_block() {
    Exec& x = exec_or_fault("__syncthreads");
    yield_to_scheduler(x, AT_BARRIER);
}

static const char* state_name(const Exec& x, const GpuThread& t) {
    switch (t.state) {
    case DONE: return "has returned";
    case AT_BARRIER: return "waits at __syncthreads";
    case AT_WARP: return x.warp_ops[t.linear / 32].op;
    default: return "is running";
    }
}

static void warp_meet(unsigned mask, const char* op, const void* in, size_t bytes, void* all, bool orders_memory) {
    Exec& x = exec_or_fault(op);
    GpuThread* t = x.cur;
    const int w = t->linear / 32, l = t->linear % 32;
    const unsigned warp_lanes = (unsigned)std::min(32, (int)x.threads.size() - w * 32);
    const unsigned present = warp_lanes == 32 ? 0xffffffffu : ((1u << warp_lanes) - 1);
    if (bytes > kMaxGather) fault("%s gathers %zu bytes a lane, more than the emulator's %zu", op, bytes, kMaxGather);
    if (!(mask >> l & 1u)) fault("%s with mask 0x%08x, which does not name the calling lane %d", op, mask, l);
    if (mask & ~present) fault("%s with mask 0x%08x names lanes the block does not have (warp %d has 0x%08x)", op, mask, w, present);
    if (mask & x.exited[w])
        fault("%s with mask 0x%08x names lanes that have returned (0x%08x)", op, mask, mask & x.exited[w]);
    WarpOp& o = x.warp_ops[w];
    if (!o.op) {
        o = WarpOp{op, mask, 0, bytes, orders_memory};
    } else if (o.op != op && strcmp(o.op, op) != 0) {
        fault("%s with mask 0x%08x while lanes 0x%08x of its warp wait at %s with mask 0x%08x", op, mask, o.arrived, o.op, o.mask);
    } else if (o.mask != mask || o.bytes != bytes) {
        fault("%s with mask 0x%08x while lanes 0x%08x of its warp wait at it with mask 0x%08x", op, mask, o.arrived, o.mask);
    }
    t->in = in;
    t->all = all;
    o.arrived |= 1u << l;
    if (o.arrived != mask) {
        yield_to_scheduler(x, AT_WARP);   // the last lane to arrive fills `all` and wakes us
        return;
    }
    // Gather once, then hand each lane the lanes of mask in one copy (lanes outside mask keep their bytes).
    unsigned char gathered[32 * kMaxGather];
    for (int j = 0; j < 32; j++)
        if (mask >> j & 1u) memcpy(gathered + (size_t)j * bytes, x.threads[(size_t)w * 32 + j].in, bytes);
    const int first = __builtin_ctz(mask), last = 31 - __builtin_clz(mask);
    const bool contiguous = mask == (last == 31 ? ~0u << first : ((1u << (last + 1)) - 1) & (~0u << first));
    for (int i = first; i <= last; i++) {
        if (!(mask >> i & 1u)) continue;
        GpuThread& dst = x.threads[(size_t)w * 32 + i];
        if (contiguous) {
            memcpy((char*)dst.all + (size_t)first * bytes, gathered + (size_t)first * bytes, (size_t)(last - first + 1) * bytes);
        } else {
            for (int j = first; j <= last; j++)
                if (mask >> j & 1u) memcpy((char*)dst.all + (size_t)j * bytes, gathered + (size_t)j * bytes, bytes);
        }
        if (i != l) make_ready(x, &dst);
    }
    if (o.orders_memory) x.wsync[w]++;
    o.op = NULL;
}

void warp_gather(unsigned mask, const char* op, const void* in, size_t bytes, void* all) {
    warp_meet(mask, op, in, bytes, all, false);
}

void sync_warp(unsigned mask) {
    char none[32];
    warp_meet(mask, "__syncwarp", none, 0, none, true);
}

unsigned vote(unsigned mask, bool pred, const char* op) {
    unsigned char all[32] = {0};
    const unsigned char mine = pred;
    warp_gather(mask, op, &mine, 1, all);
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if ((mask >> i & 1u) && all[i]) r |= 1u << i;
    return r;
}

static void thread_entry() {
    Exec& x = *tls_exec;
    x.call.body(x.call.ctx);
    GpuThread* t = x.cur;
    x.exited[t->linear / 32] |= 1u << (t->linear % 32);
    emu_ptx_thread_exit();
    t->state = DONE;
    emu_fiber_switch(&t->fiber.sp, x.sched_sp);
    fault("a returned thread was resumed");
}

// Nothing can run and not every thread has returned: a barrier or a warp collective that cannot complete.
static void check_deadlock(Exec& x) {
    for (int w = 0; w < 32; w++) {
        const WarpOp& o = x.warp_ops[w];
        if (!o.op) continue;
        for (int l = 0; l < 32; l++) {
            if (!(o.mask >> l & 1u) || (o.arrived >> l & 1u)) continue;
            const GpuThread& t = x.threads[(size_t)w * 32 + l];
            x.cur = NULL;
            fault("deadlock: lanes 0x%08x of warp %d wait at %s with mask 0x%08x, but lane %d %s", o.arrived, w, o.op,
                  o.mask, l, state_name(x, t));
        }
    }
}

static void run_block(Device& d, Exec& x) {
    Dim3 bd = x.block_d;
    const int n = (int)(bd.x * bd.y * bd.z);
    const size_t slot = kStackBytes + kPage;
    x.threads.assign((size_t)n, GpuThread());
    x.runnable.clear();
    memset(x.wsync, 0, sizeof(x.wsync));
    memset(x.warp_ops, 0, sizeof(x.warp_ops));
    memset(x.exited, 0, sizeof(x.exited));
    x.sites.clear();
    x.static_used = 0;
    x.epoch = ++d.epoch_counter;
    // A GPU's shared memory holds whatever the last block left: NaN bytes make a read before any write show.
    memset(x.smem, 0xff, x.dyn_bytes);
    for (int i = 0; i < n; i++) {
        GpuThread& t = x.threads[(size_t)i];
        t.linear = i;
        t.idx = Dim3{(unsigned)i % bd.x, ((unsigned)i / bd.x) % bd.y, (unsigned)i / (bd.x * bd.y)};
        fiber_init(&t.fiber, d.stacks + (size_t)i * slot + kPage, kStackBytes, thread_entry);
        make_ready(x, &t);
    }
    for (;;) {
        while (!x.runnable.empty()) {
            const size_t k = next_rand(&x.rng) % x.runnable.size();
            GpuThread* t = &x.threads[(size_t)x.runnable[k]];
            x.runnable[k] = x.runnable.back();
            x.runnable.pop_back();
            x.cur = t;
            emu_fiber_switch(&x.sched_sp, t->fiber.sp);
            x.cur = NULL;
        }
        int done = 0, at_warp = 0;
        for (const GpuThread& t : x.threads) done += t.state == DONE, at_warp += t.state == AT_WARP;
        if (done == n) break;
        if (at_warp) check_deadlock(x);
        for (GpuThread& t : x.threads)
            if (t.state == AT_BARRIER) make_ready(x, &t);
        x.epoch = ++d.epoch_counter;   // a barrier: what came before is ordered before what follows
        memset(x.wsync, 0, sizeof(x.wsync));
    }
}

static bool bad_config(dim3 grid, dim3 block) {
    return !grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 ||
           block.z > 64 || (size_t)block.x * block.y * block.z > (size_t)kMaxThreads || grid.y > 65535 || grid.z > 65535 ||
           grid.x > 0x7fffffffu;
}

void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, KernelCall call) {
    Device& d = device();
    if (bad_config(grid, block)) {
        tls_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    size_t dyn_max = kDefaultDynSmem;
    {
        std::lock_guard<std::mutex> g(d.lock);
        auto it = d.max_dyn_smem.find(fn);
        if (it != d.max_dyn_smem.end()) dyn_max = (size_t)it->second;
    }
    if (smem > dyn_max) {
        tls_last_error = cudaErrorInvalidValue;   // what a GPU answers to a launch over its dynamic limit
        return;
    }
    if (tls_exec) fault("a kernel launched %s from inside a kernel", name);
    Exec x;
    x.kernel = name;
    x.grid_d = Dim3{grid.x, grid.y, grid.z};
    x.block_d = Dim3{block.x, block.y, block.z};
    x.call = call;
    x.cur = NULL;
    x.smem = d.smem;
    x.shadow = d.shadow;
    x.dyn_bytes = smem;
    x.rng = d.seed * 0x2545f4914f6cdd1dull + (++d.launches);
    // The blocks in a drawn order: a result that depends on the order blocks run in differs from run to run.
    const size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<size_t> order(nblocks);
    for (size_t i = 0; i < nblocks; i++) order[i] = i;
    for (size_t i = nblocks; i > 1; i--) std::swap(order[i - 1], order[next_rand(&x.rng) % i]);
    FenceLift open_device;
    tls_exec = &x;
    for (size_t b : order) {
        x.bidx = Dim3{(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y), (unsigned)(b / ((size_t)grid.x * grid.y))};
        run_block(d, x);
    }
    tls_exec = NULL;
}

// ---------------------------------------------------------------------------------------------------
// Shared memory.
void* shared_base() { return exec_or_fault("shared memory").smem; }
static size_t block_shared_bytes(const Exec& x) { return x.dyn_bytes + x.static_used; }
size_t shared_size() { return block_shared_bytes(exec_or_fault("shared memory")); }

void* shared_dynamic(size_t align) {
    Exec& x = exec_or_fault("extern __shared__");
    if (align > 128) fault("extern __shared__ aligned to %zu bytes: the emulator aligns the window to 128", align);
    return x.smem;
}

// Static arrays follow the dynamic part, at the first thread's request; every thread gets the same address.
void* shared_static(const void* site, size_t bytes, size_t align) {
    Exec& x = exec_or_fault("__shared__");
    for (const SharedSite& s : x.sites)
        if (s.site == site) return x.smem + s.offset;
    size_t off = (x.dyn_bytes + x.static_used + align - 1) / align * align;
    const size_t used = off + bytes - x.dyn_bytes;
    if (used > kStaticSmemMax) fault("%zu bytes of static __shared__ memory: more than the %zu a block may declare", used, kStaticSmemMax);
    memset(x.smem + off, 0xff, bytes);
    x.sites.push_back(SharedSite{site, off});
    x.static_used = used;
    return x.smem + off;
}

static void race(Exec& x, size_t off, const char* first, int other, const char* then) {
    const GpuThread& o = x.threads[(size_t)other];
    fault("race on shared memory at %p (byte %zu): thread (%u,%u,%u) %s it and this thread %s it with no barrier "
          "between", (void*)(x.smem + off), off, o.idx.x, o.idx.y, o.idx.z, first, then);
}

// Ordered: the same thread, or lanes of one warp with a __syncwarp between.
static bool ordered(const Exec& x, int a, uint32_t a_wsync, int b) {
    return a == b || (a / 32 == b / 32 && x.wsync[b / 32] != a_wsync);
}

static void check_shared_bounds(const Exec& x, size_t off, size_t n, const char* what) {
    if (off + n > block_shared_bytes(x))
        fault("%s of %zu bytes at shared byte %zu, past the block's %zu bytes (%zu dynamic + %zu static)", what, n, off,
              block_shared_bytes(x), x.dyn_bytes, x.static_used);
}

static void check_shared(Exec& x, size_t off, size_t n, bool write) {
    check_shared_bounds(x, off, n, write ? "write" : "read");
    const int me = x.cur->linear, w = me / 32;
    for (size_t i = off; i < off + n; i++) {
        Shadow& s = x.shadow[i];
        if (s.epoch != x.epoch) s = Shadow{x.epoch, 0, 0, 0, 0, 0, {0, 0, 0}};
        if (s.writer && !ordered(x, s.writer - 1, s.writer_wsync, me)) race(x, i, "wrote", s.writer - 1, write ? "wrote" : "read");
        if (write) {
            if (s.reader == kMany) {
                if (s.reader_warp != w || x.wsync[w] == s.reader_wsync)
                    fault("race on shared memory at %p (byte %zu): several threads read it and this thread wrote it "
                          "with no barrier between", (void*)(x.smem + i), i);
            } else if (s.reader && !ordered(x, s.reader - 1, s.reader_wsync, me)) {
                race(x, i, "read", s.reader - 1, "wrote");
            }
            s.writer = (uint16_t)(me + 1);
            s.writer_wsync = x.wsync[w];
            s.reader = 0;
        } else if (s.reader != me + 1) {
            if (!s.reader) s.reader = (uint16_t)(me + 1), s.reader_warp = (uint8_t)w;
            else s.reader = kMany, s.reader_warp = s.reader_warp == w ? (uint8_t)w : kManyWarps;
            s.reader_wsync = x.wsync[w];
        }
    }
}

void shared_access(const void* p, size_t bytes, bool write) {
    Exec& x = exec_or_fault("a shared-memory access");
    const uintptr_t off = (uintptr_t)p - (uintptr_t)x.smem;
    if (off >= kSmemWindow) fault("%p is not a shared-memory address", p);
    check_shared(x, off, bytes, write);
}

// ---------------------------------------------------------------------------------------------------
// Device memory.
static bool in_arena(const Device& d, const void* p) {
    return (uintptr_t)p - (uintptr_t)d.arena < kArenaBytes;
}

void global_access(const void* p, size_t bytes, bool write) {
    Device& d = device();
    if (!in_arena(d, p)) return;   // host memory: pinned buffers and the emulator's own
    const uintptr_t a = (uintptr_t)p;
    const LastAlloc& last = tls_last_alloc;
    if (a >= last.start && a + bytes <= last.end && last.frees == d.frees.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> g(d.lock);
    auto it = std::upper_bound(d.allocs.begin(), d.allocs.end(), a, [](uintptr_t v, const Alloc& al) { return v < al.start; });
    if (it != d.allocs.begin()) {
        const Alloc& al = *(it - 1);
        if (a + bytes <= al.start + al.bytes) {
            if (al.live) {
                tls_last_alloc = LastAlloc{al.start, al.start + al.bytes, d.frees.load(std::memory_order_relaxed)};
                return;
            }
            fault("%s of %zu bytes at %p, inside an allocation of %zu bytes at %p that was freed", write ? "write" : "read",
                  bytes, p, al.bytes, (void*)al.start);
        }
        fault("%s of %zu bytes at %p, %zu bytes past the end of the %zu-byte allocation at %p", write ? "write" : "read",
              bytes, p, (size_t)(a + bytes - al.start - al.bytes), al.bytes, (void*)al.start);
    }
    fault("%s of %zu bytes at %p, before every allocation", write ? "write" : "read", bytes, p);
}

// The arena's allocations: page-aligned, each followed by at least one page no allocation ever uses, and
// never reused, so an access past an end or after a free reaches no other allocation's bytes.
void* device_alloc(size_t bytes) {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    const size_t span = (bytes + kPage - 1) / kPage * kPage;
    if (span + kPage > kArenaBytes - d.arena_top) return NULL;
    unsigned char* p = d.arena + d.arena_top;
    if (span && d.fence_depth > 0 && mprotect(p, span, PROT_READ | PROT_WRITE) != 0) return NULL;
    d.arena_top += span + kPage;
    d.allocs.push_back(Alloc{(uintptr_t)p, bytes, true});
    d.bytes_live += bytes;
    return p;
}

bool device_free(void* p) {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    auto it = std::lower_bound(d.allocs.begin(), d.allocs.end(), (uintptr_t)p, [](const Alloc& al, uintptr_t v) { return al.start < v; });
    if (it == d.allocs.end() || it->start != (uintptr_t)p || !it->live) return false;
    it->live = false;
    d.frees.fetch_add(1, std::memory_order_relaxed);
    d.bytes_live -= it->bytes;
    // A fresh mapping in its place returns the pages (the arena is never reused, so nothing else may claim
    // them) and keeps the fence cheap to move, whose cost grows with the pages it covers.
    const size_t span = (it->bytes + kPage - 1) / kPage * kPage;
    if (span && mmap(p, span, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        fault("unmapping a freed allocation: %s", strerror(errno));
    return true;
}

void fence_lift() {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    if (d.fence_depth++ == 0 && d.arena_top && mprotect(d.arena, d.arena_top, PROT_READ | PROT_WRITE) != 0)
        fault("mprotect opening device memory: %s", strerror(errno));
}

// Freed allocations reopen with the rest while the fence is lifted: the kernels' checks and the copies'
// (global_access) name a use after free; host code reaches none of it.
void fence_drop() {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    if (--d.fence_depth == 0 && d.arena_top && mprotect(d.arena, d.arena_top, PROT_NONE) != 0)
        fault("mprotect fencing device memory: %s", strerror(errno));
}

// Whether [p, p + bytes) lies in the arena (then it must be inside one live allocation: global_access checks).
bool is_device(const void* p) { return in_arena(device(), p); }

size_t device_bytes_live() {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    return d.bytes_live;
}

void set_max_dynamic_smem(const void* fn, int bytes) {
    Device& d = device();
    std::lock_guard<std::mutex> g(d.lock);
    d.max_dyn_smem[fn] = bytes;
}

cudaError_t take_last_error() {
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

// An atomic's bounds: shared (inside the block's bytes) or device memory; never raced.
static void check_atomic(const void* p, size_t n) {
    Exec* x = tls_exec;
    if (!x || !x->cur) fault("an atomic outside a kernel");
    const uintptr_t off = (uintptr_t)p - (uintptr_t)x->smem;
    if (off < kSmemWindow) check_shared_bounds(*x, off, n, "atomic");
    else global_access(p, n, true);
}
template <typename T, typename F> static T rmw(T* p, F f) {
    check_atomic(p, sizeof(T));
    const T old = *p;
    *p = f(old);
    return old;
}
int atomic_add(int* p, int v) { return rmw(p, [v](int o) { return (int)((unsigned)o + (unsigned)v); }); }
unsigned atomic_add(unsigned* p, unsigned v) { return rmw(p, [v](unsigned o) { return o + v; }); }
unsigned long long atomic_add(unsigned long long* p, unsigned long long v) { return rmw(p, [v](unsigned long long o) { return o + v; }); }
float atomic_add(float* p, float v) { return rmw(p, [v](float o) { return o + v; }); }
double atomic_add(double* p, double v) { return rmw(p, [v](double o) { return o + v; }); }
int atomic_max(int* p, int v) { return rmw(p, [v](int o) { return o > v ? o : v; }); }
unsigned atomic_max(unsigned* p, unsigned v) { return rmw(p, [v](unsigned o) { return o > v ? o : v; }); }
int atomic_min(int* p, int v) { return rmw(p, [v](int o) { return o < v ? o : v; }); }
int atomic_exch(int* p, int v) { return rmw(p, [v](int) { return v; }); }
int atomic_cas(int* p, int c, int v) { return rmw(p, [c, v](int o) { return o == c ? v : o; }); }
unsigned long long atomic_cas(unsigned long long* p, unsigned long long c, unsigned long long v) {
    return rmw(p, [c, v](unsigned long long o) { return o == c ? v : o; });
}

static inline void on_access(const void* p, size_t n, bool write) {
    Exec* x = tls_exec;
    if (!x || !x->cur) return;
    const uintptr_t off = (uintptr_t)p - (uintptr_t)x->smem;
    if (off < kSmemWindow) check_shared(*x, off, n, write);
    else global_access(p, n, write);
}

}  // namespace emu

extern "C" {
void __sanitizer_cov_load1(uint8_t* p) { emu::on_access(p, 1, false); }
void __sanitizer_cov_load2(uint16_t* p) { emu::on_access(p, 2, false); }
void __sanitizer_cov_load4(uint32_t* p) { emu::on_access(p, 4, false); }
void __sanitizer_cov_load8(uint64_t* p) { emu::on_access(p, 8, false); }
void __sanitizer_cov_load16(__int128* p) { emu::on_access(p, 16, false); }
void __sanitizer_cov_store1(uint8_t* p) { emu::on_access(p, 1, true); }
void __sanitizer_cov_store2(uint16_t* p) { emu::on_access(p, 2, true); }
void __sanitizer_cov_store4(uint32_t* p) { emu::on_access(p, 4, true); }
void __sanitizer_cov_store8(uint64_t* p) { emu::on_access(p, 8, true); }
void __sanitizer_cov_store16(__int128* p) { emu::on_access(p, 16, true); }
}

EmuCpAsyncQueue* emu_thread_cp_queue() { return &emu::exec_or_fault("cp.async").cur->cp_async; }
