// test_flags.c: the flag table (core/run/flags.c) against what is written from it and about it: docs/flags.md
// names every flag of the table and the table every flag of the page; -h lists every flag, and -y's help every
// flag a resume refuses to change; each default parses, formats and parses back to the same value; the run
// record's places are 0..RUN_RECORD_KEYS-1, once each, under distinct keys; the AdamW defaults are the
// constants they replaced. Run from the repository root (tests/run_all.sh does).
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/run_record.h"
#include "core/run/flags.h"
#include "tests/unit/testlib.h"

#define DOCS "docs/flags.md"

// One check with a list of what is wrong: "ok NAME" when the list is empty, else "FAIL NAME: list".
static void check_list(TestStats* st, const char* name, const char* wrong) {
    if (!wrong[0]) {
        st->passed++;
        printf("ok %s\n", name);
    } else {
        st->failed++;
        printf("FAIL %s: %s\n", name, wrong);
    }
    fflush(stdout);
}

static void append(char* list, size_t size, const char* item) {
    size_t used = strlen(list), len = strlen(item);
    if (used + 2 + len >= size) return;   // the list so far says enough
    if (used) memcpy(list + used, ", ", 2), used += 2;
    memcpy(list + used, item, len + 1);
}

// name in text, not as the start of a longer flag (-n, not -nf).
static int names_flag(const char* text, const char* name) {
    size_t len = strlen(name);
    for (const char* at = strstr(text, name); at; at = strstr(at + 1, name))
        if (!strchr("-abcdefghijklmnopqrstuvwxyz0123456789", at[len]) || !at[len]) return 1;
    return 0;
}

static char* read_text(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    char* text = NULL;
    size_t size = 0;
    FILE* mem = open_memstream(&text, &size);
    char buf[4096];
    size_t n;
    while (mem && (n = fread(buf, 1, sizeof(buf), f)) > 0) fwrite(buf, 1, n, mem);
    fclose(f);
    if (mem) fclose(mem);
    return text;
}

// The flags docs/flags.md's first table names: each `-name` (or `--name`) in a row's first cell, up to the
// first "## " heading (the other programs' tables follow it).
static int docs_flags(char names[][32], int cap) {
    char* text = read_text(DOCS);
    if (!text) return -1;
    char* end = strstr(text, "\n## ");
    if (end) *end = '\0';
    int n = 0;
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] != '|' || !strncmp(line, "|---", 4) || !strncmp(line, "| flag ", 7)) continue;
        char* cell_end = strstr(line + 1, " | ");
        if (cell_end) *cell_end = '\0';
        for (char* p = strstr(line, "`-"); p && n < cap; p = strstr(p + 1, "`-")) {
            size_t len = strspn(p + 1, "-abcdefghijklmnopqrstuvwxyz0123456789");
            if (len < sizeof(names[0])) snprintf(names[n++], sizeof(names[0]), "%.*s", (int)len, p + 1);
        }
    }
    free(text);
    return n;
}

static void docs_match_table(TestStats* st) {
    char names[256][32], missing[2048] = "", unknown[2048] = "";
    int n = docs_flags(names, 256);
    if (n < 0) {
        check_list(st, "flags_docs_readable", DOCS " cannot be read (run from the repository root)");
        return;
    }
    for (int i = 0; i < FLAG_COUNT; i++) {
        int found = 0;
        for (int k = 0; k < n && !found; k++) found = !strcmp(names[k], FLAGS[i].name);
        if (!found) append(missing, sizeof(missing), FLAGS[i].name);
    }
    for (int k = 0; k < n; k++)
        if (!flag_find(names[k])) append(unknown, sizeof(unknown), names[k]);
    check_list(st, "flags_docs_list_every_flag", missing);
    check_list(st, "flags_docs_name_no_other_flag", unknown);
}

