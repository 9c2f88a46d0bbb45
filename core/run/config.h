// config.h: the command line, in llm.c's flag style. Each field is set by a row of flags.c's table, which
// holds its name, default, range, help and resume rule. Parsing validates every value; a bad flag is a
// one-line error and exit 1.
#pragma once
#include "core/model/lora.h"
#include <stdint.h>

#include "core/comm/comm.h"
#include "core/pipeline/schedule.h"
#include "kernels/kernels.h"

// -k. After the three originals (their values are recorded by name, so the order only keeps the table's).
typedef enum {
    LR_COSINE, LR_LINEAR, LR_CONSTANT,
    LR_WSD,               // warmup, stable, decay over the last -wsd-decay of the steps
    LR_WARMUP,            // DeepSpeed's WarmupLR
    LR_WARMUP_DECAY,      // DeepSpeed's WarmupDecayLR
    LR_ONECYCLE,          // DeepSpeed's OneCycle, with AdamW's beta1 cycled
    LR_COSINE_RESTARTS,   // Hugging Face's cosine_with_restarts
    LR_POLYNOMIAL,        // Hugging Face's polynomial decay
    LR_SCHEDULE_COUNT
} LrSchedule;
typedef enum { WSD_LINEAR, WSD_ONE_MINUS_SQRT } WsdShape;
// -opt: AdamW, or 1-bit Adam (core/zero/onebit_adam.h: AdamW for -freeze steps, then compressed momentum).
typedef enum { OPTIMIZER_ADAMW, OPTIMIZER_ADAM1BIT } OptimizerChoice;
typedef enum { WARMUP_LOG, WARMUP_LINEAR } WarmupType;

// The options of the schedules after the originals (core/run/lr_schedule.c).
typedef struct {
    float wsd_decay;          // -wsd-decay: the share of the steps the decay takes
    WsdShape wsd_shape;       // -wsd-shape
    WarmupType warmup_type;   // -warmup-type: DeepSpeed's warmup_type
    float warmup_min_lr;      // -warmup-min-lr: DeepSpeed's warmup_min_lr
    float cycle_min_lr;       // -cycle-min-lr (cycle_max_lr is -l)
    int cycle_first;          // -cycle-first: cycle_first_step_size
    int cycle_second;         // -cycle-second: cycle_second_step_size (0: -cycle-first)
    int decay_step;           // -decay-step: decay_step_size (0: no decay after the cycle)
    float decay_lr_rate;      // -decay-lr-rate
    int cycle_momentum;       // -cycle-mom
    float cycle_min_mom;      // -cycle-min-mom
    float cycle_max_mom;      // -cycle-max-mom
    float decay_mom_rate;     // -decay-mom-rate
    int cycles;               // -cycles: Hugging Face's num_cycles
    float power;              // -power
    float lr_end;             // -lr-end
} LrOptions;
typedef enum { LONG_DROP, LONG_TRUNCATE } LongDocs;   // -long: a document longer than -t in a packed dataset
typedef enum { CP_ULYSSES, CP_RING } ContextMode;      // -cpm: how the context ranks of -cp share attention

