// walk.c: the forward and backward walk over units, for any family. See walk.h; a family's block is block.h's.
#include "core/model/walk.h"
#include "core/model/activations.h"
#include "core/model/lora_steps.h"

#include <stddef.h>

#include "base/common.h"
#include "core/model/block.h"
#include "core/model/context_parallel.h"

// Under -cp every token's position: where this rank's t / cp of each row lie (context_position).
static void create_positions(Model* g, Backend* be, MemLedger* mem) {
    size_t N = (size_t)g->B * g->T;
    int* host = (int*)xmalloc(N * sizeof(int));
    for (size_t i = 0; i < N; i++)
        host[i] = context_position(g->layout->cp_ring, g->layout->cp_size, comm_rank(g->cp), g->T, (int)(i % (size_t)g->T));
    g->cp_pos = (int*)mem_alloc(be, mem, MEM_ACTIVATIONS, N * sizeof(int));
    be_upload(be, g->cp_pos, host, N * sizeof(int));
    free(host);
}

void model_create(Model* g, Backend* be, MemLedger* mem, const ParamLayout* layout, ParamStore store, Comm* tp, Comm* kv_copies,
                  Comm* cp, int sp, DType dt, int B, int T, int recompute, int offload_act, int num_sets, int num_stash, int micro) {
    memset(g, 0, sizeof(*g));
    if ((cp ? comm_size(cp) : 1) != layout->cp_size)
        fail("internal: a layout for %d context ranks on a group of %d", layout->cp_size, cp ? comm_size(cp) : 1);
    int tp_ranks = tp ? comm_size(tp) : 1, copies = kv_copies ? comm_size(kv_copies) : 1;
    if (tp_ranks != layout->tp_size) fail("internal: a layout for %d tensor ranks on a group of %d", layout->tp_size, tp_ranks);
    if (copies != layout_kv_copies(layout)) fail("internal: %d copies of each kv head in the layout, a group of %d", layout_kv_copies(layout), copies);
    if (sp && (!tp || (B * T) % tp_ranks)) fail("internal: sequence parallelism over %d ranks for %d rows", tp_ranks, B * T);
    g->sp = sp && tp;
    g->rows = g->sp ? B * T / layout->tp_size : B * T;
    g->shape = layout->shape;
    g->layout = layout;
    g->ops = layout->shape.family->block;
    g->store = store;
    g->tp = tp;
    g->kv_copies = kv_copies;
    g->cp = cp;
    g->dt = dt;
    g->B = B;
    g->T = T;
    g->recompute = recompute;
    if (num_sets < 1 || num_stash < 0) fail("internal: %d activation sets, %d stash slots on this stage", num_sets, num_stash);
    activations_check_tables(g->ops);
    g->num_sets = num_sets;
    if (offload_act && recompute < 3) fail("internal: the blocks' inputs offloaded at -r %d (they are all -r 3 keeps)", recompute);
    act_offload_create(&g->inputs, be, mem, offload_act, layout->num_blocks, num_sets, model_input_bytes(layout, dt, B, T, g->sp));
    g->sets = (Activations*)xcalloc((size_t)num_sets, sizeof(Activations));
    g->num_stash = num_stash;
    g->stash = (WeightGradStash*)xcalloc((size_t)(num_stash ? num_stash : 1), sizeof(WeightGradStash));
    activations_alloc(g, be, mem);
    size_t nc = g->ops->constants ? g->ops->constants(&g->shape, NULL) : 0;
    if (nc) {
        float* host = (float*)xmalloc(nc * sizeof(float));
        g->ops->constants(&g->shape, host);
        g->constants = (float*)mem_alloc(be, mem, MEM_ACTIVATIONS, nc * sizeof(float));
        be_upload(be, g->constants, host, nc * sizeof(float));
        free(host);
    }
    if (cp) create_positions(g, be, mem);
    if (model_has_encoder(g) || model_has_head(g)) batch_io_create(&g->io, be, B * T, micro);   // the only users
    lora_work_create(g, be, mem);
}

// A set's pos and doc arrays: pos per token row, doc as context_doc_width says.
static size_t document_ints(const Model* g) { return (size_t)g->B * g->T * (1 + context_doc_width(g->layout)); }

size_t model_document_bytes(const Model* g) { return g->doc_arrays ? (size_t)g->num_sets * document_ints(g) * sizeof(int) : 0; }

void model_use_documents(Model* g, Backend* be, MemLedger* mem) {
    if (g->doc_arrays) return;
    g->doc_arrays = (int*)mem_alloc(be, mem, MEM_ACTIVATIONS, (size_t)g->num_sets * document_ints(g) * sizeof(int));
    if (!g->io.rows) batch_io_create(&g->io, be, g->B * g->T, 1);
}

