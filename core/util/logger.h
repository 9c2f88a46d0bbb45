// logger.h: DIR/log.jsonl, one JSON object per line, flushed as written so a crash loses nothing; each line's
// scalars also go to TensorBoard and CSV files beside it (core/util/monitors.h).
#pragma once
#include <stdio.h>

#include "core/util/monitors.h"

typedef struct {
    FILE* f;   // NULL when there is no output directory: logging is then a no-op
    char path[4096];
    Monitors monitors;
} Logger;

// Opens DIR/log.jsonl (DIR exists: run_dir_open made it). first_step > 0 (a resumed run): lines of steps >= first_step, written by the run
// that was interrupted after its checkpoint, are dropped so every step appears once; the monitors' files likewise.
void logger_open(Logger* lg, const char* dir, int first_step);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void logger_line(Logger* lg, const char* fmt, ...);   // fmt is one JSON object, without the newline
void logger_close(Logger* lg);
