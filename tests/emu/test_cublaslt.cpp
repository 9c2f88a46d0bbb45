// test_cublaslt.cpp: the emulated cuBLASLt (tests/emu/cublaslt.cpp), called exactly as kernels/matmul.cuh calls
// it (lt_matmul_per_call's sequence; matmul_forward's, matmul_backward_input's and matmul_backward_weight's
// arguments), against a double-precision reference written here in the project's row-major terms, for fp32,
// bf16 and fp16, on a shape whose sizes are multiples of 8 and one whose sizes are odd. Then: what the library
// refuses, the byte ranges it reports to the emulator's bounds check, and the alignment promises it holds calls to.
//
// Build and run (from the repository root):
//   clang++ -std=c++17 -O2 -Wall -Wextra -Werror -I tests/emu/include -I. tests/emu/test_cublaslt.cpp
//       tests/emu/cublaslt.cpp -o build/test_cublaslt && build/test_cublaslt
// Prints "ok NAME" / "FAIL NAME: why" lines; exits 1 if anything failed. The refusal checks make the library
// print its one-line refusals on stderr; that is expected.
#include <cublasLt.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kernels/dtype.h"

// ---------------------------------------------------------------------------------------------------
// Device memory. The emulator's runtime (tests/emu/runtime.cpp) defines emu::global_access; this weak stand-in
// checks the library's reported accesses against the buffers this test allocated, and logs them. It has no
// context argument, hence the one global of this file.
struct Access {
    const void* p;
    size_t bytes;
    bool write;
};
struct DeviceState {
    std::vector<std::pair<const char*, size_t>> live;   // start, bytes
    std::vector<Access> accesses;
    std::vector<std::string> violations;
};
static DeviceState g_device;

namespace emu {
// The fence (runtime.cpp) has nothing to open here: this test's buffers are host memory.
__attribute__((weak)) void fence_lift() {}
__attribute__((weak)) void fence_drop() {}
__attribute__((weak)) void global_access(const void* p, size_t bytes, bool write) {
    g_device.accesses.push_back({p, bytes, write});
    const char* c = (const char*)p;
    for (const auto& r : g_device.live)
        if (c >= r.first && c + bytes <= r.first + r.second) return;
    char msg[128];
    snprintf(msg, sizeof msg, "%s of %zu bytes at %p is outside every allocation", write ? "write" : "read", bytes, p);
    g_device.violations.push_back(msg);
}
}   // namespace emu

// `bytes` of device memory starting `offset` bytes past a 256-byte boundary (matmul.cuh's operands are
// activations at arbitrary element offsets, not only fresh allocations).
class DeviceBuffer {
  public:
    explicit DeviceBuffer(size_t bytes, size_t offset = 0) : bytes_(bytes) {
        base_ = (char*)aligned_alloc(256, (bytes + offset + 255) / 256 * 256 + 256);
        if (!base_) {
            fprintf(stderr, "test_cublaslt: out of memory\n");
            exit(1);
        }
        p_ = base_ + offset;
        g_device.live.push_back({p_, bytes});
    }
    ~DeviceBuffer() {
        auto& live = g_device.live;
        live.erase(std::find(live.begin(), live.end(), std::make_pair((const char*)p_, bytes_)));
        free(base_);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return p_; }

  private:
    char* base_;
    char* p_;
    size_t bytes_;
};

// ---------------------------------------------------------------------------------------------------
// Storage types.
enum class DT { F32, BF16, F16 };
static const char* dt_name(DT dt) { return dt == DT::F32 ? "fp32" : dt == DT::BF16 ? "bf16" : "fp16"; }
static cudaDataType_t lt_type(DT dt) { return dt == DT::F32 ? CUDA_R_32F : dt == DT::BF16 ? CUDA_R_16BF : CUDA_R_16F; }
static size_t dt_size(DT dt) { return dt == DT::F32 ? 4 : 2; }
// Largest relative error of one round-to-nearest store, and the absolute one below the normal range.
static double round_rel(DT dt) {
    return dt == DT::F32 ? ldexp(1.0, -24) : dt == DT::BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
}
static double round_abs(DT dt) { return dt == DT::F16 ? ldexp(1.0, -25) : 1e-37; }

static void put(DT dt, void* base, size_t i, float v) {
    if (dt == DT::F32)
        ((float*)base)[i] = v;
    else
        ((uint16_t*)base)[i] = dt == DT::BF16 ? bf16_from_f32(v) : fp16_from_f32(v);
}
static float get(DT dt, const void* base, size_t i) {
    if (dt == DT::F32) return ((const float*)base)[i];
    const uint16_t h = ((const uint16_t*)base)[i];
    return dt == DT::BF16 ? f32_from_bf16(h) : f32_from_fp16(h);
}

struct Rng {
    uint64_t s;
    float uniform(float lo, float hi) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
    }
};

