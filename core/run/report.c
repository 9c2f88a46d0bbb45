// report.c: what the trainer tells a person and its log: layout, per-rank memory and traffic, phase timing,
// model FLOPs. See report.h.
#include "core/run/report.h"

#include <math.h>
#include <string.h>

#include "base/common.h"
#include "base/gpu_variants.h"
#include "core/model/walk.h"
#include "core/pipeline/schedule.h"

const char* json_number(char* buf, size_t size, double x) {
    if (isfinite(x)) snprintf(buf, size, "%.9g", x);
    else snprintf(buf, size, "null");
    return buf;
}

static const char* const OFFLOAD_FIELD[] = {"", ", \"offload\": 1", ", \"offload\": 2"};

void report_layout(Logger* log, const ParamLayout* lay, const Config* cfg, int ranks, int first_step) {
    char buf[8192];
    int n = 0;
    for (int u = 0; u < lay->num_units && n < (int)sizeof(buf) - 32; u++)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s%zu", u ? ", " : "", lay->units[u].padded);
    char tp_field[64] = "";   // "tp" only with tensor parallelism, "cp" with context parallelism, likewise
    int k = cfg->tensor_parallel > 1 ? snprintf(tp_field, sizeof(tp_field), ", \"tp\": %d", cfg->tensor_parallel) : 0;
    if (cfg->context_parallel > 1) snprintf(tp_field + k, sizeof(tp_field) - (size_t)k, ", \"cp\": %d", cfg->context_parallel);
    // "offload" only when on, so the records of runs without it stay as they were.
    logger_line(log, "{\"step\": %d, \"layout\": {\"elements\": %zu, \"params\": %zu, \"ranks\": %d, \"zero\": %d, "
                "\"dtype_bytes\": %zu, \"ga\": %d, \"B\": %d, \"T\": %d, \"recompute\": %d, \"L\": %d, \"C\": %d, \"NH\": %d, "
                "\"Vp\": %d, \"units\": [%s]%s%s}}", first_step, lay->total, lay->num_params, ranks, cfg->zero_stage,
                dtype_size(cfg->precision), cfg->grad_accum, cfg->B, cfg->T, cfg->recompute, lay->shape.L, lay->shape.C,
                lay->shape.NH, lay->shape.Vp, buf, OFFLOAD_FIELD[cfg->offload], tp_field);
}

// Every rank's n values, rank after rank, on every rank (a sum of one-hot rows: a few values per rank).
static double* gather_rows(Comm* world, const double* mine, int n) {
    int rank = comm_rank(world), ranks = comm_size(world);
    double* all = (double*)xcalloc((size_t)ranks * (size_t)n, sizeof(double));
    memcpy(all + (size_t)rank * n, mine, (size_t)n * sizeof(double));
    comm_allreduce_host_sum(world, all, ranks * n);
    return all;
}
// The same for counts (bytes), exact however large.
static long long* gather_counts(Comm* world, const long long* mine, int n) {
    int rank = comm_rank(world), ranks = comm_size(world);
    long long* all = (long long*)xcalloc((size_t)ranks * (size_t)n, sizeof(long long));
    memcpy(all + (size_t)rank * n, mine, (size_t)n * sizeof(long long));
    comm_allreduce_host_sum_i64(world, all, ranks * n);
    return all;
}

