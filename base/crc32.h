// crc32.h: CRC-32 (the IEEE polynomial of zlib, gzip and PNG), so that Python's zlib.crc32 checks what the
// trainer writes. The running value and its tables live in the caller's Crc32: no state outside it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t table[16][256];   // table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-16)
    uint32_t crc;              // of the bytes so far
} Crc32;

void crc32_begin(Crc32* c);
void crc32_add(Crc32* c, const void* p, size_t n);
uint32_t crc32_of(const void* p, size_t n);   // the CRC of n bytes, in one call
// A whole file's CRC into *crc; 0 (errno set) when it cannot be read.
int crc32_file(const char* path, uint32_t* crc);

#ifdef __cplusplus
}
#endif
