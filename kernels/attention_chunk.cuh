// attention_chunk.cuh: attention of a query chunk against a key/value chunk at global offsets, the log-sum-exp
// merge of two partial results, and the chunk pair's accumulating backward (kernels.h: attention_chunk_forward,
// attention_lse_merge, attention_chunk_backward). Simple and deterministic: one warp per output row (a query
// row, or in the backward a key row), each lane holding head dims lane, lane + 32, ...; dot products are
// butterfly warp sums, and every row's sum runs over its keys (queries) in increasing order, so no two warps
// write one element and the bits do not depend on the schedule.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/attention_common.cuh"

constexpr int CHUNK_WARPS = 4;   // rows a block
constexpr int CHUNK_DIMS = 4;   // head dims a lane: D <= 128

// Shapes and offsets (kernels.h): q, out, dq (B,Tq,NH*D); kv, dkv (B,Tk,2*KV*D), k before v; lse (B,NH,Tq);
// doc (B,Tq) or NULL, each query's document start in the sequence's positions.
struct ChunkDims {
    int B, Tq, Tk, q0, k0, NH, KV, D;
    float scale;
    const int* doc;
};

// The last key query t attends (-1: none here), the first query that attends key j (Tq: none).
__device__ __forceinline__ int chunk_last_key(const ChunkDims& s, int t) {
    const long long last = (long long)s.q0 + t - s.k0;
    return last < 0 ? -1 : last >= s.Tk ? s.Tk - 1 : (int)last;
}
// The first key query t of row b attends: its document's first position on this chunk's keys (Tk: none here).
__device__ __forceinline__ int chunk_first_key(const ChunkDims& s, int b, int t) {
    if (!s.doc) return 0;
    const long long first = (long long)s.doc[(size_t)b * s.Tq + t] - s.k0;
    return first <= 0 ? 0 : first > s.Tk ? s.Tk : (int)first;
}
__device__ __forceinline__ int chunk_first_query(const ChunkDims& s, int j) {
    const long long first = (long long)s.k0 + j - s.q0;
    return first <= 0 ? 0 : first >= s.Tq ? s.Tq : (int)first;
}
__device__ __forceinline__ size_t chunk_q_at(const ChunkDims& s, int b, int t, int h) {
    return (((size_t)b * s.Tq + t) * s.NH + h) * s.D;
}
__device__ __forceinline__ size_t chunk_k_at(const ChunkDims& s, int b, int j, int kh) {
    return (((size_t)b * s.Tk + j) * 2 * s.KV + kh) * s.D;
}
__device__ __forceinline__ size_t chunk_lse_at(const ChunkDims& s, int b, int h, int t) {
    return ((size_t)b * s.NH + h) * s.Tq + t;
}

// The lane's head dims of one head vector (0 past D), and the dot product of two such (every lane gets it).
template <typename X>
__device__ __forceinline__ void chunk_load(float (&r)[CHUNK_DIMS], const X* p, int D) {
    const int lane = threadIdx.x % 32;
    for (int k = 0; k < CHUNK_DIMS; k++) r[k] = lane + 32 * k < D ? to_f(p[lane + 32 * k]) : 0.0f;
}
__device__ __forceinline__ float chunk_dot(const float (&a)[CHUNK_DIMS], const float (&b)[CHUNK_DIMS]) {
    float x = 0.0f;
    for (int k = 0; k < CHUNK_DIMS; k++) x += a[k] * b[k];
    return warp_sum(x);
}
// p[d] += scale * acc (the accumulating outputs), or p[d] = scale * acc with ADD false.
template <bool ADD, typename X>
__device__ __forceinline__ void chunk_store(X* p, const float (&acc)[CHUNK_DIMS], float scale, int D) {
    const int lane = threadIdx.x % 32;
    for (int k = 0; k < CHUNK_DIMS; k++)
        if (lane + 32 * k < D) p[lane + 32 * k] = from_f<X>((ADD ? to_f(p[lane + 32 * k]) : 0.0f) + acc[k] * scale);
}

