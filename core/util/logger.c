// logger.c: see logger.h.
#include "core/util/logger.h"

#include <errno.h>
#include <stdarg.h>

#include "base/common.h"
#include "core/util/fs.h"
#include "core/util/monitors.h"

// Keeps the lines of an existing log whose "step" is below first_step (rewritten through a temporary file).
static void truncate_log(const char* path, int first_step) {
    if (!path_exists(path)) return;
    FILE* in = xfopen(path, "r");   // a regular file only: a FIFO here would block the resume forever
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* out = xfopen(tmp, "w");
    char* line = NULL;   // whole lines, however long (a many-rank traffic record passes any fixed buffer)
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, in)) >= 0) {
        const char* s = strstr(line, "\"step\":");
        if (s && atoi(s + 7) >= first_step) continue;
        xfwrite(line, 1, (size_t)len, out, tmp);
    }
    if (ferror(in)) fail("cannot read %s: %s", path, strerror(errno));   // before the copy replaces it
    free(line);
    fclose(in);   // read only: nothing to lose
    xfclose(out, tmp);
    if (rename(tmp, path) != 0) fail("cannot replace %s: %s", path, strerror(errno));
}

void logger_open(Logger* lg, const char* dir, int first_step) {
    lg->f = NULL;
    lg->monitors.on = 0;
    if (!dir) return;
    snprintf(lg->path, sizeof(lg->path), "%s/log.jsonl", dir);
    if (first_step > 0) truncate_log(lg->path, first_step);
    lg->f = xfopen(lg->path, first_step > 0 ? "a" : "w");
    monitors_open(&lg->monitors, dir, first_step);
}

void logger_line(Logger* lg, const char* fmt, ...) {
    if (!lg->f) return;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char* line = len >= 0 ? (char*)xmalloc((size_t)len + 1) : NULL;
    if (line) vsnprintf(line, (size_t)len + 1, fmt, again);
    va_end(again);
    if (!line) fail("cannot format a line of %s", lg->path);
    int ok = fputs(line, lg->f) != EOF && fputc('\n', lg->f) != EOF && fflush(lg->f) == 0;
    if (!ok) fail("write error in %s: %s", lg->path, strerror(errno));
    monitors_line(&lg->monitors, line);
    free(line);
}

void logger_close(Logger* lg) {
    if (lg->f) xfclose(lg->f, lg->path);
    lg->f = NULL;
    monitors_close(&lg->monitors);
}
