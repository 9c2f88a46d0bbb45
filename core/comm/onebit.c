// onebit.c: see onebit.h. A message block is [scale as fp32][len sign bits, little-endian within each byte,
// padded to a whole word].
#include "core/comm/onebit.h"

#include <math.h>
#include <string.h>

#include "base/common.h"

size_t onebit_block_words(size_t len) { return 1 + (len + 31) / 32; }

static float sign_of(float y) { return y < 0.0f ? -1.0f : 1.0f; }

float onebit_compress(const float* y, float* err, size_t n, uint8_t* bits) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)y[i] * y[i];
    float scale = n ? (float)(sqrt(sum) / sqrt((double)n)) : 0.0f;
    memset(bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        float v = y[i];
        if (!(v < 0.0f)) bits[i / 8] |= (uint8_t)(1u << (i % 8));
        err[i] = v - scale * sign_of(v);
    }
    return scale;
}

void onebit_expand(const uint8_t* bits, float scale, size_t n, float* out) {
    for (size_t i = 0; i < n; i++) out[i] = (bits[i / 8] >> (i % 8)) & 1u ? scale : -scale;
}

OnebitScratch onebit_scratch(Backend* be, int size, size_t len) {
    size_t bytes = (size_t)size * onebit_block_words(len) * 4;
    OnebitScratch s = {.send = be_malloc(be, bytes), .recv = be_malloc(be, bytes), .host = (uint32_t*)xmalloc(bytes),
                       .avg = (float*)xmalloc((len ? len : 1) * sizeof(float)), .len = len, .size = size};
    return s;
}

void onebit_scratch_free(OnebitScratch* s, Backend* be) {
    be_free(be, s->send);
    be_free(be, s->recv);
    free(s->host);
    free(s->avg);
    *s = (OnebitScratch){0};
}

static uint32_t* block(const OnebitScratch* s, int j) { return s->host + (size_t)j * onebit_block_words(s->len); }
static float block_scale(const uint32_t* b) {
    float f;
    memcpy(&f, b, sizeof(f));
    return f;
}

// Worker side: x += e_w, compressed whole; block j gets chunk j's signs and the one scale.
static void pack_worker(OnebitScratch* s, float* x, float* e_w) {
    size_t n = (size_t)s->size * s->len;
    for (size_t i = 0; i < n; i++) x[i] += e_w[i];
    uint8_t* bits = (uint8_t*)xmalloc(n / 8 + 1);
    float scale = onebit_compress(x, e_w, n, bits);
    for (int j = 0; j < s->size; j++) {
        uint32_t* b = block(s, j);
        memset(b, 0, onebit_block_words(s->len) * 4);
        memcpy(b, &scale, sizeof(scale));
        // Chunks start at multiples of len; with len % 8 != 0 a chunk's bits do not start on a byte.
        for (size_t i = 0; i < s->len; i++) {
            size_t k = (size_t)j * s->len + i;
            if ((bits[k / 8] >> (k % 8)) & 1u) ((uint8_t*)(b + 1))[i / 8] |= (uint8_t)(1u << (i % 8));
        }
    }
    free(bits);
}

// Server side: the mean of the received chunks plus e_s, compressed into this rank's block.
static void serve_chunk(OnebitScratch* s, float* e_s, int rank) {
    float inv = 1.0f / (float)s->size;
    memset(s->avg, 0, s->len * sizeof(float));
    for (int j = 0; j < s->size; j++) {
        const uint32_t* b = block(s, j);
        float part = block_scale(b) * inv;
        const uint8_t* bits = (const uint8_t*)(b + 1);
        for (size_t i = 0; i < s->len; i++) s->avg[i] += (bits[i / 8] >> (i % 8)) & 1u ? part : -part;
    }
    for (size_t i = 0; i < s->len; i++) s->avg[i] += e_s[i];
    uint32_t* mine = block(s, rank);
    memset(mine, 0, onebit_block_words(s->len) * 4);
    float scale = onebit_compress(s->avg, e_s, s->len, (uint8_t*)(mine + 1));
    memcpy(mine, &scale, sizeof(scale));
}

void onebit_allreduce(Comm* c, Backend* be, OnebitScratch* s, float* x, float* e_w, float* e_s, size_t len) {
    int size = c ? comm_size(c) : 1, rank = c ? comm_rank(c) : 0;
    if (s->size != size || s->len < len) fail("internal: 1-bit scratch for %d x %zu, asked %d x %zu", s->size, s->len, size, len);
    size_t saved = s->len;
    s->len = len;
    size_t words = onebit_block_words(len), bytes = (size_t)size * words * 4;
    pack_worker(s, x, e_w);
    if (size > 1) {
        be_upload(be, s->send, s->host, bytes);
        comm_alltoall(c, s->recv, s->send, words, DT_FP32);
        be_download(be, s->host, s->recv, bytes);
    }
    serve_chunk(s, e_s, rank);
    if (size > 1) {
        uint32_t* mine = block(s, rank);
        be_upload(be, (char*)s->recv + (size_t)rank * words * 4, mine, words * 4);
        comm_allgather(c, s->recv, words, DT_FP32);
        be_download(be, s->host, s->recv, bytes);
    }
    for (int j = 0; j < size; j++) {
        const uint32_t* b = block(s, j);
        onebit_expand((const uint8_t*)(b + 1), block_scale(b), len, x + (size_t)j * len);
    }
    s->len = saved;
}
