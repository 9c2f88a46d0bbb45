// fuzz_model.c: llm.c model files through model_file_shape + model_file_read. The input is the file.
//
// As train_gpt does for -e FILE: read the shape, build the layout from it, read the values. Header word 64
// (ignored by the reader; word 8 names the family) picks the padding (DP sizes 1-4), or, when odd, a fixed
// layout instead, so the shape-mismatch path runs too.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/model_file.h"
#include "base/common.h"
#include "core/models/gpt2/gpt2.h"

int main(int argc, char** argv) {
    unsigned char* in;
    size_t n;
    Harness* h = harness_begin(argc, argv, 0, &in, &n);
    int pick = harness_le32(in, n, 256);
    ModelShape s = model_file_shape(argv[1]);
    int version = harness_le32(in, n, 4);
    size_t elem = version == 3 ? 4 : 2;
    ParamLayout* lay = calloc(1, sizeof *lay);
    if (!lay) return 2;
    if (pick & 1) {
        ModelShape fixed = gpt2_shape(1, 8, 1, 128, 4);   // L C NH V maxT
        layout_build(lay, &fixed, 64);
    } else {
        layout_build(lay, &s, layout_pad_multiple(1 + (pick >> 1 & 3)));
    }
    // Accepted: the header's shape accounts for every byte after the header.
    if (1024 + lay->num_params * elem != n && !(pick & 1))
        harness_bug(h, "shape L%d C%d H%d V%d Vp%d T%d has %zu parameters, the file %zu bytes", s.L, s.C, s.NH, s.V,
                    s.Vp, s.maxT, lay->num_params, n);
    float* flat = model_file_read(lay, argv[1]);
    // Touch every element (ASan checks the buffer is as long as the layout says); padding must be zero.
    unsigned char* covered = calloc(lay->total ? lay->total : 1, 1);
    if (!covered) return 2;
    for (int i = 0; i < lay->num_tensors; i++) memset(covered + lay->tensors[i].offset, 1, lay->tensors[i].size);
    for (size_t i = 0; i < lay->total; i++)
        if (!covered[i] && flat[i] != 0) harness_bug(h, "padding element %zu is %g, not zero", i, flat[i]);
    free(covered);
    free(flat);
    free(lay);
    free(in);
    return 0;
}
