// test_qgz.c: qgZ's error feedback (core/zero/qgz.h) on one piece over many steps.
//
// Each step's gradient holds, per block of 64, one large element and 63 small ones under half the block's int4
// step (absmax / 14), which int4 rounds to 0. Without feedback (the error dropped every step) the small ones
// never arrive and the sum of what was sent drifts from the sum of the gradients by steps x their size; with it,
// that difference is exactly the last step's error, within one step's quantization error (half a step,
// absmax / 14) whatever the number of steps. Also: a block holding an infinity dequantizes to NaN and leaves
// the error it had, so the step after it is finite again.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/zero/qgz.h"
#include "tests/unit/testlib.h"

#define N (4 * QGZ_BLOCK)
#define STEPS 200

// Step k's gradient: element 0 of each block 7 (absmax; the int4 step is 7 / 7 = 1), the others in [0.1, 0.4].
static void gradient(float* g, int k) {
    for (size_t i = 0; i < N; i++) g[i] = i % QGZ_BLOCK ? 0.1f + 0.3f * (float)((i * 7 + (size_t)k * 13) % 17) / 16.0f : 7.0f;
}

// The largest |sum of sent - sum of gradients| over the elements after STEPS steps, with or without feedback.
static double drift(int feedback) {
    unsigned char* packet = (unsigned char*)xmalloc(qgz_packet_bytes(N));
    float g[N], y[N], e[N] = {0}, sent[N] = {0};
    double truth[N] = {0};
    for (int k = 0; k < STEPS; k++) {
        gradient(g, k);
        memcpy(y, g, sizeof(g));
        if (!feedback) memset(e, 0, sizeof(e));
        qgz_feed_back(packet, y, e, N);
        qgz_dequantize_add(sent, packet, N);
        for (size_t i = 0; i < N; i++) truth[i] += g[i];
    }
    double worst = 0.0;
    for (size_t i = 0; i < N; i++) worst = fmax(worst, fabs((double)sent[i] - truth[i]));
    free(packet);
    return worst;
}

// A block with an infinity: NaN out, the error unchanged; the next step finite.
static void check_overflow(TestStats* st) {
    unsigned char* packet = (unsigned char*)xmalloc(qgz_packet_bytes(N));
    float y[N], e[N], out[N] = {0}, before[N];
    for (size_t i = 0; i < N; i++) e[i] = before[i] = 0.25f, y[i] = 1.0f;
    y[3] = INFINITY;
    qgz_feed_back(packet, y, e, N);
    qgz_dequantize_add(out, packet, N);
    int nan_block = 1, rest_finite = 1, error_kept = 1;
    for (size_t i = 0; i < N; i++) {
        if (i < QGZ_BLOCK) nan_block &= isnan(out[i]), error_kept &= e[i] == before[i];
        else rest_finite &= isfinite(out[i]) && isfinite(e[i]);
    }
    check_true(st, "overflow_block_dequantizes_to_nan", nan_block);
    check_true(st, "overflow_block_keeps_its_error", error_kept);
    check_true(st, "other_blocks_stay_finite", rest_finite);
    free(packet);
}

int main(void) {
    TestStats st = {0};
    double with = drift(1), without = drift(0), step_error = 7.0 / 7.0 / 2.0;   // half an int4 step at absmax 7
    printf("# sum of sent vs sum of gradients after %d steps: %.4g with feedback, %.4g without\n", STEPS, with, without);
    check_true(&st, "feedback_within_one_step_error", with <= step_error);
    check_true(&st, "without_feedback_drifts", without > 10.0 * step_error);
    check_overflow(&st);
    return test_exit(&st);
}