// A device tensor of n elements with its values (as stored) on the host.
struct Tensor {
    DT dt;
    size_t n;
    DeviceBuffer buf;
    Tensor(DT dt_, size_t n_, size_t offset_elems = 0)
        : dt(dt_), n(n_), buf(n_ * dt_size(dt_), offset_elems * dt_size(dt_)) {}
    void fill(Rng* rng, float lo, float hi) {
        for (size_t i = 0; i < n; i++) put(dt, buf.get(), i, rng->uniform(lo, hi));
    }
    void fill_value(float v) {
        for (size_t i = 0; i < n; i++) put(dt, buf.get(), i, v);
    }
    float at(size_t i) const { return get(dt, buf.get(), i); }
    std::vector<float> values() const {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; i++) v[i] = at(i);
        return v;
    }
    void* ptr() const { return buf.get(); }
};

// ---------------------------------------------------------------------------------------------------
// The call, as lt_matmul_per_call in kernels/matmul.cuh makes it.
static uint32_t lt_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

struct LtEpilogue {
    const void* bias;
    cudaDataType_t bias_type;
    void* aux;
    int64_t aux_ld;
    cublasLtEpilogue_t epilogue;
};

struct LtCall {
    DT dt;
    void* d;   // C and D (matmul.cuh's output)
    const void* a;
    const void* b;
    int trans_a, trans_b, m, n, k, lda, ldb, ldd;
    float beta;
    LtEpilogue ep;
    void* dst;   // D when not C (lt_tune's temporary); NULL: D is C
};

struct LtResult {
    std::string setup_error;   // a call that matmul.cuh wraps in CUBLAS_CHECK failed
    cublasStatus_t heuristic;
    int found;
    cublasStatus_t matmul;   // CUBLAS_STATUS_NOT_INITIALIZED when not launched
};

static const size_t kWorkspaceBytes = 4096;

struct Library {
    cublasLtHandle_t lt;
    DeviceBuffer workspace{kWorkspaceBytes};
    Library() {
        if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "test_cublaslt: cublasLtCreate failed\n");
            exit(1);
        }
    }
    ~Library() { cublasLtDestroy(lt); }
};

#define SETUP(call)                                                                  \
    do {                                                                             \
        const cublasStatus_t s_ = (call);                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS && r.setup_error.empty())                    \
            r.setup_error = std::string(#call) + ": " + cublasLtGetStatusString(s_); \
    } while (0)

static LtResult lt_matmul(const Library& lib, const LtCall& c) {
    LtResult r{"", CUBLAS_STATUS_SUCCESS, 0, CUBLAS_STATUS_NOT_INITIALIZED};
    const cudaDataType_t type = lt_type(c.dt);
    cublasLtMatmulDesc_t desc;
    SETUP(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (!r.setup_error.empty()) return r;
    const cublasOperation_t opa = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.ep.epilogue, sizeof(c.ep.epilogue)));
    if (c.ep.bias) {
        SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.ep.bias, sizeof(c.ep.bias)));
        SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c.ep.bias_type,
                                             sizeof(c.ep.bias_type)));
    }
    if (c.ep.aux) {
        SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.ep.aux,
                                             sizeof(c.ep.aux)));
        SETUP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.ep.aux_ld,
                                             sizeof(c.ep.aux_ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    SETUP(cublasLtMatrixLayoutCreate(&la, type, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.lda));
    SETUP(cublasLtMatrixLayoutCreate(&lb, type, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.ldb));
    SETUP(cublasLtMatrixLayoutCreate(&ld, type, c.m, c.n, c.ldd));
    cublasLtMatmulPreference_t pref;
    SETUP(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    SETUP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al_a = lt_alignment(c.a), al_b = lt_alignment(c.b), al_d = lt_alignment(c.d);
    SETUP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    SETUP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    SETUP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
    SETUP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
    if (!r.setup_error.empty()) return r;
    cublasLtMatmulHeuristicResult_t heur[8];
    r.heuristic = cublasLtMatmulAlgoGetHeuristic(lib.lt, desc, la, lb, ld, ld, pref, 8, heur, &r.found);
    if (r.heuristic == CUBLAS_STATUS_SUCCESS && r.found > 0) {
        const float alpha = 1.0f;
        r.matmul = cublasLtMatmul(lib.lt, desc, &alpha, c.a, la, c.b, lb, &c.beta, c.d, ld, c.dst ? c.dst : c.d, ld,
                                  &heur[0].algo, lib.workspace.get(), ws, 0);
    }
    SETUP(cublasLtMatmulPreferenceDestroy(pref));
    SETUP(cublasLtMatrixLayoutDestroy(la));
    SETUP(cublasLtMatrixLayoutDestroy(lb));
    SETUP(cublasLtMatrixLayoutDestroy(ld));
    SETUP(cublasLtMatmulDescDestroy(desc));
    return r;
}

// "" when the call ran (one algorithm found, launched, succeeded), else why not.
static std::string launched(const LtResult& r) {
    if (!r.setup_error.empty()) return r.setup_error;
    if (r.heuristic != CUBLAS_STATUS_SUCCESS)
        return std::string("heuristic refused: ") + cublasLtGetStatusString(r.heuristic);
    if (r.found != 1) return "the heuristic returned " + std::to_string(r.found) + " algorithms, not 1";
    if (r.matmul != CUBLAS_STATUS_SUCCESS) return std::string("cublasLtMatmul: ") + cublasLtGetStatusString(r.matmul);
    return "";
}

// ---------------------------------------------------------------------------------------------------
// The double-precision reference: tanh-GELU (cuBLAS's documented approximation) and its exact derivative.
static double gelu_ref(double x) {
    const double s = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(s * (x + 0.044715 * x * x * x)));
}
static double gelu_grad_ref(double x) {
    const double s = sqrt(2.0 / M_PI);
    const double t = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// A reference value and the error fp32 accumulation may add to it: (terms + 2) roundings of the sum of the
// terms' magnitudes.
struct Ref {
    double value, acc_err;
};
static Ref ref_sum(double sum, double magnitude, int terms) { return {sum, (terms + 2) * ldexp(1.0, -24) * magnitude}; }

// First element of `got` farther from `want` than its tolerance, or "".
static std::string compare(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                           const std::vector<double>& tol) {
    for (size_t i = 0; i < got.size(); i++)
        if (!(fabs((double)got[i] - want[i]) <= tol[i])) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s[%zu] = %.9g, reference %.9g (tolerance %.3g)", what, i, got[i], want[i],
                     tol[i]);
            return msg;
        }
    return "";
}

