// onebit.h: 1-bit Adam's compressed all-reduce (DeepSpeed's compressed_allreduce, error-compensated).
//
// A group of N ranks each holds a buffer x of N equal chunks (chunk j: [j*len, (j+1)*len)); afterwards every
// rank holds the same approximation of their mean. Worker side, each rank adds its worker error e_w to x,
// compresses the whole buffer to one scale s = ||x + e_w|| / sqrt(N*len) and the signs of x + e_w (sign(0) =
// +1, so ||s * sign|| = ||x + e_w||), keeps e_w = (x + e_w) - s * sign, and sends chunk j's signs, packed as
// bits, with s to rank j (an all-to-all). Server side, rank j averages the N decompressed chunks it received,
// adds its server error e_s (len elements), compresses that chunk the same way (its own scale) with e_s
// taking the remainder, and the server chunks, bits and scale, are all-gathered into x on every rank. What
// moves is N*len/8 bytes of signs and N scales each way: the all-to-all's and the all-gather's byte counts
// (comm.h) are what a 1-bit exchange costs.
//
// Buffers here are host fp32 (x, e_w, e_s); the messages go through backend memory (be_upload/download
// around the collectives), so a GPU build runs the same host arithmetic and stages the bits.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/comm/comm.h"

// Bytes of one message block: a scale and len sign bits, rounded up to whole fp32 words (the collectives'
// element type; nothing is added, the words are moved as they are).
size_t onebit_block_words(size_t len);

// Compresses y (n) in place of its error: *scale = ||y|| / sqrt(n), bits[i/8] bit i%8 set where y[i] >= 0
// (or is NaN: it is not negative), err[i] = y[i] - scale * sign(y[i]). y and err may be the same buffer.
float onebit_compress(const float* y, float* err, size_t n, uint8_t* bits);
// out[i] = scale * sign bit i (+1 set, -1 clear).
void onebit_expand(const uint8_t* bits, float scale, size_t n, float* out);

typedef struct {
    void* send;     // backend memory: N blocks (the all-to-all's input)
    void* recv;     // backend memory: N blocks (its output; then the all-gather's buffer)
    uint32_t* host; // N blocks on the host (packing and unpacking)
    float* avg;     // len fp32 on the host: the server's average
    size_t len;     // the chunk length these buffers fit
    int size;
} OnebitScratch;

OnebitScratch onebit_scratch(Backend* be, int size, size_t len);
void onebit_scratch_free(OnebitScratch* s, Backend* be);

// The exchange over c (every rank calls it with the same len): x and e_w hold comm_size(c) * len elements,
// e_s len (this rank's server chunk). With one rank it still compresses twice (the errors are the same
// arithmetic whatever N).
void onebit_allreduce(Comm* c, Backend* be, OnebitScratch* s, float* x, float* e_w, float* e_s, size_t len);
