// generate.c: the generation loop (generate.h), its sampler, and the encoding of -prompt's and -chat's text.
#include "core/run/generate.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "base/common.h"
#include "core/model/context_layout.h"
#include "core/tokenizer/tokenizer_file.h"
#include "core/util/rng.h"

typedef struct {
    float logit;
    int id;
} Candidate;

// Larger logit first, the lower id among equals: a total order, so top-k never depends on qsort.
static int by_logit(const void* a, const void* b) {
    const Candidate *x = (const Candidate*)a, *y = (const Candidate*)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

// Zeroes the weight of every token outside the k most likely.
static void keep_top_k(double* w, const float* p, int V, int k) {
    if (k <= 0 || k >= V) return;
    Candidate* c = (Candidate*)xmalloc((size_t)V * sizeof(Candidate));
    for (int v = 0; v < V; v++) c[v] = (Candidate){p[v], v};
    qsort(c, (size_t)V, sizeof(Candidate), by_logit);
    for (int i = k; i < V; i++) w[c[i].id] = 0.0;
    free(c);
}

// A token drawn from row `row` of the head chunk's logits: softmax(logits / temperature) over the top k, one
// uniform draw (none at temperature 0).
static int sample_row(Model* head, Backend* be, int row, Rng* rng, Sampling how) {
    const ModelShape* s = &head->shape;
    float* p = (float*)xmalloc((size_t)s->V * sizeof(float));
    double* w = (double*)xmalloc((size_t)s->V * sizeof(double));
    model_logits_to_host(head, be, row, 1, p);   // collective over the tensor group
    int best = 0;
    for (int v = 1; v < s->V; v++) best = p[v] > p[best] ? v : best;
    int token = best;
    if (how.temperature > 0.0f) {
        float mx = p[best];
        for (int v = 0; v < s->V; v++) w[v] = exp((double)((p[v] - mx) / how.temperature));
        keep_top_k(w, p, s->V, how.top_k);
        double total = 0.0, acc = 0.0;
        for (int v = 0; v < s->V; v++) total += w[v];
        double coin = rng_uniform(rng) * total;
        for (token = s->V - 1; token > 0 && w[token] == 0.0; token--) {}   // the last one that can be drawn
        for (int v = 0; v < s->V; v++) {
            acc += w[v];
            if (coin < acc) { token = v; break; }
        }
    }
    free(w);
    free(p);
    return token;
}

static int is_stop(const int* stop, int nstop, int token) {
    for (int i = 0; i < nstop; i++)
        if (stop[i] == token) return 1;
    return 0;
}

// The one loop: appends tokens to text[n..n+count) (text has room for them), writing each to `out` as it
// comes (flushed at once when `stream`: -prompt's text appears token by token; a training sample's line is
// flushed whole by its caller, as it always was). Positions of the (B, T) input past the window hold `pad`: causal attention keeps them from the row
// that is read, and each caller passes the filler it has always used, so the forwards see the same bytes.
// Returns how many were appended: `count`, or fewer when a stop request came with a token before the last
// (that token is kept), or when a token of stop[0..nstop) came (kept in text, not written).
static int generate_tokens(const Generator* g, int* text, int n, int count, int pad, Rng* rng, FILE* out, int stream,
                           const int* stop, int nstop) {
    int T = g->T, Tl = T / g->cp;
    Model* head = pipeline_head_chunk(g->pipe, g->chunks);
    for (int len = n; len < n + count; len++) {
        int start = len > T ? len - T : 0, window = len - start, row = -1;
        // The (B, T) input: the window in row 0, pad elsewhere; this rank's positions of it (all without -cp).
        for (int b = 0; b < g->B; b++)
            for (int i = 0; i < Tl; i++) {
                int p = g->cp > 1 ? context_position(g->cp_ring, g->cp, g->cp_rank, Tl, i) : i;
                g->inputs[(size_t)b * Tl + i] = b == 0 && p < window ? text[start + p] : pad;
                if (b == 0 && p == window - 1) row = i;
            }
        // Every position sees only its past, so recomputing the whole (B,T) forward is correct, if wasteful.
        MicroBatch mb = {g->inputs, NULL, NULL, NULL};
        pipeline_forward(g->pipe, g->chunks, g->be, &mb);
        // The last stage's rank holding the window's last position has its logits; the max over the world hands
        // its token, and any rank's stop flag, to every rank.
        long long shared[2] = {-1, g->stop_seen()};
        if (model_has_head(head) && row >= 0) shared[0] = sample_row(head, g->be, row, rng, g->how);
        else if (g->how.temperature > 0.0f) (void)rng_uniform(rng);   // the stream in step with the drawing rank's
        comm_allreduce_host_max_i64(g->world, shared, 2);
        text[len] = (int)shared[0];
        if (is_stop(stop, nstop, text[len])) return len + 1 - n;
        if (out) {
            if (g->tokenizer) tokenizer_write(g->tokenizer, text[len], out);
            else fprintf(out, "%d ", text[len]);
            if (stream) flush_stdout();   // out is stdout
        }
        if (shared[1] > 0 && len + 1 < n + count) return len + 1 - n;
    }
    return count;
}

int generate_sample(const Generator* g, int step, int eot, int count, FILE* out) {
    if (count > g->T - 1) count = g->T - 1;   // the window never slides: every token sees the end-of-text
    Rng rng = rng_seeded(g->seed, 0x5a3b1e00ull + (uint64_t)step);   // the same text on a resumed run
    int* text = (int*)xmalloc((size_t)(1 + count) * sizeof(int));
    text[0] = eot;
    if (out) fprintf(out, "step %d | sample: ", step);
    int done = generate_tokens(g, text, 1, count, eot, &rng, out, 0, NULL, 0) == count;
    if (out) fprintf(out, done ? "\n" : " [sample stopped by a signal]\n");
    flush_stdout();
    free(text);
    return done;
}

// The compact merges file beside llm.c's tokenizer file (a tokenizer.json holds its own model).
static void load_merges_beside(BpeModel* model, const char* what, const char* tokenizer_path) {
    char merges[PATH_MAX];
    path_beside(merges, sizeof(merges), tokenizer_path, "gpt2_merges.bin");
    if (file_size(merges) < 0)
        fail("%s: no %s beside the tokenizer (scripts/tokenize.py writes it; re-run scripts/prepare_kjv.sh for the quick start's data)", what, merges);
    tokenizer_file_load(model, merges);
}

int* generate_encode_text(const char* what, const char* text, const Tokenizer* tokenizer, const char* tokenizer_path, int V, int* n) {
    if (!tokenizer) fail("%s needs the tokenizer: %s does not exist (give -tk, or -i shards prepared by scripts/tokenize.py)", what, tokenizer_path);
    BpeModel merges;
    const BpeModel* model = tokenizer_bpe(tokenizer);
    if (!model) load_merges_beside(&merges, what, tokenizer_path);
    BpeWorker* worker = bpe_worker_new(model ? model : &merges);
    BpeTokens ids = {0};
    size_t bad = bpe_encode_span(worker, (const uint8_t*)text, 0, strlen(text), 0, &ids);
    if (bad != SIZE_MAX) fail("%s is not valid UTF-8 at byte %zu", what, bad);
    int* out = (int*)xmalloc(ids.n * sizeof(int));
    for (size_t i = 0; i < ids.n; i++) {
        if (ids.v[i] >= (uint32_t)V) fail("%s encodes to token %u, outside the model's vocabulary of %d", what, ids.v[i], V);
        out[i] = (int)ids.v[i];
    }
    *n = (int)ids.n;
    free(ids.v);
    bpe_worker_free(worker);
    if (!model) bpe_model_free(&merges);
    return out;
}

void generate_from_prompt(const Generator* g, const char* text, const int* prompt, int n, int count, FILE* out) {
    int* all = (int*)xmalloc((size_t)(n + count) * sizeof(int));
    memcpy(all, prompt, (size_t)n * sizeof(int));
    Rng rng = rng_seeded(g->seed, 0x9e4e0000ull);
    if (out) {
        fprintf(out, "prompt: %d token%s [", n, n == 1 ? "" : "s");
        for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? ", " : "", prompt[i]);
        fprintf(out, "]\n%s", text);
    }
    int generated = generate_tokens(g, all, n, count, 0, &rng, out, 1, NULL, 0);
    if (out) {   // the ids too, for scripts comparing generations
        fprintf(out, "\nids: [");
        for (int i = n; i < n + generated; i++) fprintf(out, "%s%d", i > n ? ", " : "", all[i]);
        fprintf(out, "]\n");
    }
    flush_stdout();
    free(all);
}

static void print_ids(FILE* out, const char* head, const int* ids, int n) {
    fprintf(out, "%s[", head);
    for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? ", " : "", ids[i]);
    fprintf(out, "]\n");
}

void generate_reply(const Generator* g, const int* prompt, int n, int count, const int* stop, int nstop, int show_ids,
                    FILE* out) {
    int* all = (int*)xmalloc((size_t)(n + count) * sizeof(int));
    memcpy(all, prompt, (size_t)n * sizeof(int));
    Rng rng = rng_seeded(g->seed, 0x9e4e0000ull);   // -prompt's stream: the same draws from the same ids
    if (out && show_ids) fprintf(out, "prompt: %d token%s ", n, n == 1 ? "" : "s"), print_ids(out, "", prompt, n);
    int generated = generate_tokens(g, all, n, count, 0, &rng, out, 1, stop, nstop);
    if (out) fprintf(out, "\n");
    if (out && show_ids) print_ids(out, "ids: ", all + n, generated);
    flush_stdout();
    free(all);
}