// ---------------------------------------------------------------------------------------------------
// The three linear-layer calls of matmul.cuh, each with its reference.
struct Shape {
    int N, IC, OC;
    size_t offset;   // elements past a 256-byte boundary for every operand
    std::string name() const {
        return std::to_string(N) + "x" + std::to_string(IC) + "x" + std::to_string(OC) + (offset ? "+off" : "");
    }
};

static std::string check_clean(const std::string& err) {
    if (!err.empty()) return err;
    if (!g_device.violations.empty()) return "bounds: " + g_device.violations.front();
    return "";
}

// matmul_forward: out (N,OC) = inp (N,IC) @ w^T (+ bias), optionally through GELU with the pre-GELU values in
// aux. The column-major call: D (OC,N) = (w as (IC,OC))^T * (inp as (IC,N)), beta 0.
static std::string test_forward(const Library& lib, DT dt, const Shape& s, bool with_bias, bool with_gelu) {
    const int N = s.N, IC = s.IC, OC = s.OC;
    Rng rng{(uint64_t)(N * 131 + IC * 17 + OC) ^ (uint64_t)dt};
    Tensor inp(dt, (size_t)N * IC, s.offset), w(dt, (size_t)OC * IC, s.offset), bias(dt, OC, s.offset);
    Tensor out(dt, (size_t)N * OC, s.offset), pre(dt, (size_t)N * OC, s.offset);
    inp.fill(&rng, -1, 1), w.fill(&rng, -1, 1), bias.fill(&rng, -1, 1);
    out.fill_value(NAN);   // beta is 0: C (the output itself) must not be read
    pre.fill_value(NAN);
    cublasLtEpilogue_t e = with_gelu ? (with_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                     : (with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    const LtEpilogue ep = {with_bias ? bias.ptr() : nullptr, lt_type(dt), with_gelu ? pre.ptr() : nullptr, OC, e};
    const LtCall call = {dt, out.ptr(), w.ptr(), inp.ptr(), 1, 0, OC, N, IC, IC, IC, OC, 0.0f, ep, nullptr};
    const LtResult r = lt_matmul(lib, call);
    if (with_gelu && OC % 8 != 0) {
        // EPILOGUE_AUX_LD (= OC) must be a multiple of 8: cuBLASLt has no kernel, matmul.cuh falls back.
        if (!r.setup_error.empty()) return r.setup_error;
        if (r.heuristic != CUBLAS_STATUS_INVALID_VALUE || r.found != 0)
            return std::string("aux_ld ") + std::to_string(OC) + " accepted: " + cublasLtGetStatusString(r.heuristic);
        return check_clean(isnan(out.at(0)) ? "" : "a refused call wrote D");
    }
    const std::string err = launched(r);
    if (!err.empty()) return err;
    std::vector<double> want_pre, tol_pre, want_out, tol_out;
    for (int n = 0; n < N; n++)
        for (int oc = 0; oc < OC; oc++) {
            double sum = 0, mag = 0;
            for (int ic = 0; ic < IC; ic++) {
                const double t = (double)inp.at((size_t)n * IC + ic) * w.at((size_t)oc * IC + ic);
                sum += t, mag += fabs(t);
            }
            if (with_bias) sum += bias.at(oc), mag += fabs(bias.at(oc));
            const Ref x = ref_sum(sum, mag, IC);
            const double rel = round_rel(dt), floor = round_abs(dt);
            want_pre.push_back(x.value);
            tol_pre.push_back(rel * fabs(x.value) + x.acc_err * (1 + rel) + floor);
            if (with_gelu) {
                const double g = gelu_ref(x.value);
                // GELU's slope is below 1.13; its fp32 evaluation adds a few roundings of |x|.
                want_out.push_back(g);
                tol_out.push_back(rel * fabs(g) +
                                  (1.13 * x.acc_err + 16 * ldexp(1.0, -24) * (fabs(x.value) + 1)) * (1 + rel) + floor);
            }
        }
    if (!with_gelu) return check_clean(compare("out", out.values(), want_pre, tol_pre));
    std::string bad = compare("pre_gelu (aux)", pre.values(), want_pre, tol_pre);
    if (bad.empty()) bad = compare("out", out.values(), want_out, tol_out);
    return check_clean(bad);
}

// matmul_backward_input: dinp (N,IC) = dout (N,OC) @ w (OC,IC), optionally times GELU'(pre) (DGELU with the
// forward's pre-GELU values as aux). The column-major call: D (IC,N) = (w as (IC,OC)) * (dout as (OC,N)).
static std::string test_backward_input(const Library& lib, DT dt, const Shape& s, bool with_dgelu) {
    const int N = s.N, IC = s.IC, OC = s.OC;
    Rng rng{(uint64_t)(N * 7 + IC * 331 + OC * 3) ^ ((uint64_t)dt << 8)};
    Tensor dout(dt, (size_t)N * OC, s.offset), w(dt, (size_t)OC * IC, s.offset), pre(dt, (size_t)N * IC, s.offset);
    Tensor dinp(dt, (size_t)N * IC, s.offset);
    dout.fill(&rng, -1, 1), w.fill(&rng, -1, 1), pre.fill(&rng, -3, 3);
    dinp.fill_value(NAN);
    const LtEpilogue ep = {nullptr, CUDA_R_32F, with_dgelu ? pre.ptr() : nullptr, IC,
                           with_dgelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT};
    const LtCall call = {dt, dinp.ptr(), w.ptr(), dout.ptr(), 0, 0, IC, N, OC, IC, OC, IC, 0.0f, ep, nullptr};
    const LtResult r = lt_matmul(lib, call);
    if (with_dgelu && IC % 8 != 0) {
        if (!r.setup_error.empty()) return r.setup_error;
        if (r.heuristic != CUBLAS_STATUS_INVALID_VALUE || r.found != 0)
            return std::string("aux_ld ") + std::to_string(IC) + " accepted: " + cublasLtGetStatusString(r.heuristic);
        return check_clean(isnan(dinp.at(0)) ? "" : "a refused call wrote D");
    }
    const std::string err = launched(r);
    if (!err.empty()) return err;
    std::vector<double> want, tol;
    const double rel = round_rel(dt), floor = round_abs(dt);
    for (int n = 0; n < N; n++)
        for (int ic = 0; ic < IC; ic++) {
            double sum = 0, mag = 0;
            for (int oc = 0; oc < OC; oc++) {
                const double t = (double)dout.at((size_t)n * OC + oc) * w.at((size_t)oc * IC + ic);
                sum += t, mag += fabs(t);
            }
            Ref x = ref_sum(sum, mag, OC);
            if (with_dgelu) {
                // fp32 GELU' of |x| <= 3 is good to a few dozen roundings of the product's magnitude.
                const double g = gelu_grad_ref(pre.at((size_t)n * IC + ic));
                x = {x.value * g, x.acc_err * 1.13 + 64 * ldexp(1.0, -24) * mag};
            }
            want.push_back(x.value);
            tol.push_back(rel * fabs(x.value) + x.acc_err * (1 + rel) + floor);
        }
    return check_clean(compare("dinp", dinp.values(), want, tol));
}

enum class BiasGrad { None, Fp32Vector, StorageVector };

// matmul_backward_weight: dw (OC,IC) += dout^T (OC,N) @ inp (N,IC), optionally with BGRADB writing
// sum_n dout[n][oc] to a vector (fp32 as the default path asks first, or the storage type as the
// bias_grad_epilogue variant does). The column-major call: D (IC,OC) = (inp as (IC,N)) * (dout as (OC,N))^T,
// beta 1. `out_of_place`: D is a separate buffer, as in lt_tune's timing launches.
static std::string test_backward_weight(const Library& lib, DT dt, const Shape& s, BiasGrad bg, bool out_of_place) {
    const int N = s.N, IC = s.IC, OC = s.OC;
    Rng rng{(uint64_t)(N * 1009 + IC * 7 + OC * 71) ^ ((uint64_t)dt << 16)};
    const DT vec_dt = bg == BiasGrad::Fp32Vector ? DT::F32 : dt;
    Tensor dout(dt, (size_t)N * OC, s.offset), inp(dt, (size_t)N * IC, s.offset), dw(dt, (size_t)OC * IC, s.offset);
    Tensor dst(dt, (size_t)OC * IC, s.offset), vec(vec_dt, OC, s.offset);
    dout.fill(&rng, -1, 1), inp.fill(&rng, -1, 1), dw.fill(&rng, -1, 1);
    dst.fill_value(NAN), vec.fill_value(NAN);
    const std::vector<float> dw0 = dw.values();
    const LtEpilogue ep = {bg != BiasGrad::None ? vec.ptr() : nullptr, lt_type(vec_dt), nullptr, 0,
                           bg != BiasGrad::None ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT};
    const LtCall call = {
        dt, dw.ptr(), inp.ptr(), dout.ptr(), 0, 1, IC, OC, N, IC, OC, IC, 1.0f, ep, out_of_place ? dst.ptr() : nullptr};
    const LtResult r = lt_matmul(lib, call);
    if (bg == BiasGrad::Fp32Vector && dt != DT::F32) {
        // cuBLASLt's datatype table: the bias vector has D's type. matmul.cuh asks, and falls back when refused.
        if (!r.setup_error.empty()) return r.setup_error;
        if (r.heuristic != CUBLAS_STATUS_NOT_SUPPORTED || r.found != 0)
            return std::string("an fp32 bias vector with 16-bit matrices was accepted: ") +
                   cublasLtGetStatusString(r.heuristic);
        return check_clean(dw.values() == dw0 ? "" : "a refused call wrote D");
    }
    const std::string err = launched(r);
    if (!err.empty()) return err;
    std::vector<double> want, tol, want_vec, tol_vec;
    const double rel = round_rel(dt), floor = round_abs(dt);
    for (int oc = 0; oc < OC; oc++)
        for (int ic = 0; ic < IC; ic++) {
            double sum = dw0[(size_t)oc * IC + ic], mag = fabs(sum);
            for (int n = 0; n < N; n++) {
                const double t = (double)dout.at((size_t)n * OC + oc) * inp.at((size_t)n * IC + ic);
                sum += t, mag += fabs(t);
            }
            const Ref x = ref_sum(sum, mag, N);
            want.push_back(x.value);
            tol.push_back(rel * fabs(x.value) + x.acc_err * (1 + rel) + floor);
        }
    for (int oc = 0; oc < OC; oc++) {
        double sum = 0, mag = 0;
        for (int n = 0; n < N; n++) sum += dout.at((size_t)n * OC + oc), mag += fabs(dout.at((size_t)n * OC + oc));
        const Ref x = ref_sum(sum, mag, N);
        want_vec.push_back(x.value);
        tol_vec.push_back(round_rel(vec_dt) * fabs(x.value) + x.acc_err * (1 + round_rel(vec_dt)) + round_abs(vec_dt));
    }
    std::string bad = compare(out_of_place ? "D" : "dw", (out_of_place ? dst : dw).values(), want, tol);
    if (bad.empty() && out_of_place && dw.values() != dw0) bad = "C changed in an out-of-place call";
    if (bad.empty() && bg != BiasGrad::None) bad = compare("bias gradient", vec.values(), want_vec, tol_vec);
    return check_clean(bad);
}

// ---------------------------------------------------------------------------------------------------
// Refusals.
static std::string expect_status(const char* what, cublasStatus_t got, cublasStatus_t want) {
    if (got == want) return "";
    return std::string(what) + " returned " + cublasLtGetStatusString(got) + ", not " + cublasLtGetStatusString(want);
}

static std::string test_refused_attributes() {
    cublasLtMatmulDesc_t desc;
    if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return "DescCreate failed";
    const int32_t scale = CUDA_R_32F, mode = 0;
    const int8_t fast = 1;
    const cublasOperation_t conj = CUBLAS_OP_C;
    const int32_t aux_ld_int = 64;
    const int32_t f64 = CUDA_R_64F;
    std::string bad;
    const auto want = [&](const char* what, cublasStatus_t got, cublasStatus_t status) {
        if (bad.empty()) bad = expect_status(what, got, status);
    };
    want("SCALE_TYPE", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale, 4),
         CUBLAS_STATUS_NOT_SUPPORTED);
    want("POINTER_MODE", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, 4),
         CUBLAS_STATUS_NOT_SUPPORTED);
    want("FAST_ACCUM", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, 1),
         CUBLAS_STATUS_NOT_SUPPORTED);
    for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
                                 CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA})
        want("EPILOGUE", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)),
             CUBLAS_STATUS_NOT_SUPPORTED);
    want("TRANSA = CUBLAS_OP_C", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &conj, sizeof(conj)),
         CUBLAS_STATUS_NOT_SUPPORTED);
    want("BIAS_DATA_TYPE = CUDA_R_64F",
         cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f64, 4),
         CUBLAS_STATUS_NOT_SUPPORTED);
    want("EPILOGUE_AUX_LD as int32_t",
         cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld_int, sizeof(aux_ld_int)),
         CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulDescDestroy(desc);

    cublasLtMatmulDesc_t tf32;
    want("CUBLAS_COMPUTE_32F_FAST_TF32", cublasLtMatmulDescCreate(&tf32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
         CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatrixLayout_t l64;
    want("CUDA_R_64F layout", cublasLtMatrixLayoutCreate(&l64, CUDA_R_64F, 4, 4, 4), CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatmulPreference_t pref;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return "PreferenceCreate failed";
    const float waves = 1.0f;
    const uint32_t al3 = 3;
    want("MAX_WAVES_COUNT", cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, &waves, 4),
         CUBLAS_STATUS_NOT_SUPPORTED);
    want("MIN_ALIGNMENT_A_BYTES = 3",
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al3, 4),
         CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulPreferenceDestroy(pref);
    return bad;
}

// A descriptor and layouts for D (m,n) = A (m,k) * B (k,n), all fp32, no transposes.
struct PlainProblem {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    PlainProblem(int m, int n, int k, int k_of_b) {
        if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k_of_b, n, k_of_b) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "test_cublaslt: creating a plain problem failed\n");
            exit(1);
        }
    }
    ~PlainProblem() {
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
    }
};

