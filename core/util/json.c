// json.c: see json.h. A recursive-descent parser; values go into one growing table in document order, and
// strings are decoded where they stand in the parser's copy of the text (decoding never lengthens one), so
// a large file costs no allocation per string.
#include "core/util/json.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/util/utf8.h"

typedef struct {
    Json* j;
    const char* start;
    char* p;
    char* why;
    size_t why_size;
} Parser;

static int refuse(Parser* ps, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(Parser* ps, const char* fmt, ...) {
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(ps->why, ps->why_size, "%s at byte %td%s", msg, ps->p - ps->start, *ps->p ? "" : ", where the text ends");
    return 0;
}

static void skip_space(Parser* ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static int add_value(Parser* ps, int parent, JsonType type, char* key) {
    Json* j = ps->j;
    if (j->count == j->cap) {
        j->cap = j->cap ? 2 * j->cap : 32;
        JsonValue* grown = (JsonValue*)realloc(j->values, (size_t)j->cap * sizeof(JsonValue));
        if (!grown) fail("out of host memory parsing JSON");
        j->values = grown;
    }
    j->values[j->count] = (JsonValue){.parent = parent, .next = -1, .type = type, .key = key, .string = NULL, .text = ps->p};
    return j->count++;
}

static int hex4(const char* s, unsigned* out) {
    if (strspn(s, "0123456789abcdefABCDEF") < 4) return 0;
    char hex[5] = {s[0], s[1], s[2], s[3], 0};
    *out = (unsigned)strtoul(hex, NULL, 16);
    return 1;
}

// The \u escape at s (its backslash), joined with the low half that must follow a high surrogate; *len gets
// the escape's length in the text. 0 on a malformed or lone one, a surrogate half alone, or \u0000.
static uint32_t unicode_escape(const char* s, int* len) {
    unsigned hi, lo;
    if (!hex4(s + 2, &hi) || hi == 0 || (hi >= 0xDC00 && hi <= 0xDFFF)) return 0;
    *len = 6;
    if (hi < 0xD800 || hi > 0xDBFF) return hi;
    if (s[6] != '\\' || s[7] != 'u' || !hex4(s + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 0;
    *len = 12;
    return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
}

// The string at ps->p (its opening quote), decoded in place and NUL-terminated; NULL on a malformed one.
static char* parse_string(Parser* ps) {
    char *s = ++ps->p, *out = s, *dst = s;
    for (; *s != '"'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20) break;   // the end of the text, or a raw control character
        if (c != '\\') {
            *dst++ = (char)c;
            continue;
        }
        const char* plain = s[1] ? strchr("\"\\/bfnrt", s[1]) : NULL;
        int len = 0;
        uint32_t cp;
        if (plain) {
            *dst++ = "\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
            s++;
        } else if (s[1] == 'u' && (cp = unicode_escape(s, &len))) {
            dst += utf8_encode(cp, (uint8_t*)dst);
            s += len - 1;
        } else {
            ps->p = s;
            refuse(ps, s[1] == 'u' ? "a \\u escape that is malformed, \\u0000 or half a surrogate pair" : "malformed escape");
            return NULL;
        }
    }
    ps->p = s;
    if (*s != '"') {
        refuse(ps, "malformed string");
        return NULL;
    }
    ps->p++;
    *dst = '\0';   // at or before the closing quote, which the parser has passed
    return out;
}

static int parse_value(Parser* ps, int parent, char* key, int depth);

static int parse_members(Parser* ps, int self, int depth, int object) {
    char close = object ? '}' : ']';
    ps->p++;
    skip_space(ps);
    if (*ps->p == close) return ps->p++, 1;
    for (int last = -1;;) {
        char* key = NULL;
        skip_space(ps);
        if (object) {
            if (*ps->p != '"') return refuse(ps, "expected a key");
            if (!(key = parse_string(ps))) return 0;
            skip_space(ps);
            if (*ps->p != ':') return refuse(ps, "expected ':'");
            ps->p++;
        }
        int member = ps->j->count;
        if (!parse_value(ps, self, key, depth + 1)) return 0;
        if (last >= 0) ps->j->values[last].next = member;
        last = member;
        skip_space(ps);
        if (*ps->p == close) return ps->p++, 1;
        if (*ps->p != ',') return refuse(ps, "expected ',' or '%c'", close);
        ps->p++;
    }
}

static int parse_number(Parser* ps) {
    char* s = ps->p;
    s += *s == '-';
    size_t digits = strspn(s, "0123456789");
    if (!digits || (s[0] == '0' && digits > 1)) return refuse(ps, "malformed number");
    s += digits;
    if (*s == '.') {
        if (!(digits = strspn(++s, "0123456789"))) return refuse(ps, "malformed number");
        s += digits;
    }
    if (*s == 'e' || *s == 'E') {
        s += 1 + (s[1] == '+' || s[1] == '-');
        if (!(digits = strspn(s, "0123456789"))) return refuse(ps, "malformed number");
        s += digits;
    }
    ps->p = s;
    return 1;
}

// key: the value's key (decoded in the text), or NULL.
static int parse_value(Parser* ps, int parent, char* key, int depth) {
    skip_space(ps);
    if (depth > JSON_MAX_DEPTH) return refuse(ps, "nested deeper than %d", JSON_MAX_DEPTH);
    static const struct { const char* word; JsonType type; } words[] = {{"true", JSON_TRUE}, {"false", JSON_FALSE}, {"null", JSON_NULL}};
    char c = *ps->p;
    if (c == '{' || c == '[') return parse_members(ps, add_value(ps, parent, c == '{' ? JSON_OBJECT : JSON_ARRAY, key), depth, c == '{');
    if (c == '"') {
        int i = add_value(ps, parent, JSON_STRING, key);
        return (ps->j->values[i].string = parse_string(ps)) != NULL;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return add_value(ps, parent, JSON_NUMBER, key), parse_number(ps);
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++) {
        size_t len = strlen(words[w].word);
        if (!strncmp(ps->p, words[w].word, len)) {
            add_value(ps, parent, words[w].type, key);
            ps->p += len;
            return 1;
        }
    }
    return c ? refuse(ps, "unexpected character '%c'", c) : refuse(ps, "expected a value");
}

// An object with two members of one name: one pass over every key through a hash table, so that an
// object of 100,000 members costs no more than 100,000 lookups.
static int refuse_duplicate_keys(Parser* ps) {
    const Json* j = ps->j;
    size_t cap = 16;
    while (cap < 2 * (size_t)j->count) cap *= 2;
    int* slot = (int*)xmalloc(cap * sizeof(int));
    memset(slot, 0xff, cap * sizeof(int));   // -1: empty
    int ok = 1;
    for (int i = 1; i < j->count && ok; i++) {
        const JsonValue* v = &j->values[i];
        if (!v->key) continue;
        size_t k = fnv1a(FNV1A_START ^ (uint64_t)v->parent, v->key, strlen(v->key)) & (cap - 1);
        for (; slot[k] >= 0 && ok; k = (k + 1) & (cap - 1)) {
            const JsonValue* w = &j->values[slot[k]];
            if (w->parent == v->parent && !strcmp(w->key, v->key)) {
                ps->p = (char*)v->text;
                ok = refuse(ps, "duplicate key \"%.60s\"", v->key);
            }
        }
        slot[k] = i;
    }
    free(slot);
    return ok;
}

int json_parse_buffer(Json* j, char* text, char* why, size_t why_size) {
    *j = (Json){0};
    j->text = text;
    Parser ps = {.j = j, .start = text, .p = text, .why = why, .why_size = why_size};
    size_t len = strlen(text), bad = utf8_invalid_at((const uint8_t*)text, len);
    if (bad != len) return ps.p = text + bad, refuse(&ps, "not valid UTF-8");
    if (!parse_value(&ps, -1, NULL, 0)) return 0;
    skip_space(&ps);
    if (*ps.p != '\0') return refuse(&ps, "text after the value");
    return refuse_duplicate_keys(&ps);
}

int json_parse(Json* j, const char* text, char* why, size_t why_size) {
    size_t n = strlen(text) + 1;
    return json_parse_buffer(j, (char*)memcpy(xmalloc(n), text, n), why, why_size);
}

void json_free(Json* j) {
    free(j->values);
    free(j->text);
    *j = (Json){0};
}

int json_first(const Json* j, int i) {
    if (i < 0 || i + 1 >= j->count || j->values[i + 1].parent != i) return -1;
    return i + 1;
}

int json_next(const Json* j, int i) { return i < 0 ? -1 : j->values[i].next; }

size_t json_offset(const Json* j, int i) { return (size_t)(j->values[i].text - j->text); }

int json_find(const Json* j, int object, const char* key) {
    if (object < 0 || object >= j->count || j->values[object].type != JSON_OBJECT) return -1;
    for (int i = json_first(j, object); i >= 0; i = j->values[i].next)
        if (!strcmp(j->values[i].key, key)) return i;
    return -1;
}

// By hand, not strtoll: a tokenizer.json has hundreds of thousands of ids, and strtoll's locale costs.
int json_get_int(const Json* j, int i, long long lo, long long hi, long long* out) {
    if (i < 0 || j->values[i].type != JSON_NUMBER) return 0;
    const char* s = j->values[i].text;
    int negative = *s == '-';
    unsigned long long v = 0, limit = negative ? (unsigned long long)LLONG_MAX + 1 : LLONG_MAX;
    for (s += negative; *s >= '0' && *s <= '9'; s++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (unsigned long long)(*s - '0'), &v) || v > limit)
            return 0;   // beyond long long
    if (*s == '.' || *s == 'e' || *s == 'E') return 0;   // not a whole number as written
    long long x = negative ? (long long)(0 - v) : (long long)v;
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

int json_get_number(const Json* j, int i, double* out) {
    if (i < 0 || j->values[i].type != JSON_NUMBER) return 0;
    double v = strtod(j->values[i].text, NULL);
    if (!isfinite(v)) return 0;
    *out = v;
    return 1;
}

const char* json_get_string(const Json* j, int i) { return i >= 0 && j->values[i].type == JSON_STRING ? j->values[i].string : NULL; }
