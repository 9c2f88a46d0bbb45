// context_ring.c: -cpm ring, ring attention over the context group. See context_parallel.h.
//
// Layouts. The block's rows of a rank are (B, 2C): its low chunk's C positions, then its high chunk's. The chunk
// kernels want each chunk contiguous over the batch, so the ring packs a tensor's columns into the chunk layout
// (chunk, B, C, width): chunk k's (B, C, width) at k B C width. lse is (B, NH, 2C) in the block, (chunk, B, NH,
// C) packed. Step s holds rank (c - s) mod N's k|v (its two chunks, packed the same way), then passes it on.
#include "core/model/context_parallel.h"

#include "base/common.h"

typedef struct {
    DType dt;
    size_t e;            // bytes per element
    int B, C, N, me;     // C positions per chunk; this rank `me` of N holds B rows of 2 C
    int NH, KV, D;
    size_t q, kv;        // elements per row: q (NH D) and k|v (2 KV D); q|k|v rows are q + kv wide
    size_t q_chunk;      // elements of one packed chunk of q (B C q)
    size_t kv_chunk;     // ... of k|v (B C kv)
    size_t lse_chunk;    // floats of one packed chunk of lse (B NH C)
    const int* doc;      // documents: this rank's queries' document starts, packed (chunk, B, C); NULL: none
} Ring;

static Ring ring_of(const Model* g) {
    const ParamLayout* lay = g->layout;
    Ring x = {g->dt, dtype_size(g->dt), g->B, g->T / 2, lay->cp_size, comm_rank(g->cp), layout_heads(lay),
              layout_kv_heads(lay), layout_head_size(lay), 0, 0, 0, 0, 0, g->acts.doc};
    x.q = (size_t)x.NH * x.D;
    x.kv = 2 * (size_t)x.KV * x.D;
    x.q_chunk = (size_t)x.B * x.C * x.q;
    x.kv_chunk = (size_t)x.B * x.C * x.kv;
    x.lse_chunk = (size_t)x.B * x.NH * x.C;
    return x;
}

static char* at(const void* base, size_t elems, const Ring* x) { return (char*)base + elems * x->e; }

// The first position of chunk k (0: low, 1: high) of rank r.
static int chunk_start(const Ring* x, int r, int k) { return context_piece_start(1, x->N, r, 2 * x->C, k); }

// Columns [col, col + w) of the block's rows (rows `rw` wide) <-> the chunk layout of width w.
static void pack(Backend* be, const Ring* x, void* chunks, const void* rows, size_t rw, size_t col, size_t w) {
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < x->B; b++)
            be_copy_rows(be, at(chunks, ((size_t)k * x->B + b) * x->C * w, x), w * x->e,
                         at(rows, ((size_t)b * 2 + k) * x->C * rw + col, x), rw * x->e, w * x->e, (size_t)x->C);
}
static void unpack(Backend* be, const Ring* x, void* rows, size_t rw, size_t col, const void* chunks, size_t w) {
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < x->B; b++)
            be_copy_rows(be, at(rows, ((size_t)b * 2 + k) * x->C * rw + col, x), rw * x->e,
                         at(chunks, ((size_t)k * x->B + b) * x->C * w, x), w * x->e, w * x->e, (size_t)x->C);
}
// lse: (B, NH, 2C) in the block <-> (chunk, B, NH, C) packed: B NH rows of C floats per chunk.
static void lse_to_chunks(Backend* be, const Ring* x, float* chunks, const float* rows) {
    size_t c = (size_t)x->C * sizeof(float);
    for (int k = 0; k < 2; k++)
        be_copy_rows(be, chunks + k * x->lse_chunk, c, rows + (size_t)k * x->C, 2 * c, c, (size_t)x->B * x->NH);
}
static void lse_to_rows(Backend* be, const Ring* x, float* rows, const float* chunks) {
    size_t c = (size_t)x->C * sizeof(float);
    for (int k = 0; k < 2; k++)
        be_copy_rows(be, rows + (size_t)k * x->C, 2 * c, chunks + k * x->lse_chunk, c, c, (size_t)x->B * x->NH);
}