static std::string test_refused_problems(const Library& lib) {
    cublasLtMatmulHeuristicResult_t heur;
    int found = 7;
    std::string bad;
    {
        PlainProblem p(4, 3, 5, 6);   // op(A) 4 x 5, op(B) 6 x 3
        bad = expect_status(
            "k mismatch",
            cublasLtMatmulAlgoGetHeuristic(lib.lt, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 1, &heur, &found),
            CUBLAS_STATUS_INVALID_VALUE);
        if (bad.empty() && found != 0) bad = "a refused heuristic reported algorithms";
    }
    if (bad.empty()) {
        PlainProblem p(4, 3, 5, 5);
        bad = expect_status(
            "requestedAlgoCount 0",
            cublasLtMatmulAlgoGetHeuristic(lib.lt, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 0, &heur, &found),
            CUBLAS_STATUS_INVALID_VALUE);
    }
    if (bad.empty()) {
        // An algorithm chosen for one epilogue, launched with another.
        PlainProblem p(4, 3, 5, 5);
        DeviceBuffer a(4 * 5 * 4), b(5 * 3 * 4), d(4 * 3 * 4), bias(4 * 4);
        if (cublasLtMatmulAlgoGetHeuristic(lib.lt, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 1, &heur, &found) !=
                CUBLAS_STATUS_SUCCESS ||
            found != 1)
            return "the plain problem's heuristic failed";
        const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        const void* bp = bias.get();
        if (cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)) !=
                CUBLAS_STATUS_SUCCESS)
            return "setting the BIAS epilogue failed";
        const float one = 1.0f, zero = 0.0f;
        bad = expect_status("another epilogue's algorithm",
                            cublasLtMatmul(lib.lt, p.desc, &one, a.get(), p.la, b.get(), p.lb, &zero, d.get(), p.ld,
                                           d.get(), p.ld, &heur.algo, lib.workspace.get(), 0, 0),
                            CUBLAS_STATUS_NOT_SUPPORTED);
    }
    return bad;
}

