// monitors.c: see monitors.h.
#include "core/util/monitors.h"

#include <limits.h>

#include "base/common.h"
#include "core/util/fs.h"
#include "core/util/json.h"

#define MAX_TAG 512

typedef struct {
    char** tags;
    double* values;
    char** texts;   // each number as the log wrote it
    int n, cap;
} Scalars;

static void add_scalar(Scalars* s, const char* tag, double value, const char* text) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->tags = (char**)xrealloc(s->tags, (size_t)s->cap * sizeof(char*));
        s->texts = (char**)xrealloc(s->texts, (size_t)s->cap * sizeof(char*));
        s->values = (double*)xrealloc(s->values, (size_t)s->cap * sizeof(double));
    }
    size_t len = strspn(text, "0123456789+-.eE");
    s->tags[s->n] = strdup(tag);
    s->texts[s->n] = strndup(text, len);
    if (!s->tags[s->n] || !s->texts[s->n]) fail("out of memory");
    s->values[s->n++] = value;
}

static void free_scalars(Scalars* s) {
    for (int i = 0; i < s->n; i++) free(s->tags[i]), free(s->texts[i]);
    free(s->tags), free(s->texts), free(s->values);
}

// The numbers of object `obj` and of the objects inside it, tagged prefix + the keys on the way.
static void collect(const Json* j, int obj, const char* prefix, Scalars* out) {
    for (int i = json_first(j, obj); i >= 0; i = json_next(j, i)) {
        const JsonValue* v = &j->values[i];
        if (obj == 0 && (!strcmp(v->key, "step") || !strcmp(v->key, "rank") || !strcmp(v->key, "layout"))) continue;
        char tag[MAX_TAG];
        if (snprintf(tag, sizeof(tag), "%s%s", prefix, v->key) >= (int)sizeof(tag)) continue;
        double x;
        if (v->type == JSON_NUMBER && json_get_number(j, i, &x)) add_scalar(out, tag, x, v->text);
        if (v->type == JSON_OBJECT && strlen(tag) + 1 < sizeof(tag)) collect(j, i, strcat(tag, "/"), out);
    }
}

void monitors_open(Monitors* m, const char* dir, int first_step) {
    char sub[4200];
    m->on = 1;
    const char* names[2] = {"tb", "csv"};
    for (int i = 0; i < 2; i++) {   // a run from step 0 owns no earlier records (as log.jsonl is rewritten)
        path_join(sub, sizeof(sub), dir, names[i]);
        if (first_step == 0) remove_path(sub);
    }
    path_join(sub, sizeof(sub), dir, "tb");
    event_file_open(&m->events, sub, first_step);
    path_join(sub, sizeof(sub), dir, "csv");
    csv_monitor_open(&m->csv, sub, first_step);
}

void monitors_line(Monitors* m, const char* line) {
    if (!m->on) return;
    Json j;
    char why[256];
    long long step, rank;
    if (!json_parse(&j, line, why, sizeof(why))) fail("internal: a log line is not JSON (%s): %.200s", why, line);
    if (json_get_int(&j, json_find(&j, 0, "step"), 0, LLONG_MAX, &step)) {
        char prefix[64] = "";
        if (json_get_int(&j, json_find(&j, 0, "rank"), 0, INT_MAX, &rank)) snprintf(prefix, sizeof(prefix), "rank%lld/", rank);
        Scalars s = {0};
        collect(&j, 0, prefix, &s);
        event_file_write(&m->events, step, (const char* const*)s.tags, s.values, s.n);
        for (int i = 0; i < s.n; i++) csv_monitor_write(&m->csv, step, s.tags[i], s.texts[i]);
        free_scalars(&s);
    }
    json_free(&j);
}

void monitors_close(Monitors* m) {
    if (m->on) event_file_close(&m->events);
    m->on = 0;
}