typedef struct {
    // data and files
    const char* train_pattern;   // -i
    const char* val_pattern;     // -j
    const char* model;           // -e  d12|d24|d36|d48, L<n>C<n>H<n>[V<n>][T<n>], or a model file
    const char* out_dir;         // -o
    const char* tokenizer;       // -tk (default: gpt2_tokenizer.bin beside the training shards)
    const char* dump_dir;        // -dump: step 0's logits and gradients, for the reference tests
    int pack;                    // -pack: 1 a document dataset's documents packed whole into rows; 0 stream windows
    LongDocs long_docs;          // -long drop|truncate
    int docmask;                 // -docmask: plain shards read as documents at the tokenizer's document-start token
    // batch
    int B;                       // -b micro-batch size
    int T;                       // -t sequence length
    int grad_accum;              // -ga micro-steps per step
    long long total_batch;       // -d tokens per step (sets -ga); 0 = unset
    // optimization
    int max_steps;               // -x (-1: one epoch)
    float lr;                    // -l
    int warmup;                  // -u
    float final_lr_frac;         // -q
    LrSchedule schedule;         // -k
    LrOptions sched;             // the options of -k's newer schedules
    const char* lr_range;        // -lr-range MIN,MAX,STEPS as given (core/run/lr_range.h); NULL: none
    struct {
        float min, max;
        int steps;               // 0: no range test
    } range_test;                // -lr-range's values
    float weight_decay;          // -c
    float adam_beta1;            // -beta1
    float adam_beta2;            // -beta2
    float adam_eps;              // -eps
    float grad_clip;             // -gc (0: off)
    OptimizerChoice optimizer;   // -opt
    int freeze_step;             // -freeze: 1-bit Adam's exact warm-up steps (0: not given)
    float loss_scale;            // -ls initial fp16 loss scale
    int max_nonfinite;           // -nf stop after this many non-finite steps in a row
    // evaluation, sampling, checkpoints
    int val_every;               // -v (0: off)
    int val_batches;             // -m
    const char* hellaswag;       // -hs: an evaluation file (scripts/prepare_hellaswag.py) scored at each -v
    int sample_every;            // -s (0: off)
    int breakdown_every;         // -lb: time per phase every N steps (0: off)
    int gen_tokens;              // -g
    const char* prompt;          // -prompt: generate -g tokens after this text with -e's model, then exit
    const char* chat;            // -chat: a user's message, answered with the chat template's pieces, then exit
    const char* chat_file;       // -chat-file: the conversation before it, one message per line (core/run/chat.h)
    int chat_ids;                // -chat-ids: also print the conversation's ids and the reply's
    float temperature;           // -temp: sampling temperature; 0 = the most likely token (default 1)
    int top_k;                   // -topk: sample among the k most likely tokens; 0 = all
    int ckpt_every;              // -n (0: only at the end)
    int resume;                  // -y: 0 fresh, 1 resume, 2 resume accepting changed hyperparameters
    int start_over;              // -ow: delete an earlier run's log and checkpoints in -o first
    int shuffle;                 // -sh
    uint64_t seed;               // -seed
    // precision and parallelism
    int precision_set;           // -p given?
    int grad_accum_set;          // -ga given? (-d sets it otherwise)
    DType precision;             // -p fp32|bf16|fp16
    int zero_stage;              // -z
    int hpz;                     // -hpz: with -z 3, ranks per secondary group (ZeRO++'s hpZ); 1: none; HPZ_HOST until
                                 // config_resolve_hpz
    int qw;                      // -qw 1: with -z 3, the weight gathers send int8 blocks (ZeRO++'s qwZ)
    int qg;                      // -qg 1: with -z 2/3, the gradient reduce-scatter sends int4 blocks (ZeRO++'s qgZ)
    int pipeline_stages;         // -pp
    ScheduleKind pipe_schedule;  // -ps: the pipeline schedule (core/pipeline/schedule.h)
    int virtual_stages;          // -vp: model chunks per rank under -ps interleaved (1 otherwise)
    int tensor_parallel;         // -tp: ranks sharing each block (Megatron's tensor parallelism)
    int sequence_parallel;       // -sp: with -tp, the regions between the parallel layers split by rows
    int context_parallel;        // -cp: ranks sharing each sequence, each holding t / cp of its positions
    ContextMode context_mode;    // -cpm: ulysses (all-to-all of q, k, v to whole sequences of heads / cp)
    int recompute;               // -r
    LoraOptions lora;            // -lora R (0: off), -lora-alpha, -lora-rslora, -lora-dropout, -lora-targets
    const char* lora_init;       // -lora-init: an adapter file to start from (lora.h)
    int offload;                 // -offload: 1 each rank's fp32 master and Adam state in host memory, 2 also
                                 // its gradient pieces (-z >= 2) and parameter pieces (-z 3)
    int offload_act;             // -offload-act: with -r 3 the blocks' inputs in host memory (act_offload.h)
    int delay_from;              // -dpu: from this step on each update lands one step late (0: never)
    const char* nvme_dir;        // -nvme: with -offload, the state (and with -offload 2 -z 3 the parameter pieces)
                                 // in files under this directory instead of host memory; NULL: none
    long long nvme_chunk;        // -nvme-chunk: elements per disk transfer and checksum
    CommKind comm;               // -comm (COMM_AUTO unless given)
    float watchdog;              // -wd: seconds a rank may wait for the others before the job ends (0: never)
    // planning
    int estimate;                // --estimate: print the memory plan and exit
    int plan_ranks;              // -w: world size to plan for (default: the launched world)
    float gpu_mem_gib;           // -gpu-mem: device memory per rank for --estimate's table or --autotune (0: none)
    float host_mem_gib;          // -host-mem: host memory per rank for that table or --autotune (0: unlimited)
    float disk_mem_gib;          // -disk-mem: disk per rank for that table's -nvme rows (0: no such rows)
    int autotune;                // --autotune: search the layouts that fit -gpu-mem, time the cheapest, print the fastest
    int autotune_trials;         // -autotune-trials: layouts timed (0: not given, 4)
    int autotune_steps;          // -autotune-steps: steps per timed layout, the first one warm-up (0: not given, 4)
} Config;