// ---------------------------------------------------------------------------------------------------
// Bounds: the exact byte ranges reported for a call, and an overrun caught.
static bool reported(const Access& a) {
    for (const Access& x : g_device.accesses)
        if (x.p == a.p && x.bytes == a.bytes && x.write == a.write) return true;
    return false;
}

static std::string test_bounds_reported(const Library& lib) {
    // GELU_AUX_BIAS, fp16, with the aux leading dimension larger than its rows.
    const int N = 3, IC = 5, OC = 8;
    const int64_t aux_ld = 16;
    Rng rng{99};
    Tensor inp(DT::F16, N * IC), w(DT::F16, OC * IC), bias(DT::F16, OC), out(DT::F16, N * OC),
        aux(DT::F16, 2 * 16 + OC);
    inp.fill(&rng, -1, 1), w.fill(&rng, -1, 1), bias.fill(&rng, -1, 1);
    g_device.accesses.clear();
    const LtEpilogue ep = {bias.ptr(), CUDA_R_16F, aux.ptr(), aux_ld, CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    std::string bad = launched(
        lt_matmul(lib, {DT::F16, out.ptr(), w.ptr(), inp.ptr(), 1, 0, OC, N, IC, IC, IC, OC, 0.0f, ep, nullptr}));
    if (!bad.empty()) return bad;
    const std::vector<Access> gelu_call = {
        {w.ptr(), (size_t)OC * IC * 2, false},        {inp.ptr(), (size_t)N * IC * 2, false},
        {out.ptr(), (size_t)N * OC * 2, true},        {bias.ptr(), (size_t)OC * 2, false},
        {aux.ptr(), (size_t)(2 * 16 + OC) * 2, true}, {lib.workspace.get(), kWorkspaceBytes, true}};
    for (const Access& a : gelu_call)
        if (!reported(a)) return "GELU_AUX_BIAS: an access of " + std::to_string(a.bytes) + " bytes was not reported";
    if (g_device.accesses.size() != gelu_call.size())
        return "GELU_AUX_BIAS: " + std::to_string(g_device.accesses.size()) + " accesses reported, not " +
               std::to_string(gelu_call.size()) + " (C must not be read with beta 0)";

    return check_clean("");
}

// BGRADB with beta 1: C read, D written, the vector written (one per column of D).
static std::string test_bounds_bgradb(const Library& lib) {
    const int N = 3, IC = 5, OC = 8;
    Rng rng{5};
    Tensor inp(DT::F32, N * IC), dout(DT::F32, N * OC), dw(DT::F32, OC * IC), vec(DT::F32, OC);
    inp.fill(&rng, -1, 1), dout.fill(&rng, -1, 1), dw.fill(&rng, -1, 1);
    g_device.accesses.clear();
    const LtEpilogue bg = {vec.ptr(), CUDA_R_32F, nullptr, 0, CUBLASLT_EPILOGUE_BGRADB};
    const std::string bad = launched(
        lt_matmul(lib, {DT::F32, dw.ptr(), inp.ptr(), dout.ptr(), 0, 1, IC, OC, N, IC, OC, IC, 1.0f, bg, nullptr}));
    if (!bad.empty()) return bad;
    const std::vector<Access> want = {
        {inp.ptr(), (size_t)N * IC * 4, false}, {dout.ptr(), (size_t)N * OC * 4, false},
        {dw.ptr(), (size_t)OC * IC * 4, false}, {dw.ptr(), (size_t)OC * IC * 4, true},
        {vec.ptr(), (size_t)OC * 4, true},      {lib.workspace.get(), kWorkspaceBytes, true}};
    for (const Access& a : want)
        if (!reported(a)) return "an access of " + std::to_string(a.bytes) + " bytes was not reported";
    if (g_device.accesses.size() != want.size())
        return std::to_string(g_device.accesses.size()) + " accesses reported, not " + std::to_string(want.size());
    return check_clean("");
}

// D's leading dimension one larger than the buffer allows: the last column reaches past the allocation.
static std::string test_bounds_overrun(const Library& lib) {
    const int m = 4, n = 3, k = 2;
    Tensor a(DT::F32, m * k), b(DT::F32, k * n), d(DT::F32, m * n);
    Rng rng{3};
    a.fill(&rng, -1, 1), b.fill(&rng, -1, 1);
    g_device.violations.clear();
    const LtEpilogue ep = {nullptr, CUDA_R_32F, nullptr, 0, CUBLASLT_EPILOGUE_DEFAULT};
    const std::string bad =
        launched(lt_matmul(lib, {DT::F32, d.ptr(), a.ptr(), b.ptr(), 0, 0, m, n, k, m, k, m + 1, 0.0f, ep, nullptr}));
    if (!bad.empty()) return bad;
    if (g_device.violations.empty()) return "a D extent past its allocation was not reported";
    const std::string v = g_device.violations.front();
    g_device.violations.clear();
    if (v.find("write of " + std::to_string((size_t)((n - 1) * (m + 1) + m) * 4) + " bytes") == std::string::npos)
        return "unexpected report: " + v;
    return "";
}

// ---------------------------------------------------------------------------------------------------
// Broken alignment promises end the run: checked in a child process, whose stderr is kept.
static std::string expect_exit_1(const std::function<void()>& body, const char* expected_text) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        body();
        _exit(0);
    }
    close(fds[1]);
    std::string text;
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, (size_t)got);
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return "waitpid failed";
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1) return "the call did not exit with status 1; stderr: " + text;
    if (text.find(expected_text) == std::string::npos)
        return "stderr does not say \"" + std::string(expected_text) + "\": " + text;
    if (std::count(text.begin(), text.end(), '\n') != 1) return "not one line: " + text;
    return "";
}

