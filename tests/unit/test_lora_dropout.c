// test_lora_dropout.c: LoRA's dropout mask (core/model/lora.h: lora_dropout_key; kernels.h: lora_dropout, its
// CPU twin). What must hold:
//   - the same key gives the same bits on every call, for any thread count, in place too;
//   - each element is dropped with probability P (the rate over 240k elements within 5 sigma, for three P),
//     independently: two keys' drops overlap at P^2;
//   - a kept element is x * (1 / (1 - P)) rounded once to the storage type, a dropped one exactly 0; P = 0
//     keeps x's bits;
//   - a block of columns of a wider matrix draws the whole one's mask there, past 2^32 elements too;
//   - the key changes with each of its parts: seed (both halves), position, layer, target.
// With arguments, `mask SEED POSITION LAYER TARGET P ROWS COLS` writes the kernel's fp32 output for an input of
// ones to stdout instead: tests/system/t_lora_dropout.sh compares it with scripts/reference.py's mask.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/model/lora.h"
#include "kernels/dtype.h"
#include "tests/unit/testlib.h"

enum { ROWS = 240, COLS = 1000 };

static float unif(uint64_t* s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 4.0f - 2.0f;
}

static uint32_t key_of(uint64_t seed, long long position, int layer, int target) {
    LoraFamily lf;
    memset(&lf, 0, sizeof(lf));
    lf.seed = seed;
    return lora_dropout_key(&lf, position, layer, target);
}

// fp32 inputs in [-2, 2), none zero (so a kept element is never 0).
static float* inputs(size_t n) {
    float* x = (float*)xmalloc(n * sizeof(float));
    uint64_t s = 42;
    for (size_t i = 0; i < n; i++) {
        x[i] = unif(&s);
        if (x[i] == 0.0f) x[i] = 1.0f;
    }
    return x;
}

// lora_dropout of x (fp32, n = rows * cols) into a new buffer.
static float* dropped(Backend* be, const float* x, int rows, int cols, int col0, int width, uint32_t key, float p) {
    float* out = (float*)xmalloc((size_t)rows * cols * sizeof(float));
    lora_dropout(be, DT_FP32, out, x, rows, cols, col0, width, key, p);
    return out;
}

static double drop_rate(const float* y, size_t n) {
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += y[i] == 0.0f;
    return (double)zeros / (double)n;
}

static void check_rates(TestStats* st, Backend* be, const float* x) {
    const size_t n = (size_t)ROWS * COLS;
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int i = 0; i < 3; i++) {
        float* y = dropped(be, x, ROWS, COLS, 0, COLS, key_of(1337, 0, 0, 0), ps[i]);
        char name[64];
        snprintf(name, sizeof(name), "drop_rate_p%g", ps[i]);
        check_close(st, name, fabs(drop_rate(y, n) - ps[i]), 5.0 * sqrt(ps[i] * (1.0 - ps[i]) / (double)n));
        free(y);
    }
    // Two keys' masks are independent: the share dropped by both is P^2.
    float* a = dropped(be, x, ROWS, COLS, 0, COLS, key_of(1337, 0, 0, 0), 0.5f);
    float* b = dropped(be, x, ROWS, COLS, 0, COLS, key_of(1337, 1, 0, 0), 0.5f);
    size_t both = 0;
    for (size_t i = 0; i < n; i++) both += a[i] == 0.0f && b[i] == 0.0f;
    check_close(st, "drops_of_two_keys_independent", fabs((double)both / (double)n - 0.25), 5.0 * sqrt(0.25 * 0.75 / (double)n));
    free(a), free(b);
}

// Kept elements are x * (1 / (1 - p)) with one rounding to dt, dropped ones 0; fp32 and bf16.
static void check_values(TestStats* st, Backend* be, const float* x, DType dt) {
    const size_t n = (size_t)ROWS * COLS, e = dtype_size(dt);
    const float p = 0.25f, scale = 1.0f / (1.0f - p);
    void* in = xmalloc(n * e);
    void* out = xmalloc(n * e);
    host_to_dtype(in, dt, x, n);
    float* xs = (float*)xmalloc(n * sizeof(float));
    float* y = (float*)xmalloc(n * sizeof(float));
    host_from_dtype(xs, in, dt, n);
    lora_dropout(be, dt, out, in, ROWS, COLS, 0, COLS, key_of(7, 3, 1, 2), p);
    host_from_dtype(y, out, dt, n);
    size_t bad = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        int keep = y[i] != 0.0f;
        kept += keep;
        bad += keep && y[i] != dtype_round(xs[i] * scale, dt);
    }
    char name[64];
    snprintf(name, sizeof(name), "kept_scaled_once_dropped_zero_%s", dtype_name(dt));
    test_report(st, bad == 0 && kept > 0 && kept < n, name, "%g of the kept elements wrong, %g kept", (double)bad, (double)kept);
    free(in), free(out), free(xs), free(y);
}

