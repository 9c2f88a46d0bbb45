#!/usr/bin/env python3
"""Hugging Face checkpoint folder -> model file, to start training from with `-e OUT.bin`.

  import_hf.py DIR OUT.bin [--bf16 | --fp32] [--allow-nonfinite]
  import_hf.py --adapter PEFT_DIR OUT.bin --base MODEL.bin     # a PEFT LoRA adapter -> adapter file (-lora-init)

--adapter reads a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) made for the model
MODEL.bin (the trainer's -e) and writes the trainer's adapter file (docs/formats.md). target_modules must
select every layer's copy of a target the family has (GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj; Llama:
q_proj ... down_proj), and the tensors must be exactly those, with r's and the model's shapes: an adapter of
another base or rank is refused naming the tensor. lora_alpha must be a multiple of 0.001; DoRA, per-layer
ranks or layers, modules_to_save and biases are refused naming the key.

DIR holds config.json and the weights: model.safetensors, or model.safetensors.index.json and the shards it
names, or (failing those) pytorch_model.bin; F32, BF16 or F16 values. numpy is all it needs, but for
pytorch_model.bin, which only PyTorch reads. config.json's model_type picks the model file's family
(scripts/families/):
  gpt2          GPT2LMHeadModel, any shape (gpt2, -medium, -large, -xl); names with or without
                `transformer.`; the attention-mask buffers are skipped; lm_head.weight must be wte.weight
  llama         LlamaForCausalLM (Llama 3.x, SmolLM2): the Llama family
  qwen3         Qwen3ForCausalLM: the Llama family with q/k norms
  qwen2         Qwen2ForCausalLM: the Llama family with q/k/v biases
The Llama family's names may come with or without `model.`; a tied model's stored lm_head.weight must be
embed_tokens, bit for bit. The sizes come from config.json, with each class's defaults for what it leaves
out. The vocabulary is padded to a multiple of 128 with zero rows. The model file keeps the weights'
precision: bf16 (version 5) when every weight is stored BF16, else fp32 (version 3), which holds F32, F16 and
BF16 values exactly; --bf16 writes bf16 whatever the storage (rounding to nearest even), --fp32 fp32.

Refused, before any tensor is read: a config.json key whose meaning the trainer does not implement, named in
the error (sliding-window attention that takes effect, RoPE scaling other than linear and llama3,
mixture-of-experts keys, o_proj or MLP biases, an activation other than silu, quantization); a shape the
trainer does not run (a head size must be a multiple of 8 and at most 128, the layers 1 to 256, the
vocabulary 2 to 2^24, a Llama hidden_size a multiple of 8); a safetensors file the safetensors library would
refuse (its offsets must tile the data exactly: no gap, overlap or trailing byte; integer shapes and offsets;
byte counts that match dtype and shape; no repeated JSON key); an index whose weight_map and shards
disagree; a name stored both with and without its prefix; and config.json sizes the weights are too small to
hold. Then a missing tensor, a wrong shape, a Llama-family tensor the model does not have (GPT-2's extra
tensors are reported and skipped), and NaN or infinite weights unless --allow-nonfinite. OUT must not be one
of DIR's files. Errors: one `error: ...` line, exit 1, and no OUT written.
"""
import os
import sys
from collections import namedtuple

# scripts/ goes last on sys.path: first, scripts/tokenize.py would shadow the stdlib module torch imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse  # noqa: E402

import numpy as np  # noqa: E402

import families  # noqa: E402
import hf_format as hf  # noqa: E402
import lora_file  # noqa: E402

# One stored tensor: the file it is in, its shape, its safetensors dtype, and load() -> its values as float32.
Tensor = namedtuple("Tensor", "path shape dtype load")
TORCH_DTYPES = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16"}


def weights_files(folder):
    """The files that hold the weights; the index first when they are shards."""
    st, index, pt = (os.path.join(folder, n) for n in (hf.SINGLE_FILE, hf.INDEX_FILE, "pytorch_model.bin"))
    if os.path.isfile(st) and os.path.isfile(index):
        hf.die("%s: has both %s and %s; which one is the model?" % (folder, hf.SINGLE_FILE, hf.INDEX_FILE))
    if os.path.isfile(index):
        return [index] + sorted(set(hf.read_index(folder).values()))
    for path in (st, pt):
        if os.path.isfile(path):
            return [path]
    hf.die("%s: has neither model.safetensors nor pytorch_model.bin (nor %s)" % (folder, hf.INDEX_FILE))


