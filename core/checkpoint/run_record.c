// run_record.c: see run_record.h. The keys, their rules and their values are the flag table's (flags.c).
#include "core/checkpoint/run_record.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/run/flags.h"

// The recorded rows by their place in the manifest (each row's resume.at).
static void record_rows(const Flag* rows[RUN_RECORD_KEYS]) {
    memset(rows, 0, RUN_RECORD_KEYS * sizeof(*rows));
    for (int i = 0; i < FLAG_COUNT; i++) {
        const Flag* f = &FLAGS[i];
        if (f->resume.kind == RESUME_FREE) continue;
        if (f->resume.at < 0 || f->resume.at >= RUN_RECORD_KEYS || rows[f->resume.at])
            fail("the flag table records %s at place %d of the run record, taken or outside 0..%d", f->name, f->resume.at,
                 RUN_RECORD_KEYS - 1);
        rows[f->resume.at] = f;
    }
    for (int k = 0; k < RUN_RECORD_KEYS; k++)
        if (!rows[k]) fail("the flag table records no flag at place %d of the run record", k);
}

// The value a row's key holds when a manifest lacks it (ABSENT_DEFAULT).
static void default_value(const Flag* f, char* out, size_t size) {
    Config defaults;
    config_defaults(&defaults);
    flag_format(f, &defaults, out, size);
}

void run_record_of(RunRecord* r, const Config* cfg, int max_steps, long long tokens_per_step) {
    const Flag* rows[RUN_RECORD_KEYS];
    record_rows(rows);
    memset(r, 0, sizeof(*r));
    RunFacts run = {cfg, max_steps, tokens_per_step};
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        flag_record_value(rows[k], &run, r->value[k], RUN_RECORD_VALUE);
        r->recorded[k] = 1;
    }
}

// Every value is written as a JSON string, escaped, so a path with quotes or backslashes survives.
static void write_json_string(FILE* f, const char* s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void run_record_write_json(FILE* f, const RunRecord* r, const char* path) {
    const Flag* rows[RUN_RECORD_KEYS];
    record_rows(rows);
    fputs("\"run\": {", f);
    char def[RUN_RECORD_VALUE];
    for (int k = 0, written = 0; k < RUN_RECORD_KEYS; k++) {
        if (rows[k]->resume.absent == ABSENT_DEFAULT && (default_value(rows[k], def, sizeof(def)), !strcmp(def, r->value[k])))
            continue;
        fprintf(f, "%s\"%s\": ", written++ ? ", " : "", rows[k]->resume.key);
        write_json_string(f, r->value[k]);
    }
    fputc('}', f);
    if (ferror(f)) fail("write error in %s", path);
}

int run_record_read(RunRecord* r, const Json* j, int run, char* why, size_t why_size) {
    const Flag* rows[RUN_RECORD_KEYS];
    record_rows(rows);
    memset(r, 0, sizeof(*r));   // nothing recorded yet
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        const FlagResume* rule = &rows[k]->resume;
        int at = json_find(j, run, rule->key);
        if (at < 0 && rule->absent == ABSENT_UNKNOWN) continue;
        if (at < 0 && rule->absent == ABSENT_DEFAULT) {
            default_value(rows[k], r->value[k], RUN_RECORD_VALUE);
            r->recorded[k] = 1;
            continue;
        }
        const char* value = json_get_string(j, at);
        if (!value || strlen(value) >= RUN_RECORD_VALUE) {
            snprintf(why, why_size, "its \"run\" lacks a well-formed \"%s\"", rule->key);
            return 0;
        }
        snprintf(r->value[k], RUN_RECORD_VALUE, "%s", value);
        r->recorded[k] = 1;
    }
    return 1;
}

// Appends "-x 20 -> 600" style items for the keys of `kind` that changed; returns how many.
static int list_changes(const Flag* const rows[], const RunRecord* saved, const RunRecord* now, ResumeKind kind, char* out,
                        size_t size) {
    int n = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        if (rows[k]->resume.kind != kind || !saved->recorded[k] || !strcmp(saved->value[k], now->value[k])) continue;
        int w = snprintf(out + used, size - used, "%s%s %s -> %s", n ? ", " : "", flag_label(rows[k]), saved->value[k],
                         now->value[k]);
        used = w > 0 && used + (size_t)w < size ? used + (size_t)w : size - 1;
        n++;
    }
    return n;
}

// The saved run's learning-rate schedule (cfg with the saved schedule keys, each read back as its flag)
// gives every step already taken the rate the new flags give it: the resumed run is then the run the new
// flags launch from scratch. A saved value that does not read back is a change.
static int schedule_same_so_far(const Flag* const rows[], const RunRecord* saved, const Config* cfg, int max_steps,
                                int first_step) {
    Config old = *cfg;
    char why[512];
    for (int k = 0; k < RUN_RECORD_KEYS; k++)
        if (rows[k]->resume.kind == RESUME_SCHEDULE && saved->recorded[k] && !flag_parse_typed(rows[k], &old, saved->value[k], why, sizeof(why)))
            return 0;
    for (int s = 0; s < first_step; s++)
        if (config_lr_at(&old, s, old.max_steps) != config_lr_at(cfg, s, max_steps) ||
            config_beta1_at(&old, s, old.max_steps) != config_beta1_at(cfg, s, max_steps))
            return 0;
    return 1;
}

// Keys an older manifest lacks are taken from this launch, and said so: nothing changes without a word.
static void note_unrecorded(const Flag* const rows[], const RunRecord* saved, const char* ckpt) {
    char names[512] = "";
    size_t used = 0;
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        if (saved->recorded[k]) continue;
        int w = snprintf(names + used, sizeof(names) - used, "%s%s", used ? ", " : "", flag_label(rows[k]));
        used = w > 0 && used + (size_t)w < sizeof(names) ? used + (size_t)w : used;
    }
    if (used) printf("note: %s does not record %s (written before they were): resuming with this launch's\n", ckpt, names);
}

void run_record_check_resume(const RunRecord* saved, const RunRecord* now, const Config* cfg, int max_steps, int first_step,
                             const char* ckpt, int print) {
    const Flag* rows[RUN_RECORD_KEYS];
    record_rows(rows);
    char fixed[2048], schedule[2048], other[2048];
    if (print) note_unrecorded(rows, saved, ckpt);
    if (list_changes(rows, saved, now, RESUME_FIXED, fixed, sizeof(fixed)))
        fail("resuming %s would change %s, which a resume cannot change (keep them, or start over with -ow 1)", ckpt, fixed);
    int changed = list_changes(rows, saved, now, RESUME_SCHEDULE, schedule, sizeof(schedule));
    int harmless = changed && schedule_same_so_far(rows, saved, cfg, max_steps, first_step);
    if (harmless && print) printf("resuming %s with %s: the %d steps taken keep their learning rates\n", ckpt, schedule, first_step);
    if (harmless) changed = 0;
    changed += list_changes(rows, saved, now, RESUME_OTHER, other, sizeof(other));
    if (!changed) return;
    char all[4200];
    snprintf(all, sizeof(all), "%s%s%s", harmless ? "" : schedule, !harmless && schedule[0] && other[0] ? ", " : "", other);
    if (cfg->resume != 2)
        fail("resuming %s would change %s: the run would differ from one launched with these flags; -y 2 resumes "
             "with them anyway, -ow 1 starts over", ckpt, all);
    if (print) printf("resuming %s with changed hyperparameters (-y 2): %s\n", ckpt, all);
}
