// test_quantize.c: block quantization (kernels.h: quantize_blocks, dequantize_blocks) on the CPU twin.
//   round trip: every element within absmax / (2 qmax) of its block (and fp32's rounding), 8 and 4 bits, from fp32,
//     bf16 and fp16
//   bf16 is read as bf16: its q and scales are those of the same values stored as fp32 (reading its bits as
//     fp16 would give others)
//   4 bits by hand: the levels, the nibbles' order, rint's ties to even, a lone last element's high nibble 0
//   an all-zero block: scale 0, dequantized 0; a block with an infinity or a NaN: scale NaN, every dequantized
//     value NaN, the other blocks untouched
//   dequantize with `add`: out + q scale, rounded once to out's type
//   the same bits on one and on three threads
// Refused: bits other than 4 and 8, an odd block at 4 bits.
// With a model file (test_quantize MODEL.bin, tests/system/t_zeropp.sh): the round trip bound on its real
// tensors, each unit's sections cut in blocks of QWZ_BLOCK from their starts as -qw cuts them (core/zero/qwz.h),
// at 8 bits, from the values in fp32 and rounded to bf16.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/model_file.h"
#include "core/zero/qwz.h"
#include "tests/unit/child_testlib.h"
#include "tests/unit/kernel_testlib.h"

typedef struct {
    Backend* be;
    TestStats st;
} Ctx;

// The bound absmax / (2 qmax) holds for exact arithmetic; x / scale and q scale round in fp32, which for |x| near
// qmax scales adds up to a few of x's ulps: the bound's factor with 4 qmax 2^-24 to spare.
static double rounding_slack(int bits) { return 1.0 + 4.0 * ((1 << (bits - 1)) - 1) * ldexp(1.0, -24); }

