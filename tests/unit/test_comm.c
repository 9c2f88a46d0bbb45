// test_comm.c: the collectives of comm.h against host computations, on any number of ranks (one process
// alone, or under mpirun; tests/system/t_comm.sh runs 1-4). Every rank can regenerate every rank's data (seeded
// per world rank), so each checks its own results; verdicts are combined over the world and rank 0 prints
// them. Buffers are backend memory, so linked with a GPU backend this checks the staging path too.
//
// Sums of rounded values depend on the order MPI adds them in, so a reduced element passes when it equals
// the result of SOME pairwise reduction tree over the ranks' values (rounding after each add), enumerated
// exactly for groups of up to 4; larger groups fall back to an error bound.
//
//   test_comm                 the checks
//   test_comm --comm nccl     the checks with the bulk collectives on NCCL (a GPU build with NCCL,
//                             build/comm_check_gpu; one GPU per rank); --comm mpi is the default
//   test_comm --misuse MODE   a misuse the comm layer must refuse (see misuse())
//   test_comm --die MODE      rank 1 dies mid-run (MODE: abort, exit3, exit0, fail, kill) while the others wait in
//                             a collective: the launcher must end the whole job.
//   test_comm --hang MODE     the hang watchdog at 1 s: rank 1 stops itself (SIGSTOP) while the others wait in an
//                             all-reduce (MODE stop), or ranks 0 and 1 each wait to receive from the other
//                             (MODE deadlock): the watchdog must end the job with one line naming them.
#include <limits.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "core/comm/comm.h"
#include "base/common.h"
#include "core/util/rng.h"
#include "tests/unit/testlib.h"

#define SEED 20240611u

typedef struct {
    Comm* world;
    int rank, size;
    Backend* be;
    TestStats st;
    int nccl;   // --comm nccl
} T;

typedef struct {
    Comm* c;
    const char* name;
    int members[64];   // world rank of each group rank
    int n;
} Group;

// One verdict per check: a check fails if it failed on any rank; rank 0 prints it.
static void verdict(T* t, const char* name, int ok, const char* why) {
    if (!ok) fprintf(stderr, "rank %d: %s: %s\n", t->rank, name, why);
    long long v[2] = {ok ? 0 : 1, ok ? LLONG_MIN : -(long long)t->rank};   // any failure; the lowest failing rank
    comm_allreduce_host_max_i64(t->world, v, 2);
    int all_ok = v[0] == 0;
    if (all_ok) t->st.passed++;
    else t->st.failed++;
    if (t->rank != 0) return;
    if (all_ok) printf("ok comm_np%d_%s\n", t->size, name);
    else printf("FAIL comm_np%d_%s: failed on rank %d%s%s\n", t->size, name, (int)-v[1], ok ? "" : ": ", ok ? "" : why);
    fflush(stdout);
}

// Nonzero values exactly representable in dt: random magnitudes over 8 binades, or small integers (whose
// sums are exact in every order, for bitwise comparisons between algorithms).
static void gen(float* v, size_t n, uint64_t stream, DType dt, int integers) {
    Rng r = rng_seeded(SEED, stream);
    for (size_t i = 0; i < n; i++) {
        uint64_t u = rng_next_u64(&r);
        float sign = (u & 1) ? -1.0f : 1.0f;
        if (integers) v[i] = sign * (float)(1 + (u >> 1) % 8);
        else v[i] = dtype_round(sign * ldexpf(1.0f + rng_uniform(&r), (int)((u >> 1) % 8) - 4), dt);
    }
}

static uint64_t stream_of(int test, int world_rank) { return (uint64_t)test * 1000 + (uint64_t)world_rank; }

// Every result of a reduction tree over the values v[i] for i in mask, rounding to dt after each add.
static int tree_results(const float* v, unsigned mask, DType dt, float* out, int cap) {
    if ((mask & (mask - 1)) == 0) {
        out[0] = v[__builtin_ctz(mask)];
        return 1;
    }
    int k = 0;
    unsigned low = mask & -mask;
    for (unsigned a = (mask - 1) & mask; a; a = (a - 1) & mask) {
        if (!(a & low)) continue;   // unordered splits: the part holding the lowest member
        float ra[64], rb[64];
        int na = tree_results(v, a, dt, ra, 64), nb = tree_results(v, mask ^ a, dt, rb, 64);
        for (int i = 0; i < na; i++)
            for (int j = 0; j < nb; j++) {
                float x = dtype_round(ra[i] + rb[j], dt);
                int seen = 0;
                for (int q = 0; q < k && !seen; q++) seen = memcmp(&out[q], &x, 4) == 0;
                if (!seen && k < cap) out[k++] = x;
            }
    }
    return k;
}

// Is x a possible reduction of the n values v (each already in dt)?
static int sum_ok(float x, const float* v, int n, DType dt) {
    if (n <= 4) {
        float r[64];
        int k = tree_results(v, (1u << n) - 1, dt, r, 64);
        for (int i = 0; i < k; i++)
            if (memcmp(&r[i], &x, 4) == 0) return 1;
        return 0;
    }
    double exact = 0, mag = 0;
    for (int i = 0; i < n; i++) exact += v[i], mag += fabs(v[i]);
    double u = dt == DT_FP32 ? 0x1p-24 : dt == DT_BF16 ? 0x1p-8 : 0x1p-11;
    return fabs(x - exact) <= (n - 1) * u * mag * 1.001 + 1e-30;
}

static void* dev_from_host(T* t, const float* x, size_t n, DType dt) {
    void* h = xmalloc(n * dtype_size(dt) + 1);
    host_to_dtype(h, dt, x, n);
    void* d = be_malloc(t->be, n * dtype_size(dt));
    be_upload(t->be, d, h, n * dtype_size(dt));
    free(h);
    return d;
}
static void host_from_dev(T* t, float* x, const void* d, size_t n, DType dt) {
    void* h = xmalloc(n * dtype_size(dt) + 1);
    be_download(t->be, h, d, n * dtype_size(dt));
    host_from_dtype(x, h, dt, n);
    free(h);
}

