// pipeline.c: see pipeline.h.
#include "core/pipeline/pipeline.h"

#include "base/common.h"
#include "core/model/context_parallel.h"

_Static_assert(MAX_CHUNKS == MAX_MODEL_CHUNKS, "schedule.h and model.h disagree on the most model chunks");

void pipeline_plan(PipelinePlan* plan, const ModelShape* s, int stages, ScheduleKind schedule, int chunks, int tp, int cp,
                   int cp_ring, int ranks, int T, int micro) {
    if (stages > s->L) fail("-pp %d: more pipeline stages than the model's %d layers (each stage needs a block)", stages, s->L);
    char why[200];
    if (tp >= 1 && !s->family->splits_tp(s, tp, why, sizeof(why))) fail("%s", why);
    if (cp > 1 && !cp_ring && !context_splits(s, tp, cp, why, sizeof(why))) fail("%s", why);   // the ring splits no heads
    grid_check(stages, tp, cp, ranks);
    schedule_check(schedule, stages, micro, chunks);
    if (stages * chunks > s->L)
        fail("-pp %d -vp %d: %d virtual stages but the model has %d layers (each needs a block)", stages, chunks,
             stages * chunks, s->L);
    memset(plan, 0, sizeof(*plan));
    plan->stages = stages;
    plan->tp = tp;
    plan->cp = cp;
    plan->cp_ring = cp > 1 && cp_ring;
    plan->micro = micro;
    plan->schedule = schedule;
    plan->chunks = chunks;
    int virtual_stages = stages * chunks;
    pipeline_split(s->L, virtual_stages, virtual_stages > 1 ? s->family->head_cost(s, T) : 0.0, plan->first, plan->count);
    for (int st = 0; st < stages; st++) {
        StageSchedule sched;
        schedule_build(schedule, stages, micro, chunks, st, &sched);
        for (int c = 0; c < chunks; c++) plan->sets[st][c] = sched.peak_chunk[c];
        plan->stash[st] = sched.peak_deferred;
        schedule_free(&sched);
    }
    plan->bubble = schedule_bubble(schedule, stages, micro, chunks);
}

void pipeline_stage_layout(ParamLayout* lay, const PipelinePlan* plan, const ModelShape* s, int dp, int stage, int tp_rank) {
    int last = stage == plan->stages - 1;
    EmbeddingRole emb = stage == 0 ? EMB_OWN : last && layout_needs_mirror(s) ? EMB_MIRROR : EMB_NONE;
    int first[MAX_CHUNKS], count[MAX_CHUNKS];
    for (int c = 0; c < plan->chunks; c++) {
        first[c] = plan->first[c * plan->stages + stage];
        count[c] = plan->count[c * plan->stages + stage];
    }
    layout_build_stage(lay, s, layout_pad_multiple(dp), first, count, plan->chunks, emb, last, tp_rank, plan->tp);
    lay->cp_size = plan->cp;
    lay->cp_ring = plan->cp_ring;
}

// The chunk with the LM head keeps one set of logits: each of its forwards must be followed by that
// micro-batch's backward before the next forward overwrites them.
static void check_head_order(const StageSchedule* s) {
    int open = -1;
    for (int i = 0; i < s->count; i++) {
        const Action* a = &s->actions[i];
        if (a->chunk != s->num_chunks - 1) continue;
        if (a->kind == ACT_FORWARD && open >= 0)
            fail("internal: the %s schedule runs F%d on the LM head's stage before B%d", schedule_kind_name(s->kind),
                 a->micro, open);
        if (a->kind == ACT_FORWARD) open = a->micro;
        if (a->kind == ACT_BACKWARD || a->kind == ACT_BACKWARD_INPUT) open = -1;
    }
}

void pipeline_create(Pipeline* p, const Grid* grid, const PipelinePlan* plan) {
    p->grid = grid;
    schedule_build(plan->schedule, grid->pp, plan->micro, plan->chunks, grid->stage, &p->sched);
    p->stash = plan->stash[grid->stage];
    for (int c = 0; c < plan->chunks; c++)   // what model_create sized
        if (p->sched.peak_chunk[c] != plan->sets[grid->stage][c] || p->sched.peak_deferred != p->stash)
            fail("internal: stage %d chunk %d holds %d micro-batches and %d deferred W's at once, %d and %d planned",
                 grid->stage, c, p->sched.peak_chunk[c], p->sched.peak_deferred, plan->sets[grid->stage][c], p->stash);
    if (grid_last_stage(grid)) check_head_order(&p->sched);
}

