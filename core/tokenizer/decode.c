// decode.c: see decode.h.
#include "core/tokenizer/decode.h"

#include <errno.h>
#include <limits.h>

#include "base/common.h"
#include "core/tokenizer/tokenizer_file.h"

#define TOK_MAGIC 20240328
#define TOK_HEADER_BYTES 1024
#define TOK_MAX_VOCAB (1 << 24)

struct Tokenizer {
    int vocab, eot;
    size_t* offset;   // llm.c's file: token i's bytes are text[offset[i], offset[i + 1] - 1), then a NUL
    char* text;
    BpeModel* bpe;   // a tokenizer.json: its model holds the tokens' bytes instead
};

static int32_t le32(const unsigned char* p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static Tokenizer* load_json(const char* path) {
    Tokenizer* t = xcalloc(1, sizeof *t);
    t->bpe = xmalloc(sizeof *t->bpe);
    tokenizer_file_load(t->bpe, path);
    t->vocab = (int)t->bpe->vocab_size;
    t->eot = (int)t->bpe->doc_start;
    return t;
}

Tokenizer* tokenizer_load(const char* path) {
    long long size = file_size(path);
    if (size < 0) {
        if (errno == ENOENT) return NULL;
        fail("cannot stat tokenizer %s: %s", path, strerror(errno));
    }
    FILE* f = xfopen(path, "rb");   // before the size check: a FIFO's size of 0 would hide what it is
    if (tokenizer_file_is_json(f, path)) {
        if (fclose(f) != 0) fail("cannot close tokenizer %s: %s", path, strerror(errno));
        return load_json(path);
    }
    if (size < TOK_HEADER_BYTES)
        fail("tokenizer %s is shorter than its %d-byte header (%lld bytes)", path, TOK_HEADER_BYTES, size);
    unsigned char h[TOK_HEADER_BYTES];
    xfread(h, 1, sizeof h, f, path);
    int32_t magic = le32(h), version = le32(h + 4), vocab = le32(h + 8);
    if (magic != TOK_MAGIC) fail("tokenizer %s has wrong magic %d (expected %d)", path, magic, TOK_MAGIC);
    if (version != 1 && version != 2) fail("tokenizer %s has unsupported version %d (expected 1 or 2)", path, version);
    if (vocab <= 0 || vocab > TOK_MAX_VOCAB) fail("tokenizer %s has a bad vocab size %d", path, vocab);
    int32_t eot = version == 1 ? GPT2_EOT : le32(h + 12);
    if (eot < 0 || eot >= vocab)   // version 1's is GPT-2's, fixed
        fail("tokenizer %s has eot token %d outside its vocab of %d", path, eot, vocab);

    // Body: vocab x (uint8 length, bytes). Read it whole (under 1 MiB for GPT-2) and walk it.
    long long body = size - TOK_HEADER_BYTES;
    unsigned char* buf = xmalloc((size_t)body);
    xfread(buf, 1, (size_t)body, f, path);
    if (fclose(f) != 0) fail("cannot close tokenizer %s: %s", path, strerror(errno));

    Tokenizer* t = xcalloc(1, sizeof *t);
    t->vocab = vocab;
    t->eot = eot;
    t->offset = xmalloc(((size_t)vocab + 1) * sizeof *t->offset);
    t->text = xmalloc((size_t)body + (size_t)vocab);   // each token: its bytes + NUL <= its length byte + bytes
    long long pos = 0;
    size_t out = 0;
    for (int i = 0; i < vocab; i++) {
        if (pos >= body) fail("tokenizer %s is truncated: it ends at token %d of %d", path, i, vocab);
        int len = buf[pos++];
        if (pos + len > body)
            fail("tokenizer %s is truncated: token %d needs %d bytes, %lld are left", path, i, len, body - pos);
        t->offset[i] = out;
        memcpy(t->text + out, buf + pos, (size_t)len);
        out += (size_t)len;
        t->text[out++] = '\0';
        pos += len;
    }
    if (pos != body) fail("tokenizer %s has trailing bytes: %lld bytes after its %d tokens", path, body - pos, vocab);
    t->offset[vocab] = out;
    free(buf);
    return t;
}

// Token `token`'s bytes (*len of them, NUL-terminated), or NULL outside the vocabulary.
static const char* token_bytes(const Tokenizer* t, int token, size_t* len) {
    if (token < 0 || token >= t->vocab) return NULL;
    if (t->bpe) return (const char*)bpe_token_bytes(t->bpe, (uint32_t)token, len);
    *len = t->offset[token + 1] - t->offset[token] - 1;
    return t->text + t->offset[token];
}

const char* tokenizer_decode(const Tokenizer* t, int token) {
    size_t len;
    const char* p = token_bytes(t, token, &len);
    return p ? p : "";
}

// fwrite, not fputs: a token may hold a NUL byte (byte-level vocabularies have one for every byte).
void tokenizer_write(const Tokenizer* t, int token, FILE* out) {
    size_t len;
    const char* p = token_bytes(t, token, &len);
    if (p)
        fwrite(p, 1, len, out);
    else
        fprintf(out, "<id %d>", token);
}

int tokenizer_eot(const Tokenizer* t) { return t->eot; }
const BpeModel* tokenizer_bpe(const Tokenizer* t) { return t->bpe; }
int tokenizer_eot_or_gpt2(const Tokenizer* t, int V) { return t ? t->eot : V > GPT2_EOT ? GPT2_EOT : V - 1; }
int tokenizer_vocab(const Tokenizer* t) { return t->vocab; }

void tokenizer_free(Tokenizer* t) {
    if (!t) return;
    if (t->bpe) bpe_model_free(t->bpe);
    free(t->bpe);
    free(t->offset);
    free(t->text);
    free(t);
}

void tokenizer_path_for(char* path, size_t size, const char* given, const char* train_pattern) {
    if (given) {
        snprintf(path, size, "%s", given);
        if (file_size(path) < 0) fail("-tk %s: no such file", path);
        return;
    }
    char json[PATH_MAX];
    path_beside(path, size, train_pattern, "gpt2_tokenizer.bin");
    path_beside(json, sizeof(json), train_pattern, "tokenizer.json");
    int has_bin = file_size(path) >= 0, has_json = file_size(json) >= 0;
    if (has_bin && has_json)
        fail("%s and %s are both beside the shards: give the one they were encoded with as -tk", path, json);
    if (has_json) snprintf(path, size, "%s", json);
}
