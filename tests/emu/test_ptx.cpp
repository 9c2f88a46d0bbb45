// test_ptx.cpp: the emulator's 16-bit float conversions (cuda_bf16.h, cuda_fp16.h) against kernels/dtype.h
// over every float, and its PTX (ptx.cpp) against plain matrix arithmetic with the fragment layouts written
// out here a second time, from the PTX ISA's per-element formulas. Links ptx.cpp and nothing of the
// runtime: the emu:: functions ptx.cpp calls are stood in for below (weak, so the runtime's win if linked).
// Prints "ok NAME" / "FAIL NAME: why"; exits 1 on any failure.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <utility>
#include <thread>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "emu.h"
#include "kernels/dtype.h"
#include "ptx.h"

// ---------------------------------------------------------------------------------------------------
// Stand-ins for the runtime. The interface they replace has no context argument, so their state is one
// object: a block whose shared window is `shared`, and one warp whose lanes the tests run one after another.
// warp_gather cannot wait for lanes not yet run, so a warp instruction is run twice over the 32 lanes: the
// first pass records each lane's contribution (its results are discarded), the second hands all of them out.

struct EmuFault {
    std::string message;
};

struct StandIn {
    std::vector<unsigned char> shared = std::vector<unsigned char>(8192);
    int lane = 0;
    bool replay = false;
    unsigned char contributions[32][64];
    int shared_reads = 0, shared_writes = 0, global_reads = 0;
    EmuCpAsyncQueue queue;
};
static StandIn stand_in;

namespace emu {
__attribute__((weak)) int lane() { return stand_in.lane; }
__attribute__((weak)) void fault(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw EmuFault{buf};
}
__attribute__((weak)) void warp_gather(unsigned mask, const char* op, const void* in, size_t bytes, void* all) {
    if (mask != 0xffffffffu || bytes > sizeof stand_in.contributions[0])
        fault("%s: stand-in warp_gather takes full warps and up to 64 bytes", op);
    memcpy(stand_in.contributions[stand_in.lane], in, bytes);
    for (int l = 0; l < 32; l++) memcpy((unsigned char*)all + l * bytes, stand_in.contributions[l], bytes);
}
__attribute__((weak)) void* shared_base() { return stand_in.shared.data(); }
__attribute__((weak)) size_t shared_size() { return stand_in.shared.size(); }
__attribute__((weak)) void shared_access(const void* p, size_t bytes, bool write) {
    const unsigned char* s = stand_in.shared.data();
    if ((const unsigned char*)p < s || (const unsigned char*)p + bytes > s + stand_in.shared.size())
        fault("shared access %p + %zu outside the window", p, bytes);
    (write ? stand_in.shared_writes : stand_in.shared_reads)++;
}
__attribute__((weak)) void global_access(const void*, size_t, bool write) {
    if (!write) stand_in.global_reads++;
}
}  // namespace emu
__attribute__((weak)) EmuCpAsyncQueue* emu_thread_cp_queue() { return &stand_in.queue; }

// Runs fn(lane) for every lane, twice (see StandIn); the second pass's effects are the instruction's.
template <typename Fn> static void run_warp(Fn fn) {
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < 32; l++) {
            stand_in.lane = l;
            fn(l);
        }
}

// ---------------------------------------------------------------------------------------------------
// Reporting.

// Prints the check's line; true when it failed.
static bool report(const char* name, const std::string& why) {
    if (why.empty()) printf("ok %s\n", name);
    else printf("FAIL %s: %s\n", name, why.c_str());
    return !why.empty();
}
static std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string format(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// Deterministic pseudo-random numbers (splitmix64).
struct Rng {
    uint64_t s;
    uint32_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return (uint32_t)((z ^ (z >> 31)) >> 32);
    }
    int below(int n) { return (int)(next() % (uint32_t)n); }
};

// ---------------------------------------------------------------------------------------------------
// Conversions.

static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2, "2-byte storage types");
static_assert(std::is_trivially_copyable<__nv_bfloat16>::value && std::is_trivially_copyable<__half>::value,
              "memcpy-able");