void pipeline_destroy(Pipeline* p) { schedule_free(&p->sched); }

// A message is (direction, boundary, micro), the boundary between virtual stages b and b + 1 (b = chunk * P +
// stage of the lower one): with interleaving two stages exchange activations and gradients of several
// chunks, and stage P-1's chunk c talks to stage 0's chunk c + 1, so both ends name the message by the
// boundary, not by their own chunk. Messages pair by order (comm_exchange), not by tag: the tag only lets
// MPI check the pairing, so wrapping at MPI's guaranteed 32767 weakens that check for long interleaved
// steps but never misroutes a message.
static int tag_of(const StageSchedule* s, const Action* a) {
    int gradient = a->kind == ACT_RECV_GRAD || a->kind == ACT_SEND_GRAD;
    int vs = a->chunk * s->num_stages + s->stage;
    int lower_is_peer = a->kind == ACT_RECV_ACT || a->kind == ACT_SEND_GRAD;
    long long boundary = vs - lower_is_peer, boundaries = (long long)s->num_stages * s->num_chunks;
    return (int)(((gradient * boundaries + boundary) * s->num_micro + a->micro) % 32768);
}

// The most messages one exchange of schedule.h's lists holds (interleaving's: two sends, two receives).
#define MAX_EXCHANGE 4

// Completes this stage's exchange of sends still in flight, if any (one stage has no pp group).
static void finish_sends(const Pipeline* p) {
    if (p->grid->pp_group) comm_exchange_finish(p->grid->pp_group);
}

// Actions first .. end-1 of the list, all communication, as one exchange. A gradient to send leaves
// dresid for a copy (model_grad_to_send), since the same exchange may receive the next one into dresid; the
// copy waits for the previous exchange, whose sends may still read it (comm_exchange).
static void exchange(Pipeline* p, Model* chunks, Backend* be, int first, int end) {
    const StageSchedule* s = &p->sched;
    finish_sends(p);
    CommMessage msgs[MAX_EXCHANGE];
    int n = 0;
    size_t bytes = model_boundary_bytes(&chunks[0]);   // the same for every chunk
    for (int i = first; i < end; i++) {
        const Action* a = &s->actions[i];
        Model* g = &chunks[a->chunk];
        int set = a->micro % g->num_sets;
        if (n == MAX_EXCHANGE) fail("internal: an exchange of more than %d messages", MAX_EXCHANGE);
        CommMessage* m = &msgs[n++];
        *m = (CommMessage){.send = a->kind == ACT_SEND_ACT || a->kind == ACT_SEND_GRAD, .bytes = bytes, .peer = a->peer,
                           .tag = tag_of(s, a)};
        switch (a->kind) {
        case ACT_RECV_ACT: m->buf = model_stage_input(g, set); break;
        case ACT_SEND_ACT: m->buf = model_stage_output(g, set); break;
        case ACT_RECV_GRAD: m->buf = model_boundary_grad(g); break;
        case ACT_SEND_GRAD: m->buf = model_grad_to_send(g, be); break;
        default: fail("internal: %s inside an exchange", schedule_action_name(a->kind));
        }
    }
    comm_exchange(p->grid->pp_group, msgs, n);
}

// The losses the step's forwards queued: only the chunk with the head has any.
static double take_losses(Model* chunks, int num_chunks, Backend* be) {
    double loss = 0.0;
    for (int c = 0; c < num_chunks; c++) loss += model_take_losses(&chunks[c], be);
    return loss;
}

