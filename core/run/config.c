// config.c: flag parsing and the learning-rate schedule. See config.h.
#include "core/run/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>

#include "base/common.h"
#include "core/zero/nvme_store.h"

void config_usage(const char* prog) {
    printf("usage: %s [flags]\n"
           "data and files\n"
           "  -i GLOB   training token shards (default data/kjv/kjv_train_*.bin)\n"
           "  -j GLOB   validation token shards (default data/kjv/kjv_val_*.bin; \"\" for none)\n"
           "  -e MODEL  d12|d24|d36|d48 (GPT-2 124M/350M/774M/1558M), L<n>C<n>H<n>[V<n>][T<n>] (custom,\n"
           "            e.g. L4C256H4), a Llama-family shape (smollm2-135m|smollm2-360m|smollm2-1.7b|llama3.2-1b|\n"
           "            llama3.2-3b|llama3.1-8b|qwen3-0.6b|qwen3-1.7b, or llama:L<n>,C<n>,H<n>,F<n>[,K<kv heads>]\n"
           "            [,D<head size>][,V<n>][,T<n>][,theta<x>][,eps<x>][,tied][,qknorm][,qkvbias][,rope-linear:<f>]\n"
           "            [,rope-llama3:<f>/<low>/<high>/<original>]; each field once, one scaling), or a model file\n"
           "            to start from (default d12).\n"
           "            The Llama family's RMSNorm, RoPE, SwiGLU and grouped-query attention CUDA kernels have not\n"
           "            yet run on a GPU, only under the kernel emulator (make test-emu)\n"
           "  -o DIR    output directory, created with its parents: log.jsonl and checkpoints; one run at a\n"
           "            time (default: none)\n"
           "  -tk FILE  tokenizer for decoding samples and encoding -prompt: llm.c's gpt2_tokenizer.bin or a Hugging Face\n"
           "            tokenizer.json (default: whichever of the two is beside the shards)\n"
           "batch\n"
           "  -b N      micro-batch size in sequences (default 4)\n"
           "  -t N      sequence length (default 1024)\n"
           "  -ga N     gradient accumulation micro-steps per step (default 1)\n"
           "  -d N      tokens per step; sets -ga = N / (b * t * data-parallel ranks)\n"
           "optimization\n"
           "  -x N      steps (default -1: one epoch of the training data)\n"
           "  -l F      peak learning rate (default 3e-4)\n"
           "  -u N      warm-up steps (default 0)\n"
           "  -q F      final learning rate as a fraction of -l (default 1.0)\n"
           "  -k S      schedule after warm-up: cosine|linear|constant (default cosine)\n"
           "  -c F      AdamW weight decay on 2-D tensors (default 0.0)\n"
           "  -gc F     clip the global gradient norm to F; 0 = off (default 1.0)\n"
           "  -ls F     initial fp16 loss scale; dynamic: halves after 2 overflows, doubles after 1000 clean\n"
           "            steps (default 65536)\n"
           "  -nf N     stop with an error after N non-finite steps in a row; each is skipped on every rank\n"
           "            (default 5; with fp16, counted once the loss scale is at its minimum 1)\n"
           "evaluation, sampling, checkpoints\n"
           "  -v N      validation loss every N steps; 0 = off (default 20)\n"
           "  -m N      validation batches (default 20)\n"
           "  -hs FILE  HellaSwag accuracy at each -v step from an evaluation file of scripts/prepare_hellaswag.py:\n"
           "            per example, the ending of lowest mean loss per token (llm.c's acc_norm); examples longer\n"
           "            than -t are left out and counted at start (default: none)\n"
           "  -s N      sample text every N steps; 0 = off (default 20)\n"
           "  -g N      tokens per sample (default 64)\n"
           "  -prompt TEXT  generate -g tokens after TEXT with -e's model, printing them as they come, then exit\n"
           "            (no training; encoded with the tokenizer.json, or gpt2_merges.bin beside gpt2_tokenizer.bin; seeded by -seed)\n"
           "  -temp F   sampling temperature, 0 = always the most likely token (default 1)\n"
           "  -topk K   sample among the K most likely tokens only; 0 = all (default 0)\n"
           "  -lb N     every N steps, time per phase (data, forward, backward, pipeline wait, grad reduce,\n"
           "            optimizer; with -pp each stage's split too),\n"
           "            synchronizing the device on those steps only; 0 = off (default 0)\n"
           "  -n N      checkpoint every N steps into -o; 0 = only at the end (default 0)\n"
           "  -y 0|1|2  1: resume from the newest complete checkpoint in -o (an older one when a newer one is\n"
           "            damaged; step 0 when there is none); refuses flags that change the run's results (-x, -l,\n"
           "            -u, -q, -k, -c, -gc, -i, -sh, -dpu, and with -dpu -v, -s, -n); 2: resume with those changes,\n"
           "            each printed (default 0)\n"
           "  -ow 0|1   start over in an -o that holds an earlier run: delete its log and checkpoints. Without it a\n"
           "            fresh run (-y 0) refuses such a directory (default 0)\n"
           "  -sh 0|1   shuffle the training windows each epoch (default 0)\n"
           "  -seed N   random seed for initialization, shuffling and sampling (default 1337)\n"
           "precision and parallelism\n"
           "  -p P      fp32|bf16|fp16 storage, fp32 master weights; fp16 with dynamic loss scaling\n"
           "            (default fp32 on the CPU build, bf16 on the GPU build)\n"
           "  -z N      ZeRO stage 0..3 (default 0)\n"
           "  -pp N     pipeline stages; ranks form N stages x ranks/N data-parallel replicas (default 1)\n"
           "  -ps S     pipeline schedule: 1f1b | interleaved (with -vp V model chunks per rank: bubble (P-1)/(V m))\n"
           "            | zb (zero bubble, ZB-H1: weight gradients deferred into the bubble) (default 1f1b)\n"
           "  -vp V     with -ps interleaved: virtual stages per rank, 2..8 (default 2)\n"
           "  -tp N     tensor parallelism: N neighbouring ranks share each block, Megatron-style (heads and the MLP\n"
           "            split; N divides the heads); ranks form stages x replicas x N (default 1)\n"
           "  -sp 0|1   with -tp: sequence parallelism; LayerNorms and residual adds on each rank's b*t/N rows,\n"
           "            all-reduces become reduce-scatter + all-gather, stages send 1/N of the activations (default 0)\n"
           "  -r N      activation recompute: 0 keep all, 1 GELU, 2 + attention and LayerNorms, 3 whole blocks (default 0)\n"
           "  -offload 0|1|2  1: keep each rank's fp32 master weights and Adam m, v (its pieces with -z >= 1) in\n"
           "            host memory (pinned on the GPU build); the optimizer runs there on the downloaded gradient and\n"
           "            uploads the new parameters. 2 (-z 2 or 3): also accumulate the gradient pieces on the host, each\n"
           "            unit's as its reduce-scatter ends, and with -z 3 keep the parameter pieces there, uploaded for\n"
           "            each gather. Same results bit for bit (default 0)\n"
           "  -dpu W    with -offload: from step W on, run each step's host update while the device computes the\n"
           "            next step, which uses the parameters before it (ZeRO-Offload's delayed parameter update;\n"
           "            updates land one step late, and land at once before each checkpoint, evaluation and the\n"
           "            end). 0: off (default 0)\n"
           "  -nvme DIR with -offload: keep each rank's fp32 master and Adam m, v (and with -offload 2 -z 3 its\n"
           "            parameter pieces) in files under DIR/gpt-nvme-rank<r> instead of host memory, streamed through\n"
           "            %d host buffers with O_DIRECT reads and writes on worker threads (ZeRO-Infinity's NVMe offload;\n"
           "            node-local storage; one run per DIR; the files are scratch, removed at the end). Same results\n"
           "            bit for bit. Not yet run on a GPU, only under the kernel emulator (default: none)\n"
           "  -nvme-chunk E  with -nvme: elements per disk transfer and checksum, a multiple of %d\n"
           "            (default %zu)\n"
           "  -comm C   mpi|nccl: what moves GPU buffers in the collectives. nccl needs one GPU per rank; mpi stages\n"
           "            through host memory and lets ranks share a GPU (default nccl on the GPU build with NCCL\n"
           "            when every rank has its own GPU, else mpi)\n"
           "  -wd S     hang watchdog: a rank that waits longer than S seconds for the others (in a collective,\n"
           "            send or receive) ends the job, non-zero, with one line naming the rank that stopped\n"
           "            answering and the operation the waiting rank was in; x%d during start-up (checkpoint load,\n"
           "            model initialization), checkpoints, evaluation and the end of the run.\n"
           "            S must exceed the longest work between two collectives of a step; 0 = off. MPI only: NCCL's\n"
           "            collectives are not watched (default 300)\n"
           "planning\n"
           "  --estimate print each rank's memory per category (and a table across ZeRO stages and world sizes)\n"
           "            for these flags without allocating anything, then exit\n"
           "  -w N      world size for --estimate (default: the ranks it is launched on)\n"
           "  -gpu-mem G, -host-mem G  with --estimate: also the largest GPT-2/GPT-3 shape whose states and\n"
           "            activations fit G GiB of device (and host) memory per rank, for each ZeRO stage, -offload and -r\n"
           "  -disk-mem G  with -gpu-mem: also rows for -offload with -nvme, whose state files fit G GiB of disk\n"
           "            per rank\n"
           "testing\n"
           "  -dump DIR write step 0's logits and gradients (fp32) for comparison with scripts/reference.py\n"
           "  -h        this help\n"
           "environment\n"
           "  GPT_CUDA_VARIANTS=a,b  opt-in CUDA kernel variants, none yet run on a GPU (all but cudnn_attention\n"
           "            under the kernel emulator, make test-emu):\n"
           "            cudnn_attention (cuDNN's fused attention), bias_grad_epilogue (cuBLASLt's bias gradient in\n"
           "            16 bits), lt_plan_cache / lt_autotune (cuBLASLt plans kept per shape / timed), norm_one_pass\n"
           "            (one-pass LayerNorm/RMSNorm backward), adamw_multi (AdamW and the norm in a few launches).\n"
           "            The CPU build accepts the names and changes nothing (default: none)\n",
           prog, NVME_BUFFERS, NVME_CHUNK_ALIGN, NVME_CHUNK_DEFAULT, COMM_WATCHDOG_LONG);
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

static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!is_decimal(s, 0) || errno || end == s || *end) fail("flag %s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) fail("flag %s = %lld is outside %lld..%lld", flag, v, lo, hi);
    return v;
}