static int same(const float* a, const float* b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void check_repeats(TestStats* st, Backend* be, const float* x) {
    const size_t n = (size_t)ROWS * COLS;
    const uint32_t key = key_of(99, 12, 3, 4);
    float* a = dropped(be, x, ROWS, COLS, 0, COLS, key, 0.1f);
    float* b = dropped(be, x, ROWS, COLS, 0, COLS, key, 0.1f);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    float* one = dropped(be, x, ROWS, COLS, 0, COLS, key, 0.1f);
    omp_set_num_threads(threads);
    float* in_place = (float*)xmalloc(n * sizeof(float));
    memcpy(in_place, x, n * sizeof(float));
    lora_dropout(be, DT_FP32, in_place, in_place, ROWS, COLS, 0, COLS, key, 0.1f);
    check_true(st, "same_key_same_bits", same(a, b, n) && same(a, one, n));
    check_true(st, "in_place_same_bits", same(a, in_place, n));
    float* none = dropped(be, x, ROWS, COLS, 0, COLS, key, 0.0f);
    check_true(st, "p0_keeps_every_bit", same(none, x, n));
    free(a), free(b), free(one), free(in_place), free(none);
}

// Columns [col0, col0 + c) of a matrix of COLS columns: the whole matrix's mask there. Row r of the block is
// row r of the whole, so the block's element (r, j) is the whole's r * width + col0 + j.
static void check_columns(TestStats* st, Backend* be, const float* x) {
    const uint32_t key = key_of(5, 0, 0, 6);
    const int c = 300, col0 = 450;
    float* whole = dropped(be, x, ROWS, COLS, 0, COLS, key, 0.3f);
    float* block = (float*)xmalloc((size_t)ROWS * c * sizeof(float));
    for (int r = 0; r < ROWS; r++) memcpy(block + (size_t)r * c, x + (size_t)r * COLS + col0, c * sizeof(float));
    float* y = dropped(be, block, ROWS, c, col0, COLS, key, 0.3f);
    int ok = 1;
    for (int r = 0; r < ROWS; r++) ok &= same(y + (size_t)r * c, whole + (size_t)r * COLS + col0, c);
    check_true(st, "column_block_draws_the_whole_mask", ok);
    // Past 2^32: one column, the last of rows of 2^30, over 64 rows; row r's element is r * 2^30 + 2^30 - 1,
    // past 2^32 from row 4 on, where a 32-bit index would draw another mask (at P = 0.5 on some of the 60 rows).
    enum { BIG_ROWS = 64 };
    const int width = 1 << 30;
    float ones[BIG_ROWS], at_end[BIG_ROWS];
    for (int r = 0; r < BIG_ROWS; r++) ones[r] = 1.0f;
    lora_dropout(be, DT_FP32, at_end, ones, BIG_ROWS, 1, width - 1, width, key, 0.5f);
    int ok_big = 1, truncated_differs = 0;
    for (int r = 0; r < BIG_ROWS; r++) {
        uint64_t index = (uint64_t)r * (uint64_t)width + (uint64_t)(width - 1);
        ok_big &= (at_end[r] != 0.0f) == dropout_keeps(key, index, 0.5f);
        truncated_differs |= (at_end[r] != 0.0f) != dropout_keeps(key, (uint32_t)index, 0.5f);
    }
    check_true(st, "index_past_2e32_is_64_bit", ok_big && truncated_differs);
    free(whole), free(block), free(y);
}

static void check_key_parts(TestStats* st) {
    const uint32_t k = key_of(1337, 10, 2, 3);
    check_true(st, "key_is_a_function", k == key_of(1337, 10, 2, 3));
    check_true(st, "key_changes_with_each_part", k != key_of(1338, 10, 2, 3) && k != key_of(1337 + (1ull << 32), 10, 2, 3) &&
                                                      k != key_of(1337, 11, 2, 3) && k != key_of(1337, 10 + (1ll << 32), 2, 3) &&
                                                      k != key_of(1337, 10, 3, 3) && k != key_of(1337, 10, 2, 4) &&
                                                      key_of(1337, 10, 3, 2) != key_of(1337, 10, 2, 3));
}

// `mask SEED POSITION LAYER TARGET P ROWS COLS`: the kernel's output for ones, fp32, to stdout.
static int print_mask(char** argv) {
    uint64_t seed = strtoull(argv[2], NULL, 10);
    long long position = strtoll(argv[3], NULL, 10);
    int layer = atoi(argv[4]), target = atoi(argv[5]), rows = atoi(argv[7]), cols = atoi(argv[8]);
    float p = strtof(argv[6], NULL);
    if (rows < 1 || cols < 1 || !(p >= 0.0f && p < 1.0f)) fail("mask: rows %d, cols %d, p %g out of range", rows, cols, p);
    size_t n = (size_t)rows * cols;
    float* ones = (float*)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    Backend* be = backend_create(0);
    float* y = dropped(be, ones, rows, cols, 0, cols, key_of(seed, position, layer, target), p);
    backend_destroy(be);
    if (fwrite(y, sizeof(float), n, stdout) != n || fflush(stdout) != 0) fail("mask: cannot write stdout");
    free(ones), free(y);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 9 && !strcmp(argv[1], "mask")) return print_mask(argv);
    if (argc != 1) fail("usage: %s [mask SEED POSITION LAYER TARGET P ROWS COLS]", argv[0]);
    TestStats st = {0, 0};
    Backend* be = backend_create(0);
    float* x = inputs((size_t)ROWS * COLS);
    check_rates(&st, be, x);
    check_values(&st, be, x, DT_FP32);
    check_values(&st, be, x, DT_BF16);
    check_repeats(&st, be, x);
    check_columns(&st, be, x);
    check_key_parts(&st);
    free(x);
    backend_destroy(be);
    return test_exit(&st);
}
