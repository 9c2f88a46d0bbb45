// optimizer_kind.c: the optimizers a parameter kind may carry (optimizer_kind.h).
#include "core/model/optimizer_kind.h"

#include "base/common.h"

static const OptimizerKind OPTIMIZERS[NUM_OPTIMIZERS] = {
    [OPT_ADAMW] = {.name = "adamw", .updates = 1, .num_state = 2, .state_names = {"m", "v"}},
    [OPT_FROZEN] = {.name = "frozen", .updates = 0, .num_state = 0, .state_names = {NULL, NULL}},
};

const OptimizerKind* optimizer_kind(OptimizerId id) {
    if ((int)id < 0 || id >= NUM_OPTIMIZERS) fail("internal: optimizer %d (0..%d)", (int)id, NUM_OPTIMIZERS - 1);
    return &OPTIMIZERS[id];
}