static float parse_float(const char* flag, const char* s, double lo, double hi) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (!is_decimal(s, 1) || errno || end == s || *end || !isfinite(v)) fail("flag %s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) fail("flag %s = %g is outside %g..%g", flag, v, lo, hi);
    return (float)v;
}

static void set_defaults(Config* c) {
    memset(c, 0, sizeof(*c));
    c->train_pattern = "data/kjv/kjv_train_*.bin";
    c->val_pattern = "data/kjv/kjv_val_*.bin";
    c->model = "d12";
    c->B = 4;
    c->T = 1024;
    c->grad_accum = 1;
    c->max_steps = -1;
    c->lr = 3e-4f;
    c->final_lr_frac = 1.0f;
    c->schedule = LR_COSINE;
    c->grad_clip = 1.0f;
    c->loss_scale = 65536.0f;
    c->max_nonfinite = 5;
    c->val_every = 20;
    c->val_batches = 20;
    c->sample_every = 20;
    c->gen_tokens = 64;
    c->temperature = 1.0f;
    c->seed = 1337;
    c->precision = DT_FP32;
    c->pipeline_stages = 1;
    c->tensor_parallel = 1;
    c->virtual_stages = 0;   // 0: not given (2 under -ps interleaved, else 1)
    c->watchdog = (float)COMM_WATCHDOG_DEFAULT;
    c->nvme_chunk = (long long)NVME_CHUNK_DEFAULT;
}

