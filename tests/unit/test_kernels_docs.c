// test_kernels_docs.c: the kernels' documents (kernels.h: Documents) on the CPU twins. Rows packed with several
// documents must give every document what it gets alone:
// - attention with doc: out, lse and dqkv of each document equal attention over that document alone (a row of
//   its own, doc NULL), bit for bit, since the sums are the same terms in the same order; and the other
//   documents' values never enter them (poisoned with NaN, the bits stay);
// - RoPE with pos equals RoPE on each document alone, bit for bit, forward and backward, in place too;
// - the encoder with pos reads wpe[pos], and dwpe[p] is the sum of dout over the tokens at position p in
//   increasing (b,t) order (the test adds them in that order: bit for bit); pos = t is pos NULL's bits, and
//   the vocabulary-parallel encoder's slices add up to the whole one's;
// - a target of -1 gives loss 0 and a zero dlogits row, the other rows keep their bits (classifier_forward
//   and the vocabulary-parallel steps);
// - a row holding a later part of a sequence (context parallelism: positions OFF .. OFF + T - 1) reads wpe from
//   row OFF on, adds its dwpe there and leaves the rows before alone, and RoPE rotates it as the same tokens at
//   the end of a row of OFF + T (pos NULL), bit for bit;
// - malformed pos or doc arrays, and targets below -1, are one-line errors.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/child_testlib.h"
#include "tests/unit/kernel_testlib.h"

// Two rows of T tokens: row 0 holds documents of 4, 1, 6 and 2 tokens, row 1 of 7 and 6.
enum { DB = 2, DT = 13, MAX_DOCS = 4 };
static const int DOC_STARTS[DB][MAX_DOCS + 1] = {{0, 4, 5, 11, DT}, {0, 7, DT, DT, DT}};
static const int DOC_COUNT[DB] = {4, 2};

typedef struct { int doc[DB * DT], pos[DB * DT]; } Docs;

static Docs docs_make(void) {
    Docs d;
    for (int b = 0; b < DB; b++)
        for (int k = 0; k < DOC_COUNT[b]; k++)
            for (int t = DOC_STARTS[b][k]; t < DOC_STARTS[b][k + 1]; t++) {
                d.doc[b * DT + t] = DOC_STARTS[b][k];
                d.pos[b * DT + t] = t - DOC_STARTS[b][k];
            }
    return d;
}

// Rows [first, first + rows) of a (.., width) tensor of dt, copied between buffers (both backend memory on the CPU).
static void copy_rows(void* dst, size_t dst_row, const void* src, size_t src_row, size_t rows, size_t width, DType dt) {
    const size_t rb = width * dtype_size(dt);
    memcpy((char*)dst + dst_row * rb, (const char*)src + src_row * rb, rows * rb);
}
static int rows_same(const void* a, size_t a_row, const void* b, size_t b_row, size_t rows, size_t width, DType dt) {
    const size_t rb = width * dtype_size(dt);
    return same_bits((const char*)a + a_row * rb, (const char*)b + b_row * rb, rows * rb);
}

// ---------------------------------------------------------------------------------------------------
// attention.

typedef struct { void *qkv, *dout, *out, *dqkv; float *lse, *scratch; } AttnBufs;   // backend memory

static AttnBufs attn_alloc(Backend* be, DType dt, int B, int T, int NH, int KV, int D) {
    const size_t rows = (size_t)B * T, ld = (size_t)(NH + 2 * KV) * D;
    AttnBufs a = {dev_zeros(be, dt, rows * ld), dev_zeros(be, dt, rows * NH * D), dev_zeros(be, dt, rows * NH * D),
                  dev_zeros(be, dt, rows * ld), dev_zeros(be, DT_FP32, rows * NH), dev_zeros(be, DT_FP32, rows * NH)};
    return a;
}
static void attn_free(Backend* be, AttnBufs* a) {
    void* p[] = {a->qkv, a->dout, a->out, a->dqkv, a->lse, a->scratch};
    for (int i = 0; i < 6; i++) be_free(be, p[i]);
}
static void attn_run(Backend* be, DType dt, AttnBufs* a, const int* doc, int B, int T, int NH, int KV, int D) {
    attention_forward(be, dt, a->out, a->lse, a->qkv, doc, B, T, NH, KV, D);
    attention_backward(be, dt, a->dqkv, a->scratch, a->dout, a->qkv, a->out, a->lse, doc, B, T, NH, KV, D);
}

