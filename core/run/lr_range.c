// lr_range.c: see lr_range.h.
#include "core/run/lr_range.h"

#include <math.h>

#include "base/common.h"

int lr_range_record(LrRangeTest* t, float lr, double loss) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->lr = (float*)xrealloc(t->lr, (size_t)t->cap * sizeof(float));
        t->loss = (double*)xrealloc(t->loss, (size_t)t->cap * sizeof(double));
    }
    double best = INFINITY;
    for (int i = 0; i < t->n; i++) best = fmin(best, t->loss[i]);
    t->lr[t->n] = lr;
    t->loss[t->n++] = loss;
    t->diverged = !isfinite(loss) || (t->n > 1 && loss > LR_RANGE_DIVERGED * best);
    return t->diverged;
}

void lr_range_finish(LrRangeTest* t, Logger* log, int print) {
    int kept = t->n - t->diverged, low = -1;
    double avg = 0.0, decay = 1.0, lowest = INFINITY;
    if (print) printf("lr range test: %d step%s, lr %.3e .. %.3e%s\n  %-11s %-11s %s\n", t->n, t->n == 1 ? "" : "s",
                      t->n ? t->lr[0] : 0.0, t->n ? t->lr[t->n - 1] : 0.0, t->diverged ? ", stopped: the loss diverged" : "",
                      "lr", "loss", "smoothed");
    for (int i = 0; i < t->n; i++) {
        double smoothed = NAN;
        if (i < kept) {
            avg = LR_RANGE_SMOOTHING * avg + (1.0 - LR_RANGE_SMOOTHING) * t->loss[i];
            decay *= LR_RANGE_SMOOTHING;
            smoothed = avg / (1.0 - decay);
            if (smoothed < lowest) lowest = smoothed, low = i;
        }
        if (print) printf("  %-11.4e %-11.6g %.6g\n", t->lr[i], t->loss[i], smoothed);
    }
    if (low >= 0) {
        double suggested = t->lr[low] / 10.0;
        if (print) printf("suggested peak lr: %.4e (a tenth of %.4e, where the smoothed loss is lowest, %.6g)\n", suggested, t->lr[low], lowest);
        logger_line(log, "{\"step\": %d, \"lr_range\": {\"suggested_lr\": %.9g, \"lowest_smoothed_loss\": %.9g, \"at_lr\": %.9g, \"diverged\": %d}}",
                    t->n - 1, suggested, lowest, (double)t->lr[low], t->diverged);
    } else if (print) printf("no suggestion: no step before the divergence\n");
    if (print) flush_stdout();
    free(t->lr);
    free(t->loss);
    *t = (LrRangeTest){0};
}
