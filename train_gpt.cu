// train_gpt.cu: the trainer, for every model family (core/models/: GPT-2, the Llama family). Plain C with no
// CUDA syntax: the same file builds train_gpt_cpu (CPU backend) and train_gpt (CUDA backend); the backend
// is chosen at link time (kernels/kernels.h).
//
// Reads top to bottom: set-up (ranks, flags, backend, model, data, log), then the loop: at each step maybe
// validate, sample and checkpoint, then one optimizer step over `ga` accumulated micro-batches on every
// data-parallel replica, each micro-batch flowing through the pipeline's stages in its schedule's order
// (-ps; pipeline.h), with ZeRO deciding where parameters, gradients and optimizer state live inside each
// stage (zero.h).
// Rank 0 prints and writes the log; every rank takes part in every collective.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/model_file.h"
#include "core/comm/comm.h"
#include "base/common.h"
#include "base/gpu_variants.h"
#include "core/run/config.h"
#include "core/data/dataloader.h"
#include "core/run/data_splits.h"
#include "core/zero/delayed_update.h"
#include "core/run/autotune.h"
#include "core/run/chat.h"
#include "core/run/generate.h"
#include "core/run/hellaswag.h"
#include "core/run/lr_range.h"
#include "core/util/fs.h"
#include "core/model/walk.h"
#include "core/comm/grid.h"
#include "core/util/logger.h"
#include "core/zero/loss_scale.h"
#include "core/zero/optimizer.h"
#include "core/pipeline/pipeline.h"
#include "core/run/report.h"
#include "core/run/stop_signal.h"
#include "core/checkpoint/run_dir.h"
#include "core/util/threads.h"
#include "core/tokenizer/decode.h"
#include "core/models/catalog.h"
#include "zero.h"

typedef struct {
    Config cfg;
    int model_is_spec;      // -e is a shape (random init), not a model file: decided once, by model_resolve
    LoraFamily lora;        // -lora: the LoRA'd family the run's shape names (lora.h)
    Comm* world;            // all ranks
    int rank, ranks;        // in the world
    int threads;            // OpenMP threads per rank
    PipelinePlan plan;      // the stages' blocks and activation sets, decided once
    NvmeConfig nvme;        // -nvme: this rank's state files (dir NULL without)
    Grid grid;              // stages x data-parallel replicas
    Backend* be;
    ParamLayout* layout;    // this stage's units
    Pipeline pipe;
    MemLedger mem;
    Zero* zero;
    ModelState model_states;   // zero's, as the optimizer and the checkpoints see them
    DelayedUpdate* delayed;    // -dpu; NULL otherwise
    Model model[MAX_MODEL_CHUNKS];   // one per model chunk of this stage (one without interleaving)
    ParamLayout* chunk_layout;   // [chunks]: each chunk's view of `layout` (layout_chunk_view)
    int chunks;
    DataLoader* train;
    DataLoader* val;        // NULL without -j
    EvalFile* hellaswag;    // -hs's examples that fit -t; NULL without -hs
    Tokenizer* tokenizer;   // NULL without a tokenizer file: samples print token ids
    int eot;                // where samples start: the tokenizer's end-of-text id (tokenizer_eot_or_gpt2)
    char tokenizer_path[PATH_MAX];   // where it was looked for (-prompt's merges file sits beside it)
    RunDir run_dir;         // -o, locked by rank 0 (node-local: by each host's lowest rank)
    Logger log;
    int first_step;         // 0, or the step a resumed run continues from
    int resumed;            // the state at first_step was loaded from a checkpoint
    LossScaler scaler;      // fp16: dynamic loss scale; otherwise a scale of 1
    int nonfinite_run;      // non-finite steps in a row (the -nf limit)
    int max_steps;
    int val_batches;
    long long val_trained;  // labels in the validation batches (their B*T each without masks)
    Batch batch;            // (B*T) host ints each; pos and doc only when the data has documents
} Trainer;

static long long tokens_per_step(const Trainer* tr) {
    return (long long)tr->cfg.B * tr->cfg.T * tr->cfg.grad_accum * tr->grid.replicas;
}

static int is_root(const Trainer* tr) { return tr->rank == 0; }

// The chunk with the LM head (on the last stage; elsewhere a chunk without one).
static Model* head_chunk(Trainer* tr) { return pipeline_head_chunk(&tr->pipe, tr->model); }

// One Model per model chunk of this stage, each walking its view of the stage's layout with its own
// activation sets; they share the parameter store (ZeRO) and the stash sizing of the schedule.
static void create_chunks(Trainer* tr) {
    const Config* cfg = &tr->cfg;
    const Grid* g = &tr->grid;
    tr->chunks = tr->layout->num_chunks;
    tr->chunk_layout = (ParamLayout*)xmalloc((size_t)tr->chunks * sizeof(ParamLayout));
    for (int c = 0; c < tr->chunks; c++) {
        layout_chunk_view(tr->layout, c, &tr->chunk_layout[c]);
        model_create(&tr->model[c], tr->be, &tr->mem, &tr->chunk_layout[c], zero_param_store(tr->zero), g->tp_group,
                     g->kv_copies, g->cp_group, cfg->sequence_parallel, cfg->precision, cfg->B, cfg->T / g->cp, cfg->recompute,
                     cfg->offload_act, tr->plan.sets[g->stage][c], tr->plan.stash[g->stage], cfg->grad_accum);
        if (tr->train && dataloader_has_documents(tr->train)) model_use_documents(&tr->model[c], tr->be, &tr->mem);
    }
}