static void parse_one(Config* c, const char* f, const char* v) {
    const long long BIG = 1LL << 40;
    if (!strcmp(f, "-i")) c->train_pattern = v;
    else if (!strcmp(f, "-j")) c->val_pattern = v;
    else if (!strcmp(f, "-e")) c->model = v;
    else if (!strcmp(f, "-o")) c->out_dir = v;
    else if (!strcmp(f, "-tk")) c->tokenizer = v;
    else if (!strcmp(f, "-dump")) c->dump_dir = v;
    else if (!strcmp(f, "-b")) c->B = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "-t")) c->T = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "-ga")) c->grad_accum = (int)parse_int(f, v, 1, 1 << 20), c->grad_accum_set = 1;
    else if (!strcmp(f, "-d")) c->total_batch = parse_int(f, v, 1, BIG);
    else if (!strcmp(f, "-x")) c->max_steps = (int)parse_int(f, v, -1, 1 << 30);
    else if (!strcmp(f, "-l")) c->lr = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "-u")) c->warmup = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-q")) c->final_lr_frac = parse_float(f, v, 0.0, 1.0);
    else if (!strcmp(f, "-c")) c->weight_decay = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "-gc")) c->grad_clip = parse_float(f, v, 0.0, 1e9);
    else if (!strcmp(f, "-ls")) c->loss_scale = parse_float(f, v, 1.0, 1e30);
    else if (!strcmp(f, "-nf")) c->max_nonfinite = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "-v")) c->val_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-m")) c->val_batches = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "-hs")) c->hellaswag = v;
    else if (!strcmp(f, "-s")) c->sample_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-lb")) c->breakdown_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-g")) c->gen_tokens = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "-prompt")) c->prompt = v;
    else if (!strcmp(f, "-temp")) c->temperature = parse_float(f, v, 0.0, 100.0);
    else if (!strcmp(f, "-topk")) c->top_k = (int)parse_int(f, v, 0, 1 << 20);
    else if (!strcmp(f, "-n")) c->ckpt_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-y")) c->resume = (int)parse_int(f, v, 0, 2);
    else if (!strcmp(f, "-ow")) c->start_over = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "-sh")) c->shuffle = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "-seed")) c->seed = (uint64_t)parse_int(f, v, 0, BIG);
    else if (!strcmp(f, "-z")) c->zero_stage = (int)parse_int(f, v, 0, 3);
    else if (!strcmp(f, "-pp")) c->pipeline_stages = (int)parse_int(f, v, 1, 1024);
    else if (!strcmp(f, "-ps")) {
        if (!schedule_kind_parse(v, &c->pipe_schedule)) fail("-ps %s: the schedule must be 1f1b, interleaved or zb", v);
    } else if (!strcmp(f, "-vp")) c->virtual_stages = (int)parse_int(f, v, 1, MAX_CHUNKS);
    else if (!strcmp(f, "-tp")) c->tensor_parallel = (int)parse_int(f, v, 1, 1024);
    else if (!strcmp(f, "-sp")) c->sequence_parallel = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "-r")) c->recompute = (int)parse_int(f, v, 0, 3);
    else if (!strcmp(f, "-offload")) c->offload = (int)parse_int(f, v, 0, 2);
    else if (!strcmp(f, "-dpu")) c->delay_from = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "-nvme")) c->nvme_dir = v;
    else if (!strcmp(f, "-nvme-chunk")) c->nvme_chunk = parse_int(f, v, NVME_CHUNK_ALIGN, 1LL << 30);
    else if (!strcmp(f, "-disk-mem")) c->disk_mem_gib = parse_float(f, v, 0.001, 1e9);
    else if (!strcmp(f, "-wd")) c->watchdog = parse_float(f, v, 0.0, 1e6);
    else if (!strcmp(f, "-w")) c->plan_ranks = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "-gpu-mem")) c->gpu_mem_gib = parse_float(f, v, 0.001, 1e6);
    else if (!strcmp(f, "-host-mem")) c->host_mem_gib = parse_float(f, v, 0.001, 1e6);
    else if (!strcmp(f, "-k")) {
        if (!strcmp(v, "cosine")) c->schedule = LR_COSINE;
        else if (!strcmp(v, "linear")) c->schedule = LR_LINEAR;
        else if (!strcmp(v, "constant")) c->schedule = LR_CONSTANT;
        else fail("flag -k expects cosine|linear|constant, got '%s'", v);
    } else if (!strcmp(f, "-comm")) {
        if (!strcmp(v, "mpi")) c->comm = COMM_MPI;
        else if (!strcmp(v, "nccl")) c->comm = COMM_NCCL;
        else fail("flag -comm expects mpi|nccl, got '%s'", v);
        // Here rather than at comm_select, so the error comes before any device or data work.
        if (c->comm == COMM_NCCL && !backend_build_is_gpu()) fail("-comm nccl needs the GPU build (train_gpt); this is the CPU build");
        if (c->comm == COMM_NCCL && !comm_nccl_built())
            fail("-comm nccl: this train_gpt was built without NCCL (rebuild with make NCCL=1 NCCL_HOME=DIR)");
    } else if (!strcmp(f, "-p")) {
        c->precision_set = 1;
        if (!strcmp(v, "fp32")) c->precision = DT_FP32;
        else if (!strcmp(v, "bf16")) c->precision = DT_BF16;
        else if (!strcmp(v, "fp16")) c->precision = DT_FP16;
        else fail("flag -p expects fp32|bf16|fp16, got '%s'", v);
    } else fail("unknown flag '%s' (see -h)", f);
}

