// flags.c: the flag table and what reads a row (parsing, formatting, -h). See flags.h.
#include "core/run/flags.h"

#include <errno.h>
#include <math.h>

#include "base/common.h"
#include "core/zero/nvme_store.h"

// Enum fields are read and written as int (memcpy): each must be int-sized.
_Static_assert(sizeof(WsdShape) == sizeof(int) && sizeof(WarmupType) == sizeof(int), "an enum flag's field is not int-sized");
_Static_assert(sizeof(LrSchedule) == sizeof(int) && sizeof(LongDocs) == sizeof(int) && sizeof(DType) == sizeof(int) && sizeof(ScheduleKind) == sizeof(int) &&
                   sizeof(CommKind) == sizeof(int) && sizeof(ContextMode) == sizeof(int), "an enum flag's field is not int-sized");
// The defaults below are text; the code that compares against these constants must see the same values.
_Static_assert(NVME_CHUNK_DEFAULT == 1048576, "-nvme-chunk's default in the table differs from NVME_CHUNK_DEFAULT");
_Static_assert((int)COMM_WATCHDOG_DEFAULT == 300, "-wd's default in the table differs from COMM_WATCHDOG_DEFAULT");

#define STR_(x) #x
#define STR(x) STR_(x)
#define HELP_INDENT 12
#define HELP_WIDTH 112

// A row's type follows its field's C type; GCC gives an enum without negative values unsigned int.
#define TYPE_OF(x) \
    _Generic(((Config*)0)->x, const char*: FLAG_STRING, int: FLAG_INT, long long: FLAG_LONG, uint64_t: FLAG_U64, \
             float: FLAG_FLOAT, unsigned int: FLAG_ENUM)
#define FIELD(x) .field = offsetof(Config, x), .type = TYPE_OF(x)
#define RANGE(lo, hi) .range = {lo, hi, 0}
#define NAMES(list) .names = list, .name_count = (int)(sizeof(list) / sizeof(list[0]))
#define RECORD(kind_, key_, at_) .resume = {.kind = kind_, .key = key_, .at = at_}
#define BIG (double)(1LL << 40)
#define STEPS (double)(1 << 30)
#define WIDE (double)(1 << 20)

static const char* const SCHEDULES[] = {[LR_COSINE] = "cosine", [LR_LINEAR] = "linear", [LR_CONSTANT] = "constant", [LR_WSD] = "wsd",
                                        [LR_WARMUP] = "warmup", [LR_WARMUP_DECAY] = "warmup-decay", [LR_ONECYCLE] = "onecycle",
                                        [LR_COSINE_RESTARTS] = "cosine-restarts", [LR_POLYNOMIAL] = "polynomial"};
static const char* const WSD_SHAPES[] = {[WSD_LINEAR] = "linear", [WSD_ONE_MINUS_SQRT] = "1-sqrt"};
static const char* const WARMUP_TYPES[] = {[WARMUP_LOG] = "log", [WARMUP_LINEAR] = "linear"};
static const char* const PRECISIONS[] = {[DT_FP32] = "fp32", [DT_BF16] = "bf16", [DT_FP16] = "fp16"};
static const char* const OPTIMIZERS[] = {[OPTIMIZER_ADAMW] = "adamw", [OPTIMIZER_ADAM1BIT] = "adam1bit"};
static const char* const PIPE_SCHEDULES[] = {[SCHEDULE_1F1B] = "1f1b", [SCHEDULE_INTERLEAVED] = "interleaved", [SCHEDULE_ZB] = "zb"};
static const char* const LONG_DOCS[] = {[LONG_DROP] = "drop", [LONG_TRUNCATE] = "truncate"};
static const char* const CONTEXT_MODES[] = {[CP_ULYSSES] = "ulysses", [CP_RING] = "ring"};
static const char* const COMMS[] = {[COMM_AUTO] = NULL, [COMM_MPI] = "mpi", [COMM_NCCL] = "nccl"};

// -ga and -d both set the accumulation steps: config.c refuses the two together.
static int parse_grad_accum(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (!flag_parse_typed(f, c, v, why, size)) return 0;
    c->grad_accum_set = 1;
    return 1;
}

// Without -p the build chooses (fp32 on the CPU, bf16 on the GPU), once the backend is known.
static int parse_precision(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (!flag_parse_typed(f, c, v, why, size)) return 0;
    c->precision_set = 1;
    return 1;
}

static int parse_pipe_schedule(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (flag_parse_typed(f, c, v, why, size)) return 1;
    return set_why(why, size, "-ps %s: the schedule must be 1f1b, interleaved or zb", v);
}

// -hpz N, or "host": the data-parallel ranks of one host (config_resolve_hpz).
static int parse_hpz(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (!strcmp(v, "host")) {
        c->hpz = HPZ_HOST;
        return 1;
    }
    return flag_parse_typed(f, c, v, why, size);
}

// MIN,MAX,STEPS: 0 < MIN < MAX, STEPS >= 2 (the first step is at MIN, the last at MAX).
static int parse_lr_range(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    char* end;
    errno = 0;
    double lo = strtod(v, &end), hi = end[0] == ',' ? strtod(end + 1, &end) : NAN;
    long steps = end[0] == ',' && end[1] >= '0' && end[1] <= '9' ? strtol(end + 1, &end, 10) : -1;
    if (errno || *end || !isfinite(lo) || !isfinite(hi) || steps < 0)
        return set_why(why, size, "%s %s: expected MIN,MAX,STEPS (learning rates, then a step count)", f->name, v);
    if (!(lo > 0.0) || hi > 10.0) return set_why(why, size, "%s %s: the rates must lie in (0, 10]", f->name, v);
    if (!(lo < hi)) return set_why(why, size, "%s %s: MIN %g must be below MAX %g", f->name, v, lo, hi);
    if (steps < 2 || steps > (1 << 30)) return set_why(why, size, "%s %s: STEPS must be 2..%d", f->name, v, 1 << 30);
    c->lr_range = v;
    c->range_test.min = (float)lo, c->range_test.max = (float)hi, c->range_test.steps = (int)steps;
    return 1;
}

// 0 is the default (no LoRA); given, the rank must be at least 1.
static int parse_lora(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (!flag_parse_typed(f, c, v, why, size)) return 0;
    if (c->lora.rank < 1) return set_why(why, size, "-lora %s: the rank must be at least 1 (leave -lora out to train every parameter)", v);
    return 1;
}