// The preference said A is 16-byte aligned; the launch passes A 4 bytes further.
static std::string test_alignment_matrix(const Library& lib) {
    return expect_exit_1(
        [&] {
            PlainProblem p(4, 3, 5, 5);
            DeviceBuffer a(4 * 5 * 4 + 4), b(5 * 3 * 4), d(4 * 3 * 4);
            const uint32_t al = 16;
            cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, 4);
            cublasLtMatmulHeuristicResult_t heur;
            int found = 0;
            cublasLtMatmulAlgoGetHeuristic(lib.lt, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 1, &heur, &found);
            const float one = 1.0f, zero = 0.0f;
            cublasLtMatmul(lib.lt, p.desc, &one, (char*)a.get() + 4, p.la, b.get(), p.lb, &zero, d.get(), p.ld, d.get(),
                           p.ld, &heur.algo, lib.workspace.get(), 0, 0);
        },
        "matrix A at");
}

// The heuristic saw a 256-byte-aligned bias pointer; the descriptor is then rebound to one 4 bytes off (what
// a plan kept per shape would do if its key left out the bias alignment).
static std::string test_alignment_bias(const Library& lib) {
    return expect_exit_1(
        [&] {
            PlainProblem p(4, 3, 5, 5);
            DeviceBuffer a(4 * 5 * 4), b(5 * 3 * 4), d(4 * 3 * 4), bias(4 * 4 + 4);
            const uint32_t al = 4;
            for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
                cublasLtMatmulPreferenceSetAttribute(p.pref, attr, &al, 4);
            const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
            const void* bp = bias.get();
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
            cublasLtMatmulHeuristicResult_t heur;
            int found = 0;
            cublasLtMatmulAlgoGetHeuristic(lib.lt, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 1, &heur, &found);
            bp = (char*)bias.get() + 4;
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
            const float one = 1.0f, zero = 0.0f;
            cublasLtMatmul(lib.lt, p.desc, &one, a.get(), p.la, b.get(), p.lb, &zero, d.get(), p.ld, d.get(), p.ld,
                           &heur.algo, lib.workspace.get(), 0, 0);
        },
        "the bias vector at");
}