static uint32_t hash_bytes(const void* p, size_t n) {
    const unsigned char* b = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

// Are the n floats at x identical on every rank of the group?
static int same_on_group(Group* g, const float* x, size_t n) {
    long long h[2] = {hash_bytes(x, n * 4), 0};
    h[1] = -h[0];
    comm_allreduce_host_max_i64(g->c, h, 2);
    return h[0] == -h[1];
}

static uint64_t ring_bytes(int n, uint64_t s, int twice) { return n <= 1 ? 0 : (twice ? 2 : 1) * (uint64_t)(n - 1) * s / (uint64_t)n; }

static int counters_are(Comm* c, Collective k, uint64_t expect) {
    int ok = 1;
    for (int j = 0; j < NUM_COLLECTIVES; j++) ok &= comm_bytes_sent(c, (Collective)j) == (j == (int)k ? expect : 0);
    return ok;
}

static void test_reductions(T* t, Group* g, DType dt, size_t n, int test_id) {
    int gr = comm_rank(g->c), gn = comm_size(g->c);
    char name[160], why[160] = "";
    size_t total = (size_t)gn * n;
    float* mine = xmalloc(total * sizeof(float));
    float* got = xmalloc(total * sizeof(float));
    float* all = xmalloc((size_t)gn * total * sizeof(float));   // every member's input
    float vals[64];
    for (int k = 0; k < gn; k++) gen(all + (size_t)k * total, total, stream_of(test_id, g->members[k]), dt, 0);
    memcpy(mine, all + (size_t)gr * total, total * sizeof(float));
    size_t es = dtype_size(dt);

    // all-reduce (in place) of the first n elements
    comm_reset_bytes(g->c);
    void* d = dev_from_host(t, mine, n, dt);
    comm_allreduce_sum(g->c, d, n, dt);
    host_from_dev(t, got, d, n, dt);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        for (int k = 0; k < gn; k++) vals[k] = all[(size_t)k * total + i];
        if (!sum_ok(got[i], vals, gn, dt)) {
            ok = 0;
            snprintf(why, sizeof why, "element %zu = %.9g, not a sum of the ranks' values", i, got[i]);
        }
    }
    snprintf(name, sizeof name, "allreduce_%s_%s_n%zu", dtype_name(dt), g->name, n);
    verdict(t, name, ok, why);
    snprintf(name, sizeof name, "allreduce_%s_%s_n%zu_same_bits_on_every_rank", dtype_name(dt), g->name, n);
    verdict(t, name, same_on_group(g, got, n), "results differ between ranks");
    snprintf(name, sizeof name, "allreduce_%s_%s_n%zu_bytes", dtype_name(dt), g->name, n);
    uint64_t expect = ring_bytes(gn, n * es, 1);
    snprintf(why, sizeof why, "counted %llu, expected %llu", (unsigned long long)comm_bytes_sent(g->c, COLL_ALLREDUCE),
             (unsigned long long)expect);
    verdict(t, name, counters_are(g->c, COLL_ALLREDUCE, expect), why);
    be_free(t->be, d);

    // reduce-scatter, out of place and in place
    for (int in_place = 0; in_place < 2; in_place++) {
        comm_reset_bytes(g->c);
        void* din = dev_from_host(t, mine, total, dt);
        void* dout = in_place ? (char*)din + (size_t)gr * n * es : be_malloc(t->be, n * es);
        comm_reduce_scatter_sum(g->c, dout, din, n, dt);
        host_from_dev(t, got, din, total, dt);   // the other slots (all slots out of place) must be untouched
        ok = 1;
        snprintf(why, sizeof why, "input changed");
        for (size_t i = 0; i < total && ok; i++)
            if (!(in_place && i / n == (size_t)gr)) ok = memcmp(&got[i], &mine[i], 4) == 0;
        host_from_dev(t, got, dout, n, dt);
        for (size_t i = 0; i < n && ok; i++) {
            for (int k = 0; k < gn; k++) vals[k] = all[(size_t)k * total + (size_t)gr * n + i];
            if (!sum_ok(got[i], vals, gn, dt)) {
                ok = 0;
                snprintf(why, sizeof why, "element %zu = %.9g, not a sum of the ranks' values", i, got[i]);
            }
        }
        snprintf(name, sizeof name, "reduce_scatter_%s_%s_%s_n%zu", in_place ? "inplace" : "outofplace",
                 dtype_name(dt), g->name, n);
        verdict(t, name, ok, why);
        expect = ring_bytes(gn, total * es, 0);
        snprintf(name, sizeof name, "reduce_scatter_%s_%s_%s_n%zu_bytes", in_place ? "inplace" : "outofplace",
                 dtype_name(dt), g->name, n);
        snprintf(why, sizeof why, "counted %llu, expected %llu",
                 (unsigned long long)comm_bytes_sent(g->c, COLL_REDUCE_SCATTER), (unsigned long long)expect);
        verdict(t, name, counters_are(g->c, COLL_REDUCE_SCATTER, expect), why);
        if (!in_place) be_free(t->be, dout);
        be_free(t->be, din);
    }

    // all-gather: own slot from `mine`, other slots hold a sentinel that must be overwritten
    comm_reset_bytes(g->c);
    for (size_t i = 0; i < total; i++) got[i] = i / n == (size_t)gr ? mine[i] : -3.0f;
    d = dev_from_host(t, got, total, dt);
    comm_allgather(g->c, d, n, dt);
    host_from_dev(t, got, d, total, dt);
    ok = 1;
    for (size_t i = 0; i < total && ok; i++) {
        size_t k = i / n;
        ok = memcmp(&got[i], &all[k * total + i], 4) == 0;
        if (!ok) snprintf(why, sizeof why, "element %zu (slot %zu) = %.9g, expected %.9g", i, k, got[i], all[k * total + i]);
    }
    snprintf(name, sizeof name, "allgather_%s_%s_n%zu", dtype_name(dt), g->name, n);
    verdict(t, name, ok, why);
    expect = ring_bytes(gn, total * es, 0);
    snprintf(name, sizeof name, "allgather_%s_%s_n%zu_bytes", dtype_name(dt), g->name, n);
    snprintf(why, sizeof why, "counted %llu, expected %llu", (unsigned long long)comm_bytes_sent(g->c, COLL_ALLGATHER),
             (unsigned long long)expect);
    verdict(t, name, counters_are(g->c, COLL_ALLGATHER, expect), why);
    be_free(t->be, d);

    // reduce-scatter + all-gather == all-reduce, bitwise, on integer data (exact in any order)
    for (int k = 0; k < gn; k++) gen(all + (size_t)k * total, total, stream_of(test_id + 1, g->members[k]), dt, 1);
    memcpy(mine, all + (size_t)gr * total, total * sizeof(float));
    void* a = dev_from_host(t, mine, total, dt);
    void* b = dev_from_host(t, mine, total, dt);
    comm_allreduce_sum(g->c, a, total, dt);
    comm_reduce_scatter_sum(g->c, (char*)b + (size_t)gr * n * es, b, n, dt);
    comm_allgather(g->c, b, n, dt);
    float* got2 = xmalloc(total * sizeof(float));
    host_from_dev(t, got, a, total, dt);
    host_from_dev(t, got2, b, total, dt);
    ok = memcmp(got, got2, total * sizeof(float)) == 0;
    snprintf(why, sizeof why, "results differ");
    for (size_t i = 0; i < total && ok; i++) {
        double s = 0;
        for (int k = 0; k < gn; k++) s += all[(size_t)k * total + i];
        ok = got[i] == (float)s;
        if (!ok) snprintf(why, sizeof why, "element %zu = %.9g, exact sum %.9g", i, got[i], s);
    }
    snprintf(name, sizeof name, "reduce_scatter_allgather_eq_allreduce_%s_%s_n%zu", dtype_name(dt), g->name, n);
    verdict(t, name, ok, why);
    be_free(t->be, a);
    be_free(t->be, b);
    free(got2);
    free(all);
    free(got);
    free(mine);
}