// Here rather than at comm_select, so the error comes before any device or data work.
static int parse_comm(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    if (!flag_parse_typed(f, c, v, why, size)) return 0;
    if (c->comm == COMM_NCCL && !backend_build_is_gpu())
        return set_why(why, size, "-comm nccl needs the GPU build (train_gpt); this is the CPU build");
    if (c->comm == COMM_NCCL && !comm_nccl_built())
        return set_why(why, size, "-comm nccl: this train_gpt was built without NCCL (rebuild with make NCCL=1 NCCL_HOME=DIR)");
    return 1;
}

static void record_steps(const RunFacts* run, char* out, size_t size) { snprintf(out, size, "%d", run->max_steps); }

static void record_tokens_per_step(const RunFacts* run, char* out, size_t size) {
    snprintf(out, size, "%lld", run->tokens_per_step);
}

// Under -dpu every evaluation, sample and checkpoint lands the update in flight at once, so their cadence
// decides which steps see fresh parameters; without -dpu they only observe ("-").
static void record_landing(const Config* c, int every, char* out, size_t size) {
    if (c->delay_from > 0) snprintf(out, size, "%d", every);
    else snprintf(out, size, "-");
}

static void record_dpu_val_every(const RunFacts* run, char* out, size_t size) {
    const Config* c = run->cfg;
    int validates = c->val_pattern && c->val_pattern[0] && c->val_every > 0;   // as the trainer opens -j
    record_landing(c, validates ? c->val_every : 0, out, size);
}

static void record_dpu_sample_every(const RunFacts* run, char* out, size_t size) {
    record_landing(run->cfg, run->cfg->sample_every, out, size);
}

static void record_dpu_ckpt_every(const RunFacts* run, char* out, size_t size) {
    record_landing(run->cfg, run->cfg->ckpt_every, out, size);
}

#define DATA "data and files"
#define BATCH "batch"
#define OPTIM "optimization"
#define EVAL "evaluation, sampling, checkpoints"
#define PARALLEL "precision and parallelism"
#define PLANNING "planning"
#define TESTING "testing"

