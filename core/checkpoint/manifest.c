// manifest.c: see manifest.h.
#include "core/checkpoint/manifest.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/crc32.h"
#include "core/util/fs.h"
#include "core/checkpoint/run_dir.h"
#include "core/model/lora.h"
#include "core/models/catalog.h"

static void write_checksums(FILE* f, const uint32_t* crcs, int world, const char* weights) {
    fprintf(f, "\"crc32\": {\"%s\": \"%08x\"", weights, crcs[world]);
    for (int r = 0; r < world; r++) fprintf(f, ", \"state_rank%d.bin\": \"%08x\"", r, crcs[r]);
    fprintf(f, "},\n ");
}

const char* manifest_weights_file(const ModelShape* s) { return lora_of(s) ? "adapters.bin" : "model.bin"; }

// A LoRA run's base: -e's model and, for a file, its CRC-32 (read again at every checkpoint: the file may
// have been replaced since the start).
static void write_base(FILE* f, const char* model) {
    ModelShape s;
    uint32_t crc = 0;
    if (!shape_from_spec(model, &s) && !crc32_file(model, &crc)) fail("cannot read the base model %s: %s", model, strerror(errno));
    fputs("\"base\": {\"model\": \"", f);
    for (const char* c = model; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if ((unsigned char)*c < 0x20) fprintf(f, "\\u%04x", (unsigned char)*c);
        else fputc(*c, f);
    }
    fprintf(f, "\", \"crc32\": \"%08x\"},\n ", crc);
}

void manifest_write(const char* path, const ModelState* ms, const Grid* g, const Config* cfg, const CheckpointInfo* info,
                    int host_dirs, const uint32_t* crcs) {
    FILE* f = xfopen(path, "w");
    const ModelShape* s = &ms->lay->shape;
    fprintf(f, "{\"format\": %d, \"step\": %d, \"tokens_per_step\": %lld, \"seed\": %llu, \"state_files\": %d,\n",
            MANIFEST_FORMAT, info->step, info->tokens_per_step, info->seed, comm_size(g->world));
    fprintf(f, " \"loss_scale\": %.9g, \"clean_steps\": %d, \"overflows_left\": %d,\n", info->scaler.scale,
            info->scaler.clean_steps, info->scaler.overflows_left);
    fprintf(f, " \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d},\n", s->L, s->C,
            s->NH, s->V, s->Vp, s->maxT);
    fprintf(f, " \"batch\": {\"B\": %d, \"T\": %d, \"ga\": %d}, \"precision\": \"%s\",\n", cfg->B, cfg->T,
            cfg->grad_accum, dtype_name(ms->dt));
    fprintf(f, " \"topology\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"zero\": %d},\n", comm_size(g->world), g->dp, g->pp,
            cfg->zero_stage);
    fprintf(f, " \"data\": {\"shuffle\": %d, \"next_step\": %d},\n ", cfg->shuffle, info->step);
    if (host_dirs) fprintf(f, "\"host_dirs\": %d,\n ", host_dirs);
    write_checksums(f, crcs, comm_size(g->world), manifest_weights_file(s));
    if (lora_of(s)) write_base(f, cfg->model);
    run_record_write_json(f, &info->run, path);
    fprintf(f, "}\n");
    xfclose(f, path);
}

void manifest_write_done(const char* dir) {
    char manifest[PATH_MAX], done[PATH_MAX];
    path_join(manifest, sizeof(manifest), dir, "manifest.json");
    path_join(done, sizeof(done), dir, "DONE");
    uint32_t crc;
    if (!crc32_file(manifest, &crc)) fail("cannot read back %s: %s", manifest, strerror(errno));
    FILE* f = xfopen(done, "w");
    fprintf(f, "{\"manifest.json\": \"%08x\"}\n", crc);
    xfclose(f, done);
}

// A CRC-32 as written: 8 lowercase hex digits. 1 and *crc, or 0.
static int parse_crc(const char* s, uint32_t* crc) {
    if (!s || strlen(s) != 8 || strspn(s, "0123456789abcdef") != 8) return 0;
    *crc = (uint32_t)strtoul(s, NULL, 16);
    return 1;
}

typedef enum { DONE_ABSENT, DONE_EMPTY, DONE_SEALED } DoneState;

