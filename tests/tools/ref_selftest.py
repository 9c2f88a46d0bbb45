#!/usr/bin/env python3
"""Checks the PyTorch reference itself (scripts/reference.py), cheaply, before it is used to judge the
trainer: gradients vs finite differences, its layers vs PyTorch's own, file round trips and errors, data
order, LR schedule, AdamW vs torch.optim.AdamW, padding, and the bench mode's CPU smoke run.
Prints "ok NAME" / "FAIL NAME: why"; exit 1 on any FAIL.   Usage: ref_selftest.py TMPDIR
"""
import json
import math
import os
import subprocess
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
import importlib.util  # noqa: E402

# Loaded by path: putting scripts/ on sys.path would let scripts/tokenize.py shadow the stdlib's.
_spec = importlib.util.spec_from_file_location("reference", os.path.join(SCRIPTS, "reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)
gpt2 = ref.families.gpt2
sys.path.insert(0, HERE)
from refusals import assert_refused  # noqa: E402

TMP = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
FAILED = []
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def tiny(seed=0, V=20, L=2, C=8, NH=2, maxT=8, scale=0.3):
    """A small model with every parameter random and O(1), so no term of the gradient is trivially 0."""
    cfg = gpt2.Config(maxT, V, L, NH, C, (V + 127) // 128 * 128)
    g = np.random.default_rng(seed)
    p = {n: (g.standard_normal(s) * scale).astype(np.float32) for n, s in zip(gpt2.NAMES, cfg.shapes())}
    for n in ("ln1w", "ln2w", "lnfw"):
        p[n] += 1.0
    return cfg, p


@check
def ref_gradcheck():
    """Autograd gradients of the mean loss vs central finite differences in float64, per tensor: along a
    random direction over the whole tensor, and at 6 random single entries (full gradcheck takes ~15 s)."""
    cfg, p = tiny()
    model = ref.Model(cfg, p, torch.float64, "cpu")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.V, (2, 5), generator=g)
    tgt = torch.randint(0, cfg.V, (2, 5), generator=g)
    model(idx, tgt)[1].backward()
    h = 1e-5
    bad = []
    for n in gpt2.NAMES:
        w = model.p[n]
        grad = w.grad.clone()
        rows = cfg.V if n == "wte" else w.shape[0]   # padded wte rows have no effect: skip them
        dirs = [torch.zeros_like(w) for _ in range(6)]
        for d in dirs:
            d.view(-1)[int(torch.randint(0, rows * (w.numel() // w.shape[0]), (1,), generator=g))] = 1.0
        full = torch.randn(w.shape, generator=g, dtype=torch.float64)
        full[rows:] = 0
        for d in [full] + dirs:
            with torch.no_grad():
                w.add_(h * d)
                lp = model(idx, tgt)[1].item()
                w.sub_(2 * h * d)
                lm = model(idx, tgt)[1].item()
                w.add_(h * d)
            fd, an = (lp - lm) / (2 * h), float((grad * d).sum())
            if abs(fd - an) > 1e-7 + 1e-6 * abs(an):
                bad.append("%s: analytic %.10g vs finite difference %.10g" % (n, an, fd))
    assert not bad, "; ".join(bad[:4])


@check
def ref_layers_vs_torch():
    """The reference writes LayerNorm, GELU and attention out by hand; PyTorch's own versions must agree."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    w, b = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    e1 = (gpt2.layernorm(x, w, b) - F.layer_norm(x, (16,), w, b, eps=1e-5)).abs().max().item()
    e2 = (gpt2.gelu(x) - F.gelu(x, approximate="tanh")).abs().max().item()
    cfg, p = tiny(C=16, NH=4)
    m = ref.Model(cfg, p, torch.float64, "cpu")
    B, T, C, NH, hs = 2, 6, 16, 4, 4
    qkv = torch.randn(B, T, 3 * C, dtype=torch.float64)
    y = gpt2.reference_attention(m, qkv, B, T)
    naive = torch.zeros(B, T, C, dtype=torch.float64)   # loops straight from the definition
    for bb in range(B):
        for h in range(NH):
            for t in range(T):
                q = qkv[bb, t, h * hs:(h + 1) * hs]
                s = torch.stack([q @ qkv[bb, u, C + h * hs:C + (h + 1) * hs] for u in range(t + 1)]) / math.sqrt(hs)
                a = torch.softmax(s, 0)
                naive[bb, t, h * hs:(h + 1) * hs] = sum(a[u] * qkv[bb, u, 2 * C + h * hs:2 * C + (h + 1) * hs]
                                                        for u in range(t + 1))
    e3 = (y - naive).abs().max().item()
    assert max(e1, e2, e3) < 1e-12, "layernorm %.1e gelu %.1e attention %.1e" % (e1, e2, e3)
    if hasattr(F, "scaled_dot_product_attention"):
        m.sdpa = True
        e4 = (gpt2.reference_attention(m, qkv, B, T) - naive).abs().max().item()
        assert e4 < 1e-12, "sdpa attention %.1e" % e4


@check
def ref_padding_inert():
    """Padded wte rows and logits must not affect the loss; logits are returned over V columns only."""
    cfg, p = tiny()
    idx = torch.randint(0, cfg.V, (2, 5))
    l1, loss1 = ref.Model(cfg, p, torch.float64, "cpu")(idx, idx)
    p2 = dict(p)
    p2["wte"] = p["wte"].copy()
    p2["wte"][cfg.V:] = 100.0
    l2, loss2 = ref.Model(cfg, p2, torch.float64, "cpu")(idx, idx)
    assert l1.shape[-1] == cfg.V and torch.equal(l1, l2) and loss1.item() == loss2.item()


@check
def ref_model_file_roundtrip():
    cfg, p = tiny(V=50, maxT=16)
    a, b = os.path.join(TMP, "rt_a.bin"), os.path.join(TMP, "rt_b.bin")
    ref.save_model(a, cfg, p)
    cfg2, p2 = ref.load_model(a)
    assert vars(cfg2) == vars(cfg), "header %s vs %s" % (cfg2, cfg)
    for n in gpt2.NAMES:
        assert np.array_equal(p2[n], p[n]), "%s changed in the fp32 round trip" % n
    ref.save_model(b, cfg2, p2)
    assert open(a, "rb").read() == open(b, "rb").read(), "fp32 rewrite is not byte-identical"
    # bf16 (version 5): values must be PyTorch's round-to-nearest-even bf16 of the fp32 ones.
    ref.save_model(b, cfg, p, version=5)
    cfg3, p3 = ref.load_model(b)
    assert ref.read_model_header(b)[1] == 5
    for n in gpt2.NAMES:
        want = torch.from_numpy(p[n]).to(torch.bfloat16).float().numpy()
        assert np.array_equal(p3[n], want), "%s: bf16 rounding differs from torch's" % n


def expect_error(name, path, kind, needle):
    """The reference must refuse a bad file with a one-line 'error:' naming it, exit status 1."""
    args = ["-e", path, "-x", "0"] if kind == "model" else ["-e", "L1C8H2V20T8", "-i", path, "-x", "1", "-t", "4", "-b", "1"]
    assert_refused(ref.main, args, needle, name)


@check
def ref_bad_files_rejected():
    cfg, p = tiny()
    good = os.path.join(TMP, "good.bin")
    ref.save_model(good, cfg, p)
    data = open(good, "rb").read()
    cases = {"truncated.bin": data[:-4], "magic.bin": b"\x00" * 4 + data[4:], "short.bin": data[:100]}
    for fname, blob in cases.items():
        path = os.path.join(TMP, fname)
        open(path, "wb").write(blob)
        expect_error(fname, path, "model", fname)
    expect_error("missing model", os.path.join(TMP, "nope.bin"), "model", "nope.bin")
    shard = os.path.join(TMP, "badshard.bin")
    h = np.zeros(256, np.int32)
    h[:3] = [20240520, 1, 100]
    open(shard, "wb").write(h.tobytes() + np.zeros(50, np.uint16).tobytes())
    expect_error("short shard", shard, "shard", "badshard.bin")
    h[0] = 1
    open(shard, "wb").write(h.tobytes() + np.zeros(100, np.uint16).tobytes())
    expect_error("shard magic", shard, "shard", "magic")


def write_shard(path, toks):
    h = np.zeros(256, np.int32)
    h[:3] = [20240520, 1, len(toks)]
    open(path, "wb").write(h.tobytes() + np.asarray(toks, np.uint16).tobytes())


@check
def ref_data_order():
    # Two shards whose sorted concatenation is 0..N-1 (mod V); written in reverse to test the sort.
    V, N = 1000, 203
    toks = np.arange(N) % V
    write_shard(os.path.join(TMP, "do_b.bin"), toks[120:])
    write_shard(os.path.join(TMP, "do_a.bin"), toks[:120])
    all_toks = ref.load_tokens(os.path.join(TMP, "do_*.bin"), V)
    assert np.array_equal(all_toks, toks)
    B, T, ga = 2, 10, 3
    ld = ref.Batches(ref.Stream(os.path.join(TMP, "do_*.bin"), V), B, T, ga)
    assert ld.W == (N - 1) // (B * T) == 10
    for s in range(5):
        for m in range(ga):
            x, y, pos, doc = ld.batch(s, m)
            start = ((s * ga + m) % 10) * B * T
            assert pos is None and doc is None and x.shape == (B, T) and x.flatten().tolist() == list(range(start, start + B * T))
            assert y.flatten().tolist() == list(range(start + 1, start + B * T + 1))
    # Also through the CLI, via make_shard.py: tokens are seeded, in range, and the count is right.
    sh = os.path.join(TMP, "ms.bin")
    for _ in range(2):
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_shard.py"), "-o", sh, "-n", "777",
                        "-V", "300", "--seed", "5"], check=True)
        t = ref.read_shard(sh)
        assert t.size == 777 and t.max() < 300 and t.min() >= 0
    t2 = np.random.default_rng(5).integers(0, 300, size=777)
    assert np.array_equal(t, t2)


@check
def ref_lr_schedule():
    class A:
        l, u, x, q = 1e-3, 4, 14, 0.1
    a = A()
    for k, want in (("cosine", {0: 2.5e-4, 3: 1e-3, 4: 1e-3, 9: 1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4, 13: None}),
                    ("linear", {4: 1e-3, 9: 1e-3 - 0.5 * 9e-4}), ("constant", {2: 7.5e-4, 9: 1e-3, 13: 1e-3})):
        a.k = k
        for s, v in want.items():
            if v is None:
                v = 1e-4 + 0.5 * (1 + math.cos(math.pi * 0.9)) * 9e-4
            got = ref.lr_at(s, a)
            assert abs(got - v) < 1e-15, "%s step %d: %r vs %r" % (k, s, got, v)
    a.u, a.x = 0, 1   # max(1, X - u) guards the division
    assert ref.lr_at(0, a) == 1e-3


@check
def ref_adamw_vs_torch():
    """The hand-written AdamW (decay on matrices only, clip scale on the gradient) vs torch.optim.AdamW."""
    cfg, p = tiny()
    m1 = ref.Model(cfg, p, torch.float64, "cpu")
    m2 = ref.Model(cfg, p, torch.float64, "cpu")
    opt1 = ref.AdamW([(n, m1.p[n]) for n in gpt2.NAMES], 0.1, gpt2.DECAYED)
    groups = [{"params": [m2.p[n] for n in gpt2.NAMES if n in gpt2.DECAYED], "weight_decay": 0.1},
              {"params": [m2.p[n] for n in gpt2.NAMES if n not in gpt2.DECAYED], "weight_decay": 0.0}]
    opt2 = torch.optim.AdamW(groups, lr=1.0, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    for step, (lr, scale) in enumerate([(1e-3, 1.0), (2e-3, 0.5), (5e-4, 0.25), (1e-3, 1.0)]):
        for n in gpt2.NAMES:
            gr = torch.randn(m1.p[n].shape, generator=g, dtype=torch.float64)
            m1.p[n].grad = gr.clone()
            m2.p[n].grad = gr * scale
        opt1.step(lr, scale)
        for grp in opt2.param_groups:
            grp["lr"] = lr
        opt2.step()
    for n in gpt2.NAMES:
        e = (m1.p[n] - m2.p[n]).abs().max().item()
        assert e < 1e-14, "%s differs by %.2e" % (n, e)


@check
def ref_accumulation_equals_big_batch():
    """ga micro-steps of B rows must give the mean-loss gradient of one batch of ga*B rows."""
    cfg, p = tiny()
    toks = torch.randint(0, cfg.V, (4, 6))
    m1 = ref.Model(cfg, p, torch.float64, "cpu")
    m1(toks[:, :-1], toks[:, 1:])[1].backward()
    m2 = ref.Model(cfg, p, torch.float64, "cpu")
    for half in (toks[:2], toks[2:]):
        (m2(half[:, :-1], half[:, 1:])[1] / 2).backward()
    for n in gpt2.NAMES:
        e = (m1.p[n].grad - m2.p[n].grad).abs().max().item()
        assert e < 1e-13, "%s grad differs by %.2e" % (n, e)


@check
def ref_cli_train_and_bench_smoke():
    """A 3-step float64 run writes a complete log, dumps and final model; the bench mode runs on CPU."""
    S = os.path.join(SCRIPTS, "reference.py")
    shard = os.path.join(TMP, "smoke.bin")
    subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_shard.py"), "-o", shard, "-n", "600", "-V", "50"], check=True)
    out, dump = os.path.join(TMP, "smoke_out"), os.path.join(TMP, "smoke_dump")
    subprocess.run([sys.executable, S, "-e", "L1C16H2V50T16", "-i", shard, "-b", "2", "-t", "8", "-ga", "2",
                    "-x", "3", "-l", "1e-2", "-u", "1", "-gc", "0.1", "-c", "0.1", "-o", out, "-dump", dump,
                    "--quiet"], check=True)
    recs = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    assert [r["step"] for r in recs] == [0, 1, 2] and all(r["grad_norm"] > 0.1 for r in recs)
    cfg, _ = ref.load_model(os.path.join(out, "model_final.bin"))
    assert os.path.getsize(os.path.join(dump, "grads0.f32")) == 4 * cfg.numel()
    assert os.path.getsize(os.path.join(dump, "logits0.f32")) == 4 * 2 * 8 * 50
    assert abs(float(open(os.path.join(dump, "loss0.txt")).read()) - recs[0]["loss"]) < 1e-6
    bench_out = os.path.join(TMP, "bench.jsonl")
    if os.path.exists(bench_out):
        os.remove(bench_out)
    for dt in ("float32", "bfloat16"):
        r = subprocess.run([sys.executable, S, "-e", "L1C16H2V50T16", "--bench", "--device", "cpu", "--dtype", dt,
                            "-b", "2", "-t", "8", "-x", "3", "--bench-warmup", "1", "--bench-out", bench_out,
                            "--quiet"], capture_output=True, text=True)
        assert r.returncode == 0, "bench %s: %s" % (dt, r.stderr.strip()[-300:])
    lines = [json.loads(l) for l in open(bench_out)]
    assert len(lines) == 2 and all(l["tok_s"] > 0 and l["steps_timed"] == 2 for l in lines)


def main():
    os.makedirs(TMP, exist_ok=True)
    torch.manual_seed(0)
    for fn in CHECKS:
        try:
            fn()
            print("ok " + fn.__name__)
        except Exception as e:  # one failing check must not hide the others
            msg = str(e) or traceback.format_exc().strip().splitlines()[-1]
            print("FAIL %s: %s" % (fn.__name__, msg.replace("\n", " ")[:400]))
            FAILED.append(fn.__name__)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
