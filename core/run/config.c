// config.c: the parse loop over flags.c's table and the checks across flags (the learning-rate schedule's
// formulas: lr_schedule.c).
// See config.h.
#include "core/run/config.h"

#include <limits.h>
#include <math.h>

#include "base/common.h"
#include "core/run/flags.h"
#include "core/zero/nvme_store.h"
#include "core/zero/qgz.h"

void config_defaults(Config* c) {
    memset(c, 0, sizeof(*c));
    char why[512];
    for (int i = 0; i < FLAG_COUNT; i++)
        if (FLAGS[i].def && !flag_parse_typed(&FLAGS[i], c, FLAGS[i].def, why, sizeof(why)))
            fail("the flag table's default of %s does not parse: %s", FLAGS[i].name, why);
}

static void check_nvme(const Config* c) {
    if (c->nvme_dir && !c->nvme_dir[0]) fail("-nvme needs a directory name");
    if (c->nvme_dir && !c->offload)
        fail("-nvme %s keeps the optimizer state on disk instead of host memory: it needs -offload 1 or 2", c->nvme_dir);
    if (c->nvme_chunk % NVME_CHUNK_ALIGN) fail("-nvme-chunk %lld is not a multiple of %d", c->nvme_chunk, NVME_CHUNK_ALIGN);
    if (c->nvme_chunk != (long long)NVME_CHUNK_DEFAULT && !c->nvme_dir) fail("-nvme-chunk sizes the transfers of -nvme: give -nvme DIR");
    if (c->disk_mem_gib > 0 && !(c->gpu_mem_gib > 0)) fail("-disk-mem needs -gpu-mem (the table is per device budget)");
}

// What -lora does not compose with yet, for the one-line refusal and --estimate's tables: ZeRO-3's parameter
// pieces on disk hold no frozen tensors.
const char* config_lora_unbuilt(const Config* c) {
    if (!c->lora.rank) return NULL;
    return c->zero_stage == 3 && c->offload == 2 && c->nvme_dir ? "-nvme with -offload 2 -z 3" : NULL;
}

// LoRA's options need -lora; what it does not compose with yet is refused by name, as is a dropout other than 0.
// Which schedules read each option: an option changed from its default under another -k is an error, not
// a flag quietly ignored.
static const struct {
    const char* flag;
    unsigned schedules;   // bit per LrSchedule
} SCHEDULE_OPTIONS[] = {
    {"-wsd-decay", 1u << LR_WSD},
    {"-wsd-shape", 1u << LR_WSD},
    {"-warmup-type", 1u << LR_WARMUP | 1u << LR_WARMUP_DECAY},
    {"-warmup-min-lr", 1u << LR_WARMUP | 1u << LR_WARMUP_DECAY},
    {"-cycle-min-lr", 1u << LR_ONECYCLE},
    {"-cycle-first", 1u << LR_ONECYCLE},
    {"-cycle-second", 1u << LR_ONECYCLE},
    {"-decay-step", 1u << LR_ONECYCLE},
    {"-decay-lr-rate", 1u << LR_ONECYCLE},
    {"-cycle-mom", 1u << LR_ONECYCLE},
    {"-cycle-min-mom", 1u << LR_ONECYCLE},
    {"-cycle-max-mom", 1u << LR_ONECYCLE},
    {"-decay-mom-rate", 1u << LR_ONECYCLE},
    {"-cycles", 1u << LR_COSINE_RESTARTS},
    {"-power", 1u << LR_POLYNOMIAL},
    {"-lr-end", 1u << LR_POLYNOMIAL},
};

