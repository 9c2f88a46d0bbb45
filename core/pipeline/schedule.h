// schedule.h: pipeline schedules (what each stage does, in which order) and the split of the model's
// layers into stages. Pure code: no memory but the host's, no communication, no model; the executor in
// core/pipeline/pipeline.c walks these lists and tests/unit/test_schedule.c proves them for every P <= 8, m <= 16, V <= 4.
//
// Three schedules (-ps), each a list of actions per stage (a stage = one rank of the pp group):
//
// 1f1b, after Megatron-LM's forward_backward_pipelining_without_interleaving. Stage s (0-based) runs
//     warm-up:      w = min(P - s - 1, m) forwards            F0 .. F(w-1)
//     steady state: m - w rounds of one forward + one backward F(w+k) B(k)      k = 0 .. m-w-1
//     cool-down:    w backwards                                 B(m-w) .. B(m-1)
// and holds at most min(P - s, m) micro-batches' activations at once. Bubble (P - 1)/m.
//
// interleaved, after Megatron's forward_backward_pipelining_with_interleaving: each stage holds V model
// chunks (virtual stages); virtual stage c*P + s is chunk c of stage s, so a micro-batch crosses every
// stage V times and the last stage's chunk c feeds stage 0's chunk c + 1. The m*V forwards of a stage run
// in groups of P micro-batches per chunk (forward k: chunk (k / P) % V, micro (k / (P V)) P + k % P);
// backwards the same with the chunks reversed. Warm-up (P - s - 1)*2 + (V - 1)*P forwards, then 1F1B, then
// the cool-down. Needs m % P == 0. Each forward is 1/V of a stage's work, so the bubble is (P - 1)/(V m).
//
// zb, after ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): each backward is split into B,
// the input gradient (sent upstream at once: it is on the critical path), and W, the weight gradient
// (needed by nobody else until the optimizer). Deferred W's fill what would be bubble. The lists come from
// a greedy pass over the ideal timeline with unit-time F, B and W: at each time step every stage that is
// free runs, in this order of preference, the next B if its gradient has arrived and it defers fewer than
// s + 1 W's; else the next F if its input has arrived and fewer than min(P - s, m) micro-batches are
// between their F and B (1F1B's bound); else the oldest deferred W. With m >= P this gives the bubble
// ZB-H1's theory gives, (P - 1)(t_f + t_b - t_w) per stage, a third of 1F1B's when t_f = t_b = t_w.
// The W's read the layer inputs the forward kept, so a micro-batch's activations live from F to W: one
// more set than 1F1B at most (peak_in_flight), plus a stash of the B's output gradients for each
// deferred W (peak_deferred).
//
// Communication sits next to the compute that needs it (1f1b, zb): every F is "RECV_ACT F SEND_ACT" and every
// B (or combined backward) "RECV_GRAD B SEND_GRAD", minus the ends of the model (virtual stage 0 receives no
// activations and sends no gradients; the last virtual stage sends no activations and receives no
// gradients: it computes the loss itself). W's communicate nothing. Interleaving places them in rounds
// instead (build_interleaved). Both ends of every link list its messages in the same order.
//
// Execution: the communication between two compute actions forms one *exchange*, whose sends and receives
// are posted together and complete together (schedule_exchange_end), as in Megatron's batched
// send_forward_recv_backward. Sends are rendezvous (a send completes only once its receive is posted, as
// NCCL's do), and the messages between two ranks pair in the order each lists them, whatever their kind
// or chunk (NCCL has no tags). The compute after an exchange with a receive waits for it; after an
// exchange of sends only it does not, and the next exchange completes that one first (comm_exchange).
// Deadlock freedom then needs the grouping: with one exchange per message 1F1B deadlocks at P=2, m=2
// (stage 0 sends act 1 while stage 1 sends grad 0). tests/unit/test_schedule.c simulates these semantics for
// every P <= 8, m <= 16, V <= 4 and checks that every list finishes, that each message pairs with the
// receive meant for it, and that no forward overwrites activations a pending send reads; it also checks
// the lists under buffered sends (what the ideal timeline assumes). The ideal timeline's bubble is the
// same under exchanges for 1f1b and interleaved; zb's grows (P=2, m=8: 0.062 -> 0.094 of the useful time;
// P=4, m=16: 0.094 -> 0.141; 1f1b: 0.125 and 0.188), because an exchange completes as a whole: a stage that
// sends a gradient and receives an activation in one exchange waits for the upstream stage's W as well.
// Where sends hold the stage too (NCCL, when a collective queues behind a pending send on the comm stream)
// zb falls behind 1f1b (P=4, m=16: 0.312); the tests check that no list deadlocks that way either.
// `./build/test_schedule print KIND P m [V]` prints all three.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB } ScheduleKind;
#define MAX_CHUNKS 8   // -vp: virtual stages per rank