void report_memory(Logger* log, Comm* world, const MemLedger* mem, const Config* cfg, const Model* chunks, int num_chunks,
                   int first_step) {
    int rank = comm_rank(world), ranks = comm_size(world);
    long long mine[NUM_MEM_CATEGORIES];
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) mine[c] = (long long)mem->bytes[c];
    long long* all = gather_counts(world, mine, NUM_MEM_CATEGORIES);
    for (int r = 0; r < ranks && rank == 0; r++) {
        char buf[512];
        int n = 0;
        long long total = 0;
        for (int c = 0; c < NUM_MEM_CATEGORIES; c++) {
            long long b = all[r * NUM_MEM_CATEGORIES + c];
            if (mem_category_where((MemCategory)c) == MEM_ON_BACKEND) total += b;   // "total": backend memory
            n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s\"%s\": %lld", c ? ", " : "", mem_category_name((MemCategory)c), b);
        }
        logger_line(log, "{\"step\": %d, \"rank\": %d, \"memory\": {%s}, \"total\": %lld}", first_step, r, buf, total);
    }
    if (rank == 0 && !config_chats(cfg)) {   // a chat prints its reply alone
        printf("memory (rank 0): %.1f MiB total:", (double)mem_total(mem) / (1 << 20));
        for (int c = 0; c < NUM_MEM_CATEGORIES; c++)   // host categories are empty without -offload, disk without -nvme
            if (mem_category_shown((MemCategory)c, config_uses_host(cfg), cfg->nvme_dir != NULL))
                printf(" %s %.1f", mem_category_name((MemCategory)c), (double)mem->bytes[c] / (1 << 20));
        printf(" MiB\n");
        size_t keep_all = 0;
        for (int c = 0; c < num_chunks; c++) {
            const Model* g = &chunks[c];
            keep_all += model_activation_bytes(g->layout, cfg->precision, g->B, g->T, 0, 0, g->num_sets, g->num_stash, g->sp) +
                        model_document_bytes(g);
        }
        size_t saved = keep_all - mem->bytes[MEM_ACTIVATIONS];
        if (cfg->recompute > 0) printf("recompute -r %d saves %.1f MiB of activations per rank (-r 0 would need %.1f MiB)\n",
                                       cfg->recompute, (double)saved / (1 << 20), (double)keep_all / (1 << 20));
        logger_line(log, "{\"step\": %d, \"recompute\": %d, \"activations\": %zu, \"activations_keep_all\": %zu, "
                    "\"activations_saved\": %zu}", first_step, cfg->recompute, mem->bytes[MEM_ACTIVATIONS], keep_all, saved);
    }
    free(all);
}

// The grid's distinct groups (NULL where a group is the world or absent).
#define GRID_GROUPS(g) \
    {(g)->world, (g)->dp_group != (g)->world ? (g)->dp_group : NULL, (g)->pp_group, (g)->tied, (g)->tp_group, (g)->cp_group, (g)->hpz_group, \
     (g)->qgz.intra, (g)->qgz.inter}

void report_comm_reset(const Grid* g) {
    Comm* groups[] = GRID_GROUPS(g);
    for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++)
        if (groups[i]) comm_reset_bytes(groups[i]);
}

// Whether any rank sent bytes by the collective in column `col` of the gathered rows.
static int any_sent(const long long* all, int ranks, int width, int col) {
    for (int r = 0; r < ranks; r++)
        if (all[(size_t)r * width + col]) return 1;
    return 0;
}

// One log record `key`: every rank's count per name (the `n` columns from `col` of the gathered rows, `width`
// values per rank). skip_unsent: from that column on, a name is listed once some rank has sent by it (the
// all-to-all, which only context parallelism sends by), so that the records of runs without it keep their keys.
static void log_counts(Logger* log, int step, const char* key, const long long* all, int ranks, int width, int col, int n,
                       const char* (*name)(int), int skip_unsent) {
    // Sized for every rank (a count is at most 20 digits), so no world is too large to log whole.
    size_t size = (size_t)n * ((size_t)ranks * 24 + 48), at = 0;
    char* buf = (char*)xmalloc(size);
    for (int k = 0; k < n; k++) {
        if (k >= skip_unsent && !any_sent(all, ranks, width, col + k)) continue;
        at += (size_t)snprintf(buf + at, size - at, "%s\"%s\": [", k ? ", " : "", name(k));
        for (int r = 0; r < ranks; r++)
            at += (size_t)snprintf(buf + at, size - at, "%s%lld", r ? ", " : "", all[(size_t)r * width + col + k]);
        at += (size_t)snprintf(buf + at, size - at, "]");
    }
    logger_line(log, "{\"step\": %d, \"%s\": {%s}}", step, key, buf);
    free(buf);
}

