// run_record.c: see run_record.h.
#include "core/checkpoint/run_record.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

typedef enum {
    FIXED,      // may never change on resume
    SCHEDULE,   // shapes the learning rate: a change is harmless when the steps taken keep their rates
    OTHER,      // any change makes the remaining steps differ from a run launched with the new value
} KeyKind;

typedef struct {
    const char* key;    // in the manifest
    const char* flag;   // what the user sets
    KeyKind kind;
    int optional;       // a manifest may lack it: those written before it was recorded
} RunKey;

static const RunKey KEYS[RUN_RECORD_KEYS] = {
    {"tokens_per_step", "b*t*ga*replicas", FIXED, 0},   // steps index the data: another size skips or repeats tokens
    {"seq_len", "-t", FIXED, 0},                        // another -t cuts the token stream into other windows
    {"seed", "-seed", FIXED, 0},                        // shuffling and stochastic rounding follow it
    {"precision", "-p", FIXED, 0},                      // the state files hold the working copy in this dtype
    {"train", "-i", OTHER, 0},
    {"shuffle", "-sh", OTHER, 0},
    {"steps", "-x", SCHEDULE, 0},
    {"lr", "-l", SCHEDULE, 0},
    {"warmup", "-u", SCHEDULE, 0},
    {"final_lr_frac", "-q", SCHEDULE, 0},
    {"schedule", "-k", SCHEDULE, 0},
    {"weight_decay", "-c", OTHER, 0},
    {"grad_clip", "-gc", OTHER, 0},
    {"delayed_update", "-dpu", OTHER, 1},
    // Under -dpu every evaluation, sample and checkpoint lands the update in flight at once, so their
    // cadence decides which steps see fresh parameters; without -dpu they only observe ("-").
    {"dpu_val_every", "-v (with -dpu)", OTHER, 1},
    {"dpu_sample_every", "-s (with -dpu)", OTHER, 1},
    {"dpu_ckpt_every", "-n (with -dpu)", OTHER, 1},
};
enum { STEPS = 6, LR, WARMUP, FINAL_LR_FRAC, LR_SCHEDULE };   // indices of the schedule's keys

// The shortest decimal form that reads back as the same float: 0.0003, not 0.000300000014.
static void format_float(char* out, float v) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, RUN_RECORD_VALUE, "%.*g", digits, v);
        if (strtof(out, NULL) == v) return;
    }
}

void run_record_of(RunRecord* r, const Config* cfg, int max_steps, long long tokens_per_step) {
    memset(r, 0, sizeof(*r));
    int k = 0;
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%lld", tokens_per_step);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", cfg->T);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%llu", (unsigned long long)cfg->seed);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%s", dtype_name(cfg->precision));
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%s", cfg->train_pattern);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", cfg->shuffle);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", max_steps);
    format_float(r->value[k++], cfg->lr);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", cfg->warmup);
    format_float(r->value[k++], cfg->final_lr_frac);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%s", lr_schedule_name(cfg->schedule));
    format_float(r->value[k++], cfg->weight_decay);
    format_float(r->value[k++], cfg->grad_clip);
    snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", cfg->delay_from);
    int validates = cfg->val_pattern && cfg->val_pattern[0] && cfg->val_every > 0;   // as the trainer opens -j
    int landings[3] = {validates ? cfg->val_every : 0, cfg->sample_every, cfg->ckpt_every};
    for (int i = 0; i < 3; i++) {
        if (cfg->delay_from > 0) snprintf(r->value[k++], RUN_RECORD_VALUE, "%d", landings[i]);
        else snprintf(r->value[k++], RUN_RECORD_VALUE, "-");
    }
    for (int i = 0; i < RUN_RECORD_KEYS; i++) r->recorded[i] = 1;
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
    fputs("\"run\": {", f);
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        fprintf(f, "%s\"%s\": ", k ? ", " : "", KEYS[k].key);
        write_json_string(f, r->value[k]);
    }
    fputc('}', f);
    if (ferror(f)) fail("write error in %s", path);
}