def load_weights(cfg, folder, files):
    """-> {name as hf_names spells it: Tensor}."""
    if files[0].endswith(hf.INDEX_FILE):
        stored = hf.read_sharded(folder)
    elif files[0].endswith(".safetensors"):
        stored = {name: (files[0], e) for name, e in hf.read_safetensors(files[0]).items()}
    else:
        return canonical(cfg, files[0], {name: Tensor(files[0], tuple(t.shape), TORCH_DTYPES.get(str(t.dtype)),
                                                      lambda n=name, t=t: torch_to_f32(files[0], n, t))
                                         for name, t in torch_state_dict(files[0]).items()})
    return canonical(cfg, files[0], {name: Tensor(path, e.shape, e.dtype,
                                                  lambda n=name, p=path, e=e: hf.decode(p, n, e))
                                     for name, (path, e) in stored.items()})


def canonical(cfg, path, tensors):
    """The names as hf_names spells them; a name stored both with and without the prefix is refused: which
    one is the model's?"""
    family, out = families.of(cfg), {}
    for name, t in tensors.items():
        c = family.canonical_name(name)
        if c in out:
            prefix = family.HF_PREFIX
            short = c[len(prefix):] if c.startswith(prefix) else c
            hf.die("%s: tensor %s is stored both with and without the `%s` prefix" % (path, short, prefix))
        out[c] = t
    return out


def refuse_own_input(out, inputs):
    """The model file is renamed over OUT at the end: OUT must not be one of the inputs (or a link to one)."""
    for path in inputs:
        if os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
            hf.die("%s: is the input %s; the import would overwrite it" % (out, path))


def check_size(config, cfg, files):
    """config.json's sizes against the weights files' bytes (at least 2 a parameter: F16, BF16), before
    anything is allocated from them: hidden_size 2^30 is a wrong config, not a terabyte to allocate."""
    numel, have = families.of(cfg).hf_numel(cfg), sum(os.path.getsize(p) for p in files)
    if 2 * numel > have:
        hf.die("%s: %s has %d parameters, at least %d bytes; %s has %d bytes"
               % (config, cfg, numel, 2 * numel, files[0] if len(files) == 1 else "the shards", have))


def import_torch(path):
    """PyTorch, the one reader of pytorch_model.bin's pickle; safetensors folders need numpy alone."""
    try:
        import torch
    except ImportError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        hf.die("%s: reading it needs PyTorch (Debian's python3-torch), which does not import here (%s); a "
               "safetensors folder imports without it" % (path, why))
    return torch


def torch_state_dict(path):
    """torch.load restricted to tensors and containers (weights_only): a checkpoint cannot run code."""
    torch = import_torch(path)
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
    torch = import_torch(path)
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        hf.die("%s: tensor %s has dtype %s; supported: float32, float16, bfloat16" % (path, name, t.dtype))
    return t.float().numpy()


def check_shapes(where, tensors, shapes):
    """Every parameter is there with config.json's shape, checked before from_hf allocates those shapes."""
    for name, shape in shapes.items():
        if name not in tensors:
            hf.die("%s: tensor %s is missing" % (where, name))
        if tuple(tensors[name].shape) != shape:
            hf.die("%s: tensor %s has shape %s, config.json says %s"
                   % (tensors[name].path, name, list(tensors[name].shape), list(shape)))


def getter(tensors, allow_nonfinite):
    """get(name): the tensor as float32. NaN or infinity in a weight would train to NaN losses, far from here:
    refused, naming the tensor, unless allowed."""
    def get(name):
        a = tensors[name].load()
        bad = 0 if allow_nonfinite else a.size - np.count_nonzero(np.isfinite(a))
        if bad:
            hf.die("%s: tensor %s has %d non-finite values of %d (%d NaN, %d infinite); --allow-nonfinite "
                   "imports them" % (tensors[name].path, name, bad, a.size, np.count_nonzero(np.isnan(a)),
                                     np.count_nonzero(np.isinf(a))))
        return a
    return get


