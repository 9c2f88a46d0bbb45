// qgz.c: see qgz.h. A packet is [int4 levels, two per byte][one fp32 scale per QGZ_BLOCK elements], in
// kernels.h's block format, made with the same arithmetic as quantize_blocks (kernels/quantize_common.h).
#include "core/zero/qgz.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "core/util/phase_timer.h"
#include "core/zero/feedback_file.h"
#include "kernels/host_elem.h"
#include "kernels/quantize_common.h"

void qgz_check(int qg, int zero_stage, int dp) {
    if (!qg) return;
    if (zero_stage < 2)
        fail("-qg 1 quantizes ZeRO's reduce-scatter of the gradients: it needs -z 2 or 3, not -z %d", zero_stage);
    if (dp < 2) fail("-qg 1 quantizes the gradient reduction: with one data-parallel rank there is none");
}

int qgz_covers(const Pieces* pc, int u) { return pc->mine_len[u] >= QGZ_MIN_PIECE; }

size_t qgz_packet_bytes(size_t n) { return quant_bytes(n, QGZ_BITS) + (n + QGZ_BLOCK - 1) / QGZ_BLOCK * sizeof(float); }

void qgz_init(Qgz* q, Backend* be, MemLedger* mem, const Pieces* pc) {
    *q = (Qgz){.be = be};
    size_t largest = 0;
    for (int u = 0; u < pc->lay->num_units; u++) {
        if (!qgz_covers(pc, u)) continue;
        if (pc->grad_len[u] != (size_t)pc->size * pc->mine_len[u] || pc->mine_len[u] % QGZ_BLOCK)
            fail("internal: unit %d's gradient (%zu) is not %d pieces of whole blocks", u, pc->grad_len[u], pc->size);
        q->err_at[u] = q->err_len;
        q->err_len += pc->grad_len[u];
        largest = pc->mine_len[u] > largest ? pc->mine_len[u] : largest;
    }
    q->err = (float*)mem_alloc(be, mem, MEM_GRADS, q->err_len * 4);
    if (be) be_memset0(be, q->err, q->err_len * 4);
    size_t packets = (size_t)pc->size * qgz_packet_bytes(largest);
    q->send = mem_alloc(be, mem, MEM_COMM, packets);
    q->recv = mem_alloc(be, mem, MEM_COMM, packets);
}

void qgz_attach(Qgz* q, const HostGroups* groups, const Pieces* pc) {
    if (!groups->intra || groups->per_host * groups->hosts != pc->size)
        fail("internal: qgZ's host groups (%d x %d) do not cover the data-parallel group of %d", groups->hosts,
             groups->per_host, pc->size);
    q->groups = *groups;
}

void qgz_free(Qgz* q, Backend* be) {
    void* bufs[] = {q->err, q->send, q->recv};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i] && be) be_free(be, bufs[i]);
    *q = (Qgz){0};
}

double qgz_take_seconds(Qgz* q) {
    double s = q->seconds;
    q->seconds = 0.0;
    return s;
}

// ---------------------------------------------------------------------------------------------------
// Packets on the host.

static float* packet_scales(unsigned char* packet, size_t n) { return (float*)(packet + quant_bytes(n, QGZ_BITS)); }
static const float* packet_scales_c(const unsigned char* packet, size_t n) { return (const float*)(packet + quant_bytes(n, QGZ_BITS)); }

static void quantize_piece(unsigned char* packet, const float* x, size_t n) {
    float* scales = packet_scales(packet, n);
    for (size_t lo = 0; lo < n; lo += QGZ_BLOCK) {
        float absmax = 0.0f;
        int nonfinite = 0;
        for (size_t i = lo; i < lo + QGZ_BLOCK; i++) {
            float a = fabsf(x[i]);
            if (!isfinite(a)) nonfinite = 1;
            else if (a > absmax) absmax = a;
        }
        float s = quant_scale(absmax, nonfinite, QGZ_BITS);
        scales[lo / QGZ_BLOCK] = s;
        for (size_t i = lo; i < lo + QGZ_BLOCK; i += 2)
            packet[i / 2] = (uint8_t)(quant_nibble(quant_level(x[i], s, QGZ_BITS)) |
                                      quant_nibble(quant_level(x[i + 1], s, QGZ_BITS)) << 4);
    }
}

static float level_at(const unsigned char* packet, size_t i) { return (float)quant_from_nibble((uint8_t)(packet[i / 2] >> (4 * (i % 2)))); }

void qgz_dequantize_add(float* out, const unsigned char* packet, size_t n) {
    const float* scales = packet_scales_c(packet, n);
    for (size_t i = 0; i < n; i++) out[i] += level_at(packet, i) * scales[i / QGZ_BLOCK];
}

void qgz_feed_back(unsigned char* packet, float* y, float* e, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += e[i];
    quantize_piece(packet, y, n);
    const float* scales = packet_scales(packet, n);
    for (size_t i = 0; i < n; i++) {
        float s = scales[i / QGZ_BLOCK];
        if (isfinite(s)) e[i] = y[i] - level_at(packet, i) * s;
    }
}

// The all-to-all of `per_peer` bytes to each rank of c, host packets in and out (nothing to move alone).
static void exchange(Qgz* q, Comm* c, unsigned char* host, size_t per_peer) {
    size_t n = (size_t)comm_size(c);
    if (n < 2) return;
    be_upload(q->be, q->send, host, n * per_peer);
    comm_alltoall(c, q->recv, q->send, per_peer / 2, DT_BF16);   // 2-byte elements: an all-to-all copies bits
    be_download(q->be, host, q->recv, n * per_peer);
}