// One warp per query row r = (b*NH + h)*Tq + t, online softmax over its keys in increasing order.
template <typename X>
__global__ void chunk_forward_kernel(X* out, float* lse, const X* q, const X* kv, ChunkDims s) {
    const long long r = (long long)blockIdx.x * CHUNK_WARPS + threadIdx.x / 32;
    if (r >= (long long)s.B * s.NH * s.Tq) return;   // the whole warp: r is the warp's
    const int t = (int)(r % s.Tq), h = (int)(r / s.Tq % s.NH), b = (int)(r / ((long long)s.Tq * s.NH));
    const int kh = h / (s.NH / s.KV), first = chunk_first_key(s, b, t), last = chunk_last_key(s, t);
    float qr[CHUNK_DIMS], kr[CHUNK_DIMS], vr[CHUNK_DIMS], acc[CHUNK_DIMS] = {};
    chunk_load(qr, q + chunk_q_at(s, b, t, h), s.D);
    float m = -INFINITY, l = 0.0f;
    for (int j = first; j <= last; j++) {
        const X* k = kv + chunk_k_at(s, b, j, kh);
        chunk_load(kr, k, s.D);
        chunk_load(vr, k + (size_t)s.KV * s.D, s.D);
        const float score = chunk_dot(qr, kr) * s.scale, mn = fmaxf(m, score);
        const float c = expf(m - mn), p = expf(score - mn);   // c = 0 at the first key (m = -inf)
        l = l * c + p;
        for (int i = 0; i < CHUNK_DIMS; i++) acc[i] = acc[i] * c + p * vr[i];
        m = mn;
    }
    chunk_store<false>(out + chunk_q_at(s, b, t, h), acc, first > last ? 0.0f : 1.0f / l, s.D);
    if (threadIdx.x % 32 == 0) lse[chunk_lse_at(s, b, h, t)] = first > last ? -INFINITY : m + logf(l);
}

// One warp per row r = (b*T + t)*NH + h of out: every lane reads the two lse before lane 0 writes the merged one.
template <typename X>
__global__ void chunk_merge_kernel(X* out, float* lse, const X* out2, const float* lse2, int B, int T, int NH, int D) {
    const long long r = (long long)blockIdx.x * CHUNK_WARPS + threadIdx.x / 32;
    if (r >= (long long)B * T * NH) return;
    const int lane = threadIdx.x % 32, h = (int)(r % NH), t = (int)(r / NH % T), b = (int)(r / ((long long)NH * T));
    const size_t lo = ((size_t)b * NH + h) * T + t, o = (size_t)r * D;
    const float l1 = lse[lo], l2 = lse2[lo], m = fmaxf(l1, l2);
    __syncwarp();
    if (m == -INFINITY) {   // neither side attended a key: exp(-inf - -inf) would be NaN
        for (int d = lane; d < D; d += 32) out[o + d] = from_f<X>(0.0f);
        return;
    }
    const float w1 = expf(l1 - m), w2 = expf(l2 - m), w = w1 + w2;
    for (int d = lane; d < D; d += 32) out[o + d] = from_f<X>((w1 * to_f(out[o + d]) + w2 * to_f(out2[o + d])) / w);
    if (lane == 0) lse[lo] = m + logf(w);
}

// The pair's p and ds (kernels.h): p = exp(q.k scale - lse), ds = p (dout.v - rowsum(dout * out)).
struct ChunkGrad {
    float p, ds;
};
__device__ __forceinline__ ChunkGrad chunk_grad(const float (&qr)[CHUNK_DIMS], const float (&kr)[CHUNK_DIMS],
                                                const float (&dor)[CHUNK_DIMS], const float (&vr)[CHUNK_DIMS],
                                                float lse, float drow, float scale) {
    const float p = expf(chunk_dot(qr, kr) * scale - lse);
    return {p, p * (chunk_dot(dor, vr) - drow)};
}

