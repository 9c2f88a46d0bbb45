// nfc.h: Unicode Normalization Form C (UAX #15), a tokenizer.json's "NFC" normalizer: canonical decomposition,
// canonical ordering by combining class, then canonical composition into primary composites (Hangul syllables
// by arithmetic). The tables come from Python's unicodedata (core/tokenizer/gen_unicode_tables.py writes
// nfc_tables.h), Unicode NFC_TABLES_VERSION: a character assigned after it is left as it is.
//
// A stable character is one of combining class 0 that NFC neither changes nor joins to what precedes it (its
// NFC_Quick_Check is Yes): ASCII, and most characters of every script. NFC of a text is NFC of the stretches
// between stable characters, each taken with the stable character before it, so runs of stable characters
// are copied as they are and only the stretches around the others are decomposed, reordered and composed.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t* text;   // the result: text[0, len)
    size_t len, cap;
    uint32_t* seg;   // one stretch's code points, each with its combining class in bits 24..31
    uint32_t* tmp;   // room to reorder a long run of marks
    size_t seg_cap;
} Nfc;

// Where the first character of s[0, n) that is not stable begins; n when s is in NFC as it is. s is valid
// UTF-8 (as every function here assumes).
size_t nfc_quick_check(const uint8_t* s, size_t n);
// s[0, n) in NFC into z->text[0, z->len), reusing z's buffers (z zeroed before its first use).
void nfc_normalize(Nfc* z, const uint8_t* s, size_t n);
void nfc_free(Nfc* z);
