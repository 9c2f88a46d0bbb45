// adamw.c: the AdamW step over one parameter span, and the deterministic sum of squares (CPU twins).
#include <stdlib.h>

#include "kernels/adamw_host.h"
#include "kernels/cpu_common.h"

// The arithmetic is adamw_host's, shared with the optimizer's update of offloaded state.
void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                  float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    (void)be;
    adamw_host(params, param_dt, master, grads, grad_dt, m, v, n, offset, a);
}

#define SQ_CHUNK 65536   // fixed partition: the partial sums and their order do not depend on threads

void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    (void)be;
    size_t nchunks = (n + SQ_CHUNK - 1) / SQ_CHUNK;
    double* part = xmalloc(sizeof(double) * (nchunks ? nchunks : 1));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i1 = (k + 1) * SQ_CHUNK < n ? (k + 1) * SQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = k * SQ_CHUNK; i < i1; i++) {
            double e = ld(x, i, dt);
            s += e * e;
        }
        part[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nchunks; k++) total += part[k];
    free(part);
    *acc += (float)total;
}