// Document (b, s, L) of the packed run against `alone`, the same document run as a row of its own.
static int attn_doc_same(const AttnBufs* packed, const AttnBufs* alone, DType dt, int b, int s, int L, int NH, int KV,
                         int D) {
    const size_t ld = (size_t)(NH + 2 * KV) * D, row = (size_t)b * DT + s;
    int ok = rows_same(packed->out, row, alone->out, 0, L, (size_t)NH * D, dt) &&
             rows_same(packed->dqkv, row, alone->dqkv, 0, L, ld, dt);
    for (int h = 0; h < NH; h++)   // lse (B,NH,T)
        ok &= same_bits(packed->lse + ((size_t)b * NH + h) * DT + s, alone->lse + (size_t)h * L, sizeof(float) * L);
    return ok;
}

static void test_attention_docs(TestStats* s, Backend* be, DType dt, int NH, int KV, int D) {
    const Docs d = docs_make();
    const size_t ld = (size_t)(NH + 2 * KV) * D, nq = (size_t)DB * DT * ld, no = (size_t)DB * DT * NH * D;
    Rng r = {211 + NH + KV + D};
    float *hq = rand_vec(&r, nq, 1.5f, dt), *hdy = rand_vec(&r, no, 1, dt);
    AttnBufs packed = attn_alloc(be, dt, DB, DT, NH, KV, D), poisoned = attn_alloc(be, dt, DB, DT, NH, KV, D);
    host_to_dtype(packed.qkv, dt, hq, nq);
    host_to_dtype(packed.dout, dt, hdy, no);
    attn_run(be, dt, &packed, d.doc, DB, DT, NH, KV, D);
    float* nans = xmalloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) nans[i] = NAN;
    int alone_ok = 1, poison_ok = 1;
    for (int b = 0; b < DB; b++)
        for (int k = 0; k < DOC_COUNT[b]; k++) {
            const int st = DOC_STARTS[b][k], L = DOC_STARTS[b][k + 1] - st;
            const size_t row = (size_t)b * DT + st;
            AttnBufs alone = attn_alloc(be, dt, 1, L, NH, KV, D);
            copy_rows(alone.qkv, 0, packed.qkv, row, L, ld, dt);
            copy_rows(alone.dout, 0, packed.dout, row, L, (size_t)NH * D, dt);
            attn_run(be, dt, &alone, NULL, 1, L, NH, KV, D);
            alone_ok &= attn_doc_same(&packed, &alone, dt, b, st, L, NH, KV, D);
            // Every other token's q, k, v and dout NaN: this document's results keep their bits.
            host_to_dtype(poisoned.qkv, dt, nans, nq);
            host_to_dtype(poisoned.dout, dt, nans, no);
            copy_rows(poisoned.qkv, row, packed.qkv, row, L, ld, dt);
            copy_rows(poisoned.dout, row, packed.dout, row, L, (size_t)NH * D, dt);
            attn_run(be, dt, &poisoned, d.doc, DB, DT, NH, KV, D);
            poison_ok &= attn_doc_same(&poisoned, &alone, dt, b, st, L, NH, KV, D);
            attn_free(be, &alone);
        }
    char name[96];
    snprintf(name, sizeof name, "attention_docs_each_alone_h%dkv%dd%d_%s", NH, KV, D, dtype_name(dt));
    check_true(s, name, alone_ok);
    snprintf(name, sizeof name, "attention_docs_never_read_others_h%dkv%dd%d_%s", NH, KV, D, dtype_name(dt));
    check_true(s, name, poison_ok);
    free(hq), free(hdy), free(nans);
    attn_free(be, &packed), attn_free(be, &poisoned);
}