static_assert(std::is_trivially_default_constructible<__nv_bfloat16>::value &&
                  std::is_trivially_default_constructible<__half>::value,
              "trivial default constructor");
template <typename T> static constexpr auto addable(int) -> decltype(std::declval<T>() + std::declval<T>(), true) {
    return true;
}
template <typename T> static constexpr bool addable(...) { return false; }
static_assert(addable<float>(0) && !addable<__half>(0) && !addable<__nv_bfloat16>(0),
              "16-bit arithmetic through float must not compile");
union Storage16 {   // the types must be usable as union members
    __nv_bfloat16 b;
    __half h;
    uint16_t u;
};

// The emulator's conversions under test, and dtype.h's.
static uint16_t emu_to16(float x, bool bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}
static float emu_from16(uint16_t h, bool bf16) {
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}
static uint16_t dtype_to16(float x, bool bf16) { return bf16 ? bf16_from_f32(x) : fp16_from_f32(x); }
static float dtype_from16(uint16_t h, bool bf16) { return bf16 ? f32_from_bf16(h) : f32_from_fp16(h); }

static bool is_nan16(uint16_t bits, uint16_t exp_mask) {
    return (bits & exp_mask) == exp_mask && (bits & 0x7fffu & ~exp_mask) != 0;
}

// The floats checked: all 2^32 (exhaustive), or blocks of 2^16 floats that share their top 16 bits, with
// every pattern of the low 16 mantissa bits. Every bf16 rounding and every normal fp16 rounding is decided
// within those bits (with the top 7 mantissa bits all zero, all one or mixed for carries); fp16's
// subnormal roundings look higher, so near fp16's range ends the top 7 bits also take single bits and
// runs, putting ties and carries at every position.
const uint32_t kTopPatterns[] = {0x00, 0x7f, 0x55, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x3f, 0x6a};
static std::vector<uint32_t> dense_float_blocks() {
    std::vector<uint32_t> tops;   // each the top 16 bits of a block
    for (uint32_t sign_exp = 0; sign_exp < 512; sign_exp++) {
        const int e = (int)(sign_exp & 0xffu) - 127;
        const bool edge = (e >= -26 && e <= -14) || e == 15 || e == 16 || e >= 127 || e <= -126;
        const size_t patterns = edge ? sizeof kTopPatterns / sizeof kTopPatterns[0] : 3;
        for (size_t i = 0; i < patterns; i++) tops.push_back((sign_exp << 7) | kTopPatterns[i]);
    }
    return tops;
}

// Floats [lo, hi) of the set: the emulator's conversion against dtype.h's (NaNs: a NaN, quiet).
struct ConvMismatch {
    uint64_t count = 0;
    uint32_t first = 0;
};
static ConvMismatch check_float_range(uint64_t lo, uint64_t hi, bool bf16, const std::vector<uint32_t>& tops) {
    ConvMismatch m;
    const uint16_t exp_mask = bf16 ? 0x7f80u : 0x7c00u, quiet = bf16 ? 0x0040u : 0x0200u;
    for (uint64_t i = lo; i < hi; i++) {
        const uint32_t u = tops.empty() ? (uint32_t)i : (tops[i >> 16] << 16) | (uint32_t)(i & 0xffffu);
        const float x = f32_from_bits(u);
        const uint16_t got = emu_to16(x, bf16);
        const bool good = x != x ? is_nan16(got, exp_mask) && (got & quiet) : got == dtype_to16(x, bf16);
        if (!good && m.count++ == 0) m.first = u;
    }
    return m;
}

