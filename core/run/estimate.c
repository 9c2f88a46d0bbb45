// estimate.c: see estimate.h.
#include "core/run/estimate.h"

#include <stdio.h>

#include "base/common.h"
#include "core/comm/grid.h"
#include "core/model/context_parallel.h"
#include "core/util/fs.h"
#include "core/zero/qgz.h"
#include "core/zero/qwz.h"
#include "core/model/walk.h"
#include "core/pipeline/pipeline.h"
#include "core/models/catalog.h"
#include "core/model/lora.h"

// Bytes per category that a data-parallel rank of dp would allocate (every rank holds as much: zero.h):
// stage `stage` of the pipeline plan, ZeRO stage `zero`, recompute level `recompute` (cfg supplies
// precision, b, t).
static void memory_plan(MemLedger* out, StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s,
                        int dp, int stage, int zero, int recompute) {
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    pipeline_stage_layout(lay, plan, s, dp, stage, 0);   // every tensor rank holds as much as rank 0
    memset(out, 0, sizeof(*out));
    states(out, lay, cfg, zero, 0, dp);
    ParamLayout* chunk = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    for (int c = 0; c < lay->num_chunks; c++) {
        layout_chunk_view(lay, c, chunk);
        int host = cfg->offload_act && recompute == 3;   // -offload-act at the level the table plans
        out->bytes[MEM_ACTIVATIONS] += model_activation_bytes(chunk, cfg->precision, cfg->B, cfg->T / plan->cp, recompute, host,
                                                              plan->sets[stage][c], plan->stash[stage], cfg->sequence_parallel);
        out->bytes[MEM_HOST_ACTIVATIONS] += model_host_activation_bytes(chunk, cfg->precision, cfg->B, cfg->T / plan->cp, host,
                                                                        plan->sets[stage][c], cfg->sequence_parallel);
    }
    free(chunk);
    free(lay);
}

static double gib(size_t bytes) { return (double)bytes / (double)(1ull << 30); }

#define DEVICE_TOTAL (-1)   // heaviest_stage's category: all backend bytes
#define HOST_TOTAL (-2)     // all host bytes (-offload)
#define DISK_TOTAL (-3)     // all disk bytes (-nvme)

static size_t category_bytes(const MemLedger* m, int category) {
    return category == DEVICE_TOTAL ? mem_total(m)
           : category == HOST_TOTAL ? mem_host_total(m)
           : category == DISK_TOTAL ? mem_disk_total(m)
                                    : m->bytes[category];
}

// The most any stage needs (every stage is the same without a pipeline).
static size_t heaviest_stage(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int dp,
                             int zero, int recompute, int category) {
    size_t most = 0;
    for (int st = 0; st < plan->stages; st++) {
        MemLedger m;
        memory_plan(&m, states, cfg, plan, s, dp, st, zero, recompute);
        most = category_bytes(&m, category) > most ? category_bytes(&m, category) : most;
    }
    return most;
}

// One row per world size, one column per ZeRO stage, of the heaviest stage's bytes in `category`.
static void print_rows(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks,
                       int category) {
    int group = plan->stages * plan->tp;   // ranks per replica
    int sizes[] = {1, 2, 4, 8, 16, 64, ranks};
    int n = ranks == 1 || ranks == 2 || ranks == 4 || ranks == 8 || ranks == 16 || ranks == 64 ? 6 : 7;
    printf("  ranks     ZeRO-0     ZeRO-1     ZeRO-2     ZeRO-3\n");
    for (int i = 0; i < n; i++) {
        if (sizes[i] % group != 0) continue;
        printf("  %5d", sizes[i]);
        for (int z = 0; z < 4; z++) {
            Config c = *cfg;
            c.zero_stage = z;
            if (config_lora_unbuilt(&c)) printf(" %10s", "not yet");   // with -lora
            else printf(" %10.2f", gib(heaviest_stage(states, cfg, plan, s, sizes[i] / group, z, cfg->recompute, category)));
        }
        printf("\n");
    }
}

