// pipeline.c: see pipeline.h.
#include "pipeline.h"

#include "base/common.h"

_Static_assert(MAX_CHUNKS == MAX_MODEL_CHUNKS, "schedule.h and model.h disagree on the most model chunks");

void pipeline_plan(PipelinePlan* plan, const GPTShape* s, int stages, ScheduleKind schedule, int chunks, int tp, int ranks,
                   int T, int micro) {
    if (stages > s->L) fail("-pp %d: more pipeline stages than the model's %d layers (each stage needs a block)", stages, s->L);
    grid_check(stages, tp, ranks, s->NH);
    schedule_check(schedule, stages, micro, chunks);
    // Interleaving sends several boundaries' messages the same way between two ranks; only distinct tags keep
    // them apart (tag_of).
    if (schedule == SCHEDULE_INTERLEAVED && 2LL * stages * chunks * micro > 32768)
        fail("-ps interleaved: -pp %d x -vp %d x -ga %d needs more than MPI's 32768 message tags; use fewer micro-batches",
             stages, chunks, micro);
    if (stages * chunks > s->L)
        fail("-pp %d -vp %d: %d virtual stages but the model has %d layers (each needs a block)", stages, chunks,
             stages * chunks, s->L);
    memset(plan, 0, sizeof(*plan));
    plan->stages = stages;
    plan->tp = tp;
    plan->micro = micro;
    plan->schedule = schedule;
    plan->chunks = chunks;
    int virtual_stages = stages * chunks;
    pipeline_split(s->L, virtual_stages, virtual_stages > 1 ? pipeline_head_cost(s->Vp, s->C, T) : 0.0, plan->first, plan->count);
    for (int st = 0; st < stages; st++) {
        StageSchedule sched;
        schedule_build(schedule, stages, micro, chunks, st, &sched);
        for (int c = 0; c < chunks; c++) plan->sets[st][c] = sched.peak_chunk[c];
        plan->stash[st] = sched.peak_deferred;
        schedule_free(&sched);
    }
    plan->bubble = schedule_bubble(schedule, stages, micro, chunks);
}

void pipeline_stage_layout(ParamLayout* lay, const PipelinePlan* plan, const GPTShape* s, int dp, int stage, int tp_rank) {
    int last = stage == plan->stages - 1;
    EmbeddingRole emb = stage == 0 ? EMB_OWN : last ? EMB_MIRROR : EMB_NONE;
    int first[MAX_CHUNKS], count[MAX_CHUNKS];
    for (int c = 0; c < plan->chunks; c++) {
        first[c] = plan->first[c * plan->stages + stage];
        count[c] = plan->count[c * plan->stages + stage];
    }
    layout_build_stage(lay, s, layout_pad_multiple(dp), first, count, plan->chunks, emb, last, tp_rank, plan->tp);
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
    for (int c = 0; c < plan->chunks; c++)   // what gpt_create sized
        if (p->sched.peak_chunk[c] != plan->sets[grid->stage][c] || p->sched.peak_deferred != p->stash)
            fail("internal: stage %d chunk %d holds %d micro-batches and %d deferred W's at once, %d and %d planned",
                 grid->stage, c, p->sched.peak_chunk[c], p->sched.peak_deferred, plan->sets[grid->stage][c], p->stash);
    if (grid_last_stage(grid)) check_head_order(&p->sched);
}

void pipeline_destroy(Pipeline* p) { schedule_free(&p->sched); }

// A message is (direction, boundary, micro), the boundary between virtual stages b and b + 1 (b = chunk * P +
// stage of the lower one): with interleaving two stages exchange activations and gradients of several
// chunks in the same direction, and stage P-1's chunk c talks to stage 0's chunk c + 1, so both ends name the
// message by the boundary, not by their own chunk. MPI guarantees tags up to 32767 only: pipeline_plan keeps
// interleaved steps within that; with one chunk a direction carries one kind of message, whose order both
// ends list alike, so tags that wrap still pair correctly.
static int tag_of(const StageSchedule* s, const Action* a) {
    int gradient = a->kind == ACT_RECV_GRAD || a->kind == ACT_SEND_GRAD;
    int vs = a->chunk * s->num_stages + s->stage;
    int lower_is_peer = a->kind == ACT_RECV_ACT || a->kind == ACT_SEND_GRAD;
    long long boundary = vs - lower_is_peer, boundaries = (long long)s->num_stages * s->num_chunks;
    return (int)(((gradient * boundaries + boundary) * s->num_micro + a->micro) % 32768);
}

