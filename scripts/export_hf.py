#!/usr/bin/env python3
"""Model file, or a trainer checkpoint directory (its model.bin: the fp32 master weights) -> a Hugging Face
folder that from_pretrained loads: GPT2LMHeadModel for a GPT-2 file; for the Llama family
LlamaForCausalLM, Qwen3ForCausalLM when it has q/k norms, Qwen2ForCausalLM when it has q/k/v biases.

  export_hf.py out/run/ckpt_000600 OUTDIR [--dtype fp32|bf16|fp16] [--max-shard-size 2GB] [--force]
  export_hf.py model.bin OUTDIR [--tokenizer HF_FOLDER] [--bos-token-id N] [--eos-token-id N[,N...]]
  export_hf.py model.bin OUTDIR --adapter ADAPTER.bin [--base-name NAME]     # a PEFT adapter folder
  export_hf.py model.bin OUTDIR --adapter ADAPTER.bin --merge [...]          # the model with it folded in

With --adapter (a LoRA adapter file of this model, as the trainer writes it), OUTDIR becomes a PEFT adapter
folder: adapter_config.json (r, lora_alpha, use_rslora, target_modules, ...; base_model_name_or_path is
--base-name, default the model's path; lora_dropout the run's -lora-dropout when ADAPTER.bin is a
checkpoint's, whose manifest records it) and adapter_model.safetensors (F32 lora_A.weight (r, in) and
lora_B.weight (out, r) under PEFT's names), which PeftModel.from_pretrained loads on top of the exported
model. With --merge, a normal Hugging Face folder of the model with W += scale * B A folded into every
targeted layer (computed in float64, rounded once to the storage).

Writes the weights with HF's names, the vocabulary cut to the real V rows, a tied lm_head left out:
model.safetensors, or, when --max-shard-size does not hold them all, model-0000i-of-0000n.safetensors and
model.safetensors.index.json. --dtype is their storage (default the model file's: fp32 for version 3 and
checkpoints, bf16 for version 5; bf16 and fp16 round to nearest even, and fp16 refuses values past its
range). NaN and infinite weights are written as they are, after a warning naming each tensor that holds them
and how many of each. Then config.json (every key the class reads, the bos and eos ids where known), and the
tokenizer: for GPT-2, GPT-2's (vocab.json and merges.txt, copies of data/tokenizer/encoder.json and vocab.bpe) and
generation_config.json; --tokenizer copies the tokenizer files of a Hugging Face folder instead (the Llama
family has none of its own here) and takes bos and eos from its config.json unless they are given.

OUTDIR must be absent or empty: Hugging Face would load an old folder's other files (a sharded checkpoint's
index, pytorch_model.bin, tokenizer.json) instead of, or mixed with, the new ones. --force exports into a
non-empty OUTDIR: it removes every file there that a Hugging Face loader reads (the names below) and keeps
the rest (a README, .git). The files are written in a hidden temporary folder (beside a new OUTDIR, inside
an existing one) and moved in by renames only once all are complete: a failed or interrupted export leaves
OUTDIR as it was. Errors: one `error: ...` line, exit 1.
"""
import argparse
import contextlib
import fnmatch
import os
import re
import shutil
import signal
import sys
import tempfile
import textwrap

# scripts/ goes last on sys.path: first, scripts/tokenize.py would shadow the stdlib module torch imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import numpy as np  # noqa: E402

import checkpoint_files  # noqa: E402
import families  # noqa: E402
import hf_format as hf  # noqa: E402
import lora_file  # noqa: E402

TOKENIZER = os.path.join(_HERE, "..", "data", "tokenizer")   # a family's TOKENIZER_FILES are here
# What transformers' from_pretrained reads for a model and its tokenizer: weights in every framework and
# sharding, a PEFT adapter (loaded on top when adapter_config.json is there), configs, tokenizer files.
HF_FILES = ["model*.safetensors", "model*.safetensors.index.json", "pytorch_model*.bin",
            "pytorch_model*.bin.index.json", "tf_model*.h5", "tf_model*.h5.index.json", "flax_model*.msgpack",
            "flax_model*.msgpack.index.json", "model.ckpt*", "adapter_config.json", "adapter_model*",
            "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
            "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json"]


