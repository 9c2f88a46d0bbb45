// cublaslt.cpp: cuBLASLt for the emulated CUDA build. Descriptors, layouts and preferences as the real library
// keeps them, a heuristic that returns one algorithm, and a CPU matmul with cuBLASLt's semantics (NVIDIA cuBLAS
// documentation, "Using the cuBLASLt API"): column-major matrices with leading dimensions,
// D = alpha * op(A) * op(B) + beta * C, then the epilogue. Products accumulate in fp32, k ascending, with fmaf,
// and each stored value is rounded to its storage type once (kernels/dtype.h, round to nearest even), so a run
// is deterministic. Every buffer is checked against the emulator's live allocations before it is touched.
//
// Three kinds of answer, kept apart on purpose:
//   - what this file does not implement (an attribute, a value, a type): refused where it is set, with a line on
//     stderr, so nothing the project asks for is silently ignored;
//   - a combination the real library documents it has no kernel for (a bias vector of another type than D, a
//     GELU aux leading dimension not a multiple of 8): the status cuBLASLt returns, and nothing printed, since
//     matmul.cuh asks for exactly these and takes its explicit fallback when refused, as on the GPU;
//   - a broken promise that would be undefined behaviour on a GPU (a pointer less aligned than the preference
//     said when its algorithm was chosen, a misaligned workspace): one line and exit(1).
#include <cublasLt.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <new>
#include <vector>

#include "kernels/dtype.h"
#include "tests/emu/device.h"
#include "tests/emu/emu.h"

struct cublasLtContext {
    int created;
};

struct cublasLtMatrixLayoutEmu {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;   // elements from one column to the next (CUBLASLT_ORDER_COL, the only order emulated)
};

struct cublasLtMatmulDescEmu {
    cublasOperation_t trans_a, trans_b;
    cublasLtEpilogue_t epilogue;
    const void* bias;    // input vector (BIAS variants) or bias-gradient output (BGRADB)
    int32_t bias_type;   // -1 until set: D's type, the documented default
    const void* aux;     // GELU input: written by GELU_AUX*, read by DGELU
    int64_t aux_ld;
};

struct cublasLtMatmulPreferenceEmu {
    uint64_t max_workspace;   // documented default 0: no workspace allowed
    uint32_t min_align[4];    // A, B, C, D in bytes; documented default 256
};

namespace {

const char* const kPrefix = "cuBLASLt (emulated by tests/emu/cublaslt.cpp)";

// One line on stderr for a refusal, returning the status the caller gets.
__attribute__((format(printf, 2, 3))) cublasStatus_t refuse(cublasStatus_t status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", kPrefix);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s)\n", cublasLtGetStatusString(status));
    va_end(ap);
    return status;
}

// A call a GPU would run into undefined behaviour with: reported, and the run ends.
[[noreturn]] __attribute__((format(printf, 1, 2))) void broken_promise(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", kPrefix);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

bool computable(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }
size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float load(const void* base, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float*)base)[i];
    const uint16_t h = ((const uint16_t*)base)[i];
    return t == CUDA_R_16BF ? f32_from_bf16(h) : f32_from_fp16(h);
}

void store(void* base, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F)
        ((float*)base)[i] = v;
    else
        ((uint16_t*)base)[i] = t == CUDA_R_16BF ? bf16_from_f32(v) : fp16_from_f32(v);
}

// Bytes from a column-major matrix's first element to just past its last: all a kernel may touch.
size_t extent_bytes(uint64_t rows, uint64_t cols, int64_t ld, cudaDataType_t t) {
    if (rows == 0 || cols == 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + rows) * type_size(t);
}

// The largest power of two up to 256 that divides the address: what the heuristic may assume of a pointer it
// is shown (the bias and aux pointers; the matrices' alignments come from the preference).
uint32_t pointer_alignment(const void* p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al != 0) al >>= 1;
    return al;
}