const Flag FLAGS[] = {
    {DATA, "-i", "GLOB", FIELD(train_pattern), .def = "data/kjv/kjv_train_*.bin", .help = "training token shards",
     RECORD(RESUME_OTHER, "train", 4)},
    {DATA, "-j", "GLOB", FIELD(val_pattern), .def = "data/kjv/kjv_val_*.bin", .help = "validation token shards (\"\" for none)"},
    // The data order of a document dataset depends on them (the rows, hence the windows and their labels).
    {DATA, "-pack", "0|1", FIELD(pack), RANGE(0, 1), .def = "1",
     .help = "a document dataset (a .mask file beside each shard, from scripts/tokenize.py --chat): 1 packs whole "
             "documents into rows of -t tokens (best fit; each document attends only to itself, positions restart at "
             "it, only its labelled tokens are trained); 0 reads -b*-t token windows of the stream, cutting documents "
             "where rows end. Counts printed at start. Plain shards are always read as windows. The CUDA kernels of "
             "documents have not yet run on a GPU, only under the kernel emulator",
     .resume = {RESUME_OTHER, "pack", 20, ABSENT_DEFAULT, NULL, NULL}},
    {DATA, "-long", NULL, FIELD(long_docs), NAMES(LONG_DOCS), .def = "drop",
     .help = "with -pack 1: a document longer than -t is left out (drop) or keeps its first -t tokens (truncate); "
             "counted at start",
     .resume = {RESUME_OTHER, "long", 21, ABSENT_DEFAULT, NULL, NULL}},
    {DATA, "-docmask", "0|1", FIELD(docmask), RANGE(0, 1), .def = "0",
     .help = "plain shards: 1 makes every occurrence of the tokenizer's document-start token (GPT-2's 50256 without a "
             "tokenizer file, a tokenizer.json's BOS or end-of-text) begin a document that attends only to itself, "
             "positions restarting there; every token stays trained. A document dataset is always read so",
     .resume = {RESUME_OTHER, "docmask", 22, ABSENT_DEFAULT, NULL, NULL}},
    {DATA, "-e", "MODEL", FIELD(model), .def = "d12",
     .help = "d12|d24|d36|d48 (GPT-2 124M/350M/774M/1558M), L<n>C<n>H<n>[V<n>][T<n>] (custom, e.g. L4C256H4), a "
             "Llama-family shape (smollm2-135m, smollm2-360m, smollm2-1.7b, llama3.2-1b, llama3.2-3b, llama3.1-8b, "
             "qwen3-0.6b, qwen3-1.7b, or llama:L<n>,C<n>,H<n>,F<n> followed by any of ,K<kv_heads> ,D<head_size> ,V<n> "
             ",T<n> ,theta<x> ,eps<x> ,tied ,qknorm ,qkvbias ,rope-linear:<f> ,rope-llama3:<f>/<low>/<high>/<original>, "
             "each field once, one scaling), or a model file to start from. The Llama family's RMSNorm, RoPE, SwiGLU "
             "and grouped-query attention CUDA kernels have not yet run on a GPU, only under the kernel emulator (make "
             "test-emu)"},
    {DATA, "-o", "DIR", FIELD(out_dir),
     .help = "output directory, created with its parents: log.jsonl, its numbers also as TensorBoard events (tb/) and "
             "CSVs (csv/), and checkpoints; one run at a time"},
    {DATA, "-tk", "FILE", FIELD(tokenizer), .def_shown = "whichever of the two is beside the shards",
     .help = "tokenizer for decoding samples and encoding -prompt and -chat: llm.c's gpt2_tokenizer.bin or a Hugging Face "
             "tokenizer.json"},

    {BATCH, "-b", "N", FIELD(B), RANGE(1, WIDE), .def = "4", .help = "micro-batch size in sequences"},
    {BATCH, "-t", "N", FIELD(T), RANGE(1, WIDE), .def = "1024", .help = "sequence length",
     RECORD(RESUME_FIXED, "seq_len", 1)},   // another -t cuts the token stream into other windows
    {BATCH, "-ga", "N", FIELD(grad_accum), RANGE(1, WIDE), .def = "1", .parse = parse_grad_accum,
     .help = "gradient accumulation micro-steps per step"},
    // Steps index the data: another number of tokens per step skips or repeats tokens.
    {BATCH, "-d", "N", FIELD(total_batch), RANGE(1, BIG), .def_shown = "unset: -ga decides",
     .help = "tokens per step; sets -ga = N / (b * t * data-parallel ranks)",
     .resume = {RESUME_FIXED, "tokens_per_step", 0, ABSENT_REFUSED, "b*t*ga*replicas", record_tokens_per_step}},

    {OPTIM, "-x", "N", FIELD(max_steps), RANGE(-1, STEPS), .def = "-1", .help = "steps; -1: one epoch of the training data",
     .resume = {RESUME_SCHEDULE, "steps", 6, ABSENT_REFUSED, NULL, record_steps}},
    {OPTIM, "-l", "F", FIELD(lr), RANGE(0, 10), .def = "3e-4", .help = "peak learning rate", RECORD(RESUME_SCHEDULE, "lr", 7)},
    {OPTIM, "-u", "N", FIELD(warmup), RANGE(0, STEPS), .def = "0", .help = "warm-up steps", RECORD(RESUME_SCHEDULE, "warmup", 8)},
    {OPTIM, "-q", "F", FIELD(final_lr_frac), RANGE(0, 1), .def = "1.0", .help = "final learning rate as a fraction of -l",
     RECORD(RESUME_SCHEDULE, "final_lr_frac", 9)},
    {OPTIM, "-k", NULL, FIELD(schedule), NAMES(SCHEDULES), .def = "cosine",
     .help = "learning-rate schedule (docs/flags.md has each formula; step s is 0-based, l is -l): cosine, linear, "
             "constant after -u steps of warm-up l(s+1)/u, down to l*q; wsd: that warm-up, flat, then the last "
             "-wsd-decay of the steps down to l*q; warmup / warmup-decay: DeepSpeed's WarmupLR / WarmupDecayLR "
             "(max(2,u) steps from -warmup-min-lr to l, then flat / linear to 0 at -x); onecycle: DeepSpeed's OneCycle "
             "between -cycle-min-lr and l, beta1 cycled between -cycle-max-mom and -cycle-min-mom; cosine-restarts "
             "/ polynomial: Hugging Face's cosine_with_restarts (-cycles) / polynomial decay (-power, -lr-end), after "
             "-u steps of warm-up l s/u",
     RECORD(RESUME_SCHEDULE, "schedule", 10)},
#define SCHEDULE_OPTION(key, at) .resume = {RESUME_SCHEDULE, key, at, ABSENT_DEFAULT, NULL, NULL}
    {OPTIM, "-wsd-decay", "F", FIELD(sched.wsd_decay), .range = {0, 1, FLAG_LO_OPEN}, .def = "0.2",
     .help = "-k wsd: the share of -x the decay takes (its last round(F*x) steps, at least 1)", SCHEDULE_OPTION("wsd_decay", 23)},
    {OPTIM, "-wsd-shape", NULL, FIELD(sched.wsd_shape), NAMES(WSD_SHAPES), .def = "linear",
     .help = "-k wsd: the decay, with p rising to 1 over it: linear 1-p or 1-sqrt(p)", SCHEDULE_OPTION("wsd_shape", 24)},
    {OPTIM, "-warmup-type", NULL, FIELD(sched.warmup_type), NAMES(WARMUP_TYPES), .def = "log",
     .help = "-k warmup|warmup-decay: DeepSpeed's warmup_type, ln(s+1)/ln(W) or s/W of the way up", SCHEDULE_OPTION("warmup_type", 25)},
    {OPTIM, "-warmup-min-lr", "F", FIELD(sched.warmup_min_lr), RANGE(0, 10), .def = "0",
     .help = "-k warmup|warmup-decay: DeepSpeed's warmup_min_lr (warmup_max_lr is -l)", SCHEDULE_OPTION("warmup_min_lr", 26)},
    {OPTIM, "-cycle-min-lr", "F", FIELD(sched.cycle_min_lr), RANGE(0, 10), .def = "0",
     .help = "-k onecycle: cycle_min_lr, where the cycle starts and ends (cycle_max_lr is -l)", SCHEDULE_OPTION("cycle_min_lr", 27)},
    {OPTIM, "-cycle-first", "N", FIELD(sched.cycle_first), RANGE(1, STEPS), .def = "2000",
     .help = "-k onecycle: cycle_first_step_size, the steps up", SCHEDULE_OPTION("cycle_first", 28)},
    {OPTIM, "-cycle-second", "N", FIELD(sched.cycle_second), RANGE(0, STEPS), .def = "0",
     .help = "-k onecycle: cycle_second_step_size, the steps down; 0: -cycle-first", SCHEDULE_OPTION("cycle_second", 29)},
    {OPTIM, "-decay-step", "N", FIELD(sched.decay_step), RANGE(0, STEPS), .def = "0",
     .help = "-k onecycle: decay_step_size after the cycle; 0: no decay (the lr stays at -cycle-min-lr, beta1 at "
             "-cycle-max-mom)", SCHEDULE_OPTION("decay_step", 30)},
    {OPTIM, "-decay-lr-rate", "F", FIELD(sched.decay_lr_rate), RANGE(0, 1e6), .def = "0",
     .help = "-k onecycle: decay_lr_rate, lr = cycle_min_lr / (1 + rate * d / decay_step) d steps after the cycle",
     SCHEDULE_OPTION("decay_lr_rate", 31)},
    {OPTIM, "-cycle-mom", "0|1", FIELD(sched.cycle_momentum), RANGE(0, 1), .def = "1",
     .help = "-k onecycle: cycle_momentum, AdamW's beta1 moving against the lr (logged as beta1); 0: -beta1 throughout",
     SCHEDULE_OPTION("cycle_momentum", 32)},
    {OPTIM, "-cycle-min-mom", "F", FIELD(sched.cycle_min_mom), .range = {0, 1, FLAG_HI_OPEN}, .def = "0.8",
     .help = "-k onecycle: cycle_min_mom, beta1 at the lr's peak", SCHEDULE_OPTION("cycle_min_mom", 33)},
    {OPTIM, "-cycle-max-mom", "F", FIELD(sched.cycle_max_mom), .range = {0, 1, FLAG_HI_OPEN}, .def = "0.9",
     .help = "-k onecycle: cycle_max_mom, beta1 at the cycle's ends", SCHEDULE_OPTION("cycle_max_mom", 34)},
    {OPTIM, "-decay-mom-rate", "F", FIELD(sched.decay_mom_rate), RANGE(0, 1e6), .def = "0",
     .help = "-k onecycle: decay_mom_rate, beta1 = cycle_max_mom * (1 + rate * d / decay_step) after the cycle (an "
             "error once it reaches 1)", SCHEDULE_OPTION("decay_mom_rate", 35)},
    {OPTIM, "-cycles", "N", FIELD(sched.cycles), RANGE(1, WIDE), .def = "1",
     .help = "-k cosine-restarts: num_cycles, the cosine's hard restarts", SCHEDULE_OPTION("cycles", 36)},
    {OPTIM, "-power", "F", FIELD(sched.power), .range = {0, 1000, FLAG_LO_OPEN}, .def = "1",
     .help = "-k polynomial: the decay's power", SCHEDULE_OPTION("power", 37)},
    {OPTIM, "-lr-end", "F", FIELD(sched.lr_end), RANGE(0, 10), .def = "1e-7",
     .help = "-k polynomial: lr_end, the rate at -x (below -l)", SCHEDULE_OPTION("lr_end", 38)},
#undef SCHEDULE_OPTION
    {OPTIM, "-lr-range", "MIN,MAX,STEPS", FIELD(lr_range), .parse = parse_lr_range,
     .help = "learning-rate range test, DeepSpeed's LRRangeTest (continuous, step size 1): STEPS steps at lr MIN + "
             "(MAX-MIN) s/(STEPS-1), stopping after a step whose loss is not finite or above 4x the lowest before it; "
             "then prints loss and smoothed loss (bias-corrected average, weight 0.9) against lr and suggests a tenth "
             "of the lr where the smoothed loss is lowest (logged as lr_range; scripts/plot.py --lr-range plots it). "
             "Sets -x; writes no checkpoint; no -k, -l, -u, -q"},
    {OPTIM, "-c", "F", FIELD(weight_decay), RANGE(0, 10), .def = "0.0", .help = "AdamW weight decay on 2-D tensors",
     RECORD(RESUME_OTHER, "weight_decay", 11)},
    {OPTIM, "-beta1", "F", FIELD(adam_beta1), .range = {0, 1, FLAG_HI_OPEN}, .def = "0.9",
     .help = "AdamW's decay rate of the running mean of the gradient (m)",
     .resume = {RESUME_OTHER, "adam_beta1", 17, ABSENT_DEFAULT, NULL, NULL}},
    {OPTIM, "-beta2", "F", FIELD(adam_beta2), .range = {0, 1, FLAG_HI_OPEN}, .def = "0.95",
     .help = "AdamW's decay rate of the running mean of the squared gradient (v)",
     .resume = {RESUME_OTHER, "adam_beta2", 18, ABSENT_DEFAULT, NULL, NULL}},
    {OPTIM, "-eps", "F", FIELD(adam_eps), .range = {0, 1, FLAG_LO_OPEN}, .def = "1e-8",
     .help = "AdamW's term added to the root of v in the update's denominator",
     .resume = {RESUME_OTHER, "adam_eps", 19, ABSENT_DEFAULT, NULL, NULL}},
    {OPTIM, "-gc", "F", FIELD(grad_clip), RANGE(0, 1e9), .def = "1.0", .help = "clip the global gradient norm to F; 0 = off",
     RECORD(RESUME_OTHER, "grad_clip", 12)},
    {OPTIM, "-opt", NULL, FIELD(optimizer), NAMES(OPTIMIZERS), .def = "adamw",
     .help = "optimizer: adamw; adam1bit: DeepSpeed's 1-bit Adam under any -z and precision, AdamW for -freeze steps, "
             "then the variance frozen and the momentum all-reduced as signs and scales with error feedback (-gc does "
             "not apply after the freeze; no -pp, -tp, -cp, -lora, -dpu, -nvme)",
     .resume = {RESUME_FIXED, "optimizer", 40, ABSENT_DEFAULT, NULL, NULL}},   // adam1bit's error files
    {OPTIM, "-freeze", "S", FIELD(freeze_step), RANGE(0, STEPS), .def = "0", .def_shown = "unset",
     .help = "-opt adam1bit: its exact AdamW warm-up steps, at most the run's steps",
     .resume = {RESUME_OTHER, "freeze_step", 41, ABSENT_DEFAULT, NULL, NULL}},
    {OPTIM, "-ls", "F", FIELD(loss_scale), RANGE(1, 1e30), .def = "65536",
     .help = "initial fp16 loss scale; dynamic: halves after 2 overflows, doubles after 1000 clean steps"},
    {OPTIM, "-nf", "N", FIELD(max_nonfinite), RANGE(1, STEPS), .def = "5",
     .help = "stop with an error after N non-finite steps in a row; each is skipped on every rank (with fp16, counted "
             "once the loss scale is at its minimum 1)"},

    {EVAL, "-v", "N", FIELD(val_every), RANGE(0, STEPS), .def = "20", .help = "validation loss every N steps; 0 = off",
     .resume = {RESUME_OTHER, "dpu_val_every", 14, ABSENT_UNKNOWN, "-v (with -dpu)", record_dpu_val_every}},
    {EVAL, "-m", "N", FIELD(val_batches), RANGE(1, STEPS), .def = "20", .help = "validation batches"},
    {EVAL, "-hs", "FILE", FIELD(hellaswag),
     .help = "HellaSwag accuracy at each -v step from an evaluation file of scripts/prepare_hellaswag.py: per example, "
             "the ending of lowest mean loss per token (llm.c's acc_norm); examples longer than -t are left out and "
             "counted at start"},
    {EVAL, "-s", "N", FIELD(sample_every), RANGE(0, STEPS), .def = "20", .help = "sample text every N steps; 0 = off",
     .resume = {RESUME_OTHER, "dpu_sample_every", 15, ABSENT_UNKNOWN, "-s (with -dpu)", record_dpu_sample_every}},
    {EVAL, "-g", "N", FIELD(gen_tokens), RANGE(1, WIDE), .def = "64", .help = "tokens per sample"},
    {EVAL, "-prompt", "TEXT", FIELD(prompt),
     .help = "generate -g tokens after TEXT with -e's model, printing them as they come, then exit (no training; "
             "encoded with the tokenizer.json, or gpt2_merges.bin beside gpt2_tokenizer.bin; seeded by -seed)"},
    {EVAL, "-chat", "TEXT", FIELD(chat),
     .help = "answer TEXT, a user's message, with -e's model, then exit: the conversation is rendered with the pieces of "
             "its chat template in chat_format.json beside the tokenizer (scripts/tokenize.py --chat writes it), "
             "encoded (special tokens become their ids), and up to -g tokens are sampled with -temp, -topk and -seed; "
             "the reply ends at the template's end-of-turn token (or the tokenizer's document start), which is not "
             "printed. Only the reply is printed"},
    {EVAL, "-chat-file", "FILE", FIELD(chat_file),
     .help = "the conversation before -chat's message (or, alone, the whole conversation to answer): one message per "
             "line, {\"role\": \"system\"|\"user\"|\"assistant\", \"content\": \"...\"}; blank lines skipped; it ends "
             "with a user's message"},
    {EVAL, "-chat-ids", "0|1", FIELD(chat_ids), RANGE(0, 1), .def = "0",
     .help = "with -chat or -chat-file: also print the rendered conversation's ids (\"prompt: N tokens [...]\") before "
             "the reply and the reply's ids, its end token included (\"ids: [...]\"), after it"},
    {EVAL, "-temp", "F", FIELD(temperature), RANGE(0, 100), .def = "1",
     .help = "sampling temperature, 0 = always the most likely token"},
    {EVAL, "-topk", "K", FIELD(top_k), RANGE(0, WIDE), .def = "0", .help = "sample among the K most likely tokens only; 0 = all"},
    {EVAL, "-lb", "N", FIELD(breakdown_every), RANGE(0, STEPS), .def = "0",
     .help = "every N steps, time per phase (data, forward, backward, pipeline wait, grad reduce, optimizer; with -pp "
             "each stage's split too), synchronizing the device on those steps only; 0 = off"},
    {EVAL, "-n", "N", FIELD(ckpt_every), RANGE(0, STEPS), .def = "0",
     .help = "checkpoint every N steps into -o; 0 = only at the end",
     .resume = {RESUME_OTHER, "dpu_ckpt_every", 16, ABSENT_UNKNOWN, "-n (with -dpu)", record_dpu_ckpt_every}},
    {EVAL, "-y", "0|1|2", FIELD(resume), RANGE(0, 2), .def = "0",
     .help = "1: resume from the newest complete checkpoint in -o (an older one when a newer one is damaged; step 0 "
             "when there is none); refuses flags that change the run's results (-x, -l, -u, -q, -k and its options -wsd-decay, -wsd-shape, "
             "-warmup-type, -warmup-min-lr, -cycle-min-lr, -cycle-first, -cycle-second, -decay-step, -decay-lr-rate, "
             "-cycle-mom, -cycle-min-mom, -cycle-max-mom, -decay-mom-rate, -cycles, -power, -lr-end, -c, -beta1, "
             "-beta2, -eps, -gc, -freeze, -qw, -qg, -i, -sh, -pack, -long, -docmask, -lora-dropout, -dpu, and with -dpu -v, -s, -n); 2: "
             "resume with those changes, each printed"},
    {EVAL, "-ow", "0|1", FIELD(start_over), RANGE(0, 1), .def = "0",
     .help = "start over in an -o that holds an earlier run: delete its log and checkpoints. Without it a fresh run "
             "(-y 0) refuses such a directory"},
    {EVAL, "-sh", "0|1", FIELD(shuffle), RANGE(0, 1), .def = "0", .help = "shuffle the training windows each epoch",
     RECORD(RESUME_OTHER, "shuffle", 5)},
    {EVAL, "-seed", "N", FIELD(seed), RANGE(0, BIG), .def = "1337",
     .help = "random seed for initialization, shuffling and sampling",
     RECORD(RESUME_FIXED, "seed", 2)},   // shuffling and stochastic rounding follow it

    {PARALLEL, "-p", NULL, FIELD(precision), NAMES(PRECISIONS), .parse = parse_precision,
     .def_shown = "fp32 on the CPU build, bf16 on the GPU build",
     .help = "storage, fp32 master weights; fp16 with dynamic loss scaling",
     RECORD(RESUME_FIXED, "precision", 3)},   // the state files hold the working copy in this dtype
    {PARALLEL, "-z", "N", FIELD(zero_stage), RANGE(0, 3), .def = "0", .help = "ZeRO stage 0..3"},
    {PARALLEL, "-hpz", "N|host", FIELD(hpz), RANGE(1, 1024), .parse = parse_hpz, .def = "1",
     .help = "with -z 3 (ZeRO++'s hierarchical partition): each rank also keeps 1/N of every unit's parameters, taken from "
             "the unit's first gather after an update (over all data-parallel ranks); the unit's later gathers (the "
             "backward's) run inside N consecutive data-parallel ranks, one host's when N is the ranks per host (host: "
             "that N, from the launched ranks' hosts). N must divide the data-parallel size. 1: off. Same results bit "
             "for bit"},
    {PARALLEL, "-qw", "0|1", FIELD(qw), RANGE(0, 1), .def = "0",
     .help = "with -z 3 (ZeRO++'s quantized weights): the parameter gathers over the data-parallel ranks send int8 "
             "with one fp32 scale per 64 elements (17/16 bytes per parameter) and every rank computes with the "
             "dequantized values, each within 1/254 of its block's largest; the master weights stay exact. Needs 2 or "
             "more data-parallel ranks",
     .resume = {RESUME_OTHER, "qw", 42, ABSENT_DEFAULT, NULL, NULL}},
    {PARALLEL, "-qg", "0|1", FIELD(qg), RANGE(0, 1), .def = "0",
     .help = "with -z 2 or 3 (ZeRO++'s quantized gradients): each unit's gradient reduce-scatter becomes int4 blocks of 64 "
             "(9/16 byte per element) sent through an all-to-all inside each host, summed, requantized and sent through "
             "an all-to-all across hosts, with each rank's quantization error fed back into its next gradient; units "
             "with pieces under 256 elements stay exact. Needs 2 or more data-parallel ranks",
     .resume = {RESUME_OTHER, "qg", 43, ABSENT_DEFAULT, NULL, NULL}},   // and qgz_rank<r>.bin's errors
    {PARALLEL, "-pp", "N", FIELD(pipeline_stages), RANGE(1, 1024), .def = "1",
     .help = "pipeline stages; ranks form N stages x ranks/N data-parallel replicas"},
    {PARALLEL, "-ps", NULL, FIELD(pipe_schedule), NAMES(PIPE_SCHEDULES), .parse = parse_pipe_schedule, .def = "1f1b",
     .help = "pipeline schedule: 1f1b | interleaved (with -vp V model chunks per rank: bubble (P-1)/(V m)) | zb (zero "
             "bubble, ZB-H1: weight gradients deferred into the bubble)"},
    {PARALLEL, "-vp", "V", FIELD(virtual_stages), RANGE(1, MAX_CHUNKS), .def_shown = "2 under -ps interleaved, else 1",
     .help = "with -ps interleaved: virtual stages per rank, 2.." STR(MAX_CHUNKS)},
    {PARALLEL, "-tp", "N", FIELD(tensor_parallel), RANGE(1, 1024), .def = "1",
     .help = "tensor parallelism: N neighbouring ranks share each block, Megatron-style (heads and the MLP split; N "
             "divides the heads); ranks form stages x replicas x N"},
    {PARALLEL, "-sp", "0|1", FIELD(sequence_parallel), RANGE(0, 1), .def = "0",
     .help = "with -tp: sequence parallelism; LayerNorms and residual adds on each rank's b*t/N rows, all-reduces "
             "become reduce-scatter + all-gather, stages send 1/N of the activations"},
    {PARALLEL, "-cp", "N", FIELD(context_parallel), RANGE(1, 1024), .def = "1",
     .help = "context parallelism: N neighbouring ranks share each sequence, rank c holding positions [c t/N, (c+1) t/N) "
             "(N divides -t; -cpm ring: two chunks); ranks form stages x replicas x N context ranks x tensor ranks; gradients reduce and ZeRO "
             "shards over replicas x N; inside -tp (and -sp) each tensor rank's heads are shared; composes with documents. "
             "Not yet with -lora-dropout or -dump"},
    {PARALLEL, "-cpm", NULL, FIELD(context_mode), NAMES(CONTEXT_MODES), .def = "ulysses",
     .help = "with -cp: ulysses (DeepSpeed's: before attention an all-to-all turns each rank's t/N positions of every "
             "head into every position of heads/N, after it one turns them back; N divides the heads, and divides the kv "
             "heads or is a multiple of them, each kv head then copied; under -tp a tensor rank's heads) | ring (ring "
             "attention with Megatron's causal balance: rank c holds chunks c and 2N-1-c of 2N of t/(2N) positions, 2N "
             "divides -t; k|v pass round the ring, partial results merged by log-sum-exp; no head split)"},
    {PARALLEL, "-r", "N", FIELD(recompute), RANGE(0, 3), .def = "0",
     .help = "activation recompute: 0 keep all, 1 GELU, 2 + attention and LayerNorms, 3 whole blocks"},
    {OPTIM, "-lora", "R", FIELD(lora.rank), RANGE(0, WIDE), .def = "0", .def_shown = "off", .parse = parse_lora,
     .help = "LoRA: freeze -e's model (no master, no optimizer state, no gradient) and train rank-R adapters A (R x in) "
             "and B (out x R) on each target linear layer, out += scale * x A^T B^T; A starts Kaiming-uniform, B at zero, "
             "so step 0 is the base model's. Checkpoints hold the adapters, their state and the base's path and CRC-32. "
             "One rank, data parallelism with -z 0..3, -tp and -sp (the adapters split as their layers), -pp with every -ps, "
             "-offload 1|2, -nvme and -dpu"},
    {OPTIM, "-lora-alpha", "A", FIELD(lora.alpha), RANGE(0, BIG), .def_shown = "R",
     .help = "with -lora: the adapters' scale is A / R (A / sqrt(R) with -lora-rslora 1)"},
    {OPTIM, "-lora-rslora", "0|1", FIELD(lora.rslora), RANGE(0, 1), .def = "0", .help = "with -lora: 1 scales by A / sqrt(R) (rsLoRA)"},
    {OPTIM, "-lora-dropout", "P", FIELD(lora.dropout), RANGE(0, 1), .def = "0",
     .help = "with -lora: in training, each element of each adapter's input is dropped with probability P and the rest "
             "scaled by 1 / (1 - P), the mask a hash of -seed, the micro-batch's place in the data, the layer and target; "
             "its CUDA kernel has not yet run on a GPU, only under the kernel emulator",
     .resume = {RESUME_OTHER, "lora_dropout", 39, ABSENT_DEFAULT, NULL, NULL}},
    {OPTIM, "-lora-targets", "LIST", FIELD(lora.targets), .def_shown = "all",
     .help = "with -lora: the layers to adapt, comma-separated: GPT-2's qkv,proj,fc,fcproj; Llama's q,k,v,o,gate,up,down"},
    {OPTIM, "-lora-init", "FILE|DIR", FIELD(lora_init),
     .help = "with -lora: start the adapters from FILE (the trainer's adapter file, docs/formats.md) or DIR (a Hugging Face "
             "PEFT adapter folder: adapter_config.json, adapter_model.safetensors): its rank, layers, targets, alpha and "
             "rsLoRA must be the run's"},
    {PARALLEL, "-offload-act", "0|1", FIELD(offload_act), RANGE(0, 1), .def = "0",
     .help = "1 (with -r 3): the blocks' inputs, which -r 3 keeps to recompute each block from, in host memory (pinned "
             "on the GPU build) but the stage's first input and its output: each copied down after its block's forward "
             "and up one block ahead of its backward, overlapped with the blocks on the GPU build (ZeRO-R's CPU "
             "checkpointing; compiled for the GPU, not yet run on one). Same results bit for bit"},
    {PARALLEL, "-offload", "0|1|2", FIELD(offload), RANGE(0, 2), .def = "0",
     .help = "1: keep each rank's fp32 master weights and Adam m, v (its pieces with -z >= 1) in host memory (pinned on "
             "the GPU build); the optimizer runs there on the downloaded gradient and uploads the new parameters. 2 (-z 2 "
             "or 3): also accumulate the gradient pieces on the host, each unit's as its reduce-scatter ends, and with -z "
             "3 keep the parameter pieces there, uploaded for each gather. Same results bit for bit"},
    {PARALLEL, "-dpu", "W", FIELD(delay_from), RANGE(0, STEPS), .def = "0",
     .help = "with -offload: from step W on, run each step's host update while the device computes the next step, "
             "which uses the parameters before it (ZeRO-Offload's delayed parameter update; updates land one step "
             "late, and land at once before each checkpoint, evaluation and the end). 0: off",
     .resume = {RESUME_OTHER, "delayed_update", 13, ABSENT_UNKNOWN, NULL, NULL}},
    {PARALLEL, "-nvme", "DIR", FIELD(nvme_dir),
     .help = "with -offload: keep each rank's fp32 master and Adam m, v (and with -offload 2 -z 3 its parameter "
             "pieces) in files under DIR/gpt-nvme-rank<r> instead of host memory, streamed through " STR(NVME_BUFFERS)
             " host buffers with O_DIRECT reads and writes on worker threads (ZeRO-Infinity's NVMe offload; node-local "
             "storage; one run per DIR; the files are scratch, removed at the end). Same results bit for bit. Not yet "
             "run on a GPU, only under the kernel emulator"},
    {PARALLEL, "-nvme-chunk", "E", FIELD(nvme_chunk), RANGE(NVME_CHUNK_ALIGN, (double)(1 << 30)), .def = "1048576",
     .help = "with -nvme: elements per disk transfer and checksum, a multiple of " STR(NVME_CHUNK_ALIGN)},
    {PARALLEL, "-comm", NULL, FIELD(comm), NAMES(COMMS), .parse = parse_comm,
     .def_shown = "nccl on the GPU build with NCCL when every rank has its own GPU, else mpi",
     .help = "what moves GPU buffers in the collectives. nccl needs one GPU per rank; mpi stages through host memory "
             "and lets ranks share a GPU"},
    {PARALLEL, "-wd", "S", FIELD(watchdog), RANGE(0, 1e6), .def = "300",
     .help = "hang watchdog: a rank that waits longer than S seconds for the others (in a collective, send or "
             "receive) ends the job, non-zero, with one line naming the rank that stopped answering and the operation "
             "the waiting rank was in; x" STR(COMM_WATCHDOG_LONG) " during start-up (checkpoint load, model "
             "initialization), checkpoints, evaluation and the end of the run. S must exceed the longest work between "
             "two collectives of a step; 0 = off. MPI only: NCCL's collectives are not watched"},

    {PLANNING, "--estimate", NULL, .field = offsetof(Config, estimate), .type = FLAG_SWITCH,
     .help = "print each rank's memory per category (and a table across ZeRO stages and world sizes) for these flags "
             "without allocating anything, then exit"},
    {PLANNING, "--autotune", NULL, .field = offsetof(Config, autotune), .type = FLAG_SWITCH,
     .help = "search the layouts of -w ranks (-z, -offload, -r, -offload-act, -pp with each -ps, -tp, -sp, -cp, and every -b x -ga x replicas "
             "split of the global batch, b*ga*t*w tokens or -d's) that the trainer accepts and whose plan fits -gpu-mem "
             "(and -host-mem), time the cheapest few by a cost model for a few steps each (mpirun -np N on this binary), "
             "print a table and the fastest's command line, and write them to autotune.json in -o (or the current "
             "directory); run in one process, without mpirun. The searched flags may not be given"},
    {PLANNING, "-autotune-trials", "K", FIELD(autotune_trials), RANGE(1, 1000), .def_shown = "4",
     .help = "with --autotune: the layouts timed"},
    {PLANNING, "-autotune-steps", "S", FIELD(autotune_steps), RANGE(2, 1000), .def_shown = "4",
     .help = "with --autotune: steps per timed layout; the first is warm-up, the rest are averaged"},
    {PLANNING, "-w", "N", FIELD(plan_ranks), RANGE(1, WIDE), .def_shown = "the ranks it is launched on (1 with --autotune)",
     .help = "world size for --estimate or --autotune"},
    {PLANNING, "-gpu-mem", "G", FIELD(gpu_mem_gib), RANGE(0.001, 1e6),
     .help = "with --estimate: also the largest shape of -e's family (GPT-2/GPT-3 124M..175B; SmolLM2 and Llama 3.x "
             "135M..405B) whose states and activations fit G GiB of device memory per rank, for each ZeRO stage, "
             "-offload and -r; with -lora, each with the run's adapters on its frozen base; and -e's longest -t per -cp and -r "
             "(and -offload-act) under the run's -z. With --autotune: the device "
             "memory per rank that each layout's plan must fit"},
    {PLANNING, "-host-mem", "G", FIELD(host_mem_gib), RANGE(0.001, 1e6),
     .help = "with -gpu-mem: that table's shapes (or --autotune's layouts) must also fit G GiB of host memory per rank"},
    {PLANNING, "-disk-mem", "G", FIELD(disk_mem_gib), RANGE(0.001, 1e9),
     .help = "with -gpu-mem: also rows for -offload with -nvme, whose state files fit G GiB of disk per rank"},

    {TESTING, "-dump", "DIR", FIELD(dump_dir),
     .help = "write step 0's logits and gradients (fp32) for comparison with scripts/reference.py"},
    {TESTING, "-h", NULL, .type = FLAG_HELP, .help = "this help (also --help)"},
};
const int FLAG_COUNT = (int)(sizeof(FLAGS) / sizeof(FLAGS[0]));

