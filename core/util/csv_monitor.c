// csv_monitor.c: see csv_monitor.h. A file is opened per row and closed (fclose checked, not synced): a
// run writes a few dozen rows per step, and holding one stream per tag would bound the tags by open files.
#include "core/util/csv_monitor.h"

#include <dirent.h>
#include <errno.h>

#include "base/common.h"
#include "core/util/fs.h"

static int is_csv(const char* name) {
    size_t n = strlen(name);
    return n > 4 && !strcmp(name + n - 4, ".csv");
}

// Keeps the header and the rows of steps below first_step (rewritten through a temporary file).
static void truncate_csv(const char* path, int first_step) {
    FILE* in = xfopen(path, "r");
    char tmp[4500];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* out = xfopen(tmp, "w");
    char* line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (int row = 0; (len = getline(&line, &cap, in)) >= 0; row++)
        if (row == 0 || atoll(line) < first_step) xfwrite(line, 1, (size_t)len, out, tmp);
    if (ferror(in)) fail("cannot read %s: %s", path, strerror(errno));
    free(line);
    fclose(in);   // read only: nothing to lose
    xfclose(out, tmp);
    if (rename(tmp, path) != 0) fail("cannot replace %s: %s", path, strerror(errno));
}

void csv_monitor_open(CsvMonitor* m, const char* dir, int first_step) {
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    make_dirs(dir);
    DIR* d = opendir(dir);
    if (!d) fail("cannot read directory %s: %s", dir, strerror(errno));
    struct dirent* e;
    char path[4400];
    while ((errno = 0, e = readdir(d)) != NULL) {
        if (!is_csv(e->d_name) || first_step <= 0) continue;
        path_join(path, sizeof(path), dir, e->d_name);
        truncate_csv(path, first_step);
    }
    if (errno) fail("cannot read directory %s: %s", dir, strerror(errno));
    closedir(d);
}

void csv_monitor_write(const CsvMonitor* m, long long step, const char* tag, const char* value) {
    if (!m->dir[0]) return;
    char name[1024], path[4400];
    snprintf(name, sizeof(name), "%s.csv", tag);
    for (char* c = name; *c; c++)
        if (*c == '/' || *c == ' ') *c = '_';
    path_join(path, sizeof(path), m->dir, name);
    int is_new = !path_exists(path);
    FILE* f = xfopen(path, "a");
    const char* last = strrchr(tag, '/');
    int ok = (!is_new || fprintf(f, "step,%s\n", last ? last + 1 : tag) >= 0) && fprintf(f, "%lld,%s\n", step, value) >= 0;
    if (fclose(f) != 0 || !ok) fail("write error in %s: %s", path, strerror(errno));
}
