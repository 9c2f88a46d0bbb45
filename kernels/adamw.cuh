// adamw.cuh: the AdamW update over one span of parameters, and the deterministic sum of squares used
// for the global gradient norm; and their lists (adamw_update_spans, sum_squares_spans), which under the
// adamw_multi variant cover many spans per launch with the per-span calls' bits.
#pragma once

// The per-call constants of one AdamW step (bias corrections bc1, bc2 computed on the host).
struct AdamWConsts {
    float lr, beta1, beta2, eps, grad_scale, bc1, bc2;
    uint32_t seed;
};

// Element i of a span: the one AdamW expression of both launchers, so the variant's bits are the default's.
// bf16 params are rounded stochastically with exactly the CPU twin's noise (dtype.h), so a parameter gets
// the same bits on every rank and in both builds.
template <typename TP, typename TG>
__device__ __forceinline__ void adamw_element(TP* params, float* master, const TG* grads, float* m, float* v, size_t i,
                                              size_t offset, float wd, const AdamWConsts& k) {
    const float g = to_f(grads[i]) * k.grad_scale;
    const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    const float mhat = mi / k.bc1, vhat = vi / k.bc2;
    const float w = master[i];
    const float nw = w - k.lr * (mhat / (sqrtf(vhat) + k.eps) + wd * w);
    m[i] = mi;
    v[i] = vi;
    master[i] = nw;
    if constexpr (std::is_same<TP, __nv_bfloat16>::value) {
        const uint16_t bits = bf16_from_f32_stochastic(nw, element_noise(k.seed, (uint64_t)(offset + i)) & 0xffffu);
        params[i] = __ushort_as_bfloat16(bits);
    } else {
        params[i] = from_f<TP>(nw);
    }
}

template <typename TP, typename TG>
__global__ void adamw_kernel(TP* params, float* master, const TG* grads, float* m, float* v, size_t n, size_t offset,
                             float lr, float beta1, float beta2, float eps, float wd, float grad_scale, float bc1,
                             float bc2, uint32_t seed) {
    const AdamWConsts k = {lr, beta1, beta2, eps, grad_scale, bc1, bc2, seed};
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(params, master, grads, m, v, i, offset, wd, k);
}

#define ADAMW_BLOCK 256
#define ADAMW_MAX_BLOCKS 65536

// A span's grid: fixed by n alone, the same in both launchers.
static int adamw_blocks(size_t n) {
    const size_t want = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
    return (int)(want < ADAMW_MAX_BLOCKS ? want : ADAMW_MAX_BLOCKS);
}

// Bias corrections once on the host, in the same float arithmetic as the CPU twin.
static AdamWConsts adamw_consts(const AdamWArgs* a) {
    const AdamWConsts k = {a->lr, a->beta1, a->beta2, a->eps, a->grad_scale, 1.0f - powf(a->beta1, (float)a->step),
                           1.0f - powf(a->beta2, (float)a->step), a->seed};
    return k;
}

extern "C" void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                             float* m, float* v, size_t n, size_t offset, const AdamWArgs* a) {
    if (n == 0) return;
    const AdamWConsts k = adamw_consts(a);
    const int grid = adamw_blocks(n);
    DISPATCH_DTYPE(param_dt, TP, DISPATCH_DTYPE(grad_dt, TG, {
        adamw_kernel<TP, TG><<<grid, ADAMW_BLOCK, 0, be->stream>>>((TP*)params, master, (const TG*)grads, m, v, n,
                                                                   offset, k.lr, k.beta1, k.beta2, k.eps,
                                                                   a->weight_decay, k.grad_scale, k.bc1, k.bc2, k.seed);
        LAUNCH_CHECK();
    }));
}

// ---------------------------------------------------------------------------------------------------
// sum_squares: a grid fixed by n alone (so the order never depends on the device), each block's partial
// written to scratch, then one block adds the partials in a fixed tree order into *acc.
#define SS_BLOCK 512
#define SS_MAX_BLOCKS 1024

