// json.c: see json.h. A recursive-descent parser; values go into one growing table in document order.
#include "core/util/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

typedef struct {
    Json* j;
    const char* start;
    const char* p;
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
    snprintf(ps->why, ps->why_size, "%s at byte %td", msg, ps->p - ps->start);
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
    j->values[j->count] = (JsonValue){.parent = parent, .type = type, .key = key, .string = NULL, .text = ps->p};
    return j->count++;
}

static void put_utf8(char* out, size_t* n, unsigned cp) {
    if (cp < 0x80) out[(*n)++] = (char)cp;
    else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | cp >> 6);
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xE0 | cp >> 12);
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

// The string at ps->p (its opening quote), decoded into a malloc'ed buffer; NULL on a malformed one.
static char* parse_string(Parser* ps) {
    const char* s = ++ps->p;
    char* out = (char*)xmalloc(strlen(s) + 1);   // decoding never grows a string
    size_t n = 0;
    for (; *s != '"'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20) break;   // the end of the text, or a raw control character
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        const char* plain = strchr("\"\\/bfnrt", *++s);
        if (*s && plain) {
            out[n++] = "\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
        } else if (*s == 'u' && strspn(s + 1, "0123456789abcdefABCDEF") >= 4) {
            char hex[5] = {s[1], s[2], s[3], s[4], 0};
            put_utf8(out, &n, (unsigned)strtoul(hex, NULL, 16));
            s += 4;
        } else {
            break;
        }
    }
    ps->p = s;
    if (*s != '"') {
        free(out);
        refuse(ps, "malformed string");
        return NULL;
    }
    ps->p++;
    out[n] = '\0';
    return out;
}

static int parse_value(Parser* ps, int parent, char* key, int depth);

static int parse_members(Parser* ps, int self, int depth, int object) {
    char close = object ? '}' : ']';
    ps->p++;
    skip_space(ps);
    if (*ps->p == close) return ps->p++, 1;
    for (;;) {
        char* key = NULL;
        skip_space(ps);
        if (object) {
            if (*ps->p != '"') return refuse(ps, "expected a key");
            if (!(key = parse_string(ps))) return 0;
            if (json_find(ps->j, self, key) >= 0) {
                int ok = refuse(ps, "duplicate key \"%.60s\"", key);
                free(key);
                return ok;
            }
            skip_space(ps);
            if (*ps->p != ':') return free(key), refuse(ps, "expected ':'");
            ps->p++;
        }
        if (!parse_value(ps, self, key, depth + 1)) return 0;
        skip_space(ps);
        if (*ps->p == close) return ps->p++, 1;
        if (*ps->p != ',') return refuse(ps, "expected ',' or '%c'", close);
        ps->p++;
    }
}

static int parse_number(Parser* ps) {
    const char* s = ps->p;
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

// key: the value's key (owned by the table from here on), or NULL.
static int parse_value(Parser* ps, int parent, char* key, int depth) {
    skip_space(ps);
    if (depth > JSON_MAX_DEPTH) return free(key), refuse(ps, "nested deeper than %d", JSON_MAX_DEPTH);
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
    free(key);
    return c ? refuse(ps, "unexpected character '%c'", c) : refuse(ps, "unexpected end");
}

int json_parse(Json* j, const char* text, char* why, size_t why_size) {
    *j = (Json){0};
    size_t n = strlen(text) + 1;
    j->text = (char*)memcpy(xmalloc(n), text, n);
    Parser ps = {.j = j, .start = j->text, .p = j->text, .why = why, .why_size = why_size};
    if (!parse_value(&ps, -1, NULL, 0)) return 0;
    skip_space(&ps);
    return *ps.p == '\0' || refuse(&ps, "text after the value");
}

void json_free(Json* j) {
    for (int i = 0; i < j->count; i++) {
        free(j->values[i].key);
        free(j->values[i].string);
    }
    free(j->values);
    free(j->text);
    *j = (Json){0};
}

int json_find(const Json* j, int object, const char* key) {
    if (object < 0 || object >= j->count || j->values[object].type != JSON_OBJECT) return -1;
    for (int i = object + 1; i < j->count; i++)
        if (j->values[i].parent == object && !strcmp(j->values[i].key, key)) return i;
    return -1;
}

int json_get_int(const Json* j, int i, long long lo, long long hi, long long* out) {
    if (i < 0 || j->values[i].type != JSON_NUMBER) return 0;
    const char* s = j->values[i].text;
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || strchr(".eE", *end)) return 0;   // beyond long long, or not a whole number as written
    if (v < lo || v > hi) return 0;
    *out = v;
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
