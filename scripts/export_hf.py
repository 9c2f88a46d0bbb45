#!/usr/bin/env python3
"""llm.c model file, or a trainer checkpoint directory (its model.bin: the fp32 master weights) -> a Hugging
Face GPT-2 folder that GPT2LMHeadModel.from_pretrained and GPT2TokenizerFast.from_pretrained load.

  export_hf.py out/run/ckpt_000600 OUTDIR
  export_hf.py model.bin OUTDIR

Writes model.safetensors (fp32, HF names, Conv1D weights transposed, wte cut to the real V rows, lm_head
left out: it is tied to wte), config.json, generation_config.json, and GPT-2's tokenizer as vocab.json and
merges.txt (copies of data/tokenizer/encoder.json and vocab.bpe). Errors: one `error: ...` line, exit 1.
"""
import os
import shutil
import sys

# scripts/ goes last on sys.path: first, scripts/tokenize.py would shadow the stdlib module torch imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import hf_format as hf  # noqa: E402

TOKENIZER = os.path.join(_HERE, "..", "data", "tokenizer")
TOKENIZER_FILES = [("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")]   # ours -> HF's name


def model_path(src):
    """A checkpoint directory stands for its model.bin; one without DONE was never finished."""
    if not os.path.isdir(src):
        return src
    if not os.path.isfile(os.path.join(src, "DONE")):
        hf.die("%s is not a complete checkpoint (no DONE)" % src)
    return os.path.join(src, "model.bin")


def write_folder(cfg, params, outdir):
    os.makedirs(outdir, exist_ok=True)
    hf.write_safetensors(os.path.join(outdir, "model.safetensors"), hf.to_hf(cfg, params), {"format": "pt"})
    hf.write_json(os.path.join(outdir, "config.json"), hf.config_to_hf(cfg))
    hf.write_json(os.path.join(outdir, "generation_config.json"),
                  {"bos_token_id": hf.GPT2_TOKEN, "eos_token_id": hf.GPT2_TOKEN})
    for ours, theirs in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(TOKENIZER, ours), os.path.join(outdir, theirs))


def export(src, outdir):
    cfg, params = hf.load_model(model_path(src))
    for ours, _ in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(TOKENIZER, ours)):
            hf.die("%s is missing: the tokenizer files come from data/tokenizer/" % os.path.join(TOKENIZER, ours))
    try:
        write_folder(cfg, params, outdir)
    except OSError as e:
        hf.die("cannot write %s (%s)" % (e.filename or outdir, e.strerror))
    print("exported %s (%d parameters without padding) to %s" % (cfg, cfg.numel() - (cfg.Vp - cfg.V) * cfg.C, outdir))
    if cfg.V != hf.GPT2_TOKEN + 1:
        print("warning: vocabulary %d is not GPT-2's %d; vocab.json and merges.txt are GPT-2's tokenizer"
              % (cfg.V, hf.GPT2_TOKEN + 1), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        hf.die("usage: export_hf.py CHECKPOINT_DIR_OR_MODEL.bin OUTDIR")
    export(sys.argv[1], sys.argv[2])
