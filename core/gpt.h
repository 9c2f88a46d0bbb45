// gpt.h: the GPT-2 model on a backend: its parameter buffers, activations, and the forward/backward walk
// over layers. Everything here is expressed in kernels.h calls, so it is the same on the CPU and the GPU.
#pragma once
#include "memory.h"
#include "model.h"
#include "zero.h"

// Saved activations for one micro-batch of B x T tokens (N = B*T rows). Per-layer tensors are stacked
// over layers, or have a single slot when the recompute level refills them in the backward.
typedef struct {
    void* resid;       // (L+1, N, C)  resid[l] = input of block l; resid[L] = output of the last block
    void* ln1;         // (L, N, C)
    float* ln1_mean;   // (L, N)
    float* ln1_rstd;   // (L, N)
    void* qkv;         // (L, N, 3C)
    void* atty;        // (L, N, C)    attention output before its projection
    float* att_lse;    // (L, B, NH, T)
    void* resid2;      // (L, N, C)    resid + attention projection
    void* ln2;         // (L, N, C)
    float* ln2_mean;   // (L, N)
    float* ln2_rstd;   // (L, N)
    void* fch;         // (L, N, 4C)   fc output before GELU
    void* fch_gelu;    // (L, N, 4C)
    void* lnf;         // (N, C)
    float* lnf_mean;   // (N)
    float* lnf_rstd;   // (N)
    void* logits;      // (N, Vp)      overwritten by dlogits in training
    float* losses;     // (N)
    int* tokens;       // (N)
    int* targets;      // (N)
    // Work buffers: projections before the residual add, and the backward's gradients.
    void* proj;        // (N, C)
    void* dresid;      // (N, C)   gradient of the residual stream, carried down the blocks
    void* dsmall;      // (N, C)
    void* dbig;        // (N, 4C)  dfch, then dqkv
    float* att_scratch;  // (B, NH, T)
} Activations;

typedef struct {
    GPTShape shape;
    const ParamLayout* layout;
    DType dt;
    int B, T;
    Zero* zero;        // where each unit's parameters and gradients live (zero.h)
    int recompute;     // 0 keep everything; 1 recompute GELU; 2 + attention and LayerNorms; 3 whole blocks
    Activations acts;
} GPT;

// Allocates the activations for micro-batches of B x T; parameters and gradients come from `zero`.
void gpt_create(GPT* g, Backend* be, MemLedger* mem, const ParamLayout* layout, Zero* zero, DType dt, int B, int T,
                int recompute);
void gpt_destroy(GPT* g, Backend* be);
// Activation bytes gpt_create allocates (for the memory plan).
size_t gpt_activation_bytes(const GPTShape* s, DType dt, int B, int T, int recompute);

// Forward over B x T tokens (host int arrays). With targets: per-token losses land in acts.losses and
// the sum of this micro-batch's token losses is returned; if dloss != 0 the logits are replaced by
// dlogits scaled by dloss, ready for gpt_backward. Without targets: logits only, returns 0.
// logits_dump (host, N x V floats) receives the logits before the loss when not NULL.
double gpt_forward(GPT* g, Backend* be, const int* tokens, const int* targets, float dloss, float* logits_dump);
// Backward of the last forward (which must have been called with dloss != 0); gradients accumulate.
void gpt_backward(GPT* g, Backend* be);