// -chat or -chat-file: answer a conversation.
int config_chats(const Config* cfg);
// -prompt or a chat: generate from -e's model and exit, without data or a run directory.
int config_generates(const Config* cfg);
// -offload or -offload-act: the run keeps memory on the host (its categories are shown, its room checked).
int config_uses_host(const Config* cfg);
// With -cp 2 or more: the first flag given that context parallelism is not built for yet ("-tp"), or NULL.
const char* config_context_unbuilt(const Config* c);
// With -lora: the layout the adapters are not built for yet ("-nvme with -offload 2 -z 3"), or NULL.
const char* config_lora_unbuilt(const Config* cfg);
// Every flag's default (flags.c).
void config_defaults(Config* cfg);
// Parses argv into cfg. Prints usage and exits 0 on -h.
void config_parse(Config* cfg, int argc, char** argv);
// -p's default where it was not given: bf16 on the GPU build, fp32 on the CPU build.
void config_resolve_precision(Config* cfg);
// -hpz host: the data-parallel ranks of one host, ranks_per_host / (tensor ranks), every host alike (the
// launched world's, `world`; --estimate, which launches none, takes an N). A one-line error otherwise.
#define HPZ_HOST (-1)
void config_resolve_hpz(Config* cfg, Comm* world);
// -t against the model's maxT, and -ga from -d once the world is known: -d sets -ga from the data-parallel
// replicas, ranks / per_replica (stages x tensor ranks). One-line errors.
void config_resolve_batch(Config* cfg, int maxT, int ranks, int per_replica);
// -opt adam1bit's -freeze step (0 under AdamW), and whether step s is past it: the group exchanges 1-bit
// momentum instead of reducing gradients (core/zero/onebit_adam.h). The check: the freeze falls in the run.
static inline int config_freeze(const Config* c) { return c->optimizer == OPTIMIZER_ADAM1BIT ? c->freeze_step : 0; }
static inline int config_onebit_exchanges(const Config* c, int step) { return config_freeze(c) && step >= c->freeze_step; }
void config_check_freeze(const Config* c, int steps);
// The run's steps: -x, or (-x -1) one epoch of epoch_steps steps of `tokens` tokens, checked against -x's range
// and -freeze.
int config_resolve_steps(const Config* c, long long epoch_steps, long long tokens);
// Learning rate at step (0-based) of max_steps under -k's schedule (core/run/lr_schedule.c).
float config_lr_at(const Config* cfg, int step, int max_steps);
// AdamW's beta1 at step: -beta1, except under -k onecycle with -cycle-mom 1.
float config_beta1_at(const Config* cfg, int step, int max_steps);
