// pipeline.c: see pipeline.h.
#include "pipeline.h"

#include "base/common.h"

void pipeline_plan(PipelinePlan* plan, const GPTShape* s, int stages, int tp, int ranks, int T, int micro) {
    if (stages > s->L) fail("-pp %d: more pipeline stages than the model's %d layers (each stage needs a block)", stages, s->L);
    grid_check(stages, tp, ranks, s->NH);
    memset(plan, 0, sizeof(*plan));
    plan->stages = stages;
    plan->tp = tp;
    plan->micro = micro;
    pipeline_split(s->L, stages, stages > 1 ? pipeline_head_cost(s->Vp, s->C, T) : 0.0, plan->first, plan->count);
    for (int st = 0; st < stages; st++) plan->sets[st] = stages - st < micro ? stages - st : micro;
    plan->bubble = schedule_bubble_fraction(stages, micro);
}

void pipeline_stage_layout(ParamLayout* lay, const PipelinePlan* plan, const GPTShape* s, int dp, int stage, int tp_rank) {
    int last = stage == plan->stages - 1;
    EmbeddingRole emb = stage == 0 ? EMB_OWN : last ? EMB_MIRROR : EMB_NONE;
    layout_build_stage(lay, s, layout_pad_multiple(dp), plan->first[stage], plan->count[stage], emb, last, tp_rank, plan->tp);
}

void pipeline_create(Pipeline* p, const Grid* grid, const PipelinePlan* plan) {
    p->grid = grid;
    schedule_1f1b(grid->pp, plan->micro, grid->stage, &p->sched);
    if (p->sched.peak_in_flight != plan->sets[grid->stage])   // what gpt_create sized
        fail("internal: stage %d holds %d micro-batches at once, %d activation sets planned", grid->stage,
             p->sched.peak_in_flight, plan->sets[grid->stage]);
}

void pipeline_destroy(Pipeline* p) { schedule_free(&p->sched); }

// MPI guarantees tags up to 32767 only; messages between two ranks arrive in order anyway, so the tag
// is a check, not what pairs them.
static int tag_of(int micro) { return micro % 32768; }

double pipeline_train_step(Pipeline* p, GPT* g, Backend* be, DataLoader* data, int step, int* inputs, int* targets,
                           float dloss, float* logits_dump, PhaseTimer* pt) {
    Comm* pp = p->grid->pp_group;
    const StageSchedule* s = &p->sched;
    size_t bytes = gpt_boundary_bytes(g);
    double loss = 0.0;
    for (int i = 0; i < s->count; i++) {
        Action a = s->actions[i];
        int set = a.micro % g->num_sets;
        switch (a.kind) {
        case ACT_RECV_ACT:
            comm_recv(pp, gpt_stage_input(g, set), bytes, a.peer, tag_of(a.micro));
            phase_mark(pt, be, PHASE_WAIT);
            break;
        case ACT_FORWARD:
            if (gpt_has_encoder(g) || gpt_has_head(g)) dataloader_batch(data, step, s->num_micro, a.micro, inputs, targets);
            phase_mark(pt, be, PHASE_DATA);
            loss += gpt_forward(g, be, set, inputs, targets, dloss, a.micro == 0 ? logits_dump : NULL);
            phase_mark(pt, be, PHASE_FORWARD);
            break;
        case ACT_SEND_ACT:
            comm_send(pp, gpt_stage_output(g, set), bytes, a.peer, tag_of(a.micro));
            break;
        case ACT_RECV_GRAD:
            comm_recv(pp, gpt_boundary_grad(g), bytes, a.peer, tag_of(a.micro));
            phase_mark(pt, be, PHASE_WAIT);
            break;
        case ACT_BACKWARD:
            gpt_backward(g, be, set);   // ZeRO-2/3 reduce-scatters and gathers happen in here
            phase_mark(pt, be, PHASE_BACKWARD);
            break;
        case ACT_SEND_GRAD:
            comm_send(pp, gpt_boundary_grad(g), bytes, a.peer, tag_of(a.micro));
            break;
        }
    }
    return loss;
}

double pipeline_forward(Pipeline* p, GPT* g, Backend* be, const int* tokens, const int* targets) {
    const Grid* grid = p->grid;
    size_t bytes = gpt_boundary_bytes(g);
    if (!grid_first_stage(grid)) comm_recv(grid->pp_group, gpt_stage_input(g, 0), bytes, grid->stage - 1, 0);
    double loss = gpt_forward(g, be, 0, tokens, targets, 0.0f, NULL);
    if (!grid_last_stage(grid)) comm_send(grid->pp_group, gpt_stage_output(g, 0), bytes, grid->stage + 1, 0);
    return loss;
}