// All-to-all: member k's input block j must arrive as member j's output block k, bit for bit (no
// arithmetic), every output block written (a sentinel fills out first), the input untouched, and the
// count (N-1)/N of the buffer. The reversed group proves the blocks follow group ranks, not world ranks.
static void test_alltoall(T* t, Group* g, DType dt, size_t n, int test_id) {
    int gr = comm_rank(g->c), gn = comm_size(g->c);
    size_t total = (size_t)gn * n, es = dtype_size(dt);
    float* all = xmalloc((size_t)gn * total * sizeof(float));   // every member's input
    float* got = xmalloc(total * sizeof(float));
    float* sentinel = xmalloc(total * sizeof(float));
    for (int k = 0; k < gn; k++) gen(all + (size_t)k * total, total, stream_of(test_id, g->members[k]), dt, 0);
    for (size_t i = 0; i < total; i++) sentinel[i] = -3.0f;
    const float* mine = all + (size_t)gr * total;
    void* din = dev_from_host(t, mine, total, dt);
    void* dout = dev_from_host(t, sentinel, total, dt);
    comm_reset_bytes(g->c);
    comm_alltoall(g->c, dout, din, n, dt);
    char name[160], why[160] = "";
    host_from_dev(t, got, dout, total, dt);
    int ok = 1;
    for (size_t i = 0; i < total && ok; i++) {
        size_t from = i / n, at = (size_t)gr * n + i % n;   // block `from` came from member `from`'s block gr
        const float* want = &all[from * total + at];
        ok = memcmp(&got[i], want, 4) == 0;
        if (!ok) snprintf(why, sizeof why, "element %zu (block %zu) = %.9g, expected %.9g", i, from, got[i], *want);
    }
    host_from_dev(t, got, din, total, dt);
    if (ok && memcmp(got, mine, total * sizeof(float)) != 0) ok = 0, snprintf(why, sizeof why, "input changed");
    snprintf(name, sizeof name, "alltoall_%s_%s_n%zu", dtype_name(dt), g->name, n);
    verdict(t, name, ok, why);
    uint64_t expect = ring_bytes(gn, total * es, 0);
    snprintf(name, sizeof name, "alltoall_%s_%s_n%zu_bytes", dtype_name(dt), g->name, n);
    snprintf(why, sizeof why, "counted %llu, expected %llu", (unsigned long long)comm_bytes_sent(g->c, COLL_ALLTOALL),
             (unsigned long long)expect);
    verdict(t, name, counters_are(g->c, COLL_ALLTOALL, expect), why);
    be_free(t->be, din), be_free(t->be, dout);
    free(all), free(got), free(sentinel);
}

// The reduce-scatters (in place, out of place) and the all-gather of test_async, run one of three ways:
// ASYNC_NONE the synchronous calls; ASYNC_EACH each started and waited for at once; ASYNC_ALL all three
// started, then waited for in reverse order. res receives the in-place reduce-scatter's buffer (total),
// the out-of-place one's result (n) and the all-gather's buffer (total).
enum { ASYNC_NONE, ASYNC_EACH, ASYNC_ALL };

static int poison_on(void) {
    const char* p = getenv("GPT_COMM_POISON");
    return p && !strcmp(p, "1");
}

// Are all `bytes` bytes at device pointer d the poison (0xff)?
static int poisoned(T* t, const void* d, size_t bytes) {
    unsigned char* h = xmalloc(bytes + 1);
    be_download(t->be, h, d, bytes);
    int ok = 1;
    for (size_t i = 0; i < bytes && ok; i++) ok = h[i] == 0xff;
    free(h);
    return ok;
}

static void async_set(T* t, Group* g, DType dt, size_t n, const float* mine, int mode, float* res, int* poison_seen) {
    int gr = comm_rank(g->c), gn = comm_size(g->c);
    size_t total = (size_t)gn * n, es = dtype_size(dt);
    float* ag = xmalloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) ag[i] = i / n == (size_t)gr ? mine[i] : -3.0f;
    void* a = dev_from_host(t, mine, total, dt);
    void* b = dev_from_host(t, mine, total, dt);
    void* o = be_malloc(t->be, n * es);
    void* c = dev_from_host(t, ag, total, dt);
    void* a_out = (char*)a + (size_t)gr * n * es;
    if (mode == ASYNC_NONE) {
        comm_reduce_scatter_sum(g->c, a_out, a, n, dt);
        comm_reduce_scatter_sum(g->c, o, b, n, dt);
        comm_allgather(g->c, c, n, dt);
    } else if (mode == ASYNC_EACH) {
        CommHandle h = comm_reduce_scatter_sum_start(g->c, a_out, a, n, dt);
        comm_wait(g->c, &h);
        h = comm_reduce_scatter_sum_start(g->c, o, b, n, dt);
        comm_wait(g->c, &h);
        h = comm_allgather_start(g->c, c, n, dt);
        comm_wait(g->c, &h);
        comm_wait(g->c, &h);   // a cleared handle: returns at once
    } else {
        CommHandle h[3] = {comm_reduce_scatter_sum_start(g->c, a_out, a, n, dt),
                           comm_reduce_scatter_sum_start(g->c, o, b, n, dt), comm_allgather_start(g->c, c, n, dt)};
        // In flight, poison mode: what the collectives will write reads as 0xff (nothing on one rank).
        size_t before = (size_t)gr * n * es, after = (size_t)(gn - 1 - gr) * n * es;
        *poison_seen = gn == 1 || (poisoned(t, a_out, n * es) && poisoned(t, o, n * es) && poisoned(t, c, before) &&
                                   poisoned(t, (char*)c + before + n * es, after));
        for (int i = 2; i >= 0; i--) comm_wait(g->c, &h[i]);
    }
    host_from_dev(t, res, a, total, dt);
    host_from_dev(t, res + total, o, n, dt);
    host_from_dev(t, res + total + n, c, total, dt);
    be_free(t->be, a), be_free(t->be, b), be_free(t->be, o), be_free(t->be, c);
    free(ag);
}