def model_path(src):
    """A checkpoint directory stands for its model.bin, checked against the checkpoint's CRC-32s; so is a
    model.bin named inside one."""
    if os.path.isdir(src):
        checkpoint_files.verify(src, ["model.bin"], hf.die)
        return os.path.join(src, "model.bin")
    ckpt = os.path.dirname(os.path.abspath(src))
    if os.path.basename(src) == "model.bin" and os.path.isfile(os.path.join(ckpt, "manifest.json")):
        checkpoint_files.verify(ckpt, ["model.bin"], hf.die)
    return src


# A Hugging Face folder's tokenizer files, as --tokenizer copies them.
TOKENIZER_NAMES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"]
SHARD_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12, "kib": 2 ** 10,
               "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def shard_bytes(text):
    """--max-shard-size: bytes, or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in SHARD_UNITS or int(m.group(1)) <= 0:
        hf.die("--max-shard-size %r: want a positive size such as 2000000000, 500MB or 2GiB" % text)
    return int(m.group(1)) * SHARD_UNITS[m.group(2).lower()]


def token_ids(what, value, V):
    """A bos or eos id (eos: one or several) checked against the vocabulary; None stays None."""
    ids = value if isinstance(value, list) else [value]
    if value is None or (ids and all(type(i) is int and 0 <= i < V for i in ids)):
        return value
    hf.die("%s %r: want token ids in [0, %d)" % (what, value, V))


def parse_ids(text):
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        hf.die("token ids %r: want integers separated by commas" % text)
    return ids[0] if len(ids) == 1 else ids


def tokenizer_source(folder, bos, eos):
    """--tokenizer FOLDER -> ([tokenizer file paths], bos, eos), the ids from its config.json (or
    generation_config.json) where not given."""
    files = [os.path.join(folder, n) for n in TOKENIZER_NAMES if os.path.isfile(os.path.join(folder, n))]
    if not files:
        hf.die("%s: has none of the tokenizer files (%s)" % (folder, ", ".join(TOKENIZER_NAMES[:5]) + ", ..."))
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            conf = hf.read_json(path)
            if isinstance(conf, dict):
                bos = conf.get("bos_token_id") if bos is None else bos
                eos = conf.get("eos_token_id") if eos is None else eos
    return files, bos, eos


def warn_nonfinite(tensors, shown=5):
    """NaN and infinite weights are exported as they are (they are the model), but said first, naming the
    tensors: Hugging Face loads them without a word, and generates nothing but NaN from them."""
    bad = []
    for name, a in tensors:
        nan, inf = np.count_nonzero(np.isnan(a)), np.count_nonzero(np.isinf(a))
        if nan or inf:
            bad.append("warning: tensor %s has %d NaN and %d infinite values of %d; exported as they are"
                       % (name, nan, inf, a.size))
    if len(bad) > shown:
        bad[shown:] = ["warning: %d more tensors hold NaN or infinite values" % (len(bad) - shown)]
    for line in bad:
        print(line, file=sys.stderr)


def write_folder(cfg, params, outdir, opts):
    if opts.adapter and not opts.merge:
        lora_file.write_peft(outdir, opts.adapter, opts.base_name, opts.lora_dropout)
        return
    family = families.of(cfg)
    storage, torch_dtype = hf.STORAGE[opts.dtype][:2]
    hf.write_weights(outdir, family.to_hf(cfg, params), {"format": "pt"}, storage, opts.max_shard)
    hf.write_json(os.path.join(outdir, "config.json"), family.hf_config(cfg, torch_dtype, opts.bos, opts.eos))
    if opts.tokenizer_files:
        for path in opts.tokenizer_files:
            shutil.copyfile(path, os.path.join(outdir, os.path.basename(path)))
    else:
        for ours, theirs in family.TOKENIZER_FILES:
            shutil.copyfile(os.path.join(TOKENIZER, ours), os.path.join(outdir, theirs))
    if opts.bos is not None or opts.eos is not None:
        hf.write_json(os.path.join(outdir, "generation_config.json"),
                      {k: v for k, v in (("bos_token_id", opts.bos), ("eos_token_id", opts.eos)) if v is not None})


def stale_files(outdir, target, force):
    """The files of target (OUTDIR resolved) that the export replaces; dies if it holds anything without
    --force."""
    if not os.path.lexists(target):
        return []
    if not os.path.isdir(target):
        hf.die("%s: exists and is not a folder" % outdir)
    names = sorted(os.listdir(target))
    if names and not force:
        hf.die("%s: is not empty (%s%s); --force replaces the Hugging Face files in it"
               % (outdir, ", ".join(names[:3]), ", ..." if len(names) > 3 else ""))
    stale = [n for n in names if any(fnmatch.fnmatch(n, p) for p in HF_FILES)]
    for name in stale:   # refused now: found while moving files in, the folder would be left half replaced
        if os.path.isdir(os.path.join(target, name)):
            hf.die("%s: is a folder where the export writes or removes a file" % os.path.join(outdir, name))
    return stale


def refuse_own_input(model, outdir, target, stale):
    """--force removes the stale files and the new ones replace theirs: the model file must be neither."""
    for name in stale:
        if os.path.exists(os.path.join(target, name)) and os.path.samefile(model, os.path.join(target, name)):
            hf.die("%s: is the input %s; the export would remove it" % (os.path.join(outdir, name), model))


def make_parents(path, created):
    """os.makedirs of path's parent, appending each folder it creates to created, outermost first."""
    missing, p = [], os.path.dirname(path)
    while p and not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for p in reversed(missing):
        os.mkdir(p)
        created.append(p)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM are delivered when the block ends, not in it."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def move_in(tmp, target, stale):
    """tmp becomes target in one rename; or, target being there already (tmp is then inside it), the stale
    files go and the new ones come in, a rename each: none can run out of space."""
    if os.path.dirname(tmp) != target:
        os.replace(tmp, target)
        return
    for name in stale:
        os.remove(os.path.join(target, name))
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(target, name))
    os.rmdir(tmp)


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def export(src, outdir, opts):
    model = model_path(src)
    target = os.path.realpath(outdir)   # a link to a folder: the folder
    stale = stale_files(outdir, target, opts.force)
    cfg, version = families.read_model_header(model)
    family = families.of(cfg)
    opts.dtype = opts.dtype or ("fp32" if version == 3 else "bf16")
    family.architecture(cfg)   # dies before anything is written if no HF class computes this model
    if family.TOKEN_IDS:
        opts.bos, opts.eos = family.TOKEN_IDS
    else:
        opts.bos, opts.eos = token_ids("bos id", opts.bos, cfg.V), token_ids("eos id", opts.eos, cfg.V)
    cfg, params = families.load_model(model)
    refuse_own_input(model, outdir, target, stale)
    if opts.adapter:
        opts.lora_dropout = lora_file.recorded_dropout(opts.adapter)
        opts.adapter = lora_file.read(opts.adapter, cfg)
        opts.base_name = opts.base_name or os.path.abspath(model)
        if opts.merge:
            params = {n: a.astype(np.float32) for n, a in lora_file.merged(cfg, params, opts.adapter).items()}
    for ours, _ in family.TOKENIZER_FILES if not opts.tokenizer_files else []:
        if not os.path.isfile(os.path.join(TOKENIZER, ours)):
            hf.die("%s: is missing; the tokenizer files come from data/tokenizer/" % os.path.join(TOKENIZER, ours))
    warn_nonfinite(family.to_hf(cfg, params))
    # The new files are written in a hidden folder where writing is already allowed: inside OUTDIR when it
    # is there, beside it otherwise.
    exists, tmp, created = os.path.isdir(target), None, []
    try:
        if not exists:
            make_parents(target, created)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(target) + ".", suffix=".tmp",
                               dir=target if exists else os.path.dirname(target))
        os.chmod(tmp, 0o777 & ~umask())   # mkdtemp's 0700 would become a new OUTDIR's mode
        write_folder(cfg, params, tmp, opts)
        with signals_held():   # a Ctrl-C waits: the moves are not left half done
            move_in(tmp, target, stale)
            created = []   # they hold OUTDIR now
    except OSError as e:
        hf.die("%s: cannot write (%s)" % (outdir, e.strerror or e))
    finally:   # also on Ctrl-C and SIGTERM (hf.run makes it a KeyboardInterrupt): nothing partial is left
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        for p in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(p)
    if opts.adapter and not opts.merge:
        print("exported the LoRA adapter (rank %d, targets %s) of %s to %s as a PEFT adapter folder"
              % (opts.adapter.R, ",".join(t.name for t in opts.adapter.targets), cfg, outdir))
        return
    print("exported %s (%d parameters without padding) to %s as %s%s" % (
        cfg, family.hf_numel(cfg), outdir, family.architecture(cfg)[1], " with the LoRA adapter merged"
        if opts.adapter else ""))
    note = None if opts.tokenizer_files else family.tokenizer_note(cfg)
    if note:
        print(note, file=sys.stderr)


