// test_packing.c: documents in the data loader (core/data/packing.c, documents.c, dataloader.c): best fit
// (against a brute-force fit, and its ties), each slot's pos/doc/target in packed rows and stream windows,
// long documents left out or cut, windows and leftover rows, the labels per window and per step across ranks
// and -ga, and the one-line refusals of bad mask files. Shards and masks are written into a mkdtemp directory.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "core/data/dataloader.h"
#include "core/data/packing.h"
#include "tests/unit/child_testlib.h"

#define VOCAB 1000
#define T_ 8
#define TR MASK_TRAINED
#define DS MASK_DOC_START

static void put32(unsigned char* p, uint32_t u) {
    p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8), p[2] = (unsigned char)(u >> 16), p[3] = (unsigned char)(u >> 24);
}

// A uint16 shard of n tokens and (mask non-NULL) its mask file, headers [magic, version, ntok, set] with
// the mask's magic, version, ntok and set given separately so that a test can make them disagree.
typedef struct {
    int32_t magic, version, ntok;
    uint64_t set;
} MaskHeader;

static void write_pair(const char* dir, const char* name, const uint32_t* tok, const uint8_t* mask, int n, uint64_t set,
                       const MaskHeader* mh) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    unsigned char h[1024] = {0};
    put32(h, 20240520), put32(h + 4, 1), put32(h + 8, (uint32_t)n), put32(h + 12, (uint32_t)set), put32(h + 16, (uint32_t)(set >> 32));
    FILE* f = xfopen(path, "wb");
    xfwrite(h, 1, sizeof h, f, path);
    for (int i = 0; i < n; i++) {
        unsigned char b[2] = {(unsigned char)tok[i], (unsigned char)(tok[i] >> 8)};
        xfwrite(b, 1, 2, f, path);
    }
    xfclose(f, path);
    if (!mask) return;
    MaskHeader m = mh ? *mh : (MaskHeader){20261129, 1, n, set};
    snprintf(path, sizeof path, "%s/%s.mask", dir, name);
    memset(h, 0, sizeof h);
    put32(h, (uint32_t)m.magic), put32(h + 4, (uint32_t)m.version), put32(h + 8, (uint32_t)m.ntok);
    put32(h + 12, (uint32_t)m.set), put32(h + 16, (uint32_t)(m.set >> 32));
    f = xfopen(path, "wb");
    xfwrite(h, 1, sizeof h, f, path);
    if (n) xfwrite(mask, 1, (size_t)n, f, path);
    xfclose(f, path);
}

// ---------------------------------------------------------------------------------------------------
// Best fit.

// The rule spelled out: scan every open row for the smallest room >= len, the first (lowest) on ties.
static long long brute_fit(const int* len, long long n, int T, long long* row_of, int* at) {
    int* used = xcalloc((size_t)n + 1, sizeof *used);
    long long rows = 0;
    for (long long i = 0; i < n; i++) {
        long long best = -1;
        for (long long r = 0; r < rows; r++)
            if (T - used[r] >= len[i] && (best < 0 || used[r] > used[best])) best = r;
        if (best < 0) best = rows++;
        row_of[i] = best, at[i] = used[best], used[best] += len[i];
    }
    free(used);
    return rows;
}

