// nfc.c: Unicode Normalization Form C; see nfc.h.
#include "core/tokenizer/nfc.h"

#include <string.h>

#include "base/common.h"
#include "core/tokenizer/nfc_tables.h"
#include "core/util/utf8.h"

// The Hangul syllables: S = S_BASE + (L * V_COUNT + V) * T_COUNT + T over the jamo's indices, T = 0 for none.
enum {
    S_BASE = 0xAC00,
    L_BASE = 0x1100,
    V_BASE = 0x1161,
    T_BASE = 0x11A7,
    L_COUNT = 19,
    V_COUNT = 21,
    T_COUNT = 28,
    N_COUNT = V_COUNT * T_COUNT,
    S_COUNT = L_COUNT * N_COUNT,
};
#define CP_MASK 0xFFFFFFu   // a segment entry's code point; its combining class is above
#define SORT_SHORT 16   // runs of marks up to this long are sorted in place; longer ones by counting

static inline unsigned prop(uint32_t c) {
    if (c >= NFC_LIMIT) return 0;
    return NFC_PROP[(unsigned)NFC_BLOCK[c >> NFC_BLOCK_SHIFT] << NFC_BLOCK_SHIFT | (c & ((1u << NFC_BLOCK_SHIFT) - 1))];
}

static unsigned combining_class(uint32_t c) {
    unsigned p = prop(c);
    return p == NFC_UNSTABLE ? 0 : p;
}

// ---------- finding what needs work ----------

// The end of the run of stable characters at s[i]; *last gets where the run's last character begins.
static size_t stable_end(const uint8_t* s, size_t i, size_t n, size_t* last) {
    while (i < n) {
        uint64_t w;
        if (i + 8 <= n && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) {
            i += 8;
            *last = i - 1;
            continue;
        }
        if (s[i] < 0x80) {
            *last = i++;
            continue;
        }
        int len;
        if (prop(utf8_decode(s + i, &len))) return i;
        *last = i;
        i += (size_t)len;
    }
    return n;
}

size_t nfc_quick_check(const uint8_t* s, size_t n) {
    size_t last = 0;
    return stable_end(s, 0, n, &last);
}

// Where the next stable character after the one at s[i] begins, or n.
static size_t unstable_end(const uint8_t* s, size_t i, size_t n) {
    int len;
    utf8_decode(s + i, &len);
    for (i += (size_t)len; i < n; i += (size_t)len)
        if (s[i] < 0x80 || !prop(utf8_decode(s + i, &len))) break;
    return i;
}

// ---------- one stretch: decompose, reorder, compose ----------