// One document per row (doc all 0) is plain causal attention, bit for bit.
static void test_attention_one_doc(TestStats* s, Backend* be) {
    enum { NH = 4, KV = 2, D = 8 };
    const size_t nq = (size_t)DB * DT * (NH + 2 * KV) * D, no = (size_t)DB * DT * NH * D;
    Rng r = {223};
    float *hq = rand_vec(&r, nq, 1.5f, DT_FP32), *hdy = rand_vec(&r, no, 1, DT_FP32);
    int zeros[DB * DT] = {0};
    AttnBufs a = attn_alloc(be, DT_FP32, DB, DT, NH, KV, D), z = attn_alloc(be, DT_FP32, DB, DT, NH, KV, D);
    for (int i = 0; i < 2; i++) {
        AttnBufs* x = i ? &z : &a;
        host_to_dtype(x->qkv, DT_FP32, hq, nq);
        host_to_dtype(x->dout, DT_FP32, hdy, no);
        attn_run(be, DT_FP32, x, i ? zeros : NULL, DB, DT, NH, KV, D);
    }
    check_true(s, "attention_docs_one_doc_is_causal",
               same_bits(a.out, z.out, no * 4) && same_bits(a.lse, z.lse, sizeof(float) * DB * DT * NH) &&
                   same_bits(a.dqkv, z.dqkv, nq * 4));
    free(hq), free(hdy);
    attn_free(be, &a), attn_free(be, &z);
}

// ---------------------------------------------------------------------------------------------------
// RoPE.

static void test_rope_docs(TestStats* s, Backend* be, DType dt) {
    enum { NH = 4, KV = 2, D = 16 };
    const Docs d = docs_make();
    const size_t W = (size_t)(NH + 2 * KV) * D, n = (size_t)DB * DT * W;
    Rng r = {227};
    float *hx = rand_vec(&r, n, 2, dt), *f = xmalloc(sizeof(float) * D / 2);
    for (int i = 0; i < D / 2; i++) f[i] = (float)pow(10000.0, -2.0 * i / D);
    float* inv_freq = dev_from(be, DT_FP32, f, D / 2);
    void *x = dev_from(be, dt, hx, n), *fwd = dev_zeros(be, dt, n), *bwd = dev_zeros(be, dt, n);
    void *inplace = dev_from(be, dt, hx, n), *piece = dev_zeros(be, dt, DT * W), *alone = dev_zeros(be, dt, DT * W);
    rope_forward(be, dt, fwd, x, inv_freq, d.pos, DB, DT, NH, KV, D);
    rope_backward(be, dt, bwd, x, inv_freq, d.pos, DB, DT, NH, KV, D);
    rope_forward(be, dt, inplace, inplace, inv_freq, d.pos, DB, DT, NH, KV, D);
    int fwd_ok = 1, bwd_ok = 1;
    for (int b = 0; b < DB; b++)
        for (int k = 0; k < DOC_COUNT[b]; k++) {
            const int st = DOC_STARTS[b][k], L = DOC_STARTS[b][k + 1] - st;
            const size_t row = (size_t)b * DT + st;
            copy_rows(piece, 0, x, row, L, W, dt);
            rope_forward(be, dt, alone, piece, inv_freq, NULL, 1, L, NH, KV, D);
            fwd_ok &= rows_same(fwd, row, alone, 0, L, W, dt);
            rope_backward(be, dt, alone, piece, inv_freq, NULL, 1, L, NH, KV, D);
            bwd_ok &= rows_same(bwd, row, alone, 0, L, W, dt);
        }
    char name[96];
    snprintf(name, sizeof name, "rope_forward_pos_each_doc_alone_%s", dtype_name(dt));
    check_true(s, name, fwd_ok);
    snprintf(name, sizeof name, "rope_backward_pos_each_doc_alone_%s", dtype_name(dt));
    check_true(s, name, bwd_ok);
    snprintf(name, sizeof name, "rope_forward_pos_in_place_%s", dtype_name(dt));
    check_true(s, name, same_bits(inplace, fwd, n * dtype_size(dt)));
    free(hx), free(f);
    void* p[] = {inv_freq, x, fwd, bwd, inplace, piece, alone};
    for (int i = 0; i < 7; i++) be_free(be, p[i]);
}

// ---------------------------------------------------------------------------------------------------
// encoder.