static void test_best_fit(TestStats* st) {
    // Rows 1 and 0 both have room 3 when the 3 comes; row 1 had it first, row 0 (the lower) takes it.
    const int tie[] = {4, 9, 5, 3};
    long long row_of[4];
    int at[4];
    long long rows = packing_best_fit(tie, 4, 12, row_of, at);
    check_true(st, "best_fit_tie_lowest_row", rows == 2 && row_of[0] == 0 && row_of[1] == 1 && row_of[2] == 0 && at[2] == 4 &&
                                                  row_of[3] == 0 && at[3] == 9);
    const int smallest[] = {6, 5, 4, 3, 7, 2, 1};   // 4 -> row 0 (room 4) not row 1 (room 5); 2 -> row 1 (2) not row 2 (3)
    long long r7[7];
    int a7[7];
    rows = packing_best_fit(smallest, 7, 10, r7, a7);
    check_true(st, "best_fit_smallest_room", rows == 3 && r7[2] == 0 && r7[3] == 1 && r7[4] == 2 && r7[5] == 1 && r7[6] == 2);
    // Random lengths, several T (the bitmap's word and summary boundaries: 64, 4096): same as brute force.
    int bad = 0;
    uint64_t s = 12345;
    const int Ts[] = {8, 63, 64, 65, 200, 5000};
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        int T = Ts[k];
        long long n = 1500;
        int* len = xmalloc((size_t)n * sizeof *len);
        for (long long i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            int r = (int)(s >> 33);
            len[i] = 1 + (r % 3 ? r % (T < 40 ? T : T / 4 + 1) : r % T);
            if (len[i] > T) len[i] = T;
        }
        long long *ra = xmalloc((size_t)n * sizeof *ra), *rb = xmalloc((size_t)n * sizeof *rb);
        int *aa = xmalloc((size_t)n * sizeof *aa), *ab = xmalloc((size_t)n * sizeof *ab);
        bad += packing_best_fit(len, n, T, ra, aa) != brute_fit(len, n, T, rb, ab);
        for (long long i = 0; i < n; i++) bad += ra[i] != rb[i] || aa[i] != ab[i];
        free(len), free(ra), free(rb), free(aa), free(ab);
    }
    check_true(st, "best_fit_equals_brute_force", bad == 0);
}

// ---------------------------------------------------------------------------------------------------
// Slots.

static int same(const int* a, const int* b, int n) { return !memcmp(a, b, (size_t)n * sizeof *a); }

static void test_fill_row(TestStats* st) {
    // Two documents (3 and 4 tokens) and a padding of 3: document 2 trains its last two tokens.
    const uint32_t tok[] = {10, 11, 12, 20, 21, 22, 23};
    const uint8_t mask[] = {DS, TR, 0, DS, 0, TR, TR};
    const int lens[] = {3, 4};
    int tokens[10], targets[10], pos[10], doc[10];
    packing_fill_row(tok, mask, lens, 2, 10, tokens, targets, pos, doc);
    const int wt[] = {10, 11, 12, 20, 21, 22, 23, 0, 0, 0}, wg[] = {11, -1, -1, -1, 22, 23, -1, -1, -1, -1};
    const int wp[] = {0, 1, 2, 0, 1, 2, 3, 0, 1, 2}, wd[] = {0, 0, 0, 3, 3, 3, 3, 7, 7, 7};
    check_true(st, "row_tokens_and_padding", same(tokens, wt, 10));
    check_true(st, "row_targets_labels_only_within_document", same(targets, wg, 10));
    check_true(st, "row_pos_restart_per_document", same(pos, wp, 10));
    check_true(st, "row_doc_first_index", same(doc, wd, 10));
    int full[7], ft[7], fp[7], fd[7];   // a row the documents fill: no padding slot
    packing_fill_row(tok, mask, lens, 2, 7, full, ft, fp, fd);
    check_true(st, "row_full_no_padding", same(full, wt, 7) && same(fd, wd, 7) && ft[6] == -1);
}

