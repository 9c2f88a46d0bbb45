// schedule.h: the 1F1B pipeline schedule (what each stage does, in which order) and the split of the
// model's layers into stages. Pure code: no memory but the host's, no communication, no model; the
// executor in the trainer walks these lists and the tests prove them correct for every small P and m.
//
// Schedule, after Megatron-LM's forward_backward_pipelining_without_interleaving. With P stages and m
// micro-batches, stage s (0-based) runs
//     warm-up:      w = min(P - s - 1, m) forwards            F0 .. F(w-1)
//     steady state: m - w rounds of one forward + one backward F(w+k) B(k)      k = 0 .. m-w-1
//     cool-down:    w backwards                                 B(m-w) .. B(m-1)
// Stage s therefore holds at most min(P - s, m) micro-batches' activations at once (forwards done whose
// backward is not), the bound the memory plan uses; stage 0 holds the most.
//
// Communication sits next to the compute that needs it: every F is "RECV_ACT F SEND_ACT" and every B is
// "RECV_GRAD B SEND_GRAD", minus the receives/sends that would leave the pipeline (stage 0 receives no
// activations and sends no gradients; the last stage sends no activations and receives no gradients: it
// computes the loss itself). Activations only flow s -> s+1 and gradients only s+1 -> s, and both ends of
// every link list their messages in the same micro-batch order, so a FIFO link (or tags = micro index)
// pairs them correctly.
//
// Deadlock freedom **requires buffered sends** (comm_send copies the message and returns at once;
// comm_recv blocks). Why it then cannot deadlock: give F(s,i) and B(s,i) the start times of the ideal
// 1F1B timeline (unit-time stages); every receive is for a message whose send has an earlier time, and each
// stage's list is in time order, so some stage can always take its next step. With rendezvous (unbuffered)
// sends this order DOES deadlock (P=2, m=2: stage 0 sends act 1 while stage 1 sends grad 0); such an
// executor must pair SEND_ACT with the following RECV_GRAD (and SEND_GRAD with RECV_ACT) in one batched
// exchange, as Megatron does.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ACT_RECV_ACT,    // receive micro's input activations from stage peer = s-1
    ACT_FORWARD,     // forward of micro through this stage's layers (peer -1)
    ACT_SEND_ACT,    // send micro's output activations to stage peer = s+1
    ACT_RECV_GRAD,   // receive the gradient w.r.t. this stage's output from stage peer = s+1
    ACT_BACKWARD,    // backward of micro (peer -1); frees its activations
    ACT_SEND_GRAD,   // send the gradient w.r.t. this stage's input to stage peer = s-1
} ActionKind;

typedef struct {
    ActionKind kind;
    int micro;   // micro-batch index, 0 .. num_micro-1
    int peer;    // the stage sent to / received from; -1 for FORWARD and BACKWARD
} Action;

typedef struct {
    int stage, num_stages, num_micro;
    int num_warmup;       // w = min(P - s - 1, m)
    int count;            // number of actions
    Action* actions;      // [count], in execution order
    int peak_in_flight;   // max over the list of (forwards done - backwards done) = min(P - s, m)
} StageSchedule;

// Builds stage `stage`'s action list. Fails (one-line error) unless num_stages >= 1, num_micro >= 1 and
// 0 <= stage < num_stages. Free with schedule_free.
void schedule_1f1b(int num_stages, int num_micro, int stage, StageSchedule* out);
void schedule_free(StageSchedule* s);

// The pipeline bubble as Megatron-LM defines it: with every stage taking the same t_f per forward and t_b
// per backward, and no communication cost, a 1F1B step takes (m + P - 1)(t_f + t_b) against the
// m(t_f + t_b) of useful work per stage, so idle time / useful time = (P - 1)/m. (The idle share of the
// whole step is (P - 1)/(m + P - 1).) The tests check this against a timed simulation of the lists.
double schedule_bubble_fraction(int num_stages, int num_micro);

// One line for the docs and debugging: "stage 1: F0 F1 F2 B0 F3 B1 ..." (compute only), or, with
// with_comm, every action: "<0" receive activation from stage 0, ">2" send activation to stage 2,
// "<<2" receive gradient from stage 2, ">>0" send gradient to stage 0, each followed by the micro index:
// "stage 1: <0:0 F0 >2:0 ...". Micro indices always follow the letter or colon.
void schedule_print(FILE* f, const StageSchedule* s, int with_comm);
const char* schedule_action_name(ActionKind k);

// ---- splitting the model into stages ----
//
// Cost model (FLOPs per token, forward; backward is ~2x forward for every part, so ratios hold for a whole
// step): a transformer block costs 24*C^2 (qkv 6C^2, attention projection 2C^2, MLP 16C^2) plus 4*T*C for
// attention scores and their weighted sum (no causal discount, as in the usual MFU formulas). The tied LM
// head costs 2*V*C (V = padded vocabulary); the softmax/loss, the embedding lookup and the LayerNorms are
// O(V) or O(C) per token and are ignored. So the last stage carries head = 2VC / (24C^2 + 4TC) blocks of
// extra work (d12, T=1024: 4.47 blocks) and the first stage none.

// The LM head's cost in units of one block, per the model above.
double pipeline_head_cost(int vocab, int channels, int seq_len);

// Splits num_layers blocks into num_stages contiguous, non-empty ranges: stage s runs blocks
// first_block[s] .. first_block[s] + num_blocks[s] - 1 (arrays of num_stages); stage 0 also runs the
// embeddings, the last stage the final LayerNorm, the LM head and the loss. Stage s costs
// num_blocks[s] (+ head_cost if it is the last); the split minimizes the most expensive stage, since the
// slowest stage sets the pipeline's pace. Among optimal splits it lightens the earliest stages first
// (stage 0 holds the most activations in flight). Every stage gets at least one block, so num_stages >
// num_layers is an error (one line naming both), as are num_stages < 1 and head_cost < 0.
void pipeline_split(int num_layers, int num_stages, double head_cost, int* first_block, int* num_blocks);

#ifdef __cplusplus
}
#endif
