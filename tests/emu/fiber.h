// fiber.h: stackful coroutines for the emulator's GPU threads. One switch saves the callee-saved registers and
// the floating-point control words on the old stack and restores them from the new one (the System V x86-64
// ABI leaves every other register to the caller), so a switch costs a few nanoseconds, not a system call.
#pragma once
#include <stddef.h>

namespace emu {

struct Fiber {
    void* sp;   // saved stack pointer while the fiber is not running
};

// Saves the running context's stack pointer in *from and resumes `to`.
extern "C" void emu_fiber_switch(void** from, void* to);

// A fiber that starts in entry() on the stack [stack, stack + bytes); entry must never return (it switches
// away for the last time instead).
void fiber_init(Fiber* f, void* stack, size_t bytes, void (*entry)());

}  // namespace emu
