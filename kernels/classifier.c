// classifier.c: fused softmax cross-entropy over the LM head's logits (CPU twin); for -tp's vocabulary-parallel
// head, in three steps (classifier_vocab_max, _sums, _finish) with the group's max and all-gather between
// them, since no rank holds a whole row.
#include "kernels/cpu_common.h"

// One row: the loss, and optionally the row's dlogits written over its logits. Only the row's scalars
// are kept: each probability is recomputed from its logit when it is needed.
static float classifier_row(DType dt, void* logits, size_t o, int target, int V, int Vp, float dloss,
                            int write_dlogits) {
    if (target == CLASSIFIER_IGNORE) {
        for (int v = 0; v < (write_dlogits ? Vp : 0); v++) st(logits, o + v, 0.0f, dt);
        return 0.0f;
    }
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = fmaxf(mx, ld(logits, o + v, dt));
    double sum = 0.0;   // up to 50k terms: double keeps the normalizer accurate
    for (int v = 0; v < V; v++) sum += expf(ld(logits, o + v, dt) - mx);
    float lse = mx + (float)log(sum);
    float loss = lse - ld(logits, o + target, dt);
    if (write_dlogits) {
        for (int v = 0; v < V; v++) {
            float p = expf(ld(logits, o + v, dt) - lse);
            st(logits, o + v, dloss * (p - (v == target ? 1.0f : 0.0f)), dt);
        }
        for (int v = V; v < Vp; v++) st(logits, o + v, 0.0f, dt);
    }
    return loss;
}

void classifier_forward(Backend* be, DType dt, void* logits, float* losses, const int* targets, int N, int V, int Vp,
                        float dloss, int write_dlogits) {
    BACKEND_ENTRY(be, logits, losses, targets);
    for (int n = 0; n < N; n++)
        if ((targets[n] < 0 && targets[n] != CLASSIFIER_IGNORE) || targets[n] >= V)
            fail("classifier_forward: target %d at row %d outside [0, %d) (and not -1, ignored)", targets[n], n, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        losses[n] = classifier_row(dt, logits, (size_t)n * Vp, targets[n], V, Vp, dloss, write_dlogits);
}

// The vocabulary-parallel steps (kernels.h). The normalizer travels as two floats per rank and is added in
// double, so it is classifier_row's double sum up to the order of its additions.

void classifier_vocab_max(Backend* be, DType dt, float* rowmax, const void* logits, int N, int real, int Vl) {
    BACKEND_ENTRY(be, rowmax, logits);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float mx = -INFINITY;
        for (int v = 0; v < real; v++) mx = fmaxf(mx, ld(logits, (size_t)n * Vl + v, dt));
        rowmax[n] = mx;
    }
}

void classifier_vocab_sums(Backend* be, DType dt, float* stats, const void* logits, const float* rowmax,
                           const int* targets, int v0, int N, int real, int Vl) {
    BACKEND_ENTRY(be, stats, logits, rowmax, targets);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * Vl;
        double sum = 0.0;
        const int terms = targets[n] == CLASSIFIER_IGNORE ? 0 : real;   // an ignored row's stats are unused
        for (int v = 0; v < terms; v++) sum += expf(ld(logits, o + v, dt) - rowmax[n]);
        int t = targets[n] - v0;
        stats[n] = (float)sum;
        stats[N + n] = (float)(sum - (double)stats[n]);
        stats[2 * (size_t)N + n] = t >= 0 && t < real ? ld(logits, o + t, dt) : 0.0f;
    }
}

void classifier_vocab_finish(Backend* be, DType dt, void* logits, float* losses, const float* rowmax,
                             const float* all, int ranks, const int* targets, int v0, int N, int real, int Vl,
                             float dloss, int write_dlogits) {
    BACKEND_ENTRY(be, logits, losses, rowmax, all, targets);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        if (targets[n] == CLASSIFIER_IGNORE) {
            losses[n] = 0.0f;
            for (int v = 0; v < (write_dlogits ? Vl : 0); v++) st(logits, (size_t)n * Vl + v, 0.0f, dt);
            continue;
        }
        double sum = 0.0;
        float target = 0.0f;   // one rank's logit, zeros from the others
        for (int k = 0; k < ranks; k++) {
            const float* s = all + (size_t)k * 3 * N;
            sum += (double)s[n] + (double)s[N + n];
            target += s[2 * (size_t)N + n];
        }
        float lse = rowmax[n] + (float)log(sum);
        losses[n] = lse - target;
        if (!write_dlogits) continue;
        size_t o = (size_t)n * Vl;
        int t = targets[n] - v0;
        for (int v = 0; v < real; v++) {
            float p = expf(ld(logits, o + v, dt) - lse);
            st(logits, o + v, dloss * (p - (v == t ? 1.0f : 0.0f)), dt);
        }
        for (int v = real; v < Vl; v++) st(logits, o + v, 0.0f, dt);
    }
}
