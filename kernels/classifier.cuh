// classifier.cuh: fused softmax + cross-entropy + dlogits over the (padded) vocabulary.
// One block per row. Pass 1 keeps a running (max, scaled sum) per thread (online softmax), combined once
// across the block; pass 2 rereads the row (from L2) to overwrite it with the gradient. No probabilities
// are stored anywhere. A row whose target is -1 (ignored) does none of this: loss 0, a zero dlogits row. -tp's vocabulary-parallel head splits this into three kernels (classifier_vocab_max,
// _sums, _finish), with the group's max and all-gather between them, since no rank holds a whole row.
#pragma once
#include "kernels/cuda_backend.cuh"

#define CLS_BLOCK 512

template <typename T, bool VEC>
__global__ void __launch_bounds__(CLS_BLOCK) classifier_kernel(T* logits, float* losses, const int* targets, int V,
                                                               int Vp, float dloss, int write_dlogits) {
    constexpr int P = VEC ? Pack128<T>::size : 1;
    __shared__ float red[32];
    const int row = blockIdx.x;
    T* x = logits + (size_t)row * Vp;
    const int tgt = targets[row];
    if (tgt == CLASSIFIER_IGNORE) {   // not a label: loss 0, a zero gradient row
        if (threadIdx.x == 0) losses[row] = 0.0f;
        for (int c = threadIdx.x; c < (write_dlogits ? Vp : 0); c += blockDim.x) x[c] = from_f<T>(0.0f);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int c0 = threadIdx.x * P; c0 < V; c0 += blockDim.x * P) {
        float v[P];
        if (VEC) {
            const Pack128<T> p = load128(x + c0);
            for (int k = 0; k < P; k++) v[k] = c0 + k < V ? p.get(k) : -INFINITY;
        } else {
            v[0] = to_f(x[c0]);
        }
        float pm = v[0];
        for (int k = 1; k < P; k++) pm = fmaxf(pm, v[k]);
        if (pm > m) {
            s *= expf(m - pm);   // m == -inf only while s == 0: exp(-inf) = 0 keeps it 0
            m = pm;
        }
        for (int k = 0; k < P; k++) s += expf(v[k] - m);
    }
    const float M = block_max(m, red);
    const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), red);
    const float lse = M + logf(S);
    if (threadIdx.x == 0) losses[row] = lse - to_f(x[tgt]);
    if (!write_dlogits) return;
    __syncthreads();   // x[tgt] is read above before any thread overwrites it
    for (int c0 = threadIdx.x * P; c0 < Vp; c0 += blockDim.x * P) {
        if (VEC) {
            Pack128<T> p = load128(x + c0);
            for (int k = 0; k < P; k++) {
                const int c = c0 + k;
                p.set(k, c < V ? dloss * (expf(p.get(k) - lse) - (c == tgt ? 1.0f : 0.0f)) : 0.0f);
            }
            store128(x + c0, p);
        } else {
            x[c0] = from_f<T>(c0 < V ? dloss * (expf(to_f(x[c0]) - lse) - (c0 == tgt ? 1.0f : 0.0f)) : 0.0f);
        }
    }
}

extern "C" void classifier_forward(Backend* be, DType dt, void* logits, float* losses, const int* targets, int N, int V,
                                   int Vp, float dloss, int write_dlogits) {
    if (N <= 0) return;
    if (V <= 0 || V > Vp) fail("classifier_forward: need 0 < V <= Vp (V=%d Vp=%d)", V, Vp);
    const bool vec = aligned16(logits) && ((size_t)Vp * dtype_size(dt)) % 16 == 0;
    DISPATCH_DTYPE(dt, X, {
        if (vec)
            classifier_kernel<X, true><<<N, CLS_BLOCK, 0, be_stream(be)>>>((X*)logits, losses, targets, V, Vp, dloss,
                                                                           write_dlogits);
        else
            classifier_kernel<X, false><<<N, CLS_BLOCK, 0, be_stream(be)>>>((X*)logits, losses, targets, V, Vp, dloss,
                                                                            write_dlogits);
        LAUNCH_CHECK();
    });
}

// ---------------------------------------------------------------------------------------------------
// The vocabulary-parallel cross-entropy (kernels.h): one block per row for each step, scalar loads (a rank's
// Vl columns need not keep 16-byte packs aligned). Exactly three passes over the rank's logits: max, sums,
// and (with dlogits) the rewrite.

template <typename T>
__global__ void __launch_bounds__(CLS_BLOCK) classifier_vocab_max_kernel(float* rowmax, const T* logits, int real, int Vl) {
    __shared__ float red[32];
    const T* x = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < real; c += blockDim.x) m = fmaxf(m, to_f(x[c]));
    m = block_max(m, red);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

