// cub/device/device_radix_sort.cuh (emulated): cub's radix sort is a library call; the emulator stands in for
// it with a stable sort on the CPU over the same key bits, which orders exactly as cub's stable LSD sort does.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "tests/emu/device.h"

namespace cub {
struct DeviceRadixSort {
    // Signed keys sort as cub sorts them: by value (cub flips the sign bit), on bits [begin_bit, end_bit).
    template <typename K, typename V>
    static cudaError_t SortPairs(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                                 V* vals_out, int n, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8,
                                 cudaStream_t = 0) {
        static_assert(sizeof(K) == 4, "the emulated radix sort takes 32-bit keys");
        if (!tmp) {
            tmp_bytes = 256;   // cub asks for scratch; the stand-in needs none but keeps the protocol
            return cudaSuccess;
        }
        emu::note_once("cub::DeviceRadixSort::SortPairs: emulated by a stable sort on the CPU (tests/emu/include/cub)");
        if (n <= 0) return cudaSuccess;
        emu::FenceLift open_device;
        emu::global_access(tmp, tmp_bytes, true);
        for (const void* p : {(const void*)keys_in, (const void*)vals_in}) emu::global_access(p, (size_t)n * 4, false);
        for (const void* p : {(const void*)keys_out, (const void*)vals_out}) emu::global_access(p, (size_t)n * 4, true);
        const uint32_t flip = std::is_signed<K>::value ? 0x80000000u : 0u;
        const uint32_t mask = (end_bit >= 32 ? 0xffffffffu : ((1u << end_bit) - 1)) & ~((1u << begin_bit) - 1);
        auto key = [&](int i) { return ((uint32_t)keys_in[i] ^ flip) & mask; };
        std::vector<int> idx((size_t)n);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key(a) < key(b); });
        std::vector<K> k((size_t)n);
        std::vector<V> v((size_t)n);
        for (int i = 0; i < n; i++) k[(size_t)i] = keys_in[idx[(size_t)i]], v[(size_t)i] = vals_in[idx[(size_t)i]];
        std::copy(k.begin(), k.end(), keys_out);
        std::copy(v.begin(), v.end(), vals_out);
        return cudaSuccess;
    }
};
}  // namespace cub