int run_record_read(RunRecord* r, const Json* j, int run, char* why, size_t why_size) {
    memset(r, 0, sizeof(*r));   // nothing recorded yet
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        int at = json_find(j, run, KEYS[k].key);
        if (at < 0 && KEYS[k].optional) continue;
        const char* value = json_get_string(j, at);
        if (!value || strlen(value) >= RUN_RECORD_VALUE) {
            snprintf(why, why_size, "its \"run\" lacks a well-formed \"%s\"", KEYS[k].key);
            return 0;
        }
        snprintf(r->value[k], RUN_RECORD_VALUE, "%s", value);
        r->recorded[k] = 1;
    }
    return 1;
}

// Appends "-x 20 -> 600" style items for the keys of `kind` that changed; returns how many.
static int list_changes(const RunRecord* saved, const RunRecord* now, KeyKind kind, char* out, size_t size) {
    int n = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        if (KEYS[k].kind != kind || !saved->recorded[k] || !strcmp(saved->value[k], now->value[k])) continue;
        int w = snprintf(out + used, size - used, "%s%s %s -> %s", n ? ", " : "", KEYS[k].flag, saved->value[k], now->value[k]);
        used = w > 0 && used + (size_t)w < size ? used + (size_t)w : size - 1;
        n++;
    }
    return n;
}

// The saved run's learning-rate schedule (cfg with the saved schedule keys) gives every step already taken
// the rate the new flags give it: the resumed run is then the run the new flags launch from scratch.
static int schedule_same_so_far(const RunRecord* saved, const Config* cfg, int max_steps, int first_step) {
    Config old = *cfg;
    old.lr = strtof(saved->value[LR], NULL);
    old.warmup = atoi(saved->value[WARMUP]);
    old.final_lr_frac = strtof(saved->value[FINAL_LR_FRAC], NULL);
    const char* k = saved->value[LR_SCHEDULE];
    old.schedule = !strcmp(k, "cosine") ? LR_COSINE : !strcmp(k, "linear") ? LR_LINEAR : LR_CONSTANT;
    int old_max = atoi(saved->value[STEPS]);
    for (int s = 0; s < first_step; s++)
        if (config_lr_at(&old, s, old_max) != config_lr_at(cfg, s, max_steps)) return 0;
    return 1;
}

// Keys an older manifest lacks are taken from this launch, and said so: nothing changes without a word.
static void note_unrecorded(const RunRecord* saved, const char* ckpt) {
    char names[512] = "";
    size_t used = 0;
    for (int k = 0; k < RUN_RECORD_KEYS; k++) {
        if (saved->recorded[k]) continue;
        int w = snprintf(names + used, sizeof(names) - used, "%s%s", used ? ", " : "", KEYS[k].flag);
        used = w > 0 && used + (size_t)w < sizeof(names) ? used + (size_t)w : used;
    }
    if (used) printf("note: %s does not record %s (written before they were): resuming with this launch's\n", ckpt, names);
}

void run_record_check_resume(const RunRecord* saved, const RunRecord* now, const Config* cfg, int max_steps, int first_step,
                             const char* ckpt, int print) {
    char fixed[2048], schedule[2048], other[2048];
    if (print) note_unrecorded(saved, ckpt);
    if (list_changes(saved, now, FIXED, fixed, sizeof(fixed)))
        fail("resuming %s would change %s, which a resume cannot change (keep them, or start over with -ow 1)", ckpt, fixed);
    int changed = list_changes(saved, now, SCHEDULE, schedule, sizeof(schedule));
    int harmless = changed && schedule_same_so_far(saved, cfg, max_steps, first_step);
    if (harmless && print) printf("resuming %s with %s: the %d steps taken keep their learning rates\n", ckpt, schedule, first_step);
    if (harmless) changed = 0;
    changed += list_changes(saved, now, OTHER, other, sizeof(other));
    if (!changed) return;
    char all[4200];
    snprintf(all, sizeof(all), "%s%s%s", harmless ? "" : schedule, !harmless && schedule[0] && other[0] ? ", " : "", other);
    if (cfg->resume != 2)
        fail("resuming %s would change %s: the run would differ from one launched with these flags; -y 2 resumes "
             "with them anyway, -ow 1 starts over", ckpt, all);
    if (print) printf("resuming %s with changed hyperparameters (-y 2): %s\n", ckpt, all);
}
