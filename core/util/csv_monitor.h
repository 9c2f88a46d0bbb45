// csv_monitor.h: one CSV file per scalar, as DeepSpeed's CSV monitor writes them: DIR/<tag with '/' and ' '
// made '_'>.csv, a header row "step,<the tag's last '/' component>", then a row "step,value" per record.
#pragma once

typedef struct {
    char dir[4200];   // empty: off
} CsvMonitor;

// dir is made if missing. first_step > 0 (a resumed run): each existing CSV keeps its header and its rows of
// steps below first_step.
void csv_monitor_open(CsvMonitor* m, const char* dir, int first_step);
// Appends "step,value" to tag's file (its header first when the file is new); value is the number's text.
void csv_monitor_write(const CsvMonitor* m, long long step, const char* tag, const char* value);