static void test_fill_window(TestStats* st) {
    // B=2 rows of 4 from 9 stream tokens; masks: a document starts at 2 and 5.
    const uint32_t raw[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const uint8_t mask[] = {0, TR, DS, TR, TR, DS, 0, TR, TR};
    int tokens[8], targets[8], pos[8], doc[8];
    packing_fill_window(raw, mask, -1, 2, 4, tokens, targets, pos, doc);
    const int wg[] = {2, -1, 4, 5, -1, -1, 8, 9}, wd[] = {0, 0, 2, 2, 0, 1, 1, 1}, wp[] = {0, 1, 0, 1, 0, 0, 1, 2};
    check_true(st, "window_masks_targets", same(targets, wg, 8));
    check_true(st, "window_masks_doc_pos", same(doc, wd, 8) && same(pos, wp, 8));
    // Plain shards, the document token 5: every target is the next token.
    packing_fill_window(raw, NULL, 5, 2, 4, tokens, targets, pos, doc);
    const int pg[] = {2, 3, 4, 5, 6, 7, 8, 9}, pd[] = {0, 0, 0, 0, 0, 0, 0, 0}, pp[] = {0, 1, 2, 3, 0, 1, 2, 3};
    check_true(st, "window_doc_token_targets_all", same(targets, pg, 8));
    check_true(st, "window_doc_token_starts", same(doc, pd, 8) && same(pos, pp, 8) && doc[4] == 0);
    const uint32_t raw2[] = {1, 5, 3, 4, 5, 5, 7, 8, 9};   // token 5 at 1 (row 0), at 4 and 5 (row 1: slots 0 and 1)
    packing_fill_window(raw2, NULL, 5, 2, 4, tokens, targets, pos, doc);
    const int qd[] = {0, 1, 1, 1, 0, 1, 1, 1}, qp[] = {0, 0, 1, 2, 0, 0, 1, 2};
    check_true(st, "window_doc_token_restarts", same(doc, qd, 8) && same(pos, qp, 8));
}

// ---------------------------------------------------------------------------------------------------
// The loader.

// A document of len tokens: a start, then labels on every odd position (so a document of len tokens
// has len / 2 labels).
static int put_doc(uint32_t* tok, uint8_t* mask, int at, int len, int id) {
    for (int i = 0; i < len; i++) {
        tok[at + i] = (uint32_t)(id * 16 + i);
        mask[at + i] = i == 0 ? DS : i % 2 ? TR : 0;
    }
    return at + len;
}

// Documents of lengths lens, split over two shards after `split` documents.
static void write_docs(const char* dir, const char* name, const int* lens, int n, int split) {
    uint32_t tok[1024];
    uint8_t mask[1024];
    int at = 0, cut = 0;
    for (int k = 0; k < n; k++) {
        if (k == split) cut = at;
        at = put_doc(tok, mask, at, lens[k], k + 1);
    }
    char a[256], b[256];
    snprintf(a, sizeof a, "%s_train_000001", name), snprintf(b, sizeof b, "%s_train_000002", name);
    write_pair(dir, a, tok, mask, cut, 7, NULL);
    write_pair(dir, b, tok + cut, mask + cut, at - cut, 7, NULL);
}

static int labels(const int* targets, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += targets[i] != -1;
    return c;
}

static void test_loader_packed(TestStats* st, const char* dir) {
    // T=8, lengths 5 3 9 4 4 2 6 1 1 7: the 9 is left out; best fit makes rows [5 3] [4 4] [2 6] [1 1] [7].
    const int lens[] = {5, 3, 9, 4, 4, 2, 6, 1, 1, 7};
    write_docs(dir, "pk", lens, 10, 4);
    char pat[512];
    snprintf(pat, sizeof pat, "%s/pk_train_*.bin", dir);
    DataOptions drop = {1, 0, -1}, cut = {1, 1, -1};
    DataLoader* dl = dataloader_open_documents(pat, 2, T_, 0, 1, 0, 1, VOCAB, &drop);
    PackStats ps = dataloader_pack_stats(dl);
    // Five rows: W = 2 windows of B = 2, one row left over.
    check_true(st, "packed_counts", ps.docs == 10 && ps.long_docs == 1 && ps.rows == 5 && ps.rows_left == 1 &&
                                        dataloader_windows_per_epoch(dl) == 2 && dataloader_is_packed(dl));
    int tok[16], tg[16], pos[16], doc[16];
    Batch b = {tok, tg, pos, doc};
    dataloader_read(dl, 1, 1, 0, &b);   // rows 2 ([2,6]) and 3 ([1,1] + padding)
    // Row 2: document 6 (2 tokens, id 6) then document 7 (6 tokens, id 7).
    const int wt[] = {96, 97, 112, 113, 114, 115, 116, 117, 128, 144, 0, 0, 0, 0, 0, 0};
    const int wd[] = {0, 0, 2, 2, 2, 2, 2, 2, 0, 1, 2, 2, 2, 2, 2, 2};
    const int wg[] = {97, -1, 113, -1, 115, -1, 117, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    check_true(st, "packed_window_tokens", same(tok, wt, 16));
    check_true(st, "packed_window_doc_targets", same(doc, wd, 16) && same(tg, wg, 16) && pos[7] == 5 && pos[15] == 5);
    check_true(st, "packed_trained_per_window", dataloader_window_trained(dl, 1) == labels(tg, 16) &&
                                                    dataloader_window_trained(dl, 0) == 2 + 1 + 2 + 2);
    dataloader_close(dl);
    // -long truncate: the 9-token document keeps its first 8 (labels at 1, 3, 5, 7) and fills a row alone.
    dl = dataloader_open_documents(pat, 2, T_, 0, 1, 0, 1, VOCAB, &cut);
    ps = dataloader_pack_stats(dl);
    check_true(st, "truncate_counts", ps.docs == 10 && ps.long_docs == 1 && ps.rows == 6 && ps.rows_left == 0);
    dataloader_read(dl, 0, 1, 0, &b);   // rows 0 ([5,3]) and 1 (the cut document)
    check_true(st, "truncate_keeps_first_T", tok[8] == 48 && tok[15] == 55 && doc[15] == 0 && pos[15] == 7 && tg[14] == 55 &&
                                                 tg[13] == -1 && tg[12] == 53 && tg[15] == -1);
    dataloader_close(dl);
}

// The labels of a step, as the loader counts them without communication, against what every rank's
// batches hold; with shuffling, over two epochs, for N ranks x G micro-steps.
static void test_step_trained(TestStats* st, const char* dir) {
    int lens[40];
    for (int k = 0; k < 40; k++) lens[k] = 1 + (k * 5) % 8;
    write_docs(dir, "st", lens, 40, 17);
    char pat[512];
    snprintf(pat, sizeof pat, "%s/st_train_*.bin", dir);
    int bad = 0, tok[16], tg[16], pos[16], doc[16];
    Batch b = {tok, tg, pos, doc};
    for (int pack = 0; pack <= 1; pack++) {
        DataOptions o = {pack, 0, -1};
        const int layouts[][2] = {{1, 1}, {2, 1}, {1, 3}, {3, 2}};
        for (int l = 0; l < 4; l++) {
            int N = layouts[l][0], G = layouts[l][1];
            DataLoader* ranks[3] = {NULL, NULL, NULL};
            for (int r = 0; r < N; r++) ranks[r] = dataloader_open_documents(pat, 2, T_, r, N, 1, 9, VOCAB, &o);
            long long W = dataloader_windows_per_epoch(ranks[0]), steps = 2 * W / (N * G) + 1;
            for (long long s = 0; s < steps; s++) {
                long long sum = 0;
                for (int r = 0; r < N; r++)
                    for (int m = 0; m < G; m++) dataloader_read(ranks[r], s, G, m, &b), sum += labels(tg, 16);
                for (int r = 0; r < N; r++) bad += dataloader_step_trained(ranks[r], s, G) != sum;
            }
            for (int r = 0; r < N; r++) dataloader_close(ranks[r]);
        }
    }
    check_true(st, "step_trained_equals_batches_all_layouts", bad == 0);
    // Without masks: B*T*ga*N, today's count.
    uint32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = (uint32_t)i;
    write_pair(dir, "plain", t, NULL, 64, 0, NULL);
    snprintf(pat, sizeof pat, "%s/plain.bin", dir);
    DataOptions dm = {1, 0, 5};
    DataLoader* dl = dataloader_open_documents(pat, 2, T_, 0, 2, 0, 1, VOCAB, &dm);
    check_true(st, "plain_step_trained_is_all", dataloader_step_trained(dl, 1, 3) == 2 * T_ * 3 * 2 && !dataloader_is_packed(dl) &&
                                                    dataloader_has_documents(dl) && !dataloader_has_masks(dl));
    dataloader_read(dl, 0, 1, 0, &b);   // tokens 0..16: the document token 5 starts one at slot 5 of row 0
    check_true(st, "plain_docmask_doc", doc[4] == 0 && doc[5] == 5 && pos[7] == 2 && doc[8] == 0 && labels(tg, 16) == 16);
    dataloader_close(dl);
}

// ---------------------------------------------------------------------------------------------------
// Refusals: one line on stderr, exit 1.

typedef struct {
    const char* pattern;
    int pack;
} OpenCase;

static void open_case(const void* arg) {
    const OpenCase* c = arg;
    DataOptions o = {c->pack, 0, -1};
    DataLoader* dl = dataloader_open_documents(c->pattern, 2, T_, 0, 1, 0, 1, VOCAB, &o);
    dataloader_close(dl);
}

static void expect_error(TestStats* st, const char* name, const char* pattern, int pack, const char* want) {
    OpenCase c = {pattern, pack};
    check_refusal(st, name, open_case, &c, want);
}

static void test_errors(TestStats* st, const char* dir) {
    uint32_t tok[12] = {0};
    uint8_t mask[12] = {DS, TR, TR, DS, TR, TR, DS, TR, TR, DS, TR, TR};
    char pat[512];
    // One shard with a mask, one without.
    write_pair(dir, "half_train_000001", tok, mask, 12, 3, NULL);
    write_pair(dir, "half_train_000002", tok, NULL, 12, 3, NULL);
    snprintf(pat, sizeof pat, "%s/half_train_*.bin", dir);
    expect_error(st, "mask_missing_on_one_shard", pat, 1, "half_train_000002.bin has none");
    struct {
        const char* name;
        MaskHeader h;
        const char* want;
    } hdr[] = {
        {"mask_bad_magic", {20261130, 1, 12, 3}, "wrong magic 20261130"},
        {"mask_bad_version", {20261129, 2, 12, 3}, "wrong version 2"},
        {"mask_ntok_differs", {20261129, 1, 11, 3}, "is for 11 tokens but its shard"},
        {"mask_set_differs", {20261129, 1, 12, 4}, "belongs to set 0000000000000004 but its shard"},
    };
    for (size_t i = 0; i < sizeof hdr / sizeof hdr[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "h%zu_train_000001", i);
        write_pair(dir, name, tok, mask, 12, 3, &hdr[i].h);
        snprintf(pat, sizeof pat, "%s/h%zu_train_*.bin", dir, i);
        expect_error(st, hdr[i].name, pat, 1, hdr[i].want);
    }
    // Bytes: an undefined bit, a start that is a label, a shard that opens inside a document.
    uint8_t m1[12], m2[12], m3[12];
    memcpy(m1, mask, 12), memcpy(m2, mask, 12), memcpy(m3, mask, 12);
    m1[4] = 4, m2[3] = DS | TR, m3[0] = 0;
    write_pair(dir, "b1", tok, m1, 12, 0, NULL), write_pair(dir, "b2", tok, m2, 12, 0, NULL), write_pair(dir, "b3", tok, m3, 12, 0, NULL);
    snprintf(pat, sizeof pat, "%s/b1.bin", dir);
    expect_error(st, "mask_undefined_bit", pat, 1, "byte 4 at token 4");
    snprintf(pat, sizeof pat, "%s/b2.bin", dir);
    expect_error(st, "mask_start_is_label", pat, 1, "token 3 starts a document and is a label");
    snprintf(pat, sizeof pat, "%s/b3.bin", dir);
    expect_error(st, "mask_shard_opens_mid_document", pat, 1, "its first token does not start a document");
    // A truncated mask file (its header says 12 tokens, 11 bytes follow).
    write_pair(dir, "tr", tok, mask, 12, 0, NULL);
    char mp[512];
    snprintf(mp, sizeof mp, "%s/tr.mask", dir);
    if (truncate(mp, 1024 + 11) != 0) fail("truncate %s", mp);
    snprintf(pat, sizeof pat, "%s/tr.bin", dir);
    expect_error(st, "mask_truncated", pat, 1, "has 1035 bytes");
    // Every document longer than T; documents that fill less than one window of B rows.
    uint32_t lt[20] = {0};
    uint8_t lm[20] = {DS};
    write_pair(dir, "long", lt, lm, 20, 0, NULL);
    snprintf(pat, sizeof pat, "%s/long.bin", dir);
    expect_error(st, "all_documents_too_long", pat, 1, "none of their 1 documents fits -t 8");
    write_pair(dir, "few", tok, mask, 6, 0, NULL);   // two documents of 3: one row
    snprintf(pat, sizeof pat, "%s/few.bin", dir);
    expect_error(st, "fewer_rows_than_a_window", pat, 1, "fill 1 rows of -t 8, fewer than one window of -b 2 rows");
}

int main(void) {
    TestStats st = {0, 0};
    char dir[] = "/tmp/test_packing.XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    test_best_fit(&st);
    test_fill_row(&st);
    test_fill_window(&st);
    test_loader_packed(&st, dir);
    test_step_trained(&st, dir);
    test_errors(&st, dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    printf("# %d passed, %d failed\n", st.passed, st.failed);
    return test_exit(&st);
}
