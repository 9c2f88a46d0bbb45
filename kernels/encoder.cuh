// encoder.cuh: token + position embedding, forward and backward.
// The backward is deterministic without atomics: the (token, position) pairs are stably sorted by token
// (cub's radix sort), and every run of equal tokens is summed by one thread block in position order, so
// each dwte row has exactly one writer and one summation order.
#pragma once
#include "kernels/cuda_backend.cuh"
#include <cub/device/device_radix_sort.cuh>

// out (B,T,C) = wte[tokens] (Vp,C) + wpe[t] (maxT,C); one 16-byte pack per thread. C % pack == 0.
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int B, int T_, int C) {
    constexpr int P = Pack128<T>::size;
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)B * T_ * C) return;
    const size_t bt = idx / C;
    const int c = (int)(idx % C), t = (int)(bt % T_);
    const Pack128<T> e = load128(wte + (size_t)tokens[bt] * C + c);
    const Pack128<T> p = load128(wpe + (size_t)t * C + c);
    Pack128<T> o;
    for (int k = 0; k < P; k++) o.set(k, e.get(k) + p.get(k));
    store128(out + idx, o);
}

// dwpe[t] (T,C) += sum over b of dout[b,t]; one thread per (t, pack), b summed in order.
template <typename T>
__global__ void encoder_backward_wpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    constexpr int P = Pack128<T>::size;
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)T_ * C) return;
    float acc[P];
    for (int k = 0; k < P; k++) acc[k] = 0.0f;
    for (int b = 0; b < B; b++) {
        const Pack128<T> d = load128(dout + (size_t)b * T_ * C + idx);
        for (int k = 0; k < P; k++) acc[k] += d.get(k);
    }
    Pack128<T> w = load128(dwpe + idx);
    for (int k = 0; k < P; k++) w.set(k, w.get(k) + acc[k]);
    store128(dwpe + idx, w);
}

__global__ void encoder_iota_kernel(int* pos, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) pos[i] = i;
}

// One block per sorted index i; only the first index of a run of equal tokens does work: it walks the run
// (positions in increasing order, the sort is stable) and adds the sum into that token's dwte row.
// Threads stride over the channels in packs.
template <typename T>
__global__ void encoder_backward_wte_kernel(T* dwte, const T* dout, const int* sorted_tok, const int* sorted_pos,
                                            int N, int C) {
    constexpr int P = Pack128<T>::size;
    const int i = blockIdx.x;
    const int tok = sorted_tok[i];
    if (i > 0 && sorted_tok[i - 1] == tok) return;
    int end = i + 1;
    while (end < N && sorted_tok[end] == tok) end++;
    for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
        float acc[P];
        for (int k = 0; k < P; k++) acc[k] = 0.0f;
        for (int j = i; j < end; j++) {
            const Pack128<T> d = load128(dout + (size_t)sorted_pos[j] * C + c);
            for (int k = 0; k < P; k++) acc[k] += d.get(k);
        }
        Pack128<T> w = load128(dwte + (size_t)tok * C + c);
        for (int k = 0; k < P; k++) w.set(k, w.get(k) + acc[k]);
        store128(dwte + (size_t)tok * C + c, w);
    }
}

extern "C" void encoder_forward(Backend* be, DType dt, void* out, const int* tokens, const int* pos, const void* wte,
                                const void* wpe, int B, int T, int C) {
    if (pos) fail("encoder_forward: positions (pos) are not yet supported by the CUDA kernels");
    if (C % 8 != 0) fail("encoder_forward: C=%d must be a multiple of 8", C);
    DISPATCH_DTYPE(dt, X, {
        const int block = 256;
        const size_t packs = (size_t)B * T * C / Pack128<X>::size;
        encoder_forward_kernel<X><<<ceil_div(packs, block), block, 0, be_stream(be)>>>(
            (X*)out, tokens, (const X*)wte, (const X*)wpe, B, T, C);
        LAUNCH_CHECK();
    });
}