static std::string check_floats(bool bf16, bool exhaustive) {
    const unsigned nthreads = std::thread::hardware_concurrency() ? std::thread::hardware_concurrency() : 1;
    const std::vector<uint32_t> tops = exhaustive ? std::vector<uint32_t>() : dense_float_blocks();
    const uint64_t total = exhaustive ? 1ull << 32 : (uint64_t)tops.size() << 16, chunk = total / nthreads + 1;
    std::vector<ConvMismatch> found(nthreads);
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < nthreads; w++) {
        const uint64_t lo = w * chunk, hi = lo + chunk < total ? lo + chunk : total;
        workers.emplace_back([&found, &tops, w, lo, hi, bf16] { found[w] = check_float_range(lo, hi, bf16, tops); });
    }
    for (std::thread& t : workers) t.join();
    uint64_t count = 0;
    for (const ConvMismatch& m : found) count += m.count;
    for (const ConvMismatch& m : found)
        if (m.count) {
            const float x = f32_from_bits(m.first);
            return format("%llu of %llu floats differ from dtype.h, first 0x%08x (%a): 0x%04x, dtype.h 0x%04x",
                          (unsigned long long)count, (unsigned long long)total, m.first, x, emu_to16(x, bf16),
                          dtype_to16(x, bf16));
        }
    return "";
}

static std::string check_all_halves_to_float(bool bf16) {
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const float got = emu_from16((uint16_t)h, bf16), want = dtype_from16((uint16_t)h, bf16);
        if (want != want ? got == got : f32_bits(got) != f32_bits(want))
            return format("0x%04x -> %a, dtype.h %a", h, got, want);
    }
    return "";
}

// What the kernels rely on beyond the named intrinsics: implicit conversions, and a double converted once.
static std::string check_implicit_conversions() {
    const __nv_bfloat16 third = 1.0f / 3.0f;
    if (__bfloat16_as_ushort(third) != bf16_from_f32(1.0f / 3.0f)) return "__nv_bfloat16(float) rounds differently";
    if ((float)third != f32_from_bf16(bf16_from_f32(1.0f / 3.0f))) return "float(__nv_bfloat16) differs";
    const __half h = 1.0f / 3.0f;
    if (__half_as_ushort(h) != fp16_from_f32(1.0f / 3.0f)) return "__half(float) rounds differently";
    // 1 + 2^-8 + 2^-40 lies just above a tie for both; through float it would be the tie, rounded down.
    const __nv_bfloat16 bd = 1.0 + 0x1p-8 + 0x1p-40;
    if (__bfloat16_as_ushort(bd) != 0x3f81u)
        return format("__nv_bfloat16(double) = 0x%04x, not 0x3f81", __bfloat16_as_ushort(bd));
    const __half hd = 1.0 + 0x1p-11 + 0x1p-40;
    if (__half_as_ushort(hd) != 0x3c01u) return format("__half(double) = 0x%04x, not 0x3c01", __half_as_ushort(hd));
    const __half hi = 2049;   // a tie: to the even 2048
    if (__half_as_ushort(hi) != 0x6800u) return format("__half(2049) = 0x%04x, not 0x6800", __half_as_ushort(hi));
    Storage16 s;
    s.h = __float2half_rn(-2.0f);
    if (s.u != 0xc000u) return "a __half in a union";
    s.b = __float2bfloat16_rn(65504.0f);
    if (s.u != bf16_from_f32(65504.0f)) return "a __nv_bfloat16 in a union";
    if (__half_as_ushort(__float2half_rn(NAN)) != emu_fp::kCanonicalNan16 ||
        __bfloat16_as_ushort(__float2bfloat16_rn(-NAN)) != emu_fp::kCanonicalNan16)
        return "a NaN does not convert to the canonical NaN";
    return "";
}

// ---------------------------------------------------------------------------------------------------
// mma.m16n8k16: the matrices, and the fragments per the PTX ISA's formulas (g = lane >> 2, t = lane % 4):
//   a_i, i = 0..7:  row g for i in {0, 1, 4, 5}, else g + 8;  col 2t + (i & 1), + 8 for i >= 4
//   b_i, i = 0..3:  row 2t + (i & 1), + 8 for i >= 2;         col g
//   c_i, i = 0..3:  row g, + 8 for i >= 2;                    col 2t + (i & 1)
// element i sits in register i / 2, in its high half when i is odd.

struct MmaCase {
    uint16_t A[16][16], B[16][8];
    float C[16][8];
    uint32_t a[32][4], b[32][2];
    float c[32][4];
};