static const char* collective_at(int k) { return collective_name((Collective)k); }
static const char* link_class_at(int k) { return link_class_name((LinkClass)k); }

// Per group, its bytes per collective then per link class.
enum { GROUP_COLS = NUM_COLLECTIVES + NUM_LINK_CLASSES };

// Every rank's bytes per collective and per link class (comm.h), summed over its groups ("comm_bytes",
// "link_bytes"); and where the grid has more than one kind of group (a pipeline, tensor, context, hpz or qgz
// groups), per group too ("dp_comm_bytes", "dp_link_bytes", and so on for pp, tied, tp, cp, hpz, qgz_intra and
// qgz_inter; a rank outside a group counts 0 there), so each can be checked against its own formula. One
// gather over the world carries them all.
void report_comm(Logger* log, const Grid* g, int step) {
    Comm* groups[] = GRID_GROUPS(g);
    enum { NUM_GROUPS = sizeof(groups) / sizeof(groups[0]), WIDTH = (1 + NUM_GROUPS) * GROUP_COLS };
    // Per group (in GRID_GROUPS' order) its records' prefix, and whether the grid has that kind of group. The
    // world's own collectives are the trainer's few host sums: counted in the total, never logged apart.
    const char* keys[NUM_GROUPS] = {NULL, "dp", "pp", "tied", "tp", "cp", "hpz", "qgz_intra", "qgz_inter"};
    int logged[NUM_GROUPS] = {0, 1, g->pp > 1, g->pp > 1, g->tp > 1, g->cp > 1, g->hpz_group != NULL, g->qgz.intra != NULL,
                               g->qgz.inter != NULL};
    int apart = g->pp > 1 || g->tp > 1 || g->cp > 1 || g->hpz_group || g->qgz.intra;   // more than one kind of group
    long long mine[WIDTH] = {0};   // the total, then each group
    for (int i = 0; i < NUM_GROUPS; i++)
        for (int k = 0; groups[i] && k < GROUP_COLS; k++) {
            long long b = (long long)(k < NUM_COLLECTIVES ? comm_bytes_sent(groups[i], (Collective)k)
                                                          : comm_link_bytes(groups[i], (LinkClass)(k - NUM_COLLECTIVES)));
            mine[k] += b;
            mine[(1 + i) * GROUP_COLS + k] = b;
        }
    report_comm_reset(g);
    int ranks = comm_size(g->world);
    long long* all = gather_counts(g->world, mine, WIDTH);
    if (comm_rank(g->world) == 0 && ranks > 1) {
        char key[32];
        for (int i = -1; i < NUM_GROUPS; i++) {
            if (i >= 0 && !(apart && logged[i])) continue;
            int col = (1 + (i == 1 && g->dp_group == g->world ? 0 : i)) * GROUP_COLS;   // dp as the world: the world's
            snprintf(key, sizeof key, "%s%scomm_bytes", i < 0 ? "" : keys[i], i < 0 ? "" : "_");
            log_counts(log, step, key, all, ranks, WIDTH, col, NUM_COLLECTIVES, collective_at, COLL_ALLTOALL);
            snprintf(key, sizeof key, "%s%slink_bytes", i < 0 ? "" : keys[i], i < 0 ? "" : "_");
            log_counts(log, step, key, all, ranks, WIDTH, col + NUM_COLLECTIVES, NUM_LINK_CLASSES, link_class_at, NUM_LINK_CLASSES);
        }
    }
    free(all);
}

double model_flops_per_token(const ParamLayout* lay, int T) {
    return lay->shape.family->flops_per_token(&lay->shape, T);
}

double gpu_peak_flops(const Backend* be) {
    const char* name = backend_device_name(be);
    if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "GH200")) return 989e12;
    if (strstr(name, "A100")) return 312e12;
    return 0.0;
}

