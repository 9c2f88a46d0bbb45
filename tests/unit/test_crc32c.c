// test_crc32c.c: core/util/crc32c.c against CRC-32C's standard check value and TFRecord's masking.
#include <string.h>

#include "core/util/crc32c.h"
#include "tests/unit/testlib.h"

int main(void) {
    TestStats st = {0};
    check_true(&st, "crc32c_check_value", crc32c("123456789", 9) == 0xE3069283u);
    check_true(&st, "crc32c_empty", crc32c("", 0) == 0u);
    // 32 zero bytes: the iSCSI test vector of RFC 3720, B.4.
    unsigned char zeros[32];
    memset(zeros, 0, sizeof(zeros));
    check_true(&st, "crc32c_rfc3720_zeros", crc32c(zeros, sizeof(zeros)) == 0x8A9136AAu);
    uint32_t c = 0xE3069283u;
    check_true(&st, "crc32c_masked", crc32c_masked("123456789", 9) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
    return test_exit(&st);
}
