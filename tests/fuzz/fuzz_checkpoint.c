// fuzz_checkpoint.c: checkpoint directories through checkpoint_load (manifest, model file, state files).
//
// Input: one parameter byte (ZeRO stage in bits 0-1, run dtype in bits 2-6, -offload in bit 7), then the
// directory's files separated by "FILE": manifest.json, model.bin, state_rank0.bin, state_rank1.bin,
// state_rank2.bin (a manifest may claim any number of ranks; missing files must be reported, not crash). One rank on the
// CPU backend (no Comm), a fixed tiny model so inputs stay a few KiB; the model and state are read
// back afterwards so every byte the loader placed is touched under ASan.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdlib.h>

#include "base/common.h"
#include "core/models/gpt2/gpt2.h"
#include "core/checkpoint/checkpoint.h"
#include "core/model/memory.h"
#include "zero.h"

static const char* const FILES[] = {"manifest.json", "model.bin", "state_rank0.bin", "state_rank1.bin",
                                    "state_rank2.bin"};
#define NFILES (int)(sizeof FILES / sizeof FILES[0])

int main(int argc, char** argv) {
    unsigned char* in;
    size_t n;
    Harness* h = harness_begin(argc, argv, 1, &in, &n);
    if (n < 1) return 0;
    ZeroCaps caps = zero_caps(in[0] & 3);
    caps.state_on_host = in[0] >> 7;   // master, m, v in host memory: the loader must memcpy, not upload
    DType dt = (DType)(((in[0] >> 2) & 31) % 3);
    const unsigned char* part[NFILES];
    size_t len[NFILES];
    int parts = harness_split(in + 1, n - 1, "FILE", NFILES, part, len);
    char path[PATH_MAX];
    for (int i = 0; i < parts; i++) harness_write(h, FILES[i], part[i], len[i], path);

    ModelShape shape = gpt2_shape(1, 8, 1, 128, 4);   // L C NH V maxT
    ParamLayout* lay = calloc(1, sizeof *lay);
    if (!lay) return 2;
    layout_build(lay, &shape, layout_pad_multiple(1));
    Backend* be = backend_create(0);
    MemLedger mem = {{0}};
    Zero* z = zero_create(be, &mem, lay, caps, NULL, NULL, NULL, dt, NULL);
    ModelState ms = zero_model_state(z);
    CheckpointInfo info = {0};
    char why[512];
    if (!checkpoint_inspect(harness_dir(h), &lay->shape, &info, why, sizeof(why))) fail("checkpoint: %s", why);
    checkpoint_load(&ms, be, harness_dir(h), &info);
    if (info.ranks < 1 || info.ranks > parts - 2) harness_bug(h, "loaded %d state files of %d", info.ranks, parts - 2);

    float* flat = calloc(lay->total, sizeof(float));
    if (!flat) return 2;
    zero_master_to_host(z, be, flat);
    free(flat);
    zero_destroy(z, be);
    backend_destroy(be);
    free(lay);
    free(in);
    return 0;
}
