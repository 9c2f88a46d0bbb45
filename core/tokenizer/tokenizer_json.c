// tokenizer_json.c: a Hugging Face tokenizer.json of the byte-level BPE kind into bpe.h's model.
//
// Accepted: what GPT-2's, Llama 3's, Qwen2's and Qwen3's files hold:
//   model           type "BPE"; vocab {token: id}; merges as "a b" strings or ["a", "b"] pairs; ignore_merges;
//                   dropout and unk_token null; continuing_subword_prefix and end_of_word_suffix null or "";
//                   fuse_unk (nothing to fuse without unk_token); byte_fallback false
//   pre_tokenizer   ByteLevel {use_regex true: GPT-2's pattern}, or a Sequence of Split {Regex: GPT-2's,
//                   Llama 3's or Qwen2's pattern, behavior Isolated, invert false} and ByteLevel {use_regex
//                   false}; add_prefix_space false in both
//   decoder         ByteLevel
//   post_processor  null, ByteLevel, TemplateProcessing, or a Sequence of them (read for the document start)
//   added_tokens    {id, content, special, normalized; lstrip, rstrip and single_word false}
//   normalizer      null, NFC, or a Sequence of NFC
//   truncation, padding: null
// Every id below the largest must be a token. Anything else ends in one "error: PATH: ..." line naming the
// key and its value: ignoring it would encode differently from Hugging Face tokenizers, without a word.
// The vocabulary's tokens are written in ByteLevel's alphabet (each byte as one printable character) and
// stored as the bytes they stand for; added tokens' contents are their own bytes.
#include "core/tokenizer/tokenizer_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/tokenizer/nfc.h"
#include "core/util/json.h"
#include "core/util/utf8.h"

// The Split regexes, as their files spell them (JSON escapes decoded).
static const struct {
    const char* regex;
    BpePattern pattern;
} PATTERNS[] = {
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", BPE_PATTERN_GPT2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     BPE_PATTERN_LLAMA3},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     BPE_PATTERN_QWEN2},
};

typedef struct {
    const Json* j;
    const char* path;
    int16_t byte_of[256 + 68];   // ByteLevel's character -> the byte it stands for; -1: not in the alphabet
} Doc;

static void refuse(const Doc* d, const char* fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void refuse(const Doc* d, const char* fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail("%s: %s", d->path, msg);
}

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves,
// the other 68, in byte order, for U+0100 onwards.
static void byte_level_alphabet(Doc* d) {
    memset(d->byte_of, 0xff, sizeof d->byte_of);
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        d->byte_of[printable ? b : 256 + extra++] = (int16_t)b;
    }
}

// The bytes a ByteLevel token s[0, len) stands for, into out (room for len); returns their count, or
// refuses naming `where`.
static size_t unmap(const Doc* d, const char* s, size_t len, uint8_t* out, const char* where) {
    size_t k = 0;
    for (const uint8_t* p = (const uint8_t*)s; p < (const uint8_t*)s + len;) {
        int n;
        uint32_t cp = utf8_decode(p, &n);
        if (cp >= sizeof d->byte_of / sizeof d->byte_of[0] || d->byte_of[cp] < 0)
            refuse(d, "%s \"%.80s\" holds U+%04X, which is not one of ByteLevel's 256 characters", where, s, cp);
        out[k++] = (uint8_t)d->byte_of[cp];
        p += n;
    }
    return k;
}

// ---------- small checks ----------

static const char* describe(const Doc* d, int i) {   // a value, for a message: its type name or kind
    static const char* KIND[] = {"an object", "an array", "a string", "a number", "true", "false", "null"};
    const char* type = json_get_string(d->j, json_find(d->j, i, "type"));
    return type ? type : KIND[d->j->values[i].type];
}

static int is_null(const Doc* d, int i) { return i < 0 || d->j->values[i].type == JSON_NULL; }