// Start/wait give the synchronous calls' bits, on values whose sums depend on the order of the additions,
// and count the same bytes.
static void test_async(T* t, Group* g, DType dt, size_t n, int test_id) {
    int gn = comm_size(g->c);
    size_t total = (size_t)gn * n, es = dtype_size(dt), m = 2 * total + n;
    float* mine = xmalloc(total * sizeof(float));
    float* res[3];
    gen(mine, total, stream_of(test_id, t->rank), dt, 0);
    int poison_seen = 1;
    for (int mode = ASYNC_NONE; mode <= ASYNC_ALL; mode++) {
        res[mode] = xmalloc(m * sizeof(float));
        comm_reset_bytes(g->c);
        async_set(t, g, dt, n, mine, mode, res[mode], &poison_seen);
    }
    static const char* const modes[3] = {"", "each", "all_in_flight"};
    char name[160], why[160];
    for (int mode = ASYNC_EACH; mode <= ASYNC_ALL; mode++) {
        size_t bad = m;
        for (size_t i = 0; i < m && bad == m; i++)
            if (memcmp(&res[mode][i], &res[ASYNC_NONE][i], 4) != 0) bad = i;
        snprintf(why, sizeof why, "element %zu differs: %.9g, synchronous %.9g", bad, bad < m ? res[mode][bad] : 0.0,
                 bad < m ? res[ASYNC_NONE][bad] : 0.0);
        snprintf(name, sizeof name, "async_%s_%s_%s_n%zu_same_bits_as_sync", modes[mode], dtype_name(dt), g->name, n);
        verdict(t, name, bad == m, why);
    }
    uint64_t rs = comm_bytes_sent(g->c, COLL_REDUCE_SCATTER), ag = comm_bytes_sent(g->c, COLL_ALLGATHER);
    uint64_t want = ring_bytes(gn, total * es, 0);
    snprintf(why, sizeof why, "reduce_scatter %llu (expected %llu), allgather %llu (expected %llu)",
             (unsigned long long)rs, (unsigned long long)(2 * want), (unsigned long long)ag, (unsigned long long)want);
    snprintf(name, sizeof name, "async_%s_%s_n%zu_bytes", dtype_name(dt), g->name, n);
    verdict(t, name, rs == 2 * want && ag == want && comm_bytes_sent(g->c, COLL_ALLREDUCE) == 0, why);
    if (poison_on()) {
        snprintf(name, sizeof name, "async_%s_%s_n%zu_poisoned_in_flight", dtype_name(dt), g->name, n);
        verdict(t, name, poison_seen, "a buffer in flight did not read as poison");
    }
    for (int mode = 0; mode < 3; mode++) free(res[mode]);
    free(mine);
}

// COMM_MAX_IN_FLIGHT all-gathers in flight at once, waited for in start order, each with the right result.
static void test_in_flight_limit(T* t, size_t n) {
    void* d[COMM_MAX_IN_FLIGHT];
    CommHandle h[COMM_MAX_IN_FLIGHT];
    size_t total = (size_t)t->size * n;
    float* x = xmalloc(total * sizeof(float));
    for (int k = 0; k < COMM_MAX_IN_FLIGHT; k++) {
        for (size_t i = 0; i < total; i++) x[i] = i / n == (size_t)t->rank ? (float)(k * 1000 + t->rank) : -1.0f;
        d[k] = dev_from_host(t, x, total, DT_FP32);
        h[k] = comm_allgather_start(t->world, d[k], n, DT_FP32);
    }
    int ok = 1;
    for (int k = 0; k < COMM_MAX_IN_FLIGHT; k++) {
        comm_wait(t->world, &h[k]);
        host_from_dev(t, x, d[k], total, DT_FP32);
        for (size_t i = 0; i < total && ok; i++) ok = x[i] == (float)(k * 1000 + (int)(i / n));
        be_free(t->be, d[k]);
    }
    verdict(t, "async_max_in_flight_allgathers", ok, "a result is wrong");
    free(x);
}

// --misuse MODE (2+ ranks): a use the comm layer must refuse with a one-line error. too-many: one start
// beyond COMM_MAX_IN_FLIGHT; write-in-flight (with GPT_COMM_POISON=1): a write into a buffer in flight;
// exchange-order: rank 1 lists rank 0's two messages in the other order; exchange-overlap: a send and a
// receive of one exchange on overlapping memory; alltoall-overlap, alltoall-in-place: an all-to-all whose
// out overlaps its in; exchange-receive-written, exchange-send-written (with GPT_COMM_POISON=1): a write into
// a started exchange's receive or send before its wait.
static void misuse(T* t, const char* mode) {
    size_t n = 16;
    void* d = be_malloc(t->be, (size_t)t->size * n * 4 * (COMM_MAX_IN_FLIGHT + 1));
    be_memset0(t->be, d, (size_t)t->size * n * 4 * (COMM_MAX_IN_FLIGHT + 1));
    if (!strcmp(mode, "too-many")) {
        for (int k = 0; k <= COMM_MAX_IN_FLIGHT; k++)
            comm_allgather_start(t->world, (float*)d + (size_t)k * t->size * n, n, DT_FP32);
    } else if (!strcmp(mode, "write-in-flight")) {
        CommHandle h = comm_reduce_scatter_sum_start(t->world, (float*)d + (size_t)t->rank * n, d, n, DT_FP32);
        float one = 1;
        be_upload(t->be, (float*)d + (size_t)((t->rank + 1) % t->size) * n, &one, 4);   // another rank's slot
        comm_wait(t->world, &h);
    } else if (!strcmp(mode, "exchange-order") && t->rank < 2) {
        int first = t->rank == 0 ? 1 : 2;
        CommMessage m[2] = {{.send = t->rank == 0, .buf = d, .bytes = 4, .peer = 1 - t->rank, .tag = first},
                            {.send = t->rank == 0, .buf = (float*)d + 1, .bytes = 4, .peer = 1 - t->rank, .tag = 3 - first}};
        comm_exchange(t->world, m, 2);
        comm_barrier(t->world);   // rank 0 waits here for rank 1's error to end the job
    } else if (!strcmp(mode, "alltoall-overlap")) {   // out one element past in: overlapping, not in place
        comm_alltoall(t->world, (float*)d + 1, d, n, DT_FP32);
    } else if (!strcmp(mode, "alltoall-in-place")) {
        comm_alltoall(t->world, d, d, n, DT_FP32);
    } else if (!strcmp(mode, "exchange-receive-written") || !strcmp(mode, "exchange-send-written")) {
        int next = (t->rank + 1) % t->size, prev = (t->rank + t->size - 1) % t->size;
        CommMessage m[2] = {{.send = 1, .buf = d, .bytes = 64, .peer = next, .tag = 5},
                            {.send = 0, .buf = (char*)d + 64, .bytes = 64, .peer = prev, .tag = 5}};
        CommHandle h = comm_exchange_start(t->world, m, 2);
        float one = 1;
        be_upload(t->be, (char*)d + (strcmp(mode, "exchange-send-written") ? 64 : 0), &one, 4);
        comm_wait(t->world, &h);
    } else if (!strcmp(mode, "exchange-overlap")) {
        CommMessage m[2] = {{.send = 1, .buf = d, .bytes = 8, .peer = 1 - t->rank % 2, .tag = 1},
                            {.send = 0, .buf = (float*)d + 1, .bytes = 8, .peer = 1 - t->rank % 2, .tag = 1}};
        comm_exchange(t->world, m, 2);
    }
    fail("--misuse %s: not refused", mode);
}

