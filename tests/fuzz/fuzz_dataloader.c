// fuzz_dataloader.c: token shards through dataloader_open + dataloader_batch.
//
// Input: 8 parameter bytes, then the shards, separated by "SHRD" (up to 8 shards, written as
// shard_0.bin ... so the loader's glob sees them in order). Parameters: B, T, world, rank, shuffle,
// vocab (16 bits), ga. Several steps are read, including one many epochs on, so shard crossings,
// the shuffle permutation and epoch wrap-around all run.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/dataloader.h"

#define MAX_SHARDS 8

// Bytes per token of an accepted shard: 4 under the uint32 format's magic (20240801), else 2.
static long long token_width(const unsigned char* shard, size_t len) {
    static const unsigned char magic32[4] = {0xa1, 0xd9, 0x34, 0x01};
    return len >= 4 && memcmp(shard, magic32, 4) == 0 ? 4 : 2;
}

int main(int argc, char** argv) {
    unsigned char* in;
    size_t n;
    Harness* h = harness_begin(argc, argv, 1, &in, &n);
    if (n < 8) return 0;   // too short to choose parameters: nothing to read
    int B = 1 + in[0] % 4, T = 1 + in[1] % 8, world = 1 + in[2] % 4, rank = in[3] % world, shuffle = in[4] & 1;
    int vocab = 1 + (in[5] | in[6] << 8), ga = 1 + in[7] % 3;

    const unsigned char* part[MAX_SHARDS];
    size_t len[MAX_SHARDS];
    int shards = harness_split(in + 8, n - 8, "SHRD", MAX_SHARDS, part, len);
    char path[PATH_MAX], pattern[PATH_MAX + 32];
    long long want_tokens = 0;
    for (int i = 0; i < shards; i++) {
        char name[32];
        snprintf(name, sizeof name, "shard_%d.bin", i);
        harness_write(h, name, part[i], len[i], path);
        want_tokens += len[i] >= 1024 ? (long long)(len[i] - 1024) / token_width(part[i], len[i]) : 0;
    }
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", harness_dir(h));

    DataLoader* dl = dataloader_open(pattern, B, T, rank, world, shuffle, 1337, vocab);
    // Accepted: every shard's size matched its header, so the token count is the bytes after the headers.
    if (dataloader_num_shards(dl) != shards) harness_bug(h, "%d shards opened, %d written", dataloader_num_shards(dl), shards);
    if (dataloader_num_tokens(dl) != want_tokens)
        harness_bug(h, "%lld tokens counted, the files hold %lld", dataloader_num_tokens(dl), want_tokens);
    long long W = dataloader_windows_per_epoch(dl), bt = (long long)B * T;
    if (W < 1 || W * bt + 1 > want_tokens) harness_bug(h, "%lld windows of %lld from %lld tokens", W, bt, want_tokens);

    int* inputs = malloc((size_t)bt * sizeof(int));
    int* targets = malloc((size_t)bt * sizeof(int));
    if (!inputs || !targets) return 2;
    const long long steps[] = {0, 1, 2, W, 3 * W + 1, INT_MAX};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        for (int micro = 0; micro < ga; micro++) {
            long long start = dataloader_window_start(dl, steps[s], ga, micro);
            if (start < 0 || start % bt != 0 || start + bt + 1 > want_tokens)
                harness_bug(h, "window start %lld (B*T %lld, %lld tokens)", start, bt, want_tokens);
            dataloader_batch(dl, steps[s], ga, micro, inputs, targets);
            for (long long i = 0; i < bt; i++) {
                if (inputs[i] < 0 || inputs[i] >= vocab || targets[i] < 0 || targets[i] >= vocab)
                    harness_bug(h, "token %d / %d outside vocab %d", inputs[i], targets[i], vocab);
                if (i + 1 < bt && targets[i] != inputs[i + 1]) harness_bug(h, "targets are not inputs shifted by one");
            }
        }
    }
    free(inputs);
    free(targets);
    dataloader_close(dl);
    free(in);
    return 0;
}