enum class Layout { kPtx, kRegistersSwapped };

static void put_half(uint32_t* reg, int i, uint16_t v) {
    uint32_t* r = reg + i / 2;
    *r = (i & 1) ? ((*r & 0xffffu) | ((uint32_t)v << 16)) : ((*r & 0xffff0000u) | v);
}

static void make_fragments(MmaCase& m, Layout layout) {
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < 8; i++) {
            // The mistaken layout exchanges registers 1 and 2 (elements 2, 3 with 4, 5).
            const int e = layout == Layout::kRegistersSwapped && i >= 2 && i <= 5 ? (i < 4 ? i + 2 : i - 2) : i;
            const int row = (e == 0 || e == 1 || e == 4 || e == 5) ? g : g + 8;
            const int col = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
            put_half(m.a[lane], i, m.A[row][col]);
        }
        for (int i = 0; i < 4; i++) put_half(m.b[lane], i, m.B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g]);
        for (int i = 0; i < 4; i++) m.c[lane][i] = m.C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)];
    }
}

static uint16_t random_element(Rng& rng, bool bf16) {
    const uint16_t sign = (uint16_t)((rng.next() & 1) << 15);
    if (bf16) return (uint16_t)(sign | ((uint16_t)(120 + rng.below(14)) << 7) | (rng.next() & 0x7f));
    const int field = rng.below(8) == 0 ? 0 : 8 + rng.below(14);   // some fp16 subnormals
    return (uint16_t)(sign | ((uint16_t)field << 10) | (rng.next() & 0x3ff));
}

static void make_case(MmaCase& m, Rng& rng, bool bf16) {
    for (auto& row : m.A)
        for (uint16_t& v : row) v = random_element(rng, bf16);
    for (auto& row : m.B)
        for (uint16_t& v : row) v = random_element(rng, bf16);
    for (auto& row : m.C)
        for (float& v : row) v = ldexpf((float)(int)(rng.next() % 2000001u) - 1000000.0f, -(int)(rng.next() % 24));
    make_fragments(m, Layout::kPtx);
}

// D = A B + C in the documented order: C, then the products for k = 0..15, each sum rounded to fp32.
static void reference_product(const MmaCase& m, bool bf16, float D[16][8]) {
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float acc = m.C[r][n];
            for (int k = 0; k < 16; k++) {
                const float p = dtype_from16(m.A[r][k], bf16) * dtype_from16(m.B[k][n], bf16);
                acc += p;
            }
            D[r][n] = acc;
        }
}

// Differences between the warp core's d and D (read through the c layout); "" when none.
static std::string compare_d(const float d[32][4], const float D[16][8], const MmaCase& m, bool bf16) {
    int bad = 0;
    std::string first;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int r = (lane >> 2) + (i >= 2 ? 8 : 0), n = 2 * (lane % 4) + (i & 1);
            double exact = m.C[r][n], scale = fabs(exact);
            for (int k = 0; k < 16; k++) {
                const double p = (double)dtype_from16(m.A[r][k], bf16) * dtype_from16(m.B[k][n], bf16);
                exact += p;
                scale += fabs(p);
            }
            const bool close = fabs(d[lane][i] - exact) <= 17 * 0x1p-24 * scale;
            if (f32_bits(d[lane][i]) != f32_bits(D[r][n]) || !close) {
                if (bad++ == 0)
                    first = format("lane %d d%d (D[%d][%d]) = %a, reference %a (exact %a)", lane, i, r, n, d[lane][i],
                                   D[r][n], exact);
            }
        }
    return bad ? format("%d of 512 elements differ; %s", bad, first.c_str()) : "";
}

static std::string check_mma(bool bf16) {
    Rng rng{bf16 ? 1u : 2u};
    for (int rep = 0; rep < 200; rep++) {
        MmaCase m;
        make_case(m, rng, bf16);
        float D[16][8], d[32][4];
        reference_product(m, bf16, D);
        ptx_mma_m16n8k16_warp(m.a, m.b, m.c, d, bf16);
        const std::string why = compare_d(d, D, m, bf16);
        if (!why.empty()) return format("case %d: %s", rep, why.c_str());
    }
    return "";
}