static void test_encoder_docs(TestStats* s, Backend* be) {
    enum { C = 8, Vp = 16, TP = 4, VL = Vp / TP, N = DB * DT };
    const Docs d = docs_make();
    Rng r = {229};
    int tokens[N], ident[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)(rng_next(&r) % 11), ident[i] = i % DT;
    float *wte = rand_vec(&r, Vp * C, 1, DT_FP32), *wpe = rand_vec(&r, DT * C, 1, DT_FP32);
    float *dy = rand_vec(&r, N * C, 1, DT_FP32), *p0 = rand_vec(&r, DT * C, 1, DT_FP32);
    float *out = dev_zeros(be, DT_FP32, N * C), *out_id = dev_zeros(be, DT_FP32, N * C), *out_null = dev_zeros(be, DT_FP32, N * C);
    encoder_forward(be, DT_FP32, out, tokens, d.pos, wte, wpe, DB, DT, C);
    int ok = 1;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) ok &= out[i * C + c] == wte[tokens[i] * C + c] + wpe[d.pos[i] * C + c];
    check_true(s, "encoder_forward_pos_reads_wpe_at_pos", ok);
    encoder_forward(be, DT_FP32, out_id, tokens, ident, wte, wpe, DB, DT, C);
    encoder_forward(be, DT_FP32, out_null, tokens, NULL, wte, wpe, DB, DT, C);
    check_true(s, "encoder_forward_pos_t_is_null", same_bits(out_id, out_null, sizeof(float) * N * C));

    // dwpe: p0 + the sum, in increasing (b,t), of dout over the tokens at each position, added here in fp32.
    float want[DT * C], acc[DT * C] = {0};
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) acc[d.pos[i] * C + c] += dy[i * C + c];
    for (int i = 0; i < DT * C; i++) want[i] = p0[i] + acc[i];
    float *dwte = dev_zeros(be, DT_FP32, Vp * C), *dwpe = dev_from(be, DT_FP32, p0, DT * C);
    float *dwte_null = dev_zeros(be, DT_FP32, Vp * C), *dwpe_null = dev_from(be, DT_FP32, p0, DT * C);
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, d.pos, DB, DT, C);
    encoder_backward(be, DT_FP32, dwte_null, dwpe_null, dy, tokens, NULL, DB, DT, C);
    check_true(s, "encoder_backward_pos_dwpe_by_position", same_bits(dwpe, want, sizeof want));
    check_true(s, "encoder_backward_pos_dwte_unchanged", same_bits(dwte, dwte_null, sizeof(float) * Vp * C));
    float* dwpe_id = dev_from(be, DT_FP32, p0, DT * C);
    memset(dwte, 0, sizeof(float) * Vp * C);
    encoder_backward(be, DT_FP32, dwte, dwpe_id, dy, tokens, ident, DB, DT, C);
    check_true(s, "encoder_backward_pos_t_is_null", same_bits(dwpe_id, dwpe_null, sizeof(float) * DT * C));

    // The vocabulary-parallel encoder with pos: the ranks' outputs add up to the whole one's, each rank's dwpe is it.
    float sum[N * C] = {0};
    int fwd_ok = 1, bwd_ok = 1;
    for (int k = 0; k < TP; k++) {
        float *part = dev_zeros(be, DT_FP32, N * C), *mte = dev_zeros(be, DT_FP32, VL * C), *mpe = dev_from(be, DT_FP32, p0, DT * C);
        encoder_forward_vocab(be, DT_FP32, part, tokens, d.pos, wte + k * VL * C, k == 0 ? wpe : NULL, k * VL, VL, DB, DT, C);
        for (int i = 0; i < N * C; i++) sum[i] += part[i];
        encoder_backward_vocab(be, DT_FP32, mte, mpe, dy, tokens, d.pos, k * VL, VL, DB, DT, C);
        bwd_ok &= same_bits(mpe, dwpe, sizeof(float) * DT * C) && same_bits(mte, dwte + k * VL * C, sizeof(float) * VL * C);
        be_free(be, part), be_free(be, mte), be_free(be, mpe);
    }
    fwd_ok = same_bits(sum, out, sizeof sum);
    check_true(s, "encoder_forward_vocab_pos_sum_is_whole", fwd_ok);
    check_true(s, "encoder_backward_vocab_pos_is_whole", bwd_ok);
    free(wte), free(wpe), free(dy), free(p0);
    void* p[] = {out, out_id, out_null, dwte, dwpe, dwte_null, dwpe_null, dwpe_id};
    for (int i = 0; i < 8; i++) be_free(be, p[i]);
}