// One warp per query row: dq_i += scale * sum_{first <= j <= last} ds_ij k_j; a row with no key here (its lse
// may be -inf) adds nothing.
template <typename X>
__global__ void chunk_dq_kernel(X* dq, const X* dout, const X* q, const X* kv, const X* out, const float* lse,
                                ChunkDims s) {
    const long long r = (long long)blockIdx.x * CHUNK_WARPS + threadIdx.x / 32;
    if (r >= (long long)s.B * s.NH * s.Tq) return;
    const int t = (int)(r % s.Tq), h = (int)(r / s.Tq % s.NH), b = (int)(r / ((long long)s.Tq * s.NH));
    const int kh = h / (s.NH / s.KV), first = chunk_first_key(s, b, t), last = chunk_last_key(s, t);
    if (first > last) return;
    const size_t qo = chunk_q_at(s, b, t, h);
    float qr[CHUNK_DIMS], dor[CHUNK_DIMS], kr[CHUNK_DIMS], vr[CHUNK_DIMS], acc[CHUNK_DIMS] = {};
    chunk_load(qr, q + qo, s.D);
    chunk_load(dor, dout + qo, s.D);
    chunk_load(vr, out + qo, s.D);
    const float drow = chunk_dot(dor, vr), L = lse[chunk_lse_at(s, b, h, t)];
    for (int j = first; j <= last; j++) {
        const X* k = kv + chunk_k_at(s, b, j, kh);
        chunk_load(kr, k, s.D);
        chunk_load(vr, k + (size_t)s.KV * s.D, s.D);
        const ChunkGrad g = chunk_grad(qr, kr, dor, vr, L, drow, s.scale);
        for (int i = 0; i < CHUNK_DIMS; i++) acc[i] += g.ds * kr[i];
    }
    chunk_store<true>(dq + qo, acc, s.scale, s.D);
}

// One warp per key row (b, kh, j): dk_j += scale * sum ds_ij q_i, dv_j += sum p_ij dout_i over the query heads of
// kv head kh in increasing h, and the queries that attend j (causally, in its document) in increasing i.
template <typename X>
__global__ void chunk_dkv_kernel(X* dkv, const X* dout, const X* q, const X* kv, const X* out, const float* lse,
                                 ChunkDims s) {
    const long long r = (long long)blockIdx.x * CHUNK_WARPS + threadIdx.x / 32;
    if (r >= (long long)s.B * s.KV * s.Tk) return;
    const int j = (int)(r % s.Tk), kh = (int)(r / s.Tk % s.KV), b = (int)(r / ((long long)s.Tk * s.KV));
    const int first = chunk_first_query(s, j), R = s.NH / s.KV;
    if (first >= s.Tq) return;
    const size_t ko = chunk_k_at(s, b, j, kh), vo = ko + (size_t)s.KV * s.D;
    float kr[CHUNK_DIMS], vr[CHUNK_DIMS], qr[CHUNK_DIMS], dor[CHUNK_DIMS], outr[CHUNK_DIMS];
    float acck[CHUNK_DIMS] = {}, accv[CHUNK_DIMS] = {};
    chunk_load(kr, kv + ko, s.D);
    chunk_load(vr, kv + vo, s.D);
    for (int h = kh * R; h < (kh + 1) * R; h++)
        for (int i = first; i < s.Tq; i++) {
            if (s.doc && s.doc[(size_t)b * s.Tq + i] > s.k0 + j) continue;   // the warp's: i is the warp's
            const size_t qo = chunk_q_at(s, b, i, h);
            chunk_load(qr, q + qo, s.D);
            chunk_load(dor, dout + qo, s.D);
            chunk_load(outr, out + qo, s.D);
            const ChunkGrad g =
                chunk_grad(qr, kr, dor, vr, lse[chunk_lse_at(s, b, h, i)], chunk_dot(dor, outr), s.scale);
            for (int c = 0; c < CHUNK_DIMS; c++) {
                acck[c] += g.ds * qr[c];
                accv[c] += g.p * dor[c];
            }
        }
    chunk_store<true>(dkv + ko, acck, s.scale, s.D);
    chunk_store<true>(dkv + vo, accv, 1.0f, s.D);
}