static void check_nvme(const Config* c) {
    if (c->nvme_dir && !c->nvme_dir[0]) fail("-nvme needs a directory name");
    if (c->nvme_dir && !c->offload)
        fail("-nvme %s keeps the optimizer state on disk instead of host memory: it needs -offload 1 or 2", c->nvme_dir);
    if (c->nvme_chunk % NVME_CHUNK_ALIGN) fail("-nvme-chunk %lld is not a multiple of %d", c->nvme_chunk, NVME_CHUNK_ALIGN);
    if (c->nvme_chunk != (long long)NVME_CHUNK_DEFAULT && !c->nvme_dir) fail("-nvme-chunk sizes the transfers of -nvme: give -nvme DIR");
    if (c->disk_mem_gib > 0 && !(c->gpu_mem_gib > 0)) fail("-disk-mem needs -gpu-mem (the table is per device budget)");
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
    if (c->plan_ranks && !c->estimate) fail("-w %d plans a world size with --estimate only", c->plan_ranks);
    if (c->dump_dir && c->max_steps == 0) fail("-dump writes step 0's tensors: it needs a step (-x 0 takes none)");
    if ((c->gpu_mem_gib > 0 || c->host_mem_gib > 0) && !c->estimate) fail("-gpu-mem and -host-mem plan with --estimate only");
    if (c->host_mem_gib > 0 && !(c->gpu_mem_gib > 0)) fail("-host-mem needs -gpu-mem (the table is per device budget)");
    if (c->prompt && c->out_dir) fail("-prompt generates from -e's model and exits: it writes no run directory (drop -o)");
    if (c->prompt && !c->prompt[0]) fail("-prompt needs some text");
    if (c->hellaswag && !c->hellaswag[0]) fail("-hs needs an evaluation file");
    if (c->hellaswag && c->prompt) fail("-prompt generates from -e's model and exits: it runs no evaluation (drop -hs)");
    if (c->hellaswag && c->val_every == 0) fail("-hs %s is scored at every validation step, which -v 0 turns off", c->hellaswag);
    if (c->sequence_parallel && c->tensor_parallel < 2) fail("-sp 1 splits the rows over the tensor group: it needs -tp 2 or more");
    if (c->sequence_parallel && ((long long)c->B * c->T) % c->tensor_parallel)
        fail("-sp 1: b*t = %d*%d rows do not split evenly over -tp %d ranks", c->B, c->T, c->tensor_parallel);
    if (c->delay_from > 0 && !c->offload)
        fail("-dpu %d delays the host's update behind the device's next step: it needs -offload 1 or 2", c->delay_from);
    if (c->offload == 2 && c->zero_stage < 2)
        fail("-offload 2 moves the sharded gradients (and with -z 3 the parameters) to the host: it needs -z 2 or 3, "
             "not -z %d (-offload 1 moves the optimizer state at any -z)", c->zero_stage);
    if (c->start_over && c->resume) fail("-ow 1 (start over) and -y %d (resume) contradict each other", c->resume);
    check_nvme(c);
}