// kernels/cuda_common.cuh's gelu_f and gelu_grad_f, the tanh approximation cuBLAS documents for its GELU
// epilogues, so a fused epilogue computes what the unfused kernels would.
const float kGeluScale = 0.7978845608028654f;   // sqrt(2/pi)
float gelu(float x) {
    const float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}
float gelu_grad(float x) {
    const float cube = 0.044715f * x * x * x;
    const float t = tanhf(kGeluScale * (x + cube));
    const float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

bool epilogue_emulated(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool reads_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool writes_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BGRADB; }
bool writes_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool reads_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_DGELU; }

// What the heuristic promised an algorithm would be used with, carried in cublasLtMatmulAlgo_t's 64 bytes so
// cublasLtMatmul can hold the call to it.
struct AlgoRecord {
    uint64_t tag;
    uint32_t epilogue;
    uint32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
    uint32_t unused;
    uint64_t workspace;
};
static_assert(sizeof(AlgoRecord) <= sizeof(cublasLtMatmulAlgo_t), "AlgoRecord must fit cublasLtMatmulAlgo_t");
const uint64_t kAlgoTag = 0x31554d454d4c5443ull;   // marks an algorithm this file's heuristic returned

// One matmul's descriptor and layouts, with its sizes: op(A) is m x k, op(B) k x n, C and D m x n.
struct Problem {
    const cublasLtMatmulDescEmu* desc;
    const cublasLtMatrixLayoutEmu *a, *b, *c, *d;
    uint64_t m, n, k;
    cudaDataType_t bias_type;
};

cublasStatus_t check_shapes(const Problem& p) {
    const bool ta = p.desc->trans_a == CUBLAS_OP_T, tb = p.desc->trans_b == CUBLAS_OP_T;
    const uint64_t ka = ta ? p.a->rows : p.a->cols, kb = tb ? p.b->cols : p.b->rows;
    const uint64_t m = ta ? p.a->cols : p.a->rows, n = tb ? p.b->rows : p.b->cols;
    if (ka != kb || m != p.d->rows || n != p.d->cols)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "shapes do not fit: op(A) is %llu x %llu, op(B) %llu x %llu, D %llu x %llu",
                      (unsigned long long)m, (unsigned long long)ka, (unsigned long long)kb, (unsigned long long)n,
                      (unsigned long long)p.d->rows, (unsigned long long)p.d->cols);
    if (p.c->rows != p.d->rows || p.c->cols != p.d->cols || p.c->type != p.d->type)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "C's layout (%llu x %llu, type %d) differs from D's (%llu x %llu, type %d)",
                      (unsigned long long)p.c->rows, (unsigned long long)p.c->cols, (int)p.c->type,
                      (unsigned long long)p.d->rows, (unsigned long long)p.d->cols, (int)p.d->type);
    // cuBLASLt has kernels for some mixed types (16-bit A and B with fp32 C and D); the project uses none.
    if (p.a->type != p.d->type || p.b->type != p.d->type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A, B and D of types %d, %d, %d: only one type for all is emulated",
                      (int)p.a->type, (int)p.b->type, (int)p.d->type);
    return CUBLAS_STATUS_SUCCESS;
}

// The epilogue's vectors and what the library documents it accepts for them.
cublasStatus_t check_epilogue(const Problem& p) {
    const cublasLtEpilogue_t e = p.desc->epilogue;
    if ((reads_bias(e) || writes_bias(e)) && !p.desc->bias)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "epilogue %d without CUBLASLT_MATMUL_DESC_BIAS_POINTER", (int)e);
    if ((reads_aux(e) || writes_aux(e)) && !p.desc->aux)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "epilogue %d without CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER",
                      (int)e);
    // cublasLtMatmul's datatype table (CUBLAS_COMPUTE_32F): the bias vector has C's and D's type; the H100
    // refuses an fp32 bias-gradient vector with 16-bit matrices likewise (matmul.cuh).
    if ((reads_bias(e) || writes_bias(e)) && p.bias_type != p.d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: for GELU, a multiple of 8 and no less than D's rows.
    if ((reads_aux(e) || writes_aux(e)) && (p.desc->aux_ld % 8 != 0 || p.desc->aux_ld < (int64_t)p.m))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t make_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Problem* p) {
    if (!desc || !a || !b || !c || !d)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "a NULL matmul descriptor or matrix layout");
    p->desc = desc, p->a = a, p->b = b, p->c = c, p->d = d;
    p->m = d->rows, p->n = d->cols;
    p->k = desc->trans_a == CUBLAS_OP_T ? a->rows : a->cols;
    p->bias_type = desc->bias_type < 0 ? d->type : (cudaDataType_t)desc->bias_type;
    const cublasStatus_t s = check_shapes(*p);
    return s != CUBLAS_STATUS_SUCCESS ? s : check_epilogue(*p);
}

