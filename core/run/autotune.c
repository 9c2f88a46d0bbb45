// autotune.c: see autotune.h.
#include "core/run/autotune.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "core/model/context_parallel.h"
#include "core/model/lora.h"
#include "core/run/flags.h"
#include "core/util/fs.h"

extern char** environ;

enum { DEFAULT_TRIALS = 4, DEFAULT_STEPS = 4, MAX_ARGS = 512 };

// One layout: the flags the search sets.
typedef struct {
    int zero, offload, recompute, offload_act;
    int pp, vp, tp, sp, cp;
    ScheduleKind schedule;
    int B, ga;
} Layout;

typedef enum { REFUSED, TOO_LARGE, FITS } Verdict;

typedef struct {
    Layout l;
    char flags[160];         // the layout as flags
    Verdict verdict;
    size_t device, host;     // the heaviest stage's planned bytes per rank
    double bubble, cost;     // the schedule's bubble; the cost model's relative step time
    int timed, failed;       // a trial ran; it failed
    double ms;               // the trial's mean step time after the warm-up step
    char error[512];         // the trainer's refusal, or the failed trial's last error line
} Candidate;

// An argument vector that owns the text of the words it adds.
typedef struct {
    char* v[MAX_ARGS + 1];
    int n;
    char text[2048];
    size_t used;
} Args;

typedef struct {
    const Config* cfg;       // the search's own command line
    StatePlanner states;
    ModelShape shape;
    LoraFamily lora;
    int ranks;
    long long sequences;     // per step: the global batch over -t
    int trials, steps;
    const char* prog;        // argv[0]
    Args run_flags;          // what each trial and the printed command carry of the command line
    Args shown_only;         // what only the printed command carries (-x, -o, -ow)
    char dir[PATH_MAX];      // -o, or the current directory: autotune.json and autotune/
    Candidate* cands;
    int count;
} Search;

static void args_add(Args* a, const char* word) {
    if (a->n >= MAX_ARGS) fail("--autotune: more than %d arguments", MAX_ARGS);
    a->v[a->n++] = (char*)word;
    a->v[a->n] = NULL;
}

// Each space-separated word of text, copied into a.
static void args_add_words(Args* a, const char* text) {
    size_t len = strlen(text);
    if (a->used + len + 1 > sizeof(a->text)) fail("--autotune: a command line longer than %zu bytes", sizeof(a->text));
    char* copy = a->text + a->used;
    memcpy(copy, text, len + 1);
    a->used += len + 1;
    for (char* word = strtok(copy, " "); word; word = strtok(NULL, " ")) args_add(a, word);
}

static void args_add_all(Args* a, const Args* from) {
    for (int i = 0; i < from->n; i++) args_add(a, from->v[i]);
}

static void layout_flags(const Layout* l, char* out, size_t n) {
    size_t at = (size_t)snprintf(out, n, "-z %d", l->zero);
    if (l->offload) at += (size_t)snprintf(out + at, n - at, " -offload %d", l->offload);
    if (l->recompute) at += (size_t)snprintf(out + at, n - at, " -r %d", l->recompute);
    if (l->offload_act) at += (size_t)snprintf(out + at, n - at, " -offload-act 1");
    if (l->pp > 1) at += (size_t)snprintf(out + at, n - at, " -pp %d -ps %s", l->pp, schedule_kind_name(l->schedule));
    if (l->schedule == SCHEDULE_INTERLEAVED) at += (size_t)snprintf(out + at, n - at, " -vp %d", l->vp);
    if (l->tp > 1) at += (size_t)snprintf(out + at, n - at, " -tp %d", l->tp);
    if (l->sp) at += (size_t)snprintf(out + at, n - at, " -sp 1");
    if (l->cp > 1) at += (size_t)snprintf(out + at, n - at, " -cp %d", l->cp);
    snprintf(out + at, n - at, " -b %d -ga %d", l->B, l->ga);
}

