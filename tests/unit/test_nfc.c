// test_nfc.c: core/tokenizer/nfc.c, Unicode Normalization Form C.
//   build/test_nfc          cases whose answers follow from the standard: composition of decomposed accents,
//                           singletons, composition exclusions, non-starter decompositions, marks in
//                           non-canonical order, blocking, Hangul jamo and syllables, a long run of marks, and
//                           the quick check
//   build/test_nfc FILE     also every case of FILE, one per line: the input's code points, a tab, Python's
//                           unicodedata.normalize('NFC', ...) of them, each as hex separated by spaces
//                           (tests/tools/nfc_cases.py writes every code point alone and random sequences)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/tokenizer/nfc.h"
#include "core/util/utf8.h"
#include "tests/unit/testlib.h"

#define MAX_CPS 4096

static size_t to_utf8(const uint32_t *cp, size_t n, uint8_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)utf8_encode(cp[i], out + k);
    return k;
}

// NFC of in[0, n) equals want[0, m), and the quick check passes the input only when it is unchanged.
static int nfc_is(Nfc *z, const uint32_t *in, size_t n, const uint32_t *want, size_t m) {
    uint8_t a[4 * MAX_CPS], b[4 * MAX_CPS];
    size_t na = to_utf8(in, n, a), nb = to_utf8(want, m, b);
    nfc_normalize(z, a, na);
    int same = z->len == nb && !memcmp(z->text, b, nb);
    int quick_ok = nfc_quick_check(a, na) < na || (na == nb && !memcmp(a, b, nb));
    return same && quick_ok;
}

#define CPS(...) (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t)

static void known_cases(TestStats *st, Nfc *z) {
    check_true(st, "nfc_composes_e_acute", nfc_is(z, CPS('e', 0x301), CPS(0xE9)));
    check_true(st, "nfc_keeps_precomposed", nfc_is(z, CPS('x', 0xE9, 'y'), CPS('x', 0xE9, 'y')));
    check_true(st, "nfc_singleton_angstrom", nfc_is(z, CPS(0x212B), CPS(0xC5)));
    check_true(st, "nfc_singleton_ohm", nfc_is(z, CPS(0x2126), CPS(0x3A9)));
    check_true(st, "nfc_exclusion_devanagari_qa", nfc_is(z, CPS(0x958), CPS(0x915, 0x93C)));
    check_true(st, "nfc_exclusion_not_recomposed", nfc_is(z, CPS(0x915, 0x93C), CPS(0x915, 0x93C)));
    check_true(st, "nfc_non_starter_decomposition", nfc_is(z, CPS(0x344), CPS(0x308, 0x301)));
    check_true(st, "nfc_tibetan_vowel", nfc_is(z, CPS(0xF73), CPS(0xF71, 0xF72)));
    // a + circumflex (230) + dot below (220): reordered to dot below first, then both compose.
    check_true(st, "nfc_reorders_marks", nfc_is(z, CPS('a', 0x302, 0x323), CPS(0x1EAD)));
    check_true(st, "nfc_recomposes_after_reorder", nfc_is(z, CPS(0x1EA1, 0x302), CPS(0x1EAD)));
    check_true(st, "nfc_same_class_blocks", nfc_is(z, CPS('a', 0x301, 0x301), CPS(0xE1, 0x301)));
    check_true(st, "nfc_starter_blocks", nfc_is(z, CPS('a', 'b', 0x301), CPS('a', 'b', 0x301)));
    check_true(st, "nfc_composes_past_lower_class", nfc_is(z, CPS('a', 0x316, 0x301), CPS(0xE1, 0x316)));
    check_true(st, "nfc_not_greater_than", nfc_is(z, CPS('<', 0x338, '>', 0x338), CPS(0x226E, 0x226F)));
    check_true(st, "nfc_hangul_lv", nfc_is(z, CPS(0x1100, 0x1161), CPS(0xAC00)));
    check_true(st, "nfc_hangul_lvt", nfc_is(z, CPS(0x1100, 0x1161, 0x11A8), CPS(0xAC01)));
    check_true(st, "nfc_hangul_syllable_t", nfc_is(z, CPS(0xAC00, 0x11A8), CPS(0xAC01)));
    check_true(st, "nfc_hangul_lvt_stays", nfc_is(z, CPS(0xAC01, 0x11A8), CPS(0xAC01, 0x11A8)));
    check_true(st, "nfc_hangul_l_l_v", nfc_is(z, CPS(0x1100, 0x1100, 0x1161), CPS(0x1100, 0xAC00)));
    check_true(st, "nfc_hangul_lone_v", nfc_is(z, CPS(0x1161, 0x11A8), CPS(0x1161, 0x11A8)));
    check_true(st, "nfc_leading_mark", nfc_is(z, CPS(0x301, 'e', 0x301), CPS(0x301, 0xE9)));
    check_true(st, "nfc_empty", (nfc_normalize(z, (const uint8_t *)"", 0), z->len == 0));
    // 'a' then 500 pairs of acute (230) and grave below (220): all grave-belows first, then the acutes, the
    // first of which composes with the 'a' (past the lower class); the rest stay.
    uint32_t in[1 + 1000], want[1 + 1000];
    in[0] = 'a';
    want[0] = 0xE1;
    for (int i = 0; i < 500; i++) {
        in[1 + 2 * i] = 0x301;
        in[2 + 2 * i] = 0x316;
        want[1 + i] = 0x316;
        if (i < 499) want[501 + i] = 0x301;
    }
    check_true(st, "nfc_long_run_of_marks", nfc_is(z, in, 1001, want, 1000));
    const char *quick = "plain ASCII text, \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xea\xb0\x80";
    check_true(st, "nfc_quick_check_passes_stable_text", nfc_quick_check((const uint8_t *)quick, strlen(quick)) == strlen(quick));
    check_true(st, "nfc_quick_check_stops_at_mark", nfc_quick_check((const uint8_t *)"abcdefghie\xcc\x81", 12) == 10);
}