const Flag* flag_find(const char* name) {
    if (!strcmp(name, "--help")) name = "-h";
    for (int i = 0; i < FLAG_COUNT; i++)
        if (!strcmp(FLAGS[i].name, name)) return &FLAGS[i];
    return NULL;
}

// A plain decimal: an optional '-', digits, and for a real number an optional fraction and exponent.
// strtod alone would also take " 1", "+1", "0x1p3" and "1e", strtoll " 1" and "+1": typos, not numbers.
static int is_decimal(const char* s, int real) {
    static const char* digits = "0123456789";
    const char* p = s + (*s == '-');
    size_t whole = strspn(p, digits), frac = 0;
    p += whole;
    if (real && *p == '.') {
        frac = strspn(++p, digits);
        p += frac;
    }
    if (whole + frac == 0) return 0;
    if (real && (*p == 'e' || *p == 'E')) {
        p += 1 + (p[1] == '-' || p[1] == '+');
        size_t exp = strspn(p, digits);
        if (exp == 0) return 0;
        p += exp;
    }
    return *p == '\0';
}

static int parse_integer(const Flag* f, const char* s, long long* out, char* why, size_t size) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!is_decimal(s, 0) || errno || end == s || *end) return set_why(why, size, "flag %s expects an integer, got '%s'", f->name, s);
    long long lo = (long long)f->range.lo, hi = (long long)f->range.hi;
    if (v < lo || v > hi) return set_why(why, size, "flag %s = %lld is outside %lld..%lld", f->name, v, lo, hi);
    *out = v;
    return 1;
}