// Set `set`'s pos and doc: the micro-batch's, uploaded; without documents no doc and the positions of
// -cp (NULL without).
static void upload_documents(Model* g, Backend* be, int set, const MicroBatch* mb) {
    Activations* a = &g->sets[set];
    if (!mb->pos || !mb->doc) {
        a->pos = g->cp_pos;
        a->doc = NULL;
        return;
    }
    if (!g->doc_arrays) fail("internal: a micro-batch with documents on a model without model_use_documents");
    size_t N = (size_t)g->B * g->T;
    a->pos = g->doc_arrays + (size_t)set * document_ints(g);
    a->doc = a->pos + N;
    batch_io_upload(&g->io, be, a->pos, mb->pos);
    if (g->cp) context_upload_documents(g, be, a->doc, mb->doc);
    else batch_io_upload(&g->io, be, a->doc, mb->doc);
}

void model_destroy(Model* g, Backend* be) {
    batch_io_destroy(&g->io, be);
    if (g->doc_arrays) be_free(be, g->doc_arrays);
    activations_free(g, be);
    if (g->constants) be_free(be, g->constants);
    if (g->cp_pos) be_free(be, g->cp_pos);
    lora_work_destroy(g, be);
    act_offload_destroy(&g->inputs, be);
    free(g->stash);
    free(g->sets);
    memset(g, 0, sizeof(*g));
}

void* model_stage_input(Model* g, int set) { return g->sets[set].resid; }
void* model_stage_output(Model* g, int set) { return activation_input(g, &g->sets[set], g->layout->num_blocks); }
void* model_boundary_grad(Model* g) { return g->sets[0].dresid; }
size_t model_boundary_bytes(const Model* g) { return (size_t)g->rows * g->shape.C * dtype_size(g->dt); }
void* model_grad_to_send(Model* g, Backend* be) {
    if (!g->sets[0].dinput_out) fail("internal: model_grad_to_send on the stage with the embeddings");
    be_copy(be, g->sets[0].dinput_out, g->sets[0].dresid, model_boundary_bytes(g));
    return g->sets[0].dinput_out;
}

static void use_set(Model* g, int set) {
    if (set < 0 || set >= g->num_sets) fail("internal: activation set %d of %d", set, g->num_sets);
    g->acts = g->sets[set];
}

// ---------------------------------------------------------------------------------------------------
// The model's ends (ends.c) in the walk: which units they read, and when those are fetched and released.

void model_logits_to_host(Model* g, Backend* be, int first, int rows, float* out) {
    const ParamLayout* lay = g->layout;
    int V = g->shape.V, Vl = layout_vocab_rows(lay), v0 = layout_vocab_first(lay), real = layout_vocab_real(lay);
    size_t x = dtype_size(g->dt);
    char* raw = (char*)xmalloc((size_t)rows * Vl * x);
    be_download(be, raw, (char*)g->acts.logits + (size_t)first * Vl * x, (size_t)rows * Vl * x);
    if (!g->tp) {
        for (int n = 0; n < rows; n++) host_from_dtype(out + (size_t)n * V, raw + (size_t)n * Vl * x, g->dt, (size_t)V);
        free(raw);
        return;
    }
    // Each rank adds its columns into zeros: every value is one rank's plus exact zeros.
    float* mine = (float*)xmalloc((size_t)(real ? real : 1) * sizeof(float));
    double* row = (double*)xmalloc((size_t)V * sizeof(double));
    for (int n = 0; n < rows; n++) {
        host_from_dtype(mine, raw + (size_t)n * Vl * x, g->dt, (size_t)real);
        for (int v = 0; v < V; v++) row[v] = v >= v0 && v < v0 + real ? (double)mine[v - v0] : 0.0;
        comm_allreduce_host_sum(g->tp, row, V);
        for (int v = 0; v < V; v++) out[(size_t)n * V + v] = (float)row[v];
    }
    free(row);
    free(mine);
    free(raw);
}

// The unit holding the LM head's matrix.
static int head_unit(const Model* g) { return g->shape.tied ? g->layout->emb_unit : final_norm_unit(g->layout); }

// The LM head and the loss: logits, then (with targets) the losses.
static void head_forward(Model* g, Backend* be, const int* targets, float dloss, float* logits_dump) {
    Activations* a = &g->acts;
    int fin = final_norm_unit(g->layout), hu = head_unit(g);
    void* head_base = store_params(&g->store, be, hu);
    ends_head(g, be, (HeadUnits){store_params(&g->store, be, fin), head_base});
    store_params_done(&g->store, fin);
    if (hu != fin) store_params_done(&g->store, hu);
    if (logits_dump) model_logits_to_host(g, be, 0, g->B * g->T, logits_dump);
    if (!targets) return;
    batch_io_upload(&g->io, be, a->targets, targets);
    batch_io_before_losses(&g->io, be);
    ends_loss(g, be, targets, dloss);
    batch_io_queue_losses(&g->io, be, a->losses);
}

double model_take_losses(Model* g, Backend* be) { return batch_io_take_losses(&g->io, be); }

int model_take_token_losses(Model* g, Backend* be, float* out, int room) { return batch_io_take_each(&g->io, be, out, room); }

