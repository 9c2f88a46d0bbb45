// checkpoint.c: writing, inspecting and loading checkpoint directories. See checkpoint.h; the files inside
// are model_file.h's, state_file.h's and manifest.h's.
#include "core/checkpoint/checkpoint.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

#include "base/common.h"
#include "base/crc32.h"
#include "core/util/fs.h"
#include "core/checkpoint/model_file.h"
#include "core/checkpoint/run_dir.h"
#include "core/checkpoint/state_file.h"
#include "core/model/lora.h"
#include "core/models/catalog.h"

// ---------------------------------------------------------------------------------------------------
// Writing a checkpoint directory.

#define MODEL_PART_TAG 7301

// Node-local directories keep model.bin in rank 0's only: a stage writer on another host sends it its
// tensors, each as a header (runs, run length), the runs' canonical offsets and the values; (0, 0) ends.
static void send_model_part(const ParamLayout* lay, const float* flat, Comm* world) {
    for (int i = 0; i < lay->num_tensors; i++) {
        const ParamTensor* t = &lay->tensors[i];
        if (tensor_is_copy(lay, t)) continue;   // its owner writes it
        long long head[2] = {(long long)(t->size / t->run), (long long)t->run};
        long long* canon = (long long*)xmalloc((size_t)head[0] * sizeof(long long));
        for (long long j = 0; j < head[0]; j++) canon[j] = (long long)tensor_canonical(t, (size_t)j * t->run);
        comm_send_host(world, head, sizeof(head), 0, MODEL_PART_TAG);
        comm_send_host(world, canon, (size_t)head[0] * sizeof(long long), 0, MODEL_PART_TAG);
        comm_send_host(world, flat + t->offset, t->size * sizeof(float), 0, MODEL_PART_TAG);
        free(canon);
    }
    long long end[2] = {0, 0};
    comm_send_host(world, end, sizeof(end), 0, MODEL_PART_TAG);
}

static void recv_model_part(Comm* world, int from, const char* path, long long params) {
    FILE* f = fopen(path, "r+b");
    if (!f) fail("cannot open %s for writing: %s", path, strerror(errno));
    long long head[2];
    for (;;) {
        comm_recv_host(world, head, sizeof(head), from, MODEL_PART_TAG);
        if (head[0] == 0) break;
        if (head[0] < 0 || head[1] < 1 || head[0] > params / head[1])
            fail("internal: rank %d sent a model part of %lld runs of %lld values", from, head[0], head[1]);
        size_t runs = (size_t)head[0], run = (size_t)head[1];
        long long* canon = (long long*)xmalloc(runs * sizeof(long long));
        float* vals = (float*)xmalloc(runs * run * sizeof(float));
        comm_recv_host(world, canon, runs * sizeof(long long), from, MODEL_PART_TAG);
        comm_recv_host(world, vals, runs * run * sizeof(float), from, MODEL_PART_TAG);
        for (size_t j = 0; j < runs; j++) {
            if (canon[j] < 0 || canon[j] > params - (long long)run) fail("internal: rank %d sent a run at %lld", from, canon[j]);
            model_file_seek(f, path, 1024, (size_t)canon[j], sizeof(float));
            xfwrite(vals + j * run, sizeof(float), run, f, path);
        }
        free(vals);
        free(canon);
    }
    xfclose(f, path);
}

// Rank 0 takes the parts of the writers that flagged `sends`, in rank order.
static void model_parts_to_root(const ParamLayout* lay, const float* flat, int sends, Comm* world, const char* path) {
    int size = comm_size(world), rank = comm_rank(world);
    long long* from = (long long*)xcalloc((size_t)size, sizeof(long long));
    from[rank] = sends;
    comm_allreduce_host_sum_i64(world, from, size);
    if (sends) send_model_part(lay, flat, world);
    for (int r = 1; rank == 0 && r < size; r++)
        if (from[r] > 0) recv_model_part(world, r, path, (long long)shape_param_count(&lay->shape));
    free(from);
}

