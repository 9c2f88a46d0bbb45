// test_dataloader.c: the data loader (data order, shard boundaries, epochs, shuffling, errors, speed)
// and the tokenizer decoder. Shards and tokenizer files are written here, into a mkdtemp directory.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "core/data/dataloader.h"
#include "core/model/context_parallel.h"
#include "tests/unit/child_testlib.h"
#include "core/tokenizer/decode.h"

#define VOCAB 50257
#define MAGIC16 20240520   // uint16 tokens, version 1
#define MAGIC32 20240801   // uint32 tokens, version 7

// The reference stream: token k of the concatenated shards. Injective for k < 50000, never all zeros.
static int tok(long long k) { return (int)((k * 7 + 3) % 50000); }

static void put32(unsigned char* p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8), p[2] = (unsigned char)(u >> 16), p[3] = (unsigned char)(u >> 24);
}

// Writes a shard: header [magic, version, hdr_ntok], then n tokens (tokens[i], or tok(first+i) if tokens
// is NULL) as little-endian uint32 under MAGIC32, else uint16, then `extra` junk bytes. hdr_len < 1024 writes
// only that much header.
static void write_shard_ex(const char* path, int32_t magic, int32_t version, int32_t hdr_ntok, const uint32_t* tokens,
                           long long first, long long n, int extra, int hdr_len) {
    FILE* f = xfopen(path, "wb");
    unsigned char h[1024] = {0};
    put32(h, magic), put32(h + 4, version), put32(h + 8, hdr_ntok);
    xfwrite(h, 1, (size_t)hdr_len, f, path);
    const int width = magic == MAGIC32 ? 4 : 2;
    unsigned char* body = xmalloc((size_t)(width * n + extra));
    for (long long i = 0; i < n; i++) {
        uint32_t v = tokens ? tokens[i] : (uint32_t)tok(first + i);
        for (int b = 0; b < width; b++) body[width * i + b] = (unsigned char)(v >> 8 * b);
    }
    for (int i = 0; i < extra; i++) body[width * n + i] = 0x5a;
    xfwrite(body, 1, (size_t)(width * n + extra), f, path);
    free(body);
    xfclose(f, path);
}
static void write_shard(const char* path, long long first, long long n) {
    write_shard_ex(path, MAGIC16, 1, (int32_t)n, NULL, first, n, 0, 1024);
}
static void write_shard32(const char* path, long long first, long long n) {
    write_shard_ex(path, MAGIC32, 7, (int32_t)n, NULL, first, n, 0, 1024);
}

// dir/name, in a buffer the caller keeps.
static const char* path_in(char* buf, size_t cap, const char* dir, const char* name) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

// Puts set id `set` into a shard's header (int32 slots 3 and 4, low half first).
static void put_set(const char* path, uint64_t set) {
    unsigned char id[8];
    put32(id, (int32_t)(uint32_t)set), put32(id + 4, (int32_t)(uint32_t)(set >> 32));
    FILE* f = xfopen(path, "r+b");
    xfseek(f, 12, SEEK_SET, path);
    xfwrite(id, 1, sizeof id, f, path);
    xfclose(f, path);
}

// dir/name: a shard of 20 tokens (uint32 ones when wide) whose header carries set id `set`.
static void write_set_shard_w(const char* dir, const char* name, uint64_t set, int wide) {
    char path[512];
    path_in(path, sizeof path, dir, name);
    if (wide) write_shard32(path, 0, 20);
    else write_shard(path, 0, 20);
    put_set(path, set);
}
static void write_set_shard(const char* dir, const char* name, uint64_t set) { write_set_shard_w(dir, name, set, 0); }

// Does the window (inputs, targets) equal the reference stream at `start`?
static int window_is(const int* in, const int* tg, long long bt, long long start) {
    for (long long i = 0; i < bt; i++)
        if (in[i] != tok(start + i) || tg[i] != tok(start + 1 + i)) return 0;
    return 1;
}

// Which window-aligned start does this batch match (-1 if none)?
static long long find_start(const int* in, const int* tg, long long bt, long long W) {
    for (long long j = 0; j < W; j++)
        if (window_is(in, tg, bt, j * bt)) return j * bt;
    return -1;
}

// ---------------------------------------------------------------------------------------------------
// Error cases: each runs in a forked child, which must exit 1 with one line "error: ...<want>...".
typedef struct {
    const char* name;
    const char* pattern;   // dataloader cases
    const char* tokpath;   // tokenizer cases
    int B, T, rank, world, read;
    const char* want;
} ErrCase;

typedef struct {
    ErrCase c;
    int vocab;
} VocabCase;

// Opens c's shards under `vocab` and, when c->read, reads an epoch's windows.
static void open_and_read(const ErrCase* c, int vocab) {
    DataLoader* dl = dataloader_open(c->pattern, c->B, c->T, c->rank, c->world, 0, 1, vocab);
    if (c->read) {
        long long bt = (long long)c->B * c->T;
        int* in = xmalloc((size_t)bt * sizeof(int));
        int* tg = xmalloc((size_t)bt * sizeof(int));
        for (long long s = 0; s < dataloader_windows_per_epoch(dl); s++) dataloader_batch(dl, s, 1, 0, in, tg);
        free(in), free(tg);
    }
    dataloader_close(dl);
}

static void open_or_fail(const void* arg) {
    const ErrCase* c = (const ErrCase*)arg;
    if (c->tokpath) tokenizer_free(tokenizer_load(c->tokpath));
    else open_and_read(c, VOCAB);
}

static void open_or_fail_vocab(const void* arg) {
    const VocabCase* v = (const VocabCase*)arg;
    open_and_read(&v->c, v->vocab);
}

// body(arg) in a child must fail as c says.
static void run_error_body(TestStats* st, const ErrCase* c, ChildBody body, const void* arg) {
    char name[256];
    snprintf(name, sizeof name, "error_%s", c->name);
    check_refusal(st, name, body, arg, c->want);
}

static void run_error_case(TestStats* st, const ErrCase* c) { run_error_body(st, c, open_or_fail, c); }