// One line of cases: "HEX HEX...\tHEX HEX...\n" into in/want; 0 on a malformed line.
static int parse_case(char *line, uint32_t *in, size_t *n, uint32_t *want, size_t *m) {
    char *tab = strchr(line, '\t');
    if (!tab) return 0;
    *tab = 0;
    char *parts[2] = {line, tab + 1};
    uint32_t *outs[2] = {in, want};
    size_t *counts[2] = {n, m};
    for (int k = 0; k < 2; k++) {
        *counts[k] = 0;
        for (char *p = parts[k], *end; *p && *p != '\n'; p = end) {
            unsigned long v = strtoul(p, &end, 16);
            if (end == p || v > 0x10FFFF || *counts[k] == MAX_CPS) return 0;
            outs[k][(*counts[k])++] = (uint32_t)v;
            while (*end == ' ') end++;
        }
    }
    return *n > 0;
}

static void file_cases(TestStats *st, Nfc *z, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) fail("%s: cannot open", path);
    size_t line_size = 16 * MAX_CPS, n, m, cases = 0, wrong = 0;
    char *line = xmalloc(line_size);
    uint32_t *in = xmalloc(MAX_CPS * sizeof *in), *want = xmalloc(MAX_CPS * sizeof *want);
    while (fgets(line, (int)line_size, f)) {
        if (!parse_case(line, in, &n, want, &m)) fail("%s: malformed line %zu", path, cases + 1);
        cases++;
        if (nfc_is(z, in, n, want, m)) continue;
        if (wrong++ < 5) printf("# case %zu: U+%04X... (%zu code points) normalizes otherwise\n", cases, in[0], n);
    }
    if (ferror(f) || fclose(f) != 0) fail("%s: read error", path);
    free(line);
    free(in);
    free(want);
    printf("# %zu cases from %s, %zu wrong\n", cases, path, wrong);
    check_true(st, "nfc_matches_python_unicodedata", cases > 0 && wrong == 0);
}

int main(int argc, char **argv) {
    TestStats st = {0, 0};
    Nfc z = {0};
    known_cases(&st, &z);
    if (argc > 1) file_cases(&st, &z, argv[1]);
    nfc_free(&z);
    return test_exit(&st);
}
