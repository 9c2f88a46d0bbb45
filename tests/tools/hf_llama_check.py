#!/usr/bin/env python3
"""Checks for tests/system/t_hf_llama.sh: scripts/export_hf.py and scripts/import_hf.py on the Llama family
(LlamaForCausalLM, Qwen3ForCausalLM, Qwen2ForCausalLM), written without scripts/hf_format.py: safetensors
files and their shard index are read and written here, and the Hugging Face forward pass is written here
from transformers' conventions (HF's names; nn.Linear's x W^T + b; rotate-half RoPE; repeat_kv; RMSNorm
w * x / sqrt(mean(x^2) + eps); each class's config defaults).

  hf_llama_check.py TMP TRAINER SHARD NAME=MODEL.bin...

NAME=MODEL.bin are trained model files: untied, tied, qknorm, qkvbias (Qwen2's biases), those written by
layouts (z2, pp2, tp2), and GPT-2's (gpt2, gpt2_tp2), whose export and import are checked for the bits
only. Prints
"ok NAME" / "FAIL NAME: why" per check; exit 1 on any FAIL.

The scripts run as programs, each in a child forked from this process once torch and numpy are imported
(os.fork, then runpy as `python3 SCRIPT ARGS` would run it): an exit status, stdout and stderr per run, at a
few milliseconds each instead of the second an import of torch takes.
"""
import json
import math
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch

from safetensors_plain import read_st, write_st

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
TMP, TRAINER, SHARD = sys.argv[1:4]
MODELS = dict(a.split("=", 1) for a in sys.argv[4:])
B, T = 2, 32
FAILED = []
WIDTH = {"F32": 4, "BF16": 2, "F16": 2, "BOOL": 1}
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def report(name, bad):
    if bad:
        FAILED.append(name)
        print("FAIL %s: %s" % (name, "; ".join(str(b) for b in bad)))
    else:
        print("ok " + name)
    sys.stdout.flush()


def check(name, fn, *args):
    """fn(*args) -> list of problems; an exception in it is a failure of the check, never a pass."""
    try:
        bad = fn(*args)
    except Exception as e:
        bad = ["%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else traceback.format_exc(limit=1))]
    report(name, bad)


class Run:
    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self):
        return "exit %d, stderr %.300r" % (self.rc, self.err)


def cli(script, *args):
    """scripts/SCRIPT ARGS as a program, in a forked child -> Run(exit status, stdout, stderr)."""
    path = os.path.join(SCRIPTS, script)
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(files[0].fileno(), 1)
            os.dup2(files[1].fileno(), 2)
            sys.argv = [path] + [str(a) for a in args]
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    out = []
    for f in files:
        f.seek(0)
        out.append(f.read().decode())
    return Run(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode")
               else status >> 8, *out)


def ran(r, what):
    """[] when the run succeeded, else the problem."""
    return [] if r.rc == 0 else ["%s: %r" % (what, r)]


def export(src, out, *opts):
    return cli("export_hf.py", src, out, *opts)


def imp(folder, out, *opts):
    return cli("import_hf.py", folder, out, *opts)


def same_bytes(a, b):
    return os.path.isfile(a) and os.path.isfile(b) and open(a, "rb").read() == open(b, "rb").read()


# ------------------------------------------------------------------------------------------------------
# Folders, read and written here (safetensors_plain: the files themselves)