static void write_tokenizer(const char* path, int32_t magic, int32_t version, int32_t vocab, int32_t eot,
                            const char* const* toks, int ntoks, int extra, int cut) {
    FILE* f = xfopen(path, "wb");
    unsigned char h[1024] = {0};
    put32(h, magic), put32(h + 4, version), put32(h + 8, vocab), put32(h + 12, eot);
    xfwrite(h, 1, sizeof h, f, path);
    for (int i = 0; i < ntoks; i++) {
        size_t len = strlen(toks[i]);
        unsigned char l = (unsigned char)len;
        xfwrite(&l, 1, 1, f, path);
        if (i == ntoks - 1 && cut) len -= (size_t)cut;   // drop the last token's final bytes
        xfwrite(toks[i], 1, len, f, path);
    }
    for (int i = 0; i < extra; i++) xfwrite("x", 1, 1, f, path);
    xfclose(f, path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The small multi-shard stream every order test reads, and buffers for two windows.
typedef struct {
    TestStats* st;
    const char* dir;
    char pat[512];      // small_*.bin
    int B, T;
    long long bt, W;    // B*T, windows per epoch
    int *in, *tg, *in2, *tg2;
} Stream;

// Shard sizes 32, 35, 5, 0 (empty), 88, 16 = 176 tokens, so shards start at tokens 0, 32, 67, 72, 72, 160;
// B*T = 16 divides 176, so W = (176-1)/16 = 10, not 11. Shard i is dir/prefix_0i.bin, of uint32 tokens when
// bit i of wide is set; returns the token count.
static long long write_stream_shards(const char* dir, const char* prefix, unsigned wide) {
    static const int sizes[] = {32, 35, 5, 0, 88, 16};
    long long first = 0;
    for (int i = 0; i < 6; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s_%02d.bin", dir, prefix, i);
        if (wide >> i & 1) write_shard32(path, first, sizes[i]);
        else write_shard(path, first, sizes[i]);
        first += sizes[i];
    }
    return first;
}

static Stream stream_write(TestStats* st, const char* dir) {
    Stream s = {st, dir, "", 2, 8, 16, 0, NULL, NULL, NULL, NULL};
    long long ntok = write_stream_shards(dir, "small", 0);
    snprintf(s.pat, sizeof s.pat, "%s/small_*.bin", dir);
    s.W = (ntok - 1) / s.bt;
    const size_t bytes = sizeof(int) * 8 * 1024;   // also holds the speed test's B=8, T=1024 window
    s.in = xmalloc(bytes), s.tg = xmalloc(bytes), s.in2 = xmalloc(bytes), s.tg2 = xmalloc(bytes);
    return s;
}

static void stream_free(Stream* s) { free(s->in), free(s->tg), free(s->in2), free(s->tg2); }

static void test_shard_boundaries(Stream* s) {
    DataLoader* dl = dataloader_open(s->pat, s->B, s->T, 0, 1, 0, 0, VOCAB);
    int *in = s->in, *tg = s->tg;
    const long long bt = s->bt;
    check_true(s->st, "shards_counted", dataloader_num_shards(dl) == 6);
    check_true(s->st, "tokens_counted", dataloader_num_tokens(dl) == 176);
    check_true(s->st, "windows_per_epoch", dataloader_windows_per_epoch(dl) == s->W && s->W == 10);
    dataloader_batch(dl, 0, 1, 0, in, tg);
    check_true(s->st, "first_window", in[0] == 3 && tg[0] == 10 && window_is(in, tg, bt, 0));
    dataloader_batch(dl, 1, 1, 0, in, tg);   // tokens 16..32: the last target is shard 1's first token
    check_true(s->st, "window_target_in_next_shard", window_is(in, tg, bt, 16));
    dataloader_batch(dl, 2, 1, 0, in, tg);   // tokens 32..48: starts exactly at shard 1
    check_true(s->st, "window_starts_at_shard_start", window_is(in, tg, bt, 32));
    dataloader_batch(dl, 4, 1, 0, in, tg);   // tokens 64..80: shards 1, 2, (3 empty), 4
    check_true(s->st, "window_spans_four_shards", window_is(in, tg, bt, 64));
    dataloader_batch(dl, 9, 1, 0, in, tg);   // last window, 144..160: last target in shard 5
    check_true(s->st, "last_window", window_is(in, tg, bt, 144));
    dataloader_batch(dl, 10, 1, 0, in, tg);   // epoch 2 starts over at token 0
    check_true(s->st, "wrap_into_epoch_2", window_is(in, tg, bt, 0));
    dataloader_batch(dl, 23, 1, 0, in, tg);   // epoch 3, window 3
    check_true(s->st, "epoch_3_window_3", window_is(in, tg, bt, 48));
    dataloader_close(dl);
}

// One shard of 33 tokens, B*T = 16: two windows, the second ending on the stream's last token (the
// stream holds exactly W*B*T + 1 tokens, so a read one token longer runs off its end).
static void test_exact_fit(Stream* s) {
    char path[512];
    write_shard(path_in(path, sizeof path, s->dir, "exact.bin"), 0, 33);
    DataLoader* dl = dataloader_open(path, s->B, s->T, 0, 1, 0, 0, VOCAB);
    int ok = dataloader_windows_per_epoch(dl) == 2;
    for (long long step = 0; step < 4; step++) {   // two epochs
        dataloader_batch(dl, step, 1, 0, s->in, s->tg);
        ok &= window_is(s->in, s->tg, s->bt, step % 2 * s->bt);
    }
    check_true(s->st, "exact_fit_last_window_ends_on_last_token", ok);
    dataloader_close(dl);
}

static void test_design_order(Stream* s) {
    const long long bt = s->bt;
    {   // Literal case: world 2, rank 1, ga 2, step 3, micro 1 -> w = (3*2+1)*2+1 = 15 -> window 5 -> token 80.
        DataLoader* dl = dataloader_open(s->pat, s->B, s->T, 1, 2, 0, 0, VOCAB);
        dataloader_batch(dl, 3, 2, 1, s->in, s->tg);
        check_true(s->st, "design_order_literal",
                   s->in[0] == tok(80) && s->tg[bt - 1] == tok(96) && window_is(s->in, s->tg, bt, 80));
        check_true(s->st, "window_start_literal", dataloader_window_start(dl, 3, 2, 1) == 80);
        dataloader_close(dl);
    }
    // Every (world, rank, ga, step, micro) against the formula in docs/ARCHITECTURE.md, into epoch 3.
    int bad = 0, n = 0;
    for (int world = 1; world <= 3; world++)
        for (int rank = 0; rank < world; rank++) {
            DataLoader* dl = dataloader_open(s->pat, s->B, s->T, rank, world, 0, 0, VOCAB);
            for (int ga = 1; ga <= 3; ga++)
                for (long long step = 0; step < 8; step++)
                    for (int m = 0; m < ga; m++) {
                        long long w = (step * ga + m) * world + rank;
                        dataloader_batch(dl, step, ga, m, s->in, s->tg);
                        bad += !window_is(s->in, s->tg, bt, (w % s->W) * bt);
                        n++;
                    }
            dataloader_close(dl);
        }
    check_true(s->st, "design_order_all_layouts", bad == 0 && n > 100);
}

// N ranks at ga=G see exactly what one rank sees at ga=N*G (micro m*N + r), shuffled or not.
static void test_ranks_equal_ga(Stream* s) {
    const size_t bytes = sizeof(int) * (size_t)s->bt;
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        int bad = 0;
        for (int N = 2; N <= 3; N++)
            for (int G = 1; G <= 2; G++) {
                DataLoader* one = dataloader_open(s->pat, s->B, s->T, 0, 1, shuffle, 7, VOCAB);
                for (int r = 0; r < N; r++) {
                    DataLoader* dl = dataloader_open(s->pat, s->B, s->T, r, N, shuffle, 7, VOCAB);
                    for (long long step = 0; step < 12; step++)
                        for (int m = 0; m < G; m++) {
                            dataloader_batch(dl, step, G, m, s->in, s->tg);
                            dataloader_batch(one, step, N * G, m * N + r, s->in2, s->tg2);
                            bad += memcmp(s->in, s->in2, bytes) != 0 || memcmp(s->tg, s->tg2, bytes) != 0;
                        }
                    dataloader_close(dl);
                }
                dataloader_close(one);
            }
        check_true(s->st, shuffle ? "ranks_equal_ga_shuffled" : "ranks_equal_ga", bad == 0);
    }
}

// Shuffling: a permutation per epoch, different per epoch and seed, same across instances and ranks.
static void test_shuffle(Stream* s) {
    const long long bt = s->bt, W = s->W;
    long long order[3][10], order_seed[10], order_b[3][10];
    DataLoader* a = dataloader_open(s->pat, s->B, s->T, 0, 1, 1, 42, VOCAB);
    DataLoader* b = dataloader_open(s->pat, s->B, s->T, 0, 1, 1, 42, VOCAB);
    DataLoader* c = dataloader_open(s->pat, s->B, s->T, 0, 1, 1, 43, VOCAB);
    int content_ok = 1, perm_ok = 1;
    for (int e = 0; e < 3; e++) {
        int seen[10] = {0};
        for (long long j = 0; j < W; j++) {
            dataloader_batch(a, e * W + j, 1, 0, s->in, s->tg);
            order[e][j] = find_start(s->in, s->tg, bt, W);
            content_ok &= order[e][j] >= 0;
            if (order[e][j] >= 0) seen[order[e][j] / bt]++;
        }
        for (int j = 0; j < W; j++) perm_ok &= seen[j] == 1;
    }
    // Instance b walks epochs backwards (2, 1, 0): the cache must not make the order path-dependent.
    for (int e = 2; e >= 0; e--)
        for (long long j = 0; j < W; j++) order_b[e][j] = dataloader_window_start(b, e * W + j, 1, 0);
    for (long long j = 0; j < W; j++) order_seed[j] = dataloader_window_start(c, j, 1, 0);
    int identity = 1;
    for (long long j = 0; j < W; j++) identity &= order[0][j] == j * bt;
    check_true(s->st, "shuffle_content_matches_stream", content_ok);
    check_true(s->st, "shuffle_is_permutation_each_epoch", perm_ok);
    check_true(s->st, "shuffle_not_identity", !identity);
    check_true(s->st, "shuffle_differs_between_epochs",
               memcmp(order[0], order[1], sizeof order[0]) != 0 && memcmp(order[1], order[2], sizeof order[0]) != 0);
    check_true(s->st, "shuffle_differs_between_seeds", memcmp(order[0], order_seed, sizeof order_seed) != 0);
    check_true(s->st, "shuffle_same_across_instances", memcmp(order, order_b, sizeof order) == 0);
    dataloader_close(a), dataloader_close(b), dataloader_close(c);

    // Over 20 epochs every position holds more than one window and every window visits a position other
    // than its own: a shuffle that never moves some window (the last, say) still permutes each epoch.
    DataLoader* many = dataloader_open(s->pat, s->B, s->T, 0, 1, 1, 42, VOCAB);
    long long at[20][10];
    for (long long e = 0; e < 20; e++)
        for (long long j = 0; j < W; j++) at[e][j] = dataloader_window_start(many, e * W + j, 1, 0);
    int varies = 1;
    for (long long j = 0; j < W; j++) {
        int pos_other = 0, win_moved = 0;
        for (long long e = 0; e < 20; e++) {
            pos_other |= at[e][j] != at[0][j];
            for (long long k = 0; k < W; k++) win_moved |= k != j && at[e][k] == j * bt;
        }
        varies &= pos_other && win_moved;
    }
    check_true(s->st, "shuffle_every_position_and_window_varies", varies);
    dataloader_close(many);

    // Shuffled, ranks: each rank's window is the global order's window w = s*N + r.
    DataLoader* one = dataloader_open(s->pat, s->B, s->T, 0, 1, 1, 5, VOCAB);
    int bad = 0;
    for (int r = 0; r < 4; r++) {
        DataLoader* dl = dataloader_open(s->pat, s->B, s->T, r, 4, 1, 5, VOCAB);
        for (long long step = 0; step < 9; step++)
            bad += dataloader_window_start(dl, step, 1, 0) != dataloader_window_start(one, step * 4 + r, 1, 0);
        dataloader_close(dl);
    }
    check_true(s->st, "shuffle_identical_across_ranks", bad == 0);
    dataloader_close(one);
}

static void test_shard_errors(Stream* s) {
    enum { N_FILES = 8 };
    static char p[N_FILES][512];
    const char* dir = s->dir;
    path_in(p[0], 512, dir, "nothing_*.bin");
    write_shard_ex(path_in(p[1], 512, dir, "short.bin"), MAGIC16, 1, 0, NULL, 0, 0, 0, 100);
    write_shard_ex(path_in(p[2], 512, dir, "magic.bin"), 20240326, 1, 40, NULL, 0, 40, 0, 1024);
    write_shard_ex(path_in(p[3], 512, dir, "version.bin"), MAGIC16, 2, 40, NULL, 0, 40, 0, 1024);
    write_shard_ex(path_in(p[4], 512, dir, "trunc.bin"), MAGIC16, 1, 40, NULL, 0, 39, 1, 1024);   // 79 body bytes
    write_shard_ex(path_in(p[5], 512, dir, "trail.bin"), MAGIC16, 1, 40, NULL, 0, 40, 2, 1024);
    write_shard(path_in(p[6], 512, dir, "few.bin"), 0, 16);   // B*T+1 = 17 needed
    uint32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (uint32_t)tok(i);
    toks[29] = 50300;
    const char* p_vocab = path_in(p[7], 512, dir, "vocab.bin");
    write_shard_ex(p_vocab, MAGIC16, 1, 40, toks, 0, 40, 0, 1024);
    char want_vocab[600];
    snprintf(want_vocab, sizeof want_vocab, "%s: token 50300 at position 29", p_vocab);
    // The boundary: vocab - 1 at position 5 is read; vocab itself, at 29, is refused.
    toks[5] = VOCAB - 1, toks[29] = VOCAB;
    static char p_eq[512];
    write_shard_ex(path_in(p_eq, 512, dir, "vocab_eq.bin"), MAGIC16, 1, 40, toks, 0, 40, 0, 1024);
    char want_eq[600];
    snprintf(want_eq, sizeof want_eq, "%s: token %d at position 29 is >= vocab size %d", p_eq, VOCAB, VOCAB);
    const int B = s->B, T = s->T;
    const ErrCase cases[] = {
        {"no_match", p[0], NULL, B, T, 0, 1, 0, "no token shard matches"},
        {"short_header", p[1], NULL, B, T, 0, 1, 0, "shorter than its 1024-byte header"},
        {"wrong_magic", p[2], NULL, B, T, 0, 1, 0, "wrong magic 20240326 (expected 20240520 for uint16 tokens or "
         "20240801 for uint32)"},
        {"wrong_version", p[3], NULL, B, T, 0, 1, 0, "version.bin has wrong version 2 for magic 20240520 (expected 1)"},
        {"truncated", p[4], NULL, B, T, 0, 1, 0, "truncated"},
        {"trailing_bytes", p[5], NULL, B, T, 0, 1, 0, "has trailing bytes"},
        {"too_few_tokens", p[6], NULL, B, T, 0, 1, 0, "hold 16 tokens, but one window of B*T+1 = 17 tokens is needed"},
        {"token_ge_vocab", p_vocab, NULL, B, T, 0, 1, 1, want_vocab},
        {"token_eq_vocab", p_eq, NULL, B, T, 0, 1, 1, want_eq},
        {"zero_B", s->pat, NULL, 0, T, 0, 1, 0, "B and T must be positive (got B=0 T=8)"},
        {"zero_T", s->pat, NULL, B, 0, 0, 1, 0, "B and T must be positive (got B=2 T=0)"},
        {"bad_rank", s->pat, NULL, B, T, 2, 2, 0, "bad rank 2 of world 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_error_case(s->st, &cases[i]);
    // The same shard with vocab check passing when the bad token is out of reach (control).
    DataLoader* dl = dataloader_open(p_vocab, 2, 8, 0, 1, 0, 0, VOCAB);
    dataloader_batch(dl, 0, 1, 0, s->in, s->tg);   // tokens 0..16
    check_true(s->st, "vocab_checked_on_read_only", window_is(s->in, s->tg, 16, 0));
    dataloader_close(dl);
}

// The small stream as uint32 shards, and as shards of both widths in turn: every window over two epochs, in
// order and shuffled, equals the uint16 stream's (and the reference stream at the window's start).
static void test_u32_same_windows(Stream* s) {
    write_stream_shards(s->dir, "u32", 0x3f);
    write_stream_shards(s->dir, "mixed", 0x15);   // shards 0, 2 and 4 wide: windows cross both ways
    static const char* const names[] = {"u32", "mixed"};
    const size_t bytes = sizeof(int) * (size_t)s->bt;
    for (int k = 0; k < 2; k++) {
        char pat[512], name[64];
        snprintf(pat, sizeof pat, "%s/%s_*.bin", s->dir, names[k]);
        int bad = 0, n = 0;
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            DataLoader* ref = dataloader_open(s->pat, s->B, s->T, 0, 1, shuffle, 9, VOCAB);
            DataLoader* dl = dataloader_open(pat, s->B, s->T, 0, 1, shuffle, 9, VOCAB);
            bad += dataloader_num_tokens(dl) != 176 || dataloader_windows_per_epoch(dl) != s->W;
            for (long long step = 0; step < 2 * s->W; step++, n++) {
                dataloader_batch(ref, step, 1, 0, s->in, s->tg);
                dataloader_batch(dl, step, 1, 0, s->in2, s->tg2);
                bad += memcmp(s->in, s->in2, bytes) != 0 || memcmp(s->tg, s->tg2, bytes) != 0;
                bad += !window_is(s->in2, s->tg2, s->bt, dataloader_window_start(dl, step, 1, 0));
            }
            dataloader_close(ref), dataloader_close(dl);
        }
        snprintf(name, sizeof name, "%s_same_windows_as_u16", names[k]);
        check_true(s->st, name, bad == 0 && n == 4 * s->W);
    }
}

// uint32 tokens past 65,535 (Llama 3's vocabulary holds 128,256) come out whole under a vocabulary that holds
// them; so do 65,535, 65,536 and 0, which a 16-bit read would confuse.
static void test_u32_large_tokens(Stream* s) {
    enum { N = 40, V = 128256 };
    uint32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (uint32_t)(V - 1 - 1601 * i);   // 128255 down to 65816
    toks[1] = 65536, toks[2] = 65535, toks[3] = 0;
    char path[512];
    write_shard_ex(path_in(path, sizeof path, s->dir, "large.bin"), MAGIC32, 7, N, toks, 0, N, 0, 1024);
    DataLoader* dl = dataloader_open(path, s->B, s->T, 0, 1, 0, 0, V);
    int ok = dataloader_windows_per_epoch(dl) == 2;
    for (long long step = 0; step < 2; step++) {
        dataloader_batch(dl, step, 1, 0, s->in, s->tg);
        for (long long i = 0; i < s->bt; i++)
            ok &= s->in[i] == (int)toks[step * s->bt + i] && s->tg[i] == (int)toks[step * s->bt + i + 1];
    }
    check_true(s->st, "u32_tokens_past_uint16_read_whole", ok);
    dataloader_close(dl);
}

// dir/name: a uint32 shard of tokens tok(0..39) but for `early` at position at/2 and `bad` at `at`.
static void write_u32_with(char* path, const char* dir, const char* name, uint32_t early, uint32_t bad, int at) {
    uint32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (uint32_t)tok(i);
    toks[at / 2] = early;
    toks[at] = bad;
    write_shard_ex(path_in(path, 512, dir, name), MAGIC32, 7, 40, toks, 0, 40, 0, 1024);
}

// uint32 shards' refusals: tokens >= vocab (128,256; 50,257, where a 16-bit read of 70,000 would pass as
// 4,464; INT_MAX, past which a signed comparison would pass), a version that is not its magic's, and a size
// that is not the header's count of 4-byte tokens.
static void test_u32_errors(Stream* s) {
    static char p[9][512], want[3][700];
    const char* dir = s->dir;
    write_u32_with(p[0], dir, "u32_vocab.bin", 128255, 128256, 29);   // 128255 (read first) is in the vocabulary
    snprintf(want[0], sizeof want[0], "error: token shard %s: token 128256 at position 29 is >= vocab size 128256\n", p[0]);
    write_u32_with(p[1], dir, "u32_past16.bin", (uint32_t)tok(14), 70000, 29);
    snprintf(want[1], sizeof want[1], "%s: token 70000 at position 29 is >= vocab size 50257", p[1]);
    write_u32_with(p[2], dir, "u32_top.bin", 128255, UINT32_MAX, 7);
    snprintf(want[2], sizeof want[2], "%s: token 4294967295 at position 7 is >= vocab size 2147483647", p[2]);
    write_shard_ex(path_in(p[3], 512, dir, "u32_version.bin"), MAGIC32, 1, 40, NULL, 0, 40, 0, 1024);
    write_shard_ex(path_in(p[4], 512, dir, "u16_version7.bin"), MAGIC16, 7, 40, NULL, 0, 40, 0, 1024);
    write_shard_ex(path_in(p[5], 512, dir, "u32_trunc.bin"), MAGIC32, 7, 40, NULL, 0, 39, 3, 1024);
    write_shard_ex(path_in(p[6], 512, dir, "u32_trail.bin"), MAGIC32, 7, 40, NULL, 0, 40, 2, 1024);
    write_shard_ex(path_in(p[7], 512, dir, "u32_short.bin"), MAGIC32, 7, 40, NULL, 0, 20, 0, 1024);   // 40 x uint16's bytes
    write_shard_ex(path_in(p[8], 512, dir, "u16_wide.bin"), MAGIC16, 1, 40, NULL, 0, 80, 0, 1024);    // 40 x uint32's bytes
    const int B = s->B, T = s->T;
    const VocabCase vocab_cases[] = {
        {{"u32_token_eq_vocab", p[0], NULL, B, T, 0, 1, 1, want[0]}, 128256},
        {{"u32_token_past_uint16_vocab", p[1], NULL, B, T, 0, 1, 1, want[1]}, VOCAB},
        {{"u32_token_past_int_max", p[2], NULL, B, T, 0, 1, 1, want[2]}, INT32_MAX},
    };
    for (size_t i = 0; i < sizeof vocab_cases / sizeof vocab_cases[0]; i++)
        run_error_body(s->st, &vocab_cases[i].c, open_or_fail_vocab, &vocab_cases[i]);
    const ErrCase cases[] = {
        {"u32_wrong_version", p[3], NULL, B, T, 0, 1, 0, "u32_version.bin has wrong version 1 for magic 20240801 "
         "(expected 7)"},
        {"u16_magic_u32_version", p[4], NULL, B, T, 0, 1, 0, "u16_version7.bin has wrong version 7 for magic 20240520 "
         "(expected 1)"},
        {"u32_truncated", p[5], NULL, B, T, 0, 1, 0, "u32_trunc.bin is truncated: header says 40 tokens of 4 bytes "
         "(1184 bytes), file has 1183 bytes"},
        {"u32_trailing_bytes", p[6], NULL, B, T, 0, 1, 0, "u32_trail.bin has trailing bytes: header says 40 tokens "
         "of 4 bytes (1184 bytes), file has 1186 bytes"},
        {"u32_header_u16_body", p[7], NULL, B, T, 0, 1, 0, "u32_short.bin is truncated: header says 40 tokens of 4 "
         "bytes (1184 bytes), file has 1104 bytes"},
        {"u16_header_u32_body", p[8], NULL, B, T, 0, 1, 0, "u16_wide.bin has trailing bytes: header says 40 tokens "
         "of 2 bytes (1104 bytes), file has 1184 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_error_case(s->st, &cases[i]);
    // Control: the first window (tokens 0..16, 128255 at 14) of the shard whose 128256 sits at 29 reads.
    DataLoader* dl = dataloader_open(p[0], B, T, 0, 1, 0, 0, 128256);
    dataloader_batch(dl, 0, 1, 0, s->in, s->tg);
    check_true(s->st, "u32_vocab_checked_on_read_only", s->in[14] == 128255 && s->tg[13] == 128255 &&
               s->in[0] == tok(0) && s->tg[15] == tok(16));
    dataloader_close(dl);
}

// dir/name with exactly n bytes of data.
static void write_bytes(const char* path, const char* data, size_t n) {
    FILE* f = xfopen(path, "wb");
    if (n) xfwrite(data, 1, n, f, path);
    xfclose(f, path);
}

typedef struct {
    const char* pattern;
    int B, T, shards;
} OkCase;

static void open_expecting(const void* arg) {
    const OkCase* c = (const OkCase*)arg;
    DataLoader* dl = dataloader_open(c->pattern, c->B, c->T, 0, 1, 0, 1, VOCAB);
    int n = dataloader_num_shards(dl);
    dataloader_close(dl);
    if (n != c->shards) fprintf(stderr, "opened %d shards, expected %d\n", n, c->shards);
    _exit(n == c->shards ? 0 : 2);
}

// dataloader_open(pattern) in a child process: it must open `shards` shards and exit 0 (a refusal, which
// exits, fails this check alone).
static void run_ok_case(TestStats* st, const char* name, const char* pattern, int B, int T, int shards) {
    OkCase c = {.pattern = pattern, .B = B, .T = T, .shards = shards};
    char msg[2048];
    int status = run_in_child(open_expecting, &c, msg, sizeof msg);
    int good = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!good) printf("# %s: exit status %d, stderr: %s\n", name, WIFEXITED(status) ? WEXITSTATUS(status) : -1, msg);
    check_true(st, name, good);
}

// Shard set ids: one dataset (a name in a directory) whose shards carry two ids is refused, 0 counting as
// an id of its own; different datasets in one glob may differ.
static void test_shard_sets(Stream* s) {
    const uint64_t A = 0xa1a2a3a4b1b2b3b4ULL, B = 0x100000000ULL;   // B: only the high half
    const char* dir = s->dir;
    char sub[512];
    mkdir(path_in(sub, sizeof sub, dir, "d1"), 0755), mkdir(path_in(sub, sizeof sub, dir, "d2"), 0755);
    // tokenize.py's replacement cut short: two of five train shards (and the val shard) are the new set's.
    write_set_shard(dir, "mix_val_000000.bin", B);
    for (int i = 1; i <= 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "mix_train_%06d.bin", i);
        write_set_shard(dir, name, i <= 3 ? A : B);
    }
    // An llm.c set (no id) that a new one began to replace.
    write_set_shard(dir, "old_train_000001.bin", 0), write_set_shard(dir, "old_train_000002.bin", B);
    write_set_shard(dir, "old_train_000003.bin", 0);
    // The same cut short in a set of uint32 shards.
    write_set_shard_w(dir, "w_train_000001.bin", A, 1), write_set_shard_w(dir, "w_train_000002.bin", B, 1);
    write_set_shard_w(dir, "w_train_000003.bin", B, 1);
    static char p_mix[512], p_old[512], p_wide[512];
    char want_mix[700], want_old[700], want_wide[700];
    snprintf(p_mix, sizeof p_mix, "%s/mix_train_*.bin", dir);
    snprintf(want_mix, sizeof want_mix, "token shards mix_{train,val}_*.bin in %s mix two shard sets: 3 of set "
             "a1a2a3a4b1b2b3b4 and 2 of set 0000000100000000; a tokenize.py run that replaced them did not "
             "finish: run tokenize.py again", dir);
    snprintf(p_old, sizeof p_old, "%s/old_*.bin", dir);
    snprintf(want_old, sizeof want_old, "old_{train,val}_*.bin in %s mix two shard sets: 2 of set 0 (none) and 1 "
             "of set 0000000100000000", dir);
    snprintf(p_wide, sizeof p_wide, "%s/w_*.bin", dir);
    snprintf(want_wide, sizeof want_wide, "w_{train,val}_*.bin in %s mix two shard sets: 1 of set a1a2a3a4b1b2b3b4 "
             "and 2 of set 0000000100000000", dir);
    const ErrCase cases[] = {
        {"shard_sets_mixed", p_mix, NULL, s->B, s->T, 0, 1, 0, want_mix},
        {"shard_sets_mixed_with_no_id", p_old, NULL, s->B, s->T, 0, 1, 0, want_old},
        {"shard_sets_mixed_u32", p_wide, NULL, s->B, s->T, 0, 1, 0, want_wide},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_error_case(s->st, &cases[i]);

    // Accepted: two datasets with their own ids; one name in two directories; NAME beside NAME_train;
    // a set with no ids (llm.c's); files of other names (tokenize.py --raw's), each a set of its own.
    write_set_shard(dir, "p_train_000001.bin", A);
    write_set_shard(dir, "q_train_000001.bin", B), write_set_shard(dir, "q_train_000002.bin", B);
    write_set_shard(dir, "d1/r_train_000001.bin", A), write_set_shard(dir, "d2/r_train_000001.bin", B);
    write_set_shard(dir, "n_train_000001.bin", A), write_set_shard(dir, "n_train_train_000001.bin", B);
    write_set_shard(dir, "z_val_000000.bin", 0), write_set_shard(dir, "z_train_000001.bin", 0);
    write_set_shard(dir, "z_train_000002.bin", 0);
    write_set_shard(dir, "raw_a.bin", A), write_set_shard(dir, "raw_b.bin", B), write_set_shard(dir, "raw_c.bin", 0);
    write_set_shard_w(dir, "v_val_000000.bin", A, 0), write_set_shard_w(dir, "v_train_000001.bin", A, 1);
    write_set_shard_w(dir, "v_train_000002.bin", A, 1);
    static const struct {
        const char *name, *pattern;
        int shards;
    } ok[] = {
        {"shard_sets_two_datasets", "[pq]_train_*.bin", 3},
        {"shard_sets_two_directories", "d[12]/r_train_*.bin", 2},
        {"shard_sets_name_and_name_train", "n_train_*.bin", 2},
        {"shard_sets_none", "z_*.bin", 3},
        {"shard_sets_raw_files_alone", "raw_*.bin", 3},
        {"shard_sets_one_id_both_widths", "v_*.bin", 3},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char pat[512];
        run_ok_case(s->st, ok[i].name, path_in(pat, sizeof pat, dir, ok[i].pattern), s->B, s->T, ok[i].shards);
    }
}

// tokenize.py's switch marker: DIR/.tokenize-PID/SWITCHING (its one line: the dataset's NAME) refuses every
// glob with a shard in DIR; a staging directory without it (a run stopped before its switch) does not.
static void test_switch_marker(Stream* s) {
    const uint64_t A = 0x5e75e75e75e75e7ULL;
    char sw[512], sw2[512], stg[512], stg2[512], marker[600], pat[512], pat2[512];
    mkdir(path_in(sw, sizeof sw, s->dir, "sw"), 0755), mkdir(path_in(sw2, sizeof sw2, s->dir, "sw2"), 0755);
    // A first run into an empty directory, stopped during its switch: one set id, nothing for the ids to show.
    write_set_shard(s->dir, "sw/s_train_000001.bin", A), write_set_shard_w(s->dir, "sw/s_train_000002.bin", A, 1);
    write_set_shard(s->dir, "sw2/s_val_000000.bin", A), write_set_shard(s->dir, "sw2/s_train_000001.bin", A);
    mkdir(path_in(stg, sizeof stg, s->dir, "sw/.tokenize-4242"), 0755);
    mkdir(path_in(stg2, sizeof stg2, s->dir, "sw2/.tokenize-77-2"), 0755);
    path_in(pat, sizeof pat, s->dir, "sw/s_train_*.bin");
    path_in(pat2, sizeof pat2, s->dir, "sw*/s_*.bin");
    run_ok_case(s->st, "switch_marker_absent", pat, s->B, s->T, 2);
    run_ok_case(s->st, "switch_marker_absent_two_dirs", pat2, s->B, s->T, 4);

    // The second of two directories, with a marker that names no dataset (a power loss cut its writing).
    static char want[2][1400];
    snprintf(marker, sizeof marker, "%s/SWITCHING", stg2);
    write_bytes(marker, "", 0);
    snprintf(want[0], sizeof want[0], "error: %s: a tokenize.py run stopped while replacing its shards (%s): run "
             "tokenize.py again\n", sw2, marker);
    const ErrCase second = {"switch_marker_second_dir", pat2, NULL, s->B, s->T, 0, 1, 0, want[0]};
    run_error_case(s->st, &second);
    // The marker names the dataset to tokenize again.
    snprintf(marker, sizeof marker, "%s/SWITCHING", stg);
    write_bytes(marker, "s\n", 2);
    snprintf(want[1], sizeof want[1], "error: %s: a tokenize.py run stopped while replacing the shards "
             "s_{train,val}_*.bin there (%s): run tokenize.py again\n", sw, marker);
    const ErrCase named = {"switch_marker", pat, NULL, s->B, s->T, 0, 1, 0, want[1]};
    run_error_case(s->st, &named);
    // Another directory's marker is not this one's.
    run_ok_case(s->st, "switch_marker_other_dir", path_in(pat, sizeof pat, s->dir, "z_*.bin"), s->B, s->T, 3);
}

static const char* const TOKENS[] = {"a", "hello", "", "\xe2\x82\xac", " world", "<|endoftext|>"};

static void test_tokenizer(TestStats* st, const char* dir) {
    char tp[512];
    write_tokenizer(path_in(tp, sizeof tp, dir, "tok_v2.bin"), 20240328, 2, 6, 5, TOKENS, 6, 0, 0);
    Tokenizer* t = tokenizer_load(tp);
    int same = t != NULL;
    for (int i = 0; same && i < 6; i++) same &= strcmp(tokenizer_decode(t, i), TOKENS[i]) == 0;
    check_true(st, "tokenizer_round_trip", same);
    check_true(st, "tokenizer_eot_v2", t && tokenizer_eot(t) == 5 && tokenizer_vocab(t) == 6);
    check_true(st, "tokenizer_out_of_range",
               t && strcmp(tokenizer_decode(t, 6), "") == 0 && strcmp(tokenizer_decode(t, -1), "") == 0);
    tokenizer_free(t);
    // Version 1 has GPT-2's vocabulary and end-of-text token: TOKENS, then empty tokens up to 50257.
    const char** gpt2 = xmalloc(50257 * sizeof(char*));
    for (int i = 0; i < 50257; i++) gpt2[i] = i < 6 ? TOKENS[i] : "";
    write_tokenizer(path_in(tp, sizeof tp, dir, "tok_v1.bin"), 20240328, 1, 50257, 0, gpt2, 50257, 0, 0);
    free(gpt2);
    t = tokenizer_load(tp);
    check_true(st, "tokenizer_v1_eot_50256", t && tokenizer_eot(t) == 50256 && strcmp(tokenizer_decode(t, 1), "hello") == 0);
    tokenizer_free(t);
    check_true(st, "tokenizer_missing_is_null", tokenizer_load(path_in(tp, sizeof tp, dir, "tok_missing.bin")) == NULL);
}

static void test_tokenizer_errors(TestStats* st, const char* dir) {
    static char p[8][512];
    write_tokenizer(path_in(p[0], 512, dir, "tok_magic.bin"), 20240520, 2, 6, 5, TOKENS, 6, 0, 0);
    write_tokenizer(path_in(p[1], 512, dir, "tok_version.bin"), 20240328, 3, 6, 5, TOKENS, 6, 0, 0);
    write_tokenizer(path_in(p[2], 512, dir, "tok_trunc.bin"), 20240328, 2, 6, 5, TOKENS, 6, 0, 2);
    write_tokenizer(path_in(p[3], 512, dir, "tok_fewer.bin"), 20240328, 2, 7, 5, TOKENS, 6, 0, 0);   // 7 said, 6 there
    write_tokenizer(path_in(p[4], 512, dir, "tok_trail.bin"), 20240328, 2, 6, 5, TOKENS, 6, 3, 0);
    write_tokenizer(path_in(p[5], 512, dir, "tok_eot.bin"), 20240328, 2, 6, 6, TOKENS, 6, 0, 0);
    write_shard_ex(path_in(p[6], 512, dir, "tok_short.bin"), 20240328, 2, 6, NULL, 0, 0, 0, 500);
    write_tokenizer(path_in(p[7], 512, dir, "tok_v1_small.bin"), 20240328, 1, 6, 0, TOKENS, 6, 0, 0);
    const ErrCase cases[] = {
        {"tokenizer_wrong_magic", NULL, p[0], 0, 0, 0, 0, 0, "wrong magic"},
        {"tokenizer_bad_version", NULL, p[1], 0, 0, 0, 0, 0, "unsupported version 3"},
        {"tokenizer_truncated_token", NULL, p[2], 0, 0, 0, 0, 0, "truncated"},
        {"tokenizer_missing_tokens", NULL, p[3], 0, 0, 0, 0, 0, "truncated"},
        {"tokenizer_trailing_bytes", NULL, p[4], 0, 0, 0, 0, 0, "trailing bytes"},
        {"tokenizer_bad_eot", NULL, p[5], 0, 0, 0, 0, 0, "eot token 6 outside"},
        {"tokenizer_short_header", NULL, p[6], 0, 0, 0, 0, 0, "shorter than its 1024-byte header"},
        {"tokenizer_v1_without_eot", NULL, p[7], 0, 0, 0, 0, 0, "eot token 50256 outside its vocab of 6"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_error_case(st, &cases[i]);
}

// B=8, T=1024 shuffled windows over 3 shards of 400k tokens (windows cross shards): the content is
// checked; the time per read is printed for whoever reads the log (a timing is not a test here).
static void test_big_shuffled(Stream* s) {
    const long long per = 400000;
    for (int i = 0; i < 3; i++) {
        char path[512], name[32];
        snprintf(name, sizeof name, "big_%d.bin", i);
        uint32_t* toks = xmalloc((size_t)per * sizeof *toks);
        for (long long k = 0; k < per; k++) toks[k] = (uint32_t)((i * per + k) % 50000);
        write_shard_ex(path_in(path, sizeof path, s->dir, name), MAGIC16, 1, (int32_t)per, toks, 0, per, 0, 1024);
        free(toks);
    }
    char pat[512];
    DataLoader* dl = dataloader_open(path_in(pat, sizeof pat, s->dir, "big_*.bin"), 8, 1024, 0, 1, 1, 3, VOCAB);
    dataloader_batch(dl, 0, 1, 0, s->in, s->tg);   // builds the epoch-0 permutation, warms the page cache
    const int nread = 2000;
    int content_ok = 1;
    const double t0 = now_s();
    for (int step = 1; step <= nread; step++) {
        dataloader_batch(dl, step, 1, 0, s->in, s->tg);
        const long long start = dataloader_window_start(dl, step, 1, 0);
        content_ok &= s->in[0] == (int)(start % 50000) && s->tg[8191] == (int)((start + 8192) % 50000);
    }
    printf("# window read (B=8, T=1024, shuffled, %lld windows/epoch, %d reads incl. epoch changes): %.1f us\n",
           dataloader_windows_per_epoch(dl), nread, (now_s() - t0) / nread * 1e6);
    check_true(s->st, "big_shuffled_content", content_ok);
    dataloader_close(dl);
}

// -cp's columns (context_parallel.h): each of N context ranks keeps its pieces of every row, tokens and targets,
// at the positions context_position names, and the ranks together hold every position once. Under -cpm ring
// every rank's causal work (the keys its queries attend: position + 1 each) is the same.
static void test_context_columns(Stream* s) {
    for (int ring = 0; ring <= 1; ring++) {
        int bad = 0, unbalanced = 0;
        for (int N = 2; N <= 4; N *= 2) {
            int Tl = s->T / N, pieces = context_pieces(ring), first[MAX_KEPT_PIECES], seen[64] = {0};
            long long work0 = -1;
            DataLoader* whole = dataloader_open(s->pat, s->B, s->T, 0, 1, 0, 0, VOCAB);
            dataloader_batch(whole, 3, 1, 0, s->in2, s->tg2);
            for (int r = 0; r < N; r++) {
                DataLoader* dl = dataloader_open(s->pat, s->B, s->T, 0, 1, 0, 0, VOCAB);
                for (int i = 0; i < pieces; i++) first[i] = context_piece_start(ring, N, r, Tl, i);
                dataloader_keep_columns(dl, pieces, first, Tl / pieces);
                dataloader_batch(dl, 3, 1, 0, s->in, s->tg);
                long long work = 0;
                for (int b = 0; b < s->B; b++)
                    for (int i = 0; i < Tl; i++) {
                        int p = context_position(ring, N, r, Tl, i), at = b * s->T + p;
                        bad += s->in[b * Tl + i] != s->in2[at] || s->tg[b * Tl + i] != s->tg2[at];
                        seen[at]++;
                        work += p + 1;
                    }
                unbalanced += work0 >= 0 && work != work0;
                work0 = work;
                dataloader_close(dl);
            }
            for (int t = 0; t < s->B * s->T; t++) bad += seen[t] != 1;
            dataloader_close(whole);
        }
        check_true(s->st, ring ? "context_columns_ring" : "context_columns_ulysses", bad == 0);
        if (ring) check_true(s->st, "context_ring_balanced", unbalanced == 0);
    }
}

int main(void) {
    TestStats st = {0, 0};
    char dir[] = "/tmp/test_dataloader.XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    Stream s = stream_write(&st, dir);
    test_shard_boundaries(&s);
    test_exact_fit(&s);
    test_design_order(&s);
    test_ranks_equal_ga(&s);
    test_shuffle(&s);
    test_shard_errors(&s);
    test_u32_same_windows(&s);
    test_u32_large_tokens(&s);
    test_u32_errors(&s);
    test_shard_sets(&s);
    test_switch_marker(&s);
    test_tokenizer(&st, dir);
    test_tokenizer_errors(&st, dir);
    test_big_shuffled(&s);
    test_context_columns(&s);
    stream_free(&s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    printf("# %d passed, %d failed\n", st.passed, st.failed);
    return test_exit(&st);
}