static int parse_number(const Flag* f, const char* s, float* out, char* why, size_t size) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (!is_decimal(s, 1) || errno || end == s || *end || !isfinite(v))
        return set_why(why, size, "flag %s expects a number, got '%s'", f->name, s);
    const FlagRange* r = &f->range;
    int below = r->open & FLAG_LO_OPEN ? v <= r->lo : v < r->lo;
    int above = r->open & FLAG_HI_OPEN ? v >= r->hi : v > r->hi;
    if (!r->open && (below || above)) return set_why(why, size, "flag %s = %g is outside %g..%g", f->name, v, r->lo, r->hi);
    if (below || above)
        return set_why(why, size, "flag %s = %g is outside %c%g, %g%c", f->name, v, r->open & FLAG_LO_OPEN ? '(' : '[', r->lo,
                       r->hi, r->open & FLAG_HI_OPEN ? ')' : ']');
    *out = (float)v;
    return 1;
}

// "a|b|c": the names a value may take.
static void join_names(const Flag* f, char* out, size_t size) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < f->name_count; i++) {
        if (!f->names[i]) continue;
        int w = snprintf(out + used, size - used, "%s%s", used ? "|" : "", f->names[i]);
        if (w < 0 || used + (size_t)w >= size) return;
        used += (size_t)w;
    }
}