// Between steps the ranks agree on a stop (core/run/stop_signal.h) through an all-reduce, finish the step,
// checkpoint and exit 0 together.
static int stop_requested(Trainer* tr) {
    long long stop = stop_signal_seen();
    comm_allreduce_host_max_i64(tr->world, &stop, 1);
    return stop > 0;
}

// ---------------------------------------------------------------------------------------------------
// Set-up.

// -z names what is sharded; -offload adds what of it lives on the host, -nvme what of that lives on disk, -dpu
// the host buffers of the update in flight; -hpz, -qw and -qg are ZeRO++'s, -opt adam1bit adds its buffers.
static ZeroCaps caps_of(const Config* cfg, int zero) {
    ZeroCaps caps = zero_plusplus(zero_on_disk(zero_offload(zero_caps(zero), cfg->offload), cfg->nvme_dir != NULL), cfg->hpz, cfg->qw, cfg->qg);
    caps.delayed_update = cfg->delay_from > 0;
    caps.onebit = cfg->optimizer == OPTIMIZER_ADAM1BIT;
    return caps;
}

static NvmeConfig nvme_config(const Config* cfg, int rank) {
    return (NvmeConfig){.dir = cfg->nvme_dir, .chunk_elems = (size_t)cfg->nvme_chunk, .rank = rank};
}

// --estimate's and --autotune's planner for the model states: ZeRO's allocation code in counting mode.
static void plan_zero_states(MemLedger* mem, const ParamLayout* lay, const Config* cfg, int zero, int dp_rank, int dp) {
    NvmeConfig disk = nvme_config(cfg, 0);
    zero_plan_rank(mem, lay, caps_of(cfg, zero), dp_rank, dp, cfg->precision, cfg->nvme_dir ? &disk : NULL);
}

static void open_tokenizer(Trainer* tr, const ModelShape* shape) {
    char* path = tr->tokenizer_path;
    tokenizer_path_for(path, sizeof(tr->tokenizer_path), tr->cfg.tokenizer, tr->cfg.train_pattern);
    tr->tokenizer = tokenizer_load(path);
    // The training samples start from the end-of-text token (a tokenizer.json's document start): it must be one
    // the model has (GPT-2's fallback, without a tokenizer file, always is).
    int V = shape->V, eot = tokenizer_eot_or_gpt2(tr->tokenizer, V);
    if (eot >= V && tr->cfg.sample_every > 0 && !config_generates(&tr->cfg))
        fail("tokenizer %s: its %s token %d is outside the model's vocabulary of %d, and samples start from it "
             "(give the model's tokenizer with -tk, or -s 0)", path, tokenizer_bpe(tr->tokenizer) ? "document-start" : "end-of-text",
             eot, V);
    tr->eot = eot;
}

// The checkpoint to resume (its path into dir and its manifest into info), or -1. With one -o, rank 0 chooses
// (warning once about damaged newer ones), the others follow and every rank inspects it; with node-local
// directories the ranks choose together the newest one complete on every host.
static int find_checkpoint(Trainer* tr, char* dir, size_t size, CheckpointInfo* info) {
    if (tr->run_dir.node_local)
        return checkpoint_find_hosts(tr->cfg.out_dir, tr->world, &tr->layout->shape, dir, size, info, is_root(tr));
    long long step = -1;
    if (is_root(tr)) step = checkpoint_find(tr->cfg.out_dir, &tr->layout->shape, dir, size, 1);
    comm_allreduce_host_max_i64(tr->world, &step, 1);
    if (step < 0) return -1;
    run_dir_checkpoint_path(dir, size, tr->cfg.out_dir, (int)step);
    char why[512];
    if (!checkpoint_inspect(dir, &tr->layout->shape, info, why, sizeof(why))) fail("checkpoint %s: %s", dir, why);
    return (int)step;
}

static void resume_from(Trainer* tr, const char* dir, const CheckpointInfo* found) {
    CheckpointInfo info = *found;
    checkpoint_check_resume(&info, &tr->cfg, tr->max_steps, tokens_per_step(tr), dir, is_root(tr));   // before the long load
    if (tr->run_dir.node_local) checkpoint_load_hosts(&tr->model_states, tr->be, tr->world, dir, &info);
    else checkpoint_load(&tr->model_states, tr->be, dir, &info);
    tr->first_step = info.step;
    tr->resumed = 1;
    if (tr->scaler.dynamic) {
        tr->scaler.scale = info.scaler.scale;
        tr->scaler.clean_steps = info.scaler.clean_steps;
        tr->scaler.overflows_left = info.scaler.overflows_left;
    }
    if (is_root(tr)) printf("resumed from %s at step %d (written by %d rank%s in %d stage%s)\n", dir, info.step, info.ranks,
                            info.ranks > 1 ? "s" : "", info.pp, info.pp > 1 ? "s" : "");
}

static void load_or_init_model(Trainer* tr) {
    char dir[PATH_MAX];
    CheckpointInfo info;
    if (tr->cfg.resume) comm_watchdog_phase(tr->world, 1, "start-up: checkpoint search");
    if (tr->cfg.resume && find_checkpoint(tr, dir, sizeof(dir), &info) >= 0) {
        comm_watchdog_phase(tr->world, 1, "start-up: loading %s", dir);
        resume_from(tr, dir, &info);
        return;
    }
    comm_watchdog_phase(tr->world, 1, "start-up: model weights");
    char log[PATH_MAX];   // say so where an earlier run's log is about to be replaced, not on a first run
    if (tr->cfg.resume && is_root(tr) && (path_join(log, sizeof(log), tr->cfg.out_dir, "log.jsonl"), path_exists(log)))
        printf("no checkpoint in %s: starting at step 0\n", tr->cfg.out_dir);
    float* flat = model_start(tr->layout, tr->cfg.model, tr->model_is_spec, tr->cfg.seed, tr->cfg.lora_init);
    zero_set_from_host(tr->zero, tr->be, flat);
    free(flat);
}