// Each schedule's activation sets (per chunk with interleaving, each set 1/V of a stage's) and zb's stash
// per stage, and the heaviest stage's activation bytes under each (at -r as given), with the bubble each buys.
static void print_schedules(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks) {
    printf("\nactivations per rank on the heaviest stage by schedule (-r %d, m=%d):\n", cfg->recompute, plan->micro);
    int P = plan->stages, m = plan->micro, V = plan->chunks > 1 ? plan->chunks : 2;
    const ScheduleKind kinds[] = {SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB};
    for (int k = 0; k < 3; k++) {
        int chunks = kinds[k] == SCHEDULE_INTERLEAVED ? V : 1;
        if (kinds[k] == SCHEDULE_INTERLEAVED && (m % P || P * V > s->L)) {
            printf("  -ps interleaved -vp %d: not possible here (needs -ga a multiple of -pp and %d layers)\n", V, P * V);
            continue;
        }
        PipelinePlan other;
        pipeline_plan(&other, s, P, kinds[k], chunks, plan->tp, plan->cp, plan->cp_ring, ranks, cfg->T, m);
        char name[32];
        snprintf(name, sizeof(name), chunks > 1 ? "%s -vp %d" : "%s", schedule_kind_name(kinds[k]), chunks);
        printf("  -ps %-18s %.3f GiB, bubble %.1f%%; sets per stage", name,
               gib(heaviest_stage(states, cfg, &other, s, plan_replicas(plan, ranks), cfg->zero_stage, cfg->recompute, MEM_ACTIVATIONS)),
               100.0 * other.bubble);
        for (int st = 0; st < P; st++) {
            printf(" ");
            for (int c = 0; c < chunks; c++) printf("%s%d", c ? "+" : "", other.sets[st][c]);
        }
        if (kinds[k] == SCHEDULE_ZB) {
            printf(", W stash per stage");
            for (int st = 0; st < P; st++) printf(" %d", other.stash[st]);
        }
        printf("\n");
    }
}

// What the kinds' optimizers keep per parameter, as their descriptions name it: "fp32 master, adamw m, v"
// (each updating optimizer once; a frozen kind keeps nothing).
static void describe_state(const ModelShape* s, char* out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "fp32 master");
    int seen[NUM_OPTIMIZERS] = {0};
    for (int k = 0; k < s->family->num_kinds && used < n; k++) {
        OptimizerId id = kind_info(s, k)->optimizer;
        const OptimizerKind* o = optimizer_kind(id);
        if (seen[id]++ || !o->num_state) continue;
        used += (size_t)snprintf(out + used, n - used, ", %s", o->name);
        for (int i = 0; i < o->num_state && used < n; i++) used += (size_t)snprintf(out + used, n - used, "%s%s", i ? ", " : " ", o->state_names[i]);
    }
}

static void print_table(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks) {
    int P = plan->stages;
    char state[128];
    describe_state(s, state, sizeof(state));
    printf("\n%sGiB per rank%s (model states + activations at -r %d, b=%d t=%d%s):\n", cfg->offload ? "device " : "",
           P > 1 ? " on the heaviest stage" : "", cfg->recompute, cfg->B, cfg->T, P > 1 ? ", -pp and -ga as given" : "");
    print_rows(states, cfg, plan, s, ranks, DEVICE_TOTAL);
    if (cfg->offload) {   // what -offload moved: each rank's master, optimizer state and staging buffer (and pieces)
        const char* params = cfg->nvme_dir ? "the walk's parameter read buffers" : "parameter pieces";
        printf("\nhost GiB per rank%s (-offload %d%s: %s, staging%s%s):\n", P > 1 ? " on the heaviest stage" : "", cfg->offload,
               cfg->nvme_dir ? " -nvme" : "", cfg->nvme_dir ? "the disk's buffer pool" : state,
               cfg->offload == 2 ? "; gradient pieces at -z >= 2, at -z 3 " : "", cfg->offload == 2 ? params : "");
        print_rows(states, cfg, plan, s, ranks, HOST_TOTAL);
    }
    if (cfg->nvme_dir) {   // what -nvme moved on: the state files (and parameter pieces at -z 3 -offload 2)
        printf("\ndisk GiB per rank%s (-nvme: %s%s):\n", P > 1 ? " on the heaviest stage" : "", state,
               cfg->offload == 2 ? "; parameter pieces at -z 3" : "");
        print_rows(states, cfg, plan, s, ranks, DISK_TOTAL);
    }
    printf("\nactivations per rank%s by recompute level (b=%d t=%d):", P > 1 ? " on the heaviest stage" : "", cfg->B, cfg->T);
    for (int r = 0; r <= 3; r++)
        printf("  -r %d: %.2f GiB", r, gib(heaviest_stage(states, cfg, plan, s, plan_replicas(plan, ranks), cfg->zero_stage, r, MEM_ACTIVATIONS)));
    printf("\n");
    if (P > 1) print_schedules(states, cfg, plan, s, ranks);
}

