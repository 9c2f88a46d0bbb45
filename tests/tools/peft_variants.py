#!/usr/bin/env python3
"""PEFT adapter folders for tests/system/t_lora_peft_in.sh, made from one good folder (export_hf.py --adapter's):

  peft_variants.py GOOD_DIR OUT_ROOT

OUT_ROOT/bf16 and OUT_ROOT/f16 hold the same adapter with its tensors stored BF16 and F16 (the test's values
are exact in both). Every other OUT_ROOT/<name> is a folder the trainer must refuse, named for what is wrong
with it. The tensors go through the tests' own safetensors writer (safetensors_plain.py), not the scripts'.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_plain import read_st, write_st  # noqa: E402

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX, SUFFIX = "base_model.model.", ".lora_A.weight"


def tensors_of(folder):
    """[(name, array float32)] of the folder's F32 safetensors file, in name order."""
    header, _, data = read_st(os.path.join(folder, WEIGHTS))
    out = []
    for name in sorted(k for k in header if k != "__metadata__"):
        e = header[name]
        assert e["dtype"] == "F32", e
        begin, end = e["data_offsets"]
        out.append((name, np.frombuffer(data[begin:end], "<f4").reshape(e["shape"])))
    return out


def bf16_bits(a):
    """The top half of each float32: exact for the test's values, which are."""
    u = a.astype("<f4").view("<u4")
    assert not (u & 0xFFFF).any(), "a value not exact in bf16"
    return (u >> 16).astype("<u2")


def f16_bits(a):
    h = a.astype("<f2")
    assert (h.astype(np.float32) == a).all(), "a value not exact in f16"
    return h


def write(root, name, config, tensors):
    """tensors: [(name, safetensors dtype, array of that dtype's bits)]."""
    folder = os.path.join(root, name)
    os.makedirs(folder)
    if config is not None:
        with open(os.path.join(folder, CONFIG), "w") as f:
            json.dump(config, f)
    if tensors is not None:
        write_st(os.path.join(folder, WEIGHTS), tensors, {"format": "pt"})
    return folder


def main(good, root):
    config = json.load(open(os.path.join(good, CONFIG)))
    f32 = [(n, "F32", a) for n, a in tensors_of(good)]
    write(root, "bf16", config, [(n, "BF16", bf16_bits(a)) for n, _, a in f32])
    write(root, "f16", config, [(n, "F16", f16_bits(a)) for n, _, a in f32])

    def with_config(name, **changes):
        write(root, name, dict(config, **changes), f32)

    with_config("loha", peft_type="LOHA")
    with_config("dora", use_dora=True)
    with_config("bias", bias="all")
    with_config("stray_module", target_modules=config["target_modules"] + ["lm_head"])
    with_config("regex", target_modules=".*c_attn")
    # The first entry narrowed to block 0's copy of its module: the other blocks keep their tensors.
    first = config["target_modules"][0]
    module0 = min(n[len(PREFIX):-len(SUFFIX)] for n, _, _ in f32
                  if n.endswith(SUFFIX) and n[len(PREFIX):-len(SUFFIX)].endswith("." + first))
    with_config("one_block", target_modules=[module0] + config["target_modules"][1:])

    write(root, "missing_tensor", config, f32[:-1])
    name, _, a = f32[0]
    write(root, "extra_tensor", config, f32 + [(PREFIX + "lm_head" + SUFFIX, "F32", a)])
    write(root, "int_tensor", config, [(name, "I32", a.view("<i4"))] + f32[1:])
    write(root, "no_config", None, f32)
    truncated = write(root, "truncated", config, f32)
    path = os.path.join(truncated, WEIGHTS)
    os.truncate(path, os.path.getsize(path) - 100)
    short = write(root, "short_header", config, f32)
    os.truncate(os.path.join(short, WEIGHTS), 20)


if __name__ == "__main__":
    main(*sys.argv[1:])
