// test_json.c: core/util/json.c, the reader of the files the trainer reads back (checkpoint manifests, DONE):
// lookups by key whatever the order and spacing, the value types and their ranges, decoded strings, and
// the refusals (duplicate keys, deep nesting, malformed values, text after the value).
#include <limits.h>
#include <string.h>

#include "core/util/json.h"
#include "tests/unit/testlib.h"

static int parses(const char* text) {
    Json j;
    char why[160];
    int ok = json_parse(&j, text, why, sizeof(why));
    json_free(&j);
    return ok;
}

static void lookups(TestStats* st) {
    Json j;
    char why[160];
    const char* text = " { \"b\" :{\"T\":32,\"x\":[1,{\"y\":2}]},\n\t\"a\": -7 , \"s\": \"q\\\"\\\\\\u00e9\\n\", \"f\": 2.5e-1, \"t\": true}";
    long long v = 0, w = 0;
    double f = 0;
    int ok = json_parse(&j, text, why, sizeof(why));
    check_true(st, "json_parses_spacing_and_order", ok);
    check_true(st, "json_int_nested", ok && json_get_int(&j, json_find(&j, json_find(&j, 0, "b"), "T"), 1, 100, &v) && v == 32);
    check_true(st, "json_int_negative", ok && json_get_int(&j, json_find(&j, 0, "a"), -10, 10, &w) && w == -7);
    check_true(st, "json_int_range", ok && !json_get_int(&j, json_find(&j, 0, "a"), 0, 10, &w));
    check_true(st, "json_int_not_whole", ok && !json_get_int(&j, json_find(&j, 0, "f"), LLONG_MIN, LLONG_MAX, &w));
    check_true(st, "json_number", ok && json_get_number(&j, json_find(&j, 0, "f"), &f) && f == 0.25);
    const char* s = ok ? json_get_string(&j, json_find(&j, 0, "s")) : NULL;
    check_true(st, "json_string_decoded", s && !strcmp(s, "q\"\\\xc3\xa9\n"));
    check_true(st, "json_missing_key", ok && json_find(&j, 0, "T") < 0 && json_find(&j, json_find(&j, 0, "missing"), "T") < 0);
    check_true(st, "json_wrong_type", ok && !json_get_string(&j, json_find(&j, 0, "a")) && !json_get_int(&j, json_find(&j, 0, "t"), 0, 1, &w));
    json_free(&j);
}

static void refusals(TestStats* st) {
    char deep[64] = "";
    for (int i = 0; i < JSON_MAX_DEPTH + 1; i++) strcat(deep, "[");
    check_true(st, "json_refuses_duplicate_key", !parses("{\"a\": 1, \"a\": 2}") && parses("{\"a\": 1, \"b\": {\"a\": 2}}"));
    check_true(st, "json_refuses_deep_nesting", !parses(deep));
    check_true(st, "json_refuses_trailing_text", !parses("{\"a\": 1} x") && parses("{\"a\": 1}\n"));
    check_true(st, "json_refuses_malformed_numbers", !parses("[01]") && !parses("[1.]") && !parses("[1e]") && !parses("[+1]") && !parses("[0x10]"));
    check_true(st, "json_refuses_unterminated", !parses("{\"a\": \"x") && !parses("{\"a\": 1") && !parses(""));
    check_true(st, "json_refuses_raw_control", !parses("[\"a\tb\"]") && !parses("{a: 1}"));
}

int main(void) {
    TestStats st = {0};
    lookups(&st);
    refusals(&st);
    return test_exit(&st);
}
