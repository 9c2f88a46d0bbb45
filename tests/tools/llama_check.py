#!/usr/bin/env python3
"""Checks scripts/reference.py's Llama family against tests/tools/llama_plain.py (a plain float64 Llama
that reads the model files itself) and against values computed by hand from the format and the rope rules:
logits, loss and gradients for several shapes, a few training steps (schedule, clipping, AdamW, decay of
the 2-D tensors only), the -dump files, RoPE, the llama3 frequency table, saved models' headers and sizes,
and the refusal of bad specs and headers. Prints "ok NAME" / "FAIL NAME: why"; exit 1 on any FAIL.
Usage: llama_check.py TMPDIR [CHECK...]
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
REF = os.path.join(ROOT, "scripts", "reference.py")
sys.path.insert(0, HERE)
import llama_plain as plain  # noqa: E402

# Loaded by path: putting scripts/ on sys.path would let scripts/tokenize.py shadow the stdlib's.
_spec = importlib.util.spec_from_file_location("reference", REF)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)
llama = ref.families.llama

TMP = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
ONLY = sys.argv[2:]
CHECKS, FAILED = [], []


def check(fn):
    CHECKS.append(fn)
    return fn


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def run_ref(args):
    """reference.py's main in this process; SystemExit from a die() becomes an AssertionError."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ref.main(args)
    except SystemExit as e:
        raise AssertionError("reference.py %s exited %s: %s" % (" ".join(args), e.code, err.getvalue().strip()))


