// test_onebit.c: 1-bit Adam's compressed all-reduce (core/comm/onebit.h), on one process or under mpirun.
//
//   test_onebit            the identities, on every rank: per compression ||s * sign(y)|| = ||y|| and
//                          c + e_new = x + e_old (worker side over the whole buffer, server side per chunk),
//                          every rank ending with the same bits, and the bytes the exchange counts (signs as
//                          bits and one scale per block)
//   test_onebit --dump DIR also writes each rank's inputs and results of three rounds (the errors carried from
//                          round to round) to DIR/rank<r>.f32, which tests/tools/onebit_oracle.py checks
//                          against its own implementation of DeepSpeed's algorithm (torch_sim)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/comm/comm.h"
#include "core/comm/onebit.h"
#include "core/util/rng.h"
#include "tests/unit/testlib.h"

#define ROUNDS 3
#define LEN 40   // not a multiple of 32: the blocks' last words are partly padding, and chunks start mid-byte

static double norm_of(const float* x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

// One compression: the norm is kept and the error takes exactly the rest (c + e_new = y, y = x + e_old).
static void check_compress(TestStats* st, const float* y, size_t n, const char* name) {
    uint8_t* bits = (uint8_t*)xmalloc(n / 8 + 1);
    float* err = (float*)xmalloc(n * sizeof(float));
    float* c = (float*)xmalloc(n * sizeof(float));
    float scale = onebit_compress(y, err, n, bits);
    onebit_expand(bits, scale, n, c);
    double rest = 0.0, yn = norm_of(y, n);
    for (size_t i = 0; i < n; i++) rest = fmax(rest, fabs((double)c[i] + err[i] - y[i]));
    char label[96];
    snprintf(label, sizeof(label), "%s_norm_kept", name);
    check_close(st, label, fabs(norm_of(c, n) - yn) / (yn > 0 ? yn : 1), 1e-6);
    snprintf(label, sizeof(label), "%s_error_is_rest", name);
    check_close(st, label, rest, 1e-6 * (scale > 1 ? scale : 1));
    free(bits), free(err), free(c);
}

static void check_sign_zero(TestStats* st) {
    float y[3] = {0.0f, -0.0f, -1.0f}, err[3];
    uint8_t bits = 0;
    onebit_compress(y, err, 3, &bits);
    check_true(st, "sign_of_zero_is_plus_one", bits == 0x3);
}

static void fill(float* x, size_t n, uint64_t seed) {
    Rng r = rng_seeded(seed, 7);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_next_u64(&r) >> 11) / 9007199254740992.0f * 2.0f - 1.0f;
}

static void dump(FILE* f, const float* x, size_t n, const char* path) { xfwrite(x, sizeof(float), n, f, path); }

int main(int argc, char** argv) {
    TestStats st = {0};
    Comm* world = comm_init_world(&argc, &argv);
    Backend* be = backend_create(comm_local_rank(world));
    comm_attach_backend(world, be);
    comm_select(world, COMM_MPI);
    int rank = comm_rank(world), size = comm_size(world);
    const char* dir = argc == 3 && !strcmp(argv[1], "--dump") ? argv[2] : NULL;
    if (argc != 1 && !dir) fail("usage: test_onebit [--dump DIR]");
    check_sign_zero(&st);
    size_t n = (size_t)size * LEN;
    float* x = (float*)xcalloc(n, sizeof(float));
    float* e_w = (float*)xcalloc(n, sizeof(float));
    float* e_s = (float*)xcalloc(LEN, sizeof(float));
    float* y = (float*)xmalloc(n * sizeof(float));
    OnebitScratch s = onebit_scratch(be, size, LEN);
    char path[4096];
    FILE* f = NULL;
    if (dir) {
        snprintf(path, sizeof(path), "%s/rank%d.f32", dir, rank);
        f = xfopen(path, "wb");
    }
    int agree = 1;
    for (int round = 0; round < ROUNDS; round++) {
        fill(x, n, 1000u * (uint64_t)round + (uint64_t)rank);
        if (f) dump(f, x, n, path);
        for (size_t i = 0; i < n; i++) y[i] = x[i] + e_w[i];
        check_compress(&st, y, n, "worker");
        check_compress(&st, y + (size_t)rank * LEN, LEN, "chunk");
        comm_reset_bytes(world);
        onebit_allreduce(world, be, &s, x, e_w, e_s, LEN);
        if (round == 0 && size > 1) {
            double words = (double)onebit_block_words(LEN) * 4;
            check_true(&st, "alltoall_bytes_are_bits", comm_bytes_sent(world, COLL_ALLTOALL) == (uint64_t)((size - 1) * words));
            check_true(&st, "allgather_bytes_are_bits", comm_bytes_sent(world, COLL_ALLGATHER) == (uint64_t)((size - 1) * words));
            check_true(&st, "no_fp32_allreduce", comm_bytes_sent(world, COLL_ALLREDUCE) == 0);
        }
        // Each chunk of the result is one server's compression: one scale, signs.
        int two_valued = 1;
        for (size_t i = 0; i < n; i++) two_valued &= fabsf(x[i]) == fabsf(x[i / LEN * LEN]);
        check_true(&st, "result_is_scale_times_sign_per_chunk", two_valued);
        agree &= comm_all_equal(world, fnv1a(FNV1A_START, x, n * sizeof(float)));
        if (f) dump(f, x, n, path), dump(f, e_w, n, path), dump(f, e_s, LEN, path);
    }
    check_true(&st, "every_rank_same_result", agree);
    if (f) xfclose(f, path);
    onebit_scratch_free(&s, be);
    free(x), free(e_w), free(e_s), free(y);
    long long failed = st.failed;
    comm_allreduce_host_sum_i64(world, &failed, 1);
    if (rank == 0) printf("# test_onebit: %d ranks, %d checks, %lld failed\n", size, st.passed + st.failed, failed);
    comm_finalize(world);
    return failed ? 1 : 0;
}
