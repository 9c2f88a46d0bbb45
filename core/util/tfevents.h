// tfevents.h: a TensorBoard event file, DIR/events.out.tfevents.<unix time>.<host>: TFRecord framing (uint64
// length, its masked CRC-32C, the bytes, their masked CRC-32C; little-endian) around protobuf Event messages
// encoded by hand: wall_time (double, field 1), step (int64, field 2), file_version "brain.Event:2" (string,
// field 3, the first record only), summary (field 5) = Summary { repeated Value value = 1 }, Value { string tag
// = 1; float simple_value = 2 }.
#pragma once
#include <stdio.h>

typedef struct {
    FILE* f;
    char path[4200];
} EventFile;

// Opens the event file in dir (made if missing). first_step > 0 (a resumed run): the existing file is kept and
// its records of steps >= first_step dropped (a torn last record too), so no step appears twice; otherwise a
// fresh file begins with the file_version record.
void event_file_open(EventFile* ev, const char* dir, int first_step);
// One Event at `step` holding n scalars tags[i] = values[i] (float: simple_value's type), flushed.
void event_file_write(EventFile* ev, long long step, const char* const* tags, const double* values, int n);
void event_file_close(EventFile* ev);