static void open_data(Trainer* tr, const ModelShape* shape) {
    Config* cfg = &tr->cfg;
    const Grid* g = &tr->grid;   // every stage and context rank of a replica reads that replica's windows
    if (config_generates(cfg)) return;   // generation reads no data and takes no step
    DataOptions opt = {cfg->pack, cfg->long_docs == LONG_TRUNCATE, data_document_token(cfg, tr->tokenizer, tr->tokenizer_path, shape->V)};
    tr->train = dataloader_open_documents(cfg->train_pattern, cfg->B, cfg->T, g->replica, g->replicas, cfg->shuffle, cfg->seed,
                                          shape->V, &opt);
    if (cfg->val_pattern && cfg->val_pattern[0] && cfg->val_every > 0)
        tr->val = data_open_val(cfg, tr->train, g->replica, g->replicas, shape->V, &opt, &tr->val_batches, &tr->val_trained);
    data_keep_context(cfg, tr->train, tr->val, g->cp, g->cp_rank);
    if (cfg->hellaswag) {   // a bad file is an error now, not at the first evaluation
        tr->hellaswag = (EvalFile*)xmalloc(sizeof(EvalFile));
        hellaswag_open(tr->hellaswag, cfg->hellaswag, shape->V, cfg->T);
    }
    long long epoch_steps = dataloader_windows_per_epoch(tr->train) / ((long long)cfg->grad_accum * g->replicas);
    tr->max_steps = config_resolve_steps(cfg, epoch_steps, tokens_per_step(tr));
}

static const char* offload_text(const Config* cfg) {
    if (cfg->offload == 0) return "";
    if (cfg->offload == 1) return ", state on host";
    return cfg->zero_stage == 3 ? ", state, gradient and parameter pieces on host" : ", state and gradient pieces on host";
}

static const char* delay_text(const Config* cfg, char* buf, size_t size) {
    if (cfg->delay_from > 0) snprintf(buf, size, ", updates one step late from step %d", cfg->delay_from);
    else buf[0] = 0;
    return buf;
}

static void print_setup(Trainer* tr, CommKind comm) {
    const Config* cfg = &tr->cfg;
    const ModelShape* s = &tr->layout->shape;
    char delay[64];
    char dims[160], shape[256];
    grid_describe(&tr->grid, dims, sizeof(dims));
    shape_describe(s, shape, sizeof(shape));
    printf("model %s: %zu parameters | %s on %s | %d rank%s (%s): %s, ZeRO-%d%s%s | %d thread%s per rank | b=%d t=%d ga=%d | %d steps\n",
           shape, shape_param_count(s), dtype_name(cfg->precision), backend_device_name(tr->be), tr->ranks, tr->ranks > 1 ? "s" : "",
           comm_kind_name(comm), dims, cfg->zero_stage, offload_text(cfg), delay_text(cfg, delay, sizeof(delay)), tr->threads,
           tr->threads > 1 ? "s" : "", cfg->B, cfg->T, cfg->grad_accum, tr->max_steps);
    if (!config_generates(cfg))
        printf("optimizer: AdamW beta1 %g, beta2 %g, eps %g, weight decay %g on 2-D tensors | gradient clip %g\n", cfg->adam_beta1,
               cfg->adam_beta2, cfg->adam_eps, cfg->weight_decay, cfg->grad_clip);
    data_print_packing(tr->train, tr->val, cfg);
    if (tr->val && tr->val_batches < cfg->val_batches)
        printf("validation: %d batch%s per evaluation, all that %s holds (-m %d)\n", tr->val_batches,
               tr->val_batches > 1 ? "es" : "", cfg->val_pattern, cfg->val_batches);
    if (tr->hellaswag) {
        const EvalFile* hs = tr->hellaswag;
        printf("hellaswag: %s: %d examples over %d replica%s", cfg->hellaswag, hs->count, tr->grid.replicas, tr->grid.replicas > 1 ? "s" : "");
        if (hs->dropped) printf("; %d longer than -t %d left out", hs->dropped, cfg->T);
        printf("\n");
    }
    report_variants(&tr->log, tr->be, tr->first_step);
    if (tr->run_dir.node_local)
        printf("-o %s: node-local directories on %d hosts (no shared filesystem): model.bin and the log in rank 0's\n",
               cfg->out_dir, tr->run_dir.dirs);
    if (tr->model_states.disk) printf("%s\n", nvme_describe(tr->model_states.disk));
    report_pipeline_plan(&tr->log, &tr->plan, tr->first_step);
}

