// adamw_multi.cuh: the adamw_multi kernel variant (base/gpu_variants.h): the lists adamw_update_spans and
// sum_squares_spans in a few launches instead of one (AdamW) or two (sum of squares) per span. A kernel takes a
// table of spans by value (as apex's multi_tensor_apply does), kept under the 4 KB limit of kernel parameters:
// one AdamW launch per 48 spans, one pair of sum-of-squares launches per 160. Each span keeps the grid the
// per-span launcher gives it, and block b of that grid does what block b of the per-span launch does, through
// the same device functions (kernels/adamw.cuh), and the sums reach *acc in the same order: the variant's
// results are bit for bit the default's. It replaces the kernel table's two list entries.
#pragma once
#include "kernels/cuda_backend.cuh"
#include "kernels/adamw.cuh"

#define ADAMW_SPANS_PER_LAUNCH 48
#define SS_SPANS_PER_LAUNCH 160
#define SPAN_TABLE_BYTES 3584   // a table and the kernel's other parameters: under 4 KB with room to spare

// Span s of a table owns its launch's blocks [first_block[s], first_block[s + 1]).
struct SpanBlocks {
    int first;           // the span of this block
    unsigned b, count;   // this block within the span's grid of `count`
};

__device__ __forceinline__ SpanBlocks span_of_block(const int* first_block, int spans) {
    const int block = (int)blockIdx.x;
    int lo = 0, hi = spans - 1;   // the last span whose first block is at or before this one
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first_block[mid] <= block) lo = mid;
        else hi = mid - 1;
    }
    const SpanBlocks r = {lo, (unsigned)(block - first_block[lo]), (unsigned)(first_block[lo + 1] - first_block[lo])};
    return r;
}

struct AdamWSpanTable {
    void* params[ADAMW_SPANS_PER_LAUNCH];
    float* master[ADAMW_SPANS_PER_LAUNCH];
    const void* grads[ADAMW_SPANS_PER_LAUNCH];
    float* m[ADAMW_SPANS_PER_LAUNCH];
    float* v[ADAMW_SPANS_PER_LAUNCH];
    size_t n[ADAMW_SPANS_PER_LAUNCH], offset[ADAMW_SPANS_PER_LAUNCH];
    float wd[ADAMW_SPANS_PER_LAUNCH];
    int first_block[ADAMW_SPANS_PER_LAUNCH + 1];
    int count;
};
static_assert(sizeof(AdamWSpanTable) + sizeof(AdamWConsts) <= SPAN_TABLE_BYTES, "AdamW's span table is too large");

template <typename TP, typename TG>
__global__ void adamw_spans_kernel(const __grid_constant__ AdamWSpanTable t, const AdamWConsts k) {
    const SpanBlocks sb = span_of_block(t.first_block, t.count);
    const int s = sb.first;
    TP* params = (TP*)t.params[s];
    const TG* grads = (const TG*)t.grads[s];
    for (size_t i = sb.b * (size_t)blockDim.x + threadIdx.x; i < t.n[s]; i += (size_t)sb.count * blockDim.x)
        adamw_element(params, t.master[s], grads, t.m[s], t.v[s], i, t.offset[s], t.wd[s], k);
}

template <typename TP, typename TG>
static void adamw_spans_launch(Backend* be, const AdamWSpanTable* t, const AdamWConsts* k) {
    adamw_spans_kernel<TP, TG><<<t->first_block[t->count], ADAMW_BLOCK, 0, be_stream(be)>>>(*t, *k);
    LAUNCH_CHECK();
}

static void adamw_table_add(AdamWSpanTable* t, const AdamWSpan* s) {
    const int j = t->count++;
    t->params[j] = s->params;
    t->master[j] = s->master;
    t->grads[j] = s->grads;
    t->m[j] = s->m;
    t->v[j] = s->v;
    t->n[j] = s->n;
    t->offset[j] = s->offset;
    t->wd[j] = s->weight_decay;
    t->first_block[j + 1] = t->first_block[j] + adamw_blocks(s->n);
}

