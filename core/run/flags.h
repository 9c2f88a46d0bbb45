// flags.h: the command line as one table, a row per flag (flags.c). Parsing, the defaults, -h, the run
// record's keys and values (core/checkpoint/run_record.c) and tests/unit/test_flags.c's check of docs/flags.md
// are all read from it, so a flag is added in one place. Checks across flags stay in config.c.
#pragma once
#include <stddef.h>

#include "core/run/config.h"

// A row's value type follows its Config field's C type (flags.c's TYPE_OF); a switch takes no value.
typedef enum {
    FLAG_STRING,   // const char*
    FLAG_INT,      // int
    FLAG_LONG,     // long long
    FLAG_U64,      // uint64_t
    FLAG_FLOAT,    // float, from a plain decimal
    FLAG_ENUM,     // an enum field: one of the row's names, each value's name at its index
    FLAG_SWITCH,   // an int set to 1 by the flag alone (--estimate)
    FLAG_HELP,     // -h: prints the usage and exits
} FlagType;

// What a resume may do with a flag's value (run_record.h). Flags not recorded change only the layout or what
// observes the run, and a resume may change them freely.
typedef enum {
    RESUME_FREE,       // not recorded
    RESUME_FIXED,      // may never change: the data position or the state files depend on it
    RESUME_SCHEDULE,   // shapes the learning rate: a change is harmless when the steps taken keep their rates
    RESUME_OTHER,      // any change makes the remaining steps differ from a run launched with the new value
} ResumeKind;

// What a manifest without the key means.
typedef enum {
    ABSENT_REFUSED,   // a damaged manifest: the key was recorded from the start
    ABSENT_UNKNOWN,   // written before the key was: resumed with the launch's value, said so
    // The flag's default. Such a key is written only when its value differs from the default, so a run with
    // the defaults writes the manifest it wrote before the flag existed.
    ABSENT_DEFAULT,
} AbsentMeans;

// What a recorded value may depend on besides the flags: the resolved step count and tokens per step.
typedef struct {
    const Config* cfg;
    int max_steps;
    long long tokens_per_step;
} RunFacts;

typedef struct Flag Flag;
// A row's own parsing, where its type's is not all: sets the field (usually through flag_parse_typed) or
// formats the problem into why and returns 0.
typedef int (*FlagParse)(const Flag* f, Config* c, const char* value, char* why, size_t size);
// A recorded value other than the field's own (resolved or derived from several fields).
typedef void (*FlagRecordValue)(const RunFacts* run, char* out, size_t size);

typedef struct {
    ResumeKind kind;
    const char* key;         // in the manifest's "run" object
    int at;                  // its place there (0 .. RUN_RECORD_KEYS-1), so the manifest's bytes stay put
    AbsentMeans absent;
    const char* label;       // what a resume's messages call it; NULL: the flag's name
    FlagRecordValue value;   // NULL: the field's value as the flag would take it
} FlagResume;

enum { FLAG_LO_OPEN = 1, FLAG_HI_OPEN = 2 };   // FlagRange.open: the bound itself is outside

typedef struct {
    double lo, hi;   // integers and numbers; both 0: no range
    int open;
} FlagRange;

struct Flag {
    const char* group;               // -h's heading, printed where it changes
    const char* name;                // "-l"
    const char* arg;                 // -h's name of the value ("F"); NULL: from the type or the names
    FlagType type;
    size_t field;                    // offsetof(Config, ...)
    FlagRange range;
    const char* const* names;        // FLAG_ENUM: names[value], NULL where a value has no name
    int name_count;
    const char* def;                 // the default as the flag's value text; NULL: zero (or none)
    const char* def_shown;           // -h's default where def does not tell it (a default resolved later)
    const char* help;                // -h's text; " (default ...)" is appended
    FlagParse parse;                 // NULL: by type
    FlagResume resume;
};

extern const Flag FLAGS[];
extern const int FLAG_COUNT;

// The row of a flag's name ("--help" is -h's), or NULL.
const Flag* flag_find(const char* name);
// Parses value by the row's type and range into its field: 1, or 0 with the problem in why.
int flag_parse_typed(const Flag* f, Config* c, const char* value, char* why, size_t size);
// The row's own parsing when it has one, else flag_parse_typed.
int flag_parse(const Flag* f, Config* c, const char* value, char* why, size_t size);
// The field's value as the flag would take it back (a float in its shortest exact decimal form).
void flag_format(const Flag* f, const Config* c, char* out, size_t size);
// What the run record holds for the row: its record hook's value, else flag_format's.
void flag_record_value(const Flag* f, const RunFacts* run, char* out, size_t size);
// What a resume's messages call the row.
const char* flag_label(const Flag* f);
// Every row, grouped under its headings, each with its default, wrapped to the terminal's usual width.
void flags_print_usage(FILE* out, const char* prog);