// model.bin (a -lora run's adapters.bin: the adapters only, lora.h): rank 0 sizes the file, then each
// stage's replica-0 ranks (one per tensor rank) gather their stage's master weights and write their tensors
// in place (or send them to rank 0 from another host's directory), so no rank ever holds more than its own
// stage.
static void model_save(const ModelState* ms, Backend* be, const Grid* g, const RunDir* rd, const char* path) {
    int lora = lora_of(&ms->lay->shape) != NULL;
    if (comm_rank(g->world) == 0) {
        if (lora) lora_adapter_file_create(path, &ms->lay->shape);
        else model_file_create(&ms->lay->shape, path, 1);
    }
    comm_barrier(g->world);
    int writer = g->dp_rank == 0, sends = writer && !rd->root_dir;
    float* flat = writer ? (float*)xcalloc(ms->lay->total, sizeof(float)) : NULL;
    ms->master_to_host(ms->ctx, be, flat);   // collective over the stage's replicas
    if (writer && !sends && lora) lora_write_adapter_part(path, ms->lay, flat);
    else if (writer && !sends) model_file_write_part(ms->lay, flat, path, 1);
    if (rd->node_local) model_parts_to_root(ms->lay, flat, sends, g->world, path);
    free(flat);
}

// The finished ckpt_tmp takes the step's name. A directory already there (a damaged checkpoint of this
// step: a complete one is never re-saved) is moved aside first and removed last, as an entry: a symlink
// to storage elsewhere loses the link, never the files behind it. At every moment the newest complete
// checkpoint is in place under its name.
static void publish(const char* tmp, const char* dir, const char* out_dir) {
    char old[PATH_MAX];
    path_join(old, sizeof(old), out_dir, "ckpt_old");
    remove_path(old);
    if (path_exists(dir) && rename(dir, old) != 0) fail("cannot move %s aside: %s", dir, strerror(errno));
    if (rename(tmp, dir) != 0) fail("cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    sync_dir(out_dir);
    remove_path(old);
}

// Why the copies can differ: the tied pair sums its gradients, so the same update keeps the two equal and a
// difference is a bug; each tensor rank updates its copies of the whole tensors (LayerNorms, the
// projections' biases, wpe, the final LayerNorm) from its own data-parallel group's reduction, so their bits
// agree only while those reductions add alike (NCCL picks its order per communicator). A hash of each
// rank's copies compares them without sending them.
typedef struct {
    const ModelState* ms;
    Backend* be;
    CopyPick pick;
    uint64_t hash;
} CopyHash;

static void hash_copy(const StateSpan* s, void* ctx) {
    CopyHash* c = (CopyHash*)ctx;
    if (!c->pick(s->t, c->ms->lay)) return;
    size_t master = s->n * sizeof(float), working = s->n * dtype_size(c->ms->dt);
    unsigned char* host = (unsigned char*)xmalloc(master > working ? master : working);
    span_to_host(c->ms, c->be, s, SPAN_MASTER, host);
    c->hash = fnv1a(c->hash, host, master);
    span_to_host(c->ms, c->be, s, SPAN_PARAMS, host);
    c->hash = fnv1a(c->hash, host, working);
    free(host);
}

int copies_agree(const ModelState* ms, Backend* be, Comm* group, CopyPick pick) {
    if (!group) return 1;
    CopyHash c = {ms, be, pick, FNV1A_START};
    ms->for_each_span(ms->ctx, STATE_UPDATE, hash_copy, &c);
    return comm_all_equal(group, c.hash);
}

int copy_in_embedding_unit(const ParamTensor* t, const ParamLayout* lay) { return t->unit == lay->emb_unit; }
int copy_held_whole_by_group(const ParamTensor* t, const ParamLayout* lay) {
    (void)lay;
    return t->group_whole;
}
int copy_of_kv_head(const ParamTensor* t, const ParamLayout* lay) {
    (void)lay;
    return t->copies > 1;
}

// Every rank's state file CRC-32 (mine: this rank's) and model.bin's, on every rank, as write_checksums takes
// them. The stages write model.bin in place, in parts, so rank 0 reads it back once all of them are done.
static uint32_t* gather_checksums(Comm* world, uint32_t mine, const char* model_path) {
    int size = comm_size(world), rank = comm_rank(world);
    long long* v = (long long*)xcalloc((size_t)size, sizeof(long long));
    v[rank] = mine;
    comm_allreduce_host_sum_i64(world, v, size);   // after every rank's part of model.bin
    uint32_t* crcs = (uint32_t*)xmalloc(((size_t)size + 1) * sizeof(uint32_t));
    for (int r = 0; r < size; r++) crcs[r] = (uint32_t)v[r];
    free(v);
    if (rank == 0 && !crc32_file(model_path, &crcs[size])) fail("cannot read back %s: %s", model_path, strerror(errno));
    comm_broadcast_host(world, &crcs[size], sizeof(uint32_t), 0);
    return crcs;
}

void checkpoint_save(const ModelState* ms, Backend* be, const Grid* g, const Config* cfg, const RunDir* rd, const CheckpointInfo* info,
                     char* dir, size_t dir_size) {
    char tmp[PATH_MAX], p[PATH_MAX], name[64];
    Comm* world = g->world;
    int rank = comm_rank(world), manager = rd->manager;   // of this rank's directory
    run_dir_checkpoint_path(dir, dir_size, cfg->out_dir, info->step);
    path_join(tmp, sizeof(tmp), cfg->out_dir, "ckpt_tmp");
    if (manager) {
        remove_path(tmp);   // left by a crash mid-write
        make_dirs(tmp);
    }
    comm_barrier(world);
    if (!copies_agree(ms, be, g->tied, copy_in_embedding_unit))   // only stage 0's copy is saved
        fail("internal: the last stage's copy of the tied embedding differs from stage 0's (replica %d)", g->dp_rank);
    if (!copies_agree(ms, be, g->tp_group, copy_held_whole_by_group))   // only tensor rank 0's copies are saved
        fail("internal: the tensor ranks' copies of the tensors they hold whole differ (stage %d, replica %d): their "
             "data-parallel reductions added in different orders", g->stage, g->dp_rank);
    if (!copies_agree(ms, be, g->kv_copies, copy_of_kv_head))   // only the first copy of each kv head is saved
        fail("internal: the tensor ranks' copies of a kv head differ (stage %d, replica %d, tensor rank %d)", g->stage, g->dp_rank,
             g->tp_rank);
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    path_join(p, sizeof(p), tmp, name);
    uint32_t state_crc = state_file_write(ms, be, p, rank, g->dp, cfg->zero_stage);
    if (ms->save_own) ms->save_own(ms->ctx, be, tmp);
    if (lora_of(&ms->lay->shape) && rd->node_local) fail("-o %s: node-local checkpoint directories are not yet written with -lora", cfg->out_dir);
    path_join(p, sizeof(p), tmp, manifest_weights_file(&ms->lay->shape));
    model_save(ms, be, g, rd, p);
    uint32_t* crcs = gather_checksums(world, state_crc, p);
    if (manager) {
        path_join(p, sizeof(p), tmp, "manifest.json");
        manifest_write(p, ms, g, cfg, info, rd->node_local ? rd->dirs : 0, crcs);
    }
    free(crcs);
    comm_barrier(world);   // every file on every host is on disk before any DONE
    if (manager) {
        manifest_write_done(tmp);
        sync_dir(tmp);
        publish(tmp, dir, cfg->out_dir);
    }
    comm_barrier(world);
}

// ---------------------------------------------------------------------------------------------------
// Inspecting a checkpoint directory: everything a resume relies on, checked before anything is loaded,
// without exiting, so a damaged newest checkpoint can be skipped for an older complete one.

// A state file missing from a checkpoint that several hosts wrote into their own directories is on one of
// the others: say so (returns 1), rather than only that it is missing.
static int missing_on_other_host(const char* dir, int rank, const CheckpointInfo* info, char* why, size_t n) {
    char name[64], p[PATH_MAX];
    snprintf(name, sizeof(name), "state_rank%d.bin", rank);
    path_join(p, sizeof(p), dir, name);
    if (info->host_dirs < 2 || path_exists(p)) return 0;
    set_why(why, n, "%s is missing: the checkpoint was written into %d hosts' own directories; " CHECKPOINT_COPY_HINT, name,
            info->host_dirs);
    return 1;
}

// The files whose meaning depends on the model's shape: model.bin's size, each state file's header and
// spans, and the spans together covering every parameter once.
static int inspect_files(const char* dir, const ModelShape* s, const CheckpointInfo* info, char* why, size_t n) {
    long long size = 0;
    if (!lora_of(s) != !info->has_base)
        return set_why(why, n, info->has_base ? "a LoRA run's checkpoint (adapters.bin): resume it with -lora" : "not a LoRA run's checkpoint");
    int ok = lora_of(s) ? regular_file_size(dir, "adapters.bin", &size, why, n) : model_file_inspect(dir, s, why, n);
    if (ok && lora_of(s) && size != lora_adapter_file_bytes(s))
        ok = set_why(why, n, "adapters.bin has %lld bytes, this run's adapters %lld", size, lora_adapter_file_bytes(s));
    SpanList all = {0};
    for (int r = 0; ok && r < info->ranks; r++)
        ok = !missing_on_other_host(dir, r, info, why, n) && state_file_inspect(dir, r, s, info->dt, &all, why, n);
    ok = ok && spans_cover(&all, s, info->ranks, why, n);
    free(all.items);
    return ok;
}

int checkpoint_inspect(const char* dir, const ModelShape* s, CheckpointInfo* info, char* why, size_t n) {
    Manifest m;
    int ok = manifest_read(&m, dir, info, why, n) && inspect_files(dir, s, info, why, n);
    manifest_free(&m);
    return ok;
}

// Every file's bytes against the manifest's CRC-32s (the manifest's own against DONE's: manifest_read),
// each file read once. Nothing here depends on the model's shape: a file that fails is damaged, whatever
// its header says.
static int verify_files(const char* dir, const CheckpointInfo* info, const Manifest* m, char* why, size_t n) {
    int ok = manifest_verify_file(m, dir, info->has_base ? "adapters.bin" : "model.bin", why, n);
    for (int r = 0; ok && r < info->ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        ok = !missing_on_other_host(dir, r, info, why, n) && manifest_verify_file(m, dir, name, why, n);
    }
    return ok;
}

void checkpoint_note_unverified(const char* dir, const CheckpointInfo* info) {
    if (!info->checksums) printf("note: %s records no checksums (written before they were): its files are not verified\n", dir);
}

void checkpoint_refuse_other_shape(const char* dir, const ModelShape* want) {
    char p[PATH_MAX];
    ModelShape fs;
    if (lora_of(want)) return;   // adapters.bin's header is checked as it is read
    path_join(p, sizeof(p), dir, "model.bin");
    if (model_file_peek_shape(p, &fs)) model_file_check_shape(&fs, want, p);
}

// One candidate of checkpoint_find: complete (DONE) and every file as the checksums say; only then is a
// model of another shape another run (a one-line error) rather than damage; then well formed for this shape.
static int usable(const char* dir, const ModelShape* s, int verbose, char* why, size_t n) {
    long long done_size = 0;
    if (!regular_file_size(dir, "DONE", &done_size, why, n)) return set_why(why, n, "no DONE marker (incomplete)");
    CheckpointInfo info;
    Manifest m;
    int ok = manifest_read(&m, dir, &info, why, n) && verify_files(dir, &info, &m, why, n);
    manifest_free(&m);
    if (ok) checkpoint_refuse_other_shape(dir, s);
    ok = ok && inspect_files(dir, s, &info, why, n);
    if (ok && verbose) checkpoint_note_unverified(dir, &info);
    return ok;
}

int checkpoint_find(const char* out_dir, const ModelShape* s, char* path, size_t size, int verbose) {
    int* steps;
    int count = run_dir_checkpoints(out_dir, &steps), found = -1;
    char why[512], skipped[2048] = "";
    size_t used = 0;
    for (int i = 0; i < count && found < 0; i++) {
        run_dir_checkpoint_path(path, size, out_dir, steps[i]);
        if (usable(path, s, verbose, why, sizeof(why))) {
            found = steps[i];
            break;
        }
        int w = snprintf(skipped + used, sizeof(skipped) - used, "%s%s: %s", used ? "; " : "", path, why);
        used = w > 0 && used + (size_t)w < sizeof(skipped) ? used + (size_t)w : used;
    }
    free(steps);
    if (count > 0 && found < 0) fail("no usable checkpoint in %s (%s)", out_dir, skipped);
    if (found >= 0 && used && verbose) fprintf(stderr, "warning: skipping damaged checkpoints: %s\n", skipped);
    return found;
}

void checkpoint_load(const ModelState* ms, Backend* be, const char* dir, const CheckpointInfo* info) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, manifest_weights_file(&ms->lay->shape));
    ModelShape base;   // a LoRA run: the base from -e (checkpoint_check_resume put it in base_model), the adapters over it
    float* flat = info->has_base ? model_start(ms->lay, info->base_model, shape_from_spec(info->base_model, &base), info->seed, p)
                                 : model_file_read(ms->lay, p);   // checks the shape
    ms->set_from_host(ms->ctx, be, flat);
    free(flat);
    for (int r = 0; r < info->ranks; r++) {
        char name[64];
        snprintf(name, sizeof(name), "state_rank%d.bin", r);
        path_join(p, sizeof(p), dir, name);
        StateReader reader = {xfopen(p, "rb"), p, NULL, 0};
        state_file_read(ms, be, &reader);
        fclose(reader.f);
    }
    state_flush(ms);   // what went to the disk's cache is on disk before anything reads it there
    if (ms->load_own) ms->load_own(ms->ctx, be, dir);
}