template <typename T>
__global__ void __launch_bounds__(CLS_BLOCK) classifier_vocab_sums_kernel(float* stats, const T* logits,
                                                                          const float* rowmax, const int* targets,
                                                                          int v0, int N, int real, int Vl) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    const T* x = logits + (size_t)row * Vl;
    const float M = rowmax[row];
    float s = 0.0f;
    for (int c = threadIdx.x; c < real; c += blockDim.x) s += expf(to_f(x[c]) - M);
    s = block_sum(s, red);
    if (threadIdx.x == 0) {   // a float sum: lo is 0
        const int t = targets[row] - v0;
        stats[row] = s;
        stats[N + row] = 0.0f;
        stats[2 * (size_t)N + row] = t >= 0 && t < real ? to_f(x[t]) : 0.0f;
    }
}

template <typename T>
__global__ void __launch_bounds__(CLS_BLOCK) classifier_vocab_finish_kernel(T* logits, float* losses,
                                                                            const float* rowmax, const float* all,
                                                                            int ranks, const int* targets, int v0,
                                                                            int N, int real, int Vl, float dloss,
                                                                            int write_dlogits) {
    const int row = blockIdx.x;
    T* x = logits + (size_t)row * Vl;
    if (targets[row] == CLASSIFIER_IGNORE) {   // not a label: loss 0, a zero gradient row
        if (threadIdx.x == 0) losses[row] = 0.0f;
        for (int c = threadIdx.x; c < (write_dlogits ? Vl : 0); c += blockDim.x) x[c] = from_f<T>(0.0f);
        return;
    }
    double sum = 0.0;   // every thread adds the ranks' few scalars itself: no shared memory, same order
    float target = 0.0f;
    for (int k = 0; k < ranks; k++) {
        const float* s = all + (size_t)k * 3 * N;
        sum += (double)s[row] + (double)s[N + row];
        target += s[2 * (size_t)N + row];
    }
    const float lse = rowmax[row] + (float)log(sum);
    if (threadIdx.x == 0) losses[row] = lse - target;
    if (!write_dlogits) return;
    const int t = targets[row] - v0;
    for (int c = threadIdx.x; c < Vl; c += blockDim.x)
        x[c] = from_f<T>(c < real ? dloss * (expf(to_f(x[c]) - lse) - (c == t ? 1.0f : 0.0f)) : 0.0f);
}

static void classifier_vocab_check(const char* who, int N, int real, int Vl) {
    if (N < 0 || real < 0 || real > Vl) fail("%s: need 0 <= real <= Vl (N=%d real=%d Vl=%d)", who, N, real, Vl);
}

extern "C" void classifier_vocab_max(Backend* be, DType dt, float* rowmax, const void* logits, int N, int real, int Vl) {
    classifier_vocab_check("classifier_vocab_max", N, real, Vl);
    if (N == 0) return;
    DISPATCH_DTYPE(dt, X, {
        classifier_vocab_max_kernel<X><<<N, CLS_BLOCK, 0, be_stream(be)>>>(rowmax, (const X*)logits, real, Vl);
        LAUNCH_CHECK();
    });
}

extern "C" void classifier_vocab_sums(Backend* be, DType dt, float* stats, const void* logits, const float* rowmax,
                                      const int* targets, int v0, int N, int real, int Vl) {
    classifier_vocab_check("classifier_vocab_sums", N, real, Vl);
    if (N == 0) return;
    DISPATCH_DTYPE(dt, X, {
        classifier_vocab_sums_kernel<X><<<N, CLS_BLOCK, 0, be_stream(be)>>>(stats, (const X*)logits, rowmax, targets, v0,
                                                                            N, real, Vl);
        LAUNCH_CHECK();
    });
}

extern "C" void classifier_vocab_finish(Backend* be, DType dt, void* logits, float* losses, const float* rowmax,
                                        const float* all, int ranks, const int* targets, int v0, int N, int real,
                                        int Vl, float dloss, int write_dlogits) {
    classifier_vocab_check("classifier_vocab_finish", N, real, Vl);
    if (ranks < 1) fail("classifier_vocab_finish: %d ranks", ranks);
    if (N == 0) return;
    DISPATCH_DTYPE(dt, X, {
        classifier_vocab_finish_kernel<X><<<N, CLS_BLOCK, 0, be_stream(be)>>>((X*)logits, losses, rowmax, all, ranks,
                                                                              targets, v0, N, real, Vl, dloss,
                                                                              write_dlogits);
        LAUNCH_CHECK();
    });
}