// -lr-range sets the rate and the steps itself, and its weights are not worth a checkpoint.
static void check_range_test(const Config* c, const Config* def) {
    static const char* const SETS_ITSELF[] = {"-k", "-l", "-u", "-q", "-x"};
    char given[64], dflt[64];
    for (size_t i = 0; i < sizeof(SETS_ITSELF) / sizeof(SETS_ITSELF[0]); i++) {
        const Flag* f = flag_find(SETS_ITSELF[i]);
        flag_format(f, c, given, sizeof(given));
        flag_format(f, def, dflt, sizeof(dflt));
        if (strcmp(given, dflt)) fail("-lr-range %s sets the learning rate and the steps itself: drop %s", c->lr_range, f->name);
    }
    if (c->resume || c->ckpt_every) fail("-lr-range %s writes no checkpoint: drop %s", c->lr_range, c->resume ? "-y" : "-n");
}

// -k's options and -lr-range against -k: an option of another schedule changed from its default, or a flag the
// range test sets itself, is an error.
static void check_schedule(const Config* c) {
    Config def;
    config_defaults(&def);
    if (c->range_test.steps) check_range_test(c, &def);
    const Flag* k = flag_find("-k");
    char name[64], given[64], dflt[64];
    flag_format(k, c, name, sizeof(name));
    for (size_t i = 0; i < sizeof(SCHEDULE_OPTIONS) / sizeof(SCHEDULE_OPTIONS[0]); i++) {
        const Flag* f = flag_find(SCHEDULE_OPTIONS[i].flag);
        if (!f) fail("internal: the schedule option %s has no row in the flag table", SCHEDULE_OPTIONS[i].flag);
        flag_format(f, c, given, sizeof(given));
        flag_format(f, &def, dflt, sizeof(dflt));
        if (strcmp(given, dflt) && !(SCHEDULE_OPTIONS[i].schedules >> c->schedule & 1u))
            fail("%s %s shapes another schedule than -k %s (see -h)", f->name, given, name);
    }
    const LrOptions* o = &c->sched;
    if (c->schedule == LR_POLYNOMIAL && !(o->lr_end < c->lr)) fail("-k polynomial: -lr-end %g must be below -l %g", o->lr_end, c->lr);
    if (c->schedule == LR_ONECYCLE && !(o->cycle_min_lr <= c->lr))
        fail("-k onecycle: -cycle-min-lr %g must not exceed -l %g (the cycle's peak)", o->cycle_min_lr, c->lr);
    if (c->schedule == LR_ONECYCLE && o->cycle_momentum && !(o->cycle_min_mom <= o->cycle_max_mom))
        fail("-k onecycle: -cycle-min-mom %g must not exceed -cycle-max-mom %g", o->cycle_min_mom, o->cycle_max_mom);
}

static void check_offload_act(const Config* c) {
    if (c->offload_act && c->recompute != 3)
        fail("-offload-act 1 keeps the blocks' inputs, all that -r 3 keeps, in host memory: it needs -r 3 (at -r %d the "
             "blocks keep more)", c->recompute);
}

static void check_lora(const Config* c) {
    if (!c->lora.rank) {
        if (c->lora.alpha > 0 || c->lora.rslora || c->lora.dropout > 0 || c->lora.targets || c->lora_init)
            fail("%s sets up LoRA's adapters: it needs -lora R",
                 c->lora.alpha > 0 ? "-lora-alpha" : c->lora.rslora ? "-lora-rslora" : c->lora.dropout > 0 ? "-lora-dropout"
                 : c->lora.targets ? "-lora-targets" : "-lora-init");
        return;
    }
    const char* flag = config_lora_unbuilt(c);
    if (flag) fail("%s: not yet with -lora", flag);
    if (c->lora.targets && !c->lora.targets[0]) fail("-lora-targets needs a list of targets");
    if (c->lora_init && !c->lora_init[0]) fail("-lora-init needs a file or folder name");
}

// What -cp does not compose with yet, for the one-line refusal: each needs its own context-parallel path (the
// adapters' dropout by position, one rank's whole logits).
const char* config_context_unbuilt(const Config* c) {
    if (c->context_parallel < 2) return NULL;
    if (c->lora.dropout > 0) return "-lora-dropout";   // its masks are drawn by the element's place in the rank's rows
    if (c->dump_dir) return "-dump";
    return NULL;
}