template <typename TP, typename TG>
static void adamw_spans_multi(Backend* be, const AdamWSpan* spans, int count, const AdamWConsts* k) {
    AdamWSpanTable t = {};
    for (int i = 0; i < count; i++) {
        if (spans[i].n == 0) continue;   // as adamw_update: nothing to do
        adamw_table_add(&t, &spans[i]);
        if (t.count < ADAMW_SPANS_PER_LAUNCH) continue;
        adamw_spans_launch<TP, TG>(be, &t, k);
        t.count = 0;
    }
    if (t.count) adamw_spans_launch<TP, TG>(be, &t, k);
}

static void adamw_update_spans_multi(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                                     const AdamWArgs* a) {
    const AdamWConsts k = adamw_consts(a);
    DISPATCH_DTYPE(param_dt, TP, DISPATCH_DTYPE(grad_dt, TG, adamw_spans_multi<TP, TG>(be, spans, count, &k)));
}

// The partials of a table's spans land in scratch at their launch-wide block index, so the final kernel
// finds span s's at first_block[s]; it adds them span by span, in order, into *acc, as the per-span final
// kernels would one after another.
struct SumSquaresTable {
    const void* x[SS_SPANS_PER_LAUNCH];
    size_t n[SS_SPANS_PER_LAUNCH];
    int first_block[SS_SPANS_PER_LAUNCH + 1];
    int count;
};
static_assert(sizeof(SumSquaresTable) + 2 * sizeof(float*) <= SPAN_TABLE_BYTES, "sum_squares' span table is too large");

template <typename T>
__global__ void __launch_bounds__(SS_BLOCK) sum_squares_spans_partial_kernel(float* partial,
                                                                             const __grid_constant__ SumSquaresTable t) {
    __shared__ float red[32];
    const SpanBlocks sb = span_of_block(t.first_block, t.count);
    const float s = sum_squares_block((const T*)t.x[sb.first], t.n[sb.first], sb.b, sb.count, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(SS_BLOCK) sum_squares_spans_final_kernel(float* acc, const float* partial,
                                                                           const __grid_constant__ SumSquaresTable t) {
    __shared__ float red[32];
    for (int s = 0; s < t.count; s++) {
        const float sum = sum_partials(partial + t.first_block[s], t.first_block[s + 1] - t.first_block[s], red);
        if (threadIdx.x == 0) *acc += sum;
    }
}

// One table: its partials (scratch holds exactly them; the previous table's final kernel, earlier on the
// stream, has read its own), then their sums into *acc.
static void sum_squares_table_launch(Backend* be, DType dt, float* acc, const SumSquaresTable* t) {
    const int blocks = t->first_block[t->count];
    float* partial = (float*)be_scratch(be, (size_t)blocks * sizeof(float), "sum_squares_spans");
    DISPATCH_DTYPE(dt, X, {
        sum_squares_spans_partial_kernel<X><<<blocks, SS_BLOCK, 0, be_stream(be)>>>(partial, *t);
        LAUNCH_CHECK();
    });
    sum_squares_spans_final_kernel<<<1, SS_BLOCK, 0, be_stream(be)>>>(acc, partial, *t);
    LAUNCH_CHECK();
}

static void sum_squares_multi(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n, int count) {
    SumSquaresTable t = {};
    for (int i = 0; i < count; i++) {
        if (n[i] == 0) continue;   // as sum_squares: nothing to add
        const int j = t.count++;
        t.x[j] = x[i];
        t.n[j] = n[i];
        t.first_block[j + 1] = t.first_block[j] + sum_squares_blocks(n[i]);
        if (t.count < SS_SPANS_PER_LAUNCH) continue;
        sum_squares_table_launch(be, dt, acc, &t);
        t.count = 0;
    }
    if (t.count) sum_squares_table_launch(be, dt, acc, &t);
}

static void adamw_multi_register(Backend* be, KernelTable* t) {
    t->adamw_update_spans = adamw_update_spans_multi;
    t->sum_squares_spans = sum_squares_multi;
}