// The comparison can fail: fragments swapped between two lanes, or laid out with two registers exchanged,
// must give a different D.
static std::string check_mma_detects_wrong_layout(bool bf16) {
    Rng rng{bf16 ? 3u : 4u};
    MmaCase m;
    make_case(m, rng, bf16);
    float D[16][8], d[32][4];
    reference_product(m, bf16, D);
    MmaCase swapped = m;
    for (int r = 0; r < 4; r++) {
        swapped.a[0][r] = m.a[5][r];
        swapped.a[5][r] = m.a[0][r];
    }
    ptx_mma_m16n8k16_warp(swapped.a, swapped.b, swapped.c, d, bf16);
    if (compare_d(d, D, m, bf16).empty()) return "a fragments of lanes 0 and 5 swapped went unnoticed";
    MmaCase misplaced = m;
    make_fragments(misplaced, Layout::kRegistersSwapped);
    ptx_mma_m16n8k16_warp(misplaced.a, misplaced.b, misplaced.c, d, bf16);
    if (compare_d(d, D, m, bf16).empty()) return "a registers 1 and 2 exchanged went unnoticed";
    return "";
}

// The per-lane entry point (what a kernel thread calls) against the warp core.
static std::string check_mma_entry(bool bf16) {
    Rng rng{bf16 ? 5u : 6u};
    MmaCase m;
    make_case(m, rng, bf16);
    float d[32][4], got[32][4];
    ptx_mma_m16n8k16_warp(m.a, m.b, m.c, d, bf16);
    run_warp([&](int l) {
        memcpy(got[l], m.c[l], sizeof got[l]);
        (bf16 ? emu_ptx_mma_m16n8k16_bf16 : emu_ptx_mma_m16n8k16_f16)(got[l], m.a[l], m.b[l][0], m.b[l][1]);
    });
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++)
            if (f32_bits(got[l][i]) != f32_bits(d[l][i]))
                return format("lane %d c%d = %a, warp core %a", l, i, got[l][i], d[l][i]);
    return "";
}

// ---------------------------------------------------------------------------------------------------
// ldmatrix.x4: four 8x8 matrices of 16-bit elements, row i of matrix j at lane 8j + i's address.

struct LdmCase {
    std::vector<unsigned char> smem;
    uint32_t addr[32];
};

static LdmCase make_ldm_case(Rng& rng) {
    LdmCase c;
    c.smem.resize(8192);
    for (unsigned char& byte : c.smem) byte = (unsigned char)rng.next();
    std::vector<uint32_t> slots(c.smem.size() / 16);
    for (size_t i = 0; i < slots.size(); i++) slots[i] = (uint32_t)(16 * i);
    for (int l = 0; l < 32; l++) {   // distinct rows scattered over the buffer
        const size_t pick = l + (size_t)rng.below((int)(slots.size() - l));
        std::swap(slots[l], slots[pick]);
        c.addr[l] = slots[l];
    }
    return c;
}

// The expected registers, by placing each element where the PTX ISA says it goes: element (i, col) of
// matrix j goes to lane 4i + col/2 (plain) or lane 4col + i/2 (.trans), register j, high half if col
// (plain) or i (.trans) is odd.
static void expected_ldm(const LdmCase& c, bool trans, uint32_t out[32][4], int placed[32][4]) {
    memset(placed, 0, sizeof(int) * 32 * 4);
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 8; i++)
            for (int col = 0; col < 8; col++) {
                uint16_t v;
                memcpy(&v, c.smem.data() + c.addr[8 * j + i] + 2 * col, 2);
                const int lane = trans ? 4 * col + i / 2 : 4 * i + col / 2, high = trans ? i & 1 : col & 1;
                put_half(out[lane], j * 2 + high, v);
                placed[lane][j]++;
            }
}

static std::string compare_ldm(const uint32_t got[32][4], const uint32_t want[32][4]) {
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 4; j++)
            if (got[l][j] != want[l][j])
                return format("lane %d r%d = 0x%08x, expected 0x%08x", l, j, got[l][j], want[l][j]);
    return "";
}