static void trainer_setup(Trainer* tr, int argc, char** argv) {
    memset(tr, 0, sizeof(*tr));
    autotune_if_asked(plan_zero_states, model_resolve, argc, argv);   // before MPI: it launches its trials itself
    tr->world = comm_init_world(&argc, &argv);
    tr->rank = comm_rank(tr->world);
    tr->ranks = comm_size(tr->world);
    tr->threads = threads_set_for_rank(comm_local_size(tr->world));
    Config* cfg = &tr->cfg;
    config_parse(cfg, argc, argv);
    // Watched from comm_init_world on; now at this run's -wd. Start-up is a long phase (comm.h): one rank
    // may find, inspect and read a large checkpoint, or a model file, while the others wait.
    comm_watchdog_start(tr->world, cfg->watchdog);
    gpu_variants_from_env();   // a bad GPT_CUDA_VARIANTS fails here, before the run directory is touched
    ModelShape shape = lora_apply(&tr->lora, model_resolve(cfg->model, &tr->model_is_spec), &cfg->lora);
    tr->lora.seed = cfg->seed;   // LoRA's dropout masks follow -seed
    config_resolve_precision(cfg);
    config_resolve_hpz(cfg, tr->world);
    int planned = cfg->estimate && cfg->plan_ranks ? cfg->plan_ranks : tr->ranks;
    config_resolve_batch(cfg, shape.maxT, planned, cfg->pipeline_stages * cfg->tensor_parallel * cfg->context_parallel);
    pipeline_plan(&tr->plan, &shape, cfg->pipeline_stages, cfg->pipe_schedule, cfg->virtual_stages, cfg->tensor_parallel,
                  cfg->context_parallel, cfg->context_mode == CP_RING, planned, cfg->T, cfg->grad_accum);
    if (cfg->estimate) {   // before any allocation, data or device
        if (is_root(tr)) print_memory_plan(plan_zero_states, cfg, &tr->plan, &shape, planned);
        comm_finalize(tr->world);
        exit(0);
    }
    // Before anything is written: one run per directory, never mixed with an earlier one; shared or node-local.
    comm_watchdog_phase(tr->world, 1, "start-up: run directory");
    run_dir_setup(&tr->run_dir, tr->world, cfg->out_dir, cfg->start_over ? RUN_START_OVER : cfg->resume ? RUN_RESUME : RUN_FRESH);
    comm_watchdog_phase(tr->world, 1, "start-up: device and groups");
    tr->be = backend_create(comm_local_rank(tr->world));
    comm_attach_backend(tr->world, tr->be);
    CommKind comm = comm_select(tr->world, cfg->comm);   // before any group is split
    grid_create(&tr->grid, tr->world, cfg->pipeline_stages, cfg->tensor_parallel, cfg->context_parallel, shape.tied,
                shape_kv_copies(&shape, cfg->tensor_parallel), cfg->hpz, cfg->qg);
    comm_watchdog_phase(tr->world, 1, "start-up: data and tokenizer");
    open_tokenizer(tr, &shape);   // first: -docmask's document-start token is the tokenizer's
    open_data(tr, &shape);
    tr->batch = data_batch_create(cfg->B, cfg->T, tr->train);

    const Grid* g = &tr->grid;
    tr->layout = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    pipeline_stage_layout(tr->layout, &tr->plan, &shape, g->dp, g->stage, g->tp_rank);
    comm_watchdog_phase(tr->world, 1, "start-up: model state");
    tr->nvme = nvme_config(cfg, tr->rank);
    check_room(plan_zero_states, cfg, tr->layout, tr->grid.dp_rank, tr->grid.dp, comm_local_size(tr->world), &tr->nvme);
    tr->zero = zero_create(tr->be, &tr->mem, tr->layout, caps_of(cfg, cfg->zero_stage), g->dp_group, g->tied, g->hpz_group,
                           cfg->precision, cfg->nvme_dir ? &tr->nvme : NULL);
    if (cfg->qg) zero_qgz_groups(tr->zero, &g->qgz);
    tr->model_states = zero_model_state(tr->zero);
    if (cfg->delay_from > 0) tr->delayed = delayed_update_create(&tr->model_states);
    create_chunks(tr);
    pipeline_create(&tr->pipe, g, &tr->plan);
    tr->scaler = loss_scaler_init(cfg->precision == DT_FP16, cfg->loss_scale);
    load_or_init_model(tr);
    if (tr->model_states.disk) nvme_take_times(tr->model_states.disk);   // -lb's first step shows its own
    comm_watchdog_phase(tr->world, 1, "start-up: report");
    if (is_root(tr)) logger_open(&tr->log, cfg->out_dir, tr->first_step);
    if (is_root(tr) && !config_chats(cfg)) print_setup(tr, comm);   // a chat prints its reply alone
    report_layout(&tr->log, tr->layout, cfg, g->dp, tr->first_step);
    report_memory(&tr->log, tr->world, &tr->mem, cfg, tr->model, tr->chunks, tr->first_step);
    stop_signals_catch();   // last: the training loop starts next
}

static void trainer_teardown(Trainer* tr) {
    // Long: a rank may remove large -nvme files, or free much memory, while the others wait in finalize.
    comm_watchdog_phase(tr->world, 1, "the end of the run");
    logger_close(&tr->log);
    run_dir_close(&tr->run_dir);
    dataloader_close(tr->train);
    if (tr->val) dataloader_close(tr->val);
    if (tr->hellaswag) eval_file_free(tr->hellaswag);
    free(tr->hellaswag);
    if (tr->tokenizer) tokenizer_free(tr->tokenizer);
    pipeline_destroy(&tr->pipe);
    for (int c = 0; c < tr->chunks; c++) model_destroy(&tr->model[c], tr->be);
    free(tr->chunk_layout);
    if (tr->delayed) delayed_update_destroy(tr->delayed);
    zero_destroy(tr->zero, tr->be);
    grid_destroy(&tr->grid);
    backend_destroy(tr->be);
    free(tr->layout);
    data_batch_free(&tr->batch);
    comm_finalize(tr->world);
}

// ---------------------------------------------------------------------------------------------------
// Evaluation and sampling.