// ---------------------------------------------------------------------------------------------------
// The product and the epilogues.

// op(X) in fp32, column-major with leading dimension its row count.
std::vector<float> op_f32(const void* x, const cublasLtMatrixLayoutEmu& l, cublasOperation_t op) {
    const bool t = op == CUBLAS_OP_T;
    const uint64_t rows = t ? l.cols : l.rows, cols = t ? l.rows : l.cols;
    std::vector<float> out(rows * cols);
    for (uint64_t c = 0; c < cols; c++)
        for (uint64_t r = 0; r < rows; r++)
            out[r + c * rows] = load(x, l.type, t ? c + r * (uint64_t)l.ld : r + c * (uint64_t)l.ld);
    return out;
}

struct Run {
    Problem p;
    float alpha, beta;
    const void* c;
    void* d;
    std::vector<float> b_op;   // op(B), k x n (BGRADB reduces it)
    std::vector<float> acc;    // op(A) * op(B), m x n, each element summed over k ascending with fmaf
};

void multiply(Run* r, const void* a) {
    const uint64_t m = r->p.m, n = r->p.n, k = r->p.k;
    const std::vector<float> a_op = op_f32(a, *r->p.a, r->p.desc->trans_a);
    r->acc.assign(m * n, 0.0f);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t l = 0; l < k; l++) {
            const float b = r->b_op[l + j * k];
            for (uint64_t i = 0; i < m; i++) r->acc[i + j * m] = fmaf(a_op[i + l * m], b, r->acc[i + j * m]);
        }
}

// alpha * op(A) op(B) + beta * C at (i, j) in fp32. With beta 0, C is not read (BLAS's rule: it may hold
// anything, NaN included), which lets a caller pass an uninitialised output as C.
float linear(const Run& r, uint64_t i, uint64_t j) {
    float v = r.alpha * r.acc[i + j * r.p.m];
    if (r.beta != 0.0f) v += r.beta * load(r.c, r.p.c->type, i + j * (uint64_t)r.p.c->ld);
    return v;
}

void store_d(const Run& r, uint64_t i, uint64_t j, float v) { store(r.d, r.p.d->type, i + j * (uint64_t)r.p.d->ld, v); }

// Every element is read from C before the same element of D is written, so C == D (in place) is safe.
void epilogue_default(const Run& r) {
    for (uint64_t j = 0; j < r.p.n; j++)
        for (uint64_t i = 0; i < r.p.m; i++) store_d(r, i, j, linear(r, i, j));
}

// BIAS: bias[i] (one per row of D, broadcast over the columns) added before the result is rounded.
void epilogue_bias(const Run& r) {
    for (uint64_t j = 0; j < r.p.n; j++)
        for (uint64_t i = 0; i < r.p.m; i++) store_d(r, i, j, linear(r, i, j) + load(r.p.desc->bias, r.p.bias_type, i));
}