static std::string check_ldmatrix(bool trans) {
    Rng rng{trans ? 7u : 8u};
    for (int rep = 0; rep < 50; rep++) {
        LdmCase c = make_ldm_case(rng);
        uint32_t want[32][4], got[32][4];
        int placed[32][4];
        expected_ldm(c, trans, want, placed);
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 4; j++)
                if (placed[l][j] != 2)
                    return format("the test's layout puts %d elements in lane %d r%d", placed[l][j], l, j);
        ptx_ldmatrix_x4_warp(c.smem.data(), c.addr, got, trans);
        const std::string why = compare_ldm(got, want);
        if (!why.empty()) return format("case %d: %s", rep, why.c_str());
        std::swap(c.addr[3], c.addr[12]);   // the comparison can fail: two lanes' rows exchanged
        ptx_ldmatrix_x4_warp(c.smem.data(), c.addr, got, trans);
        if (compare_ldm(got, want).empty()) return "rows of lanes 3 and 12 exchanged went unnoticed";
    }
    return "";
}

static std::string check_ldmatrix_entry(bool trans) {
    Rng rng{trans ? 9u : 10u};
    LdmCase c = make_ldm_case(rng);
    stand_in.shared = c.smem;
    uint32_t want[32][4], got[32][4];
    ptx_ldmatrix_x4_warp(c.smem.data(), c.addr, want, trans);
    stand_in.shared_reads = 0;
    run_warp([&](int l) { emu_ptx_ldmatrix_x4(got[l], c.addr[l], trans); });
    std::string why = compare_ldm(got, want);
    if (!why.empty()) return why;
    if (stand_in.shared_reads != 64) return format("%d shared reads recorded, not 2 x 32 rows", stand_in.shared_reads);
    try {
        emu_ptx_ldmatrix_x4(got[0], c.addr[0] + 8, trans);
        return "a row address not 16-byte aligned was accepted";
    } catch (const EmuFault&) {
    }
    try {
        emu_ptx_ldmatrix_x4(got[0], (uint32_t)stand_in.shared.size(), trans);
        return "a row past the shared window was accepted";
    } catch (const EmuFault&) {
    }
    return "";
}

static std::string check_cvta() {
    unsigned char* s = stand_in.shared.data();
    if (emu_cvta_generic_to_shared(s + 4000) != 4000) return "offset of shared + 4000";
    try {
        emu_cvta_generic_to_shared(s + stand_in.shared.size());
        return "the end of the window was accepted";
    } catch (const EmuFault&) {
    }
    const int outside = 0;
    try {
        emu_cvta_generic_to_shared(&outside);
        return "a stack address was accepted";
    } catch (const EmuFault&) {
    }
    return "";
}

// ---------------------------------------------------------------------------------------------------
// cp.async: a thread's groups, performed by the waits that cover them.

static bool row_is(uint32_t off, const unsigned char* want) {
    return memcmp(stand_in.shared.data() + off, want, 16) == 0;
}