static int parse_enum(const Flag* f, void* at, const char* v, char* why, size_t size) {
    for (int i = 0; i < f->name_count; i++)
        if (f->names[i] && !strcmp(f->names[i], v)) return memcpy(at, &i, sizeof i), 1;
    char names[256];
    join_names(f, names, sizeof(names));
    return set_why(why, size, "flag %s expects %s, got '%s'", f->name, names, v);
}

// An integer into its field's width; the range check already kept it within.
static void store_integer(const Flag* f, void* at, long long v) {
    int i = (int)v;
    uint64_t u = (uint64_t)v;
    if (f->type == FLAG_INT) memcpy(at, &i, sizeof i);
    else if (f->type == FLAG_U64) memcpy(at, &u, sizeof u);
    else memcpy(at, &v, sizeof v);
}

int flag_parse_typed(const Flag* f, Config* c, const char* v, char* why, size_t size) {
    void* at = (char*)c + f->field;
    long long i = 0;
    float x = 0.0f;
    switch (f->type) {
        case FLAG_STRING: memcpy(at, &v, sizeof v); return 1;
        case FLAG_INT:
        case FLAG_LONG:
        case FLAG_U64:
            if (!parse_integer(f, v, &i, why, size)) return 0;
            store_integer(f, at, i);
            return 1;
        case FLAG_FLOAT:
            if (!parse_number(f, v, &x, why, size)) return 0;
            memcpy(at, &x, sizeof x);
            return 1;
        case FLAG_ENUM: return parse_enum(f, at, v, why, size);
        default: return set_why(why, size, "flag %s takes no value", f->name);
    }
}