def same_bits(a, b):
    """Bit for bit: a NaN, unequal to itself, is the same NaN; -0 is not 0."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check_extras(cfg, tensors, shapes, get):
    """A stored head of a tied model must be the embedding, bit for bit (the trainer ties them, it cannot hold
    another). Other tensors may mean config.json and the weights disagree (a 13th layer for 12): the family
    reports or refuses them (extra_tensors)."""
    family = families.of(cfg)
    wte = family.hf_names(cfg)[0][0]
    head = tensors.get(hf.TIED_HEAD) if hf.TIED_HEAD not in shapes else None
    if head is not None and not (tuple(head.shape) == shapes[wte] and same_bits(head.load(), get(wte))):
        hf.die("%s: %s differs from %s; %s" % (head.path, hf.TIED_HEAD, wte, family.TIED_WHY))
    extra = [n for n in tensors if n not in shapes and n != hf.TIED_HEAD and not family.ignored(n)]
    if extra:
        family.extra_tensors(cfg, tensors[extra[0]].path, extra)


def import_adapter(args):
    if not (args.adapter and args.base):
        hf.die("--adapter and --base MODEL.bin go together")
    if args.bf16 or args.fp32 or args.allow_nonfinite:
        hf.die("--bf16, --fp32 and --allow-nonfinite are for models; an adapter file is fp32")
    cfg, _ = families.read_model_header(args.base)
    refuse_own_input(args.out, [args.base] + [os.path.join(args.dir, n) for n in
                                              (lora_file.CONFIG_FILE, lora_file.WEIGHTS_FILE)])
    adapter = lora_file.read_peft(args.dir, cfg)
    try:
        lora_file.write(args.out, adapter)
    except OSError as e:
        hf.die("%s: cannot write (%s)" % (args.out, e.strerror or e))
    print("imported the LoRA adapter (rank %d, alpha %g%s, targets %s) from %s to %s"
          % (adapter.R, adapter.alpha, ", rslora" if adapter.rslora else "",
             ",".join(t.name for t in adapter.targets), args.dir, args.out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="Hugging Face folder: config.json and model.safetensors, its shards and "
                    "model.safetensors.index.json, or pytorch_model.bin")
    ap.add_argument("out", help="model file to write (not one of DIR's files)")
    precision = ap.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", help="write bf16 weights (version 5), rounding F32 and "
                           "F16 values (default: bf16 when every weight is stored BF16, else fp32)")
    precision.add_argument("--fp32", action="store_true", help="write fp32 weights (version 3) whatever the storage")
    ap.add_argument("--allow-nonfinite", action="store_true",
                    help="import NaN and infinite weights instead of refusing them")
    ap.add_argument("--adapter", action="store_true", help="DIR is a PEFT LoRA adapter folder: write an adapter "
                    "file for --base")
    ap.add_argument("--base", metavar="MODEL.bin", help="with --adapter: the model file the adapter is for")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        hf.die("%s: no such folder" % args.dir)
    if args.adapter or args.base:
        import_adapter(args)
        return
    config = os.path.join(args.dir, "config.json")
    cfg = families.config_from_hf(config)
    files = weights_files(args.dir)
    refuse_own_input(args.out, [args.dir, config] + files)
    check_size(config, cfg, files)
    tensors = load_weights(cfg, args.dir, files)
    shapes = dict(families.of(cfg).hf_names(cfg))
    check_shapes(files[0], tensors, shapes)
    get = getter(tensors, args.allow_nonfinite)
    check_extras(cfg, tensors, shapes, get)
    bf16 = args.bf16 or (not args.fp32 and all(tensors[name].dtype == "BF16" for name in shapes))
    params = families.of(cfg).from_hf(cfg, get)
    try:
        hf.save_model(args.out, cfg, params, 5 if bf16 else 3)
    except OSError as e:
        hf.die("%s: cannot write (%s)" % (args.out, e.strerror or e))
    print("imported %s (%d parameters) from %s to %s (%s)"
          % (cfg, cfg.numel(), files[0], args.out, "bf16" if bf16 else "fp32"))


if __name__ == "__main__":
    hf.run(main)