static void trial_dir(const Search* s, int trial, char* out, size_t n) {
    if (snprintf(out, n, "%s/autotune/trial%d", s->dir, trial) >= (int)n) fail("--autotune: -o %s is too long a path", s->dir);
}

// The trainer's arguments for candidate c's trial (program name first).
static void trial_args(const Search* s, const Candidate* c, int trial, Args* a, char* steps, char* dir, size_t dir_size) {
    a->n = 0;
    a->used = 0;
    args_add(a, s->prog);
    args_add_all(a, &s->run_flags);
    args_add_words(a, c->flags);
    snprintf(steps, 16, "%d", s->steps);
    trial_dir(s, trial, dir, dir_size);
    args_add(a, "-x");
    args_add(a, steps);
    args_add(a, "-o");
    args_add(a, dir);
    args_add(a, "-ow");
    args_add(a, "1");
}

// The set-up calls of the trainer's start (train_gpt.cu) for c's trial, which end the process with the
// trainer's one-line refusal when it would refuse the layout.
static void candidate_config(const Search* s, const Candidate* c, Config* cfg, PipelinePlan* plan) {
    Args a;
    char steps[16], dir[PATH_MAX];
    trial_args(s, c, 0, &a, steps, dir, sizeof(dir));
    config_parse(cfg, a.n, a.v);
    config_resolve_precision(cfg);
    config_resolve_batch(cfg, s->shape.maxT, s->ranks, cfg->pipeline_stages * cfg->tensor_parallel * cfg->context_parallel);
    pipeline_plan(plan, &s->shape, cfg->pipeline_stages, cfg->pipe_schedule, cfg->virtual_stages, cfg->tensor_parallel,
                  cfg->context_parallel, cfg->context_mode == CP_RING, s->ranks, cfg->T, cfg->grad_accum);
}

// In a child: candidate_config and every rank's layout (the tensor split's checks), then one byte on `passed`.
static void check_candidate(const Search* s, const Candidate* c, int passed) {
    Config cfg;
    PipelinePlan plan;
    candidate_config(s, c, &cfg, &plan);
    ParamLayout* lay = (ParamLayout*)xmalloc(sizeof(ParamLayout));
    for (int st = 0; st < plan.stages; st++)
        for (int t = 0; t < plan.tp; t++) pipeline_stage_layout(lay, &plan, &s->shape, plan_replicas(&plan, s->ranks), st, t);
    free(lay);
    if (write(passed, "k", 1) != 1) _exit(2);
}

// Reads fd to its end into out (at most size - 1 bytes kept, NUL-terminated); the bytes read.
static size_t read_all(int fd, char* out, size_t size) {
    size_t total = 0;
    char buf[4096];
    for (;;) {
        ssize_t got = read(fd, buf, sizeof(buf));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t keep = total < size - 1 ? size - 1 - total : 0;
        memcpy(out + (total < size - 1 ? total : size - 1), buf, (size_t)got < keep ? (size_t)got : keep);
        total += (size_t)got;
    }
    out[total < size - 1 ? total : size - 1] = '\0';
    return total;
}

// Checks candidates first.. in one child until one is refused: their count passed; the refusal's line in why.
static int check_from(const Search* s, int first, char* why, size_t why_size) {
    int passed[2], errors[2];
    if (pipe(passed) != 0 || pipe(errors) != 0) fail("--autotune: pipe: %s", strerror(errno));
    flush_stdout();
    pid_t pid = fork();
    if (pid < 0) fail("--autotune: fork: %s", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || dup2(null, 1) < 0 || dup2(errors[1], 2) < 0) _exit(2);
        close(passed[0]);
        close(errors[0]);
        for (int i = first; i < s->count; i++) check_candidate(s, &s->cands[i], passed[1]);
        _exit(0);
    }
    close(passed[1]);
    close(errors[1]);
    char counts[1];
    int ok = (int)read_all(passed[0], counts, sizeof(counts));
    read_all(errors[0], why, why_size);
    close(passed[0]);
    close(errors[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) fail("--autotune: waitpid: %s", strerror(errno));
    char* end = strchr(why, '\n');
    if (end) *end = '\0';
    if (first + ok < s->count && !why[0]) snprintf(why, why_size, "the check ended with status %d", status);
    return ok;
}

