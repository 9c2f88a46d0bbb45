#!/usr/bin/env python3
"""A small made-up LlamaForCausalLM folder for end-to-end tests, beside the tokenizer.json already in it.

  make_tiny_llama.py FOLDER

Writes FOLDER/config.json and FOLDER/model.safetensors: LlamaForCausalLM's config keys and tensor names, GQA
(4 heads over 2 kv heads of 16), 2 layers of width 64, an untied head, the vocabulary of FOLDER/tokenizer.json
(its bos and eos: the first two added tokens), random weights from a fixed seed stored as BF16 (as published
checkpoints are), through the tests' own safetensors writer.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_plain import write_st  # noqa: E402


def bf16(a):
    """Round to nearest even: the bits safetensors stores."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main(out):
    tok = json.load(open(os.path.join(out, "tokenizer.json"), encoding="utf-8"))
    V = max(tok["model"]["vocab"].values()) + 1 + len(tok["added_tokens"])
    bos, eos = (t["id"] for t in tok["added_tokens"][:2])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": 64,
           "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
           "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16"}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    rng = np.random.default_rng(3)
    C, F, KVD = 64, 160, 2 * 16
    t = [("model.embed_tokens.weight", rng.normal(0, 0.02, (V, C))), ("model.norm.weight", np.ones(C)),
         ("lm_head.weight", rng.normal(0, 0.02, (V, C)))]
    for layer in range(2):
        p = "model.layers.%d." % layer
        t += [(p + "input_layernorm.weight", 1 + rng.normal(0, 0.1, C)), (p + "post_attention_layernorm.weight", np.ones(C)),
              (p + "self_attn.q_proj.weight", rng.normal(0, 0.02, (C, C))),
              (p + "self_attn.k_proj.weight", rng.normal(0, 0.02, (KVD, C))),
              (p + "self_attn.v_proj.weight", rng.normal(0, 0.02, (KVD, C))),
              (p + "self_attn.o_proj.weight", rng.normal(0, 0.01, (C, C))),
              (p + "mlp.gate_proj.weight", rng.normal(0, 0.02, (F, C))), (p + "mlp.up_proj.weight", rng.normal(0, 0.02, (F, C))),
              (p + "mlp.down_proj.weight", rng.normal(0, 0.01, (C, F)))]
    write_st(os.path.join(out, "model.safetensors"), [(n, "BF16", bf16(a)) for n, a in t])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