typedef struct {
    float *y, *e, *part;       // the unit's y and e; the H partial sums
    unsigned char* packets;    // pc->size packets
} Scratch;

// Step 1: y = g + e, every piece quantized into the intra-host all-to-all's order, e kept.
static void quantize_unit(Qgz* q, const Pieces* pc, int u, const void* buf, Scratch* s) {
    size_t p = pc->mine_len[u], n = pc->grad_len[u], pb = qgz_packet_bytes(p);
    int L = q->groups.per_host, H = q->groups.hosts;
    void* raw = xmalloc(n * piece_elem_bytes(pc));
    be_download(q->be, raw, buf, n * piece_elem_bytes(pc));
    be_download(q->be, s->e, q->err + q->err_at[u], n * 4);
    double t = now_seconds();
    host_from_dtype(s->y, raw, pc->dt, n);
    for (int r = 0; r < pc->size; r++)
        qgz_feed_back(s->packets + ((size_t)(r % L) * H + (size_t)(r / L)) * pb, s->y + (size_t)r * p, s->e + (size_t)r * p, p);
    q->seconds += now_seconds() - t;
    be_upload(q->be, q->err + q->err_at[u], s->e, n * 4);
    free(raw);
}

// Sums `count` packets, `stride` packets apart from `first`, into out (p fp32), in order.
static void sum_packets(Qgz* q, float* out, unsigned char* first, int count, size_t stride, size_t p) {
    double t = now_seconds();
    size_t pb = qgz_packet_bytes(p);
    memset(out, 0, p * sizeof(float));
    for (int j = 0; j < count; j++) qgz_dequantize_add(out, first + (size_t)j * stride * pb, p);
    q->seconds += now_seconds() - t;
}

void qgz_reduce_scatter(Qgz* q, const Pieces* pc, int u, void* buf) {
    size_t p = pc->mine_len[u], pb = qgz_packet_bytes(p), x = piece_elem_bytes(pc);
    int L = q->groups.per_host, H = q->groups.hosts;
    if (!q->groups.intra || !qgz_covers(pc, u)) fail("internal: qgZ's reduction of unit %d without its groups or buffers", u);
    Scratch s = {.y = (float*)xmalloc(pc->grad_len[u] * 4), .e = (float*)xmalloc(pc->grad_len[u] * 4),
                 .part = (float*)xmalloc((size_t)H * p * 4), .packets = (unsigned char*)xmalloc((size_t)pc->size * pb)};
    quantize_unit(q, pc, u, buf, &s);
    exchange(q, q->groups.intra, s.packets, (size_t)H * pb);
    for (int h = 0; h < H; h++) sum_packets(q, s.part + (size_t)h * p, s.packets + (size_t)h * pb, L, (size_t)H, p);
    float* mine = s.part;
    if (H > 1) {
        double t = now_seconds();
        for (int h = 0; h < H; h++) quantize_piece(s.packets + (size_t)h * pb, s.part + (size_t)h * p, p);
        q->seconds += now_seconds() - t;
        exchange(q, q->groups.inter, s.packets, pb);
        mine = s.y;
        sum_packets(q, mine, s.packets, H, 1, p);
    }
    void* low = xmalloc(p * x);
    host_to_dtype(low, pc->dt, mine, p);
    be_upload(q->be, elem_at(buf, pc->mine_first[u], x), low, p * x);
    free(low), free(s.y), free(s.e), free(s.part), free(s.packets);
}

// ---------------------------------------------------------------------------------------------------
// Checkpoints.

static const FeedbackKind QGZ_FILE = {.name = "qgZ", .prefix = "qgz", .magic = "QGZERR2", .flag = "-qg 1", .group_sums = 1,
                                      .retired_magic = "QGZERR1"};

// Between the error (covered units, err_at) and the whole layout (grad_offset; the other units 0).
static void error_to_whole(const Qgz* q, const Pieces* pc, const float* err, float* whole) {
    memset(whole, 0, feedback_whole_len(pc) * 4);
    for (int u = 0; u < pc->lay->num_units; u++)
        if (qgz_covers(pc, u)) memcpy(whole + pc->grad_offset[u], err + q->err_at[u], pc->grad_len[u] * 4);
}
static void error_from_whole(const Qgz* q, const Pieces* pc, const float* whole, float* err) {
    for (int u = 0; u < pc->lay->num_units; u++)
        if (qgz_covers(pc, u)) memcpy(err + q->err_at[u], whole + pc->grad_offset[u], pc->grad_len[u] * 4);
}

void qgz_save(const Qgz* q, Backend* be, const Pieces* pc, const char* dir) {
    float* err = (float*)xmalloc(q->err_len * 4 + 4);
    float* whole = (float*)xmalloc(feedback_whole_len(pc) * 4 + 4);
    be_download(be, err, q->err, q->err_len * 4);
    error_to_whole(q, pc, err, whole);
    feedback_file_save(&QGZ_FILE, pc, dir, whole, NULL);
    free(err), free(whole);
}

void qgz_load(Qgz* q, Backend* be, const Pieces* pc, const char* dir) {
    float* err = (float*)xmalloc(q->err_len * 4 + 4);
    float* whole = (float*)xmalloc(feedback_whole_len(pc) * 4 + 4);
    int writers = feedback_file_load(&QGZ_FILE, pc, dir, whole, NULL);
    if (writers != pc->size && pc->rank == 0)
        printf("qgZ: the errors of %d ranks resharded for %d: each rank's error their sum over %d\n", writers, pc->size, pc->size);
    error_from_whole(q, pc, whole, err);
    be_upload(be, q->err, err, q->err_len * 4);
    free(err), free(whole);
}