// Marks each candidate the trainer refuses, with its one-line reason ("error: " dropped).
static void check_all(Search* s) {
    int next = 0;
    while (next < s->count) {
        char why[512];
        next += check_from(s, next, why, sizeof(why));
        if (next == s->count) break;
        Candidate* c = &s->cands[next++];
        c->verdict = REFUSED;
        snprintf(c->error, sizeof(c->error), "%s", strncmp(why, "error: ", 7) ? why : why + 7);
    }
}

static void add_candidate(Search* s, const Layout* l) {
    if (s->count % 256 == 0) s->cands = (Candidate*)xrealloc(s->cands, (size_t)(s->count + 256) * sizeof(Candidate));
    Candidate* c = &s->cands[s->count++];
    memset(c, 0, sizeof(*c));
    c->l = *l;
    c->verdict = FITS;   // until the checks or the planner say otherwise
    layout_flags(l, c->flags, sizeof(c->flags));
}

// Every -z, -offload and -r (and at -r 3 -offload-act) over one parallel layout and batch split (-offload 2
// only from -z 2, as --estimate's capacity table counts: the loops leave out what cannot be legal, the checks
// decide the rest).
static void add_memory_options(Search* s, Layout l) {
    for (l.zero = 0; l.zero <= 3; l.zero++)
        for (l.offload = 0; l.offload <= (l.zero >= 2 ? 2 : 1); l.offload++)
            for (l.recompute = 0; l.recompute <= 3; l.recompute++)
                for (l.offload_act = 0; l.offload_act <= (l.recompute == 3); l.offload_act++) add_candidate(s, &l);
}

// Every split of one replica's sequences into -b x -ga.
static void add_batch_splits(Search* s, Layout l, long long per_replica) {
    for (long long b = 1; b <= per_replica && b <= INT_MAX; b++) {
        if (per_replica % b || per_replica / b > INT_MAX) continue;
        l.B = (int)b;
        l.ga = (int)(per_replica / b);
        add_memory_options(s, l);
    }
}

// Each schedule (with interleaving, each -vp up to a block per virtual stage) of a -pp, -tp and -sp.
static void add_schedules(Search* s, Layout l, long long per_replica) {
    const ScheduleKind kinds[] = {SCHEDULE_1F1B, SCHEDULE_ZB, SCHEDULE_INTERLEAVED};
    for (int k = 0; k < (l.pp > 1 ? 3 : 1); k++) {
        int interleaved = kinds[k] == SCHEDULE_INTERLEAVED;
        l.schedule = kinds[k];
        for (l.vp = interleaved ? 2 : 1; l.vp <= (interleaved ? MAX_CHUNKS : 1) && l.pp * l.vp <= s->shape.L; l.vp++)
            add_batch_splits(s, l, per_replica);
    }
}

// Whether -tp can split the model: the trainer's own predicates (model.h), which say so without exiting.
static int splits_tensors(const ModelShape* shape, int tp) {
    char why[256];
    return shape_splits_vocab(shape, tp) && shape->family->splits_tp(shape, tp, why, sizeof(why));
}

// Whether -cp can split each tensor rank's attention heads under -cpm's mode (the ring splits none): the
// trainer's own predicate (context_parallel.h).
static int splits_context(const ModelShape* shape, int tp, int cp, ContextMode mode) {
    char why[256];
    return cp == 1 || mode == CP_RING || context_splits(shape, tp, cp, why, sizeof(why));
}