static ChunkDims chunk_dims(const char* who, const int* doc, int B, int Tq, int Tk, int q0, int k0, int NH, int KV,
                            int D) {
    attention_check_shape(NH, KV, D, who);
    if (B < 0 || Tq < 0 || Tk < 0 || q0 < 0 || k0 < 0)
        fail("%s: negative size or offset (B=%d Tq=%d Tk=%d q0=%d k0=%d)", who, B, Tq, Tk, q0, k0);
    return {B, Tq, Tk, q0, k0, NH, KV, D, 1.0f / sqrtf((float)D), doc};
}

extern "C" void attention_chunk_forward(Backend* be, DType dt, void* out, float* lse, const void* q, const void* kv,
                                        const int* doc, int B, int Tq, int Tk, int q0, int k0, int NH, int KV, int D) {
    const ChunkDims s = chunk_dims("attention_chunk_forward", doc, B, Tq, Tk, q0, k0, NH, KV, D);
    const long long rows = (long long)B * NH * Tq;
    if (rows == 0) return;
    DISPATCH_DTYPE(dt, X, {
        chunk_forward_kernel<X><<<ceil_div(rows, CHUNK_WARPS), CHUNK_WARPS * 32, 0, be_stream(be)>>>(
            (X*)out, lse, (const X*)q, (const X*)kv, s);
        LAUNCH_CHECK();
    });
}

extern "C" void attention_lse_merge(Backend* be, DType dt, void* out, float* lse, const void* out2, const float* lse2,
                                    int B, int T, int NH, int D) {
    if (B < 0 || T < 0 || NH <= 0 || D <= 0) fail("attention_lse_merge: bad shape B=%d T=%d NH=%d D=%d", B, T, NH, D);
    const long long rows = (long long)B * T * NH;
    if (rows == 0) return;
    DISPATCH_DTYPE(dt, X, {
        chunk_merge_kernel<X><<<ceil_div(rows, CHUNK_WARPS), CHUNK_WARPS * 32, 0, be_stream(be)>>>(
            (X*)out, lse, (const X*)out2, lse2, B, T, NH, D);
        LAUNCH_CHECK();
    });
}

extern "C" void attention_chunk_backward(Backend* be, DType dt, void* dq, void* dkv, const void* dout, const void* q,
                                         const void* kv, const void* out, const float* lse, const int* doc, int B,
                                         int Tq, int Tk, int q0, int k0, int NH, int KV, int D) {
    const ChunkDims s = chunk_dims("attention_chunk_backward", doc, B, Tq, Tk, q0, k0, NH, KV, D);
    const long long qrows = (long long)B * NH * Tq, krows = (long long)B * KV * Tk;
    if (qrows == 0 || krows == 0) return;
    DISPATCH_DTYPE(dt, X, {
        chunk_dq_kernel<X><<<ceil_div(qrows, CHUNK_WARPS), CHUNK_WARPS * 32, 0, be_stream(be)>>>(
            (X*)dq, (const X*)dout, (const X*)q, (const X*)kv, (const X*)out, lse, s);
        LAUNCH_CHECK();
        chunk_dkv_kernel<X><<<ceil_div(krows, CHUNK_WARPS), CHUNK_WARPS * 32, 0, be_stream(be)>>>(
            (X*)dkv, (const X*)dout, (const X*)q, (const X*)kv, (const X*)out, lse, s);
        LAUNCH_CHECK();
    });
}