void config_parse(Config* c, int argc, char** argv) {
    set_defaults(c);
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            config_usage(argv[0]);
            exit(0);
        }
        if (!strcmp(argv[i], "--estimate")) {   // the one flag without a value
            c->estimate = 1;
            i--;
            continue;
        }
        if (argv[i][0] != '-') fail("expected a flag, got '%s' (see -h)", argv[i]);
        if (i + 1 >= argc) fail("flag %s needs a value (see -h)", argv[i]);
        parse_one(c, argv[i], argv[i + 1]);
    }
    if (!c->virtual_stages) c->virtual_stages = c->pipe_schedule == SCHEDULE_INTERLEAVED ? 2 : 1;
    check_combinations(c);
}

const char* lr_schedule_name(LrSchedule s) { return s == LR_COSINE ? "cosine" : s == LR_LINEAR ? "linear" : "constant"; }

float config_lr_at(const Config* c, int step, int max_steps) {
    if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
    double frac = (double)(step - c->warmup) / (double)(max_steps - c->warmup > 1 ? max_steps - c->warmup : 1);
    double lr_min = (double)c->lr * c->final_lr_frac;
    switch (c->schedule) {
        case LR_COSINE: return (float)(lr_min + 0.5 * (1.0 + cos(M_PI * frac)) * (c->lr - lr_min));
        case LR_LINEAR: return (float)(c->lr - frac * (c->lr - lr_min));
        default: return c->lr;
    }
}