// Every layout of the world: stages (a block each at least) x tensor ranks x context ranks x replicas, the
// replicas splitting the global batch (the context ranks of a replica share its sequences).
static void enumerate(Search* s) {
    for (int pp = 1; pp <= s->ranks && pp <= s->shape.L; pp++)
        for (int tp = 1; pp * tp <= s->ranks; tp++)
            for (int cp = 1; pp * tp * cp <= s->ranks; cp++) {
                int replicas = s->ranks / (pp * tp * cp);
                if (s->ranks % (pp * tp * cp) || s->sequences % replicas || !splits_tensors(&s->shape, tp) ||
                    !splits_context(&s->shape, tp, cp, s->cfg->context_mode))
                    continue;
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    Layout l = {.pp = pp, .tp = tp, .sp = sp, .cp = cp};
                    add_schedules(s, l, s->sequences / replicas);
                }
            }
}

// The cost model: a step's time relative to the plain layout's, from what each choice is known to cost.
static double layout_cost(const Layout* l, double bubble) {
    static const double recompute[] = {1.0, 1.05, 1.15, 1.33};   // the forward work each -r redoes
    static const double offload[] = {1.0, 1.3, 1.6};             // host transfers and the host's optimizer
    double cost = recompute[l->recompute] * offload[l->offload] * (1.0 + bubble);
    cost *= l->offload_act ? 1.05 : 1.0;       // the block inputs' copies, overlapped but for their waits
    cost *= 1.0 + 0.1 * (l->cp - 1);           // -cp's all-to-alls (or ring passes) around every attention
    cost *= l->zero == 3 ? 1.1 : 1.0;          // ZeRO-3 gathers every unit's parameters for each micro-batch
    cost *= 1.0 + 0.1 * (l->tp - 1);           // -tp's collectives inside every block
    cost *= 1.0 + 0.02 * (l->ga - 1);          // each micro-batch's fixed overhead: a larger -b is cheaper
    return cost;
}

// The planner's bytes and the cost of each candidate the trainer accepts; those over the budgets are marked.
static void plan_all(Search* s) {
    double gib = (double)(1ull << 30);
    for (int i = 0; i < s->count; i++) {
        Candidate* c = &s->cands[i];
        if (c->verdict == REFUSED) continue;
        Config cfg;
        PipelinePlan plan;
        candidate_config(s, c, &cfg, &plan);
        PlanPeak peak = plan_peak(s->states, &cfg, &plan, &s->shape, s->ranks);
        c->device = peak.device;
        c->host = peak.host;
        c->bubble = plan.bubble;
        c->cost = layout_cost(&c->l, plan.bubble);
        int over = (double)c->device > s->cfg->gpu_mem_gib * gib || (s->cfg->host_mem_gib > 0 && (double)c->host > s->cfg->host_mem_gib * gib);
        if (over) c->verdict = TOO_LARGE;
    }
}

// Fitting candidates first, cheapest first (then the fewest device bytes, then the enumeration's order).
static int by_cost(const void* a, const void* b) {
    const Candidate *x = (const Candidate*)a, *y = (const Candidate*)b;
    if ((x->verdict == FITS) != (y->verdict == FITS)) return x->verdict == FITS ? -1 : 1;
    if (x->cost != y->cost) return x->cost < y->cost ? -1 : 1;
    if (x->device != y->device) return x->device < y->device ? -1 : 1;
    return memcmp(&x->l, &y->l, sizeof(Layout));
}

// Timed and succeeded first, fastest first; then the failed trials; then the rest by cost.
static int by_speed(const void* a, const void* b) {
    const Candidate *x = (const Candidate*)a, *y = (const Candidate*)b;
    int rx = x->timed ? (x->failed ? 1 : 0) : 2, ry = y->timed ? (y->failed ? 1 : 0) : 2;
    if (rx != ry) return rx - ry;
    if (rx == 0 && x->ms != y->ms) return x->ms < y->ms ? -1 : 1;
    return by_cost(a, b);
}