// GELU_AUX[_BIAS]: the GELU input (after the bias) goes to aux, rounded to D's type; D gets GELU of the same
// fp32 value, so it is rounded once.
void epilogue_gelu_aux(const Run& r, bool with_bias) {
    void* aux = (void*)r.p.desc->aux;
    for (uint64_t j = 0; j < r.p.n; j++)
        for (uint64_t i = 0; i < r.p.m; i++) {
            float x = linear(r, i, j);
            if (with_bias) x += load(r.p.desc->bias, r.p.bias_type, i);
            store(aux, r.p.d->type, i + j * (uint64_t)r.p.desc->aux_ld, x);
            store_d(r, i, j, gelu(x));
        }
}

// DGELU: the product times GELU's derivative at the stored GELU input (aux, D's type).
void epilogue_dgelu(const Run& r) {
    for (uint64_t j = 0; j < r.p.n; j++)
        for (uint64_t i = 0; i < r.p.m; i++) {
            const float x = load(r.p.desc->aux, r.p.d->type, i + j * (uint64_t)r.p.desc->aux_ld);
            store_d(r, i, j, linear(r, i, j) * gelu_grad(x));
        }
}

// BGRADB: D as DEFAULT, and bias[j] = the sum over k of op(B)[l][j], one per column of D (cuBLASLt: "the bias
// size corresponds to the number of columns of the matrix D; the reduction happens over the GEMM's k
// dimension"). The vector is overwritten, not accumulated into; alpha does not scale it (the project's alpha
// is always 1, checked where the call is made).
void epilogue_bgradb(const Run& r) {
    epilogue_default(r);
    void* bias = (void*)r.p.desc->bias;
    for (uint64_t j = 0; j < r.p.n; j++) {
        float s = 0.0f;
        for (uint64_t l = 0; l < r.p.k; l++) s += r.b_op[l + j * r.p.k];
        store(bias, r.p.bias_type, j, s);
    }
}

void run_epilogue(const Run& r) {
    switch (r.p.desc->epilogue) {
    case CUBLASLT_EPILOGUE_BIAS: epilogue_bias(r); break;
    case CUBLASLT_EPILOGUE_GELU_AUX: epilogue_gelu_aux(r, false); break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: epilogue_gelu_aux(r, true); break;
    case CUBLASLT_EPILOGUE_DGELU: epilogue_dgelu(r); break;
    case CUBLASLT_EPILOGUE_BGRADB: epilogue_bgradb(r); break;
    default: epilogue_default(r); break;   // the setter lets through no other epilogue
    }
}

// ---------------------------------------------------------------------------------------------------
// What cublasLtMatmul checks before it computes.

void check_aligned(const char* what, const void* p, uint32_t promised, const char* source) {
    if (promised > 1 && (uintptr_t)p % promised != 0)
        broken_promise("%s at %p is not %u-byte aligned, as %s promised when its algorithm was chosen", what, p,
                       promised, source);
}