// Validation windows 0..m-1, dealt round-robin to the replicas. Every rank runs the same number of
// forwards (ZeRO-3 gathers are collective); a replica's extra window past m counts with weight 0. Only the
// last stage has losses; the others add 0. A stop signal is looked at between rounds, agreed over the world
// like stop_requested so that every rank leaves at the same round (the next round's collectives would wait
// for the ones that left): the partial sum is dropped, nothing is logged, and 0 is returned. A validation
// of m rounds otherwise delays the stop by its whole length.
static int validate(Trainer* tr, int step) {
    const Grid* g = &tr->grid;
    double sum = 0.0;
    int rounds = (tr->val_batches + g->replicas - 1) / g->replicas;
    for (int i = 0; i < rounds; i++) {
        if (i > 0 && stop_requested(tr)) {
            if (is_root(tr)) printf("step %d | validation stopped by a signal after %d of %d rounds: no val loss\n", step, i, rounds);
            return 0;
        }
        dataloader_read(tr->val, i, 1, 0, &tr->batch);
        MicroBatch mb = pipeline_micro_batch(&tr->batch, tr->val);
        double loss = pipeline_forward(&tr->pipe, tr->model, tr->be, &mb);
        if (i * g->replicas + g->replica < tr->val_batches && g->tp_rank == 0) sum += loss;   // a tensor group's losses are one
    }
    comm_allreduce_host_sum(tr->world, &sum, 1);
    double val_loss = sum / (double)tr->val_trained;
    if (is_root(tr)) printf("step %d | val loss %.6f\n", step, val_loss);
    logger_line(&tr->log, "{\"step\": %d, \"val_loss\": %.9g}", step, val_loss);
    return 1;
}

// -hs: the share of the examples each replica scores, counted over the world (core/run/hellaswag.h). Returns
// 0 when a stop signal ended it (nothing logged), like validate.
static int hellaswag(Trainer* tr, int step) {
    const Config* cfg = &tr->cfg;
    EvalRunner run = {&tr->pipe, tr->model, tr->be, &tr->grid, tr->batch.tokens, tr->batch.targets, cfg->B, cfg->T, stop_signal_seen};
    EvalScore s;
    if (!hellaswag_evaluate(&run, tr->hellaswag, &s)) {
        if (is_root(tr)) printf("step %d | hellaswag stopped by a signal: no accuracy\n", step);
        return 0;
    }
    double acc = (double)s.correct / (double)s.total;
    if (is_root(tr)) printf("step %d | hellaswag %lld/%lld = %.4f\n", step, s.correct, s.total, acc);
    logger_line(&tr->log, "{\"step\": %d, \"hellaswag_acc\": %.9g, \"hellaswag_correct\": %lld, \"hellaswag_total\": %lld}", step,
                acc, s.correct, s.total);
    return 1;
}

// -v's evaluations: the validation loss (-j) and the HellaSwag accuracy (-hs). Returns 0 when a stop signal
// ended one of them.
static int evaluate(Trainer* tr, int step) {
    if (tr->val && !validate(tr, step)) return 0;
    return !tr->hellaswag || hellaswag(tr, step);
}

// What the generation loop (core/run/generate.h) runs on: this rank's stages, the world, the trainer's input
// buffer and tokenizer, the stop signals, and -temp, -topk and -seed.
static Generator generator_of(Trainer* tr) {
    const Config* cfg = &tr->cfg;
    return (Generator){&tr->pipe, tr->model, tr->be, tr->world, tr->batch.tokens, cfg->B, cfg->T, tr->tokenizer, stop_signal_seen,
                       {cfg->temperature, cfg->top_k}, cfg->seed, tr->grid.cp, tr->grid.cp_rank, cfg->context_mode == CP_RING};
}

// -s: rank 0 prints the sample (every replica draws the same tokens). Returns 0 when a stop signal ended it
// early: the flag rides on the all-reduce that shares each token, so every rank sees it at the same token.
static int sample(Trainer* tr, int step) {
    Generator gen = generator_of(tr);
    return generate_sample(&gen, step, tr->eot, tr->cfg.gen_tokens, is_root(tr) ? stdout : NULL);
}

// -prompt (-chat: the rendered conversation, up to its end of turn): -g tokens after the prompt, sampled with -temp
// and -topk from -seed's stream and printed as they come; Ctrl-C ends the text early (a second one kills).
static void generate(Trainer* tr) {
    const Config* cfg = &tr->cfg;
    int V = tr->model[0].shape.V;
    ChatPrompt chat = config_chats(cfg) ? chat_prompt(cfg->chat, cfg->chat_file, tr->tokenizer, tr->tokenizer_path, V) : (ChatPrompt){0};
    if (!chat.ids) chat.ids = generate_encode_text("-prompt", cfg->prompt, tr->tokenizer, tr->tokenizer_path, V, &chat.n);
    if (is_root(tr) && !tr->resumed && tr->model_is_spec)
        fprintf(stderr, "warning: -e %s is a shape, not weights: the text is sampled from a randomly initialized model "
                        "(give a model file with -e, or -y 1 -o DIR to generate from a run's checkpoint)\n", cfg->model);
    comm_watchdog_phase(tr->world, 1, "generation");
    Generator gen = generator_of(tr);
    FILE* out = is_root(tr) ? stdout : NULL;
    if (config_chats(cfg)) generate_reply(&gen, chat.ids, chat.n, cfg->gen_tokens, chat.stop, chat.nstop, cfg->chat_ids, out);
    else generate_from_prompt(&gen, cfg->prompt, chat.ids, chat.n, cfg->gen_tokens, out);
    free(chat.ids);
}

// ---------------------------------------------------------------------------------------------------
// One optimizer step.