static void check_context(const Config* c) {
    if (c->context_parallel < 2) {
        if (c->context_mode == CP_RING) fail("-cpm ring passes k|v round the context ranks: it needs -cp 2 or more");
        return;
    }
    const char* flag = config_context_unbuilt(c);
    if (flag) fail("-cp %d with %s: not yet built", c->context_parallel, flag);
    if (c->context_mode == CP_RING && c->T % (2 * c->context_parallel))
        fail("-t %d does not split into the %d chunks of -cp %d -cpm ring (2 per rank: t must be a multiple of %d)", c->T,
             2 * c->context_parallel, c->context_parallel, 2 * c->context_parallel);
    if (c->T % c->context_parallel)
        fail("-t %d does not split into -cp %d equal parts (t must be a multiple of %d)", c->T, c->context_parallel, c->context_parallel);
}

int config_chats(const Config* c) { return c->chat || c->chat_file; }
int config_generates(const Config* c) { return c->prompt || config_chats(c); }

int config_uses_host(const Config* c) { return c->offload || c->offload_act; }

// What generates, for the messages of the checks below.
static const char* generation_flag(const Config* c) { return c->prompt ? "-prompt" : c->chat ? "-chat" : "-chat-file"; }

static void check_chat(const Config* c) {
    if (c->chat && !c->chat[0]) fail("-chat needs a message");
    if (c->chat_file && !c->chat_file[0]) fail("-chat-file needs a file name");
    if (c->prompt && config_chats(c))
        fail("-prompt continues a text, %s answers a conversation: give one of them", c->chat ? "-chat" : "-chat-file");
    if (c->chat_ids && !config_chats(c)) fail("-chat-ids 1 shows a chat's ids: give -chat or -chat-file");
}

void config_check_freeze(const Config* c, int steps) {
    if (config_freeze(c) > steps) fail("-freeze %d is beyond the run's %d steps", c->freeze_step, steps);
}

int config_resolve_steps(const Config* c, long long epoch_steps, long long tokens) {
    if (c->max_steps < 0 && epoch_steps < 1)
        fail("one epoch of %s is shorter than one step (b*t*ga*replicas = %lld tokens); set -x", c->train_pattern, tokens);
    if (c->max_steps < 0 && epoch_steps > 1 << 30)   // -x's own range
        fail("one epoch of %s is %lld steps, more than %d; set -x", c->train_pattern, epoch_steps, 1 << 30);
    int steps = c->max_steps >= 0 ? c->max_steps : (int)epoch_steps;
    config_check_freeze(c, steps);
    return steps;
}

// -opt adam1bit (core/zero/onebit_adam.h) exchanges the data-parallel group's momentum in place of its
// gradient reduction: the paths that reduce or hold gradients otherwise are not built for it.
static void check_onebit(const Config* c) {
    if (c->optimizer != OPTIMIZER_ADAM1BIT) {
        if (c->freeze_step) fail("-freeze %d is 1-bit Adam's warm-up: it needs -opt adam1bit", c->freeze_step);
        return;
    }
    if (!c->freeze_step) fail("-opt adam1bit needs -freeze S >= 1: its exact AdamW steps before the variance freezes");
    if (c->max_steps >= 0) config_check_freeze(c, c->max_steps);
    const char* other = c->pipeline_stages > 1 ? "-pp" : c->tensor_parallel > 1 ? "-tp" : c->context_parallel > 1 ? "-cp"
                      : c->lora.rank ? "-lora" : c->delay_from ? "-dpu" : c->nvme_dir ? "-nvme" : c->qg ? "-qg" : NULL;
    if (other) fail("-opt adam1bit with %s: not yet built", other);
}

