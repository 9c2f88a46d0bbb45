#!/usr/bin/env python3
"""Hugging Face GPT-2 checkpoint folder -> llm.c model file, to start training from with `-e OUT.bin`.

  import_hf.py DIR OUT.bin [--bf16] [--allow-nonfinite]

DIR holds config.json and model.safetensors (or, failing that, pytorch_model.bin); names may carry
GPT2LMHeadModel's `transformer.` prefix. Any GPT-2 shape works (gpt2, -medium, -large, -xl): the sizes come
from config.json. The attention-mask buffers are skipped; lm_head.weight must equal wte.weight (tied), as the
trainer ties them. The vocabulary is padded to a multiple of 128 with zero rows. --bf16 writes version 5
(bf16, round to nearest even) instead of fp32 (version 3).

Refused, before any tensor is read: a safetensors file the safetensors library would refuse (its offsets must
tile the data exactly: no gap, overlap or trailing byte; integer shapes and offsets; byte counts that match
dtype and shape; no repeated JSON key), a name stored both with and without `transformer.`, and config.json
sizes the weights file is too small to hold. Then NaN or infinite weights, unless --allow-nonfinite. OUT
must not be one of DIR's files. Errors: one `error: ...` line, exit 1, and no OUT written.
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


def weights_file(folder):
    st, pt = os.path.join(folder, "model.safetensors"), os.path.join(folder, "pytorch_model.bin")
    for path in (st, pt):
        if os.path.isfile(path):
            return path
    hf.die("%s: has neither model.safetensors nor pytorch_model.bin" % folder)


def load_weights(path):
    """-> ({name without `transformer.`: safetensors Entry or torch tensor}, decoder to float32)."""
    if path.endswith(".safetensors"):
        return strip_prefix(path, hf.read_safetensors(path)), lambda name, e: hf.decode(path, name, e)
    return strip_prefix(path, torch_state_dict(path)), lambda name, t: torch_to_f32(path, name, t)


def strip_prefix(path, tensors):
    """Names without `transformer.`; a name stored both ways is refused: which one is the model's?"""
    out = {}
    for name, t in tensors.items():
        short = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if short in out:
            hf.die("%s: tensor %s is stored both with and without the `%s` prefix" % (path, short, PREFIX))
        out[short] = t
    return out


def refuse_own_input(out, inputs):
    """The model file is renamed over OUT at the end: OUT must not be one of the inputs (or a link to one)."""
    for path in inputs:
        if os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
            hf.die("%s: is the input %s; the import would overwrite it" % (out, path))


def check_size(config, cfg, path):
    """config.json's sizes against the weights file's bytes (at least 2 a parameter: F16, BF16), before
    anything is allocated from them: n_embd 2^30 is a wrong config, not a terabyte to allocate."""
    numel, have = hf.hf_numel(cfg), os.path.getsize(path)
    if 2 * numel > have:
        hf.die("%s: %s has %d parameters, at least %d bytes; %s has %d bytes"
               % (config, cfg, numel, 2 * numel, path, have))


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


def check_shapes(path, tensors, shapes):
    """Every parameter is there with config.json's shape, checked before from_hf allocates those shapes."""
    for name, shape in shapes.items():
        if name not in tensors:
            hf.die("%s: tensor %s is missing" % (path, name))
        if tuple(tensors[name].shape) != shape:
            hf.die("%s: tensor %s has shape %s, config.json says %s"
                   % (path, name, list(tensors[name].shape), list(shape)))


def getter(path, tensors, decode, allow_nonfinite):
    """get(name): the tensor as float32. NaN or infinity in a weight would train to NaN losses, far from here:
    refused, naming the tensor, unless allowed."""
    def get(name):
        a = decode(name, tensors[name])
        bad = 0 if allow_nonfinite else a.size - np.count_nonzero(np.isfinite(a))
        if bad:
            hf.die("%s: tensor %s has %d non-finite values of %d (%d NaN, %d infinite); --allow-nonfinite "
                   "imports them" % (path, name, bad, a.size, np.count_nonzero(np.isnan(a)),
                                     np.count_nonzero(np.isinf(a))))
        return a
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
    ap.add_argument("out", help="llm.c model file to write (not one of DIR's files)")
    ap.add_argument("--bf16", action="store_true", help="write bf16 weights (version 5) instead of fp32")
    ap.add_argument("--allow-nonfinite", action="store_true",
                    help="import NaN and infinite weights instead of refusing them")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        hf.die("%s: no such folder" % args.dir)
    config = os.path.join(args.dir, "config.json")
    cfg = hf.config_from_hf(config)
    path = weights_file(args.dir)
    refuse_own_input(args.out, [args.dir, config, path])
    check_size(config, cfg, path)
    tensors, decode = load_weights(path)
    shapes = dict(hf.hf_names(cfg))
    check_shapes(path, tensors, shapes)
    get = getter(path, tensors, decode, args.allow_nonfinite)
    check_extras(path, tensors, shapes, decode, get)
    params = hf.from_hf(cfg, get)
    try:
        hf.save_model(args.out, cfg, params, 5 if args.bf16 else 3)
    except OSError as e:
        hf.die("%s: cannot write (%s)" % (args.out, e.strerror or e))
    print("imported %s (%d parameters) from %s to %s (%s)"
          % (cfg, cfg.numel(), path, args.out, "bf16" if args.bf16 else "fp32"))


if __name__ == "__main__":
    hf.run(main)