static void must_be_null(const Doc* d, int obj, const char* key, const char* where, const char* why) {
    int i = json_find(d->j, obj, key);
    if (!is_null(d, i))
        refuse(d, "%s%s%s is %s: not supported (%s)", where, *where ? "." : "", key, describe(d, i), why);
}

// A true/false member: its value, dflt when absent (-1: it must be there).
static int flag(const Doc* d, int obj, const char* key, int dflt, const char* where) {
    int i = json_find(d->j, obj, key);
    if (i < 0 && dflt >= 0) return dflt;
    JsonType t = i < 0 ? JSON_NULL : d->j->values[i].type;
    if (t != JSON_TRUE && t != JSON_FALSE) refuse(d, "%s.%s must be true or false", where, key);
    return t == JSON_TRUE;
}

static void want_flag(const Doc* d, int obj, const char* key, int dflt, int want, const char* where) {
    if (flag(d, obj, key, dflt, where) != want)
        refuse(d, "%s.%s %s is not supported", where, key, want ? "false" : "true");
}

// Every member of obj is one of keys (NULL-terminated): a key this reader does not know may change the encoding.
static void only_keys(const Doc* d, int obj, const char* where, const char* const* keys) {
    if (obj < 0 || d->j->values[obj].type != JSON_OBJECT) refuse(d, "%s must be an object", where);
    for (int i = json_first(d->j, obj); i >= 0; i = json_next(d->j, i)) {
        const char* const* k = keys;
        while (*k && strcmp(*k, d->j->values[i].key)) k++;
        if (!*k) refuse(d, "%s has the key \"%.60s\", which is not supported", where, d->j->values[i].key);
    }
}

static const char* type_of(const Doc* d, int obj, const char* where) {
    const char* t = json_get_string(d->j, json_find(d->j, obj, "type"));
    if (!t) refuse(d, "%s has no \"type\"", where);
    return t;
}

static int array_of(const Doc* d, int obj, const char* key, const char* where) {
    int i = json_find(d->j, obj, key);
    if (i < 0 || d->j->values[i].type != JSON_ARRAY) refuse(d, "%s.%s must be an array", where, key);
    return i;
}

static size_t count(const Doc* d, int container) {
    size_t n = 0;
    for (int i = json_first(d->j, container); i >= 0; i = json_next(d->j, i)) n++;
    return n;
}

// ---------- the settings that decide the encoding ----------

static void check_top(const Doc* d) {
    static const char* const KEYS[] = {"version",       "truncation",     "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model",        NULL};
    only_keys(d, 0, "the top level", KEYS);
    must_be_null(d, 0, "truncation", "", "it would cut the text");
    must_be_null(d, 0, "padding", "", "it would add tokens");
    int dec = json_find(d->j, 0, "decoder");
    if (is_null(d, dec) || strcmp(describe(d, dec), "ByteLevel"))
        refuse(d, "decoder is %s: not supported (only ByteLevel)", is_null(d, dec) ? "null" : describe(d, dec));
}

// NFC (1) or none (0): null, NFC, or a Sequence of NFC alone (NFC again changes nothing).
static int normalizer(const Doc* d) {
    static const char *const NFC_KEYS[] = {"type", NULL}, *const SEQUENCE_KEYS[] = {"type", "normalizers", NULL};
    int n = json_find(d->j, 0, "normalizer");
    if (is_null(d, n)) return 0;
    const char* type = type_of(d, n, "normalizer");
    if (!strcmp(type, "NFC")) {
        only_keys(d, n, "normalizer", NFC_KEYS);
        return 1;
    }
    if (strcmp(type, "Sequence"))
        refuse(d, "normalizer is %.40s: not supported (only NFC, or a Sequence of NFC)", type);
    only_keys(d, n, "normalizer", SEQUENCE_KEYS);
    int nfc = 0;
    size_t k = 0;
    for (int i = json_first(d->j, array_of(d, n, "normalizers", "normalizer")); i >= 0; i = json_next(d->j, i), k++) {
        char where[48];
        snprintf(where, sizeof where, "normalizer.normalizers[%zu]", k);
        const char* t = type_of(d, i, where);
        if (strcmp(t, "NFC")) refuse(d, "%s is %.40s: not supported (only NFC)", where, t);
        only_keys(d, i, where, NFC_KEYS);
        nfc = 1;
    }
    return nfc;
}

