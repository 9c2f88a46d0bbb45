// context_parallel.c: Ulysses' all-to-alls around attention. See context_parallel.h.
#include "core/model/context_parallel.h"

#include "base/common.h"

// " per tensor rank (the model's n over -tp tp)" into out under -tp, "" without.
static const char* per_tensor_rank(char* out, size_t size, int n, int tp) {
    out[0] = '\0';
    if (tp > 1) snprintf(out, size, " per tensor rank (the model's %d over -tp %d)", n, tp);
    return out;
}

int context_splits(const ModelShape* s, int tp, int N, char* why, size_t size) {
    int KV = shape_layer_sizes(s).kv_heads, NH = s->NH / tp, KVl = KV * shape_kv_copies(s, tp) / tp;
    char of[96];
    if (NH % N)
        return set_why(why, size, "-cp %d does not divide the %s%d attention heads%s", N, tp > 1 ? "" : "model's ", NH,
                       per_tensor_rank(of, sizeof(of), s->NH, tp));
    if (KVl % N && N % KVl)
        return set_why(why, size, "-cp %d and %d kv heads%s: one must divide the other (each rank takes KV / cp kv heads, or a copy of one)",
                       N, KVl, per_tensor_rank(of, sizeof(of), KV, tp));
    return 1;
}

// ---------------------------------------------------------------------------------------------------
// The exchange. A rank's rows are (B, Tl) token rows of q|k|v (or of the attention output) with every
// head; block j of the all-to-all carries what rank j attends: its heads of this rank's rows, as parts
// (q, k, v; or the output alone), each part (B Tl, width) contiguous in the block, so that the copies of a
// kv head sit whole and add with one kernel. The receiving rank places block i's rows at positions
// [i Tl, (i+1) Tl) of every sequence, each part at its columns of the (B, T, heads) layout attention reads.

typedef struct {
    size_t e;            // bytes per element
    int B, Tl, T, N;     // rows per rank B Tl; positions T = N Tl
    int NH, KV, D;       // the whole layer's heads (this rank's q|k|v rows hold them all)
    ContextHeads h;      // per rank after the exchange
} Exchange;

typedef struct {
    size_t width;      // elements per row
    size_t seq_col;    // first column in the rows' layout (every head)
    size_t heads_col;  // first column in the exchanged layout (this rank's heads)
    size_t offset;     // first element in a block
    int kv;            // a kv head's part (copied when there are fewer kv heads than ranks)
} Part;

static Exchange exchange_of(const Model* g) {
    const ParamLayout* lay = g->layout;
    Exchange x = {dtype_size(g->dt), g->B, g->T, g->T * lay->cp_size, lay->cp_size, layout_heads(lay), layout_kv_heads(lay),
                  layout_head_size(lay), context_heads(lay)};
    return x;
}

// The first kv head that rank j's query heads read.
static int kv_first(const Exchange* x, int j) { return x->h.copies > 1 ? j / x->h.copies : j * x->h.KV; }

// Rank j's parts: q, k, v of its heads (qkv), or its heads of the attention output. Returns their count.
static int parts_of(const Exchange* x, int qkv, int j, Part* p) {
    size_t R = (size_t)x->B * x->Tl, D = (size_t)x->D, q = (size_t)x->h.NH * D, kv = (size_t)x->h.KV * D;
    p[0] = (Part){q, (size_t)j * q, 0, 0, 0};
    if (!qkv) return 1;
    size_t k_col = (size_t)x->NH * D + (size_t)kv_first(x, j) * D;
    p[1] = (Part){kv, k_col, q, R * q, 1};
    p[2] = (Part){kv, k_col + (size_t)x->KV * D, q + kv, R * (q + kv), 1};
    return 3;
}

// Elements of one block, and the row widths of both layouts.
static size_t block_elems(const Exchange* x, int qkv) { return (size_t)x->B * x->Tl * (size_t)(x->h.NH + (qkv ? 2 * x->h.KV : 0)) * x->D; }
static size_t seq_width(const Exchange* x, int qkv) { return (size_t)(x->NH + (qkv ? 2 * x->KV : 0)) * x->D; }
static size_t heads_width(const Exchange* x, int qkv) { return (size_t)(x->h.NH + (qkv ? 2 * x->h.KV : 0)) * x->D; }

static char* elems_at(const void* base, size_t elems, const Exchange* x) { return (char*)base + elems * x->e; }

// seq (this rank's rows, every head) -> send: block j holds rank j's heads.
static void pack_rows(Backend* be, const Exchange* x, int qkv, void* send, const void* seq) {
    size_t R = (size_t)x->B * x->Tl, sw = seq_width(x, qkv), blk = block_elems(x, qkv);
    Part p[3];
    for (int j = 0; j < x->N; j++)
        for (int i = 0, n = parts_of(x, qkv, j, p); i < n; i++)
            be_copy_rows(be, elems_at(send, j * blk + p[i].offset, x), p[i].width * x->e, elems_at(seq, p[i].seq_col, x), sw * x->e,
                         p[i].width * x->e, R);
}

// recv (block i: rank i's rows of this rank's heads) -> heads (B, T, this rank's heads).
static void unpack_heads(Backend* be, const Exchange* x, int qkv, void* heads, const void* recv, int me) {
    size_t hw = heads_width(x, qkv), blk = block_elems(x, qkv), Tl = (size_t)x->Tl;
    Part p[3];
    int n = parts_of(x, qkv, me, p);
    for (int i = 0; i < x->N; i++)
        for (int k = 0; k < n; k++)
            for (int b = 0; b < x->B; b++)
                be_copy_rows(be, elems_at(heads, ((size_t)b * x->T + i * Tl) * hw + p[k].heads_col, x), hw * x->e,
                             elems_at(recv, i * blk + p[k].offset + b * Tl * p[k].width, x), p[k].width * x->e, p[k].width * x->e, Tl);
}