extern "C" void encoder_backward(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens,
                                 const int* pos, int B, int T, int C) {
    if (pos) fail("encoder_backward: positions (pos) are not yet supported by the CUDA kernels");
    if (C % 8 != 0) fail("encoder_backward: C=%d must be a multiple of 8", C);
    const int N = B * T;
    // Scratch: sorted tokens, positions in and out, then cub's temporary storage.
    size_t cub_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, (const int*)NULL, (int*)NULL, (const int*)NULL,
                                               (int*)NULL, N, 0, 32, be_stream(be)));
    const size_t ints = ((size_t)3 * N + 63) / 64 * 64;   // keeps cub's storage 256-byte aligned
    int* s = (int*)be_scratch(be, ints * sizeof(int) + cub_bytes, "encoder_backward");
    int* sorted_tok = s;
    int* index = s + N;
    int* sorted_pos = s + 2 * N;
    void* cub_tmp = s + ints;
    encoder_iota_kernel<<<ceil_div(N, 256), 256, 0, be_stream(be)>>>(index, N);
    LAUNCH_CHECK();
    // Tokens are non-negative ids below 2^31: sorting all 32 bits keeps the code independent of V.
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, tokens, sorted_tok, index, sorted_pos, N, 0, 32,
                                               be_stream(be)));
    DISPATCH_DTYPE(dt, X, {
        constexpr int P = Pack128<X>::size;
        const int threads = C / P < 256 ? ((C / P + 31) / 32) * 32 : 256;
        encoder_backward_wte_kernel<X><<<N, threads, 0, be_stream(be)>>>((X*)dwte, (const X*)dout, sorted_tok,
                                                                         sorted_pos, N, C);
        LAUNCH_CHECK();
        if (dwpe) {
            const size_t packs = (size_t)T * C / P;
            encoder_backward_wpe_kernel<X><<<ceil_div(packs, 256), 256, 0, be_stream(be)>>>((X*)dwpe, (const X*)dout, B, T, C);
            LAUNCH_CHECK();
        }
    });
}

// ---------------------------------------------------------------------------------------------------
// The vocabulary-parallel embedding (kernels.h): this rank's wte rows are [v0, v0 + Vl).

// out (B,T,C) = (token in range ? wte[token - v0] : 0) + (wpe ? wpe[t] : 0); one 16-byte pack per thread.
template <typename T>
__global__ void encoder_forward_vocab_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int v0, int Vl,
                                             int B, int T_, int C) {
    constexpr int P = Pack128<T>::size;
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)B * T_ * C) return;
    const size_t bt = idx / C;
    const int c = (int)(idx % C), t = (int)(bt % T_), row = tokens[bt] - v0;
    float v[P];
    for (int k = 0; k < P; k++) v[k] = 0.0f;
    if (row >= 0 && row < Vl) {
        const Pack128<T> e = load128(wte + (size_t)row * C + c);
        for (int k = 0; k < P; k++) v[k] = e.get(k);
    }
    if (wpe) {
        const Pack128<T> p = load128(wpe + (size_t)t * C + c);
        for (int k = 0; k < P; k++) v[k] += p.get(k);
    }
    Pack128<T> o;
    for (int k = 0; k < P; k++) o.set(k, v[k]);
    store128(out + idx, o);
}

// The sort key of each position: its row in this rank's shard, or Vl (sorted last, skipped) when the token is
// another rank's.
__global__ void encoder_vocab_keys_kernel(int* keys, const int* tokens, int v0, int Vl, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int row = tokens[i] - v0;
    keys[i] = row >= 0 && row < Vl ? row : Vl;
}

