// hellaswag.c: see hellaswag.h.
#include "core/run/hellaswag.h"

#include <string.h>

#include "base/common.h"
#include "core/model/context_layout.h"

void hellaswag_open(EvalFile* ef, const char* path, int vocab, int T) {
    eval_file_read(ef, path, vocab, T);
    if (ef->count == 0)
        fail("-hs %s: each of its %d examples is longer than -t %d tokens (context and longest ending)", path, ef->dropped, T);
}

int hellaswag_predict(const double mean[EVAL_ENDINGS]) {
    int best = 0;
    for (int k = 1; k < EVAL_ENDINGS; k++) best = mean[k] < mean[best] ? k : best;
    return best;
}

// This replica's share of the examples, [first, first + mine), and the largest share, per. The context ranks
// of a replica share its rows.
typedef struct {
    int first, mine, per;
} Share;

static Share share_of(int count, const Grid* g) {
    int per = (count + g->replicas - 1) / g->replicas, first = per * g->replica;
    int mine = count - first < per ? count - first : per;
    return (Share){first, mine > 0 ? mine : 0, per};
}

// A batch row for ending k of ex: its tokens are the context, then the ending; the inputs are all but the
// last, the targets all but the first. Past them the row holds token 0, which causal attention keeps from
// the scored positions.
static void fill_row(int* in, int* tg, int T, const EvalFile* ef, const EvalExample* ex, int k) {
    int nc, ne;
    const int* c = eval_example_tokens(ef, ex, -1, &nc);
    const int* e = eval_example_tokens(ef, ex, k, &ne);
    int n = nc + ne;   // <= T: longer examples were dropped when the file was read
    for (int i = 0; i < T; i++) {
        in[i] = i < n - 1 ? (i < nc ? c[i] : e[i - nc]) : 0;
        tg[i] = i < n - 1 ? (i + 1 < nc ? c[i + 1] : e[i + 1 - nc]) : 0;
    }
}

// Whole rows, (B, T), and this rank's positions of them (context_layout.h): Tl = T / cp of each row.
typedef struct {
    int *inputs, *targets;
    double* losses;
    int Tl;
} Rows;

// The position of this rank's row element i (the layout says where: Ulysses' or the ring's).
static int position_of(const EvalRunner* r, const Rows* w, int i) {
    return context_position(r->chunks->layout->cp_ring, r->grid->cp, r->grid->cp_rank, w->Tl, i);
}

// Forward f's rows: rows f*B .. f*B + B-1 of this replica's share, four per example; past the share, pads.
// The model reads this rank's positions of them.
static void fill_batch(const EvalRunner* r, const Rows* w, const EvalFile* ef, Share s, int f) {
    for (int b = 0; b < r->B; b++) {
        long long row = (long long)f * r->B + b;
        int* in = w->inputs + (size_t)b * r->T;
        int* tg = w->targets + (size_t)b * r->T;
        if (row < (long long)EVAL_ENDINGS * s.mine) {
            fill_row(in, tg, r->T, ef, &ef->examples[s.first + row / EVAL_ENDINGS], (int)(row % EVAL_ENDINGS));
        } else {
            memset(in, 0, (size_t)r->T * sizeof(int));
            memset(tg, 0, (size_t)r->T * sizeof(int));
        }
        for (int i = 0; i < w->Tl; i++) {
            r->inputs[(size_t)b * w->Tl + i] = in[position_of(r, w, i)];
            r->targets[(size_t)b * w->Tl + i] = tg[position_of(r, w, i)];
        }
    }
}

// This rank's token losses (B, Tl) into the whole rows' (B, T): each position is one context rank's, the
// others add exact zeros.
static void gather_losses(const EvalRunner* r, const Rows* w, const float* mine) {
    memset(w->losses, 0, (size_t)r->B * r->T * sizeof(double));
    for (int b = 0; b < r->B; b++)
        for (int i = 0; i < w->Tl; i++) w->losses[(size_t)b * r->T + position_of(r, w, i)] = mine[(size_t)b * w->Tl + i];
    if (r->grid->cp_group) comm_allreduce_host_sum(r->grid->cp_group, w->losses, r->B * r->T);
}

// The mean loss over ending k's tokens: each is the target of the position before it, so they are
// positions context-1 .. context+len-2 of the row.
static double ending_loss(const double* row, const EvalExample* ex, int k) {
    double sum = 0.0;
    for (int j = 0; j < ex->ending[k]; j++) sum += row[ex->context - 1 + j];
    return sum / ex->ending[k];
}

// Forward f's scored rows into mean (this replica's rows, four per example).
static void keep_means(const EvalRunner* r, const EvalFile* ef, Share s, int f, const double* losses, double* mean) {
    for (int b = 0; b < r->B; b++) {
        long long row = (long long)f * r->B + b;
        if (row >= (long long)EVAL_ENDINGS * s.mine) return;
        const EvalExample* ex = &ef->examples[s.first + row / EVAL_ENDINGS];
        mean[row] = ending_loss(losses + (size_t)b * r->T, ex, (int)(row % EVAL_ENDINGS));
    }
}

// A stop request on any rank, agreed over the world.
static int stop_agreed(const EvalRunner* r) {
    long long stop = r->stop_seen();
    comm_allreduce_host_max_i64(r->grid->world, &stop, 1);
    return stop > 0;
}

int hellaswag_evaluate(const EvalRunner* r, const EvalFile* ef, EvalScore* score) {
    const Grid* g = r->grid;
    Share s = share_of(ef->count, g);
    int forwards = (int)(((long long)EVAL_ENDINGS * s.per + r->B - 1) / r->B);
    size_t whole = (size_t)r->B * r->T;
    Rows w = {xmalloc(whole * sizeof(int)), xmalloc(whole * sizeof(int)), xmalloc(whole * sizeof(double)), r->T / g->cp};
    // The losses are whole on every rank of the head's tensor group once its context ranks pooled them: the
    // replica's first such rank tallies them.
    int head = model_has_head(pipeline_head_chunk(r->pipe, r->chunks)), tally = head && g->tp_rank == 0 && g->cp_rank == 0;
    double* mean = (double*)xmalloc((size_t)EVAL_ENDINGS * s.per * sizeof(double));   // per >= 1: hellaswag_open refused a file without an example that fits
    float* losses = (float*)xmalloc((size_t)r->B * w.Tl * sizeof(float));
    int stopped = 0;
    for (int f = 0; f < forwards; f++) {
        if (f > 0 && (stopped = stop_agreed(r))) break;
        fill_batch(r, &w, ef, s, f);
        if (!pipeline_forward_token_losses(r->pipe, r->chunks, r->be, r->inputs, r->targets, losses)) continue;
        gather_losses(r, &w, losses);
        if (tally) keep_means(r, ef, s, f, w.losses, mean);
    }
    long long counts[2] = {0, 0};   // correct, scored
    for (int i = 0; tally && !stopped && i < s.mine; i++) {
        counts[0] += hellaswag_predict(mean + (size_t)EVAL_ENDINGS * i) == ef->examples[s.first + i].label;
        counts[1]++;
    }
    free(losses);
    free(mean);
    free(w.inputs), free(w.targets), free(w.losses);
    if (stopped) return 0;
    comm_allreduce_host_sum_i64(g->world, counts, 2);
    if (counts[1] != ef->count) fail("internal: %lld HellaSwag examples scored, %d in the file", counts[1], ef->count);
    *score = (EvalScore){counts[0], counts[1]};
    return 1;
}
