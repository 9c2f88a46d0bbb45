// tokenizer_file.c: see tokenizer_file.h.
#include "core/tokenizer/tokenizer_file.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/tokenizer/tokenizer_json.h"

static int read_exact(FILE* f, void* buf, size_t n) { return fread(buf, 1, n, f) == n; }

static void load_compact(BpeModel* m, const char* path, FILE* f) {
    int32_t hdr[4];
    uint32_t bytes[256];
    if (!read_exact(f, hdr, sizeof hdr) || hdr[0] != BPE_MERGES_MAGIC || hdr[1] != 1 || hdr[2] <= 0 ||
        hdr[2] >= (int32_t)BPE_MAX_VOCAB || !read_exact(f, bytes, sizeof bytes))
        fail("%s: not a compact merges file", path);
    for (int i = 0; i < 256; i++) {
        if (bytes[i] > 0xffff) fail("%s: byte id out of range", path);
        m->byte_id[i] = bytes[i];
    }
    bpe_merges_reserve(m, (size_t)hdr[2]);
    for (int32_t r = 0; r < hdr[2]; r++) {
        uint32_t t[3];
        if (!read_exact(f, t, sizeof t) || t[0] > 0xffff || t[1] > 0xffff || t[2] > 0xffff)
            fail("%s: truncated or corrupt merges", path);
        bpe_merge_add(m, t[0], t[1], (uint32_t)r, t[2]);   // a repeated pair keeps its first rank
    }
}

// The whole file, NUL-terminated: tokenizer.json's text.
static char* read_text(const char* path, FILE* f) {
    if (fseek(f, 0, SEEK_END) != 0) fail("%s: %s", path, strerror(errno));
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) fail("%s: %s", path, strerror(errno));
    if (size >= (1L << 31)) fail("%s: larger than 2 GiB", path);
    char* text = xmalloc((size_t)size + 1);
    if (!read_exact(f, text, (size_t)size))
        fail("%s: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
    text[size] = 0;
    const char* nul = memchr(text, 0, (size_t)size);
    if (nul) fail("%s: a NUL byte at byte %td", path, nul - text);
    return text;
}

int tokenizer_file_is_json(FILE* f, const char* path) {
    int c;
    while ((c = getc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
    if (ferror(f) || fseek(f, 0, SEEK_SET) != 0) fail("%s: %s", path, strerror(errno));
    return c == EOF || (c >= 0x20 && c < 0x7f);
}

void tokenizer_file_load(BpeModel* m, const char* path) {
    memset(m, 0, sizeof *m);
    FILE* f = xfopen(path, "rb");
    if (tokenizer_file_is_json(f, path)) {
        char* text = read_text(path, f);
        if (fclose(f) != 0) fail("%s: %s", path, strerror(errno));
        tokenizer_json_load(m, path, text);
    } else {
        m->pattern = BPE_PATTERN_GPT2;
        load_compact(m, path, f);
        if (fclose(f) != 0) fail("%s: %s", path, strerror(errno));
    }
    bpe_model_finish(m);
}