static void print_json(const char* prefix, const MemLedger* m) {
    printf("%s{", prefix);
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) printf("%s\"%s\": %zu", c ? ", " : "", mem_category_name((MemCategory)c), m->bytes[c]);
    printf("}");
}

// cfg with a row of the capacity table's ZeRO stage, -offload and -nvme (planned, never opened).
static Config row_config(const Config* cfg, int zero, int offload, int nvme) {
    Config c = *cfg;
    c.zero_stage = zero;
    c.offload = offload;
    c.nvme_dir = nvme ? (cfg->nvme_dir ? cfg->nvme_dir : "-disk-mem") : NULL;
    return c;
}

// Whether every rank of every stage of shape s fits the budgets under row configuration c (row_config) and
// recompute level r.
static int fits(StatePlanner states, const Config* c, const ModelShape* s, int ranks, int r) {
    char why[200];
    if (s->L < c->pipeline_stages || !shape_splits_vocab(s, c->tensor_parallel) ||
        !s->family->splits_tp(s, c->tensor_parallel, why, sizeof(why)) ||
        (c->context_parallel > 1 && c->context_mode != CP_RING &&
         !context_splits(s, c->tensor_parallel, c->context_parallel, why, sizeof(why))))
        return 0;
    PipelinePlan plan;
    pipeline_plan(&plan, s, c->pipeline_stages, c->pipe_schedule, c->virtual_stages, c->tensor_parallel, c->context_parallel,
                  c->context_mode == CP_RING, ranks, c->T, c->grad_accum);
    double gib = (double)(1ull << 30), gpu = c->gpu_mem_gib * gib, host = c->host_mem_gib * gib, disk = c->disk_mem_gib * gib;
    int dp = plan_replicas(&plan, ranks), z = c->zero_stage;
    return (double)heaviest_stage(states, c, &plan, s, dp, z, r, DEVICE_TOTAL) <= gpu &&
           (host <= 0.0 || (double)heaviest_stage(states, c, &plan, s, dp, z, r, HOST_TOTAL) <= host) &&
           (!c->nvme_dir || (double)heaviest_stage(states, c, &plan, s, dp, z, r, DISK_TOTAL) <= disk);
}

// Rung i of the base family's ladder as the run would train it, planned for sequences of -t (and at least
// 1024) tokens: with -lora, the base frozen and -lora's adapters on it (lf holds their family). 0 when -lora's
// rank is larger than one of the rung's target layers.
static int rung_shape(const ModelFamily* base, int i, const Config* cfg, ModelShape* s, LoraFamily* lf) {
    if (!shape_from_spec(base->ladder[i].spec, s)) fail("the %s ladder's shape '%s' is no shape", base->name, base->ladder[i].spec);
    if (s->maxT < cfg->T || s->maxT < 1024) s->maxT = cfg->T > 1024 ? cfg->T : 1024;
    if (cfg->lora.rank && lora_max_rank(s, &cfg->lora) < cfg->lora.rank) return 0;
    *s = lora_apply(lf, *s, &cfg->lora);
    return 1;
}

// One row of the capacity table: per -r, the largest shape of the base family's ladder that fits; a row
// whose layout -lora is not built for says so.
static void print_capacity_row(StatePlanner states, const Config* cfg, const ModelFamily* base, int ranks, int zero,
                               int offload, int nvme) {
    char level[16];
    snprintf(level, sizeof(level), nvme ? "%d+nvme" : "%d", offload);
    printf("  %4d  %7s", zero, level);
    Config c = row_config(cfg, zero, offload, nvme);
    const char* unbuilt = config_lora_unbuilt(&c);
    if (unbuilt) {
        printf("   not yet with -lora (%s)\n", unbuilt);
        return;
    }
    for (int r = 0; r <= 3; r++) {
        const char* best = "-";
        for (int i = 0; i < base->ladder_len; i++) {
            ModelShape s;
            LoraFamily lf;
            if (rung_shape(base, i, cfg, &s, &lf) && fits(states, &c, &s, ranks, r)) best = base->ladder[i].label;
        }
        printf(" %9s", best);
    }
    printf("\n");
}