// ---------------------------------------------------------------------------------------------------
int main() {
    const Library lib;
    std::vector<std::pair<std::string, std::function<std::string()>>> tests;
    const Shape shapes[] = {{6, 24, 40, 0}, {7, 13, 11, 1}};
    for (DT dt : {DT::F32, DT::BF16, DT::F16})
        for (const Shape& s : shapes) {
            const std::string at = std::string("/") + dt_name(dt) + "/" + s.name();
            tests.push_back({"forward" + at, [&lib, dt, s] { return test_forward(lib, dt, s, false, false); }});
            tests.push_back({"forward_bias" + at, [&lib, dt, s] { return test_forward(lib, dt, s, true, false); }});
            tests.push_back({"forward_gelu_aux" + at, [&lib, dt, s] { return test_forward(lib, dt, s, false, true); }});
            tests.push_back(
                {"forward_gelu_aux_bias" + at, [&lib, dt, s] { return test_forward(lib, dt, s, true, true); }});
            tests.push_back({"backward_input" + at, [&lib, dt, s] { return test_backward_input(lib, dt, s, false); }});
            tests.push_back(
                {"backward_input_dgelu" + at, [&lib, dt, s] { return test_backward_input(lib, dt, s, true); }});
            tests.push_back({"backward_weight" + at,
                             [&lib, dt, s] { return test_backward_weight(lib, dt, s, BiasGrad::None, false); }});
            tests.push_back({"backward_weight_out_of_place" + at,
                             [&lib, dt, s] { return test_backward_weight(lib, dt, s, BiasGrad::None, true); }});
            tests.push_back({"backward_weight_bgradb_fp32_vector" + at,
                             [&lib, dt, s] { return test_backward_weight(lib, dt, s, BiasGrad::Fp32Vector, false); }});
            tests.push_back({"backward_weight_bgradb_storage_vector" + at, [&lib, dt, s] {
                                 return test_backward_weight(lib, dt, s, BiasGrad::StorageVector, false);
                             }});
        }
    tests.push_back({"refused_attributes", [] { return test_refused_attributes(); }});
    tests.push_back({"refused_problems", [&lib] { return test_refused_problems(lib); }});
    tests.push_back({"bounds_reported_gelu_aux_bias", [&lib] { return test_bounds_reported(lib); }});
    tests.push_back({"bounds_reported_bgradb", [&lib] { return test_bounds_bgradb(lib); }});
    tests.push_back({"bounds_overrun", [&lib] { return test_bounds_overrun(lib); }});
    tests.push_back({"alignment_matrix_promise", [&lib] { return test_alignment_matrix(lib); }});
    tests.push_back({"alignment_bias_promise", [&lib] { return test_alignment_bias(lib); }});

    int failed = 0;
    for (const auto& t : tests) {
        g_device.violations.clear(), g_device.accesses.clear();
        const std::string why = t.second();
        if (why.empty()) {
            printf("ok %s\n", t.first.c_str());
        } else {
            printf("FAIL %s: %s\n", t.first.c_str(), why.c_str());
            failed++;
        }
        fflush(stdout);
    }
    return failed ? 1 : 0;
}
