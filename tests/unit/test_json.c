// test_json.c: core/util/json.c, the reader of the files the trainer reads back (checkpoint manifests, DONE)
// and of tokenizer.json: lookups by key whatever the order and spacing, the value types and their ranges,
// decoded strings (surrogate pairs joined), walking members in order, and the refusals (duplicate keys in
// small and large objects, deep nesting, malformed values, bad escapes, text that is not UTF-8, text after
// the value) with the byte offset of the problem.
#include <limits.h>
#include <stdlib.h>
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
    Json big;
    long long lim = 0;
    check_true(st, "json_int_limits", json_parse(&big, "[-9223372036854775808, 9223372036854775807, 9223372036854775808]", why, sizeof(why)) &&
               json_get_int(&big, json_first(&big, 0), LLONG_MIN, LLONG_MAX, &lim) && lim == LLONG_MIN &&
               json_get_int(&big, json_next(&big, json_first(&big, 0)), LLONG_MIN, LLONG_MAX, &lim) && lim == LLONG_MAX &&
               !json_get_int(&big, json_next(&big, json_next(&big, json_first(&big, 0))), LLONG_MIN, LLONG_MAX, &lim));
    json_free(&big);
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
    Json j;
    char why[160];
    int ok = json_parse(&j, "{\"a\": [1, ", why, sizeof(why));
    check_true(st, "json_truncated_says_where_the_text_ends", !ok && !strcmp(why, "expected a value at byte 10, where the text ends"));
    json_free(&j);
}

static void unicode(TestStats* st) {
    Json j;
    char why[160];
    int ok = json_parse(&j, "[\"\\ud83d\\ude00 \\u00e9\", \"\xc3\xa9\"]", why, sizeof(why));
    const char* pair = ok ? json_get_string(&j, json_first(&j, 0)) : NULL;
    const char* raw = ok ? json_get_string(&j, json_next(&j, json_first(&j, 0))) : NULL;
    check_true(st, "json_surrogate_pair_joined", pair && !strcmp(pair, "\xf0\x9f\x98\x80 \xc3\xa9"));
    check_true(st, "json_raw_utf8_kept", raw && !strcmp(raw, "\xc3\xa9"));
    json_free(&j);
    check_true(st, "json_refuses_lone_surrogates", !parses("[\"\\ud83d\"]") && !parses("[\"\\ude00\"]") && !parses("[\"\\ud83dx\"]"));
    check_true(st, "json_refuses_nul_escape", !parses("[\"a\\u0000\"]") && parses("[\"a\\u0001\"]"));
    ok = json_parse(&j, "[\"ok\", \"caf\xe9\"]", why, sizeof(why));
    check_true(st, "json_refuses_invalid_utf8_with_offset", !ok && strstr(why, "not valid UTF-8 at byte 11"));
    json_free(&j);
}

// Members come back in document order; a large object's duplicate is found, and named by its offset.
static void members(TestStats* st) {
    enum { N = 20000 };
    char* text = (char*)malloc(N * 24 + 64);
    size_t n = (size_t)sprintf(text, "{");
    for (int i = 0; i < N; i++) n += (size_t)sprintf(text + n, "%s\"k%d\": %d", i ? ", " : "", i, i);
    sprintf(text + n, "}");
    Json j;
    char why[160];
    int ok = json_parse(&j, text, why, sizeof(why)), seen = 0, in_order = ok;
    for (int i = json_first(&j, 0); i >= 0; i = json_next(&j, i), seen++) {
        long long v;
        in_order &= json_get_int(&j, i, 0, N, &v) && v == seen;
    }
    check_true(st, "json_members_in_order", ok && in_order && seen == N && json_find(&j, 0, "k19999") > 0);
    json_free(&j);
    size_t dup_at = n - strlen("\"k19999\": 19999");
    memcpy(text + dup_at, "\"k12345\"", 8);
    ok = json_parse(&j, text, why, sizeof(why));
    char want[64];
    snprintf(want, sizeof(want), "duplicate key \"k12345\" at byte %zu", dup_at + 10);
    check_true(st, "json_refuses_duplicate_in_large_object", !ok && strstr(why, want));
    json_free(&j);
    free(text);
}

int main(void) {
    TestStats st = {0};
    lookups(&st);
    refusals(&st);
    unicode(&st);
    members(&st);
    return test_exit(&st);
}