// -gpu-mem (-host-mem): per ZeRO stage and -offload, per -r, the largest shape of -e's family that fits (with
// -lora's adapters on it when s has them).
static void print_capacity(StatePlanner states, const Config* cfg, const ModelShape* s, int ranks) {
    const LoraFamily* lora = lora_of(s);
    const ModelFamily* base = lora ? lora->base : s->family;
    char host[64] = "", disk[64] = "", adapters[128] = "";
    if (cfg->host_mem_gib > 0) snprintf(host, sizeof(host), " and -host-mem %g GiB", cfg->host_mem_gib);
    if (cfg->disk_mem_gib > 0) snprintf(disk, sizeof(disk), " (-nvme rows: -disk-mem %g GiB)", cfg->disk_mem_gib);
    if (lora) {
        size_t at = (size_t)snprintf(adapters, sizeof(adapters), " with LoRA r=%d on ", lora->rank);
        for (int j = 0; j < lora->num_targets && at < sizeof(adapters); j++)
            at += (size_t)snprintf(adapters + at, sizeof(adapters) - at, "%s%s", j ? "," : "", base->lora_targets[lora->target[j]]);
    }
    printf("\nlargest %s shape%s per rank within -gpu-mem %g GiB%s%s (%d rank%s, -pp %d, -tp %d%s, b=%d t=%d, %s):\n  ZeRO  offload",
           base->name, adapters, cfg->gpu_mem_gib, host, disk, ranks, ranks > 1 ? "s" : "", cfg->pipeline_stages,
           cfg->tensor_parallel, cfg->sequence_parallel ? " -sp 1" : "", cfg->B, cfg->T, dtype_name(cfg->precision));
    for (int r = 0; r <= 3; r++) printf("      -r %d", r);
    printf("\n");
    for (int zero = 0; zero < 4; zero++)
        for (int offload = 0; offload <= (zero >= 2 ? 2 : 1); offload++) {   // -offload 2 needs -z >= 2
            print_capacity_row(states, cfg, base, ranks, zero, offload, 0);
            if (offload > 0 && cfg->disk_mem_gib > 0) print_capacity_row(states, cfg, base, ranks, zero, offload, 1);
        }
}

// The longest -t, in steps of SEQ_STEP tokens up to the shape's maxT, at which shape s fits the budgets
// under c (its -cp) and recompute level r: 0 when even one step does not. Memory grows with -t, so the
// fitting lengths are a prefix.
#define SEQ_STEP 1024
static int longest_sequence(StatePlanner states, Config c, const ModelShape* s, int ranks, int r) {
    int lo = 0, hi = s->maxT / SEQ_STEP;   // lo fits (0: nothing yet), hi + 1 does not
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        c.T = mid * SEQ_STEP;
        if (fits(states, &c, s, ranks, r)) lo = mid;
        else hi = mid - 1;
    }
    return lo * SEQ_STEP;
}

// -gpu-mem (-host-mem): per -cp that divides the ranks of a stage's tensor group and the heads, per -r (and
// -r 3 with -offload-act), the longest sequence -e's shape trains at under the run's -z, -offload and -b.
static void print_longest_sequences(StatePlanner states, const Config* cfg, const ModelShape* s, int ranks) {
    printf("\nlongest -t per rank within -gpu-mem %g GiB (%d rank%s, -pp %d, -tp %d, -z %d, -offload %d, b=%d, %s; up to "
           "the model's %d positions, in steps of %d):\n     -cp", cfg->gpu_mem_gib, ranks, ranks > 1 ? "s" : "", cfg->pipeline_stages,
           cfg->tensor_parallel, cfg->zero_stage, cfg->offload, cfg->B, dtype_name(cfg->precision), s->maxT, SEQ_STEP);
    for (int r = 0; r <= 3; r++) printf("     -r %d", r);
    printf("  -r 3 -offload-act 1\n");
    char why[200];
    for (int cp = 1; cp <= ranks / (cfg->pipeline_stages * cfg->tensor_parallel); cp *= 2) {
        if ((ranks / (cfg->pipeline_stages * cfg->tensor_parallel)) % cp ||
            (cp > 1 && cfg->context_mode != CP_RING && !context_splits(s, cfg->tensor_parallel, cp, why, sizeof(why))))
            continue;
        Config c = *cfg;
        c.context_parallel = cp;
        printf("  %6d", cp);
        for (int r = 0; r <= 4; r++) {
            c.offload_act = r == 4;
            int t = longest_sequence(states, c, s, ranks, r < 4 ? r : 3);
            if (t) printf(r < 4 ? " %8d" : " %20d", t);
            else printf(r < 4 ? " %8s" : " %20s", "-");
        }
        printf("\n");
    }
}