// Flags that mean something only beside others, and values that only together leave the supported range: an
// error rather than a flag quietly ignored or overridden.
static void check_combinations(const Config* c) {
    if (c->out_dir && !c->out_dir[0]) fail("-o needs a directory name");
    if (c->resume && !c->out_dir) fail("-y %d needs -o DIR to resume from", c->resume);
    if (c->start_over && !c->out_dir) fail("-ow 1 needs -o DIR to start over in");
    if (c->ckpt_every > 0 && !c->out_dir) fail("-n %d writes checkpoints into -o DIR: give -o", c->ckpt_every);
    if (c->total_batch && c->grad_accum_set) fail("-d and -ga both set the accumulation steps: give one of them");
    if ((long long)c->B * c->T > INT_MAX) fail("-b %d x -t %d tokens per micro-batch exceed %d", c->B, c->T, INT_MAX);
    if (c->plan_ranks && !c->estimate && !c->autotune) fail("-w %d plans a world size with --estimate or --autotune only", c->plan_ranks);
    if (c->dump_dir && c->max_steps == 0) fail("-dump writes step 0's tensors: it needs a step (-x 0 takes none)");
    if ((c->gpu_mem_gib > 0 || c->host_mem_gib > 0) && !c->estimate && !c->autotune)
        fail("-gpu-mem and -host-mem plan with --estimate or --autotune only");
    if (c->autotune && c->estimate) fail("--estimate prints one layout's plan, --autotune searches layouts: give one of them");
    if (c->autotune && !(c->gpu_mem_gib > 0)) fail("--autotune keeps the layouts that fit the device: it needs -gpu-mem G (GiB per rank)");
    if ((c->autotune_trials || c->autotune_steps) && !c->autotune) fail("-autotune-trials and -autotune-steps need --autotune");
    if (c->host_mem_gib > 0 && !(c->gpu_mem_gib > 0)) fail("-host-mem needs -gpu-mem (the table is per device budget)");
    if (config_generates(c) && c->out_dir)
        fail("%s generates from -e's model and exits: it writes no run directory (drop -o)", generation_flag(c));
    if (c->prompt && !c->prompt[0]) fail("-prompt needs some text");
    check_chat(c);
    if (c->hellaswag && !c->hellaswag[0]) fail("-hs needs an evaluation file");
    if (c->hellaswag && config_generates(c))
        fail("%s generates from -e's model and exits: it runs no evaluation (drop -hs)", generation_flag(c));
    if (c->hellaswag && c->val_every == 0) fail("-hs %s is scored at every validation step, which -v 0 turns off", c->hellaswag);
    if (c->sequence_parallel && c->tensor_parallel < 2) fail("-sp 1 splits the rows over the tensor group: it needs -tp 2 or more");
    if (c->sequence_parallel && ((long long)c->B * c->T) % c->tensor_parallel)
        fail("-sp 1: b*t = %d*%d rows do not split evenly over -tp %d ranks", c->B, c->T, c->tensor_parallel);
    if (c->delay_from > 0 && !c->offload)
        fail("-dpu %d delays the host's update behind the device's next step: it needs -offload 1 or 2", c->delay_from);
    if (c->offload == 2 && c->zero_stage < 2)
        fail("-offload 2 moves the sharded gradients (and with -z 3 the parameters) to the host: it needs -z 2 or 3, "
             "not -z %d (-offload 1 moves the optimizer state at any -z)", c->zero_stage);
    if (c->qw && c->zero_stage != 3)
        fail("-qw 1 quantizes ZeRO-3's parameter gathers: it needs -z 3, not -z %d", c->zero_stage);
    if (c->hpz == HPZ_HOST && c->zero_stage != 3)
        fail("-hpz host keeps a secondary copy of ZeRO-3's parameter pieces: it needs -z 3, not -z %d", c->zero_stage);
    if (c->qg) qgz_check(c->qg, c->zero_stage, 2);
    if (c->qg && (c->pipeline_stages > 1 || c->tensor_parallel > 1 || c->context_parallel > 1))
        fail("-qg 1 with -pp, -tp or -cp: not yet built (its error files are named by data-parallel rank alone)");
    if (c->hpz > 1 && c->zero_stage != 3)
        fail("-hpz %d keeps a secondary copy of ZeRO-3's parameter pieces: it needs -z 3, not -z %d", c->hpz, c->zero_stage);
    if (c->start_over && c->resume) fail("-ow 1 (start over) and -y %d (resume) contradict each other", c->resume);
    check_nvme(c);
    check_lora(c);
    check_onebit(c);
    check_offload_act(c);
    check_schedule(c);
    check_context(c);
}