// The last line of the trial's console that starts "error:" into c->error.
static void note_failure(Candidate* c, const char* console_dir, const char* console_name) {
    char why[256];
    char* text = read_small_text(console_dir, console_name, why, sizeof(why));
    if (!text) {
        snprintf(c->error, sizeof(c->error), "no output (%s)", why);
        return;
    }
    const char* last = NULL;
    const char* words = NULL;   // without an error line (mpirun's own messages): the first line of words
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "error:", 6)) last = line;
        if (!words && strpbrk(line, "abcdefghijklmnopqrstuvwxyz")) words = line;
    }
    snprintf(c->error, sizeof(c->error), "%s", last ? last : words ? words : "no output");
    free(text);
}

// The mean of the log's step times after the first step; 0 when it holds none.
static double mean_step_ms(const char* dir) {
    char why[256];
    char* text = read_small_text(dir, "log.jsonl", why, sizeof(why));
    if (!text) return 0.0;
    double sum = 0.0;
    int n = 0;
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char* dt = strstr(line, "\"dt_ms\": ");
        const char* step = strstr(line, "\"step\": ");
        if (!dt || !step || atoi(step + 8) == 0) continue;
        sum += strtod(dt + 9, NULL);
        n++;
    }
    free(text);
    return n ? sum / n : 0.0;
}

// Runs the trial (mpirun -np W on more than one rank), its console in autotune/trial<i>.txt; the exit status.
static int run_trial(const Search* s, const Args* trainer, const char* console) {
    Args a = {.n = 0};
    char np[16];
    snprintf(np, sizeof(np), "%d", s->ranks);
    if (s->ranks > 1) {
        args_add(&a, "mpirun");
        args_add(&a, "-np");
        args_add(&a, np);
    }
    args_add_all(&a, trainer);
    posix_spawn_file_actions_t io;
    if (posix_spawn_file_actions_init(&io) || posix_spawn_file_actions_addopen(&io, 1, console, O_WRONLY | O_CREAT | O_TRUNC, 0644) ||
        posix_spawn_file_actions_adddup2(&io, 1, 2))
        fail("--autotune: cannot set up a trial's output");
    flush_stdout();
    pid_t pid;
    int err = posix_spawnp(&pid, a.v[0], &io, NULL, a.v, environ);
    posix_spawn_file_actions_destroy(&io);
    if (err) fail("--autotune: cannot start %s: %s", a.v[0], strerror(err));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) fail("--autotune: waitpid: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void time_candidate(const Search* s, Candidate* c, int trial) {
    Args a;
    char steps[16], dir[PATH_MAX], console_name[64], console[PATH_MAX + 80];
    trial_args(s, c, trial, &a, steps, dir, sizeof(dir));
    snprintf(console_name, sizeof(console_name), "trial%d.txt", trial);
    snprintf(console, sizeof(console), "%s/autotune/%s", s->dir, console_name);
    c->timed = 1;
    int status = run_trial(s, &a, console);
    c->ms = status == 0 ? mean_step_ms(dir) : 0.0;
    if (status == 0 && c->ms > 0.0) {
        remove_path(dir);   // its checkpoint: a trial's state is of no further use
        return;
    }
    c->failed = 1;
    char console_dir[PATH_MAX + 16];
    snprintf(console_dir, sizeof(console_dir), "%s/autotune", s->dir);
    if (status) note_failure(c, console_dir, console_name);
    else snprintf(c->error, sizeof(c->error), "its log.jsonl holds no step after the first");
}

static double tokens_per_second(const Search* s, const Candidate* c) {
    return (double)s->sequences * s->cfg->T / (c->ms / 1e3);
}

static void time_best(Search* s, int fits) {
    int trials = fits < s->trials ? fits : s->trials;
    char where[PATH_MAX + 16];
    snprintf(where, sizeof(where), "%s/autotune", s->dir);
    make_dirs(where);
    for (int i = 0; i < trials; i++) {
        Candidate* c = &s->cands[i];
        printf("autotune: trial %d/%d: %s (cost %.3f, %.3f GiB device, %.3f GiB host) ...", i + 1, trials, c->flags, c->cost,
               (double)c->device / (1 << 30), (double)c->host / (1 << 30));
        time_candidate(s, c, i + 1);
        if (c->failed) printf(" failed: %s\n", c->error);
        else printf(" %.2f ms/step, %.0f tokens/s\n", c->ms, tokens_per_second(s, c));
    }
}