// -nvme: the free space of DIR's filesystem against the state files, as the run checks it before allocating.
static void print_disk_room(const Config* cfg, const MemLedger* plans, int stages) {
    size_t most = 0;
    for (int st = 0; st < stages; st++) most = mem_disk_total(&plans[st]) > most ? mem_disk_total(&plans[st]) : most;
    double free_bytes = (double)fs_free_bytes(cfg->nvme_dir);
    printf("-nvme: %.3f GiB free on the filesystem of %s: room for the state files of %.0f rank%s of %.3f GiB\n", gib((size_t)free_bytes),
           cfg->nvme_dir, most ? free_bytes / (double)most : 0.0, most && free_bytes / (double)most < 2.0 ? "" : "s", gib(most));
}

// -offload: the state this rank keeps on the host against its share of the host's available memory (the
// ranks of one host split it evenly), so a model too large for the host is one clear error instead of the
// kernel's OOM killer mid-allocation.
static void check_host_room(const MemLedger* plan, const Config* cfg, int local) {
    size_t need = mem_host_total(plan), avail = host_memory_available();
    if (avail > 0 && need > avail / (size_t)local)
        fail("-offload %d: this rank's host state needs %.2f GiB, but the host has %.2f GiB available for its %d rank%s "
             "(%.2f GiB each); use more ranks or hosts, a higher -z, or a smaller model", cfg->offload, (double)need / (1 << 30),
             (double)avail / (1 << 30), local, local > 1 ? "s" : "", (double)avail / (1 << 30) / local);
}

// -nvme: the files this rank will write against its share of the free space of DIR's filesystem (the ranks of
// one host split it evenly, as they split a node-local disk), plus what its files of an earlier run there
// take, which this run reuses.
static void check_disk_room(const MemLedger* plan, const Config* cfg, int local, const NvmeConfig* mine) {
    make_dirs(cfg->nvme_dir);
    double gib = 1 << 30, need = (double)mem_disk_total(plan), free_bytes = (double)fs_free_bytes(cfg->nvme_dir);
    double share = free_bytes / local + (double)nvme_reusable_bytes(mine);
    if (need > share)
        fail("-nvme %s: this rank's state files need %.3f GiB, but the filesystem has %.3f GiB free for this host's %d rank%s; "
             "free some, use another -nvme directory, more hosts or a higher -z", cfg->nvme_dir, need / gib, free_bytes / gib, local,
             local > 1 ? "s" : "");
}

void check_room(StatePlanner states, const Config* cfg, const ParamLayout* lay, int dp_rank, int dp, int local_ranks,
                const NvmeConfig* mine) {
    if (!cfg->offload && !cfg->nvme_dir) return;
    MemLedger plan = {{0}};
    states(&plan, lay, cfg, cfg->zero_stage, dp_rank, dp);
    if (cfg->offload) check_host_room(&plan, cfg, local_ranks);
    if (cfg->nvme_dir) check_disk_room(&plan, cfg, local_ranks, mine);
}

// What the printout shows: each stage's plan, and the heaviest stage's device bytes.
typedef struct {
    MemLedger* stages;   // [stages]
    size_t heaviest;
} StagePlans;

static StagePlans plan_stages(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int dp) {
    StagePlans p = {.stages = (MemLedger*)xmalloc((size_t)plan->stages * sizeof(MemLedger))};
    for (int st = 0; st < plan->stages; st++) {
        memory_plan(&p.stages[st], states, cfg, plan, s, dp, st, cfg->zero_stage, cfg->recompute);
        p.heaviest = mem_total(&p.stages[st]) > p.heaviest ? mem_total(&p.stages[st]) : p.heaviest;
    }
    return p;
}