def st_problems(path):
    """What the safetensors library would refuse: data not 8-byte aligned, offsets that do not tile it."""
    h, n, data = read_st(path)
    bad = [] if (8 + n) % 8 == 0 else ["%s: data starts at %d" % (path, 8 + n)]
    end = 0
    for k, e in sorted(((k, e) for k, e in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"]):
        b, en = e["data_offsets"]
        if b != end or en - b != WIDTH[e["dtype"]] * math.prod(e["shape"]):
            bad.append("%s: %s at %s after %d" % (path, k, e["data_offsets"], end))
        end = en
    return bad + ([] if end == len(data) else ["%s: tensors end at %d of %d" % (path, end, len(data))])


def folder_files(folder):
    """The weight files: the index's shards, or model.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        return sorted(set(json.load(open(index))["weight_map"].values()))
    return ["model.safetensors"]


def folder_tensors(folder):
    """{name: (dtype, shape, raw bytes)} over all of a folder's weight files."""
    out = {}
    for f in folder_files(folder):
        h, _, data = read_st(os.path.join(folder, f))
        for k, e in h.items():
            if k != "__metadata__":
                out[k] = (e["dtype"], tuple(e["shape"]), data[e["data_offsets"][0]:e["data_offsets"][1]])
    return out


def decode(dtype, shape, raw):
    if dtype == "BF16":
        a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(raw, {"F32": "<f4", "F16": "<f2"}[dtype])
    return a.astype(np.float64).reshape(shape)


def values(folder):
    return {k: decode(*v) for k, v in folder_tensors(folder).items()}


def encode(a, dtype):
    a = np.asarray(a, np.float32)
    if dtype == "BF16":   # truncated: the values written are the values meant
        return (a.view(np.uint32) >> 16).astype("<u2")
    return a.astype({"F32": "<f4", "F16": "<f2"}[dtype])


def write_folder(folder, conf, tensors, shards=1, index_map=None):
    """A Hugging Face folder: config.json and [(name, dtype, array)] in one file or `shards` shards with HF's
    names and index. index_map edits the index's weight_map after it is made."""
    os.makedirs(folder)
    json.dump(conf, open(os.path.join(folder, "config.json"), "w"), indent=1)
    if shards == 1:
        return write_st(os.path.join(folder, "model.safetensors"), tensors, {"format": "pt"})
    per = -(-len(tensors) // shards)
    weight_map = {}
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = tensors[i * per:(i + 1) * per]
        write_st(os.path.join(folder, name), part, {"format": "pt"})
        weight_map.update((t[0], name) for t in part)
    if index_map:
        index_map(weight_map)
    total = sum(a.nbytes for _, _, a in tensors)
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(folder, "model.safetensors.index.json"), "w"))


# ------------------------------------------------------------------------------------------------------
# Hugging Face's model, written here

def dims(conf):
    """(C, NH, KV, D, F, L, V) with each class's defaults (Qwen3's head_dim is 128 unless given)."""
    C, NH = conf["hidden_size"], conf["num_attention_heads"]
    D = conf.get("head_dim") or (128 if conf["model_type"] == "qwen3" else C // NH)
    return (C, NH, conf.get("num_key_value_heads") or NH, D, conf["intermediate_size"], conf["num_hidden_layers"],
            conf["vocab_size"])


def expected_names(conf):
    """{name: shape} of the parameters from_pretrained expects of this config."""
    C, NH, KV, D, F, L, V = dims(conf)
    kind = conf["model_type"]
    per = {"self_attn.q_proj.weight": (NH * D, C), "self_attn.k_proj.weight": (KV * D, C),
           "self_attn.v_proj.weight": (KV * D, C), "self_attn.o_proj.weight": (C, NH * D),
           "mlp.gate_proj.weight": (F, C), "mlp.up_proj.weight": (F, C), "mlp.down_proj.weight": (C, F),
           "input_layernorm.weight": (C,), "post_attention_layernorm.weight": (C,)}
    if kind == "qwen2":
        per.update({"self_attn.q_proj.bias": (NH * D,), "self_attn.k_proj.bias": (KV * D,),
                    "self_attn.v_proj.bias": (KV * D,)})
    if kind == "qwen3":
        per.update({"self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,)})
    out = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    out.update({"model.layers.%d.%s" % (l, k): s for l in range(L) for k, s in per.items()})
    if not conf.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (V, C)
    return out


def inv_freq(conf, D):
    """RoPE's inverse frequencies as transformers' rope init functions make them (default, linear, llama3)."""
    theta = conf.get("rope_theta", 10000.0)
    base = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    rs = conf.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return base / rs["factor"]
    if kind == "llama3":
        f, lo, hi, orig = (rs[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"))
        out = []
        for w in base:
            wavelen = 2 * math.pi / w
            if wavelen < orig / hi:
                out.append(w)
            elif wavelen > orig / lo:
                out.append(w / f)
            else:
                s = (orig / wavelen - lo) / (hi - lo)
                out.append((1 - s) * w / f + s * w)
        return np.array(out)
    assert kind == "default", kind
    return base


def hf_forward(folder, ids):
    """Logits (B, T, V) of the folder's model in float64, HF's way."""
    conf = json.load(open(os.path.join(folder, "config.json")))
    w = {k: torch.from_numpy(v) for k, v in values(folder).items()}
    C, NH, KV, D, F, L, V = dims(conf)
    eps = conf.get("rms_norm_eps", 1e-6)
    Bn, Tn = ids.shape

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1)

    freqs = torch.outer(torch.arange(Tn, dtype=torch.float64), torch.from_numpy(inv_freq(conf, D)))
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms(x, w[p + "input_layernorm.weight"])
        q = linear(h, p + "self_attn.q_proj").view(Bn, Tn, NH, D)
        k = linear(h, p + "self_attn.k_proj").view(Bn, Tn, KV, D)
        v = linear(h, p + "self_attn.v_proj").view(Bn, Tn, KV, D).transpose(1, 2)
        if conf["model_type"] == "qwen3":
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # repeat_kv: kv head j serves query heads j*NH/KV .. (j+1)*NH/KV - 1
        k = k[:, :, None].expand(Bn, KV, NH // KV, Tn, D).reshape(Bn, NH, Tn, D)
        v = v[:, :, None].expand(Bn, KV, NH // KV, Tn, D).reshape(Bn, NH, Tn, D)
        att = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + linear((att @ v).transpose(1, 2).reshape(Bn, Tn, NH * D), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = linear(h, p + "mlp.gate_proj")
        x = x + linear(g * torch.sigmoid(g) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = w["model.embed_tokens.weight"] if conf.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return (rms(x, w["model.norm.weight"]) @ head.T).numpy()


def step0_ids():
    return torch.from_numpy(np.fromfile(SHARD, np.uint16, offset=1024)[:B * T].astype(np.int64).reshape(B, T))


def logits_match(folder, dump, tol=1e-5):
    """The HF forward of folder against a -dump's logits0.f32 (B*T x V): max |diff| <= tol * max(1, max |logit|)."""
    ours = hf_forward(folder, step0_ids()).reshape(-1)
    theirs = np.fromfile(os.path.join(dump, "logits0.f32"), np.float32)
    if theirs.size != ours.size:
        return ["%s has %d logits, the HF forward %d" % (dump, theirs.size, ours.size)]
    err, scale = float(np.abs(ours - theirs).max()), max(1.0, float(np.abs(ours).max()))
    print("# %s: max |HF forward - dump| %.2g (largest logit %.3g)" % (os.path.basename(folder), err, scale))
    return [] if err <= tol * scale else ["max |HF forward - dump| = %.3g > %.0g x %.3g" % (err, tol, scale)]


def trainer_dump(model, name):
    """The trainer's step-0 logits for MODEL (-dump); the dump folder."""
    d = os.path.join(TMP, "dump_" + name)
    os.makedirs(d, exist_ok=True)
    p = subprocess.run([TRAINER, "-e", model, "-i", SHARD, "-j", "", "-b", str(B), "-t", str(T), "-x", "1", "-s", "0",
                        "-v", "0", "-dump", d, "-o", os.path.join(TMP, "run_" + name)], capture_output=True, text=True)
    assert p.returncode == 0, "trainer on %s: %s" % (model, (p.stderr or p.stdout).strip().splitlines()[-1:])
    return d


def reference_dump(model, name):
    d = os.path.join(TMP, "refdump_" + name)
    r = cli("reference.py", "-e", model, "-i", SHARD, "-b", B, "-t", T, "-x", 1, "-dump", d, "--quiet")
    assert r.rc == 0, "reference.py -e %s: %r" % (model, r)
    return d


def header(path):
    return np.fromfile(path, np.int32, 32)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def trainer_vs_reference(name, model):
    """The trainer's step-0 -dump of a model with q/k/v biases against reference.py's (float64): logits,
    and the gradients of all tensors and of bq and bkv alone, within 1e-5 relative."""
    a, b = trainer_dump(model, name), reference_dump(model, name)
    h = header(model)
    Vp, L, NH, C, KV, D = (int(h[i]) for i in (7, 4, 5, 6, 9, 10))
    start = Vp * C + L * C + L * NH * D * C + L * 2 * KV * D * C   # wte, attn_norm, wq, wkv, then bq and bkv
    bad = []
    for what, f, lo, hi in (("logits", "logits0.f32", 0, None), ("gradients", "grads0.f32", 0, None),
                            ("bq's gradient", "grads0.f32", start, start + L * NH * D),
                            ("bkv's gradient", "grads0.f32", start + L * NH * D, start + L * (NH + 2 * KV) * D)):
        x, y = (np.fromfile(os.path.join(d, f), np.float32)[lo:hi].astype(np.float64) for d in (a, b))
        e = rel_err(x, y)
        print("# %s %s: relative error %.2g" % (name, what, e))
        if not (x.size == y.size and e < 1e-5 and np.abs(y).max() > 0):
            bad.append("%s: relative error %.3g (%d vs %d values)" % (what, e, x.size, y.size))
    return bad


# ------------------------------------------------------------------------------------------------------
# Trained model files -> Hugging Face folders and back

FAMILY = {"untied": "llama", "tied": "llama", "qknorm": "qwen3", "qkvbias": "qwen2", "z2": "qwen2",
          "pp2": "llama", "tp2": "qwen3", "gpt2": "gpt2", "gpt2_tp2": "gpt2"}


def exported_folder(name, model, out):
    """The folder is a valid HF checkpoint of the model: header, HF's names and shapes for config.json,
    F32 storage, config.json's keys and values from the model file's header."""
    h = header(model)
    conf = json.load(open(os.path.join(out, "config.json")))
    kind = FAMILY[name]
    bad = st_problems(os.path.join(out, "model.safetensors"))
    got = {k: v[1] for k, v in folder_tensors(out).items()}
    want = expected_names(conf)
    if got != want:
        bad.append("names/shapes differ: %s" % sorted(set(got.items()) ^ set(want.items()))[:3])
    if {v[0] for v in folder_tensors(out).values()} != {"F32"}:
        bad.append("storage is not F32")
    f32 = lambda i: float(np.array([h[i]], np.int32).view(np.float32)[0])
    rope = [None, {"rope_type": "linear", "factor": f32(17)},
            {"rope_type": "llama3", "factor": f32(17), "low_freq_factor": f32(18), "high_freq_factor": f32(19),
             "original_max_position_embeddings": int(h[20])}][h[14]]
    expect = {"architectures": [ARCH[kind]], "model_type": kind, "vocab_size": h[3], "hidden_size": h[6],
              "num_hidden_layers": h[4], "num_attention_heads": h[5], "num_key_value_heads": h[9], "head_dim": h[10],
              "intermediate_size": h[11], "tie_word_embeddings": bool(h[12]), "max_position_embeddings": h[2],
              "rms_norm_eps": f32(16), "rope_theta": f32(15), "rope_scaling": rope, "hidden_act": "silu",
              "torch_dtype": "float32"}
    if kind != "qwen2":
        expect["attention_bias"] = False
    for k, v in expect.items():
        if k not in conf or (conf[k] != v and not (isinstance(v, float) and np.float32(conf[k]) == np.float32(v))):
            bad.append("config.json %s = %r, want %r" % (k, conf.get(k), v))
    return bad


def roundtrip(name, model):
    """export (F32) then import: the same file, byte for byte; for the Llama family, the folder checked as
    above and its HF forward against the model's step-0 logits (GPT-2's: t_hf.sh)."""
    out, back = os.path.join(TMP, "hf_" + name), os.path.join(TMP, name + "_back.bin")
    bad = ran(export(model, out), "export") or ran(imp(out, back), "import")
    if bad:
        return bad
    if not same_bytes(model, back):
        return ["import(export(model)) differs from the model file"]
    if FAMILY[name] == "gpt2":
        return []
    check("export_folder_" + name, exported_folder, name, model, out)
    check("hf_logits_" + name, logits_match, out, trainer_dump(model, name))
    return []


def reference_reads_folder(name, model):
    """reference.py -e FOLDER gives the logits reference.py -e MODEL.bin gives, to the bit, and the
    trainer's step-0 logits (roundtrip's -dump) within 1e-5 relative."""
    a, b = reference_dump(os.path.join(TMP, "hf_" + name), name + "_folder"), reference_dump(model, name + "_file")
    logits = lambda d: np.fromfile(os.path.join(d, "logits0.f32"), np.float32).astype(np.float64)
    bad = [] if same_bytes(os.path.join(a, "logits0.f32"), os.path.join(b, "logits0.f32")) else [
        "reference.py's logits from the folder differ from those from the model file"]
    x, y = logits(a), logits(os.path.join(TMP, "dump_" + name))
    e = rel_err(x, y) if x.size == y.size else float("inf")
    return bad + ([] if e < 1e-5 else ["reference.py on the folder vs the trainer: relative error %.3g" % e])


def bf16_roundtrip(name, model):
    """import --bf16 of the F32 folder; its export is BF16 by default (config torch_dtype bfloat16), and
    importing that (bf16 by default, the weights being BF16) gives the same file; the bf16 folder's HF forward
    equals the trainer's logits of the bf16 model file."""
    m16, out, back = (os.path.join(TMP, name + s) for s in ("16.bin", "_hf16", "16_back.bin"))
    bad = (ran(imp(os.path.join(TMP, "hf_" + name), m16, "--bf16"), "import --bf16") or ran(export(m16, out), "export")
           or ran(imp(out, back), "import"))
    if bad:
        return bad
    if header(m16)[1] != 5:
        bad.append("import --bf16 wrote version %d" % header(m16)[1])
    dtypes = {v[0] for v in folder_tensors(out).values()}
    if dtypes != {"BF16"} or json.load(open(os.path.join(out, "config.json")))["torch_dtype"] != "bfloat16":
        bad.append("a bf16 file exported as %s" % dtypes)
    if not same_bytes(m16, back):
        bad.append("import(export(bf16 file)) differs")
    return bad + logits_match(out, trainer_dump(m16, name + "16"))


def fp16_and_shards(name, model):
    """export --dtype fp16 --max-shard-size 40KB: F16 shards of at most 40000 bytes (a larger tensor alone),
    HF's shard names, an index whose weight_map lists every tensor once and whose total_size is their bytes;
    the values are the model's rounded to float16; importing and exporting again gives the same shards."""
    out, back, again = (os.path.join(TMP, name + s) for s in ("_hf_f16", "_f16_back.bin", "_hf_f16_again"))
    bad = ran(export(model, out, "--dtype", "fp16", "--max-shard-size", "40KB"), "export --dtype fp16")
    if bad:
        return bad
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    if n < 3 or files != ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]:
        bad.append("shards %s" % files)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        bad.append("model.safetensors written beside the shards")
    tensors = folder_tensors(out)
    for f in files:
        bad += st_problems(os.path.join(out, f))
        h = read_st(os.path.join(out, f))[0]
        size = sum(len(tensors[k][2]) for k in h if k != "__metadata__")
        if size > 40000 and len(h) > 2:
            bad.append("%s holds %d bytes of tensors" % (f, size))
        for k in h:
            if k != "__metadata__" and index["weight_map"].get(k) != f:
                bad.append("%s is in %s, the index says %s" % (k, f, index["weight_map"].get(k)))
    if index["metadata"]["total_size"] != sum(len(v[2]) for v in tensors.values()):
        bad.append("total_size %d" % index["metadata"]["total_size"])
    if {v[0] for v in tensors.values()} != {"F16"}:
        bad.append("not all F16")
    f32 = values(os.path.join(TMP, "hf_" + name))
    if set(f32) != set(tensors) or any(not np.array_equal(decode(*tensors[k]), v.astype(np.float16).astype(np.float64))
                                       for k, v in f32.items()):
        bad.append("the F16 values are not the model's rounded to float16")
    bad += ran(imp(out, back), "import") or ran(export(back, again, "--dtype", "fp16", "--max-shard-size", "40KB"),
                                               "export again")
    if not bad and any(not same_bytes(os.path.join(out, f), os.path.join(again, f)) for f in files):
        bad.append("export(import(F16 shards)) gives other shards")
    return bad


# ------------------------------------------------------------------------------------------------------
# Hugging Face folders written here -> model files and back

def hf_config(kind, **kw):
    conf = {"architectures": [ARCH[kind]], "model_type": kind, "vocab_size": 500, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    conf.update(kw)
    return {k: v for k, v in conf.items() if v is not None}


def hf_tensors(conf, dtype, seed):
    """Random values for every parameter of the config, in HF's state-dict order, as (name, dtype, bits)."""
    g = np.random.default_rng(seed)
    out = []
    for name, shape in expected_names(conf).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            a = 1 + 0.2 * g.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.5 * g.standard_normal(shape)
        else:
            a = g.standard_normal(shape) / math.sqrt(shape[-1])
        out.append((name, dtype, encode(a, dtype)))
    return out


HF = {   # name: (config, storage, shards)
    # Llama 3.2-style: tied, bf16, llama3 RoPE, no num_key_value_heads and no rms_norm_eps (KV = heads, 1e-6).
    "llama_bf16_tied": (hf_config("llama", tie_word_embeddings=True, num_key_value_heads=None, rms_norm_eps=None,
                                  rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 32}), "BF16", 1),
    # Qwen3: q/k norms, no head_dim (128), F16 in 3 shards.
    "qwen3_f16_sharded": (hf_config("qwen3", tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                    use_sliding_window=False, sliding_window=None, max_window_layers=28), "F16", 3),
    # Qwen2: q/k/v biases, untied, linear RoPE in the older "type" spelling, F32.
    "qwen2_f32": (hf_config("qwen2", rope_scaling={"type": "linear", "factor": 2.0}, use_sliding_window=False,
                            sliding_window=32, max_window_layers=2), "F32", 1),
}
STORAGE = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}


def make_hf(name):
    conf, dtype, shards = HF[name]
    folder = os.path.join(TMP, "src_" + name)
    write_folder(folder, conf, hf_tensors(conf, dtype, len(name)), shards)
    return folder


def hf_roundtrip(name):
    """import (bf16 from BF16 storage, fp32 from the others) then export (in the folder's storage, sharded as
    it is): the same names, shapes, dtypes and values; the imported file's header holds config.json's values
    and each class's defaults; the trainer's step-0 logits of the imported file equal the HF forward of the
    folder."""
    conf, dtype, shards = HF[name]
    src, model, out = make_hf(name), os.path.join(TMP, name + ".bin"), os.path.join(TMP, name + "_out")
    opts = ["--dtype", STORAGE[dtype]] + (["--max-shard-size", "60000"] if shards > 1 else [])
    bad = ran(imp(src, model), "import") or ran(export(model, out, *opts), "export")
    if bad:
        return bad
    if header(model)[1] != (5 if dtype == "BF16" else 3):
        bad.append("a %s folder imported as version %d" % (dtype, header(model)[1]))
    a, b = folder_tensors(src), folder_tensors(out)
    if {k: v[:2] for k, v in a.items()} != {k: v[:2] for k, v in b.items()}:
        bad.append("names/dtypes/shapes differ: %s" % sorted(set((k, v[:2]) for k, v in a.items())
                                                             ^ set((k, v[:2]) for k, v in b.items()))[:3])
    bad += ["%s's values differ" % k for k in a if k in b and a[k][2] != b[k][2]][:3]
    if (len(folder_files(out)) > 1) != (shards > 1):
        bad.append("exported as %d files from %d" % (len(folder_files(out)), shards))
    h = header(model)
    C, NH, KV, D, F, L, V = dims(conf)
    f32 = lambda x: int(np.array([x], np.float32).view(np.int32)[0])
    want = {3: V, 4: L, 5: NH, 6: C, 7: 512, 8: 1, 9: KV, 10: D, 11: F, 12: int(conf["tie_word_embeddings"]),
            13: int(conf["model_type"] == "qwen3"), 15: f32(conf["rope_theta"]),
            16: f32(conf.get("rms_norm_eps", 1e-6)), 21: int(conf["model_type"] == "qwen2")}
    bad += ["header slot %d is %d, want %d" % (i, h[i], v) for i, v in want.items() if h[i] != v]
    return bad + logits_match(src, trainer_dump(model, name))


def alternative_names():
    """A Llama base model's names (no `model.`) and a tied model's stored lm_head equal to the embedding
    import to the file the usual folder imports to."""
    conf, dtype, _ = HF["llama_bf16_tied"]
    tensors = hf_tensors(conf, dtype, len("llama_bf16_tied"))
    emb = next(a for n, _, a in tensors if n == "model.embed_tokens.weight")
    folder = os.path.join(TMP, "alt_names")
    write_folder(folder, conf, [(n[len("model."):], d, a) for n, d, a in tensors] + [("lm_head.weight", dtype, emb)])
    r = imp(folder, os.path.join(TMP, "alt.bin"))
    return ran(r, "import") or ([] if same_bytes(os.path.join(TMP, "alt.bin"), os.path.join(TMP, "llama_bf16_tied.bin"))
                                else ["a different model file"])


# ------------------------------------------------------------------------------------------------------
# Refusals

def variant(base, name, conf=None, drop=(), add=(), replace=None, shards=1, index_map=None):
    """A copy of the HF folder base with config.json's keys changed (None removes one), tensors dropped,
    added ((name, dtype, array)), or replaced by replace(name, dtype, array) -> array."""
    c = json.load(open(os.path.join(base, "config.json")))
    for k, v in (conf or {}).items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    tensors = []
    for k, (dtype, shape, raw) in folder_tensors(base).items():
        if k not in drop:
            a = np.frombuffer(raw, {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[dtype]).reshape(shape)
            tensors.append((k, dtype, replace(k, dtype, a) if replace else a))
    folder = os.path.join(TMP, "bad", name)
    write_folder(folder, c, tensors + list(add), shards, index_map)
    return folder


def whole_folder(name, conf):
    """A folder whose tensors all have config.json's shapes: refused for its config.json, or not at all."""
    folder = os.path.join(TMP, "bad", name)
    write_folder(folder, conf, hf_tensors(conf, "F32", 1))
    return folder


def with_single_file(folder):
    """A sharded folder with a model.safetensors beside its index (a copy of its first shard)."""
    shutil.copyfile(os.path.join(folder, "model-00001-of-00003.safetensors"), os.path.join(folder, "model.safetensors"))
    return folder


def refused(run, pattern, out):
    """Exit 1, one stderr line `error: ...` containing pattern, and nothing at out."""
    lines = run.err.strip().splitlines()
    bad = [] if run.rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0] else [
        "want one line 'error: ...%s...': %r" % (pattern, run)]
    leftovers = [p for p in (out, out + ".tmp") if os.path.lexists(p)]
    return bad + (["left %s behind" % leftovers] if leftovers else [])


def import_refusals():
    q2 = os.path.join(TMP, "src_qwen2_f32")
    ll = os.path.join(TMP, "src_llama_bf16_tied")
    q3 = os.path.join(TMP, "src_qwen3_f16_sharded")
    bias = lambda shape: ("model.layers.0.self_attn.o_proj.bias", "F32", np.zeros(shape, "<f4"))
    cases = [   # name, folder, the key the error names
        ("sliding_window", variant(q2, "sliding", {"use_sliding_window": True, "sliding_window": 16,
                                                   "max_window_layers": 1}), "use_sliding_window"),
        ("sliding_window_layer_types", variant(q3, "sliding3", {
            "use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]}),
         "use_sliding_window"),
        ("rope_yarn", variant(q2, "yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32}}), "rope_scaling"),
        ("rope_dynamic", variant(ll, "dynamic", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}), "rope_scaling"),
        ("rope_longrope_parameters", variant(ll, "longrope", {"rope_parameters": {"rope_type": "longrope",
                                                                                  "rope_theta": 1e4}}),
         "rope_parameters"),
        ("rope_llama3_extra_key", variant(ll, "llama3x", {"rope_scaling": dict(
            HF["llama_bf16_tied"][0]["rope_scaling"], mscale=2.0)}), "rope_scaling.mscale"),
        ("moe_num_experts", variant(q3, "moe", {"num_experts": 8, "num_experts_per_tok": 2}), "num_experts"),
        ("moe_num_local_experts", variant(ll, "mixtral", {"num_local_experts": 4}), "num_local_experts"),
        ("llama_attention_bias", variant(ll, "attn_bias", {"attention_bias": True}), "attention_bias"),
        ("qwen3_attention_bias", variant(q3, "attn_bias3", {"attention_bias": True}), "attention_bias"),
        ("mlp_bias", variant(ll, "mlp_bias", {"mlp_bias": True}), "mlp_bias"),
        ("hidden_act", variant(q2, "gelu", {"hidden_act": "gelu"}), "hidden_act"),
        ("partial_rotary_factor", variant(ll, "partial", {"partial_rotary_factor": 0.5}), "partial_rotary_factor"),
        ("quantization_config", variant(ll, "quant", {"quantization_config": {"quant_method": "gptq"}}),
         "quantization_config"),
        ("architectures", variant(ll, "arch", {"architectures": ["MistralForCausalLM"]}), "architectures"),
        ("model_type", variant(ll, "mistral", {"model_type": "mistral"}), "model_type 'mistral'"),
        ("kv_heads", variant(q2, "kv3", {"num_key_value_heads": 3}), "num_key_value_heads 3"),
        ("qwen2_head_dim", variant(q2, "headdim", {"head_dim": 8}), "head_dim 8"),
        ("extra_tensor", variant(q2, "extra", add=[bias((64,))]), "model.layers.0.self_attn.o_proj.bias"),
        ("extra_layer", variant(q2, "layers", {"num_hidden_layers": 1}), "model.layers.1."),
        ("missing_tensor", variant(q2, "missing", drop=["model.layers.1.self_attn.v_proj.bias"]),
         "model.layers.1.self_attn.v_proj.bias is missing"),
        ("missing_head", variant(q2, "nohead", drop=["lm_head.weight"]), "lm_head.weight is missing"),
        ("wrong_shape", variant(q2, "shape", replace=lambda k, d, a: a[:, :32] if k.endswith(
            "0.self_attn.k_proj.weight") else a), "model.layers.0.self_attn.k_proj.weight has shape [32, 32]"),
        ("tied_head_differs", variant(ll, "untied", add=[("lm_head.weight", "BF16", np.zeros((500, 64), "<u2"))]),
         "lm_head.weight differs"),
        ("prefix_twice", variant(ll, "prefix", add=[("norm.weight", "BF16", np.zeros(64, "<u2"))]),
         "norm.weight is stored both with and without the `model.` prefix"),
        ("index_wrong_shard", variant(q3, "index", shards=3, index_map=lambda m: m.update(
            {"model.norm.weight": "model-00003-of-00003.safetensors"})), "model.norm.weight"),
        ("index_outside_folder", variant(q3, "outside", shards=3, index_map=lambda m: m.update(
            {"model.norm.weight": "../model-00003-of-00003.safetensors"})), "not a file name in the folder"),
        ("single_and_index", with_single_file(variant(q3, "both", shards=3)), "has both"),
    ]
    cases += [("head_dim_%d" % D, whole_folder("head_dim%d" % D, hf_config("llama", head_dim=D)),
               "config.json: head size %d must be a multiple of 8 and at most 128" % D) for D in (6, 20, 256)]
    for name, folder, pattern in cases:
        out = os.path.join(TMP, "bad", name + ".bin")
        check("import_refuses_" + name, refused, imp(folder, out), pattern, out)
    # A sliding window that takes effect in no layer (max_window_layers = every layer), or covers the whole
    # context, changes nothing: imported as the same model.
    for name, change in (("no_layer", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
                         ("whole_context", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0})):
        out = os.path.join(TMP, "bad", "window_" + name + ".bin")
        r = imp(variant(q2, "window_" + name, change), out)
        check("import_accepts_sliding_window_" + name, lambda: ran(r, "import") or (
            [] if same_bytes(out, os.path.join(TMP, "qwen2_f32.bin")) else ["a different model file"]))


def export_refusals():
    """Export errors leave no OUTDIR: a model no HF class computes, fp16 overflow, bad option values."""
    out = os.path.join(TMP, "bad_export")
    both = os.path.join(TMP, "both.bin")
    cases = []
    r = cli("reference.py", "-e", "llama:L1,C64,H4,K2,F96,V500,T64,qknorm,qkvbias", "--save", both, "-x", 0)
    cases.append(("qknorm_and_qkvbias", export(both, out), "q/k norms (Qwen3) and q/k/v biases (Qwen2)"))
    big = os.path.join(TMP, "big.bin")
    raw = bytearray(open(MODELS["untied"], "rb").read())
    raw[1024 + 4 * 700:1024 + 4 * 701] = np.array([1e5], np.float32).tobytes()   # a wte value past 65504
    open(big, "wb").write(raw)
    cases.append(("fp16_overflow", export(big, out, "--dtype", "fp16"), "tensor model.embed_tokens.weight has 1 values "
                  "beyond float16's range"))
    cases.append(("shard_size", export(MODELS["untied"], out, "--max-shard-size", "2 furlongs"), "--max-shard-size"))
    cases.append(("eos_id", export(MODELS["untied"], out, "--eos-token-id", "2,500"), "eos id [2, 500]"))
    qwen2 = os.path.join(TMP, "qwen2_d.bin")
    cli("reference.py", "-e", "llama:L1,C64,H4,K2,D32,F96,V500,T64,qkvbias", "--save", qwen2, "-x", 0)
    cases.append(("qwen2_head_dim", export(qwen2, out), "head_dim must be hidden_size / num_attention_heads"))
    if r.rc:
        return report("export_refusals_setup", [r])
    for name, run, pattern in cases:
        check("export_refuses_" + name, refused, run, pattern, out)


def tokenizer_and_ids():
    """--tokenizer copies a folder's tokenizer files and takes its bos/eos ids (config.json and
    generation_config.json); --eos-token-id overrides, several ids allowed."""
    src = os.path.join(TMP, "tok_src")
    os.makedirs(src)
    for f, text in (("tokenizer.json", '{"version": "1.0"}'), ("tokenizer_config.json", '{"x": 1}'),
                    ("config.json", '{"bos_token_id": 7, "eos_token_id": 8}'), ("README.md", "not copied")):
        open(os.path.join(src, f), "w").write(text)
    out = os.path.join(TMP, "tok_out")
    bad = ran(export(MODELS["tied"], out, "--tokenizer", src, "--eos-token-id", "8,9"), "export")
    if bad:
        return bad
    conf = json.load(open(os.path.join(out, "config.json")))
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    ids = (conf["bos_token_id"], conf["eos_token_id"], gen.get("bos_token_id"), gen.get("eos_token_id"))
    if ids != (7, [8, 9], 7, [8, 9]):
        bad.append("ids: config %r %r, generation_config %r" % (conf["bos_token_id"], conf["eos_token_id"], gen))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if not same_bytes(os.path.join(src, f), os.path.join(out, f)):
            bad.append("%s not copied" % f)
    if os.path.exists(os.path.join(out, "README.md")):
        bad.append("README.md copied")
    return bad


def main():
    torch.set_num_threads(1)
    os.makedirs(os.path.join(TMP, "bad"), exist_ok=True)
    for name, model in MODELS.items():
        check("roundtrip_" + name, roundtrip, name, model)
    for name in ("untied", "qknorm", "qkvbias"):
        check("reference_reads_folder_" + name, reference_reads_folder, name, MODELS[name])
    check("trainer_vs_reference_qkvbias", trainer_vs_reference, "qkvbias_ref", MODELS["qkvbias"])
    for name in ("untied", "qkvbias"):
        check("bf16_roundtrip_" + name, bf16_roundtrip, name, MODELS[name])
    for name in ("tied", "qkvbias"):
        check("fp16_sharded_" + name, fp16_and_shards, name, MODELS[name])
    for name in HF:
        check("hf_roundtrip_" + name, hf_roundtrip, name)
    check("import_alternative_names", alternative_names)
    import_refusals()
    export_refusals()
    check("export_tokenizer_and_ids", tokenizer_and_ids)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