// The command line of candidate c as the user runs it: the search's flags, the layout's, -x and -o as given.
static void command_of(const Search* s, const Candidate* c, char* out, size_t n) {
    size_t at = s->ranks > 1 ? (size_t)snprintf(out, n, "mpirun -np %d ", s->ranks) : 0;
    Args words = {.n = 0};
    args_add(&words, s->prog);
    args_add_all(&words, &s->run_flags);
    args_add_words(&words, c->flags);
    args_add_all(&words, &s->shown_only);
    for (int i = 0; i < words.n && at < n; i++) {
        const char* w = words.v[i];
        int plain = w[0] && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == strlen(w);
        if (plain) at += (size_t)snprintf(out + at, n - at, "%s%s", i ? " " : "", w);
        else {   // single-quoted, each ' as '\''
            at += (size_t)snprintf(out + at, n - at, "%s'", i ? " " : "");
            for (const char* p = w; *p && at < n; p++) at += (size_t)snprintf(out + at, n - at, *p == '\'' ? "'\\''" : "%c", *p);
            if (at < n) at += (size_t)snprintf(out + at, n - at, "'");
        }
    }
    if (at >= n) fail("--autotune: the fastest layout's command line is longer than %zu bytes", n);
}

static void print_table(const Search* s, int timed) {
    printf("\n%-44s %11s %9s %9s %10s\n", "layout (fastest first)", "device GiB", "host GiB", "ms/step", "tokens/s");
    for (int i = 0; i < timed; i++) {
        const Candidate* c = &s->cands[i];
        printf("%-44s %11.4f %9.4f", c->flags, (double)c->device / (1 << 30), (double)c->host / (1 << 30));
        if (c->failed) printf("   failed: %s\n", c->error);
        else printf(" %9.2f %10.0f\n", c->ms, tokens_per_second(s, c));
    }
}