// One stage's line: its replica 0 rank's phases. The bubble it saw: waiting over the work it did.
static void print_stage_line(int stage, const double* sec) {
    double work = sec[PHASE_DATA] + sec[PHASE_FORWARD] + sec[PHASE_BACKWARD];
    printf("  stage %d: forward %.1f ms, backward %.1f ms, waiting %.1f ms (%.0f%% of its work)\n", stage,
           (sec[PHASE_DATA] + sec[PHASE_FORWARD]) * 1e3, sec[PHASE_BACKWARD] * 1e3, sec[PHASE_WAIT] * 1e3,
           work > 0.0 ? 100.0 * sec[PHASE_WAIT] / work : 0.0);
}

// One stage's {"forward", "backward", "wait"} record with its separator: three times under 10^12 ms fit.
#define STAGE_JSON_MAX 128

// -nvme: the disk's side of the update (not phases: with -dpu it ran behind the step, else within the
// optimizer phase, of which the main loop waited for all). Appends to text; returns the characters added.
static int disk_breakdown(Logger* log, int step, const PhaseTimer* pt, char* text, size_t size) {
    const DiskTimes* d = &pt->disk;
    logger_line(log, "{\"step\": %d, \"nvme_ms\": {\"read\": %.3f, \"write\": %.3f, \"update\": %.3f, \"disk_wait\": %.3f, \"pass\": %.3f}}",
                step, d->read * 1e3, d->write * 1e3, (d->pass - d->wait) * 1e3, d->wait * 1e3, d->pass * 1e3);
    int n = snprintf(text, size, " | nvme: read %.1f ms, write %.1f ms, update %.1f ms; the pass took %.1f ms, %.1f of them waiting "
                     "for the disk%s", d->read * 1e3, d->write * 1e3, (d->pass - d->wait) * 1e3, d->pass * 1e3, d->wait * 1e3,
                     pt->overlapped > 0.0 ? ", behind the step" : "");
    return n < 0 ? 0 : n < (int)size ? n : (int)size - 1;
}

void report_breakdown(Logger* log, const Grid* g, int step, const PhaseTimer* pt, const PipelinePlan* plan) {
    double* all = gather_rows(g->world, pt->seconds, NUM_PHASES);
    if (comm_rank(g->world) == 0) {
        double total = 0.0;
        char text[1024], json[512];
        const size_t stages_size = (size_t)g->pp * STAGE_JSON_MAX + 1;
        char* stages = (char*)xmalloc(stages_size);
        size_t k = 0;
        int n = 0, m = 0;
        stages[0] = '\0';
        for (int p = 0; p < NUM_PHASES; p++) total += pt->seconds[p];
        for (int p = 0; p < NUM_PHASES; p++) {
            n += snprintf(text + n, sizeof(text) - (size_t)n, " | %s %.1f ms (%.0f%%)", phase_name((Phase)p), pt->seconds[p] * 1e3,
                          total > 0.0 ? 100.0 * pt->seconds[p] / total : 0.0);
            m += snprintf(json + m, sizeof(json) - (size_t)m, "%s\"%s\": %.3f", p ? ", " : "", phase_name((Phase)p), pt->seconds[p] * 1e3);
        }
        if (pt->host_copies > 0.0) {   // not a phase: part of the forward's and backward's time
            n += snprintf(text + n, sizeof(text) - (size_t)n, " | host copies %.1f ms, within them", pt->host_copies * 1e3);
            logger_line(log, "{\"step\": %d, \"offload_host_copies_ms\": %.3f}", step, pt->host_copies * 1e3);
        }
        if (pt->quantize > 0.0) {   // not a phase: part of the backward's time
            n += snprintf(text + n, sizeof(text) - (size_t)n, " | qgZ quantize %.1f ms, within it", pt->quantize * 1e3);
            logger_line(log, "{\"step\": %d, \"qgz_quantize_ms\": %.3f}", step, pt->quantize * 1e3);
        }
        if (pt->disk.pass > 0.0 || pt->disk.write > 0.0) n += disk_breakdown(log, step, pt, text + n, sizeof(text) - (size_t)n);
        if (pt->overlapped > 0.0) {   // not a phase: it ran beside them
            n += snprintf(text + n, sizeof(text) - (size_t)n, " | host update %.1f ms, overlapped", pt->overlapped * 1e3);
            logger_line(log, "{\"step\": %d, \"host_update_overlapped_ms\": %.3f}", step, pt->overlapped * 1e3);
        }
        printf("step %5d breakdown (synchronized, rank 0)%s\n", step, text);
        logger_line(log, "{\"step\": %d, \"breakdown_ms\": {%s}}", step, json);
        for (int s = 0; s < g->pp && g->pp > 1; s++) {
            const double* sec = all + (size_t)s * g->dp * g->tp * NUM_PHASES;   // world rank of (stage s, replica 0, tensor rank 0)
            print_stage_line(s, sec);
            int w = snprintf(stages + k, STAGE_JSON_MAX + 1, "%s{\"forward\": %.3f, \"backward\": %.3f, \"wait\": %.3f}",
                             s ? ", " : "", (sec[PHASE_DATA] + sec[PHASE_FORWARD]) * 1e3, sec[PHASE_BACKWARD] * 1e3, sec[PHASE_WAIT] * 1e3);
            if (w < 0 || w > STAGE_JSON_MAX) fail("internal: stage %d's breakdown record is %d bytes", s, w);
            k += (size_t)w;
        }
        if (g->pp > 1)
            logger_line(log, "{\"step\": %d, \"pipeline_ms\": {\"schedule\": \"%s\", \"bubble_theory\": %.6f, \"stages\": [%s]}}",
                        step, schedule_kind_name(plan->schedule), plan->bubble, stages);
        free(stages);
    }
    free(all);
}

