// crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing, and
// TFRecord's masked form of it (a CRC stored beside the data it covers is rotated and offset so that a CRC
// of bytes holding CRCs does not degenerate).
#pragma once
#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(const void* data, size_t n);
// ((crc >> 15) | (crc << 17)) + 0xa282ead8 of crc32c(data).
uint32_t crc32c_masked(const void* data, size_t n);
