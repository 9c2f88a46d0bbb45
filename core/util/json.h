// json.h: a small, strict JSON reader: the files the trainer writes and reads back itself (checkpoint
// manifests, DONE) and Hugging Face tokenizer.json files (megabytes, hundreds of thousands of values). The
// whole text is parsed into a table of values, looked up by key or walked child by child, so neither the
// writer's key order nor its spacing matters. Objects, arrays, strings (escapes decoded, \u to UTF-8 with
// surrogate pairs joined), numbers, true, false, null. Refused, with the byte offset of the problem: text
// that is not UTF-8, a duplicate key, nesting deeper than JSON_MAX_DEPTH, a lone surrogate, \u0000 (strings
// are NUL-terminated, so it could not be told from their end), anything after the value; text that ends
// early is said to end there.
#pragma once
#include <stddef.h>

#define JSON_MAX_DEPTH 16

typedef enum { JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_NUMBER, JSON_TRUE, JSON_FALSE, JSON_NULL } JsonType;

typedef struct {
    int parent;         // the enclosing object's or array's index; -1 for the root
    int next;           // the next member of the same parent; -1 for the last
    JsonType type;
    char* key;          // decoded, inside an object; NULL otherwise (points into Json.text)
    char* string;       // decoded, for JSON_STRING (points into Json.text)
    const char* text;   // where the value starts in the parsed text (numbers are read from here)
} JsonValue;

typedef struct {
    JsonValue* values;   // values[0] is the root; a container's members follow it, in document order
    int count, cap;
    char* text;          // the parser's own copy of the text; strings are decoded in place
} Json;

// Parses text into j: 1, or 0 with the problem (and its byte offset) in why. json_free either way.
int json_parse(Json* j, const char* text, char* why, size_t why_size);
// The same, taking over `text` (malloc'd, NUL-terminated): no copy of a large file.
int json_parse_buffer(Json* j, char* text, char* why, size_t why_size);
void json_free(Json* j);
// The index of `key` in object `object` (0: the root), or -1 when absent or object is not an object.
int json_find(const Json* j, int object, const char* key);
// The first member of object or array i, and the member after member i: -1 when there is none.
int json_first(const Json* j, int i);
int json_next(const Json* j, int i);
// The byte offset of value i in the parsed text: for messages that point at the problem.
size_t json_offset(const Json* j, int i);
// The value at index i as a whole number within [lo, hi], a finite number, or a string: 1, or 0 when it is
// another type or out of range (i < 0 included, so a json_find miss reads as 0).
int json_get_int(const Json* j, int i, long long lo, long long hi, long long* out);
int json_get_number(const Json* j, int i, double* out);
const char* json_get_string(const Json* j, int i);   // NULL when not a string
