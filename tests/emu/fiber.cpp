// fiber.cpp: the context switch (x86-64 System V) and the initial frame of a new fiber.
#include "tests/emu/fiber.h"

#include <stdint.h>
#include <string.h>

#if !defined(__x86_64__)
#error "the emulator's fibers are written for x86-64"
#endif

// Pushes rbp, rbx, r12-r15 and the MXCSR / x87 control words, stores rsp, loads the other stack and pops the
// same in reverse; `ret` resumes wherever that fiber last called emu_fiber_switch (or its entry, first time).
asm(R"(
    .text
    .globl emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch
    .section .note.GNU-stack,"",@progbits
)");

namespace emu {

// The frame emu_fiber_switch pops, built by hand at the top of the stack (high addresses first):
//   top-8: 0 (entry's return address: entry never returns; it keeps rsp = 8 mod 16 at entry, as a call does)
//   top-16: entry (popped by ret)   top-24..top-64: rbp rbx r12 r13 r14 r15 = 0   top-72: MXCSR | x87 CW
void fiber_init(Fiber* f, void* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
    uint64_t* s = (uint64_t*)top;
    s[-1] = 0;
    s[-2] = (uint64_t)(uintptr_t)entry;
    for (int i = 3; i <= 8; i++) s[-i] = 0;
    uint32_t mxcsr;
    uint16_t cw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(cw));
    uint64_t ctl = mxcsr | ((uint64_t)cw << 32);
    memcpy(&s[-9], &ctl, 8);
    f->sp = &s[-9];
}

}  // namespace emu