static std::string check_cp_async() {
    alignas(16) unsigned char src[4][16], zero[16] = {0}, old[16];
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 16; b++) src[i][b] = (unsigned char)(16 * i + b + 1);
    std::fill(stand_in.shared.begin(), stand_in.shared.end(), 0xee);
    memset(old, 0xee, 16);
    stand_in.queue = EmuCpAsyncQueue();
    stand_in.shared_writes = stand_in.global_reads = 0;

    emu_ptx_cp_async_cg16(0, src[0], 16);   // group 0
    emu_ptx_cp_async_commit();
    emu_ptx_cp_async_cg16(16, src[1], 16);   // group 1
    emu_ptx_cp_async_commit();
    emu_ptx_cp_async_cg16(32, src[2], 0);   // group 2: zero-fill
    emu_ptx_cp_async_cg16(48, src[3], 6);   // group 2: 6 bytes, 10 zero
    emu_ptx_cp_async_commit();
    emu_ptx_cp_async_commit();              // group 3: empty
    emu_ptx_cp_async_cg16(64, src[0], 16);   // not committed
    if (!row_is(0, old)) return "a copy was performed before any wait";
    emu_ptx_cp_async_wait(3);
    if (!row_is(0, src[0]) || !row_is(16, old)) return "wait_group 3 of 4 groups did not perform exactly group 0";
    emu_ptx_cp_async_wait(1);   // the most recent group is the empty one
    unsigned char partial[16] = {0};
    memcpy(partial, src[3], 6);
    if (!row_is(16, src[1]) || !row_is(32, zero) || !row_is(48, partial))
        return "wait_group 1 did not perform groups 1 and 2 (copy, zero fill, 6-byte fill)";
    emu_ptx_cp_async_wait(0);
    if (!row_is(64, old)) return "wait_group 0 performed an uncommitted copy";
    if (stand_in.shared_writes != 4 || stand_in.global_reads != 3)
        return format("%d shared writes and %d global reads recorded, not 4 and 3", stand_in.shared_writes,
                      stand_in.global_reads);
    try {
        emu_ptx_thread_exit();
        return "a thread exiting with an uncommitted copy was accepted";
    } catch (const EmuFault&) {
    }
    emu_ptx_cp_async_cg16(64, src[0], 16);
    emu_ptx_cp_async_commit();
    emu_ptx_cp_async_wait(0);
    if (!row_is(64, src[0])) return "a copy after a thread's exit check was not performed";
    emu_ptx_thread_exit();   // nothing pending: no fault

    struct Bad {
        uint32_t smem;
        const void* gmem;
        int bytes;
        const char* what;
    } bad[] = {{8, src[0], 16, "a shared address not 16-byte aligned"},
               {0, src[0] + 4, 16, "a global address not 16-byte aligned"},
               {0, src[0], 17, "src-size 17"},
               {(uint32_t)stand_in.shared.size(), src[0], 16, "a destination past the shared window"}};
    for (const Bad& b : bad) {
        try {
            emu_ptx_cp_async_cg16(b.smem, b.gmem, b.bytes);
            return format("%s was accepted", b.what);
        } catch (const EmuFault&) {
        }
    }
    return "";
}

int main(int argc, char** argv) {
    const bool exhaustive = argc == 2 && strcmp(argv[1], "--exhaustive") == 0;
    if (argc > 2 || (argc == 2 && !exhaustive)) {
        fprintf(stderr, "usage: %s [--exhaustive]  (--exhaustive: the conversions over all 2^32 floats)\n", argv[0]);
        return 2;
    }
    int failures = 0;
    failures += report(exhaustive ? "conv_bf16_all_floats" : "conv_bf16_dense_floats", check_floats(true, exhaustive));
    failures += report(exhaustive ? "conv_fp16_all_floats" : "conv_fp16_dense_floats", check_floats(false, exhaustive));
    failures += report("conv_bf16_to_float", check_all_halves_to_float(true));
    failures += report("conv_fp16_to_float", check_all_halves_to_float(false));
    failures += report("conv_implicit", check_implicit_conversions());
    failures += report("mma_bf16", check_mma(true));
    failures += report("mma_f16", check_mma(false));
    failures += report("mma_bf16_detects_wrong_layout", check_mma_detects_wrong_layout(true));
    failures += report("mma_f16_detects_wrong_layout", check_mma_detects_wrong_layout(false));
    failures += report("mma_bf16_entry", check_mma_entry(true));
    failures += report("mma_f16_entry", check_mma_entry(false));
    failures += report("ldmatrix_x4", check_ldmatrix(false));
    failures += report("ldmatrix_x4_trans", check_ldmatrix(true));
    failures += report("ldmatrix_x4_entry", check_ldmatrix_entry(false));
    failures += report("ldmatrix_x4_trans_entry", check_ldmatrix_entry(true));
    failures += report("cvta_generic_to_shared", check_cvta());
    failures += report("cp_async_groups", check_cp_async());
    return failures ? 1 : 0;
}