static int sum_squares_blocks(size_t n) {
    const size_t want = (n + (size_t)SS_BLOCK * 8 - 1) / ((size_t)SS_BLOCK * 8);
    return (int)(want < SS_MAX_BLOCKS ? (want ? want : 1) : SS_MAX_BLOCKS);
}

// Block b of a span's nb: its threads' strided sums, then the block's tree; both launchers call it.
template <typename T>
__device__ __forceinline__ float sum_squares_block(const T* x, size_t n, unsigned b, unsigned nb, float* red) {
    float s = 0.0f;
    for (size_t i = b * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)nb * blockDim.x) {
        const float v = to_f(x[i]);
        s += v * v;
    }
    return block_sum(s, red);
}

// One span's partials in a fixed order; both launchers' final kernels call it.
__device__ __forceinline__ float sum_partials(const float* partial, int nparts, float* red) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
    return block_sum(s, red);
}

template <typename T>
__global__ void __launch_bounds__(SS_BLOCK) sum_squares_partial_kernel(float* partial, const T* x, size_t n) {
    __shared__ float red[32];
    const float s = sum_squares_block(x, n, blockIdx.x, gridDim.x, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(SS_BLOCK) sum_squares_final_kernel(float* acc, const float* partial, int nparts) {
    __shared__ float red[32];
    const float s = sum_partials(partial, nparts, red);
    if (threadIdx.x == 0) *acc += s;
}

extern "C" void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n) {
    if (n == 0) return;
    const int grid = sum_squares_blocks(n);
    float* partial = (float*)be_scratch(be, (size_t)grid * sizeof(float), "sum_squares");
    DISPATCH_DTYPE(dt, X, {
        sum_squares_partial_kernel<X><<<grid, SS_BLOCK, 0, be->stream>>>(partial, (const X*)x, n);
        LAUNCH_CHECK();
    });
    sum_squares_final_kernel<<<1, SS_BLOCK, 0, be->stream>>>(acc, partial, grid);
    LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------
// The lists. By default each is its per-span calls (the same launches as without the list). Under the
// adamw_multi variant a kernel takes a table of spans by value (as apex's multi_tensor_apply does), kept
// under the 4 KB limit of kernel parameters: one AdamW launch per 48 spans, one pair of sum-of-squares
// launches per 160. Each span keeps the grid the per-span launcher gives it, and block b of that grid does
// what block b of the per-span launch does, through the same device functions, and the sums reach *acc in
// the same order: the variant's results are bit for bit the default's.

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
    adamw_spans_kernel<TP, TG><<<t->first_block[t->count], ADAMW_BLOCK, 0, be->stream>>>(*t, *k);
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

extern "C" void adamw_update_spans(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                                   const AdamWArgs* a) {
    if (variant_on(be, VARIANT_ADAMW_MULTI)) {
        const AdamWConsts k = adamw_consts(a);
        DISPATCH_DTYPE(param_dt, TP, DISPATCH_DTYPE(grad_dt, TG, adamw_spans_multi<TP, TG>(be, spans, count, &k)));
        return;
    }
    for (int i = 0; i < count; i++) {
        const AdamWSpan* s = &spans[i];
        AdamWArgs si = *a;
        si.weight_decay = s->weight_decay;
        adamw_update(be, s->params, param_dt, s->master, s->grads, grad_dt, s->m, s->v, s->n, s->offset, &si);
    }
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
        sum_squares_spans_partial_kernel<X><<<blocks, SS_BLOCK, 0, be->stream>>>(partial, *t);
        LAUNCH_CHECK();
    });
    sum_squares_spans_final_kernel<<<1, SS_BLOCK, 0, be->stream>>>(acc, partial, *t);
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

extern "C" void sum_squares_spans(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n, int count) {
    if (variant_on(be, VARIANT_ADAMW_MULTI)) {
        sum_squares_multi(be, dt, acc, x, n, count);
        return;
    }
    for (int i = 0; i < count; i++) sum_squares(be, dt, acc, x[i], n[i]);
}