// Whether query chunk qi of this rank attends key chunk kj of rank r: unless every key is in every query's
// future. Chunks are aligned and of one length, so that is the key chunk starting after the query chunk.
// Documents only take keys away, and a pair whose keys all lie before its queries' documents gives lse -inf,
// out 0 and no gradient, which the merge and the backward take as nothing: skipping by position alone is
// exact with or without them.
static int pair_attends(const Ring* x, int r, int qi, int kj) {
    return chunk_start(x, r, kj) <= chunk_start(x, x->me, qi);
}

// One hop round the ring, started: `send` (`bytes`) goes to rank me + 1, `recv` gets its replacement from rank
// me - 1. The tag names the hop's message so a mismatch is named. Until comm_wait the caller may read send
// (the chunk pair being computed) but not touch recv.
static CommHandle hop_start(Model* g, const Ring* x, void* send, void* recv, size_t bytes, int tag) {
    CommMessage m[2] = {{1, send, bytes, (x->me + 1) % x->N, tag}, {0, recv, bytes, (x->me + x->N - 1) % x->N, tag}};
    return comm_exchange_start(g->cp, m, 2);
}

// The forward's running (out, lse) of each query chunk, merged with each key chunk's partial result as it
// comes; the first key chunk a query chunk meets writes it directly. Scratch: the block's own out and lse,
// written last.
typedef struct {
    void *q, *out, *scratch_out;
    float *lse, *scratch_lse;
    int started[2];
} Running;

// Query chunk qi's document starts (packed as lse's chunks: B C of each), or NULL.
static const int* query_docs(const Ring* x, int qi) { return x->doc ? x->doc + (size_t)qi * x->B * x->C : NULL; }

static void forward_pair(Backend* be, const Ring* x, Running* run, const void* kv, int r, int qi, int kj) {
    const void* q = at(run->q, qi * x->q_chunk, x);
    const int* doc = query_docs(x, qi);
    const void* k = at(kv, kj * x->kv_chunk, x);
    void* out = at(run->out, qi * x->q_chunk, x);
    float* lse = run->lse + qi * x->lse_chunk;
    int q0 = chunk_start(x, x->me, qi), k0 = chunk_start(x, r, kj);
    if (!run->started[qi]) {
        attention_chunk_forward(be, x->dt, out, lse, q, k, doc, x->B, x->C, x->C, q0, k0, x->NH, x->KV, x->D);
        run->started[qi] = 1;
        return;
    }
    attention_chunk_forward(be, x->dt, run->scratch_out, run->scratch_lse, q, k, doc, x->B, x->C, x->C, q0, k0, x->NH,
                            x->KV, x->D);
    attention_lse_merge(be, x->dt, out, lse, run->scratch_out, run->scratch_lse, x->B, x->C, x->NH, x->D);
}

// Work buffers: cp_send holds q then the running output (packed), cp_recv the two k|v buffers; att_scratch
// the running lse. Each step's attention reads the k|v held while the next one arrives in the other buffer
// (the hop started before the compute, waited for after it), and the buffer it just read is sent on next.
void context_ring_forward(Model* g, Backend* be, void* out, float* lse, const void* qkv) {
    Ring x = ring_of(g);
    size_t rw = x.q + x.kv;
    void* kv[2] = {g->acts.cp_recv, at(g->acts.cp_recv, 2 * x.kv_chunk, &x)};
    Running run = {g->acts.cp_send, at(g->acts.cp_send, 2 * x.q_chunk, &x), out, g->acts.att_scratch, lse, {0, 0}};
    pack(be, &x, run.q, qkv, rw, 0, x.q);
    pack(be, &x, kv[0], qkv, rw, x.q, x.kv);
    for (int s = 0; s < x.N; s++) {
        int cur = s % 2, r = (x.me - s + x.N) % x.N;
        CommHandle next = comm_no_handle();
        if (s < x.N - 1) next = hop_start(g, &x, kv[cur], kv[1 - cur], 2 * x.kv_chunk * x.e, 0);
        for (int qi = 0; qi < 2; qi++)
            for (int kj = 0; kj < 2; kj++)
                if (pair_attends(&x, r, qi, kj)) forward_pair(be, &x, &run, kv[cur], r, qi, kj);
        comm_wait(g->cp, &next);
    }
    unpack(be, &x, out, x.q, 0, run.out, x.q);
    lse_to_rows(be, &x, lse, run.lse);
}

