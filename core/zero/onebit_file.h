// onebit_file.h: 1-bit Adam's errors in a checkpoint (onebit_adam.h), one file per rank of the data-parallel group,
// onebit_rank<r>.bin beside the state files, which a resume under any data-parallel size reads.
//
// The file holds only real elements, in an order no rank count changes: per unit, its trained elements' worker
// error (the padding, which depends on the size, left out), then per unit the writer's server chunk's real
// elements and where they start in the unit; its CRC-32 last. A resume with the writer's size reads its own
// file back bit for bit. Under another size each rank reads every file: its server chunk is recut from the
// writers' chunks, and its worker error is their workers' mean, which keeps what the errors add to the group's
// average, the only place they act (each worker sends m + e_w, and the server averages). A damaged file, a
// missing one, or one of another model is a one-line error.
#pragma once
#include "core/zero/onebit_adam.h"

void onebit_file_save(const OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir);
void onebit_file_load(OnebitBuffers* b, Backend* be, const Pieces* pc, const char* dir);