int flag_parse(const Flag* f, Config* c, const char* value, char* why, size_t size) {
    return f->parse ? f->parse(f, c, value, why, size) : flag_parse_typed(f, c, value, why, size);
}

// The shortest decimal form that reads back as the same float: 0.0003, not 0.000300000014.
static void format_float(char* out, size_t size, float v) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, size, "%.*g", digits, v);
        if (strtof(out, NULL) == v) return;
    }
}

void flag_format(const Flag* f, const Config* c, char* out, size_t size) {
    const void* at = (const char*)c + f->field;
    const char* s;
    int i;
    long long l;
    uint64_t u;
    float x;
    switch (f->type) {
        case FLAG_STRING: memcpy(&s, at, sizeof s), snprintf(out, size, "%s", s ? s : ""); break;
        case FLAG_INT: case FLAG_SWITCH: memcpy(&i, at, sizeof i), snprintf(out, size, "%d", i); break;
        case FLAG_LONG: memcpy(&l, at, sizeof l), snprintf(out, size, "%lld", l); break;
        case FLAG_U64: memcpy(&u, at, sizeof u), snprintf(out, size, "%llu", (unsigned long long)u); break;
        case FLAG_FLOAT: memcpy(&x, at, sizeof x), format_float(out, size, x); break;
        case FLAG_ENUM:
            memcpy(&i, at, sizeof i);
            snprintf(out, size, "%s", i >= 0 && i < f->name_count && f->names[i] ? f->names[i] : "");
            break;
        default: snprintf(out, size, "%s", "");
    }
}

