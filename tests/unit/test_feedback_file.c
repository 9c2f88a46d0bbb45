// test_feedback_file.c: error-feedback files (core/zero/feedback_file.h) written by 4 ranks and read back
// by 4 and by 2, on a layout of three units whose padding differs with the group size (one with a frozen
// section, one whose real elements end before rank 3's chunk). Both kinds: 1-bit Adam's (server chunks, a
// group that averages) and qgZ's (no chunks, a group that sums). What must hold:
//   - the writers' size reads a rank's own file bit for bit (a -0.0 stays -0.0), the padding 0;
//   - another size reads, on every real element, the 4 writers' mean where the group averages and their sum
//     over 2 where it sums; the padding 0;
//   - the server chunks are recut: rank r of 2 holds the real elements [r piece, +piece) of each unit as the
//     writers wrote them, 0 past the real ones.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "core/util/fs.h"
#include "core/zero/feedback_file.h"
#include "tests/unit/testlib.h"

#define UNITS 3
#define WRITERS 4

static const FeedbackKind AVERAGED = {.name = "averaged", .prefix = "averaged", .magic = "TESTAVG", .flag = "-avg", .has_chunks = 1};
static const FeedbackKind SUMMED = {.name = "summed", .prefix = "summed", .magic = "TESTSUM", .flag = "-sum", .group_sums = 1};

// Unit u's sizes: real elements, frozen section; trained sections padded to 64 elements per rank.
static const size_t REAL[UNITS] = {1000, 300, 700}, FROZEN[UNITS] = {0, 0, 128};

static ParamLayout* layout_for(int size) {
    ParamLayout* lay = (ParamLayout*)xcalloc(1, sizeof(ParamLayout));
    size_t at = 0, step = 64 * (size_t)size;
    lay->num_units = UNITS;
    for (int u = 0; u < UNITS; u++) {
        Unit* un = &lay->units[u];
        un->offset = at, un->frozen = FROZEN[u], un->size = FROZEN[u] + REAL[u];
        un->padded = FROZEN[u] + (REAL[u] + step - 1) / step * step;
        at += un->padded;
    }
    return lay;
}

static Pieces pieces_for(const ParamLayout* lay, int rank, int size) {
    Pieces pc = {.lay = lay, .rank = rank, .size = size, .dt = DT_FP32};
    pieces_index_grads(&pc);
    return pc;
}

// Writer r's value of unit u's real element i (its worker section), and of its chunks' element i.
static float worker_value(int r, int u, size_t i) {
    if (r == 1 && u == 0 && i == 5) return -0.0f;
    return (float)((r + 1) * 3001 + u * 100000 - (int)i) / 64.0f;   // exact: no rounding to differ between call sites
}
static float chunk_value(int u, size_t i) { return (float)(1000 * u + (int)i); }

static void write_all(const FeedbackKind* k, const char* dir) {
    ParamLayout* lay = layout_for(WRITERS);
    for (int r = 0; r < WRITERS; r++) {
        Pieces pc = pieces_for(lay, r, WRITERS);
        size_t whole_len = feedback_whole_len(&pc), mine_len = pc.mine_offset[UNITS - 1] + pc.mine_len[UNITS - 1];
        float* whole = (float*)xcalloc(whole_len + 1, 4);
        float* chunks = (float*)xcalloc(mine_len + 1, 4);
        for (int u = 0; u < UNITS; u++) {
            for (size_t i = 0; i < REAL[u]; i++) whole[pc.grad_offset[u] + i] = worker_value(r, u, i);
            for (size_t j = 0, first = pc.mine_first[u]; j < pc.mine_len[u] && first + j < REAL[u]; j++)
                chunks[pc.mine_offset[u] + j] = chunk_value(u, first + j);
        }
        feedback_file_save(k, &pc, dir, whole, chunks);
        free(whole), free(chunks);
    }
    free(lay);
}

// Reads as rank `rank` of `size`; counts the elements that differ from what they must be.
static size_t read_and_count_bad(const FeedbackKind* k, const char* dir, int rank, int size, int* writers) {
    ParamLayout* lay = layout_for(size);
    Pieces pc = pieces_for(lay, rank, size);
    size_t whole_len = feedback_whole_len(&pc), mine_len = pc.mine_offset[UNITS - 1] + pc.mine_len[UNITS - 1], bad = 0;
    float* whole = (float*)xmalloc(whole_len * 4 + 4);
    float* chunks = (float*)xmalloc(mine_len * 4 + 4);
    for (size_t i = 0; i < whole_len; i++) whole[i] = NAN;
    for (size_t i = 0; i < mine_len; i++) chunks[i] = NAN;
    *writers = feedback_file_load(k, &pc, dir, whole, chunks);
    for (int u = 0; u < UNITS; u++) {
        for (size_t i = 0; i < pc.grad_len[u]; i++) {
            float got = whole[pc.grad_offset[u] + i], want = 0.0f;
            if (i < REAL[u] && size == WRITERS) want = worker_value(rank, u, i);
            double share = 0.0;
            for (int r = 0; i < REAL[u] && r < WRITERS; r++) share += worker_value(r, u, i) / (double)(k->group_sums ? size : WRITERS);
            if (size == WRITERS ? memcmp(&got, &want, 4) != 0 : !(fabs(got - share) <= 1e-6 * (1.0 + fabs(share)))) bad++;
        }
        for (size_t j = 0, first = pc.mine_first[u]; k->has_chunks && j < pc.mine_len[u]; j++)
            bad += chunks[pc.mine_offset[u] + j] != (first + j < REAL[u] ? chunk_value(u, first + j) : 0.0f);
    }
    free(whole), free(chunks), free(lay);
    return bad;
}

int main(void) {
    TestStats st = {0, 0};
    char dir[] = "/tmp/test_feedback_file.XXXXXX";
    if (!mkdtemp(dir)) fail("cannot make a temporary directory");
    const FeedbackKind* kinds[] = {&AVERAGED, &SUMMED};
    for (int i = 0; i < 2; i++) {
        const FeedbackKind* k = kinds[i];
        write_all(k, dir);
        int writers = 0;
        char name[96];
        size_t bad = read_and_count_bad(k, dir, 1, WRITERS, &writers);
        snprintf(name, sizeof(name), "%s_same_size_reads_own_file_bit_for_bit", k->name);
        check_true(&st, name, bad == 0 && writers == WRITERS);
        for (int rank = 0; rank < 2; rank++) {
            bad = read_and_count_bad(k, dir, rank, 2, &writers);
            snprintf(name, sizeof(name), "%s_resharded_4_to_2_rank%d", k->name, rank);
            check_true(&st, name, bad == 0 && writers == WRITERS);
        }
    }
    remove_path(dir);
    return test_exit(&st);
}