// x's blocks' absmax, from the values as stored.
static float block_absmax(const float* x, size_t lo, size_t hi) {
    float m = 0.0f;
    for (size_t i = lo; i < hi; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

// h's n values (as stored in dt) quantized and dequantized to fp32: the largest error over its block's bound.
static double round_trip_worst(Ctx* c, DType dt, const float* h, size_t n, int block, int bits) {
    void* x = dev_from(c->be, dt, h, n);
    void* q = be_malloc(c->be, quantized_bytes(n, bits));
    float* s = (float*)be_malloc(c->be, quantized_blocks(n, block) * sizeof(float));
    float* y = (float*)be_malloc(c->be, n * sizeof(float));
    quantize_blocks(c->be, dt, q, s, x, n, block, bits);
    dequantize_blocks(c->be, DT_FP32, y, q, s, n, block, bits, 0);
    double worst = 0.0;
    for (size_t lo = 0; lo < n; lo += (size_t)block) {
        size_t hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        double bound = block_absmax(h, lo, hi) / (2.0 * ((1 << (bits - 1)) - 1));
        for (size_t i = lo; i < hi; i++) {
            double e = fabs((double)y[i] - (double)h[i]);
            if (e > 0.0) worst = e / bound > worst ? e / bound : worst;   // an all-zero block: bound 0, error 0
        }
    }
    be_free(c->be, x), be_free(c->be, q), be_free(c->be, s), be_free(c->be, y);
    return worst;
}

static double worst_over_bound(Ctx* c, DType dt, size_t n, int block, int bits, uint64_t seed) {
    Rng r = {seed};
    float* h = rand_vec(&r, n, 3.0f, dt);
    for (size_t i = 0; i < n; i += 97) h[i] *= 1e-3f;   // small values beside large ones in a block
    double worst = round_trip_worst(c, dt, h, n, block, bits);
    free(h);
    return worst;
}

static void round_trip(Ctx* c) {
    const DType dts[3] = {DT_FP32, DT_BF16, DT_FP16};
    const char* names[3] = {"fp32", "bf16", "fp16"};
    for (int d = 0; d < 3; d++)
        for (int bits = 4; bits <= 8; bits += 4) {
            char name[96];
            snprintf(name, sizeof name, "quantize_round_trip_within_half_step_%s_int%d", names[d], bits);
            // a last block of 1001 % 64 = 41 elements (odd at 4 bits)
            check_close(&c->st, name, worst_over_bound(c, dts[d], 1001, 64, bits, 11 + d), rounding_slack(bits));
        }
}

// q and scales of n values stored as dt, downloaded (quantized_bytes and blocks long).
static void quantized(Ctx* c, DType dt, const float* h, size_t n, int block, int bits, uint8_t* q, float* s) {
    void* x = dev_from(c->be, dt, h, n);
    void* dq = be_malloc(c->be, quantized_bytes(n, bits));
    float* ds = (float*)be_malloc(c->be, quantized_blocks(n, block) * sizeof(float));
    quantize_blocks(c->be, dt, dq, ds, x, n, block, bits);
    be_download(c->be, q, dq, quantized_bytes(n, bits));
    be_download(c->be, s, ds, quantized_blocks(n, block) * sizeof(float));
    be_free(c->be, x), be_free(c->be, dq), be_free(c->be, ds);
}

static void bf16_as_bf16(Ctx* c) {
    const size_t n = 512;
    Rng r = {5};
    float* h = rand_vec(&r, n, 2.0f, DT_BF16);
    uint8_t qa[512], qb[512];
    float sa[8], sb[8];
    quantized(c, DT_BF16, h, n, 64, 8, qa, sa);
    quantized(c, DT_FP32, h, n, 64, 8, qb, sb);
    check_true(&c->st, "quantize_bf16_reads_bf16_values", !memcmp(qa, qb, n) && !memcmp(sa, sb, sizeof sa));
    free(h);
}

static void int4_by_hand(Ctx* c) {
    // block 1: absmax 7, scale 1: levels 7, -7, rint(3.5) = 4 and rint(2.5) = 2 (ties to even), 0, -1
    // block 2 (the last, 3 elements): absmax 0.875, scale 0.125: levels 7, -3, and a lone 1 (high nibble 0)
    const float h[9] = {7.0f, -7.0f, 3.5f, 0.0f, 2.5f, -1.0f, 0.875f, -0.375f, 0.125f};
    uint8_t q[5];
    float s[2];
    quantized(c, DT_FP32, h, 9, 6, 4, q, s);
    const uint8_t want[5] = {0x97, 0x04, 0xF2, 0xD7, 0x01};
    check_true(&c->st, "quantize_int4_nibbles_by_hand", !memcmp(q, want, 5) && s[0] == 1.0f && s[1] == 0.125f);
}

static void special_blocks(Ctx* c) {
    float h[12] = {0, 0, 0, 0, 1.0f, INFINITY, 2.0f, 3.0f, 0.5f, -0.25f, 0.125f, 1.0f};
    float y[12];
    for (int pass = 0; pass < 2; pass++) {
        if (pass) h[5] = NAN;
        void* x = dev_from(c->be, DT_FP32, h, 12);
        void* q = be_malloc(c->be, 12);
        float* s = (float*)be_malloc(c->be, 3 * sizeof(float));
        float* dy = (float*)be_malloc(c->be, 12 * sizeof(float));
        quantize_blocks(c->be, DT_FP32, q, s, x, 12, 4, 8);
        dequantize_blocks(c->be, DT_FP32, dy, q, s, 12, 4, 8, 0);
        be_download(c->be, y, dy, sizeof y);
        float hs[3];
        be_download(c->be, hs, s, sizeof hs);
        int zero = hs[0] == 0.0f && y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f;
        int nan = isnan(hs[1]) && isnan(y[4]) && isnan(y[5]) && isnan(y[6]) && isnan(y[7]);
        int rest = hs[2] == 1.0f / 127.0f && y[11] == 1.0f;
        check_true(&c->st, pass ? "quantize_nan_block_dequantizes_nan" : "quantize_inf_block_dequantizes_nan", zero && nan && rest);
        be_free(c->be, x), be_free(c->be, q), be_free(c->be, s), be_free(c->be, dy);
    }
}

static void dequantize_adds(Ctx* c) {
    const float h[4] = {1.0f, -0.5f, 0.25f, 0.0f}, base[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    void* x = dev_from(c->be, DT_FP32, h, 4);
    void* q = be_malloc(c->be, 4);
    float* s = (float*)be_malloc(c->be, sizeof(float));
    void* out = dev_from(c->be, DT_BF16, base, 4);
    quantize_blocks(c->be, DT_FP32, q, s, x, 4, 4, 8);
    dequantize_blocks(c->be, DT_BF16, out, q, s, 4, 4, 8, 1);
    float* y = host_of(out, DT_BF16, 4);
    int8_t lv[4];
    float sc;
    be_download(c->be, lv, q, 4);
    be_download(c->be, &sc, s, sizeof sc);
    int ok = 1;
    for (int i = 0; i < 4; i++) ok &= y[i] == dtype_round(1.0f + (float)lv[i] * sc, DT_BF16);
    check_true(&c->st, "dequantize_add_rounds_once", ok && lv[0] == 127 && lv[1] == -64);
    be_free(c->be, x), be_free(c->be, q), be_free(c->be, s), be_free(c->be, out), free(y);
}

static void threads(Ctx* c) {
    const size_t n = 5000;
    Rng r = {9};
    float* h = rand_vec(&r, n, 1.0f, DT_FP32);
    uint8_t q1[2500], q3[2500];
    float s1[40], s3[40];
    omp_set_num_threads(1);
    quantized(c, DT_FP32, h, n, 128, 4, q1, s1);
    omp_set_num_threads(3);
    quantized(c, DT_FP32, h, n, 128, 4, q3, s3);
    omp_set_num_threads(1);
    check_true(&c->st, "quantize_same_bits_on_three_threads", !memcmp(q1, q3, sizeof q1) && !memcmp(s1, s3, sizeof s1));
    free(h);
}

static void bad_bits(const void* arg) {
    (void)arg;
    Backend* be = backend_create(0);
    quantize_blocks(be, DT_FP32, NULL, NULL, NULL, 4, 4, 5);
}
static void odd_block(const void* arg) {
    (void)arg;
    Backend* be = backend_create(0);
    quantize_blocks(be, DT_FP32, NULL, NULL, NULL, 4, 3, 4);
}

// The model's sections (flat, in its layout), each quantized as qwZ quantizes it: the worst error over its bound.
static double model_worst(Ctx* c, const char* path, DType dt) {
    ModelShape shape = model_file_shape(path);
    ParamLayout lay;
    layout_build(&lay, &shape, layout_pad_multiple(1));
    float* flat = model_file_read(&lay, path);
    double worst = 0.0;
    for (int u = 0; u < lay.num_units; u++)
        for (int s = 0; s < UNIT_SECTIONS; s++) {
            size_t n = section_len(&lay.units[u], s);
            if (!n) continue;
            float* h = flat + section_begin(&lay.units[u], s);
            for (size_t i = 0; i < n; i++) h[i] = dtype_round(h[i], dt);
            double w = round_trip_worst(c, dt, h, n, QWZ_BLOCK, QWZ_BITS);
            worst = w > worst ? w : worst;
        }
    free(flat);
    return worst;
}

int main(int argc, char** argv) {
    Ctx c = {backend_create(0), {0, 0}};
    if (argc == 2) {
        check_close(&c.st, "qwz_round_trip_on_model_fp32", model_worst(&c, argv[1], DT_FP32), rounding_slack(QWZ_BITS));
        check_close(&c.st, "qwz_round_trip_on_model_bf16", model_worst(&c, argv[1], DT_BF16), rounding_slack(QWZ_BITS));
        backend_destroy(c.be);
        return test_exit(&c.st);
    }
    // The refusals first: a child forked beside a pool of OpenMP threads makes LeakSanitizer's exit noisy.
    check_refusal(&c.st, "quantize_refuses_5_bits", bad_bits, NULL, "5 bits");
    check_refusal(&c.st, "quantize_refuses_odd_block_at_4_bits", odd_block, NULL, "blocks of 3");
    omp_set_num_threads(1);
    round_trip(&c);
    bf16_as_bf16(&c);
    int4_by_hand(&c);
    special_blocks(&c);
    dequantize_adds(&c);
    threads(&c);
    backend_destroy(c.be);
    return test_exit(&c.st);
}