void report_pipeline_plan(Logger* log, const PipelinePlan* plan, int first_step) {
    int P = plan->stages, m = plan->micro;
    if (P > 1) {
        char blocks[MAX_LAYERS * 6], chunks[64] = "";
        for (int i = 0, n = 0; i < P * plan->chunks; i++)
            n += snprintf(blocks + n, sizeof(blocks) - (size_t)n, "%s%d", i ? ", " : "", plan->count[i]);
        if (plan->chunks > 1) snprintf(chunks, sizeof(chunks), " x %d virtual stages each", plan->chunks);
        const char* formula[] = {"(P-1)/m", "(P-1)/(V m)", "(P-1)/(3m)"};
        printf("pipeline: %s over %d stages%s (blocks per %sstage: %s), %d micro-batches per step: bubble %s = %.1f%% of "
               "the useful time\n", schedule_kind_name(plan->schedule), P, chunks, plan->chunks > 1 ? "virtual " : "", blocks,
               m, formula[plan->schedule], 100.0 * plan->bubble);
        if (plan->schedule == SCHEDULE_ZB)   // core/pipeline/schedule.h: an exchange completes as a whole
            printf("pipeline: zb's bubble assumes buffered sends; its exchanges (rendezvous, as NCCL's) leave more: "
                   "./build/test_schedule print zb %d %d (make tests-bin)\n", P, m);
        logger_line(log, "{\"step\": %d, \"pipeline\": {\"schedule\": \"%s\", \"stages\": %d, \"micro_batches\": %d, "
                    "\"blocks\": [%s], \"bubble_theory\": %.6f}}", first_step, schedule_kind_name(plan->schedule), P, m,
                    blocks, plan->bubble);
    }
    if (P > 1 && m < P)
        fprintf(stderr, "warning: -ga %d < -pp %d: most of each step is pipeline bubble; use -ga >= %d (ideally several times -pp)\n", m,
                P, P);
}

void report_variants(Logger* log, Backend* be, int first_step) {
    const unsigned set = backend_variants(be);
    if (!set) return;
    char names[256];
    gpu_variants_describe(set, names, sizeof names);
    const int cpu = !strncmp(backend_device_name(be), "cpu", 3);   // "cpu" or "cpu (fenced)"
    printf("kernel variants: %s%s\n", names, cpu ? " (the CPU build has one kernel each: they change nothing here)" : "");
    logger_line(log, "{\"step\": %d, \"kernel_variants\": \"%s\"}", first_step, names);
}