static void test_broadcast(T* t, Group* g, size_t bytes, int test_id) {
    int gr = comm_rank(g->c), gn = comm_size(g->c);
    unsigned char* expect = xmalloc(bytes + 1);
    unsigned char* got = xmalloc(bytes + 1);
    void* d = be_malloc(t->be, bytes);
    // the first and last rank as roots: the same number of checks in every group, whatever its size
    for (int which = 0; which < 2; which++) {
        int root = which ? gn - 1 : 0;
        Rng r = rng_seeded(SEED, stream_of(test_id, g->members[root]));
        for (size_t i = 0; i < bytes; i++) expect[i] = (unsigned char)(rng_next_u64(&r) | 1);
        memset(got, gr == root ? 0 : 0xee, bytes);
        if (gr == root) memcpy(got, expect, bytes);
        be_upload(t->be, d, got, bytes);
        comm_reset_bytes(g->c);
        comm_broadcast(g->c, d, bytes, root);
        be_download(t->be, got, d, bytes);
        char name[128];
        snprintf(name, sizeof name, "broadcast_%s_root%s_%zub", g->name, which ? "last" : "first", bytes);
        verdict(t, name, memcmp(got, expect, bytes) == 0, "data differs from the root's");
        snprintf(name, sizeof name, "broadcast_%s_root%s_%zub_bytes", g->name, which ? "last" : "first", bytes);
        verdict(t, name, counters_are(g->c, COLL_BROADCAST, gr == root && gn > 1 ? bytes : 0), "wrong count");
    }
    be_free(t->be, d);
    free(got);
    free(expect);
}

// One exchange per rank around the ring: two messages to the successor and two from the predecessor, all
// posted together (with rendezvous sends, separate exchanges would deadlock the ring).
static void test_ring(T* t, size_t bytes) {
    if (t->size < 2) return;
    int next = (t->rank + 1) % t->size, prev = (t->rank + t->size - 1) % t->size;
    size_t n = bytes / 4;
    float *x = xmalloc(bytes), *y = xmalloc(bytes), *e = xmalloc(bytes);
    comm_reset_bytes(t->world);
    void* d[4];
    for (int k = 0; k < 4; k++) d[k] = be_malloc(t->be, bytes);
    for (int k = 0; k < 2; k++) {
        gen(x, n, stream_of(90 + k, t->rank), DT_FP32, 0);
        be_upload(t->be, d[k], x, bytes);
    }
    CommMessage msgs[4] = {
        {.send = 1, .buf = d[0], .bytes = bytes, .peer = next, .tag = 1},
        {.send = 0, .buf = d[2], .bytes = bytes, .peer = prev, .tag = 1},
        {.send = 1, .buf = d[1], .bytes = bytes, .peer = next, .tag = 2},
        {.send = 0, .buf = d[3], .bytes = bytes, .peer = prev, .tag = 2},
    };
    comm_exchange(t->world, msgs, 4);
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        be_download(t->be, y, d[2 + k], bytes);
        gen(e, n, stream_of(90 + k, prev), DT_FP32, 0);
        ok &= memcmp(y, e, bytes) == 0;
    }
    char name[96];
    snprintf(name, sizeof name, "ring_exchange_%zub", bytes);
    verdict(t, name, ok, "received data differs from what the predecessor sent");
    snprintf(name, sizeof name, "ring_exchange_%zub_bytes", bytes);
    verdict(t, name, counters_are(t->world, COLL_SEND, 2 * bytes), "wrong count");
    for (int k = 0; k < 4; k++) be_free(t->be, d[k]);
    free(x), free(y), free(e);
}