// A LoRA run's checkpoint continues only on its base: a file with the same bytes (CRC-32; it may have moved),
// or the same shape (its values are the seed's).
static void check_base(CheckpointInfo* info, const Config* cfg, const char* dir) {
    if (!info->has_base) return;
    ModelShape s;
    uint32_t crc = 0;
    int spec = shape_from_spec(cfg->model, &s), was_spec = shape_from_spec(info->base_model, &s);
    if (!spec && !crc32_file(cfg->model, &crc)) fail("cannot read -e %s: %s", cfg->model, strerror(errno));
    if (spec != was_spec || crc != info->base_crc || (spec && strcmp(info->base_model, cfg->model) != 0))
        fail("checkpoint %s adapts the base %s (crc32 %08x); -e %s is another (crc32 %08x)", dir, info->base_model, info->base_crc,
             cfg->model, crc);
    snprintf(info->base_model, sizeof(info->base_model), "%s", cfg->model);   // where checkpoint_load reads it
}

// The checkpoint must continue this run: its recorded hyperparameters against this launch's (older
// manifests record only what may never change: the tokens per step, -t, -seed and -p), and not past this
// run's end.
void checkpoint_check_resume(CheckpointInfo* info, const Config* cfg, int max_steps, long long tokens_per_step,
                             const char* dir, int root) {
    if (info->has_run) {
        RunRecord now;
        run_record_of(&now, cfg, max_steps, tokens_per_step);
        run_record_check_resume(&info->run, &now, cfg, max_steps, info->step, dir, root);
    } else if (info->tokens_per_step != tokens_per_step) {
        fail("checkpoint %s was written with %lld tokens per step; this run has %lld (keep b*t*ga*replicas the same)", dir,
             info->tokens_per_step, tokens_per_step);
    } else if (info->T != cfg->T) {
        fail("checkpoint %s was written with -t %d; this run has %d", dir, info->T, cfg->T);
    } else if (info->seed != cfg->seed) {
        fail("checkpoint %s was written with -seed %llu; this run has %llu", dir, info->seed, (unsigned long long)cfg->seed);
    } else if (info->dt != cfg->precision) {
        fail("checkpoint %s was written with -p %s; this run has %s", dir, dtype_name(info->dt), dtype_name(cfg->precision));
    }
    check_base(info, cfg, dir);
    if (cfg->dump_dir) fail("-dump writes step 0's tensors: this run resumes at step %d (dump from a fresh run)", info->step);
    if (info->step > max_steps) fail("checkpoint %s is at step %d, past this run's last step %d (-x)", dir, info->step, max_steps);
}