typedef enum {
    ACT_RECV_ACT,          // receive (chunk, micro)'s input activations from stage `peer`
    ACT_FORWARD,           // forward of micro through chunk's layers (peer -1)
    ACT_SEND_ACT,          // send the output activations to stage `peer`
    ACT_RECV_GRAD,         // receive the gradient w.r.t. the chunk's output from stage `peer`
    ACT_BACKWARD,          // backward of micro (input and weight gradients; peer -1); frees its activations
    ACT_SEND_GRAD,         // send the gradient w.r.t. the chunk's input to stage `peer`
    ACT_BACKWARD_INPUT,    // zb's B: the input gradient only; the weight gradient's inputs stay for W
    ACT_BACKWARD_WEIGHT,   // zb's W: the weight gradient; frees the activations and B's stash
} ActionKind;

typedef struct {
    ActionKind kind;
    int micro;   // micro-batch index, 0 .. num_micro-1
    int chunk;   // this stage's model chunk (virtual stage chunk * P + stage); 0 but with interleaving
    int peer;    // the stage sent to / received from; -1 for compute
} Action;

typedef struct {
    ScheduleKind kind;
    int stage, num_stages, num_micro, num_chunks;
    int num_warmup;       // forwards before the first backward
    int count;            // number of actions
    Action* actions;      // [count], in execution order
    int peak_in_flight;   // max over the list of micro-batches (per chunk: chunk-micros) whose F is done and
                          // whose backward (W under zb) is not: the activation sets the stage needs
    int peak_chunk[MAX_CHUNKS];   // the same for each chunk alone (interleaving: a chunk's own sets)
    int peak_deferred;    // zb: max of B done, W not (the stash of output gradients); 0 otherwise
} StageSchedule;

// Builds stage `stage`'s action list for `kind` with P = num_stages, m = num_micro and V = num_chunks
// (1 unless interleaved, where 2 <= V <= MAX_CHUNKS, P >= 2 and m % P == 0). One-line error otherwise.
void schedule_build(ScheduleKind kind, int num_stages, int num_micro, int num_chunks, int stage, StageSchedule* out);
static inline void schedule_1f1b(int num_stages, int num_micro, int stage, StageSchedule* out) {
    schedule_build(SCHEDULE_1F1B, num_stages, num_micro, 1, stage, out);
}
void schedule_free(StageSchedule* s);
// Checks the flags' combination: one-line error naming the problem (e.g. "-ps interleaved needs -ga
// divisible by -pp"). Called at start-up and by --estimate.
void schedule_check(ScheduleKind kind, int num_stages, int num_micro, int num_chunks);
const char* schedule_kind_name(ScheduleKind k);
int schedule_kind_parse(const char* name, ScheduleKind* out);   // 1 if name is 1f1b, interleaved or zb

// The pipeline bubble as Megatron-LM defines it: idle time over useful time per stage, with every stage
// taking the same time and no communication cost. 1f1b: (P - 1)/m. interleaved: (P - 1)/(V m). zb (m >= P,
// t_f = t_b = t_w, as the lists are built): (P - 1)(t_f + t_b - t_w) / (m (t_f + t_b + t_w)) = (P - 1)/(3m).
// The tests check each against a timed simulation of the lists.
double schedule_bubble(ScheduleKind kind, int num_stages, int num_micro, int num_chunks);
static inline double schedule_bubble_fraction(int num_stages, int num_micro) {
    return schedule_bubble(SCHEDULE_1F1B, num_stages, num_micro, 1);
}

// One line for the docs and debugging: "stage 1: F0 F1 F2 B0 F3 B1 ..." (compute only; zb's B and W as
// "B" and "W"; a chunk other than 0 as "F3.1" = micro 3 of chunk 1), or, with with_comm, every action:
// "<0" receive activation from stage 0, ">2" send activation to stage 2, "<<2" receive gradient from
// stage 2, ">>0" send gradient to stage 0, each followed by ":micro": "stage 1: <0:0 F0 >2:0 ...".
void schedule_print(FILE* f, const StageSchedule* s, int with_comm);
const char* schedule_action_name(ActionKind k);
static inline int action_is_compute(ActionKind k) {
    return k == ACT_FORWARD || k == ACT_BACKWARD || k == ACT_BACKWARD_INPUT || k == ACT_BACKWARD_WEIGHT;
}
// The exchange starting at action i (a communication action): actions i .. end-1, up to the next compute
// action or the end of the list. Returns i itself if action i is compute.
static inline int schedule_exchange_end(const StageSchedule* s, int i) {
    while (i < s->count && !action_is_compute(s->actions[i].kind)) i++;
    return i;
}

// ---- splitting the model into stages ----
//
// Splits num_layers blocks into num_stages contiguous, non-empty ranges: stage s runs blocks
// first_block[s] .. first_block[s] + num_blocks[s] - 1 (arrays of num_stages); stage 0 also runs the
// embeddings, the last stage the final norm, the LM head and the loss. Stage s costs num_blocks[s] (+
// head_cost if it is the last: the head's and the loss's work in blocks, ModelFamily.head_cost); the split minimizes the most expensive stage, since the
// slowest stage sets the pipeline's pace. Among optimal splits it lightens the earliest stages first
// (stage 0 holds the most activations in flight). Every stage gets at least one block, so num_stages >
// num_layers is an error (one line naming both), as are num_stages < 1 and head_cost < 0. With
// interleaving the "stages" here are the P*V virtual stages.
void pipeline_split(int num_layers, int num_stages, double head_cost, int* first_block, int* num_blocks);

#ifdef __cplusplus
}
#endif
