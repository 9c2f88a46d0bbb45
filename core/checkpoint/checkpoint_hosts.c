// checkpoint_hosts.c: checkpoints in node-local directories (run_dir.h): each host's directory holds its
// ranks' state files, the manifest and DONE; rank 0's also model.bin. The ranks agree on what every host
// holds through the world. See checkpoint.h.
#include <errno.h>
#include <limits.h>

#include "base/common.h"
#include "core/checkpoint/checkpoint.h"
#include "core/util/fs.h"
#include "core/checkpoint/model_file.h"
#include "core/checkpoint/run_dir.h"
#include "core/checkpoint/state_file.h"

#define WHY_SIZE 512

// Whether `ok` holds on every rank; where not, every rank's why (WHY_SIZE bytes) becomes the lowest
// failing rank's.
static int agree(Comm* world, int ok, char* why) {
    int size = comm_size(world);
    long long first = ok ? 0 : size - comm_rank(world);
    comm_allreduce_host_max_i64(world, &first, 1);
    if (first == 0) return 1;
    comm_broadcast_host(world, why, WHY_SIZE, size - (int)first);
    why[WHY_SIZE - 1] = '\0';
    return 0;
}

// For each of n state files in dir, the lowest rank whose host's directory holds it; -1 where none does.
static int* state_holders(Comm* world, const char* dir, int n) {
    int size = comm_size(world);
    long long* v = (long long*)xmalloc((size_t)n * sizeof(long long));
    for (int r = 0; r < n; r++) {
        char name[64], p[PATH_MAX];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        v[r] = path_exists(p) ? size - comm_rank(world) : 0;
    }
    comm_allreduce_host_max_i64(world, v, n);
    int* holders = (int*)xmalloc((size_t)n * sizeof(int));
    for (int r = 0; r < n; r++) holders[r] = v[r] > 0 ? size - (int)v[r] : -1;
    free(v);
    return holders;
}

// The verdict of one rank (root) on every rank: its ok, and its why (WHY_SIZE bytes) where not.
static int verdict_of(Comm* world, int root, int ok, char* why) {
    long long v = ok;
    comm_broadcast_host(world, &v, sizeof(v), root);
    if (v) return 1;
    comm_broadcast_host(world, why, WHY_SIZE, root);
    why[WHY_SIZE - 1] = '\0';
    return 0;
}

// What this rank's host holds of dir: DONE, a manifest (kept in m), whether model.bin is there.
static int read_local(const char* dir, CheckpointInfo* info, Manifest* m, int* has_model, char* why) {
    long long size = 0;
    char p[PATH_MAX];
    *m = (Manifest){0};
    if (!regular_file_size(dir, "DONE", &size, why, WHY_SIZE)) return set_why(why, WHY_SIZE, "no DONE marker (incomplete)");
    path_join(p, sizeof(p), dir, "model.bin");
    *has_model = path_exists(p);
    return manifest_read(m, dir, info, why, WHY_SIZE);
}

// The lowest rank for which `mine` holds, the same on every rank; -1 when it holds on none.
static int lowest_with(Comm* world, int mine) {
    int size = comm_size(world);
    long long lowest = mine ? size - comm_rank(world) : 0;
    comm_allreduce_host_max_i64(world, &lowest, 1);
    return lowest > 0 ? size - (int)lowest : -1;
}

// model.bin is on some host, and the lowest rank that has it finds its bytes as the manifest records them.
static int model_verified(Comm* world, const char* dir, const Manifest* m, int has_model, char* why) {
    int holder = lowest_with(world, has_model), ok = 1;
    if (holder < 0) return set_why(why, WHY_SIZE, "model.bin is on no host");
    if (comm_rank(world) == holder) {
        char mine[WHY_SIZE];
        ok = manifest_verify_file(m, dir, "model.bin", mine, WHY_SIZE);
        if (!ok) snprintf(why, WHY_SIZE, "on the host of rank %d: %.470s", holder, mine);
    }
    return verdict_of(world, holder, ok, why);
}

// Each state file is on some host, and its holder finds its bytes as the manifest records them.
static int state_files_verified(Comm* world, const char* dir, const Manifest* m, const int* holders, int ranks, char* why) {
    int ok = 1;
    for (int r = 0; ok && r < ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        if (holders[r] < 0) return set_why(why, WHY_SIZE, "%s is on no host; " CHECKPOINT_COPY_HINT, name);
        if (comm_rank(world) == holders[r]) ok = manifest_verify_file(m, dir, name, why, WHY_SIZE);
        ok = verdict_of(world, holders[r], ok, why);
    }
    return ok;
}

// model.bin is of this shape's size wherever it is.
static int model_well_sized(Comm* world, const char* dir, const ModelShape* s, int has_model, char* why) {
    char mine[WHY_SIZE];
    int ok = !has_model || model_file_inspect(dir, s, mine, WHY_SIZE);
    if (!ok) snprintf(why, WHY_SIZE, "on the host of rank %d: %.480s", comm_rank(world), mine);
    return agree(world, ok, why);
}

