#!/usr/bin/env python3
"""llm.c model file, or a trainer checkpoint directory (its model.bin: the fp32 master weights) -> a Hugging
Face GPT-2 folder that GPT2LMHeadModel.from_pretrained and GPT2TokenizerFast.from_pretrained load.

  export_hf.py out/run/ckpt_000600 OUTDIR [--force]
  export_hf.py model.bin OUTDIR [--force]

Writes model.safetensors (fp32, HF names, Conv1D weights transposed, wte cut to the real V rows, lm_head
left out: it is tied to wte), config.json, generation_config.json, and GPT-2's tokenizer as vocab.json and
merges.txt (copies of data/tokenizer/encoder.json and vocab.bpe).

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
import shutil
import signal
import sys
import tempfile
import textwrap

# scripts/ goes last on sys.path: first, scripts/tokenize.py would shadow the stdlib module torch imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import checkpoint_files  # noqa: E402
import hf_format as hf  # noqa: E402

TOKENIZER = os.path.join(_HERE, "..", "data", "tokenizer")
TOKENIZER_FILES = [("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")]   # ours -> HF's name
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


def write_folder(cfg, params, outdir):
    hf.write_safetensors(os.path.join(outdir, "model.safetensors"), hf.to_hf(cfg, params), {"format": "pt"})
    hf.write_json(os.path.join(outdir, "config.json"), hf.config_to_hf(cfg))
    hf.write_json(os.path.join(outdir, "generation_config.json"),
                  {"bos_token_id": hf.GPT2_TOKEN, "eos_token_id": hf.GPT2_TOKEN})
    for ours, theirs in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(TOKENIZER, ours), os.path.join(outdir, theirs))


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


def export(src, outdir, force):
    model = model_path(src)
    target = os.path.realpath(outdir)   # a link to a folder: the folder
    stale = stale_files(outdir, target, force)
    cfg, params = hf.load_model(model)
    refuse_own_input(model, outdir, target, stale)
    for ours, _ in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(TOKENIZER, ours)):
            hf.die("%s: is missing; the tokenizer files come from data/tokenizer/" % os.path.join(TOKENIZER, ours))
    # The new files are written in a hidden folder where writing is already allowed: inside OUTDIR when it
    # is there, beside it otherwise.
    exists, tmp, created = os.path.isdir(target), None, []
    try:
        if not exists:
            make_parents(target, created)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(target) + ".", suffix=".tmp",
                               dir=target if exists else os.path.dirname(target))
        os.chmod(tmp, 0o777 & ~umask())   # mkdtemp's 0700 would become a new OUTDIR's mode
        write_folder(cfg, params, tmp)
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
    print("exported %s (%d parameters without padding) to %s" % (cfg, hf.hf_numel(cfg), outdir))
    if cfg.V != hf.GPT2_TOKEN + 1:
        print("warning: vocabulary %d is not GPT-2's %d; vocab.json and merges.txt are GPT-2's tokenizer"
              % (cfg.V, hf.GPT2_TOKEN + 1), file=sys.stderr)


def main():
    removed = textwrap.fill(" ".join(HF_FILES), 110, initial_indent="  ", subsequent_indent="  ")
    ap = argparse.ArgumentParser(description=__doc__ + "\nThe files --force removes:\n" + removed,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="checkpoint directory (its model.bin) or llm.c model file")
    ap.add_argument("outdir", help="Hugging Face folder to write: absent or empty, unless --force")
    ap.add_argument("--force", action="store_true",
                    help="export into a non-empty OUTDIR, removing the Hugging Face files in it (listed above)")
    args = ap.parse_args()
    export(args.src, args.outdir, args.force)


if __name__ == "__main__":
    hf.run(main)
