// utf8.h: strict UTF-8 checking and decoding, shared by the JSON reader and the tokenizer's hot loop (hence
// inline). Strict: no overlong forms, no surrogates, nothing above U+10FFFF.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Offset of the first byte that does not begin a valid character, or len when all of s is valid.
static inline size_t utf8_invalid_at(const uint8_t* s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint64_t w;
        if (i + 8 <= len && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) { i += 8; continue; }   // ASCII
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        if (c < 0xC2 || c > 0xF4 || i + (size_t)n >= len) return i;
        uint32_t cp = c & (0x3F >> n);
        for (int k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += (size_t)n + 1;
    }
    return len;
}

// The (already validated) character at s; *n gets its byte length.
static inline uint32_t utf8_decode(const uint8_t* s, int* n) {
    uint8_t c = s[0];
    if (c < 0x80) { *n = 1; return c; }
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = c & (0x3F >> k);
    for (int i = 1; i <= k; i++) cp = cp << 6 | (s[i] & 0x3F);
    *n = k + 1;
    return cp;
}

// Writes code point cp (at most U+10FFFF) at out; returns its byte length.
static inline int utf8_encode(uint32_t cp, uint8_t* out) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xC0 | cp >> 6); out[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12); out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18); out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}