def run_cli(args):
    """reference.py as a program: (exit status, stderr)."""
    p = subprocess.run([sys.executable, REF] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stderr


# Shapes: grouped-query attention (KV < NH), one kv head, head_dim other than C/NH, tied and untied heads,
# q/k norms, Qwen2's q/k/v biases, each rope scaling, a bf16 file, and a large eps (so that where eps enters
# shows).
CASES = {
    "gqa_untied": (dict(maxT=16, V=100, L=2, NH=4, C=32, KV=2, D=8, F=48), 3, 12),
    "kv1_tied_qknorm_D10": (dict(maxT=8, V=130, L=2, NH=4, C=24, KV=1, D=10, F=40, tied=1, qk_norm=1,
                                 theta=50.0, eps=1e-6), 3, 8),
    "mha_rope_linear_eps": (dict(maxT=16, V=60, L=1, NH=2, C=16, KV=2, D=8, F=24, theta=20.0, eps=0.05,
                                 rope=1, factor=2.5), 3, 16),
    # D=12, theta 1e4, orig 256: frequencies 0-1 kept, 2 blended, 3-5 divided (llama3_case_has_all_regimes).
    "gqa_qknorm_llama3_bf16": (dict(maxT=16, V=200, L=2, NH=6, C=32, KV=3, D=12, F=40, qk_norm=1,
                                    rope=2, factor=8.0, low=1.0, high=4.0, orig=256), 5, 12),
    "gqa_qkvbias_tied": (dict(maxT=16, V=100, L=2, NH=4, C=32, KV=2, D=8, F=48, tied=1, qkv_bias=1), 3, 12),
}


def case_files(name, seed=0):
    kw, version, T = CASES[name]
    f = plain.make_fields(**kw)
    params = plain.random_params(f, seed, version)
    path = os.path.join(TMP, name + ".bin")
    plain.write_model(path, f, params, version)
    shard = os.path.join(TMP, name + "_tok.bin")
    plain.write_shard(shard, np.random.default_rng(seed + 100).integers(0, f["V"], 4000))
    return f, path, shard, T


def plain_grads(f, params, x, y):
    P = {n: torch.tensor(params[n], dtype=torch.float64, requires_grad=True) for n, _ in plain.tensors(f)}
    logits = plain.forward(f, P, x)
    loss = plain.loss_of(logits, y)
    loss.backward()
    return logits.detach().numpy(), float(loss), {n: P[n].grad.numpy() for n in P}


def make_case_check(name):
    def fn():
        """reference.py's float64 logits, loss and per-tensor gradients (in process) and its -dump files
        (logits0.f32, loss0.txt, grads0.f32 in the file's tensor order) vs the plain model on one batch."""
        f, path, shard, T = case_files(name)
        _, _, params = plain.read_model(path)
        toks = np.fromfile(shard, dtype=np.uint16, offset=1024)
        x, y = plain.batch(toks, 2, T, 1, 0, 0)
        want_logits, want_loss, want_grads = plain_grads(f, params, x, y)

        cfg, rp = ref.load_model(path)
        assert cfg.family == llama.NAME, "read as family %s" % cfg.family
        model = ref.build_model(cfg, rp, torch.float64, "cpu")
        logits, loss = model(torch.tensor(x), torch.tensor(y))
        loss.backward()
        e = rel(logits.detach().numpy(), want_logits)
        assert e < 1e-11, "logits differ from the plain model's, relative %.3g" % e
        assert abs(float(loss) - want_loss) < 1e-11 * abs(want_loss), "loss %.15g vs %.15g" % (float(loss), want_loss)
        assert cfg.names == [n for n, _ in plain.tensors(f)], "tensor order %s" % cfg.names
        for n in cfg.names:
            e = rel(model.p[n].grad.numpy(), want_grads[n])
            assert e < 1e-10, "gradient of %s differs, relative %.3g" % (n, e)

        dump = os.path.join(TMP, name + "_dump")
        run_ref(["-e", path, "-i", shard, "-b", "2", "-t", str(T), "-x", "1", "-dump", dump, "--quiet"])
        got = np.fromfile(os.path.join(dump, "logits0.f32"), dtype=np.float32)
        assert got.size == 2 * T * f["V"], "logits0.f32 holds %d values, want B*T*V = %d" % (got.size, 2 * T * f["V"])
        e = rel(got, want_logits.reshape(-1))
        assert e < 1e-6, "logits0.f32 vs the plain model: relative %.3g" % e
        l0 = float(open(os.path.join(dump, "loss0.txt")).read())
        assert abs(l0 - want_loss) < 1e-8 * abs(want_loss), "loss0.txt %.10g vs %.10g" % (l0, want_loss)
        g = np.fromfile(os.path.join(dump, "grads0.f32"), dtype=np.float32)
        assert g.size == plain.numel(f), "grads0.f32 holds %d values, the model %d" % (g.size, plain.numel(f))
        for n, a in plain.split(g, f).items():
            e = rel(a, want_grads[n])
            assert e < 1e-6, "grads0.f32's %s vs the plain model: relative %.3g" % (n, e)
    fn.__name__ = "llama_vs_plain_" + name
    return fn


for _name in CASES:
    check(make_case_check(_name))


@check
def llama3_case_has_all_regimes():
    """The llama3 case above exercises all three branches of the rule (kept, blended, divided)."""
    f = plain.make_fields(**CASES["gqa_qknorm_llama3_bf16"][0])
    base = [1.0 / f["theta"] ** (2.0 * i / f["D"]) for i in range(f["D"] // 2)]
    got = plain.inv_freq(f)
    kinds = set()
    for b, w in zip(base, got):
        kinds.add("kept" if w == b else "divided" if abs(w - b / f["factor"]) < 1e-15 * b else "blended")
    assert kinds == {"kept", "blended", "divided"}, kinds


@check
def llama_train_vs_plain():
    """Three steps (ga 2, warm-up then cosine, clipping active, weight decay 0.5) on three models: the log's
    loss / lr / grad_norm and the final model vs the plain AdamW. Decay of a norm weight or a q/k/v bias (or
    none of a matrix) moves it by ~lr * 0.5 * value per step, far above the 1e-6 allowed."""
    for name in ("gqa_untied", "kv1_tied_qknorm_D10", "gqa_qkvbias_tied"):
        f, path, shard, T = case_files(name, seed=3)
        _, _, params = plain.read_model(path)
        toks = np.fromfile(shard, dtype=np.uint16, offset=1024)
        P0 = {n: torch.tensor(params[n], dtype=torch.float64, requires_grad=True) for n, _ in plain.tensors(f)}
        xb, yb = plain.batch(toks, 2, T, 2, 0, 0)
        plain.loss_of(plain.forward(f, P0, xb), yb).backward()
        clip = 0.5 * math.sqrt(sum(float((p.grad ** 2).sum()) for p in P0.values()))
        log, final = plain.train(f, params, toks, 2, T, 2, 3, 1e-2, 1, 0.1, 0.5, clip)
        assert any(r["clipped"] for r in log), "clipping never active"
        out = os.path.join(TMP, name + "_train")
        run_ref(["-e", path, "-i", shard, "-b", "2", "-t", str(T), "-ga", "2", "-x", "3", "-l", "1e-2", "-u", "1",
                 "-q", "0.1", "-k", "cosine", "-c", "0.5", "-gc", repr(clip), "-o", out, "--quiet"])
        got = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
        assert len(got) == 3, "%d log lines" % len(got)
        for a, b in zip(got, log):
            for k in ("loss", "lr", "grad_norm"):
                assert abs(a[k] - b[k]) <= 1e-10 * abs(b[k]), \
                    "%s step %d: %.15g vs plain %.15g" % (k, b["step"], a[k], b[k])
        ff, version, fin = plain.read_model(os.path.join(out, "model_final.bin"))
        assert version == 3 and ff == dict(f, magic=plain.MODEL_MAGIC, version=3), "final model header %s" % ff
        for n in fin:
            moved = np.abs(final[n] - params[n]).max()
            d = np.abs(fin[n] - final[n]).max()
            assert d < 1e-6, "%s: final model off by %.3g (moved %.3g in training) (%s)" % (n, d, moved, name)


# Llama 3.1's published rope_scaling: theta 500000, factor 8, low 1, high 4, original 8192, head_dim 128.
# inv[i] = 500000^(-i/64); wavelen = 2 pi / inv; kept below 8192/4 = 2048, divided by 8 above 8192/1,
# blended between with s = (8192/wavelen - 1) / 3. Worked out to 30 digits with bc:
#   i=0  kept     1
#   i=16 kept     500000^-0.25 = 0.037606030930863935681
#   i=28 kept     wavelen 1956.50 (< 2048)       0.0032114459947525910185
#   i=29 blended  wavelen 2401.74, s 0.80362104  0.0021665707635033586093
#   i=32 blended  wavelen 4442.88, s 0.28128261  0.00052484616099295466973
#   i=34 blended  wavelen 6695.11, s 0.07452656  0.00017850781276799641852
#   i=35 divided  wavelen 8218.72 (> 8192)       0.000095562123539646830199
#   i=48 divided  500000^-0.75 / 8              0.0000066478698711812357703
#   i=63 divided                                 0.00000030689259889145110891
LLAMA31 = {0: 1.0, 16: 0.037606030930863935681, 28: 0.0032114459947525910185, 29: 0.0021665707635033586093,
           32: 0.00052484616099295466973, 34: 0.00017850781276799641852, 35: 0.000095562123539646830199,
           48: 0.0000066478698711812357703, 63: 0.00000030689259889145110891}


@check
def llama3_inv_freq_llama31():
    cfg = ref.parse_spec("llama:L1,C1024,H8,F64,theta500000,rope-llama38/1/4/8192")
    assert cfg.D == 128
    for got in (llama.rope_inv_freq(128, 500000.0, llama.ROPE_LLAMA3, 8.0, 1.0, 4.0, 8192), cfg.inv_freq()):
        assert len(got) == 64, len(got)
        for i, want in LLAMA31.items():
            assert abs(got[i] - want) <= 1e-13 * want, "inv_freq[%d] %.17g, by hand %.17g" % (i, got[i], want)


@check
def rope_inv_freq_plain_and_linear():
    """Without scaling, theta^(-2i/D); 'linear' divides every entry by the factor."""
    got = llama.rope_inv_freq(8, 100.0)
    want = [1.0, 0.31622776601683794, 0.1, 0.031622776601683794]
    assert np.allclose(got, want, rtol=1e-15, atol=0), got
    got = llama.rope_inv_freq(8, 100.0, llama.ROPE_LINEAR, 2.5)
    assert np.allclose(got, np.array(want) / 2.5, rtol=1e-15, atol=0), got


@check
def rope_position0_identity():
    """RoPE leaves position 0 exactly as it is and turns later positions (norm kept per pair)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 12, generator=g, dtype=torch.float64)
    inv = llama.rope_inv_freq(12, 10000.0, llama.ROPE_LLAMA3, 8.0, 1.0, 4.0, 256)
    cos, sin = llama.rope_cos_sin(inv, 5, torch.float64, "cpu")
    y = llama.apply_rope(x, cos, sin)
    assert torch.equal(y[..., 0, :], x[..., 0, :]), "position 0 changed"
    assert (y[..., 1:, :] - x[..., 1:, :]).abs().max() > 1e-3, "later positions unchanged"
    pairs = lambda t: t[..., :6] ** 2 + t[..., 6:] ** 2
    assert torch.allclose(pairs(y), pairs(x), rtol=1e-12, atol=1e-14), "a pair's length changed"
    # Explicit rotation of the pair (i, i + D/2) at position 3 by 3 * inv[i].
    for i in range(6):
        c, s = math.cos(3 * inv[i]), math.sin(3 * inv[i])
        a, b = x[..., 3, i], x[..., 3, i + 6]
        assert torch.allclose(y[..., 3, i], a * c - b * s, rtol=0, atol=1e-13)
        assert torch.allclose(y[..., 3, i + 6], b * c + a * s, rtol=0, atol=1e-13)


@check
def rope_position0_model():
    """A model's position-0 logits do not depend on theta or the rope scaling; later positions do."""
    base = "llama:L2,C32,H4,K2,F48,V100,T16,qknorm"
    outs = []
    for extra in ("", ",theta37", ",rope-llama38/1/4/64", ",rope-linear3"):
        cfg = ref.parse_spec(base + extra)
        p = ref.random_params(cfg, 5)
        g = np.random.default_rng(6)
        for n in cfg.names:   # random norms too, so the q/k norms (before RoPE) are not the identity
            if n.endswith("norm"):
                p[n] = (1 + 0.3 * g.standard_normal(p[n].shape)).astype(np.float32)
        idx = torch.tensor(np.random.default_rng(7).integers(0, 100, (2, 10)))
        outs.append(ref.build_model(cfg, p, torch.float64, "cpu")(idx)[0].detach())
    for o in outs[1:]:
        assert torch.allclose(o[:, 0], outs[0][:, 0], rtol=1e-13, atol=1e-15), "position 0 moved"
        assert (o[:, 1:] - outs[0][:, 1:]).abs().max() > 1e-6, "later positions did not move"


def expect_header(path, want, size_values, bytes_per):
    h = np.fromfile(path, dtype=np.int32, count=256)
    full = np.zeros(256, dtype=np.int64)
    full[:len(want)] = want
    bad = [i for i in range(256) if int(h[i]) != int(full[i])]
    assert not bad, "header slots %s: %s, want %s" % (bad, [int(h[i]) for i in bad], [int(full[i]) for i in bad])
    size = os.path.getsize(path)
    assert size == 1024 + bytes_per * size_values, "size %d, want %d" % (size, 1024 + bytes_per * size_values)


F32 = plain.f32_bits


@check
def saved_headers_and_sizes():
    """reference.py --save for llama specs: every header slot (the floats as float32 bits, unused slots 0)
    and the file size, with the tensor sizes added up by hand."""
    # L2 C64 H4 K2 D16 F160 V500 (Vp 512), untied, q/k norms:
    # wte 512*64 + attn_norm 2*64 + wq 2*4*16*64 + wkv 2*2*2*16*64 + q_norm, k_norm 2*16 each + attn_proj 2*64*64
    # + mlp_norm 2*64 + gate_up 2*320*64 + down 2*64*160 + final_norm 64 + lm_head 512*64
    n1 = 32768 + 128 + 16384 + 32 + 32 + 8192 + 128 + 40960 + 20480 + 64 + 32768
    spec = "llama:L2,C64,H4,K2,F160,V500,T64,theta500000,eps1e-6,qknorm,rope-llama38/1/4/8192"
    for version, width in ((3, 4), (5, 2)):
        path = os.path.join(TMP, "saved%d.bin" % version)
        run_ref(["-e", spec, "--seed", "5", "--save", path, "--save-version", str(version), "-x", "0"])
        expect_header(path, [20240326, version, 64, 500, 2, 4, 64, 512, 1, 2, 16, 160, 0, 1, 2,
                             F32(500000.0), F32(1e-6), F32(8.0), F32(1.0), F32(4.0), 8192], n1, width)
    # Defaults (K = H, D = C/H, V 50257, T 1024, theta 1e4, eps 1e-5, rope factor 1 as the trainer writes it
    # without scaling), tied: no lm_head.
    path = os.path.join(TMP, "saved_defaults.bin")
    run_ref(["-e", "llama:L1,C32,H4,F64,tied", "--save", path, "-x", "0"])
    n2 = 50304 * 32 + 32 + (4 + 8) * 8 * 32 + 32 * 32 + 32 + 128 * 32 + 32 * 64 + 32
    expect_header(path, [20240326, 3, 1024, 50257, 1, 4, 32, 50304, 1, 4, 8, 64, 1, 0, 0,
                         F32(10000.0), F32(1e-5), F32(1.0)], n2, 4)
    # q/k/v biases (slot 21): bq (L, NH D) = 2 * 4 * 8 and bkv (L, 2 KV D) = 2 * 2 * 8 after wkv, tied.
    path = os.path.join(TMP, "saved_qkvbias.bin")
    run_ref(["-e", "llama:L2,C32,H4,K1,F64,V128,T32,tied,qkvbias", "--save", path, "-x", "0"])
    n4 = (128 * 32 + 2 * 32 + 2 * (4 + 2) * 8 * 32 + 2 * 4 * 8 + 2 * 2 * 8 + 2 * 32 * 32 + 2 * 32 + 2 * 128 * 32
          + 2 * 32 * 64 + 32)
    expect_header(path, [20240326, 3, 32, 128, 2, 4, 32, 128, 1, 1, 8, 64, 1, 0, 0,
                         F32(10000.0), F32(1e-5), F32(1.0), 0, 0, 0, 1], n4, 4)
    f, _, p = plain.read_model(path)
    assert (p["bq"] == 0).all() and (p["bkv"] == 0).all(), "a random model's q/k/v biases are not 0"
    path = os.path.join(TMP, "saved_linear.bin")
    run_ref(["-e", "llama:L1,C32,H4,K1,D6,F64,V128,T32,rope-linear2.5", "--save", path, "-x", "0"])
    n3 = 128 * 32 + 32 + (4 + 2) * 6 * 32 + 32 * 24 + 32 + 128 * 32 + 32 * 64 + 32 + 128 * 32
    expect_header(path, [20240326, 3, 32, 128, 1, 4, 32, 128, 1, 1, 6, 64, 0, 0, 1,
                         F32(10000.0), F32(1e-5), F32(2.5)], n3, 4)


@check
def saved_tensor_contents():
    """A saved random model, read with the plain reader: norms exactly 1 where the format puts them, the
    padded vocabulary rows of wte and lm_head 0, the matrices N(0, 0.02) (attn_proj and down 0.02/sqrt(2L))."""
    path = os.path.join(TMP, "saved3.bin")
    if not os.path.exists(path):
        run_ref(["-e", "llama:L2,C64,H4,K2,F160,V500,T64,theta500000,eps1e-6,qknorm,rope-llama38/1/4/8192",
                 "--seed", "5", "--save", path, "-x", "0"])
    f, _, p = plain.read_model(path)
    for n in ("attn_norm", "q_norm", "k_norm", "mlp_norm", "final_norm"):
        assert (p[n] == 1).all(), "%s is not all ones" % n
    for n in ("wte", "lm_head"):
        assert (p[n][500:] == 0).all(), "%s's padded rows are not 0" % n
    std = {"wte": 0.02, "wq": 0.02, "wkv": 0.02, "gate_up": 0.02, "lm_head": 0.02, "attn_proj": 0.01, "down": 0.01}
    for n, s in std.items():
        got = p[n][:500].std() if n in ("wte", "lm_head") else p[n].std()
        assert abs(got - s) < 0.05 * s and abs(p[n][:500].mean()) < 0.1 * s, "%s: std %.4g, want %.4g" % (n, got, s)


@check
def gpt2_header_family0():
    """GPT-2 files keep slot 8 (and the Llama slots after it) 0, as llm.c's do."""
    path = os.path.join(TMP, "gpt2.bin")
    run_ref(["-e", "L1C8H2V16T8", "--save", path, "-x", "0"])
    h = np.fromfile(path, dtype=np.int32, count=256)
    assert list(h[:8]) == [20240326, 3, 8, 16, 1, 2, 8, 128] and not h[8:].any(), list(h[:24])


@check
def bad_specs():
    """Each bad llama spec: exit 1 with one 'error:' line that says what is wrong."""
    cases = [("llama:L2,C64,H4", "needs F"), ("llama:L2,C64,H4,K3,F16", "kv heads 3 do not divide query heads 4"),
             ("llama:L2,C64,H4,D7,F16", "head_dim 7 is odd"), ("llama:L2,C64,H4,F16,F8", "'F16' and 'F8' both set F"),
             ("llama:L2,C64,H3,F16", "C must be divisible by H"), ("llama:L2,C64,H4,F16,bias", "unknown field 'bias'"),
             ("llama:L2,C64,H4,F16,rope-llama38/4/1/64", "low_freq_factor < high_freq_factor"),
             ("llama:L2,C64,H4,F16,theta0", "rope_theta 0")]
    for spec, msg in cases:
        rc, err = run_cli(["-e", spec, "-x", "0"])
        lines = err.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], \
            "%s: rc %d, %r" % (spec, rc, err)


@check
def bad_headers():
    """Model files the format rules out: an unknown family, KV not dividing NH, an odd head_dim, a size that
    does not match the header (a qk_norm flag without the norms' tensors)."""
    base = plain.make_fields(maxT=8, V=20, L=1, NH=4, C=8, KV=2, D=4, F=8)
    params = plain.random_params(base, 0)
    cases = [(dict(family=2), "unknown model family 2"), (dict(KV=3), "kv heads 3 do not divide"),
             (dict(D=3), "head_dim 3 is odd"), (dict(qk_norm=1), "size"), (dict(rope=3), "rope scaling kind 3")]
    for change, msg in cases:
        f = dict(base, **change)
        path = os.path.join(TMP, "bad.bin")
        raw = plain.header_ints(f, 3)
        with open(path, "wb") as fh:
            fh.write(np.array(raw, dtype=np.int32).tobytes())
            fh.write(np.concatenate([params[n].reshape(-1) for n, _ in plain.tensors(base)]).tobytes())
        rc, err = run_cli(["-e", path, "-x", "0"])
        lines = err.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], \
            "%s: rc %d, %r" % (change, rc, err)


def main():
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(1)
    for fn in CHECKS:
        if ONLY and fn.__name__ not in ONLY:
            continue
        try:
            fn()
            print("ok " + fn.__name__)
        except Exception as e:   # a check's own bug is a failure too, never a skip
            detail = str(e) if isinstance(e, AssertionError) else traceback.format_exc().strip().splitlines()[-1]
            print("FAIL %s: %s" % (fn.__name__, detail or type(e).__name__))
            FAILED.append(fn.__name__)
        sys.stdout.flush()
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
