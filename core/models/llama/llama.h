// llama.h: the Llama family (family.h), with Hugging Face's LlamaForCausalLM semantics: RMSNorm, rotate-half
// rotary embeddings (rope_theta; rope_scaling "linear" and "llama3"), a SwiGLU MLP down(silu(gate x) * up x)
// of any width, grouped-query attention with a head size of its own, no biases (but Qwen2's optional q, k
// and v biases), an untied or tied LM head, and Qwen3's optional per-head RMSNorm of q and k.
#pragma once
#include "core/model/family.h"

// Rotary position embeddings: the rotate-half convention with base `theta`, and Hugging Face's rope_scaling
// kinds.
typedef enum { ROPE_NONE, ROPE_LINEAR, ROPE_LLAMA3 } RopeScaling;
typedef struct {
    RopeScaling scaling;
    float theta, factor, low_freq_factor, high_freq_factor;
    int original_max;   // original_max_position_embeddings (ROPE_LLAMA3)
} Rope;

// A Llama shape's own parameters (ModelShape.params). Every field is 4 bytes, so the struct has no padding.
typedef struct {
    int KV;       // key/value heads (NH: multi-head attention; 1: multi-query)
    int D;        // head size (C / NH unless given)
    int F;        // the MLP's hidden width
    int qk_norm;  // per-head RMSNorm of q and k (Qwen3)
    int qkv_bias; // biases on the q, k and v projections (Qwen2)
    float eps;    // RMSNorm's epsilon
    Rope rope;
} LlamaParams;
_Static_assert(sizeof(LlamaParams) == 12 * 4 && sizeof(LlamaParams) <= FAMILY_PARAMS_BYTES, "LlamaParams: padded or too big");

static inline LlamaParams llama_params(const ModelShape* s) {
    LlamaParams p;
    family_params_get(s, &p, sizeof(p));
    return p;
}

// Its parameter kinds in the model file's order. WKV joins WQ in a unit (KindInfo.joins_previous), so the
// two are the one (NH + 2 KV) D x C matrix the block multiplies by; BKV joins BQ likewise, its bias.
typedef enum {
    LLAMA_WTE, LLAMA_ATTN_NORM, LLAMA_WQ, LLAMA_WKV, LLAMA_BQ, LLAMA_BKV, LLAMA_Q_NORM, LLAMA_K_NORM, LLAMA_WO,
    LLAMA_MLP_NORM, LLAMA_GATE_UP, LLAMA_DOWN, LLAMA_FINAL_NORM, LLAMA_HEAD, LLAMA_NUM_KINDS
} LlamaKind;

extern const ModelFamily LLAMA_FAMILY;
extern const BlockOps LLAMA_BLOCK;   // block.c

// RoPE's inverse frequencies for head size D (D / 2 of them), with the shape's scaling applied.
void llama_inv_freq(const ModelShape* s, float* out);
