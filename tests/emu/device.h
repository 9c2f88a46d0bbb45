// device.h: what runtime.cpp's emulated device offers the runtime API (runtime_api.cpp) and the library
// stand-ins (cublaslt.cpp, cub): its memory arena and its launch settings.
#pragma once
#include <stddef.h>

#include "tests/emu/include/cuda_runtime.h"

namespace emu {
void* device_alloc(size_t bytes);          // NULL when the arena is used up
bool device_free(void* p);                 // false: p is not a live allocation's start
bool is_device(const void* p);             // p lies in the device arena
size_t device_bytes_live();
void set_max_dynamic_smem(const void* fn, int bytes);
cudaError_t take_last_error();             // cudaGetLastError: the thread's last launch error, cleared
// A note printed once per process on stderr: which library call the emulator stands in for, and how.
void note_once(const char* what);

// Device memory is fenced from host code, as on a GPU: the arena is inaccessible except while the device
// itself works on it (a launch, a copy, a library call), each of which holds a FenceLift for its duration.
// A host access outside those is a segmentation fault the emulator names.
void fence_lift();
void fence_drop();
struct FenceLift {
    FenceLift() { fence_lift(); }
    ~FenceLift() { fence_drop(); }
    FenceLift(const FenceLift&) = delete;
    FenceLift& operator=(const FenceLift&) = delete;
};
}  // namespace emu
