// qgz.h: ZeRO++'s quantized gradient reduction (qgZ, Wang et al. 2023) in place of -z 2/3's reduce-scatter of a
// unit's gradient slot (grad_slots.h), over the data-parallel group split by host (core/comm/host_groups.h:
// H hosts x L ranks, dp rank h L + l).
//
// The result is the exact reduce-scatter's layout: rank r ends with the sum over ranks of piece r of the
// unit's gradient buffer, in the run's dtype at its place in the buffer (Pieces.mine_first), and the
// accumulator adds it as before. On the way:
//   1. each rank adds its error e to its gradient g (fp32, y = g + e), quantizes every piece of y (int4,
//      blocks of QGZ_BLOCK, kernels.h's block format and arithmetic) and keeps e = y - dequant(quant(y));
//   2. an all-to-all inside the host sends local rank l' the packets of pieces h' L + l' (every h');
//   3. each rank dequantizes the L packets of each such piece and sums them in fp32 in local-rank order;
//   4. with more than one host, it requantizes the H partial sums, an all-to-all among the ranks of its local
//      index (one per host) brings it the H packets of its own piece, and it sums their dequantized values in
//      host order; with one host the partial sum of step 3 is already the whole sum.
// So only step 4's all-to-all crosses hosts, carrying 9/16 byte per element where the exact reduce-scatter
// carries 2 (bf16, fp16) or 4 (fp32): int4 is half a byte, the fp32 scale per 64 elements a sixteenth. Blocks
// of 64: a piece is a multiple of 64 elements (pieces.h), so blocks never straddle pieces and start at the same
// places whatever the number of ranks; smaller blocks would spend more on scales than int4 saves over int8.
// Every sum runs in a fixed order, so every run with the same inputs gives the same bits.
//
// Error feedback. LoCo (Xie et al. 2023) keeps, per rank, the error its compression of the gradient left and
// adds it (moving-averaged and itself compressed to 8 bits) to the next step's gradient before compressing it,
// so the errors cancel over steps instead of piling up. Here the error is kept whole in fp32 (no averaging, no
// compression of it): e after a reduction is exactly what the first quantization lost, so the sum over k
// reductions of what each rank sent equals the sum of its gradients minus the last e, within one step's
// quantization error. Only the first quantization (the rank's own gradient) has an error buffer; the
// requantization of the partial sums (step 4) does not, as in ZeRO++. The buffer is backend fp32, the whole
// gradient layout of the units qgZ covers (category grads: --estimate counts it), one per rank of the group.
// Checkpoints keep it in qgz_rank<r>.bin (feedback_file.h's whole-layout section): a resume with the same
// data-parallel size is bit-exact; under another size each of the R ranks starts from the sum of the writers'
// errors over R, since the reduction sums what every rank sends: the errors the readers add together are
// those the writers would have (a mean would drop a share of them, or add one, whenever R differs from the
// writers' count). A unit's coverage depends on its piece, so on the size: a unit the writer did not cover
// holds zeros in its file, and a unit the reader does not cover leaves what its file holds unused. Under
// fp16 the error is in the loss-scaled units of the step that made it.
//
// Overflow: a block holding a NaN or an infinity quantizes to scale NaN, so the sums dequantize to NaN and the
// trainer's non-finite verdict skips the step (fp16: the loss scale shrinks). The error of such a block keeps
// its previous value rather than becoming NaN for every later step.
//
// A unit whose piece is under QGZ_MIN_PIECE elements (a tied head's final norm) takes the exact reduce-scatter:
// its collective costs its latency whatever the bytes. The arithmetic runs on the host (as 1-bit Adam's does):
// in the CPU build its copies are memcpy, in the GPU build they make it a correctness path.
#pragma once
#include "core/comm/host_groups.h"
#include "core/model/memory.h"
#include "core/zero/pieces.h"

#define QGZ_BLOCK 64
#define QGZ_BITS 4
#define QGZ_MIN_PIECE 256

// -qg covers -z 2 and 3's reduce-scatter over 2 or more data-parallel ranks: one line otherwise.
void qgz_check(int qg, int zero_stage, int dp);

typedef struct {
    HostGroups groups;            // the grid's (not owned); zeroed for zero_plan
    Backend* be;
    float* err;                   // backend fp32: unit u's error at err_at[u] (covered units only)
    size_t err_at[MAX_UNITS], err_len;
    void *send, *recv;            // backend: the all-to-alls' packets, pc->size of the largest covered piece's
    double seconds;               // quantizing and dequantizing since qgz_take_seconds
} Qgz;

// Allocates (be == NULL: only charges mem) the error, zeroed, and the packet buffers.
void qgz_init(Qgz* q, Backend* be, MemLedger* mem, const Pieces* pc);
// The grid's host groups of the data-parallel group (after qgz_init, before the first reduction).
void qgz_attach(Qgz* q, const HostGroups* groups, const Pieces* pc);
void qgz_free(Qgz* q, Backend* be);
int qgz_covers(const Pieces* pc, int u);
// One rank's packet for a piece of n elements: int4 levels, then the fp32 scales.
size_t qgz_packet_bytes(size_t n);
// The host arithmetic of one piece (n a multiple of QGZ_BLOCK). Error feedback: y += e, y quantized into
// packet, e = y - dequant(packet) (kept as it was in a block holding a NaN or an infinity). packet's values
// added to out (fp32, one rounding each).
void qgz_feed_back(unsigned char* packet, float* y, float* e, size_t n);
void qgz_dequantize_add(float* out, const unsigned char* packet, size_t n);
// Unit u's gradient buffer buf (pc->dt, the whole trained section) -> this rank's summed piece at
// mine_first. Collective over the data-parallel group; synchronous.
void qgz_reduce_scatter(Qgz* q, const Pieces* pc, int u, void* buf);
double qgz_take_seconds(Qgz* q);   // the time since the last call
// The error into this rank's qgz_rank<r>.bin in checkpoint dir, and back (Error feedback above).
void qgz_save(const Qgz* q, Backend* be, const Pieces* pc, const char* dir);
void qgz_load(Qgz* q, Backend* be, const Pieces* pc, const char* dir);