// What dir/DONE says of text, the manifest: absent (the caller's concern), empty, or sealed (it holds
// text's CRC-32). A DONE that holds anything else is damage (0, the problem in why).
static int read_done(const char* dir, const char* text, DoneState* state, char* why, size_t n) {
    long long size = 0;
    char unused[8];   // why DONE is not there: the caller says it
    *state = !regular_file_size(dir, "DONE", &size, unused, sizeof(unused)) ? DONE_ABSENT : size == 0 ? DONE_EMPTY : DONE_SEALED;
    if (*state != DONE_SEALED) return 1;
    char* done = read_small_text(dir, "DONE", why, n);
    if (!done) return 0;
    Json j;
    char jwhy[128];
    uint32_t want;
    int ok = json_parse(&j, done, jwhy, sizeof(jwhy)) && parse_crc(json_get_string(&j, json_find(&j, 0, "manifest.json")), &want);
    if (!ok) set_why(why, n, "DONE is malformed");
    uint32_t got = crc32_of(text, strlen(text));
    if (ok && got != want) ok = set_why(why, n, "manifest.json is damaged: its CRC-32 is %08x, DONE's %08x", got, want);
    json_free(&j);
    free(done);
    return ok;
}

// Which era wrote the manifest, from its "format" and "crc32" and from DONE: only a manifest with neither
// key was written before checksums, and only that one goes with an empty DONE (an empty DONE beside any
// other is damage, so a damaged DONE never turns the checks off). Sets *checksums.
static int check_format(const Json* j, DoneState done, int* checksums, char* why, size_t n) {
    int format_at = json_find(j, 0, "format");
    long long format = 0;
    if (format_at >= 0 && !json_get_int(j, format_at, 3, MANIFEST_FORMAT, &format))
        return set_why(why, n, "manifest.json has an unknown \"format\" (this build reads formats up to %d)", MANIFEST_FORMAT);
    *checksums = json_find(j, 0, "crc32") >= 0;
    if (!*checksums && format_at >= 0) return set_why(why, n, "manifest.json (format %lld) lacks \"crc32\"", format);
    if (done == DONE_EMPTY && *checksums)
        return set_why(why, n, "DONE is empty, but manifest.json records checksums (only a checkpoint from before them has an empty DONE)");
    if (done == DONE_SEALED && !*checksums) return set_why(why, n, "manifest.json lacks \"crc32\", though DONE holds its CRC-32");
    return 1;
}

// The run's fields, each checked against the range a writer could have written.
static int read_fields(const Json* j, const char* dir, CheckpointInfo* info, char* why, size_t n) {
    int topology = json_find(j, 0, "topology"), batch = json_find(j, 0, "batch");
    // Manifests from before pipelines had one state file per data-parallel rank, as a top-level "dp".
    int state_files = json_find(j, 0, "state_files"), ranks_at = state_files >= 0 ? state_files : json_find(j, 0, "dp");
    long long step, tps, seed, ranks, pp, clean, left, T, dirs = 0;   // no "host_dirs": one directory
    double scale;
    if (!json_get_int(j, json_find(j, 0, "step"), LLONG_MIN, LLONG_MAX, &step) ||
        !json_get_int(j, json_find(j, 0, "tokens_per_step"), LLONG_MIN, LLONG_MAX, &tps) ||
        !json_get_int(j, json_find(j, 0, "seed"), LLONG_MIN, LLONG_MAX, &seed) ||
        !json_get_int(j, ranks_at, LLONG_MIN, LLONG_MAX, &ranks) || !json_get_int(j, json_find(j, topology, "pp"), LLONG_MIN, LLONG_MAX, &pp) ||
        !json_get_number(j, json_find(j, 0, "loss_scale"), &scale) ||
        !json_get_int(j, json_find(j, 0, "clean_steps"), LLONG_MIN, LLONG_MAX, &clean) ||
        !json_get_int(j, json_find(j, 0, "overflows_left"), LLONG_MIN, LLONG_MAX, &left))
        return set_why(why, n, "manifest.json lacks a field or has a malformed one (step, tokens_per_step, seed, %s, pp, loss_scale, "
                       "clean_steps, overflows_left)", state_files >= 0 ? "state_files" : "dp");
    int named = run_dir_step_of(dir);
    if (step < 0 || step > INT_MAX || (named >= 0 && step != named))
        return set_why(why, n, "manifest.json says step %lld, its directory's name %d", step, named);
    if (ranks < 1 || ranks > (1 << 20) || pp < 1 || pp > ranks || tps < 1 || seed < 0)
        return set_why(why, n, "manifest.json: bad topology or batch (%lld state files, %lld stages, %lld tokens per step)", ranks, pp, tps);
    if (!(scale >= 1.0) || clean < 0 || clean > INT_MAX || left < 0 || left > INT_MAX) return set_why(why, n, "manifest.json: bad loss-scale state");
    const char* prec = json_get_string(j, json_find(j, 0, "precision"));
    long long dt = !prec ? -1 : !strcmp(prec, "fp32") ? DT_FP32 : !strcmp(prec, "bf16") ? DT_BF16 : !strcmp(prec, "fp16") ? DT_FP16 : -1;
    if (dt < 0) return set_why(why, n, "manifest.json lacks a well-formed \"precision\"");
    if (!json_get_int(j, json_find(j, batch, "T"), 1, INT_MAX, &T)) return set_why(why, n, "manifest.json lacks a well-formed batch \"T\"");
    int host_dirs = json_find(j, 0, "host_dirs");
    if (host_dirs >= 0 && !json_get_int(j, host_dirs, 2, ranks, &dirs)) return set_why(why, n, "manifest.json has a malformed \"host_dirs\"");
    *info = (CheckpointInfo){.step = (int)step, .tokens_per_step = tps, .seed = (unsigned long long)seed, .dt = (DType)dt, .T = (int)T,
                             .ranks = (int)ranks, .pp = (int)pp, .host_dirs = (int)dirs,
                             .scaler = {.scale = (float)scale, .clean_steps = (int)clean, .overflows_left = (int)left}};
    return 1;
}