// -dump: step 0's first-micro-batch logits (N x V) and its loss, from the rank with the head of replica 0
// (tensor rank 0; every tensor rank gathers them, since each holds a slice of the vocabulary),
// and the reduced gradients (llm.c order), each stage writing its own tensors.
static void dump_step0(Trainer* tr, const float* logits, double loss) {
    char p[PATH_MAX];
    path_join(p, sizeof(p), tr->cfg.dump_dir, "grads0.f32");
    if (is_root(tr)) {
        if (mkdir(tr->cfg.dump_dir, 0755) != 0 && errno != EEXIST) fail("cannot create -dump directory %s: %s", tr->cfg.dump_dir, strerror(errno));
        model_file_create(&tr->layout->shape, p, 0);
    }
    comm_barrier(tr->world);
    int writer = tr->grid.dp_rank == 0;
    float* grads = writer ? (float*)xcalloc(tr->layout->total, sizeof(float)) : NULL;
    zero_grads_to_host(tr->zero, tr->be, grads);   // collective over the stage's replicas
    if (writer) model_file_write_part(tr->layout, grads, p, 0);
    free(grads);
    if (logits && tr->grid.tp_rank == 0) {
        size_t n = (size_t)tr->cfg.B * tr->cfg.T * tr->model[0].shape.V;
        path_join(p, sizeof(p), tr->cfg.dump_dir, "logits0.f32");
        FILE* f = xfopen(p, "wb");
        xfwrite(logits, sizeof(float), n, f, p);
        xfclose(f, p);
        path_join(p, sizeof(p), tr->cfg.dump_dir, "loss0.txt");
        f = xfopen(p, "w");
        if (fprintf(f, "%.9g\n", loss) < 0) fail("write error in %s", p);
        xfclose(f, p);
    }
    comm_barrier(tr->world);
}

typedef struct {
    double loss, grad_norm;   // grad_norm: of the unscaled gradients
    float lr, beta1;          // beta1: AdamW's, which -k onecycle cycles
    float loss_scale;         // the scale this step used
    int skipped;              // non-finite loss or gradients: no update on any rank
    long long trained;        // labels in the step, over every micro-step and replica (0: no update either)
    PhaseTimer phases;
} StepResult;

// -dpu: the update in flight (the last step's) lands now; the caller redistributes the parameters if one did.
static int land_delayed_update(Trainer* tr) { return tr->delayed && delayed_update_finish(tr->delayed, tr->be); }

// -nvme: the disk's time since the last call (the pass of the update that just ran or landed, and -dpu's
// landing of the working copy), for -lb.
static void take_disk_times(Trainer* tr, PhaseTimer* pt) {
    if (!tr->model_states.disk) return;
    DiskTimes t = nvme_take_times(tr->model_states.disk);
    pt->disk.read += t.read, pt->disk.write += t.write, pt->disk.wait += t.wait, pt->disk.pass += t.pass;
}

// Every update in flight has landed: before anything reads or saves the parameters or the state.
static void settle_updates(Trainer* tr) {
    if (land_delayed_update(tr)) zero_after_update(tr->zero, tr->be);
}

// The optimizer's part of step `step`: the last step's delayed update lands (whatever this step's verdict),
// then this step's runs now, or from -dpu's step on, starts on the host to land at the end of the next step.
static void update(Trainer* tr, int step, const StepResult* r, PhaseTimer* pt) {
    const Config* cfg = &tr->cfg;
    phase_mark(pt, tr->be, PHASE_OPTIMIZER);   // the norm
    int landed = land_delayed_update(tr);
    int skip = r->skipped || r->trained == 0;   // nothing to learn from: AdamW's moments and decay stay put too
    phase_mark(pt, tr->be, PHASE_UPDATE_WAIT);
    if (landed) pt->overlapped = delayed_update_seconds(tr->delayed);
    OptimizerStep o = {r->lr, r->beta1, cfg->adam_beta2, cfg->adam_eps, cfg->weight_decay, step, cfg->seed, config_freeze(cfg), r->loss_scale};
    float grad_scale = grad_clip_scale(r->grad_norm, cfg->grad_clip) / r->loss_scale;
    take_disk_times(tr, pt);
    if (!skip && tr->delayed && step >= cfg->delay_from) {
        if (landed) zero_after_update(tr->zero, tr->be);
        delayed_update_start(tr->delayed, tr->be, &o, grad_scale);
        return;
    }
    if (!skip) optimizer_step(&tr->model_states, tr->be, &o, grad_scale);
    take_disk_times(tr, pt);
    if (landed || !skip) zero_after_update(tr->zero, tr->be);
}

