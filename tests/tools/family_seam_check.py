#!/usr/bin/env python3
"""The scripts' family seam (scripts/families/). Prints "ok NAME" / "FAIL NAME: why"; exit 1 on any FAIL.

  generic_code_names_no_family  the scripts outside scripts/families/ (and families/__init__.py past its
                                table) hold no identifier naming a family (is_llama, LlamaConfig, GPT2_TOKEN)
                                and no string that starts with one (model_type == "gpt2", "llama:")
  family_modules_complete       every family in the table has every name the table's docstring promises
  spec_grammar_is_trainers      families.from_spec against train_gpt_cpu -e on the specs the tests give
                                either, and on the grammar's corners: both accept with the same model file
                                header (-x 0 writes it), or, for a model too big to write quickly, the same
                                shape and parameter counts --estimate prints (it names the RoPE scaling, not
                                its numbers); or both refuse. The trainer also refuses the shapes
                                hf_format.trainer_shape_error names, which reference.py computes.

Usage: family_seam_check.py TMPDIR TRAINER
"""
import ast
import concurrent.futures
import contextlib
import io
import os
import re
import subprocess
import sys
import traceback

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.append(SCRIPTS)   # last: scripts/tokenize.py must not shadow the standard library's
import families  # noqa: E402
import hf_format  # noqa: E402
import model_file  # noqa: E402

TMP, TRAINER = sys.argv[1], sys.argv[2]
FAILED = []

# Scripts that hold no model: the tokenizer (GPT-2's and Hugging Face's BPE, for any family) and the
# evaluation file it encodes.
NOT_MODEL_CODE = {"tokenize.py", "prepare_hellaswag.py"}


def report(name, bad):
    print("ok " + name if not bad else "FAIL %s: %s" % (name, "; ".join(bad[:6])))
    if bad:
        FAILED.append(name)


# ------------------------------------------------------------------------------------------------------

def family_words():
    words = set()
    for f in families.FAMILIES.values():
        words |= {f.NAME, f.TITLE} | set(f.HF_MODEL_TYPES)
    return sorted(w.lower() for w in words)


def docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def table_nodes(tree):
    """families/__init__.py's table: the import of the family modules and FAMILIES."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "families" or isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "FAMILIES" for t in node.targets):
            out |= {id(n) for n in ast.walk(node)}
    return out


def family_mentions(path, words):
    """Identifiers that contain a family's word and strings (not docstrings) that start with one."""
    tree = ast.parse(open(path).read(), path)
    skip = docstrings(tree) | (table_nodes(tree) if path.endswith(os.path.join("families", "__init__.py")) else set())
    word = re.compile("|".join(re.escape(w) for w in words), re.I)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        elif isinstance(node, ast.keyword):
            names = [node.arg or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and word.match(node.value):
            found.append("%s:%d string %r" % (os.path.relpath(path, ROOT), node.lineno, node.value[:40]))
        found += ["%s:%d %s" % (os.path.relpath(path, ROOT), node.lineno, n) for n in names if word.search(n)]
    return found


def generic_code_names_no_family():
    words = family_words() + ["gpt"]   # GPT, the old name of GPT-2's classes
    paths = [os.path.join(SCRIPTS, n) for n in sorted(os.listdir(SCRIPTS)) if n.endswith(".py")
             and n not in NOT_MODEL_CODE] + [os.path.join(SCRIPTS, "families", "__init__.py")]
    bad = [m for p in paths for m in family_mentions(p, words)]
    report("generic_code_names_no_family", bad + ([] if len(paths) > 5 else ["only %d files read" % len(paths)]))


# What families/__init__.py's docstring promises of a family module, and of its Config.
MODULE_NAMES = ["NAME", "TITLE", "FILE_ID", "Config", "config_from_header", "parse_spec", "HF_MODEL_TYPES",
                "HF_PREFIX", "hf_names", "to_hf", "from_hf", "canonical_name", "ignored", "hf_numel",
                "config_from_hf", "architecture", "hf_config", "TIED_WHY", "extra_tensors", "TOKEN_IDS",
                "TOKENIZER_FILES", "tokenizer_note", "reference_logits", "reference_hf_config",
                "reference_hf_params", "LORA_LAYER", "LORA_FAN_IN_FAN_OUT", "lora_targets"]
CONFIG_NAMES = ["family", "file_id", "names", "decayed", "vocab_tensors", "head_size", "init", "shapes", "numel",
                "header", "error", "trainer_error"]


def family_modules_complete():
    doc = families.__doc__
    bad = ["the table's docstring does not name %s" % n for n in MODULE_NAMES if n not in doc]
    for name, f in families.FAMILIES.items():
        bad += ["%s has no %s" % (name, n) for n in MODULE_NAMES if not hasattr(f, n)]
        bad += ["%s.Config has no %s" % (name, n) for n in CONFIG_NAMES if not hasattr(f.Config, n)]
        if f.NAME != name or f.Config.family != name or f.Config.file_id != f.FILE_ID:
            bad.append("%s: the table's key, NAME, Config.family and file ids disagree" % name)
    ids = [f.FILE_ID for f in families.FAMILIES.values()]
    types = families.model_types()
    if len(set(ids)) != len(ids) or len(set(types)) != len(types):
        bad.append("file ids %s or model types %s repeat" % (ids, types))
    report("family_modules_complete", bad + ([] if len(families.FAMILIES) >= 2 else ["fewer than 2 families"]))


# ------------------------------------------------------------------------------------------------------
# The specs: those the tests give reference.py or the trainer, then the grammar's corners. Each is accepted
# by both, refused by both, or (REFERENCE_ONLY) parsed here and refused by the trainer for its shape.

ACCEPTED = [
    "L2C64H4V500T64", "L1C16H2V50T16", "L2C64H4V512T64", "L2C64H4", "L2H4C64T64V500", "L02C064H4V500T0064",
    "d12",
    "llama:L2,C32,H4,K2,F48,V300,T32,qknorm,rope-llama38/1/4/16", "llama:L1,C64,H4,K2,F96,V500,T64,qknorm,qkvbias",
    "llama:L1,C64,H4,K2,D32,F96,V500,T64,qkvbias", "llama:L1,C32,H4,F64,tied",
    "llama:L2,C64,H4,K2,F160,V500,T64,theta500000,eps1e-6,qknorm,rope-llama38/1/4/8192",
    "llama:L2,C32,H4,K1,F64,V128,T32,tied,qkvbias", "llama:L1,C1024,H8,F64,theta500000,rope-llama38/1/4/8192",
    "llama:L2,C32,H4,K2,F48,V100,T16,qknorm,theta37", "llama:L2,C32,H4,K2,F48,V100,T16,qknorm,rope-linear3",
    "llama:L2,C64,H4,K2,F160,V500,T64,rope-llama3:8/1/4/32", "llama:L2,C64,H4,K1,F160,V500,T64,tied,rope-linear:2",
    "llama:L2,C64,H4,K2,D32,F160,V500,T64,qknorm,theta1000000,eps1e-6", "llama:L4,C64,H4,K2,D32,F96,V512,T64,qknorm",
    "llama:L2,C64,H4,K1,D32,F96,V512,T64,qknorm,qkvbias", "llama:L2,C64,H4,K1,F128,T64,tied",
    "llama:L2.0,C6.4e1,H4,F96,V512,T64", "llama:L2,,C64,H4,F96,V512,T64,", "llama:T64,F96,H4,C64,L2,V512",
    "llama:L2,C64,H4,F96,V512,T64,theta0x1p10,eps 1e-6", "llama:L2,C64,H4,F96,V512,T64,rope-llama3 8/ 1/ 4/ +32",
    "smollm2-135m", "llama3.1-8b", "qwen3-0.6b",
]
REFERENCE_ONLY = [
    "L1C8H2V16T8", "L1C8H2V20T8", "L2C48H4", "L300C64H4", "L1C64H2V1",
    "llama:L1,C32,H4,K1,D6,F64,V128,T32,rope-linear2.5", "llama:L2,C48,H4,F96,V512,T64",
    "llama:L1,C36,H4,D8,F64,V128,T32",
]
REFUSED = [
    "llama:L2,C64,H4", "llama:L2,C64,H4,K3,F16", "llama:L2,C64,H4,D7,F16", "llama:L2,C64,H4,F16,F8",
    "llama:L2,C64,H3,F16", "llama:L2,C64,H4,F16,bias", "llama:L2,C64,H4,F16,rope-llama38/4/1/64",
    "llama:L2,C64,H4,F16,theta0", "llama:L2,C64,H4,F96,Z9", "llama:L2,C64,H4,V512", "llama:L2,C64,H4,F96,tied,tied",
    "llama:L2,C64,H4,F96,rope-linear:2,rope-llama3:8/1/4/32", "llama:L2.5,C64,H4,F96", "llama:L2,C64,H4,F96,tiedx",
    "llama:L2,C64,H4,F96,theta", "llama:L2,C64,H4,F96,thetanan", "llama:L2,C64,H4,F96,rope-llama38/1/4",
    "llama:L2,C64,H4,F96,rope-llama38/1/4/0", "llama:L2e9,C64,H4,F96", "llama:" + "L2," * 200 + "C64",
    "L2C64Q4", "L2C64H5", "L2C64", "L0C64H4", "L2C64H4L3", "L2C+64H4", "L2C64H4V2000000000", "x12",
]


def parse_here(spec):
    """(Config or None, its error line or None): families.from_spec, a die() caught."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = families.from_spec(spec)
    except SystemExit:
        return None, err.getvalue().strip()
    return cfg, None if cfg is not None else "not a spec of any family"


def describe(cfg):
    """core/model/model.c's shape_describe, and --estimate's parameter counts."""
    out = "%sL=%d C=%d NH=%d V=%d Vp=%d maxT=%d" % ("" if cfg.file_id == 0 else cfg.family + " ", cfg.L, cfg.C,
                                                  cfg.NH, cfg.V, cfg.Vp, cfg.maxT)
    if cfg.file_id != 0:
        out += " KV=%d D=%d F=%d%s%s%s theta=%g eps=%g%s" % (
            cfg.KV, cfg.D, cfg.F, " tied" if cfg.tied else "", " qk_norm" if cfg.qk_norm else "",
            " qkv_bias" if cfg.qkv_bias else "", cfg.theta, cfg.eps,
            ["", " rope-linear", " rope-llama3"][cfg.rope_kind])
    real = cfg.numel() - sum((cfg.Vp - cfg.V) * cfg.C for _ in cfg.vocab_tensors)
    return "model: %s, %d parameters (%d with the padded vocabulary rows)" % (out, real, cfg.numel())


# Models past this many parameters are described by --estimate instead of written: each run writes its
# model and optimizer state.
WRITTEN_MAX = 1_000_000


def one_line(stderr):
    """The trainer's `error:` line, or all it said (an MPI failure comes in a box of several lines)."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip() and not l.startswith("---")]
    return next((l for l in lines if l.startswith("error: ")), " | ".join(lines) or "no message")


def trainer(spec, i, shard, written):
    """(the header the trainer writes, or, when not written, --estimate's model line; None when it refuses;
    its error). Only a spec the scripts take for a small model is written: the trainer would otherwise
    allocate whatever it accepts."""
    # Each run starts MPI alone (a singleton) beside the pool's others: a session directory of its own, or two
    # could race to create the same one and fail to start.
    session = os.path.join(TMP, "ompi%d" % i)
    os.makedirs(session, exist_ok=True)
    env = dict(os.environ, OMPI_MCA_orte_tmpdir_base=session)
    if not written:
        r = subprocess.run([TRAINER, "-e", spec, "--estimate", "-i", "none", "-j", "", "-b", "1", "-t", "8"],
                           capture_output=True, text=True, env=env)
        line = next((l for l in r.stdout.splitlines() if l.startswith("model: ")), None)
        return (line, None) if r.returncode == 0 else (None, one_line(r.stderr))
    out = os.path.join(TMP, "spec%d" % i)
    r = subprocess.run([TRAINER, "-e", spec, "-i", shard, "-j", "", "-v", "0", "-s", "0", "-b", "1", "-t", "8",
                        "-x", "0", "-o", out], capture_output=True, text=True, env=env)
    if r.returncode:
        return None, one_line(r.stderr)
    return open(os.path.join(out, "ckpt_000000", "model.bin"), "rb").read(model_file.HEADER_INTS * 4), None


def compare(spec, i, shard, expect):
    cfg, why = parse_here(spec)
    runs = None if cfg is None else hf_format.trainer_shape_error(cfg)
    written = cfg is not None and runs is None and cfg.numel() <= WRITTEN_MAX
    theirs, their_error = trainer(spec, i, shard, written)
    ours = None if cfg is None or runs else cfg.header(3).tobytes() if written else describe(cfg)
    says = "scripts: %s; trainer: %s" % (why or runs or cfg, their_error or "accepts")
    if (cfg is not None and runs is None) != (expect == "accepted") or (cfg is not None) != (expect != "refused"):
        return "%s: expected %s, %s" % (spec, expect, says)
    if ours != theirs:
        return "%s: %s" % (spec, says if ours is None or theirs is None else differences(ours, theirs))
    return None


def differences(ours, theirs):
    if isinstance(ours, str):
        return "the scripts describe %r, the trainer prints %r" % (ours, theirs)
    a, b = np.frombuffer(ours, np.int32), np.frombuffer(theirs, np.int32)
    return "header slots differ (slot: scripts, trainer): %s" % ", ".join(
        "%d: %d, %d" % (i, a[i], b[i]) for i in np.flatnonzero(a != b)[:6])


def spec_grammar_is_trainers():
    shard = os.path.join(TMP, "tokens.bin")
    subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_shard.py"), "-o", shard, "-n", "200", "-V", "16",
                    "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    cases = ([(s, "accepted") for s in ACCEPTED] + [(s, "reference only") for s in REFERENCE_ONLY]
             + [(s, "refused") for s in REFUSED])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:   # the trainer mostly waits on MPI's start
        bad = [b for b in pool.map(lambda c: compare(c[1][0], c[0], shard, c[1][1]), enumerate(cases)) if b]
    report("spec_grammar_is_trainers", bad)


def main():
    os.makedirs(TMP, exist_ok=True)
    for fn in (generic_code_names_no_family, family_modules_complete, spec_grammar_is_trainers):
        try:
            fn()
        except Exception:   # a check's own bug is a failure too, never a skip
            report(fn.__name__, [traceback.format_exc().strip().splitlines()[-1]])
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
