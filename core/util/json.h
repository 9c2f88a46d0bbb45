// json.h: a small JSON reader for the files the trainer writes and reads back itself (checkpoint manifests,
// DONE). The whole text is parsed into a table of values looked up by key, so neither the writer's key
// order nor its spacing matters. Objects, arrays, strings (escapes decoded, \u to UTF-8), numbers, true,
// false, null; a duplicate key, nesting deeper than JSON_MAX_DEPTH, or anything after the value is an error.
#pragma once
#include <stddef.h>

#define JSON_MAX_DEPTH 16

typedef enum { JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_NUMBER, JSON_TRUE, JSON_FALSE, JSON_NULL } JsonType;

typedef struct {
    int parent;         // the enclosing object's or array's index; -1 for the root
    JsonType type;
    char* key;          // decoded, inside an object; NULL otherwise
    char* string;       // decoded, for JSON_STRING
    const char* text;   // where the value starts in the parsed text (numbers are read from here)
} JsonValue;

typedef struct {
    JsonValue* values;   // values[0] is the root
    int count, cap;
    char* text;          // the parser's own copy of the text, which the values point into
} Json;

// Parses text into j: 1, or 0 with the problem (and its byte offset) in why. json_free either way.
int json_parse(Json* j, const char* text, char* why, size_t why_size);
void json_free(Json* j);
// The index of `key` in object `object` (0: the root), or -1 when absent or object is not an object.
int json_find(const Json* j, int object, const char* key);
// The value at index i as a whole number within [lo, hi], a finite number, or a string: 1, or 0 when it is
// another type or out of range (i < 0 included, so a json_find miss reads as 0).
int json_get_int(const Json* j, int i, long long lo, long long hi, long long* out);
int json_get_number(const Json* j, int i, double* out);
const char* json_get_string(const Json* j, int i);   // NULL when not a string
