// fake_gpu_backend.c: a stand-in "GPU" backend for testing the comm layer's staging path without a GPU
// (tests/t_comm.sh links it into test_comm instead of the CPU backend). backend_is_gpu says yes, and
// "device" memory is mapped PROT_NONE except inside be_upload/be_download/be_copy, so any collective that
// hands a device pointer to MPI or memcpy crashes instead of passing by luck.
#include <sys/mman.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/dtype.h"
#include "kernels/kernels.h"

struct Backend {
    size_t page;
};


Backend* backend_create(int local_rank) {
    (void)local_rank;
    Backend* be = xcalloc(1, sizeof(Backend));
    be->page = (size_t)sysconf(_SC_PAGESIZE);
    return be;
}
void backend_destroy(Backend* be) { free(be); }
const char* backend_device_name(const Backend* be) {
    (void)be;
    return "fake gpu";
}
int backend_is_gpu(const Backend* be) {
    (void)be;
    return 1;
}

// Layout: one readable page holding the mapping length, then the payload pages, PROT_NONE.
void* be_malloc(Backend* be, size_t bytes) {
    size_t len = be->page + (bytes + be->page - 1) / be->page * be->page;
    unsigned char* base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) fail("fake gpu: mmap of %zu bytes failed", len);
    memcpy(base, &len, sizeof len);
    if (len > be->page && mprotect(base + be->page, len - be->page, PROT_NONE) != 0) fail("fake gpu: mprotect failed");
    return base + be->page;
}
void be_free(Backend* be, void* p) {
    if (!p) return;
    unsigned char* base = (unsigned char*)p - be->page;
    size_t len;
    memcpy(&len, base, sizeof len);
    if (munmap(base, len) != 0) fail("fake gpu: munmap failed");
}

// Opens or closes the pages of the allocation holding p (p may point inside it).
static void access_pages(Backend* be, const void* p, size_t bytes, int prot) {
    uintptr_t lo = (uintptr_t)p / be->page * be->page;
    uintptr_t hi = ((uintptr_t)p + bytes + be->page - 1) / be->page * be->page;
    if (bytes && mprotect((void*)lo, hi - lo, prot) != 0) fail("fake gpu: mprotect failed");
}

void be_memset0(Backend* be, void* p, size_t bytes) {
    access_pages(be, p, bytes, PROT_READ | PROT_WRITE);
    memset(p, 0, bytes);
    access_pages(be, p, bytes, PROT_NONE);
}
void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes) {
    access_pages(be, dst, bytes, PROT_READ | PROT_WRITE);
    memcpy(dst, src_host, bytes);
    access_pages(be, dst, bytes, PROT_NONE);
}
void be_download(Backend* be, void* dst_host, const void* src, size_t bytes) {
    access_pages(be, src, bytes, PROT_READ);
    memcpy(dst_host, src, bytes);
    access_pages(be, src, bytes, PROT_NONE);
}
void be_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    access_pages(be, src, bytes, PROT_READ | PROT_WRITE);
    access_pages(be, dst, bytes, PROT_READ | PROT_WRITE);
    memmove(dst, src, bytes);
    access_pages(be, src, bytes, PROT_NONE);
    access_pages(be, dst, bytes, PROT_NONE);
}
void be_synchronize(Backend* be) { (void)be; }

float dtype_round(float x, DType dt) {
    return dt == DT_BF16 ? f32_from_bf16(bf16_from_f32(x)) : dt == DT_FP16 ? f32_from_fp16(fp16_from_f32(x)) : x;
}
void host_to_dtype(void* dst, DType dt, const float* src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_FP32) ((float*)dst)[i] = src[i];
        else ((uint16_t*)dst)[i] = dt == DT_BF16 ? bf16_from_f32(src[i]) : fp16_from_f32(src[i]);
    }
}
void host_from_dtype(float* dst, const void* src, DType dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dt == DT_FP32 ? 0 : ((const uint16_t*)src)[i];
        dst[i] = dt == DT_FP32 ? ((const float*)src)[i] : dt == DT_BF16 ? f32_from_bf16(h) : f32_from_fp16(h);
    }
}
