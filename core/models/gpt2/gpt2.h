// gpt2.h: the GPT-2 family (family.h): learned position embeddings, pre-LayerNorm blocks with biases,
// multi-head attention, a GELU MLP of width 4C, the LM head tied to the token embedding.
#pragma once
#include "core/model/family.h"

// Its 16 parameter kinds, in llm.c's file order.
typedef enum {
    GPT2_WTE, GPT2_WPE, GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB, GPT2_ATTPROJW, GPT2_ATTPROJB,
    GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB, GPT2_FCPROJW, GPT2_FCPROJB, GPT2_LNFW, GPT2_LNFB, GPT2_NUM_KINDS
} Gpt2Kind;

extern const ModelFamily GPT2_FAMILY;

// A GPT-2 shape from its four free sizes (heads of C / NH channels, MLP 4C, vocabulary padded as llm.c does).
ModelShape gpt2_shape(int L, int C, int NH, int V, int maxT);

extern const BlockOps GPT2_BLOCK;   // block.c
extern const EndOps GPT2_ENDS;      // block.c: the embedding with learned positions
