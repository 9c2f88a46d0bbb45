// classifier.c: fused softmax cross-entropy over the LM head's logits (CPU twin).
#include "kernels/cpu_common.h"

// One row: the loss, and optionally the row's dlogits written over its logits. Only the row's scalars
// are kept: each probability is recomputed from its logit when it is needed.
static float classifier_row(DType dt, void* logits, size_t o, int target, int V, int Vp, float dloss,
                            int write_dlogits) {
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
    (void)be;
    for (int n = 0; n < N; n++)
        if (targets[n] < 0 || targets[n] >= V) fail("classifier_forward: target %d at row %d outside [0, %d)", targets[n], n, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        losses[n] = classifier_row(dt, logits, (size_t)n * Vp, targets[n], V, Vp, dloss, write_dlogits);
}