def main():
    removed = textwrap.fill(" ".join(HF_FILES), 110, initial_indent="  ", subsequent_indent="  ")
    ap = argparse.ArgumentParser(description=__doc__ + "\nThe files --force removes:\n" + removed,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="checkpoint directory (its model.bin) or llm.c model file")
    ap.add_argument("outdir", help="Hugging Face folder to write: absent or empty, unless --force")
    ap.add_argument("--force", action="store_true",
                    help="export into a non-empty OUTDIR, removing the Hugging Face files in it (listed above)")
    ap.add_argument("--dtype", choices=sorted(hf.STORAGE), help="storage of the weights (default: the model "
                    "file's, fp32 for a checkpoint)")
    ap.add_argument("--max-shard-size", help="shard the weights into files of at most this size (bytes, or "
                    "e.g. 500MB, 2GiB); one tensor larger than it gets a shard of its own")
    ap.add_argument("--tokenizer", metavar="HF_FOLDER", help="copy this folder's tokenizer files and take its "
                    "bos and eos ids")
    ap.add_argument("--bos-token-id", help="bos token id for config.json (Llama family)")
    ap.add_argument("--eos-token-id", help="eos token id, or ids separated by commas (Llama family)")
    ap.add_argument("--adapter", metavar="ADAPTER.bin", help="a LoRA adapter file of this model: write a PEFT "
                    "adapter folder (or, with --merge, the model with it merged)")
    ap.add_argument("--merge", action="store_true", help="with --adapter: fold W += scale * B A into the model")
    ap.add_argument("--base-name", help="with --adapter: adapter_config.json's base_model_name_or_path (default: "
                    "the model's path)")
    args = ap.parse_args()
    if (args.merge or args.base_name) and not args.adapter:
        hf.die("--merge and --base-name go with --adapter ADAPTER.bin")
    opts = argparse.Namespace(force=args.force, dtype=args.dtype, tokenizer_files=[], adapter=args.adapter,
                              merge=args.merge, base_name=args.base_name,
                              max_shard=shard_bytes(args.max_shard_size) if args.max_shard_size else 0,
                              bos=parse_ids(args.bos_token_id) if args.bos_token_id else None,
                              eos=parse_ids(args.eos_token_id) if args.eos_token_id else None)
    if args.tokenizer:
        if not os.path.isdir(args.tokenizer):
            hf.die("%s: no such folder" % args.tokenizer)
        opts.tokenizer_files, opts.bos, opts.eos = tokenizer_source(args.tokenizer, opts.bos, opts.eos)
    export(args.src, args.outdir, opts)


if __name__ == "__main__":
    hf.run(main)
