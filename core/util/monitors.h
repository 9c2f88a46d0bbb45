// monitors.h: the scalars of log.jsonl, also in TensorBoard's event file (DIR/tb/) and in DeepSpeed-style CSV
// files (DIR/csv/). Fed each log line as it is written, so the three cannot disagree. A line's scalars: each
// number in it except "step", at that step; a number inside an object is tagged with the keys leading to it
// joined by '/' ("breakdown_ms/forward"); a line with a top-level "rank" is that rank's ("rank0/memory/params",
// the rank itself no scalar); arrays (per-rank and per-unit lists), non-numbers (a null for a non-finite
// loss) and the "layout" record (the run's shape, not a measurement) are left out. The event file holds each value as a float32; a CSV row holds the number's text in the log.
#pragma once
#include "core/util/csv_monitor.h"
#include "core/util/tfevents.h"

typedef struct {
    EventFile events;
    CsvMonitor csv;
    int on;
} Monitors;

// first_step > 0 (a resumed run): records of steps >= first_step are dropped first, as log.jsonl's lines are.
void monitors_open(Monitors* m, const char* dir, int first_step);
// One log line (a JSON object with a whole "step"); a line without one is no scalar's.
void monitors_line(Monitors* m, const char* line);
void monitors_close(Monitors* m);