// A row of positions OFF .. OFF + DT - 1 (a context rank's share of a sequence of OFF + DT).
static void test_later_positions(TestStats* s, Backend* be) {
    enum { C = 8, Vp = 16, OFF = DT, NH = 2, KV = 1, D = 8, N = DB * DT, W = (NH + 2 * KV) * D };
    Rng r = {231};
    int tokens[N], pos[N];
    for (int i = 0; i < N; i++) tokens[i] = (int)(rng_next(&r) % 11), pos[i] = OFF + i % DT;
    float *wte = rand_vec(&r, Vp * C, 1, DT_FP32), *wpe = rand_vec(&r, (OFF + DT) * C, 1, DT_FP32);
    float *dy = rand_vec(&r, N * C, 1, DT_FP32), *p0 = rand_vec(&r, (OFF + DT) * C, 1, DT_FP32);
    float *out = dev_zeros(be, DT_FP32, N * C), *dwte = dev_zeros(be, DT_FP32, Vp * C), *dwpe = dev_from(be, DT_FP32, p0, (OFF + DT) * C);
    encoder_forward(be, DT_FP32, out, tokens, pos, wte, wpe, DB, DT, C);
    int ok = 1;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) ok &= out[i * C + c] == wte[tokens[i] * C + c] + wpe[pos[i] * C + c];
    check_true(s, "encoder_forward_later_positions_read_wpe_there", ok);
    float want[(OFF + DT) * C];
    memcpy(want, p0, sizeof want);
    for (int t = 0; t < DT; t++)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int b = 0; b < DB; b++) acc += dy[(b * DT + t) * C + c];
            want[(OFF + t) * C + c] += acc;
        }
    encoder_backward(be, DT_FP32, dwte, dwpe, dy, tokens, pos, DB, DT, C);
    check_true(s, "encoder_backward_later_positions_add_there", same_bits(dwpe, want, sizeof want));
    // RoPE: the same tokens at the end of a row of OFF + DT without pos.
    float *hx = rand_vec(&r, (size_t)DT * W, 2, DT_FP32), *f = xmalloc(sizeof(float) * D / 2);
    for (int i = 0; i < D / 2; i++) f[i] = (float)pow(10000.0, -2.0 * i / D);
    float *inv_freq = dev_from(be, DT_FP32, f, D / 2), *mine = dev_zeros(be, DT_FP32, (size_t)DT * W);
    float *whole = dev_zeros(be, DT_FP32, (size_t)(OFF + DT) * W), *rotated = dev_zeros(be, DT_FP32, (size_t)(OFF + DT) * W);
    memcpy(whole + (size_t)OFF * W, hx, sizeof(float) * DT * W);
    rope_forward(be, DT_FP32, mine, hx, inv_freq, pos, 1, DT, NH, KV, D);
    rope_forward(be, DT_FP32, rotated, whole, inv_freq, NULL, 1, OFF + DT, NH, KV, D);
    check_true(s, "rope_forward_later_positions_as_in_the_whole_row", same_bits(mine, rotated + (size_t)OFF * W, sizeof(float) * DT * W));
    rope_backward(be, DT_FP32, mine, hx, inv_freq, pos, 1, DT, NH, KV, D);
    rope_backward(be, DT_FP32, rotated, whole, inv_freq, NULL, 1, OFF + DT, NH, KV, D);
    check_true(s, "rope_backward_later_positions_as_in_the_whole_row", same_bits(mine, rotated + (size_t)OFF * W, sizeof(float) * DT * W));
    free(wte), free(wpe), free(dy), free(p0), free(hx), free(f);
    void* p[] = {out, dwte, dwpe, inv_freq, mine, whole, rotated};
    for (int i = 0; i < 7; i++) be_free(be, p[i]);
}