// The backward's packed inputs (q, the final out and lse, dout) and accumulators (dq; d(k|v) beside each k|v).
typedef struct {
    void *q, *out, *dout, *dq;
    float* lse;
    void *kv[2], *dkv[2];
} Packed;

static void backward_pair(Backend* be, const Ring* x, const Packed* p, int cur, int r, int qi, int kj) {
    size_t qo = qi * x->q_chunk, ko = kj * x->kv_chunk;
    attention_chunk_backward(be, x->dt, at(p->dq, qo, x), at(p->dkv[cur], ko, x), at(p->dout, qo, x), at(p->q, qo, x),
                             at(p->kv[cur], ko, x), at(p->out, qo, x), p->lse + qi * x->lse_chunk, query_docs(x, qi), x->B,
                             x->C, x->C, chunk_start(x, x->me, qi), chunk_start(x, r, kj), x->NH, x->KV, x->D);
}

// Work buffers: cp_send holds q, out, dout, dq (packed), cp_recv the two k|v buffers and their d(k|v);
// att_scratch the packed lse. Each step adds the held k|v's share of this rank's queries to the d(k|v) that
// travels with it, then passes both on; after the last step the d(k|v) held is rank me + 1's, complete, and one
// more hop brings each rank its own. The k|v leaves before the compute (which only reads it) and arrives in the
// other buffer meanwhile; the d(k|v) leaves after it, since it carries this step's sums: starting the next
// rank's sum without it would add the shares in another order, and change the bits.
void context_ring_backward(Model* g, Backend* be, void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse) {
    Ring x = ring_of(g);
    size_t rw = x.q + x.kv, qb = 2 * x.q_chunk, kvb = 2 * x.kv_chunk;
    char* s0 = g->acts.cp_send;
    char* r0 = g->acts.cp_recv;
    Packed p = {s0, at(s0, qb, &x), at(s0, 2 * qb, &x), at(s0, 3 * qb, &x), g->acts.att_scratch,
                {r0, at(r0, kvb, &x)}, {at(r0, 2 * kvb, &x), at(r0, 3 * kvb, &x)}};
    pack(be, &x, p.q, qkv, rw, 0, x.q);
    pack(be, &x, p.kv[0], qkv, rw, x.q, x.kv);
    pack(be, &x, p.out, out, x.q, 0, x.q);
    pack(be, &x, p.dout, dout, x.q, 0, x.q);
    lse_to_chunks(be, &x, p.lse, lse);
    be_memset0(be, p.dq, qb * x.e);
    be_memset0(be, p.dkv[0], kvb * x.e);
    int cur = 0;
    for (int s = 0; s < x.N; s++, cur = 1 - cur) {
        int r = (x.me - s + x.N) % x.N;
        CommHandle next = comm_no_handle();
        if (s < x.N - 1) next = hop_start(g, &x, p.kv[cur], p.kv[1 - cur], kvb * x.e, 2 * s + 1);
        for (int qi = 0; qi < 2; qi++)
            for (int kj = 0; kj < 2; kj++)
                if (pair_attends(&x, r, qi, kj)) backward_pair(be, &x, &p, cur, r, qi, kj);
        CommHandle sums = hop_start(g, &x, p.dkv[cur], p.dkv[1 - cur], kvb * x.e, 2 * s);   // the last: home
        comm_wait(g->cp, &next);
        comm_wait(g->cp, &sums);
    }
    unpack(be, &x, dqkv, rw, 0, p.dq, x.q);
    unpack(be, &x, dqkv, rw, x.q, p.dkv[cur], x.kv);
}