// heads (B, T, this rank's heads) -> send: block j holds rank j's positions.
static void pack_heads(Backend* be, const Exchange* x, int qkv, void* send, const void* heads, int me) {
    size_t hw = heads_width(x, qkv), blk = block_elems(x, qkv), Tl = (size_t)x->Tl;
    Part p[3];
    int n = parts_of(x, qkv, me, p);
    for (int j = 0; j < x->N; j++)
        for (int k = 0; k < n; k++)
            for (int b = 0; b < x->B; b++)
                be_copy_rows(be, elems_at(send, j * blk + p[k].offset + b * Tl * p[k].width, x), p[k].width * x->e,
                             elems_at(heads, ((size_t)b * x->T + j * Tl) * hw + p[k].heads_col, x), hw * x->e, p[k].width * x->e, Tl);
}

// recv (block i: rank i's heads of this rank's rows) -> seq (this rank's rows, every head). A kv head's
// copies (blocks i of one group of `copies`) are summed into the group's first block, in rank order, first.
static void unpack_rows(Backend* be, DType dt, const Exchange* x, int qkv, void* seq, void* recv) {
    size_t R = (size_t)x->B * x->Tl, sw = seq_width(x, qkv), blk = block_elems(x, qkv);
    int c = x->h.copies;
    Part p[3];
    for (int i = 0; i < x->N; i++)
        for (int k = 0, n = parts_of(x, qkv, i, p); k < n; k++) {
            if (p[k].kv && i % c) continue;   // added into block i - i % c below
            void* first = elems_at(recv, i * blk + p[k].offset, x);
            for (int t = 1; p[k].kv && t < c; t++)
                residual_forward(be, dt, first, first, elems_at(recv, (i + t) * blk + p[k].offset, x), R * p[k].width);
            be_copy_rows(be, elems_at(seq, p[k].seq_col, x), sw * x->e, first, p[k].width * x->e, p[k].width * x->e, R);
        }
}

// Rows -> heads: heads may be the send buffer (free once the exchange has read it).
static void to_heads(Model* g, Backend* be, const Exchange* x, int qkv, void* heads, const void* seq) {
    pack_rows(be, x, qkv, g->acts.cp_send, seq);
    comm_alltoall(g->cp, g->acts.cp_recv, g->acts.cp_send, block_elems(x, qkv), g->dt);
    unpack_heads(be, x, qkv, heads, g->acts.cp_recv, comm_rank(g->cp));
}

// Heads -> rows: heads may be the receive buffer (packed before the exchange rewrites it).
static void to_rows(Model* g, Backend* be, const Exchange* x, int qkv, void* seq, const void* heads) {
    pack_heads(be, x, qkv, g->acts.cp_send, heads, comm_rank(g->cp));
    comm_alltoall(g->cp, g->acts.cp_recv, g->acts.cp_send, block_elems(x, qkv), g->dt);
    unpack_rows(be, g->dt, x, qkv, seq, g->acts.cp_recv);
}

void context_upload_documents(Model* g, Backend* be, int* doc, const int* rows) {
    size_t N = (size_t)g->B * g->T;
    int cp = g->layout->cp_size;
    if (!g->layout->cp_ring) {   // the upload ring moves N ints at a time
        for (int i = 0; i < cp; i++) batch_io_upload(&g->io, be, doc + (size_t)i * N, rows + (size_t)i * N);
        return;
    }
    int C = g->T / 2, me = comm_rank(g->cp);
    int* packed = (int*)xmalloc(N * sizeof(int));
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < g->B; b++)
            memcpy(packed + ((size_t)k * g->B + b) * C, rows + (size_t)b * cp * g->T + context_piece_start(1, cp, me, g->T, k),
                   (size_t)C * sizeof(int));
    batch_io_upload(&g->io, be, doc, packed);
    free(packed);
}

void context_attention_forward(Model* g, Backend* be, int index, void* out, float* lse, const void* qkv, int refill) {
    if (g->layout->cp_ring) {   // keeps nothing per block: a refill runs the ring again from q|k|v
        context_ring_forward(g, be, out, lse, qkv);
        return;
    }
    Exchange x = exchange_of(g);
    void* qkv_heads = context_qkv_heads(g, index);
    void* att_heads = context_att_heads(g, index);
    if (!refill) to_heads(g, be, &x, 1, qkv_heads, qkv);
    attention_forward(be, g->dt, att_heads, lse, qkv_heads, g->acts.doc, x.B, x.T, x.h.NH, x.h.KV, x.D);
    to_rows(g, be, &x, 0, out, att_heads);
}

// d(out) reaches the heads layout in the send buffer and d(q|k|v) is made in the receive buffer: both are
// free by then, and each exchange reads its input before it writes.
void context_attention_backward(Model* g, Backend* be, int index, void* dqkv, const void* dout, const void* qkv,
                                const void* out, const float* lse) {
    if (g->layout->cp_ring) {
        context_ring_backward(g, be, dqkv, dout, qkv, out, lse);
        return;
    }
    Exchange x = exchange_of(g);
    void* dout_heads = g->acts.cp_send;
    void* dqkv_heads = g->acts.cp_recv;
    to_heads(g, be, &x, 0, dout_heads, dout);
    attention_backward(be, g->dt, dqkv_heads, g->acts.att_scratch, dout_heads, context_qkv_heads(g, index),
                       context_att_heads(g, index), lse, g->acts.doc, x.B, x.T, x.h.NH, x.h.KV, x.D);
    to_rows(g, be, &x, 1, dqkv, dqkv_heads);
}
