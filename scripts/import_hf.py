#!/usr/bin/env python3
"""Hugging Face GPT-2 checkpoint folder -> llm.c model file, to start training from with `-e OUT.bin`.

  import_hf.py DIR OUT.bin [--bf16]

DIR holds config.json and model.safetensors (or, failing that, pytorch_model.bin); names may carry
GPT2LMHeadModel's `transformer.` prefix. Any GPT-2 shape works (gpt2, -medium, -large, -xl): the sizes come
from config.json. The attention-mask buffers are skipped; lm_head.weight must equal wte.weight (tied), as the
trainer ties them. The vocabulary is padded to a multiple of 128 with zero rows. --bf16 writes version 5
(bf16, round to nearest even) instead of fp32 (version 3). Errors: one `error: ...` line, exit 1.
"""
import os
import sys

# scripts/ goes last on sys.path: first, scripts/tokenize.py would shadow the stdlib module torch imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse  # noqa: E402

import numpy as np  # noqa: E402

import hf_format as hf  # noqa: E402

PREFIX = "transformer."


def load_weights(folder):
    """-> (path, {name without `transformer.`: safetensors Entry or torch tensor}, decoder to float32)."""
    st, pt = os.path.join(folder, "model.safetensors"), os.path.join(folder, "pytorch_model.bin")
    if os.path.isfile(st):
        return st, strip_prefix(hf.read_safetensors(st)), lambda name, e: hf.decode(st, name, e)
    if os.path.isfile(pt):
        return pt, strip_prefix(torch_state_dict(pt)), lambda name, t: torch_to_f32(pt, name, t)
    hf.die("%s has neither model.safetensors nor pytorch_model.bin" % folder)


def strip_prefix(tensors):
    return {n[len(PREFIX):] if n.startswith(PREFIX) else n: t for n, t in tensors.items()}


def torch_state_dict(path):
    """torch.load restricted to tensors and containers (weights_only): a checkpoint cannot run code."""
    import torch
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # torch raises many kinds (pickle, zip, runtime) for a bad file
        hf.die("%s: cannot load (%s)" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
    if not isinstance(sd, dict):
        hf.die("%s: holds a %s, not a state dict" % (path, type(sd).__name__))
    for name, t in sd.items():   # names and tensors only: anything else is not a model's weights
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            hf.die("%s: entry %r is a %s, not a named tensor" % (path, name, type(t).__name__))
    return sd


def torch_to_f32(path, name, t):
    import torch
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        hf.die("%s: tensor %s has dtype %s; supported: float32, float16, bfloat16" % (path, name, t.dtype))
    return t.float().numpy()


def getter(path, tensors, decode, shapes):
    """get(name): the tensor as float32, after checking it is there and has config.json's shape."""
    def get(name):
        if name not in tensors:
            hf.die("%s: tensor %s is missing" % (path, name))
        shape = tuple(tensors[name].shape)
        if shape != shapes[name]:
            hf.die("%s: tensor %s has shape %s, config.json says %s" % (path, name, list(shape), list(shapes[name])))
        return decode(name, tensors[name])
    return get


def check_extras(path, tensors, shapes, decode, get):
    """A stored head must equal wte (the trainer ties them, it cannot hold another). Other unknown tensors are
    reported: they may mean config.json and the weights disagree (a 13th layer for n_layer 12)."""
    head = tensors.get(hf.TIED_HEAD)
    if head is not None and not (tuple(head.shape) == shapes["wte.weight"]
                                 and np.array_equal(decode(hf.TIED_HEAD, head), get("wte.weight"))):
        hf.die("%s: %s differs from wte.weight; only tied heads are supported" % (path, hf.TIED_HEAD))
    extra = [n for n in tensors
             if n not in shapes and n != hf.TIED_HEAD and not n.endswith(hf.IGNORED_SUFFIXES)]
    if extra:
        print("warning: %s: ignored %d tensors not in GPT-2: %s" % (path, len(extra), ", ".join(extra[:3])),
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="Hugging Face GPT-2 folder: config.json, model.safetensors or pytorch_model.bin")
    ap.add_argument("out", help="llm.c model file to write")
    ap.add_argument("--bf16", action="store_true", help="write bf16 weights (version 5) instead of fp32")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        hf.die("%s: no such folder" % args.dir)
    cfg = hf.config_from_hf(os.path.join(args.dir, "config.json"))
    path, tensors, decode = load_weights(args.dir)
    shapes = dict(hf.hf_names(cfg))
    get = getter(path, tensors, decode, shapes)
    check_extras(path, tensors, shapes, decode, get)
    params = hf.from_hf(cfg, get)
    try:
        hf.save_model(args.out, cfg, params, 5 if args.bf16 else 3)
    except OSError as e:
        hf.die("cannot write %s (%s)" % (args.out, e.strerror))
    print("imported %s (%d parameters) from %s to %s (%s)"
          % (cfg, cfg.numel(), path, args.out, "bf16" if args.bf16 else "fp32"))


if __name__ == "__main__":
    main()