void config_parse(Config* c, int argc, char** argv) {
    config_defaults(c);
    char why[512];
    for (int i = 1; i < argc; i += 2) {
        if (argv[i][0] != '-') fail("expected a flag, got '%s' (see -h)", argv[i]);
        const Flag* f = flag_find(argv[i]);
        if (f && f->type == FLAG_HELP) {
            flags_print_usage(stdout, argv[0]);
            flush_stdout();
            exit(0);
        }
        if (f && f->type == FLAG_SWITCH) {   // a flag without a value
            memcpy((char*)c + f->field, &(int){1}, sizeof(int));
            i--;
            continue;
        }
        if (i + 1 >= argc) fail("flag %s needs a value (see -h)", argv[i]);
        if (!f) fail("unknown flag '%s' (see -h)", argv[i]);
        if (!flag_parse(f, c, argv[i + 1], why, sizeof(why))) fail("%s", why);
    }
    if (!c->virtual_stages) c->virtual_stages = c->pipe_schedule == SCHEDULE_INTERLEAVED ? 2 : 1;
    check_combinations(c);
    if (c->range_test.steps) c->max_steps = c->range_test.steps;
}

void config_resolve_precision(Config* cfg) {
    if (!cfg->precision_set) cfg->precision = backend_build_is_gpu() ? DT_BF16 : DT_FP32;
}

// Every host must run as many ranks: sum(L)^2 = ranks sum(L^2) holds exactly then (Cauchy-Schwarz).
void config_resolve_hpz(Config* cfg, Comm* world) {
    if (cfg->hpz != HPZ_HOST) return;
    if (cfg->estimate) fail("-hpz host takes the launched ranks' hosts: --estimate needs -hpz N (the data-parallel ranks per host)");
    long long L = comm_local_size(world), sums[2] = {L, L * L};
    comm_allreduce_host_sum_i64(world, sums, 2);
    long long ranks = comm_size(world);
    if (sums[0] * sums[0] != ranks * sums[1])
        fail("-hpz host: the hosts run different numbers of ranks (%lld on this one): give -hpz N", L);
    if (L % cfg->tensor_parallel)
        fail("-hpz host: -tp %d does not divide the %lld ranks of a host", cfg->tensor_parallel, L);
    cfg->hpz = (int)(L / cfg->tensor_parallel);
}

// -d sets -ga from the data-parallel replicas, ranks / (stages x tensor ranks). When those do not divide the
// ranks there are no replicas to count: pipeline_plan, next, says so.
void config_resolve_batch(Config* cfg, int maxT, int ranks, int per_replica) {
    if (cfg->T > maxT) fail("-t %d exceeds the model's maximum sequence length %d", cfg->T, maxT);
    int dp = ranks / per_replica;
    if (cfg->total_batch && ranks % per_replica == 0) {
        long long per_micro = (long long)cfg->B * cfg->T * dp;
        if (cfg->total_batch % per_micro)
            fail("-d %lld is not a multiple of b*t*replicas = %d*%d*%d", cfg->total_batch, cfg->B, cfg->T, dp);
        long long ga = cfg->total_batch / per_micro;
        if (ga < 1 || ga > 1 << 20)   // -ga's own range, checked before the narrowing to int
            fail("-d %lld gives -ga %lld (d / (b*t*replicas = %d*%d*%d)), outside 1..%d", cfg->total_batch, ga, cfg->B,
                 cfg->T, dp, 1 << 20);
        cfg->grad_accum = (int)ga;
    }
}