// State file r, inspected by its holder; its spans go to every rank's `all`.
static int state_file_spans(Comm* world, const char* dir, int r, int holder, const ModelShape* s, long long dt, SpanList* all, char* why) {
    SpanList mine = {0};
    int ok = comm_rank(world) != holder || state_file_inspect(dir, r, s, dt, &mine, why, WHY_SIZE);
    if (!verdict_of(world, holder, ok, why)) {
        free(mine.items);
        return 0;
    }
    long long spans = (long long)mine.n;
    comm_broadcast_host(world, &spans, sizeof(spans), holder);
    if (comm_rank(world) != holder) {
        mine.items = (Span*)xmalloc((size_t)spans * sizeof(Span));
        mine.n = (size_t)spans;
    }
    comm_broadcast_host(world, mine.items, mine.n * sizeof(Span), holder);
    for (size_t i = 0; i < mine.n; i++) span_push(all, mine.items[i].start, mine.items[i].count);
    free(mine.items);
    return 1;
}

// The state files, each inspected where it is, together covering every parameter once.
static int state_files_cover(Comm* world, const char* dir, const int* holders, const ModelShape* s, const CheckpointInfo* info, char* why) {
    SpanList all = {0};
    int ok = 1;
    for (int r = 0; ok && r < info->ranks; r++) ok = state_file_spans(world, dir, r, holders[r], s, info->dt, &all, why);
    ok = ok && spans_cover(&all, s, info->ranks, why, WHY_SIZE);
    free(all.items);
    return ok;
}

// Every host's DONE and manifest (the same everywhere), then every file against its checksum: only then is
// a model of another shape another run (a one-line error) rather than damage; then the files are inspected
// for this shape. The same answer (and why) on every rank.
static int verify_and_inspect(Comm* world, const char* dir, const ModelShape* s, CheckpointInfo* info, Manifest* m, char* why) {
    int has_model = 0;
    char mine[WHY_SIZE];
    int ok = read_local(dir, info, m, &has_model, mine);
    if (!ok) snprintf(why, WHY_SIZE, "on the host of rank %d: %.480s", comm_rank(world), mine);
    ok = agree(world, ok, why);
    if (ok && !comm_all_equal(world, m->hash)) ok = set_why(why, WHY_SIZE, "the hosts' manifest.json differ");
    if (!ok) return 0;
    int* holders = state_holders(world, dir, info->ranks);
    ok = model_verified(world, dir, m, has_model, why) && state_files_verified(world, dir, m, holders, info->ranks, why);
    if (ok && has_model) checkpoint_refuse_other_shape(dir, s);
    ok = ok && model_well_sized(world, dir, s, has_model, why) && state_files_cover(world, dir, holders, s, info, why);
    free(holders);
    return ok;
}

static int inspect_hosts(Comm* world, const char* dir, const ModelShape* s, CheckpointInfo* info, char* why) {
    Manifest m;
    int ok = verify_and_inspect(world, dir, s, info, &m, why);
    manifest_free(&m);
    return ok;
}

// The newest step of this host's that is at most bound, least over the hosts: -1 when some host has none.
static int common_candidate(Comm* world, const int* steps, int count, int bound) {
    long long c = 1;   // negated: a max over ranks is the least step
    for (int i = 0; i < count && c > 0; i++)
        if (steps[i] <= bound) c = -(long long)steps[i];
    comm_allreduce_host_max_i64(world, &c, 1);
    return c > 0 ? -1 : (int)-c;
}

int checkpoint_find_hosts(const char* out_dir, Comm* world, const ModelShape* s, char* path, size_t size, CheckpointInfo* info,
                          int verbose) {
    int* steps;
    int count = run_dir_checkpoints(out_dir, &steps), found = -1, bound = INT_MAX;
    long long any = count;
    comm_allreduce_host_max_i64(world, &any, 1);
    char why[WHY_SIZE], skipped[2048] = "";
    size_t used = 0;
    for (int step; any > 0 && found < 0 && (step = common_candidate(world, steps, count, bound)) >= 0; bound = step - 1) {
        run_dir_checkpoint_path(path, size, out_dir, step);
        if (inspect_hosts(world, path, s, info, why)) {
            found = step;
            break;
        }
        int w = snprintf(skipped + used, sizeof(skipped) - used, "%s%s: %s", used ? "; " : "", path, why);
        used = w > 0 && used + (size_t)w < sizeof(skipped) ? used + (size_t)w : used;
    }
    free(steps);
    if (any > 0 && found < 0)
        fail("no checkpoint in %s is complete on every host (%s)", out_dir, used ? skipped : "some host's directory holds none");
    if (found >= 0 && used && verbose) fprintf(stderr, "warning: skipping checkpoints incomplete on some host: %s\n", skipped);
    if (found >= 0 && verbose) checkpoint_note_unverified(path, info);
    return found;
}

void checkpoint_load_hosts(const ModelState* ms, Backend* be, Comm* world, const char* dir, const CheckpointInfo* info) {
    // Every value a rank keeps comes from the state files (their coverage was checked); the padding starts
    // at zero, as model_file_read leaves it.
    float* flat = (float*)xcalloc(ms->lay->total, sizeof(float));
    ms->set_from_host(ms->ctx, be, flat);
    free(flat);
    int* holders = state_holders(world, dir, info->ranks);
    for (int r = 0; r < info->ranks; r++) {
        char name[64], p[PATH_MAX];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        if (holders[r] < 0) fail("%s: %s is on no host (removed after it was inspected); " CHECKPOINT_COPY_HINT, dir, name);
        StateReader reader = {comm_rank(world) == holders[r] ? xfopen(p, "rb") : NULL, p, world, holders[r]};
        state_file_read(ms, be, &reader);
        if (reader.f) fclose(reader.f);
    }
    free(holders);
    state_flush(ms);   // what went to the disk's cache is on disk before anything reads it there
}
