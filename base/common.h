// common.h: error reporting and checked stdio/allocation shared by every part of the trainer. The base
// layer: it includes nothing of the project, so everything above (kernels/, core/, zero, the trainer) may use it.
// Every failure ends in one line on stderr naming the problem, and exit(1): bad input never crashes.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// Print "error: <message>" (one line, one write(2), so ranks sharing mpirun's stderr do not interleave)
// and exit(1). printf-style. Under a multi-rank launch a rank other than 0 (the launcher's environment:
// OMPI_COMM_WORLD_RANK, else PMIX_RANK, else PMI_RANK) first puts SIGTERM/SIGINT back to their default and
// waits about 2 s: an error every rank hits is printed by rank 0 alone (its non-zero exit makes mpirun kill
// the waiting ranks), and one only rank r hits is printed after the wait as "error: rank r: <message>".
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 1, 2)))
#endif
void fail(const char* fmt, ...);

// For checks that report instead of exiting: formats the problem into why (size bytes) and returns 0, so a
// check reads `if (...) return set_why(why, n, "...", ...);`.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int set_why(char* why, size_t size, const char* fmt, ...);

// fail()'s line, "error: <message>" in one write(2), without its rank prefix, its wait or its exit: for a
// caller that names the ranks itself and ends the process its own way (the comm layer's hang watchdog, which
// aborts the whole MPI job).
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void print_error_line(const char* fmt, ...);

// Checked wrappers: on failure they call fail() with the path / size involved.
void* xmalloc(size_t bytes);
void* xcalloc(size_t n, size_t size);
void* xrealloc(void* p, size_t bytes);
FILE* xfopen(const char* path, const char* mode);   // "r"/"rb": regular files only (a FIFO would block)
void xfread(void* dst, size_t size, size_t n, FILE* f, const char* path);   // fails on short read ("truncated")
void xfwrite(const void* src, size_t size, size_t n, FILE* f, const char* path);
void xfclose(FILE* f, const char* path);                                      // fflush + fsync + fclose, checked
void xfseek(FILE* f, long long off, int whence, const char* path);
void flush_stdout(void);
// FNV-1a over n bytes, continuing from h (FNV1A_START to begin): hashes that ranks compare (comm_all_equal)
// instead of sending what should be bit-identical.
#define FNV1A_START 1469598103934665603ull
uint64_t fnv1a(uint64_t h, const void* p, size_t n);   // what was printed is written (a full disk under `> file` is an error, not a short file)
long long file_size(const char* path);                                        // -1 if missing
// out = dir + "/" + name; fails if it does not fit in size bytes.
void path_join(char* out, size_t size, const char* dir, const char* name);
// out = the file `name` in the directory of `path` ("." when path has no '/'); fails like path_join.
void path_beside(char* out, size_t size, const char* path, const char* name);

#ifdef __cplusplus
}
#endif