static void check_model(const Doc* d, BpeModel* m, int model) {
    static const char* const KEYS[] = {"type",
                                       "dropout",
                                       "unk_token",
                                       "continuing_subword_prefix",
                                       "end_of_word_suffix",
                                       "fuse_unk",
                                       "byte_fallback",
                                       "ignore_merges",
                                       "vocab",
                                       "merges",
                                       NULL};
    only_keys(d, model, "model", KEYS);
    const char* type = type_of(d, model, "model");
    if (strcmp(type, "BPE")) refuse(d, "model.type \"%.40s\" is not supported: only \"BPE\"", type);
    must_be_null(d, model, "dropout", "model", "it samples the merges");
    must_be_null(d, model, "unk_token", "model", "a byte-level vocabulary has no unknown bytes");
    static const char* const AFFIXES[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        int i = json_find(d->j, model, AFFIXES[k]);
        const char* s = json_get_string(d->j, i);
        if (!is_null(d, i) && (!s || *s)) refuse(d, "model.%s must be null or \"\"", AFFIXES[k]);
    }
    want_flag(d, model, "byte_fallback", 0, 0, "model");
    flag(d, model, "fuse_unk", 0, "model");
    m->ignore_merges = flag(d, model, "ignore_merges", 0, "model");
}

static void check_byte_level(const Doc* d, int obj, const char* where, int use_regex) {
    static const char* const KEYS[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    only_keys(d, obj, where, KEYS);
    want_flag(d, obj, "add_prefix_space", -1, 0, where);
    flag(d, obj, "trim_offsets", 0, where);   // offsets only
    want_flag(d, obj, "use_regex", 1, use_regex, where);
}

static BpePattern split_pattern(const Doc* d, int split) {
    static const char* const KEYS[] = {"type", "pattern", "behavior", "invert", NULL};
    const char* where = "pre_tokenizer.pretokenizers[0]";
    only_keys(d, split, where, KEYS);
    const char* behavior = json_get_string(d->j, json_find(d->j, split, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated")) refuse(d, "%s.behavior must be \"Isolated\"", where);
    want_flag(d, split, "invert", -1, 0, where);
    const char* regex = json_get_string(d->j, json_find(d->j, json_find(d->j, split, "pattern"), "Regex"));
    if (!regex) refuse(d, "%s.pattern must be {\"Regex\": ...}", where);
    for (size_t k = 0; k < sizeof PATTERNS / sizeof PATTERNS[0]; k++)
        if (!strcmp(regex, PATTERNS[k].regex)) return PATTERNS[k].pattern;
    refuse(d, "%s.pattern.Regex \"%.200s\" is not GPT-2's, Llama 3's or Qwen2's", where, regex);
}

static BpePattern pre_tokenizer(const Doc* d) {
    const char* kinds = "(ByteLevel, or a Sequence of Split and ByteLevel)";
    int pt = json_find(d->j, 0, "pre_tokenizer");
    if (is_null(d, pt)) refuse(d, "pre_tokenizer is null: not supported %s", kinds);
    const char* type = type_of(d, pt, "pre_tokenizer");
    if (!strcmp(type, "ByteLevel")) {
        check_byte_level(d, pt, "pre_tokenizer", 1);
        return BPE_PATTERN_GPT2;
    }
    if (strcmp(type, "Sequence")) refuse(d, "pre_tokenizer.type \"%.40s\" is not supported %s", type, kinds);
    static const char* const KEYS[] = {"type", "pretokenizers", NULL};
    only_keys(d, pt, "pre_tokenizer", KEYS);
    int list = array_of(d, pt, "pretokenizers", "pre_tokenizer");
    int split = json_first(d->j, list), byte_level = json_next(d->j, split);
    if (count(d, list) != 2 || strcmp(type_of(d, split, "pre_tokenizer.pretokenizers[0]"), "Split") ||
        strcmp(type_of(d, byte_level, "pre_tokenizer.pretokenizers[1]"), "ByteLevel"))
        refuse(d, "pre_tokenizer.pretokenizers must be [Split, ByteLevel]");
    check_byte_level(d, byte_level, "pre_tokenizer.pretokenizers[1]", 0);
    return split_pattern(d, split);
}

// ---------- the token table ----------

typedef struct {
    int vocab, added;
} Source;   // a token's vocab member and added token (-1: none)

static uint32_t vocab_id(const Doc* d, int i) {
    long long id;
    if (!json_get_int(d->j, i, 0, BPE_MAX_VOCAB - 1, &id))
        refuse(d, "model.vocab \"%.80s\" must have a whole-number id below 2^24", d->j->values[i].key);
    return (uint32_t)id;
}

static uint32_t added_id(const Doc* d, int t, size_t k) {
    static const char* const KEYS[] = {"id",     "content",    "single_word", "lstrip",
                                       "rstrip", "normalized", "special",     NULL};
    char where[48];
    snprintf(where, sizeof where, "added_tokens[%zu]", k);
    only_keys(d, t, where, KEYS);
    long long id;
    const char* content = json_get_string(d->j, json_find(d->j, t, "content"));
    if (!json_get_int(d->j, json_find(d->j, t, "id"), 0, BPE_MAX_VOCAB - 1, &id) || !content || !*content)
        refuse(d, "%s needs a whole-number id below 2^24 and a non-empty content", where);
    static const char* const UNSUPPORTED[] = {"single_word", "lstrip", "rstrip"};
    for (int f = 0; f < 3; f++) want_flag(d, t, UNSUPPORTED[f], 0, 0, where);
    flag(d, t, "special", 0, where);
    flag(d, t, "normalized", -1, where);   // no default: Hugging Face's reader has none either
    return (uint32_t)id;
}

// Each id's source, for ids below *V (one more than the largest); every id must have one.
static Source* token_sources(const Doc* d, int vocab, int added, uint32_t* V) {
    uint32_t top = 0;
    size_t n = 0;
    for (int i = json_first(d->j, vocab); i >= 0; i = json_next(d->j, i), n++) {
        uint32_t id = vocab_id(d, i);
        top = id > top ? id : top;
    }
    size_t k = 0;
    for (int t = json_first(d->j, added); t >= 0; t = json_next(d->j, t), n++, k++) {
        uint32_t id = added_id(d, t, k);
        top = id > top ? id : top;
    }
    if (!n) refuse(d, "model.vocab is empty");
    if ((size_t)top >= n) refuse(d, "ids reach %u, but there are only %zu tokens: some id below it has none", top, n);
    *V = top + 1;
    Source* src = xmalloc(*V * sizeof *src);
    memset(src, 0xff, *V * sizeof *src);
    for (int i = json_first(d->j, vocab); i >= 0; i = json_next(d->j, i)) {
        Source* s = &src[vocab_id(d, i)];
        if (s->vocab >= 0)
            refuse(d, "model.vocab gives the id %u to \"%.60s\" and to \"%.60s\"", vocab_id(d, i),
                   d->j->values[s->vocab].key, d->j->values[i].key);
        s->vocab = i;
    }
    k = 0;
    for (int t = json_first(d->j, added); t >= 0; t = json_next(d->j, t), k++) {
        Source* s = &src[added_id(d, t, k)];
        if (s->added >= 0) refuse(d, "added_tokens[%zu] repeats the id %u", k, added_id(d, t, k));
        s->added = t;
    }
    for (uint32_t id = 0; id < *V; id++)
        if (src[id].vocab < 0 && src[id].added < 0)
            refuse(d, "no token has the id %u (ids must run from 0 without a gap)", id);
    return src;
}

static const char* added_content(const Doc* d, int t) { return json_get_string(d->j, json_find(d->j, t, "content")); }

// One token's bytes at out: the vocabulary's (unmapped), which an added token of the same id must repeat.
static size_t token_bytes(const Doc* d, Source s, uint32_t id, uint8_t* out) {
    const char* content = s.added >= 0 ? added_content(d, s.added) : NULL;
    if (s.vocab < 0) {
        memcpy(out, content, strlen(content));
        return strlen(content);
    }
    const char* key = d->j->values[s.vocab].key;
    size_t n = unmap(d, key, strlen(key), out, "model.vocab");
    if (content && (strlen(content) != n || memcmp(content, out, n)))
        refuse(d, "added token \"%.60s\" has the id %u of model.vocab's \"%.60s\", another token", content, id, key);
    return n;
}

static int is_normalized(const Doc* d, int t) {
    return d->j->values[json_find(d->j, t, "normalized")].type == JSON_TRUE;
}

// The second pass matches normalized text: its tokens are matched by their contents in NFC.
static void normalize_contents(BpeModel* m) {
    BpeAddedSet* s = &m->added_normalized;
    Nfc z = {0};
    size_t total = 0, at = 0;
    for (uint32_t k = 0; k < s->n; k++, total += z.len) nfc_normalize(&z, s->v[k].bytes, s->v[k].len);
    m->normalized_bytes = xmalloc(total + 1);
    for (uint32_t k = 0; k < s->n; k++, at += z.len) {
        nfc_normalize(&z, s->v[k].bytes, s->v[k].len);
        memcpy(m->normalized_bytes + at, z.text, z.len);
        s->v[k].bytes = m->normalized_bytes + at;
        s->v[k].len = (uint32_t)z.len;
    }
    nfc_free(&z);
}

// Moves the added tokens with "normalized" true out of m->added into the second pass's set.
static void split_passes(const Doc* d, BpeModel* m, const Source* src) {
    BpeAddedSet *raw = &m->added, *norm = &m->added_normalized;
    norm->v = xmalloc((raw->n + 1) * sizeof *norm->v);
    uint32_t kept = 0;
    for (uint32_t k = 0; k < raw->n; k++) {
        if (is_normalized(d, src[raw->v[k].id].added))
            norm->v[norm->n++] = raw->v[k];
        else
            raw->v[kept++] = raw->v[k];
    }
    raw->n = kept;
    if (m->nfc) normalize_contents(m);
    if (!bpe_added_index(raw)) refuse(d, "added_tokens has two tokens of the same content");
    if (!bpe_added_index(norm))
        refuse(d, "added_tokens has two \"normalized\" tokens whose contents are the same in NFC");
}

static void token_table(const Doc* d, BpeModel* m, int vocab, int added) {
    Source* src = token_sources(d, vocab, added, &m->vocab_size);
    size_t total = 0;
    for (uint32_t id = 0; id < m->vocab_size; id++)
        total += strlen(src[id].vocab >= 0 ? d->j->values[src[id].vocab].key : added_content(d, src[id].added)) + 1;
    m->bytes = xmalloc(total);
    m->offset = xmalloc(((size_t)m->vocab_size + 1) * sizeof *m->offset);
    uint32_t at = 0;
    for (uint32_t id = 0; id < m->vocab_size; id++) {
        m->offset[id] = at;
        at += (uint32_t)token_bytes(d, src[id], id, m->bytes + at);
        m->bytes[at++] = 0;
    }
    m->offset[m->vocab_size] = at;
    bpe_vocab_reserve(m, m->vocab_size);
    m->added.v = xmalloc((count(d, added) + 1) * sizeof *m->added.v);
    for (uint32_t id = 0; id < m->vocab_size; id++) {
        size_t len;
        const uint8_t* p = bpe_token_bytes(m, id, &len);
        if (src[id].vocab >= 0 && !bpe_vocab_add(m, id)) refuse(d, "model.vocab has the bytes of token %u twice", id);
        if (src[id].added >= 0) m->added.v[m->added.n++] = (BpeAdded){p, (uint32_t)len, id};
    }
    if (!bpe_added_index(&m->added)) refuse(d, "added_tokens has two tokens of the same content");
    split_passes(d, m, src);
    free(src);
}

static void byte_ids(const Doc* d, BpeModel* m) {
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        int64_t id = bpe_vocab_find(m, &byte, 1);
        if (id < 0) refuse(d, "model.vocab has no token for the byte 0x%02X", b);
        m->byte_id[b] = (uint32_t)id;
    }
}

// ---------- merges ----------

// Merge i's two tokens: "a b" (one space) or ["a", "b"].
static void merge_pair(const Doc* d, int i, size_t rank, const char** a, size_t* na, const char** b, size_t* nb) {
    const char *s = json_get_string(d->j, i), *sp = s ? strchr(s, ' ') : NULL;
    int first = json_first(d->j, i), second = json_next(d->j, first);
    if (sp && sp > s && sp[1] && !strchr(sp + 1, ' ')) {
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
        return;
    }
    *a = json_get_string(d->j, first);
    *b = json_get_string(d->j, second);
    if (s || !*a || !*b || !**a || !**b || json_next(d->j, second) >= 0 || d->j->values[i].type != JSON_ARRAY)
        refuse(d, "model.merges[%zu] must be \"a b\" (one space) or [\"a\", \"b\"]", rank);
    *na = strlen(*a);
    *nb = strlen(*b);
}

static uint32_t merge_token(const Doc* d, const BpeModel* m, const uint8_t* p, size_t n, size_t rank, const char* s,
                            size_t len) {
    int64_t id = bpe_vocab_find(m, p, n);
    if (id < 0 && s)
        refuse(d, "model.merges[%zu]: \"%.*s\" is not in model.vocab", rank, (int)(len < 80 ? len : 80), s);
    if (id < 0) refuse(d, "model.merges[%zu]: the token it makes is not in model.vocab", rank);
    return (uint32_t)id;
}

static void merges(const Doc* d, BpeModel* m, int model) {
    int list = array_of(d, model, "merges", "model");
    bpe_merges_reserve(m, count(d, list));
    uint8_t* buf = NULL;
    size_t cap = 0, rank = 0;
    for (int i = json_first(d->j, list); i >= 0; i = json_next(d->j, i), rank++) {
        const char *a, *b;
        size_t na, nb;
        merge_pair(d, i, rank, &a, &na, &b, &nb);
        if (na + nb > cap) buf = xrealloc(buf, cap = 2 * (na + nb));
        size_t ua = unmap(d, a, na, buf, "a merge's token"), ub = unmap(d, b, nb, buf + ua, "a merge's token");
        uint32_t ia = merge_token(d, m, buf, ua, rank, a, na), ib = merge_token(d, m, buf + ua, ub, rank, b, nb);
        uint32_t merged = merge_token(d, m, buf, ua + ub, rank, NULL, 0);
        if (!bpe_merge_add(m, ia, ib, (uint32_t)rank, merged))
            refuse(d, "model.merges[%zu] repeats an earlier pair", rank);
    }
    free(buf);
}

// ---------- the document start ----------

static int64_t template_start(const Doc* d, int tp) {
    int single = array_of(d, tp, "single", "post_processor's TemplateProcessing");
    int special = json_find(d->j, json_first(d->j, single), "SpecialToken");
    if (special < 0) return -1;   // "$A ...": nothing before the text
    const char* name = json_get_string(d->j, json_find(d->j, special, "id"));
    int ids = json_find(d->j, json_find(d->j, json_find(d->j, tp, "special_tokens"), name ? name : ""), "ids");
    long long id;
    if (!name || count(d, ids) != 1 || !json_get_int(d->j, json_first(d->j, ids), 0, BPE_MAX_VOCAB - 1, &id))
        refuse(d, "post_processor's TemplateProcessing begins with a SpecialToken that its special_tokens do not give "
                  "one id");
    return id;
}

// The template's leading special token, -1 when no template has one.
static int64_t post_processor_start(const Doc* d, int pp) {
    if (is_null(d, pp)) return -1;
    const char* type = type_of(d, pp, "post_processor");
    if (!strcmp(type, "ByteLevel")) return -1;
    if (!strcmp(type, "TemplateProcessing")) return template_start(d, pp);
    if (strcmp(type, "Sequence"))
        refuse(d,
               "post_processor type \"%.40s\" is not supported (ByteLevel, TemplateProcessing or a Sequence of them)",
               type);
    int64_t start = -1;
    for (int i = json_first(d->j, array_of(d, pp, "processors", "post_processor")); i >= 0; i = json_next(d->j, i)) {
        int64_t s = post_processor_start(d, i);
        start = s >= 0 ? s : start;
    }
    return start;
}

static int64_t added_named(const BpeModel* m, const char* content) {
    const BpeAddedSet* sets[2] = {&m->added, &m->added_normalized};
    for (int s = 0; s < 2; s++)
        for (uint32_t k = 0; k < sets[s]->n; k++) {
            size_t len;
            const uint8_t* p = bpe_token_bytes(m, sets[s]->v[k].id, &len);
            if (len == strlen(content) && !memcmp(p, content, len)) return sets[s]->v[k].id;
        }
    return -1;
}

// The token before every document: what the post_processor puts before a text (Llama 3.1's <|begin_of_text|>);
// else an added <|begin_of_text|> (Llama 3's first files put it there through tokenizer_config.json); else an
// added <|endoftext|> (GPT-2, Qwen2: between documents, as GPT-2 was trained).
static uint32_t document_start(const Doc* d, const BpeModel* m) {
    int64_t id = post_processor_start(d, json_find(d->j, 0, "post_processor"));
    if (id < 0) id = added_named(m, "<|begin_of_text|>");
    if (id < 0) id = added_named(m, "<|endoftext|>");
    if (id < 0)
        refuse(d, "cannot tell the token that begins a document: no post_processor template begins with a special "
                  "token, and added_tokens has neither <|begin_of_text|> nor <|endoftext|>");
    if (id >= m->vocab_size) refuse(d, "post_processor's document start %lld is not a token", (long long)id);
    return (uint32_t)id;
}

void tokenizer_json_load(BpeModel* m, const char* path, char* text) {
    if (!*text) fail("%s: an empty file", path);
    if (!text[strspn(text, " \t\n\r")])
        fail("%s: nothing but whitespace, where a tokenizer.json holds one JSON object", path);
    Json j;
    char why[200];
    if (!json_parse_buffer(&j, text, why, sizeof why)) fail("%s: JSON parse error: %s", path, why);
    Doc d = {&j, path, {0}};
    if (j.values[0].type != JSON_OBJECT)
        refuse(&d, "the top level is %s, not the JSON object of a tokenizer.json", describe(&d, 0));
    byte_level_alphabet(&d);
    check_top(&d);
    m->nfc = normalizer(&d);
    int model = json_find(&j, 0, "model");
    check_model(&d, m, model);
    m->pattern = pre_tokenizer(&d);
    int vocab = json_find(&j, model, "vocab"), added = json_find(&j, 0, "added_tokens");
    if (vocab < 0 || j.values[vocab].type != JSON_OBJECT) refuse(&d, "model.vocab must be an object");
    if (added >= 0 && j.values[added].type != JSON_ARRAY) refuse(&d, "added_tokens must be an array");
    token_table(&d, m, vocab, added);
    byte_ids(&d, m);
    merges(&d, m, model);
    m->doc_start = document_start(&d, m);
    json_free(&j);
}