static void json_string(FILE* f, const char* text) {
    fputc('"', f);
    for (const unsigned char* p = (const unsigned char*)text; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_candidate(FILE* f, const Search* s, const Candidate* c) {
    fprintf(f, "{\"flags\": ");
    json_string(f, c->flags);
    fprintf(f, ", \"device_bytes\": %zu, \"host_bytes\": %zu, \"cost\": %.6g, \"bubble\": %.6g, ", c->device, c->host, c->cost, c->bubble);
    if (c->timed && !c->failed) fprintf(f, "\"ms\": %.6g, \"tokens_per_s\": %.6g, \"error\": null}", c->ms, tokens_per_second(s, c));
    else {
        fprintf(f, "\"ms\": null, \"tokens_per_s\": null, \"error\": ");
        if (c->failed) json_string(f, c->error);
        else fprintf(f, "null");
        fprintf(f, "}");
    }
}

// autotune.json: the search's counts, every layout that fits (the timed ones first, fastest first) and the
// fastest's command line.
static void write_json(const Search* s, const int counts[3], const char* best_command, const char* best_flags) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/autotune.json", s->dir);
    FILE* f = xfopen(path, "w");
    fprintf(f, "{\"ranks\": %d, \"gpu_mem_gib\": %.6g, \"host_mem_gib\": %.6g, \"sequences_per_step\": %lld, \"t\": %d, ", s->ranks,
            s->cfg->gpu_mem_gib, s->cfg->host_mem_gib, s->sequences, s->cfg->T);
    fprintf(f, "\"steps_per_trial\": %d, \"candidates\": %d, \"refused\": %d, \"too_large\": %d, \"fit\": %d,\n \"layouts\": [", s->steps,
            s->count, counts[REFUSED], counts[TOO_LARGE], counts[FITS]);
    for (int i = 0; i < counts[FITS]; i++) {
        fprintf(f, "%s\n  ", i ? "," : "");
        json_candidate(f, s, &s->cands[i]);
    }
    fprintf(f, "],\n \"best\": {\"flags\": ");
    json_string(f, best_flags);
    fprintf(f, ", \"command\": ");
    json_string(f, best_command);
    if (fprintf(f, "}}\n") < 0) fail("write error in %s", path);
    xfclose(f, path);
}

// The flags the search sets, which the command line may not give.
static const char* const SEARCHED[] = {"-z", "-offload", "-offload-act", "-r", "-pp", "-ps", "-vp", "-tp", "-sp", "-cp"};
// The search's own flags and the global batch's: neither a trial nor the printed command carries them.
static const char* const SEARCH_ONLY[] = {"--autotune", "-autotune-trials", "-autotune-steps", "-w", "-gpu-mem", "-host-mem", "-disk-mem", "-b", "-ga", "-d"};
// What the printed command carries but a trial replaces (with -x S, -o autotune/trial<i>, -ow 1).
static const char* const SHOWN_ONLY[] = {"-x", "-o", "-ow"};

static int named_in(const char* name, const char* const* list, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(name, list[i])) return 1;
    return 0;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

// Sorts the command line's flags (config_parse has accepted them) into what the trials and the printed
// command carry; a searched flag, or -y, is refused.
static void sort_flags(Search* s, int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        const Flag* f = flag_find(argv[i]);
        int has_value = f->type != FLAG_SWITCH && f->type != FLAG_HELP;
        if (named_in(f->name, SEARCHED, COUNT(SEARCHED)))
            fail("--autotune searches %s (with -z, -offload, -r, -pp, -ps, -vp, -tp and -sp): drop it from the command line", f->name);
        if (!strcmp(f->name, "-y")) fail("--autotune times fresh runs of each layout: -y resumes one; drop it");
        Args* to = named_in(f->name, SEARCH_ONLY, COUNT(SEARCH_ONLY)) ? NULL : named_in(f->name, SHOWN_ONLY, COUNT(SHOWN_ONLY)) ? &s->shown_only : &s->run_flags;
        if (to) args_add(to, argv[i]);
        if (to && has_value) args_add(to, argv[i + 1]);
        i += has_value;
    }
}

static void check_not_launched(void) {
    const char* names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (int i = 0; i < COUNT(names); i++)
        if (getenv(names[i]))
            fail("--autotune runs in one process and launches each trial on -w ranks itself: run it without mpirun");
}

// The global batch in sequences of -t: -d's tokens, else -b x -ga on every rank as data-parallel replicas.
static long long global_sequences(const Config* cfg, int ranks) {
    if (!cfg->total_batch) return (long long)cfg->B * cfg->grad_accum * ranks;
    if (cfg->total_batch % cfg->T) fail("--autotune: -d %lld tokens is not a whole number of sequences of -t %d", cfg->total_batch, cfg->T);
    return cfg->total_batch / cfg->T;
}

static void search_init(Search* s, const Config* cfg, StatePlanner states, ModelResolver resolve, int argc, char** argv) {
    memset(s, 0, sizeof(*s));
    s->cfg = cfg;
    s->states = states;
    s->prog = argv[0];
    s->ranks = cfg->plan_ranks ? cfg->plan_ranks : 1;
    s->trials = cfg->autotune_trials ? cfg->autotune_trials : DEFAULT_TRIALS;
    s->steps = cfg->autotune_steps ? cfg->autotune_steps : DEFAULT_STEPS;
    int is_spec;
    s->shape = lora_apply(&s->lora, resolve(cfg->model, &is_spec), &cfg->lora);
    if (cfg->T > s->shape.maxT) fail("-t %d exceeds the model's maximum sequence length %d", cfg->T, s->shape.maxT);
    s->sequences = global_sequences(cfg, s->ranks);
    snprintf(s->dir, sizeof(s->dir), "%s", cfg->out_dir ? cfg->out_dir : ".");
    if (cfg->out_dir) make_dirs(cfg->out_dir);
    sort_flags(s, argc, argv);
}