// comm_exchange_start round the ring: a message to the successor and one from the predecessor per exchange,
// two exchanges in flight at once (waited for in reverse order). Meanwhile the sends' buffers may be read
// (they hold what they held), and in poison mode the receives' read as poison: a read before the wait cannot
// pass by luck. Byte counts and link classes as comm_exchange's.
static void test_exchange_start(T* t, size_t bytes) {
    CommHandle none = comm_exchange_start(t->world, NULL, 0);
    verdict(t, "exchange_start_of_nothing_is_cleared", none.gen == 0, "a handle in flight for no messages");
    if (t->size < 2) return;
    int next = (t->rank + 1) % t->size, prev = (t->rank + t->size - 1) % t->size;
    size_t n = bytes / 4;
    float *x = xmalloc(bytes), *y = xmalloc(bytes), *e = xmalloc(bytes);
    void* d[4];
    for (int k = 0; k < 4; k++) {
        gen(x, n, stream_of(k < 2 ? 95 + k : 97, t->rank), DT_FP32, 0);   // the receives start as other data
        d[k] = dev_from_host(t, x, n, DT_FP32);
    }
    comm_reset_bytes(t->world);
    CommMessage a[2] = {{.send = 1, .buf = d[0], .bytes = bytes, .peer = next, .tag = 1},
                        {.send = 0, .buf = d[2], .bytes = bytes, .peer = prev, .tag = 1}};
    CommMessage b[2] = {{.send = 1, .buf = d[1], .bytes = bytes, .peer = next, .tag = 2},
                        {.send = 0, .buf = d[3], .bytes = bytes, .peer = prev, .tag = 2}};
    CommHandle h[2] = {comm_exchange_start(t->world, a, 2), comm_exchange_start(t->world, b, 2)};
    int sends_intact = 1, receives_poisoned = !poison_on() || (poisoned(t, d[2], bytes) && poisoned(t, d[3], bytes));
    for (int k = 0; k < 2; k++) {
        be_download(t->be, y, d[k], bytes);
        gen(e, n, stream_of(95 + k, t->rank), DT_FP32, 0);
        sends_intact &= memcmp(y, e, bytes) == 0;
    }
    comm_wait(t->world, &h[1]);
    comm_wait(t->world, &h[0]);
    int ok = h[0].gen == 0 && h[1].gen == 0;
    for (int k = 0; k < 2; k++) {
        be_download(t->be, y, d[2 + k], bytes);
        gen(e, n, stream_of(95 + k, prev), DT_FP32, 0);
        ok &= memcmp(y, e, bytes) == 0;
    }
    char name[96], why[160];
    snprintf(name, sizeof name, "exchange_start_%zub", bytes);
    verdict(t, name, ok, "received data differs from what the predecessor sent, or a handle was not cleared");
    snprintf(name, sizeof name, "exchange_start_%zub_sends_readable_in_flight", bytes);
    verdict(t, name, sends_intact, "a send's buffer changed while in flight");
    if (poison_on()) {
        snprintf(name, sizeof name, "exchange_start_%zub_poisoned_in_flight", bytes);
        verdict(t, name, receives_poisoned, "a receive's buffer did not read as poison before its wait");
    }
    uint64_t intra = comm_link_bytes(t->world, LINK_INTRA_HOST), cross = comm_link_bytes(t->world, LINK_CROSS_HOST);
    snprintf(name, sizeof name, "exchange_start_%zub_bytes", bytes);
    snprintf(why, sizeof why, "send %llu, intra-host %llu, cross-host %llu (expected %zu, %zu, 0)",
             (unsigned long long)comm_bytes_sent(t->world, COLL_SEND), (unsigned long long)intra,
             (unsigned long long)cross, 2 * bytes, 2 * bytes);
    verdict(t, name, counters_are(t->world, COLL_SEND, 2 * bytes) && intra == 2 * bytes && cross == 0, why);
    for (int k = 0; k < 4; k++) be_free(t->be, d[k]);
    free(x), free(y), free(e);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Sends are rendezvous under MPI (comm.h): rank 0's exchange of one small message (eager-sized: MPI_Send
// would return at once) completes only once rank 1, 0.3 s late, posts the receive; being sends only, it
// returns once posted, and comm_exchange_finish waits. (NCCL may deliver a small message into the peer's
// buffers before the receive is posted, so there only the data is checked.)
static void test_rendezvous(T* t) {
    if (t->size < 2 || t->rank > 1) {
        if (t->size >= 2) verdict(t, "exchange_send_waits_for_receive", 1, ""), verdict(t, "exchange_of_sends_returns_when_posted", 1, "");
        return;
    }
    int v = t->rank == 0 ? 42 : 0;
    void* d = be_malloc(t->be, sizeof v);
    be_upload(t->be, d, &v, sizeof v);
    CommMessage m = {.send = t->rank == 0, .buf = d, .bytes = sizeof v, .peer = 1 - t->rank, .tag = 7};
    if (t->rank == 1) usleep(300000);
    double t0 = now_seconds();
    comm_exchange(t->world, &m, 1);
    double posting = now_seconds() - t0;   // an exchange of sends only returns once posted
    comm_exchange_finish(t->world);
    be_download(t->be, &v, d, sizeof v);   // NCCL: the host waits here, for the main stream that waits for it
    double waited = now_seconds() - t0;
    be_free(t->be, d);
    verdict(t, "exchange_send_waits_for_receive", t->rank == 1 ? v == 42 : waited > 0.2 || t->nccl,
            "the send completed before its receive was posted (buffered), or the message was lost");
    verdict(t, "exchange_of_sends_returns_when_posted", t->rank == 1 || posting < 0.1,
            "comm_exchange waited for an exchange of sends only");
}

// An exchange of sends only still in flight when the next exchange posts: rank 0 sends A alone, then B
// (larger: the MPI path's staging grows) with a receive of C; rank 1 takes A and B and sends C in one
// exchange. The second exchange must complete the first before it reuses anything A's send uses.
static void test_pending_sends(T* t, size_t bytes) {
    if (t->size < 2 || t->rank > 1) {
        if (t->size >= 2) verdict(t, "exchange_after_pending_sends", 1, "");
        return;
    }
    int me0 = t->rank == 0;
    size_t sizes[3] = {bytes, 2 * bytes, bytes};   // A, B, C
    void* d[3];
    float *x = xmalloc(2 * bytes), *e = xmalloc(2 * bytes);
    for (int k = 0; k < 3; k++) {
        d[k] = be_malloc(t->be, sizes[k]);
        gen(x, sizes[k] / 4, stream_of(95 + k, 0), DT_FP32, 0);
        if (me0 == (k < 2)) be_upload(t->be, d[k], x, sizes[k]);   // the sender's data
        else be_memset0(t->be, d[k], sizes[k]);
    }
    if (me0) {
        CommMessage first = {.send = 1, .buf = d[0], .bytes = sizes[0], .peer = 1, .tag = 1};
        CommMessage second[2] = {{.send = 1, .buf = d[1], .bytes = sizes[1], .peer = 1, .tag = 2},
                                 {.send = 0, .buf = d[2], .bytes = sizes[2], .peer = 1, .tag = 3}};
        comm_exchange(t->world, &first, 1);
        comm_exchange(t->world, second, 2);
    } else {
        CommMessage all[3] = {{.send = 0, .buf = d[0], .bytes = sizes[0], .peer = 0, .tag = 1},
                              {.send = 0, .buf = d[1], .bytes = sizes[1], .peer = 0, .tag = 2},
                              {.send = 1, .buf = d[2], .bytes = sizes[2], .peer = 0, .tag = 3}};
        comm_exchange(t->world, all, 3);
    }
    comm_exchange_finish(t->world);
    int ok = 1;
    for (int k = me0 ? 2 : 0; k < (me0 ? 3 : 2); k++) {   // what this rank received
        be_download(t->be, x, d[k], sizes[k]);
        gen(e, sizes[k] / 4, stream_of(95 + k, 0), DT_FP32, 0);
        ok &= memcmp(x, e, sizes[k]) == 0;
    }
    verdict(t, "exchange_after_pending_sends", ok, "a message arrived wrong after an exchange of sends only");
    for (int k = 0; k < 3; k++) be_free(t->be, d[k]);
    free(x), free(e);
}

static void test_host(T* t) {
    double xs[3] = {t->rank + 0.5, -(double)t->rank, 1e300};
    comm_allreduce_host_sum(t->world, xs, 2);
    double n = t->size;
    verdict(t, "host_allreduce_sum", xs[0] == n * (n - 1) / 2 + 0.5 * n && xs[1] == -n * (n - 1) / 2 && xs[2] == 1e300,
            "wrong sums");
    double ys[2] = {t->rank, -(double)t->rank};
    comm_allreduce_host_max(t->world, ys, 2);
    verdict(t, "host_allreduce_max", ys[0] == n - 1 && ys[1] == 0, "wrong maxima");
    // The integer reductions, on values past 2^53 (odd ones, which no double holds) and at the ends of the
    // range: doubles would round every one of them.
    const long long big = 1LL << 58, r = t->rank, m = t->size;
    long long is[3] = {big + 2 * r + 1, -big - 1, LLONG_MIN + 1 + r};
    comm_allreduce_host_sum_i64(t->world, is, 2);
    verdict(t, "host_allreduce_sum_i64", is[0] == m * big + m * m && is[1] == -m * big - m && is[2] == LLONG_MIN + 1 + r,
            "wrong integer sums");
    long long im[3] = {LLONG_MAX - r, -(1LL << 60) - 1 - r, (1LL << 53) + 1 + 2 * r};
    comm_allreduce_host_max_i64(t->world, im, 3);
    verdict(t, "host_allreduce_max_i64", im[0] == LLONG_MAX && im[1] == -(1LL << 60) - 1 && im[2] == (1LL << 53) + 2 * m - 1,
            "wrong integer maxima");
    comm_reset_bytes(t->world);
    comm_allreduce_host_sum(t->world, xs, 2);
    comm_allreduce_host_sum_i64(t->world, is, 2);
    comm_allreduce_host_max_i64(t->world, im, 3);
    int zero = 1;
    for (int k = 0; k < NUM_COLLECTIVES; k++) zero &= comm_bytes_sent(t->world, (Collective)k) == 0;
    verdict(t, "host_allreduce_not_counted", zero, "host reductions were counted");
    // comm_all_equal: 64-bit values that differ only in the low half, or only in the high half, on the last rank.
    const uint64_t same = 0xfedcba9876543210ull;
    int last = t->rank == t->size - 1;
    int eq = comm_all_equal(t->world, same);
    int low = comm_all_equal(t->world, last ? same ^ 1u : same);
    int high = comm_all_equal(t->world, last ? same ^ (1ull << 63) : same);
    verdict(t, "host_all_equal", eq && (t->size == 1 || (!low && !high)), "comm_all_equal missed a difference or saw one");
}

// The checkpoints' host transfers: a broadcast from the last rank, then each rank sends to its successor
// (even ranks send first, odd ranks receive first, so every blocking send meets its receive); neither is counted.
static void test_host_transfers(T* t) {
    enum { N = 1031 };
    unsigned char buf[N], want[N];
    for (int i = 0; i < N; i++) want[i] = buf[i] = (unsigned char)(i * 7 + (t->rank == t->size - 1 ? 3 : 0));
    for (int i = 0; i < N; i++) want[i] = (unsigned char)(i * 7 + 3);
    comm_reset_bytes(t->world);
    comm_broadcast_host(t->world, buf, N, t->size - 1);
    verdict(t, "host_broadcast", memcmp(buf, want, N) == 0, "received bytes differ from the root's");
    if (t->size > 1) {
        int next = (t->rank + 1) % t->size, prev = (t->rank + t->size - 1) % t->size, ok = 1;
        for (int i = 0; i < N; i++) want[i] = (unsigned char)(i + prev);
        for (int phase = 0; phase < 2; phase++) {
            for (int i = 0; i < N; i++) buf[i] = (unsigned char)(i + t->rank);
            if ((t->rank % 2 == 0) == (phase == 0)) comm_send_host(t->world, buf, N, next, 5);
            else comm_recv_host(t->world, buf, N, prev, 5), ok &= memcmp(buf, want, N) == 0;
        }
        verdict(t, "host_send_recv", ok, "received bytes differ from the predecessor's");
    }
    int zero = 1;
    for (int k = 0; k < NUM_COLLECTIVES; k++) zero &= comm_bytes_sent(t->world, (Collective)k) == 0;
    verdict(t, "host_transfers_not_counted", zero, "host transfers were counted");
    verdict(t, "host_leader_is_rank_0_on_one_host", comm_host_leader(t->world) == 0, "host leader is not rank 0");
}

static void die(T* t, const char* mode) {
    float x = 1;
    comm_allreduce_sum(t->world, &x, 1, DT_FP32);   // everyone is up and talking
    if (t->rank == 0) printf("die: %g ranks up\n", x), fflush(stdout);   // t_comm.sh: the death came after this
    if (t->rank == 1) {
        if (!strcmp(mode, "abort")) abort();
        if (!strcmp(mode, "exit3")) exit(3);
        if (!strcmp(mode, "exit0")) exit(0);
        if (!strcmp(mode, "fail")) fail("rank 1 gives up (test)");
        if (!strcmp(mode, "kill")) raise(SIGKILL);
    }
    for (;;) comm_allreduce_sum(t->world, &x, 1, DT_FP32);   // waits for rank 1 forever
}

static void hang(T* t, const char* mode) {
    int stop = !strcmp(mode, "stop"), deadlock = !strcmp(mode, "deadlock");
    if (!stop && !deadlock) fail("--hang %s: expected stop or deadlock", mode);
    comm_watchdog_start(t->world, 1.0);
    comm_watchdog_phase(t->world, 0, "hang test");
    float x = 1;
    comm_allreduce_sum(t->world, &x, 1, DT_FP32);   // everyone is up and talking
    if (t->rank == 0) printf("hang: %g ranks up\n", x), fflush(stdout);   // t_comm.sh: the hang came after this
    if (stop && t->rank == 1 && raise(SIGSTOP) != 0) fail("raise(SIGSTOP) failed");
    if (deadlock && t->rank < 2) {
        char byte;
        comm_recv_host(t->world, &byte, 1, 1 - t->rank, 7);   // the other one receives too: nobody sends
    }
    for (;;) comm_allreduce_sum(t->world, &x, 1, DT_FP32);
}

int main(int argc, char** argv) {
    T t = {0};
    t.world = comm_init_world(&argc, &argv);
    t.rank = comm_rank(t.world);
    t.size = comm_size(t.world);
    t.be = backend_create(comm_local_rank(t.world));
    comm_attach_backend(t.world, t.be);
    if (argc == 3 && !strcmp(argv[1], "--die")) die(&t, argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--hang")) hang(&t, argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--misuse")) misuse(&t, argv[2]);
    CommKind kind = COMM_MPI;
    if (argc == 3 && !strcmp(argv[1], "--comm") && !strcmp(argv[2], "nccl")) kind = COMM_NCCL;
    else if (argc != 1 && !(argc == 3 && !strcmp(argv[1], "--comm") && !strcmp(argv[2], "mpi")))
        fail("usage: test_comm [--comm mpi|nccl | --die abort|exit3|exit0|fail|kill | --hang stop|deadlock | "
             "--misuse too-many|write-in-flight|exchange-order|exchange-overlap|alltoall-overlap|alltoall-in-place|"
             "exchange-receive-written|exchange-send-written]");
    if (comm_select(t.world, kind) != kind) fail("comm_select did not give %s", comm_kind_name(kind));
    t.nccl = kind == COMM_NCCL;

    verdict(&t, "world_rank_size", t.rank >= 0 && t.rank < t.size, "rank outside [0, size)");
    // mpirun starts every rank on this host in rank order
    verdict(&t, "local_rank_is_world_rank_on_one_host", comm_local_rank(t.world) == t.rank, "local rank differs");
    verdict(&t, "local_size_is_world_size_on_one_host", comm_local_size(t.world) == t.size, "local size differs");

    Group groups[3];
    groups[0] = (Group){.c = t.world, .name = "world", .n = t.size};
    for (int k = 0; k < t.size; k++) groups[0].members[k] = k;
    // even/odd ranks, and the world in reverse order (the key decides the order)
    groups[1] = (Group){.c = comm_split(t.world, t.rank % 2, t.rank), .name = "evenodd"};
    for (int k = t.rank % 2; k < t.size; k += 2) groups[1].members[groups[1].n++] = k;
    groups[2] = (Group){.c = comm_split(t.world, 0, -t.rank), .name = "reversed", .n = t.size};
    for (int k = 0; k < t.size; k++) groups[2].members[k] = t.size - 1 - k;
    for (int i = 0; i < 3; i++) {
        int r = comm_rank(groups[i].c), ok = comm_size(groups[i].c) == groups[i].n && groups[i].members[r] == t.rank;
        char name[64];
        snprintf(name, sizeof name, "split_%s_rank_size", groups[i].name);
        verdict(&t, name, ok, "group rank/size do not follow color and key");
    }
    {   // COMM_NO_GROUP: the odd ranks join nothing (NULL), the even ones form their group without them
        Comm* evens = comm_split(t.world, t.rank % 2 ? COMM_NO_GROUP : 0, t.rank);
        int ok = t.rank % 2 ? evens == NULL : evens && comm_size(evens) == (t.size + 1) / 2 && comm_rank(evens) == t.rank / 2;
        if (evens) {
            double x = 1.0;
            comm_allreduce_host_sum(evens, &x, 1);
            ok = ok && x == (t.size + 1) / 2;
        }
        comm_free(evens);
        verdict(&t, "split_no_group", ok, "a rank passing COMM_NO_GROUP got a group, or the others' group is wrong");
    }

    int test_id = 0;
    const size_t sizes[] = {1, 1031};
    for (int gi = 0; gi < 3; gi++)
        for (int dt = DT_FP32; dt <= DT_FP16; dt++)
            for (size_t si = 0; si < 2; si++) {
                // the world's counters must not see a sub-group's traffic
                comm_reset_bytes(t.world);
                test_reductions(&t, &groups[gi], (DType)dt, sizes[si], test_id += 2);
                if (gi != 0) {
                    int zero = 1;
                    for (int k = 0; k < NUM_COLLECTIVES; k++) zero &= comm_bytes_sent(t.world, (Collective)k) == 0;
                    char name[96];
                    snprintf(name, sizeof name, "world_counters_ignore_%s_%s_n%zu", groups[gi].name, dtype_name((DType)dt),
                             sizes[si]);
                    verdict(&t, name, zero, "world counted sub-group bytes");
                }
            }
    for (int gi = 0; gi < 3; gi++)
        for (int dt = DT_FP32; dt <= DT_FP16; dt++)
            for (size_t si = 0; si < 2; si++) test_async(&t, &groups[gi], (DType)dt, sizes[si], ++test_id);
    // odd sizes; 1031 goes out in 4 pieces under t_comm.sh's GPT_COMM_MAX_COUNT=300
    const size_t a2a_sizes[] = {1, 7, 1031};
    for (int gi = 0; gi < 3; gi++)
        for (int dt = DT_FP32; dt <= DT_FP16; dt++)
            for (size_t si = 0; si < 3; si++) test_alltoall(&t, &groups[gi], (DType)dt, a2a_sizes[si], ++test_id);
    test_in_flight_limit(&t, 1031);
    for (int gi = 0; gi < 3; gi++) test_broadcast(&t, &groups[gi], 1000, ++test_id);
    test_ring(&t, 64);
    test_ring(&t, 1u << 20);   // beyond any eager limit (rendezvous protocol)
    test_exchange_start(&t, 64);
    test_exchange_start(&t, 1u << 20);
    test_rendezvous(&t);
    test_pending_sends(&t, 1u << 16);
    test_host(&t);
    test_host_transfers(&t);

    comm_free(groups[1].c);
    comm_free(groups[2].c);
    int failed = t.st.failed;
    if (t.rank == 0)
        printf("# test_comm: %d ranks, %d checks, %d failed%s\n", t.size, t.st.passed + t.st.failed, failed,
               kind == COMM_NCCL ? " (nccl)" : "");
    backend_destroy(t.be);
    comm_finalize(t.world);
    return failed ? 1 : 0;
}