int manifest_read(Manifest* m, const char* dir, CheckpointInfo* info, char* why, size_t n) {
    *m = (Manifest){0};
    char* text = read_small_text(dir, "manifest.json", why, n);
    if (!text) return 0;
    m->hash = fnv1a(FNV1A_START, text, strlen(text));
    char jwhy[128];
    DoneState done;
    int checksums = 0;
    int ok = read_done(dir, text, &done, why, n);
    if (ok && !json_parse(&m->json, text, jwhy, sizeof(jwhy))) ok = set_why(why, n, "manifest.json is not valid JSON: %s", jwhy);
    free(text);
    ok = ok && check_format(&m->json, done, &checksums, why, n) && read_fields(&m->json, dir, info, why, n);
    if (ok) {
        info->checksums = checksums;
        char rwhy[480];
        int run = json_find(&m->json, 0, "run");
        info->has_run = run >= 0;
        if (info->has_run && !run_record_read(&info->run, &m->json, run, rwhy, sizeof(rwhy))) ok = set_why(why, n, "manifest.json: %s", rwhy);
    }
    int base = ok ? json_find(&m->json, 0, "base") : -1;
    if (base >= 0) {
        const char* model = json_get_string(&m->json, json_find(&m->json, base, "model"));
        info->has_base = 1;
        if (!model || strlen(model) >= sizeof(info->base_model) || !parse_crc(json_get_string(&m->json, json_find(&m->json, base, "crc32")), &info->base_crc))
            ok = set_why(why, n, "manifest.json has a malformed \"base\"");
        else snprintf(info->base_model, sizeof(info->base_model), "%s", model);
    }
    return ok;
}

void manifest_free(Manifest* m) { json_free(&m->json); }

static int has_checksums(const Manifest* m) { return json_find(&m->json, 0, "crc32") >= 0; }

int manifest_verify_file(const Manifest* m, const char* dir, const char* name, char* why, size_t n) {
    long long size = 0;
    if (!regular_file_size(dir, name, &size, why, n)) return 0;
    if (!has_checksums(m)) return 1;
    uint32_t want, got;
    if (!parse_crc(json_get_string(&m->json, json_find(&m->json, json_find(&m->json, 0, "crc32"), name)), &want))
        return set_why(why, n, "manifest.json has no well-formed CRC-32 for %s", name);
    char p[PATH_MAX];
    path_join(p, sizeof(p), dir, name);
    if (!crc32_file(p, &got)) return set_why(why, n, "cannot read %s: %s", name, strerror(errno));
    if (got != want) return set_why(why, n, "%s is damaged: its CRC-32 is %08x, the manifest's %08x", name, got, want);
    return 1;
}