// ---------------------------------------------------------------------------------------------------
// classifier: ignored targets.

enum { CN = 10, CV = 11, CVP = 16, CTP = 4, CVL = CVP / CTP };
static const int IGNORED[] = {2, 5, 9};

static int is_ignored(int n) { return n == IGNORED[0] || n == IGNORED[1] || n == IGNORED[2]; }

// The vocabulary-parallel steps over CTP simulated ranks: losses (CN), and the ranks' dlogits into dl (CN,CVP).
static void vocab_run(Backend* be, const float* x, const int* targets, float* losses, float* dl) {
    float part[CTP][CN * CVL], rowmax[CTP][CN], stats[CTP][3 * CN], gmax[CN];
    int real[CTP];
    for (int k = 0; k < CTP; k++) {
        real[k] = CV - k * CVL < 0 ? 0 : CV - k * CVL > CVL ? CVL : CV - k * CVL;
        for (int n = 0; n < CN; n++) memcpy(part[k] + n * CVL, x + n * CVP + k * CVL, sizeof(float) * CVL);
        classifier_vocab_max(be, DT_FP32, rowmax[k], part[k], CN, real[k], CVL);
    }
    for (int n = 0; n < CN; n++) {
        gmax[n] = rowmax[0][n];
        for (int k = 1; k < CTP; k++) gmax[n] = fmaxf(gmax[n], rowmax[k][n]);
    }
    for (int k = 0; k < CTP; k++) classifier_vocab_sums(be, DT_FP32, stats[k], part[k], gmax, targets, k * CVL, CN, real[k], CVL);
    for (int k = 0; k < CTP; k++) {
        classifier_vocab_finish(be, DT_FP32, part[k], losses, gmax, &stats[0][0], CTP, targets, k * CVL, CN, real[k], CVL,
                                1.0f / CN, 1);
        for (int n = 0; n < CN; n++) memcpy(dl + n * CVP + k * CVL, part[k] + n * CVL, sizeof(float) * CVL);
    }
}

// Ignored rows: loss +0 and every dlogit 0; the others the bits of a run where no row is ignored.
static int ignore_ok(const float* losses, const float* dl, const float* ref_losses, const float* ref_dl) {
    int ok = 1;
    for (int n = 0; n < CN; n++) {
        if (!is_ignored(n)) {
            ok &= losses[n] == ref_losses[n] && same_bits(dl + n * CVP, ref_dl + n * CVP, sizeof(float) * CVP);
            continue;
        }
        ok &= losses[n] == 0.0f && !signbit(losses[n]);
        for (int v = 0; v < CVP; v++) ok &= dl[n * CVP + v] == 0.0f;
    }
    return ok;
}

static void test_classifier_ignore(TestStats* s, Backend* be) {
    Rng r = {233};
    int targets[CN], all_targets[CN];
    for (int n = 0; n < CN; n++) all_targets[n] = targets[n] = (int)(rng_next(&r) % CV);
    for (int i = 0; i < 3; i++) targets[IGNORED[i]] = CLASSIFIER_IGNORE;
    float* x = rand_vec(&r, CN * CVP, 4, DT_FP32);   // every logit nonzero until dlogits overwrite it
    float losses[CN], ref_losses[CN], dl[CN * CVP], ref_dl[CN * CVP];
    memcpy(ref_dl, x, sizeof ref_dl);
    memcpy(dl, x, sizeof dl);
    classifier_forward(be, DT_FP32, ref_dl, ref_losses, all_targets, CN, CV, CVP, 1.0f / CN, 1);
    classifier_forward(be, DT_FP32, dl, losses, targets, CN, CV, CVP, 1.0f / CN, 1);
    check_true(s, "classifier_ignore_rows", ignore_ok(losses, dl, ref_losses, ref_dl));
    float nodl[CN * CVP];
    memcpy(nodl, x, sizeof nodl);
    classifier_forward(be, DT_FP32, nodl, losses, targets, CN, CV, CVP, 1.0f / CN, 0);
    int ok = same_bits(nodl, x, sizeof nodl);
    for (int n = 0; n < CN; n++) ok &= is_ignored(n) ? losses[n] == 0.0f : losses[n] == ref_losses[n];
    check_true(s, "classifier_ignore_rows_no_dlogits", ok);

    vocab_run(be, x, all_targets, ref_losses, ref_dl);
    vocab_run(be, x, targets, losses, dl);
    check_true(s, "classifier_vocab_ignore_rows", ignore_ok(losses, dl, ref_losses, ref_dl));
    free(x);
}