static StepResult train_step(Trainer* tr, int step) {
    Config* cfg = &tr->cfg;
    Model* g = head_chunk(tr);
    int dump = cfg->dump_dir && step == 0, dumps_logits = dump && model_has_head(g) && tr->grid.dp_rank == 0;
    float* logits = dumps_logits ? (float*)xmalloc((size_t)cfg->B * cfg->T * g->shape.V * sizeof(float)) : NULL;
    // Every label of the global step (every token without masks; each rank counts them from the data order) enters
    // with weight 1/labels: the gradient of the mean loss (times the loss scale, which the optimizer divides back out).
    long long trained = dataloader_step_trained(tr->train, step, cfg->grad_accum);
    float dloss = trained ? (float)(tr->scaler.scale / (double)trained) : 0.0f;
    StepResult r = {.lr = config_lr_at(cfg, step, tr->max_steps), .beta1 = config_beta1_at(cfg, step, tr->max_steps), .loss_scale = tr->scaler.scale, .trained = trained,
                    .phases = {.last = now_seconds()}};
    PhaseTimer* pt = &r.phases;
    pt->on = cfg->breakdown_every > 0 && (step + 1) % cfg->breakdown_every == 0;
    comm_watchdog_phase(tr->world, 0, "step %d: forward and backward", step);
    zero_onebit_local(tr->zero, config_onebit_exchanges(cfg, step), r.beta1, r.loss_scale);
    zero_begin_step(tr->zero, tr->be);
    r.loss = pipeline_train_step(&tr->pipe, tr->model, tr->be, tr->train, step, &tr->batch, dloss, logits, pt);
    if (tr->grid.tp_rank > 0) r.loss = 0.0;            // its tensor group's rank 0 holds the same losses
    comm_watchdog_phase(tr->world, 0, "step %d: loss", step);
    comm_allreduce_host_sum(tr->world, &r.loss, 1);   // the last stage of each replica holds its losses
    r.loss = trained ? r.loss / (double)trained : NAN;
    comm_watchdog_phase(tr->world, 0, "step %d: gradient reduction", step);
    zero_reduce_grads(tr->zero, tr->be);
    pt->host_copies = zero_host_copy_seconds(tr->zero);   // read every step, so it covers this step only
    pt->quantize = zero_quantize_seconds(tr->zero);
    phase_mark(pt, tr->be, PHASE_COMM);
    if (dump) dump_step0(tr, logits, r.loss);
    free(logits);
    comm_watchdog_phase(tr->world, 0, "step %d: gradient norm", step);
    r.grad_norm = grad_global_norm(&tr->model_states, tr->be, tr->grid.tp_group, tr->grid.pp_group) / r.loss_scale;
    // The loss and the norm are all-reduced, so every rank reaches the same verdict.
    r.skipped = trained && (!isfinite(r.loss) || !isfinite(r.grad_norm));
    if (trained) loss_scaler_update(&tr->scaler, r.skipped);
    comm_watchdog_phase(tr->world, 0, "step %d: update", step);
    update(tr, step, &r, pt);
    be_synchronize(tr->be);
    phase_mark(pt, tr->be, PHASE_OPTIMIZER);
    return r;
}

static void report_step(Trainer* tr, int step, const StepResult* r, double seconds, double* avg_seconds) {
    report_comm(&tr->log, &tr->grid, step);
    if (r->phases.on) report_breakdown(&tr->log, &tr->grid, step, &r->phases, &tr->plan);
    if (!is_root(tr)) return;
    double tok_s = (double)tokens_per_step(tr) / seconds;
    *avg_seconds = *avg_seconds <= 0.0 ? seconds : 0.9 * *avg_seconds + 0.1 * seconds;
    double eta = *avg_seconds * (tr->max_steps - step - 1);
    // Per GPU: the job's model FLOPs over the peak of all its ranks' GPUs.
    double peak = gpu_peak_flops(tr->be) * tr->ranks;
    double mfu = peak > 0.0 ? tok_s * model_flops_per_token(tr->layout, tr->cfg.T) / peak : 0.0;
    double peak_mib = (double)be_peak_bytes(tr->be) / (1 << 20);
    char mfu_text[32] = "", extra[192] = "", trained_text[48] = "";
    if (peak > 0.0) snprintf(mfu_text, sizeof(mfu_text), " | mfu %.1f%%", 100.0 * mfu);
    if (tr->scaler.dynamic) snprintf(extra, sizeof(extra), ", \"loss_scale\": %.9g", r->loss_scale);
    if (tr->cfg.schedule == LR_ONECYCLE && tr->cfg.sched.cycle_momentum)   // otherwise -beta1 throughout
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), ", \"beta1\": %.9g", r->beta1);
    data_trained_rate(tr->train, r->trained, seconds, trained_text, sizeof(trained_text), extra, sizeof(extra));
    if (!r->trained)
        printf("step %5d/%d | no trained token in this step's documents: no update on any rank\n", step, tr->max_steps);
    if (r->skipped) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof(extra) - n, ", \"skipped\": 1");
        printf("step %5d/%d | non-finite loss or gradients (loss %g, norm %g): update skipped on every rank\n", step,
               tr->max_steps, r->loss, r->grad_norm);
    }
    printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s%s | mem %.0f MiB | eta %.0fs\n", step,
           tr->max_steps, r->loss, r->lr, r->grad_norm, seconds * 1e3, tok_s, trained_text, mfu_text, peak_mib, eta);
    flush_stdout();
    char loss[32], norm[32];
    logger_line(&tr->log,
                "{\"step\": %d, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"dt_ms\": %.3f, \"tok_s\": %.1f, "
                "\"mfu\": %.4f, \"peak_mem\": %zu%s}",
                step, json_number(loss, sizeof(loss), r->loss), r->lr, json_number(norm, sizeof(norm), r->grad_norm),
                seconds * 1e3, tok_s, mfu, be_peak_bytes(tr->be), extra);
}

// Skipped steps in a row end the run once they cannot be an fp16 overflow the loss scale will absorb.
static void check_nonfinite(Trainer* tr, int step, const StepResult* r) {
    int counts = r->skipped && (!tr->scaler.dynamic || r->loss_scale <= tr->scaler.min_scale);
    tr->nonfinite_run = counts ? tr->nonfinite_run + 1 : r->skipped ? tr->nonfinite_run : 0;
    if (tr->nonfinite_run >= tr->cfg.max_nonfinite)
        fail("%d non-finite steps in a row (the last at step %d, loss %g, gradient norm %g); stopping (-nf %d)",
             tr->nonfinite_run, step, r->loss, r->grad_norm, tr->cfg.max_nonfinite);
}

static int due(int every, int step, int last) { return every > 0 && (step % every == 0 || last); }

