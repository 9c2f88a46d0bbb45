// feedback_file.h: a rank's error-feedback buffers in a checkpoint (1-bit Adam's, onebit_adam.h; qgZ's, qgz.h),
// one file per rank of the data-parallel group, <prefix>_rank<r>.bin beside the state files, which a resume
// under any data-parallel size reads.
//
// A file holds only real elements, in an order no rank count changes: per unit, the trained elements of a
// buffer over the whole gradient layout (Pieces.grad_offset; the padding, which depends on the size, left
// out), then, for 1-bit Adam, per unit the writer's server chunk's real elements and where they start in the
// unit; its CRC-32 last. A resume with the writer's size reads its own file back bit for bit. Under another
// size each rank reads every file and its whole-layout buffer keeps what the writers' errors add together to
// the one place they act, each rank sending its value plus its error: where the group averages what the
// ranks send (1-bit Adam's server) each reader takes the writers' mean, where it sums them (qgZ's
// reduce-scatter) the writers' sum over the readers' count; the server chunks are recut from the writers'
// chunks. A damaged file, a missing one, or one of another model is a one-line error naming it.
//
// Layout: 8 bytes of magic; uint64 writer's size, rank, units; per unit uint64 n and n floats; with chunks,
// per unit uint64 first, n and n floats; uint32 CRC-32 of all after the magic.
#pragma once
#include "core/zero/pieces.h"

typedef struct {
    const char* name;            // "1-bit Adam", "qgZ": in messages
    const char* prefix;          // of the file name
    const char* magic;           // 7 characters and the NUL
    const char* flag;            // the flag of the runs that write it, named when a file is missing
    int has_chunks;              // a server chunk section follows (1-bit Adam)
    int group_sums;              // the group sums what the ranks send (qgZ), rather than averaging it
    const char* retired_magic;   // an earlier format's magic, refused with the way out; NULL when none
} FeedbackKind;

// The elements of the whole gradient layout.
size_t feedback_whole_len(const Pieces* pc);

// Writes this rank's file: whole (host, the whole layout) and with has_chunks chunks (host, this rank's
// server chunks at Pieces.mine_offset).
void feedback_file_save(const FeedbackKind* k, const Pieces* pc, const char* dir, const float* whole, const float* chunks);

// Sets whole (host, the whole layout; the padding 0) to this rank's file under the writers' size, else to the
// writers' mean (group_sums: their sum over this group's size), and with has_chunks this rank's chunks (host,
// Pieces.mine_offset). Returns the writers' size.
int feedback_file_load(const FeedbackKind* k, const Pieces* pc, const char* dir, float* whole, float* chunks);