void flag_record_value(const Flag* f, const RunFacts* run, char* out, size_t size) {
    if (f->resume.value) f->resume.value(run, out, size);
    else flag_format(f, run->cfg, out, size);
}

const char* flag_label(const Flag* f) { return f->resume.label ? f->resume.label : f->name; }

// text, word by word, at HELP_INDENT up to HELP_WIDTH, beside the flag's name (which ends at column col)
// when the name leaves room, else from the next line.
static void print_wrapped(FILE* out, int col, const char* text) {
    if (col < HELP_INDENT) fprintf(out, "%*s", HELP_INDENT - col, "");
    else fprintf(out, "\n%*s", HELP_INDENT, "");
    col = HELP_INDENT;
    int first = 1;
    for (const char* p = text; *p;) {
        int w = (int)strcspn(p, " ");
        if (!first && col + 1 + w > HELP_WIDTH) fprintf(out, "\n%*s", HELP_INDENT, ""), col = HELP_INDENT, first = 1;
        if (!first) fputc(' ', out), col++;
        fwrite(p, 1, (size_t)w, out);
        col += w, first = 0;
        p += w + (p[w] == ' ');
    }
    fputc('\n', out);
}

static void print_row(FILE* out, const Flag* f) {
    char arg[256], text[4096], def[256] = "";
    if (f->arg) snprintf(arg, sizeof(arg), " %s", f->arg);
    else if (f->type == FLAG_ENUM) arg[0] = ' ', join_names(f, arg + 1, sizeof(arg) - 1);
    else arg[0] = '\0';
    if (f->def_shown) snprintf(def, sizeof(def), " (default %s)", f->def_shown);
    else if (f->def) snprintf(def, sizeof(def), " (default %s)", f->def);
    else if (f->type == FLAG_STRING || f->type == FLAG_FLOAT) snprintf(def, sizeof(def), " (default none)");
    snprintf(text, sizeof(text), "%s%s", f->help, def);
    print_wrapped(out, fprintf(out, "  %s%s", f->name, arg), text);
}

void flags_print_usage(FILE* out, const char* prog) {
    fprintf(out, "usage: %s [flags]\n", prog);
    for (int i = 0; i < FLAG_COUNT; i++) {
        if (!i || strcmp(FLAGS[i].group, FLAGS[i - 1].group)) fprintf(out, "%s\n", FLAGS[i].group);
        print_row(out, &FLAGS[i]);
    }
    fprintf(out, "environment\n");
    print_wrapped(out, fprintf(out, "  GPT_CUDA_VARIANTS=a,b"),
                  "opt-in CUDA kernel variants, none yet run on a GPU (all but cudnn_attention under the kernel emulator, "
                  "make test-emu): cudnn_attention (cuDNN's fused attention), bias_grad_epilogue (cuBLASLt's bias "
                  "gradient in 16 bits), lt_plan_cache / lt_autotune (cuBLASLt plans kept per shape / timed), "
                  "norm_one_pass (one-pass LayerNorm/RMSNorm backward), adamw_multi (AdamW and the norm in a few "
                  "launches). The CPU build accepts the names and changes nothing (default: none)");
}