PlanPeak plan_peak(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks) {
    StagePlans sp = plan_stages(states, cfg, plan, s, plan_replicas(plan, ranks));
    PlanPeak peak = {.device = sp.heaviest};
    for (int st = 0; st < plan->stages; st++)
        peak.host = mem_host_total(&sp.stages[st]) > peak.host ? mem_host_total(&sp.stages[st]) : peak.host;
    free(sp.stages);
    return peak;
}

static void print_heading(const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks, int dp) {
    int P = plan->stages;
    printf("memory plan per rank, nothing allocated: L=%d C=%d NH=%d V=%d | %s | %d rank%s (%d stage%s x %d replica%s x %d "
           "tensor rank%s%s), ZeRO-%d, -r %d | b=%d t=%d ga=%d\n",
           s->L, s->C, s->NH, s->V, dtype_name(cfg->precision), ranks, ranks > 1 ? "s" : "", P, P > 1 ? "s" : "", dp,
           dp > 1 ? "s" : "", plan->tp, plan->tp > 1 ? "s" : "", cfg->sequence_parallel ? ", -sp" : "", cfg->zero_stage,
           cfg->recompute, cfg->B, cfg->T, cfg->grad_accum);
    char shape[300];
    shape_describe(s, shape, sizeof(shape));
    printf("model: %s, %zu parameters (%zu with the padded vocabulary rows)\n", shape,
           shape_real_param_count(s), shape_param_count(s));
}

void print_memory_plan(StatePlanner states, const Config* cfg, const PipelinePlan* plan, const ModelShape* s, int ranks) {
    int P = plan->stages, dp = plan_replicas(plan, ranks);
    grid_check_hpz(cfg->hpz, dp);
    qwz_check_ranks(cfg->qw && cfg->zero_stage == 3, dp);
    qgz_check(cfg->qg, cfg->zero_stage, dp);
    StagePlans sp = plan_stages(states, cfg, plan, s, dp);
    const MemLedger* plans = sp.stages;
    const MemLedger* m = &plans[0];
    print_heading(cfg, plan, s, ranks, dp);
    if (P > 1) printf("stage 0 (embeddings, the most micro-batches in flight):\n");
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++)   // host categories are empty without -offload, disk without -nvme
        if (mem_category_shown((MemCategory)c, config_uses_host(cfg), cfg->nvme_dir != NULL))
            printf("  %-12s %10.3f GiB\n", mem_category_name((MemCategory)c), gib(m->bytes[c]));
    printf("  %-12s %10.3f GiB\n", config_uses_host(cfg) ? "device total" : "total", gib(mem_total(m)));
    if (config_uses_host(cfg)) printf("  %-12s %10.3f GiB\n", "host total", gib(mem_host_total(m)));
    if (cfg->nvme_dir) printf("  %-12s %10.3f GiB\n", "disk total", gib(mem_disk_total(m)));
    for (int st = 1; st < P; st++) {
        printf("stage %d%s: %.3f GiB (activations %.3f GiB)", st, st == P - 1 ? " (LM head)" : "", gib(mem_total(&plans[st])),
               gib(plans[st].bytes[MEM_ACTIVATIONS]));
        if (config_uses_host(cfg)) printf(", host %.3f GiB", gib(mem_host_total(&plans[st])));
        if (cfg->nvme_dir) printf(", disk %.3f GiB", gib(mem_disk_total(&plans[st])));
        printf("\n");
    }
    if (P > 1) printf("heaviest stage: %.3f GiB (the table below; per-stage bytes in plan_stages)\n", gib(sp.heaviest));
    if (cfg->nvme_dir) print_disk_room(cfg, plans, P);
    print_table(states, cfg, plan, s, ranks);
    print_json("plan: ", m);
    printf("\n");
    if (P > 1) {
        printf("plan_stages: [");
        for (int st = 0; st < P; st++) print_json(st ? ", " : "", &plans[st]);
        printf("]\n");
    }
    if (cfg->gpu_mem_gib > 0) print_capacity(states, cfg, s, ranks);
    if (cfg->gpu_mem_gib > 0) print_longest_sequences(states, cfg, s, ranks);
    free(sp.stages);
}