// The losses the step's forwards queued: only the chunk with the head has any.
static double take_losses(GPT* chunks, int num_chunks, Backend* be) {
    double loss = 0.0;
    for (int c = 0; c < num_chunks; c++) loss += gpt_take_losses(&chunks[c], be);
    return loss;
}

double pipeline_train_step(Pipeline* p, GPT* chunks, Backend* be, DataLoader* data, int step, int* inputs, int* targets,
                           float dloss, float* logits_dump, PhaseTimer* pt) {
    Comm* pp = p->grid->pp_group;
    const StageSchedule* s = &p->sched;
    size_t bytes = gpt_boundary_bytes(&chunks[0]);   // the same for every chunk
    for (int i = 0; i < s->count; i++) {
        Action a = s->actions[i];
        GPT* g = &chunks[a.chunk];
        int set = a.micro % g->num_sets, tag = tag_of(s, &a);
        switch (a.kind) {
        case ACT_RECV_ACT:
            comm_recv(pp, gpt_stage_input(g, set), bytes, a.peer, tag);
            phase_mark(pt, be, PHASE_WAIT);
            break;
        case ACT_FORWARD:
            if (gpt_has_encoder(g) || gpt_has_head(g)) dataloader_batch(data, step, s->num_micro, a.micro, inputs, targets);
            phase_mark(pt, be, PHASE_DATA);
            gpt_forward(g, be, set, inputs, targets, dloss, a.micro == 0 ? logits_dump : NULL);
            phase_mark(pt, be, PHASE_FORWARD);
            break;
        case ACT_SEND_ACT:
            comm_send(pp, gpt_stage_output(g, set), bytes, a.peer, tag);
            break;
        case ACT_RECV_GRAD:
            comm_recv(pp, gpt_boundary_grad(g), bytes, a.peer, tag);
            phase_mark(pt, be, PHASE_WAIT);
            break;
        case ACT_BACKWARD:
            gpt_backward(g, be, set);   // ZeRO-2/3 reduce-scatters and gathers happen in here
            phase_mark(pt, be, PHASE_BACKWARD);
            break;
        case ACT_BACKWARD_INPUT:
            gpt_backward_input(g, be, set, a.micro % p->stash);
            phase_mark(pt, be, PHASE_BACKWARD);
            break;
        case ACT_BACKWARD_WEIGHT:
            gpt_backward_weight(g, be, set, a.micro % p->stash);   // and ZeRO-2/3's reduce-scatters
            phase_mark(pt, be, PHASE_BACKWARD);
            break;
        case ACT_SEND_GRAD:
            comm_send(pp, gpt_boundary_grad(g), bytes, a.peer, tag);
            break;
        }
    }
    return take_losses(chunks, s->num_chunks, be);
}

// The virtual stages in order: chunk 0 of every stage, then chunk 1, ...; stage P-1's chunk c feeds stage
// 0's chunk c + 1. Each message's tag is the virtual stage that sends it.
double pipeline_forward(Pipeline* p, GPT* chunks, Backend* be, const int* tokens, const int* targets) {
    const Grid* grid = p->grid;
    int P = grid->pp, V = p->sched.num_chunks, prev = (grid->stage + P - 1) % P, next = (grid->stage + 1) % P;
    size_t bytes = gpt_boundary_bytes(&chunks[0]);
    for (int c = 0; c < V; c++) {
        GPT* g = &chunks[c];
        int first = c == 0 && grid_first_stage(grid), last = c == V - 1 && grid_last_stage(grid);
        int vs = c * P + grid->stage;
        if (!first) comm_recv(grid->pp_group, gpt_stage_input(g, 0), bytes, prev, vs - 1);
        gpt_forward(g, be, 0, tokens, targets, 0.0f, NULL);
        if (!last) comm_send(grid->pp_group, gpt_stage_output(g, 0), bytes, next, vs);
    }
    return take_losses(chunks, V, be);
}