// ---------------------------------------------------------------------------------------------------
// Bad arrays: a child process calls the kernel; it must exit 1 with one line naming the problem.

typedef enum { BAD_DOC_GAP, BAD_DOC_AHEAD, BAD_POS_PAST_T, BAD_POS_NEGATIVE, BAD_TARGET } BadCase;

static void bad_call(Backend* be, BadCase c) {
    enum { NH = 2, D = 8, C = 8 };
    Docs d = docs_make();
    float qkv[DB * DT * 3 * NH * D] = {0}, out[DB * DT * NH * D], lse[DB * DT * NH], wte[16 * C] = {0}, wpe[DT * C] = {0};
    int tokens[DB * DT] = {0};
    float logits[DB * DT * 16] = {0}, losses[DB * DT];
    switch (c) {
    case BAD_DOC_GAP: d.doc[DT + 9] = 8; break;     // a document starting at 8 that does not hold token 8
    case BAD_DOC_AHEAD: d.doc[DT + 3] = 4; break;   // a token before its document's start
    case BAD_POS_PAST_T: d.pos[2] = 3; break;
    case BAD_POS_NEGATIVE: d.pos[DT + 1] = -1; break;
    case BAD_TARGET: tokens[3] = -2; break;
    }
    if (c <= BAD_DOC_AHEAD) attention_forward(be, DT_FP32, out, lse, qkv, d.doc, DB, DT, NH, NH, D);
    else if (c < BAD_TARGET) encoder_forward(be, DT_FP32, out, tokens, d.pos, wte, wpe, DB, DT, C);
    else classifier_forward(be, DT_FP32, logits, losses, tokens, DB * DT, 11, 16, 1.0f, 1);
}

typedef struct {
    Backend* be;
    BadCase c;
} BadCall;

static void bad_call_body(const void* arg) {
    const BadCall* b = arg;
    bad_call(b->be, b->c);
}

static void check_bad(TestStats* s, Backend* be, BadCase c, const char* name, const char* expect) {
    BadCall b = {be, c};
    check_refusal(s, name, bad_call_body, &b, expect);
}

int main(void) {
    TestStats s = {0, 0};
    Backend* be = backend_create(0);
    // The refusals first, forked while this process has no OpenMP threads yet: a sanitizer's exit-time leak
    // check in a child forked from a threaded parent adds a line of its own to the child's stderr.
    check_bad(&s, be, BAD_DOC_GAP, "attention_doc_gap_is_an_error", "attention: doc 8 at row 1, token 9");
    check_bad(&s, be, BAD_DOC_AHEAD, "attention_doc_ahead_is_an_error", "attention: doc 4 at row 1, token 3");
    check_bad(&s, be, BAD_POS_PAST_T, "encoder_pos_past_t_is_an_error", "encoder_forward: pos 3 at row 0, token 2");
    check_bad(&s, be, BAD_POS_NEGATIVE, "encoder_pos_negative_is_an_error", "encoder_forward: pos -1 at row 1, token 1");
    check_bad(&s, be, BAD_TARGET, "classifier_target_below_ignore_is_an_error", "classifier_forward: target -2 at row 3");
    const int shapes[][3] = {{2, 2, 4}, {4, 2, 16}, {2, 1, 8}};
    for (int i = 0; i < 3; i++) test_attention_docs(&s, be, DT_FP32, shapes[i][0], shapes[i][1], shapes[i][2]);
    test_attention_docs(&s, be, DT_BF16, 4, 2, 16);
    test_attention_one_doc(&s, be);
    test_rope_docs(&s, be, DT_FP32);
    test_rope_docs(&s, be, DT_BF16);
    test_encoder_docs(&s, be);
    test_later_positions(&s, be);
    test_classifier_ignore(&s, be);
    backend_destroy(be);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return test_exit(&s);
}
