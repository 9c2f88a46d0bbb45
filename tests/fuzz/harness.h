// harness.h: what every fuzz harness shares. See build.sh for how they are built and run.
//
// Why AFL++ in fork-server mode rather than libFuzzer: the readers end bad input with fail(), i.e.
// exit(1), which is the correct outcome and must not end the fuzzing campaign. libFuzzer runs every
// input inside one process and treats any exit as the end (it would need -fork=1 plus a wrapper that
// tells exit(1) from a crash). AFL++ forks a fresh process per input and only counts signals (a
// sanitizer report aborts) and time-outs as findings, and a fresh process per input also means no state
// (open files, half-built structs) leaks from one input into the next.
//
// That alone would accept any exit status, and a reader that exits 2, or exit(1)s without saying why,
// breaks the program's contract just as surely. So harness_begin() swaps stderr for a memory stream and
// registers an on_exit() handler that sees the exit status: 0 is fine, 1 is fine when the captured text
// is exactly one line starting "error: ", anything else abort()s, which AFL++ records as a crash. The
// captured text is echoed to the real stderr, so replaying an input by hand shows the reader's message.
// (Sanitizer reports bypass stdio and go straight to fd 2, so they stay visible too.)
#pragma once
#define _GNU_SOURCE
#include <stddef.h>

typedef struct Harness Harness;

// Reads the fuzz input (the file AFL++ passes as @@), swaps stderr, registers the exit check. With
// scratch != 0 it also creates a private scratch directory, removed (one level deep) at exit whatever the
// outcome, for harnesses that cut the input into several files.
Harness* harness_begin(int argc, char** argv, int scratch, unsigned char** data, size_t* size);
const char* harness_dir(const Harness* h);
// Writes bytes to harness_dir()/name; the path goes into path (PATH_MAX bytes).
void harness_write(const Harness* h, const char* name, const void* bytes, size_t n, char* path);
// Cuts data at each occurrence of sep into at most max parts (the last one keeps any further separators).
// Returns the number of parts (>= 1); part i is [start[i], start[i] + len[i]).
int harness_split(const unsigned char* data, size_t size, const char* sep, int max, const unsigned char** start,
                  size_t* len);
// A broken invariant in what a reader returned: report it and abort() (a finding).
__attribute__((noreturn, format(printf, 2, 3))) void harness_bug(const Harness* h, const char* fmt, ...);
// Little-endian int32 at byte offset off of data, or 0 past its end (harness parameters live in header
// words the readers ignore, so the file the reader sees is exactly the fuzz input).
int harness_le32(const unsigned char* data, size_t size, size_t off);