// The forward of model_forward (training 0) and model_forward_training.
static void forward_walk(Model* g, Backend* be, int set, const MicroBatch* mb, int training, long long position, float dloss,
                         float* logits_dump) {
    const ParamLayout* lay = g->layout;
    if (set < 0 || set >= g->num_sets) fail("internal: activation set %d of %d", set, g->num_sets);
    upload_documents(g, be, set, mb);
    g->sets[set].training = training;
    g->sets[set].position = position;
    use_set(g, set);
    Activations* a = &g->acts;
    if (model_has_encoder(g)) {
        batch_io_upload(&g->io, be, a->tokens, mb->tokens);
        ends_embed(g, be, store_params(&g->store, be, lay->emb_unit));
        if (!model_has_head(g) || head_unit(g) != lay->emb_unit) store_params_done(&g->store, lay->emb_unit);
    }
    for (int i = 0; i < lay->num_blocks; i++) {
        int l = lay->first_block + i, u = unit_of_block(lay, l);
        BlockRef b = {.index = i, .layer = l, .params = store_params(&g->store, be, u)};
        act_offload_before_forward(&g->inputs, be, i);
        g->ops->forward(g, be, &b, 0);
        act_offload_after_forward(&g->inputs, be, set, i, training);
        store_params_done(&g->store, u);
    }
    if (model_has_head(g)) head_forward(g, be, mb->targets, dloss, logits_dump);
}

void model_forward(Model* g, Backend* be, int set, const MicroBatch* mb, float dloss, float* logits_dump) {
    forward_walk(g, be, set, mb, 0, 0, dloss, logits_dump);
}

void model_forward_training(Model* g, Backend* be, int set, const MicroBatch* mb, long long position, float dloss,
                            float* logits_dump) {
    forward_walk(g, be, set, mb, 1, position, dloss, logits_dump);
}

// dlogits -> the gradient of the last block's output, in acts.dresid; the head's and the final norm's
// gradients accumulate. A tied head's gradient buffer (wte's) stays live for the encoder on a one-stage run.
static void head_backward(Model* g, Backend* be) {
    const ParamLayout* lay = g->layout;
    const ParamStore* ps = &g->store;
    int fin = final_norm_unit(lay), hu = head_unit(g);
    void* head_params = store_params(ps, be, hu);
    void* head_grads = store_grads(ps, be, hu);
    HeadUnits params = {store_params(ps, be, fin), head_params}, grads = {store_grads(ps, be, fin), head_grads};
    // The backward needs the last block next: a store that gathers may start now, while the head computes.
    store_prefetch(ps, be, unit_of_block(lay, lay->first_block + lay->num_blocks - 1));
    ends_head_backward(g, be, params, grads);
    store_grads_done(ps, be, fin);
    store_params_done(ps, fin);
    if (hu != fin && !model_has_encoder(g)) {
        store_grads_done(ps, be, hu);
        store_params_done(ps, hu);
    }
}

// The backward walk: the head, the blocks from the last, the embeddings. W walks the blocks only (the
// head's and the embeddings' gradients are B's: small, or on the stage that runs W at once), in the same
// order, so a store that gathers (ZeRO-3) prefetches as it does there, and asks for the parameters too:
// the recompute levels refill what B refilled, and the norm kernels take their weights. slot: B's and W's
// stash slot.
static void backward_walk(Model* g, Backend* be, int set, BackwardMode mode, int slot) {
    const ParamLayout* lay = g->layout;
    const ParamStore* ps = &g->store;
    use_set(g, set);
    if (mode != BWD_WEIGHT && model_has_head(g)) head_backward(g, be);
    for (int i = lay->num_blocks - 1; i >= 0; i--) {
        int l = lay->first_block + i, u = unit_of_block(lay, l), weights = mode != BWD_INPUT;
        BlockRef b = {.index = i, .layer = l, .params = store_params(ps, be, u)};   // one request (a gather) serves both
        act_offload_before_backward(&g->inputs, be, set, i);
        if (g->recompute >= 3) g->ops->forward(g, be, &b, 1);
        else g->ops->recompute(g, be, &b);
        BlockBackward c = {.g = g, .be = be, .mode = mode, .index = i};
        if (mode != BWD_FUSED) c.stash = activations_stash_of_block(g, slot, i);
        if (weights) b.grads = store_grads(ps, be, u);
        g->ops->backward(&c, &b);
        if (weights) store_grads_done(ps, be, u);
        store_params_done(ps, u);
    }
    if (mode == BWD_WEIGHT || !model_has_encoder(g)) return;
    void* demb = store_grads(ps, be, lay->emb_unit);   // still live with a tied head
    ends_embed_backward(g, be, demb);
    store_grads_done(ps, be, lay->emb_unit);
    if (head_unit(g) == lay->emb_unit) store_params_done(ps, lay->emb_unit);
}

void model_backward(Model* g, Backend* be, int set) { backward_walk(g, be, set, BWD_FUSED, -1); }
void model_backward_input(Model* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_INPUT, slot); }
void model_backward_weight(Model* g, Backend* be, int set, int slot) { backward_walk(g, be, set, BWD_WEIGHT, slot); }