static const unsigned* decomposition(uint32_t c, size_t* k) {
    uint32_t block = c >> NFC_BLOCK_SHIFT;
    if (c >= NFC_LIMIT || !(NFC_DECOMP_BLOCKS[block / 32] >> block % 32 & 1)) return NULL;   // most text
    size_t lo = 0, hi = sizeof NFC_DECOMP_KEY / sizeof NFC_DECOMP_KEY[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (NFC_DECOMP_KEY[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == sizeof NFC_DECOMP_KEY / sizeof NFC_DECOMP_KEY[0] || NFC_DECOMP_KEY[lo] != c) return NULL;
    *k = NFC_DECOMP_AT[lo + 1] - NFC_DECOMP_AT[lo];
    return NFC_DECOMP_CP + NFC_DECOMP_AT[lo];
}

static size_t push(uint32_t* seg, size_t m, uint32_t c) {
    seg[m] = combining_class(c) << 24 | c;
    return m + 1;
}

// s[0, n)'s full canonical decomposition into z->seg; returns its length.
static size_t decompose(Nfc* z, const uint8_t* s, size_t n) {
    if (n * NFC_MAX_DECOMPOSITION > z->seg_cap) {   // n bytes hold at most n characters
        z->seg_cap = 2 * n * NFC_MAX_DECOMPOSITION;
        z->seg = xrealloc(z->seg, z->seg_cap * sizeof *z->seg);
        z->tmp = xrealloc(z->tmp, z->seg_cap * sizeof *z->tmp);
    }
    size_t m = 0, k = 0;
    for (size_t i = 0; i < n;) {
        int len;
        uint32_t c = utf8_decode(s + i, &len), x = c - S_BASE;
        const unsigned* d;
        i += (size_t)len;
        if (x < S_COUNT) {
            m = push(z->seg, m, L_BASE + x / N_COUNT);
            m = push(z->seg, m, V_BASE + x % N_COUNT / T_COUNT);
            if (x % T_COUNT) m = push(z->seg, m, T_BASE + x % T_COUNT);
        } else if ((d = decomposition(c, &k))) {
            for (size_t j = 0; j < k; j++) m = push(z->seg, m, d[j]);
        } else {
            m = push(z->seg, m, c);
        }
    }
    return m;
}

// Sorts a run of marks by combining class, keeping the order of equal classes.
static void sort_run(uint32_t* v, size_t n, uint32_t* tmp) {
    if (n <= SORT_SHORT) {
        for (size_t i = 1; i < n; i++) {
            uint32_t x = v[i];
            size_t j = i;
            for (; j > 0 && v[j - 1] >> 24 > x >> 24; j--) v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    size_t at[257] = {0};   // a counting sort: linear however long and disordered the run
    for (size_t i = 0; i < n; i++) at[(v[i] >> 24) + 1]++;
    for (int c = 1; c <= 256; c++) at[c] += at[c - 1];
    for (size_t i = 0; i < n; i++) tmp[at[v[i] >> 24]++] = v[i];
    memcpy(v, tmp, n * sizeof *v);
}

static void reorder(Nfc* z, size_t m) {
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && z->seg[j] >> 24) j++;
        sort_run(z->seg + i, j - i, z->tmp);
        i = j + 1;
    }
}

// The primary composite of a then b, or 0.
static uint32_t composite(uint32_t a, uint32_t b) {
    if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT) return S_BASE + ((a - L_BASE) * V_COUNT + b - V_BASE) * T_COUNT;
    if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1) return a + b - T_BASE;
    const uint32_t mask = (1u << NFC_PAIR_BITS) - 1;
    for (uint32_t i = (a * 0x9E3779B1u + b * 0x85EBCA77u) >> (32 - NFC_PAIR_BITS);; i = (i + 1) & mask) {
        unsigned k = NFC_PAIR_SLOTS[i];
        if (!k) return 0;
        const NfcPair* p = &NFC_PAIRS[k - 1];
        if (p->first == a && p->second == b) return p->composite;
    }
}

// In place; returns the new length. A character joins the last starter when they make a primary composite
// and nothing between them blocks it: a starter, or a mark of the same or a higher class.
static size_t compose(uint32_t* v, size_t m) {
    size_t starter = 0, k = 1;
    unsigned last = v[0] >> 24 ? 256 : 0;   // the class of the last character kept; 256: no starter yet
    for (size_t i = 1; i < m; i++) {
        unsigned cc = v[i] >> 24;
        uint32_t c = (last == 0 || last < cc) ? composite(v[starter], v[i] & CP_MASK) : 0;
        if (c) {
            v[starter] = c;
            continue;
        }   // a composite's class is 0
        if (!cc) starter = k;
        last = cc;
        v[k++] = v[i];
    }
    return k;
}

static void reserve(Nfc* z, size_t extra) {
    if (z->len + extra <= z->cap) return;
    z->cap = 2 * (z->len + extra);
    z->text = xrealloc(z->text, z->cap);
}

static void normalize_stretch(Nfc* z, const uint8_t* s, size_t n) {
    size_t m = decompose(z, s, n);
    reorder(z, m);
    m = compose(z->seg, m);
    reserve(z, 4 * m);
    for (size_t i = 0; i < m; i++) z->len += (size_t)utf8_encode(z->seg[i] & CP_MASK, z->text + z->len);
}

// ---------- the text ----------

void nfc_normalize(Nfc* z, const uint8_t* s, size_t n) {
    z->len = 0;
    size_t last = 0;   // where the last stable character begins: the stretch after it starts there
    for (size_t i = 0; i < n;) {
        size_t k = stable_end(s, i, n, &last);
        if (k > i) {   // an empty run may find no buffer yet
            reserve(z, k - i);
            memcpy(z->text + z->len, s + i, k - i);
            z->len += k - i;
        }
        if (k == n) break;
        size_t end = unstable_end(s, k, n);
        z->len -= k - last;   // that stable character is copied again, in its stretch's normal form
        normalize_stretch(z, s + last, end - last);
        i = end;
    }
}

void nfc_free(Nfc* z) {
    free(z->text);
    free(z->seg);
    free(z->tmp);
    memset(z, 0, sizeof *z);
}
