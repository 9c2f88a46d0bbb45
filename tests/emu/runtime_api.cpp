// runtime_api.cpp: CUDA's runtime API on the emulated device. Every stream runs its work at the call (a launch
// runs its grid before returning), so streams and events only need to exist and be checked; copies check
// that each end is on the side the kind says, as a GPU would fail an illegal address.
#include <mutex>
#include <set>
#include <string>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/emu/device.h"

struct EmuStream {
    unsigned flags;
};
struct EmuEvent {
    unsigned flags;
    bool recorded;
};

namespace emu {
void note_once(const char* what) {
    static std::mutex m;
    static std::set<std::string>* seen = new std::set<std::string>();
    std::lock_guard<std::mutex> g(m);
    if (seen->insert(what).second) fprintf(stderr, "emulator: %s\n", what);
}
}  // namespace emu

static const size_t kDeviceBytes = (size_t)80 << 30;   // what cudaMemGetInfo reports as the device's memory

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError() { return emu::take_last_error(); }
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return cudaErrorInvalidValue;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "the kernel emulator (tests/emu, as sm_90)");
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = kDeviceBytes;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->maxThreadsPerBlock = 1024, p->warpSize = 32;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* lowest, int* highest) {
    *lowest = 0, *highest = -5;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
    const size_t live = emu::device_bytes_live();
    *total_b = kDeviceBytes;
    *free_b = live < kDeviceBytes ? kDeviceBytes - live : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = bytes <= kDeviceBytes - emu::device_bytes_live() ? emu::device_alloc(bytes) : NULL;
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    return emu::device_free(p) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
    free(p);
    return cudaSuccess;
}

// Each end of a copy on the side its kind names, and a device end inside one live allocation.
static void check_end(const void* p, size_t bytes, bool device_side, bool write, const char* what) {
    if (!bytes) return;
    if (emu::is_device(p) != device_side)
        emu::fault("%s: the %s pointer %p is %s memory, the copy's kind says %s", what, write ? "destination" : "source", p,
                   emu::is_device(p) ? "device" : "host", device_side ? "device" : "host");
    if (device_side) {
        emu::global_access(p, 1, write);
        emu::global_access((const char*)p + bytes - 1, 1, write);
    }
}

static cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (kind == cudaMemcpyDefault)
        kind = (cudaMemcpyKind)((emu::is_device(src) ? 2 : 0) | (emu::is_device(dst) ? 1 : 0));
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    check_end(dst, bytes, dst_dev, true, what);
    check_end(src, bytes, src_dev, false, what);
    emu::FenceLift open_device;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    return copy(dst, src, bytes, kind, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    return copy(dst, src, bytes, kind, "cudaMemcpyAsync");
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                              cudaMemcpyKind kind, cudaStream_t) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    for (size_t r = 0; r < rows; r++) {
        cudaError_t e = copy((char*)dst + r * dpitch, (const char*)src + r * spitch, width, kind, "cudaMemcpy2DAsync");
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
    check_end(p, bytes, true, true, "cudaMemsetAsync");
    emu::FenceLift open_device;
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    *s = new EmuStream{flags};
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) { return cudaStreamCreateWithFlags(s, flags); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return e ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    *e = new EmuEvent{flags, false};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    if (!e) return cudaErrorInvalidValue;
    e->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }
// The emulator keeps no device clock: every interval is zero, and timing flags are refused where CUDA refuses them.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b || !a->recorded || !b->recorded || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return cudaErrorInvalidValue;
    *ms = 0.0f;
    return cudaSuccess;
}

cudaError_t emu_func_get_attributes(cudaFuncAttributes* a, const void* f) {
    memset(a, 0, sizeof(*a));
    a->maxThreadsPerBlock = 1024;
    a->maxDynamicSharedSizeBytes = 48 << 10;
    return f ? cudaSuccess : cudaErrorInvalidDeviceFunction;
}
cudaError_t emu_func_set_max_dynamic_smem(const void* f, int bytes) {
    if (bytes < 0 || bytes > (227 << 10)) return cudaErrorInvalidValue;
    emu::set_max_dynamic_smem(f, bytes);
    return cudaSuccess;
}