static void save_checkpoint(Trainer* tr, int step) {
    CheckpointInfo info = {.step = step, .tokens_per_step = tokens_per_step(tr), .seed = tr->cfg.seed, .ranks = tr->ranks,
                           .pp = tr->grid.pp, .scaler = tr->scaler, .has_run = 1};
    run_record_of(&info.run, &tr->cfg, tr->max_steps, tokens_per_step(tr));
    char dir[PATH_MAX];
    double t0 = now_seconds();
    checkpoint_save(&tr->model_states, tr->be, &tr->grid, &tr->cfg, &tr->run_dir, &info, dir, sizeof(dir));
    if (is_root(tr)) printf("step %d | checkpoint %s written in %.2f s\n", step, dir, now_seconds() - t0);
}

static void print_finish(const Trainer* tr, int steps_done, double seconds) {
    if (!is_root(tr)) return;
    if (steps_done == 0 && tr->resumed) printf("the run had already reached step %d of %d: nothing left to train\n", tr->first_step, tr->max_steps);
    else printf("trained %d step%s in %.1f s, now at step %d of %d\n", steps_done, steps_done == 1 ? "" : "s", seconds,
                tr->first_step + steps_done, tr->max_steps);
    const char* resume_from = tr->cfg.range_test.steps ? NULL : tr->cfg.out_dir;   // a range test writes no checkpoint
    if (tr->cfg.out_dir) printf("log: %s/log.jsonl%s%s\n", tr->cfg.out_dir, resume_from ? "; resume or extend with -y 1 -o " : "", resume_from ? resume_from : "");
    flush_stdout();
}

// Between steps: land -dpu's update where anything reads the parameters, then validate, sample and checkpoint
// as due. Returns 0 when a stop signal came during evaluation: then the state after `step` steps, unchanged by
// evaluation, is saved as step's checkpoint, and the resumed run evaluates step `step` again.
static int between_steps(Trainer* tr, int step, int last) {
    const Config* cfg = &tr->cfg;
    int loaded = tr->resumed && step == tr->first_step;   // this state is already a checkpoint
    int val = (tr->val || tr->hellaswag) && due(cfg->val_every, step, last);
    int smp = due(cfg->sample_every, step, last) && step > tr->first_step;
    int save = cfg->out_dir && !loaded && !cfg->range_test.steps && (last || (step > tr->first_step && due(cfg->ckpt_every, step, 0)));
    if (val || smp || save || last) {
        comm_watchdog_phase(tr->world, 0, "step %d: landing the updates", step);
        settle_updates(tr);
    }
    // Evaluation and checkpoints are long phases for the watchdog (comm.h): rank 0 alone writes the model file
    // and publishes the checkpoint, and a slow disk can stretch either far past a training step.
    comm_watchdog_phase(tr->world, 1, "validation at step %d", step);
    int stopped = val && !evaluate(tr, step);   // a stop signal mid-evaluation: nothing of it logged
    comm_watchdog_phase(tr->world, 1, "sampling at step %d", step);
    if (!stopped && smp) stopped = !sample(tr, step);
    comm_watchdog_phase(tr->world, 1, "checkpoint at step %d", step);
    if (save || (stopped && cfg->out_dir && !loaded)) save_checkpoint(tr, step);
    if (stopped && is_root(tr))
        printf("stopped by a signal after step %d (during evaluation)%s\n", step,
               !cfg->out_dir ? " (no -o: nothing saved)"
               : loaded      ? "; its checkpoint was already there, resume with -y 1"
                             : "; checkpoint written, resume with -y 1");
    return !stopped;
}

// After step `step`: when any rank saw a stop signal, every rank lands the update in flight and checkpoints
// step + 1. Returns 1 when the run stops.
static int stop_after_step(Trainer* tr, int step) {
    comm_watchdog_phase(tr->world, 0, "step %d: stop check", step);
    if (!stop_requested(tr)) return 0;
    comm_watchdog_phase(tr->world, 1, "checkpoint at step %d", step + 1);
    settle_updates(tr);
    if (tr->cfg.out_dir) save_checkpoint(tr, step + 1);
    if (is_root(tr))
        printf("stopped by a signal after step %d%s%s\n", step + 1,
               tr->cfg.out_dir ? "; checkpoint written, resume with -y 1" : " (no -o: nothing saved)",
               tr->delayed && tr->cfg.out_dir ? " (-dpu: the update in flight landed for it, as at a -n checkpoint)" : "");
    return 1;
}

int main(int argc, char** argv) {
    Trainer tr;
    trainer_setup(&tr, argc, argv);
    if (config_generates(&tr.cfg)) {
        generate(&tr);
        trainer_teardown(&tr);
        return 0;
    }
    double avg_seconds = 0.0, start = now_seconds();
    LrRangeTest range = {0};
    int step = tr.first_step;
    for (; step <= tr.max_steps; step++) {
        int last = step == tr.max_steps;
        if (!between_steps(&tr, step, last) || last) break;
        report_comm_reset(&tr.grid);
        double t0 = now_seconds();
        StepResult r = train_step(&tr, step);
        comm_watchdog_phase(tr.world, 0, "step %d: report", step);
        report_step(&tr, step, &r, now_seconds() - t0, &avg_seconds);
        check_nonfinite(&tr, step, &r);
        if ((tr.cfg.range_test.steps && lr_range_record(&range, r.lr, r.loss)) || stop_after_step(&tr, step)) {
            step++;
            break;
        }
    }
    if (tr.cfg.range_test.steps) lr_range_finish(&range, &tr.log, is_root(&tr));
    print_finish(&tr, (step < tr.max_steps ? step : tr.max_steps) - tr.first_step, now_seconds() - start);
    trainer_teardown(&tr);
    return 0;
}
