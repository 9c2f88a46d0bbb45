// backend_cpu.c: the CPU backend's memory, synchronization and precision helpers. Backend memory is host
// memory; kernels run synchronously, so streams and synchronization are no-ops.
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_common.h"

struct Backend {
    size_t bytes_now;    // live be_malloc'd bytes (payload only)
    size_t bytes_peak;   // high-water mark of bytes_now
};

// Each allocation is preceded by a header recording its size, so be_free can keep the count without a
// table. 64 bytes keeps the payload aligned for vector loads.
#define ALLOC_HEADER 64

Backend* backend_create(int local_rank) {
    (void)local_rank;
    Backend* be = xcalloc(1, sizeof(Backend));
    return be;
}

void backend_destroy(Backend* be) { free(be); }

const char* backend_device_name(const Backend* be) {
    (void)be;
    return "cpu";
}

int backend_is_gpu(const Backend* be) {
    (void)be;
    return 0;
}

void* backend_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* backend_comm_stream(Backend* be) {
    (void)be;
    return NULL;
}

void* be_malloc(Backend* be, size_t bytes) {
    size_t total = (bytes + ALLOC_HEADER + ALLOC_HEADER - 1) / ALLOC_HEADER * ALLOC_HEADER;
    if (total < bytes) fail("out of host memory allocating %zu bytes", bytes);
    unsigned char* base = aligned_alloc(ALLOC_HEADER, total);
    if (!base) fail("out of host memory allocating %zu bytes (%zu in use)", bytes, be->bytes_now);
    memcpy(base, &bytes, sizeof bytes);
    be->bytes_now += bytes;
    if (be->bytes_now > be->bytes_peak) be->bytes_peak = be->bytes_now;
    return base + ALLOC_HEADER;
}

void be_free(Backend* be, void* p) {
    if (!p) return;
    unsigned char* base = (unsigned char*)p - ALLOC_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    be->bytes_now -= bytes;
    free(base);
}

void be_memset0(Backend* be, void* p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}

void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src_host, bytes);
}

void be_download(Backend* be, void* dst_host, const void* src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst_host, src, bytes);
}

void be_copy(Backend* be, void* dst, const void* src, size_t bytes) {
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void be_synchronize(Backend* be) { (void)be; }

size_t be_peak_bytes(const Backend* be) { return be->bytes_peak; }

// The CPU has no pinned memory: host buffers are plain heap memory, outside the backend's byte ledger.
void* be_host_alloc(Backend* be, size_t bytes) {
    (void)be;
    return xmalloc(bytes ? bytes : 1);
}

void be_host_free(Backend* be, void* p) {
    (void)be;
    free(p);
}

float dtype_round(float x, DType dt) { return round_to(x, dt); }

void host_to_dtype(void* dst, DType dt, const float* src, size_t n) {
    for (size_t i = 0; i < n; i++) st(dst, i, src[i], dt);
}

void host_from_dtype(float* dst, const void* src, DType dt, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = ld(src, i, dt);
}

void convert(Backend* be, void* dst, DType dst_dt, const void* src, DType src_dt, size_t n) {
    if (dst_dt == src_dt) {
        be_copy(be, dst, src, n * dtype_size(dst_dt));
        return;
    }
    // Widening to fp32 first is exact, so bf16 -> fp16 rounds once, from the true value.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) st(dst, i, ld(src, i, src_dt), dst_dt);
}

int backend_build_is_gpu(void) { return 0; }