static void compute(Pipeline* p, Model* chunks, Backend* be, const Action* a, DataLoader* data, int step, Batch* batch,
                    float dloss, float* logits_dump, PhaseTimer* pt) {
    Model* g = &chunks[a->chunk];
    int set = a->micro % g->num_sets;
    int documents = dataloader_has_documents(data);   // every block reads them: every stage reads the batch
    MicroBatch mb = pipeline_micro_batch(batch, data);
    switch (a->kind) {
    case ACT_FORWARD:
        if (model_has_encoder(g) || model_has_head(g) || documents)
            dataloader_read(data, step, p->sched.num_micro, a->micro, batch);
        phase_mark(pt, be, PHASE_DATA);
        model_forward_training(g, be, set, &mb, dataloader_position(data, step, p->sched.num_micro, a->micro), dloss,
                               a->micro == 0 ? logits_dump : NULL);
        phase_mark(pt, be, PHASE_FORWARD);
        break;
    case ACT_BACKWARD:
        model_backward(g, be, set);   // ZeRO-2/3 reduce-scatters and gathers happen in here
        phase_mark(pt, be, PHASE_BACKWARD);
        break;
    case ACT_BACKWARD_INPUT:
        model_backward_input(g, be, set, a->micro % p->stash);
        phase_mark(pt, be, PHASE_BACKWARD);
        break;
    case ACT_BACKWARD_WEIGHT:
        model_backward_weight(g, be, set, a->micro % p->stash);   // and ZeRO-2/3's reduce-scatters
        phase_mark(pt, be, PHASE_BACKWARD);
        break;
    default: fail("internal: %s is not compute", schedule_action_name(a->kind));
    }
}

double pipeline_train_step(Pipeline* p, Model* chunks, Backend* be, DataLoader* data, int step, Batch* batch, float dloss,
                           float* logits_dump, PhaseTimer* pt) {
    const StageSchedule* s = &p->sched;
    for (int i = 0; i < s->count;) {
        const Action* a = &s->actions[i];
        if (action_is_compute(a->kind)) {
            compute(p, chunks, be, a, data, step, batch, dloss, logits_dump, pt);
            i++;
            continue;
        }
        int end = schedule_exchange_end(s, i);
        exchange(p, chunks, be, i, end);
        phase_mark(pt, be, PHASE_WAIT);
        i = end;
    }
    finish_sends(p);   // the last sends read activations the next step overwrites
    phase_mark(pt, be, PHASE_WAIT);
    return take_losses(chunks, s->num_chunks, be);
}

// The virtual stages in order: chunk 0 of every stage, then chunk 1, ...; stage P-1's chunk c feeds stage
// 0's chunk c + 1. Each message's tag is the virtual stage that sends it. A chunk's output goes out in the
// same exchange as the next chunk's input comes in (the ring's last stage sends to stage 0 while stage 0
// waits for it), so no send waits for a receive its peer has not reached.
static void forward_through(Pipeline* p, Model* chunks, Backend* be, const MicroBatch* mb) {
    const Grid* grid = p->grid;
    int P = grid->pp, V = p->sched.num_chunks, prev = (grid->stage + P - 1) % P, next = (grid->stage + 1) % P;
    size_t bytes = model_boundary_bytes(&chunks[0]);
    CommMessage msgs[2];
    int n = 0;
    for (int c = 0; c < V; c++) {
        Model* g = &chunks[c];
        int vs = c * P + grid->stage;
        if (vs > 0) msgs[n++] = (CommMessage){.send = 0, .buf = model_stage_input(g, 0), .bytes = bytes, .peer = prev, .tag = vs - 1};
        if (n) comm_exchange(grid->pp_group, msgs, n);
        model_forward(g, be, 0, mb, 0.0f, NULL);
        n = 0;
        if (vs < P * V - 1) msgs[n++] = (CommMessage){.send = 1, .buf = model_stage_output(g, 0), .bytes = bytes, .peer = next, .tag = vs};
    }
    if (n) comm_exchange(grid->pp_group, msgs, n);
    finish_sends(p);
}

double pipeline_forward(Pipeline* p, Model* chunks, Backend* be, const MicroBatch* mb) {
    forward_through(p, chunks, be, mb);
    return take_losses(chunks, p->sched.num_chunks, be);
}

int pipeline_forward_token_losses(Pipeline* p, Model* chunks, Backend* be, const int* tokens, const int* targets, float* losses) {
    MicroBatch mb = {tokens, targets, NULL, NULL};
    forward_through(p, chunks, be, &mb);
    Model* head = pipeline_head_chunk(p, chunks);
    return model_has_head(head) && model_take_token_losses(head, be, losses, 1) == 1;
}