static void usage_lists_every_flag(TestStats* st) {
    char* text = NULL;
    size_t size = 0;
    FILE* mem = open_memstream(&text, &size);
    flags_print_usage(mem, "train_gpt_cpu");
    fclose(mem);
    char missing[2048] = "", line_start[64];
    for (int i = 0; i < FLAG_COUNT; i++) {
        snprintf(line_start, sizeof(line_start), "\n  %s", FLAGS[i].name);   // a row starts with it
        if (!names_flag(text, line_start)) append(missing, sizeof(missing), FLAGS[i].name);
    }
    free(text);
    check_list(st, "flags_usage_lists_every_flag", missing);
}

// -y's help says which flags a resume refuses to change: every recorded flag but the fixed ones, which it
// refuses even under -y 2 (the error says so).
static void resume_help_names_refused_flags(TestStats* st) {
    const char* help = flag_find("-y")->help;
    char missing[1024] = "";
    for (int i = 0; i < FLAG_COUNT; i++) {
        ResumeKind kind = FLAGS[i].resume.kind;
        if ((kind == RESUME_SCHEDULE || kind == RESUME_OTHER) && !names_flag(help, FLAGS[i].name))
            append(missing, sizeof(missing), FLAGS[i].name);
    }
    check_list(st, "flags_resume_help_names_refused_flags", missing);
}

static size_t field_size(const Flag* f) {
    switch (f->type) {
        case FLAG_STRING: return sizeof(const char*);
        case FLAG_LONG: return sizeof(long long);
        case FLAG_U64: return sizeof(uint64_t);
        case FLAG_FLOAT: return sizeof(float);
        default: return sizeof(int);
    }
}

// What the run record writes and a resume reads back through the same row must be the same value.
static void defaults_round_trip(TestStats* st) {
    Config defaults, back;
    config_defaults(&defaults);
    char wrong[2048] = "", text[1024], again[1024], why[512];
    for (int i = 0; i < FLAG_COUNT; i++) {
        const Flag* f = &FLAGS[i];
        if (!f->def) continue;
        back = defaults;
        memset((char*)&back + f->field, 0xA5, field_size(f));
        flag_format(f, &defaults, text, sizeof(text));
        int same = flag_parse_typed(f, &back, text, why, sizeof(why));
        flag_format(f, &back, again, sizeof(again));
        same = same && !strcmp(text, again);
        if (f->type != FLAG_STRING) same = same && !memcmp((char*)&back + f->field, (char*)&defaults + f->field, field_size(f));
        if (!same) append(wrong, sizeof(wrong), f->name);
    }
    check_list(st, "flags_defaults_format_and_parse_back", wrong);
}

static void record_places(TestStats* st) {
    char wrong[1024] = "", item[128];
    int at_count[RUN_RECORD_KEYS] = {0};
    for (int i = 0; i < FLAG_COUNT; i++) {
        const FlagResume* r = &FLAGS[i].resume;
        if (r->kind == RESUME_FREE) continue;
        if (r->at < 0 || r->at >= RUN_RECORD_KEYS) {
            snprintf(item, sizeof(item), "%s at %d", FLAGS[i].name, r->at);
            append(wrong, sizeof(wrong), item);
            continue;
        }
        at_count[r->at]++;
        for (int j = 0; j < i; j++)
            if (FLAGS[j].resume.kind != RESUME_FREE && !strcmp(FLAGS[j].resume.key, r->key)) append(wrong, sizeof(wrong), r->key);
    }
    for (int k = 0; k < RUN_RECORD_KEYS; k++)
        if (at_count[k] != 1) snprintf(item, sizeof(item), "place %d held %d times", k, at_count[k]), append(wrong, sizeof(wrong), item);
    check_list(st, "flags_record_places_once_each", wrong);
}

int main(void) {
    TestStats st = {0, 0};
    docs_match_table(&st);
    usage_lists_every_flag(&st);
    resume_help_names_refused_flags(&st);
    defaults_round_trip(&st);
    record_places(&st);
    Config c;
    config_defaults(&c);
    check_true(&st, "flags_adam_defaults_are_the_constants_they_replaced",
               c.adam_beta1 == 0.9f && c.adam_beta2 == 0.95f && c.adam_eps == 1e-8f);
    return test_exit(&st);
}