// The one line when nothing fits: the smallest plan, which the budget would have to reach.
static void fail_nothing_fits(const Search* s, const int counts[3]) {
    if (!s->count)
        fail("--autotune -w %d: no layout of %d rank%s splits a global batch of %lld sequences of -t %d (the replicas must "
             "divide it, -pp the layers, -tp the heads and vocabulary, -cp the heads)", s->ranks, s->ranks, s->ranks > 1 ? "s" : "",
             s->sequences, s->cfg->T);
    if (!counts[TOO_LARGE])
        fail("--autotune -w %d: the trainer refuses every layout of %d rank%s for this model and a global batch of %lld "
             "sequences of -t %d (one: %s)", s->ranks, s->ranks, s->ranks > 1 ? "s" : "", s->sequences, s->cfg->T,
             s->cands[s->count - 1].error);
    const Candidate* least = NULL;
    for (int i = 0; i < s->count; i++)
        if (s->cands[i].verdict == TOO_LARGE && (!least || s->cands[i].device < least->device)) least = &s->cands[i];
    fail("--autotune: none of the %d layouts fits -gpu-mem %g GiB%s: the smallest plan is %.4f GiB of device memory "
         "(%.4f GiB host) per rank, %s", counts[TOO_LARGE], s->cfg->gpu_mem_gib, s->cfg->host_mem_gib > 0 ? " and -host-mem" : "",
         (double)least->device / (1 << 30), (double)least->host / (1 << 30), least->flags);
}

static void search(Search* s) {
    enumerate(s);
    check_all(s);
    plan_all(s);
    qsort(s->cands, (size_t)s->count, sizeof(Candidate), by_cost);
    int counts[3] = {0};
    for (int i = 0; i < s->count; i++) counts[s->cands[i].verdict]++;
    if (!counts[FITS]) fail_nothing_fits(s, counts);
    printf("autotune: %d rank%s, %lld sequences of %d tokens per step: %d layouts, %d refused by the trainer's checks, "
           "%d over the memory budget, %d fit; timing the cheapest %d for %d steps each\n", s->ranks, s->ranks > 1 ? "s" : "",
           s->sequences, s->cfg->T, s->count, counts[REFUSED], counts[TOO_LARGE], counts[FITS],
           counts[FITS] < s->trials ? counts[FITS] : s->trials, s->steps);
    time_best(s, counts[FITS]);
    int timed = counts[FITS] < s->trials ? counts[FITS] : s->trials;
    qsort(s->cands, (size_t)timed, sizeof(Candidate), by_speed);
    print_table(s, timed);
    const Candidate* best = &s->cands[0];
    char command[4096];
    command_of(s, best, command, sizeof(command));
    write_json(s, counts, best->failed ? "" : command, best->failed ? "" : best->flags);
    printf("autotune.json: %s/autotune.json\n", s->dir);
    if (best->failed) fail("--autotune: every timed layout failed (the first: %s)", best->error);
    printf("fastest: %s\n", command);
}

void autotune_if_asked(StatePlanner states, ModelResolver resolve, int argc, char** argv) {
    Config cfg;
    config_parse(&cfg, argc, argv);
    if (!cfg.autotune) return;
    check_not_launched();
    // The planner and the checks allocate and free a layout of half a megabyte per stage of each candidate:
    // kept on the heap, not mapped and faulted in afresh each time, the search is many times faster.
    if (!mallopt(M_MMAP_THRESHOLD, 64 << 20) || !mallopt(M_TRIM_THRESHOLD, 256 << 20)) fail("--autotune: mallopt failed");
    config_resolve_precision(&cfg);
    Search* s = (Search*)xmalloc(sizeof(Search));
    search_init(s, &cfg, states, resolve, argc, argv);
    search(s);
    free(s->cands);
    free(s);
    flush_stdout();
    exit(0);
}