void check_alignments(const Problem& p, const AlgoRecord& rec, const void* a, const void* b, const void* c,
                      const void* d) {
    check_aligned("matrix A", a, rec.align_a, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES");
    check_aligned("matrix B", b, rec.align_b, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES");
    check_aligned("matrix C", c, rec.align_c, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES");
    check_aligned("matrix D", d, rec.align_d, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES");
    const cublasLtEpilogue_t e = p.desc->epilogue;
    if (reads_bias(e) || writes_bias(e))
        check_aligned("the bias vector", p.desc->bias, rec.align_bias,
                      "the bias pointer's value (seen by the heuristic)");
    if (reads_aux(e) || writes_aux(e))
        check_aligned("the aux matrix", p.desc->aux, rec.align_aux, "the aux pointer's value (seen by the heuristic)");
}

// Every byte range the call reads or writes, inside a live device allocation (emu::global_access faults if not).
void check_bounds(const Run& r, const void* a, const void* b, const void* workspace, size_t workspace_bytes) {
    const Problem& p = r.p;
    const cublasLtEpilogue_t e = p.desc->epilogue;
    const auto access = [](const void* ptr, size_t bytes, bool write) {
        if (bytes) emu::global_access(ptr, bytes, write);
    };
    access(a, extent_bytes(p.a->rows, p.a->cols, p.a->ld, p.a->type), false);
    access(b, extent_bytes(p.b->rows, p.b->cols, p.b->ld, p.b->type), false);
    if (r.beta != 0.0f) access(r.c, extent_bytes(p.c->rows, p.c->cols, p.c->ld, p.c->type), false);
    access(r.d, extent_bytes(p.d->rows, p.d->cols, p.d->ld, p.d->type), true);
    if (reads_bias(e)) access(p.desc->bias, p.m * type_size(p.bias_type), false);
    if (writes_bias(e)) access(p.desc->bias, p.n * type_size(p.bias_type), true);
    if (reads_aux(e) || writes_aux(e))
        access(p.desc->aux, extent_bytes(p.m, p.n, p.desc->aux_ld, p.d->type), writes_aux(e));
    // An algorithm may use all the workspace it was chosen with.
    access(workspace, workspace_bytes, true);
}

template <typename T> cublasStatus_t read_attribute(T* out, const void* buf, size_t size, const char* what) {
    if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: NULL value", what);
    if (size != sizeof(T))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: %zu bytes given, the attribute has %zu", what, size, sizeof(T));
    memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t set_transpose(cublasOperation_t* out, const void* buf, size_t size, const char* what) {
    int32_t op = 0;
    const cublasStatus_t s = read_attribute(&op, buf, size, what);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s = %d: only CUBLAS_OP_N and CUBLAS_OP_T are emulated", what, op);
    *out = (cublasOperation_t)op;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t set_epilogue(cublasLtMatmulDescEmu* desc, const void* buf, size_t size) {
    uint32_t e = 0;
    const cublasStatus_t s = read_attribute(&e, buf, size, "CUBLASLT_MATMUL_DESC_EPILOGUE");
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!epilogue_emulated(e))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "epilogue %u is not emulated (DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU and BGRADB are)", e);
    desc->epilogue = (cublasLtEpilogue_t)e;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t set_bias_type(cublasLtMatmulDescEmu* desc, const void* buf, size_t size) {
    int32_t t = 0;
    const cublasStatus_t s = read_attribute(&t, buf, size, "CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE");
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (t != -1 && !computable(t))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "bias data type %d is not emulated (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F are)", t);
    desc->bias_type = t;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t set_alignment(uint32_t* out, const void* buf, size_t size, const char* what) {
    uint32_t al = 0;
    const cublasStatus_t s = read_attribute(&al, buf, size, what);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (al == 0 || (al & (al - 1)) != 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s = %u: an alignment is a power of two", what, al);
    *out = al;
    return CUBLAS_STATUS_SUCCESS;
}

}   // namespace

// ---------------------------------------------------------------------------------------------------
// The API.

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
    static std::once_flag announced;
    std::call_once(announced, [] { fprintf(stderr, "cuBLASLt: emulated by a CPU matmul (tests/emu/cublaslt.cpp)\n"); });
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtContext* h = new (std::nothrow) cublasLtContext{1};
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "unknown cublasStatus_t";
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    if (!computable(type))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "matrix type %d is not emulated (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F are)", (int)type);
    // Column-major: each column's rows fit below the next column's start.
    if (ld < 1 || (uint64_t)ld < rows)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "leading dimension %lld for %llu rows", (long long)ld,
                      (unsigned long long)rows);
    cublasLtMatrixLayoutEmu* l = new (std::nothrow) cublasLtMatrixLayoutEmu{type, rows, cols, ld};
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "compute type %d with scale type %d is not emulated (CUBLAS_COMPUTE_32F with CUDA_R_32F is)",
                      (int)computeType, (int)scaleType);
    cublasLtMatmulDescEmu* d = new (std::nothrow)
        cublasLtMatmulDescEmu{CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, -1, nullptr, 0};
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return set_transpose(&matmulDesc->trans_a, buf, sizeInBytes, "CUBLASLT_MATMUL_DESC_TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return set_transpose(&matmulDesc->trans_b, buf, sizeInBytes, "CUBLASLT_MATMUL_DESC_TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_epilogue(matmulDesc, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return read_attribute(&matmulDesc->bias, buf, sizeInBytes, "CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_bias_type(matmulDesc, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return read_attribute(&matmulDesc->aux, buf, sizeInBytes, "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return read_attribute(&matmulDesc->aux_ld, buf, sizeInBytes, "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD");
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "matmul descriptor attribute %d is not emulated (TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, "
                      "BIAS_DATA_TYPE, EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD are)",
                      (int)attr);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreferenceEmu* p = new (std::nothrow) cublasLtMatmulPreferenceEmu{0, {256, 256, 256, 256}};
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return read_attribute(&pref->max_workspace, buf, sizeInBytes, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        return set_alignment(&pref->min_align[0], buf, sizeInBytes, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        return set_alignment(&pref->min_align[1], buf, sizeInBytes, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        return set_alignment(&pref->min_align[2], buf, sizeInBytes, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return set_alignment(&pref->min_align[3], buf, sizeInBytes, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES");
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "matmul preference attribute %d is not emulated (MAX_WORKSPACE_BYTES and "
                      "MIN_ALIGNMENT_A/B/C/D_BYTES are)",
                      (int)attr);
    }
}

// One algorithm, or the status cuBLASLt documents for a combination it has no kernel for.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !preference)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    Problem p;
    const cublasStatus_t s = make_problem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    AlgoRecord rec;
    memset(&rec, 0, sizeof(rec));
    rec.tag = kAlgoTag;
    rec.epilogue = (uint32_t)operationDesc->epilogue;
    rec.align_a = preference->min_align[0], rec.align_b = preference->min_align[1];
    rec.align_c = preference->min_align[2], rec.align_d = preference->min_align[3];
    rec.align_bias = pointer_alignment(operationDesc->bias);
    rec.align_aux = pointer_alignment(operationDesc->aux);
    rec.workspace = preference->max_workspace;
    cublasLtMatmulHeuristicResult_t* r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    memcpy(r->algo.data, &rec, sizeof(rec));
    r->workspaceSize = (size_t)rec.workspace;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    (void)stream;   // every emulated stream runs in issue order: computing now keeps that order
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    emu::FenceLift open_device;   // the stand-in works on device memory as the library would
    Run r;
    cublasStatus_t s = make_problem(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &r.p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: NULL alpha or beta");
    if (!algo) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul without an algorithm is not emulated");
    AlgoRecord rec;
    memcpy(&rec, algo->data, sizeof(rec));
    if (rec.tag != kAlgoTag)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "cublasLtMatmul: the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned");
    if (rec.epilogue != (uint32_t)computeDesc->epilogue)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "cublasLtMatmul: epilogue %d with an algorithm chosen for epilogue %u",
                      (int)computeDesc->epilogue, rec.epilogue);
    if (workspaceSizeInBytes < rec.workspace)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "cublasLtMatmul: a %zu-byte workspace for an algorithm chosen with %llu", workspaceSizeInBytes,
                      (unsigned long long)rec.workspace);
    if (rec.workspace && (uintptr_t)workspace % 256 != 0)
        broken_promise("the workspace at %p is not 256-byte aligned, as cublasLtMatmul requires", workspace);
    r.alpha = *(const float*)alpha;   // CUDA_R_32F scale type, host pointer mode: the only ones emulated
    r.beta = *(const float*)beta;
    if (writes_bias(computeDesc->epilogue) && r.alpha != 1.0f)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "BGRADB with alpha %g: only alpha 1 is emulated", (double)r.alpha);
    r.c = C, r.d = D;
    check_alignments(r.p, rec, A, B, C, D);
    check_bounds(r, A, B, workspace, (size_t)rec.workspace);
    r.b_op = op_f32(B, *r.p.b, computeDesc->trans_b);
    multiply(&r, A);
    run_epilogue(r);
    return CUBLAS_STATUS_SUCCESS;
}

}   // extern "C"
