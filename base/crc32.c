// crc32.c: see crc32.h. Slicing-by-16: sixteen table lookups per 16 bytes instead of one per byte, about
// five times faster than the bytewise loop, so checksumming a checkpoint costs little beside writing it.
#include "base/crc32.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

void crc32_begin(Crc32* c) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t r = b;
        for (int k = 0; k < 8; k++) r = r & 1 ? 0xEDB88320u ^ (r >> 1) : r >> 1;
        c->table[0][b] = r;
    }
    for (int k = 1; k < 16; k++)
        for (int b = 0; b < 256; b++) c->table[k][b] = (c->table[k - 1][b] >> 8) ^ c->table[0][c->table[k - 1][b] & 0xff];
    c->crc = 0;
}

static uint32_t le32_at(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void crc32_add(Crc32* c, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint32_t(*t)[256] = c->table;
    uint32_t r = ~c->crc;
    for (; n >= 16; p += 16, n -= 16) {
        uint32_t a = le32_at(p) ^ r, b = le32_at(p + 4), d = le32_at(p + 8), e = le32_at(p + 12);
        r = t[15][a & 0xff] ^ t[14][(a >> 8) & 0xff] ^ t[13][(a >> 16) & 0xff] ^ t[12][a >> 24] ^
            t[11][b & 0xff] ^ t[10][(b >> 8) & 0xff] ^ t[9][(b >> 16) & 0xff] ^ t[8][b >> 24] ^
            t[7][d & 0xff] ^ t[6][(d >> 8) & 0xff] ^ t[5][(d >> 16) & 0xff] ^ t[4][d >> 24] ^
            t[3][e & 0xff] ^ t[2][(e >> 8) & 0xff] ^ t[1][(e >> 16) & 0xff] ^ t[0][e >> 24];
    }
    for (; n; p++, n--) r = (r >> 8) ^ t[0][(r ^ *p) & 0xff];
    c->crc = ~r;
}

uint32_t crc32_of(const void* p, size_t n) {
    Crc32* c = (Crc32*)xmalloc(sizeof(Crc32));
    crc32_begin(c);
    crc32_add(c, p, n);
    uint32_t crc = c->crc;
    free(c);
    return crc;
}

int crc32_file(const char* path, uint32_t* crc) {
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    Crc32* c = (Crc32*)xmalloc(sizeof(Crc32));
    enum { CHUNK = 1 << 20 };
    unsigned char* buf = (unsigned char*)xmalloc(CHUNK);
    crc32_begin(c);
    for (size_t got; (got = fread(buf, 1, CHUNK, f)) > 0;) crc32_add(c, buf, got);
    int ok = !ferror(f);
    if (ok) *crc = c->crc;
    free(buf);
    free(c);
    fclose(f);
    return ok;
}
