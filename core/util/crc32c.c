// crc32c.c: see crc32c.h. Bit by bit: the records are a few hundred bytes per step, so a table buys nothing.
#include "core/util/crc32c.h"

uint32_t crc32c(const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int b = 0; b < 8; b++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

uint32_t crc32c_masked(const void* data, size_t n) {
    uint32_t crc = crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