// encoder_backward_wte_kernel over the sorted keys, skipping the run of other ranks' tokens (key Vl).
template <typename T>
__global__ void encoder_backward_vocab_wte_kernel(T* dwte, const T* dout, const int* sorted_row, const int* sorted_pos,
                                                  int N, int C, int Vl) {
    constexpr int P = Pack128<T>::size;
    const int i = blockIdx.x;
    const int row = sorted_row[i];
    if (row == Vl || (i > 0 && sorted_row[i - 1] == row)) return;
    int end = i + 1;
    while (end < N && sorted_row[end] == row) end++;
    for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
        float acc[P];
        for (int k = 0; k < P; k++) acc[k] = 0.0f;
        for (int j = i; j < end; j++) {
            const Pack128<T> d = load128(dout + (size_t)sorted_pos[j] * C + c);
            for (int k = 0; k < P; k++) acc[k] += d.get(k);
        }
        Pack128<T> w = load128(dwte + (size_t)row * C + c);
        for (int k = 0; k < P; k++) w.set(k, w.get(k) + acc[k]);
        store128(dwte + (size_t)row * C + c, w);
    }
}

extern "C" void encoder_forward_vocab(Backend* be, DType dt, void* out, const int* tokens, const int* pos,
                                      const void* wte, const void* wpe, int v0, int Vl, int B, int T, int C) {
    if (pos) fail("encoder_forward_vocab: positions (pos) are not yet supported by the CUDA kernels");
    if (C % 8 != 0) fail("encoder_forward_vocab: C=%d must be a multiple of 8", C);
    DISPATCH_DTYPE(dt, X, {
        const int block = 256;
        const size_t packs = (size_t)B * T * C / Pack128<X>::size;
        encoder_forward_vocab_kernel<X><<<ceil_div(packs, block), block, 0, be_stream(be)>>>(
            (X*)out, tokens, (const X*)wte, (const X*)wpe, v0, Vl, B, T, C);
        LAUNCH_CHECK();
    });
}

extern "C" void encoder_backward_vocab(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout,
                                       const int* tokens, const int* pos, int v0, int Vl, int B, int T, int C) {
    if (pos) fail("encoder_backward_vocab: positions (pos) are not yet supported by the CUDA kernels");
    if (C % 8 != 0) fail("encoder_backward_vocab: C=%d must be a multiple of 8", C);
    const int N = B * T;
    // Scratch: keys, sorted keys, positions in and out, then cub's temporary storage.
    size_t cub_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, (const int*)NULL, (int*)NULL, (const int*)NULL,
                                               (int*)NULL, N, 0, 32, be_stream(be)));
    const size_t ints = ((size_t)4 * N + 63) / 64 * 64;   // keeps cub's storage 256-byte aligned
    int* s = (int*)be_scratch(be, ints * sizeof(int) + cub_bytes, "encoder_backward_vocab");
    int* keys = s;
    int* sorted_row = s + N;
    int* index = s + 2 * N;
    int* sorted_pos = s + 3 * N;
    void* cub_tmp = s + ints;
    encoder_iota_kernel<<<ceil_div(N, 256), 256, 0, be_stream(be)>>>(index, N);
    LAUNCH_CHECK();
    encoder_vocab_keys_kernel<<<ceil_div(N, 256), 256, 0, be_stream(be)>>>(keys, tokens, v0, Vl, N);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys, sorted_row, index, sorted_pos, N, 0, 32,
                                               be_stream(be)));
    DISPATCH_DTYPE(dt, X, {
        constexpr int P = Pack128<X>::size;
        const int threads = C / P < 256 ? ((C / P + 31) / 32) * 32 : 256;
        encoder_backward_vocab_wte_kernel<X><<<N, threads, 0, be_stream(be)>>>((X*)dwte, (const X*)dout, sorted_row,
                                                                               sorted_pos, N, C, Vl);
        LAUNCH_CHECK();
        if (dwpe) {
            const size_t packs = (size_t)T * C / P;
            encoder_backward_wpe_kernel<X><<<ceil_div(packs, 256), 256, 0, be_stream(be)>>>((X*)dwpe, (const X*)dout, B, T, C);
            LAUNCH_CHECK();
        }
    });
}
