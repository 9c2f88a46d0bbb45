#!/usr/bin/env python3
"""LoRA in the scripts, on tiny GPT-2 and Llama models (GQA, untied head). Prints "ok NAME" / "FAIL NAME: why";
exit 1 on any FAIL.   Usage: lora_check.py TMPDIR

  peft_roundtrip_<family>   export_hf.py --adapter writes PEFT's names, shapes and config keys (spelled out here
                            from PEFT's conventions, not from scripts/), holding the adapter file's values (read
                            here with code of its own); import_hf.py --adapter gives the adapter file back bit for bit
  peft_refusals             another base (width, layers), another rank, target_modules naming nothing or one the
                            tensors lack, DoRA, a string target_modules, a missing tensor: one `error:` line, no OUT
  ref_zero_b_is_base        B = 0: the adapted model's logits are the base model's, bit for bit
  ref_lora_gradcheck_<f>    A's and B's gradients against central finite differences (float64); the base gets none
  ref_merge_logits_<f>      the base with scale B A folded in (lora_file.merged) gives the adapted model's logits
                            within 1e-10 (float64; scale alpha/R and rsLoRA's alpha/sqrt(R))
  export_merge_<family>     export_hf.py --merge: the folder holds the merged weights rounded once to fp32, and
                            its logits are the adapted model's within fp32 rounding
  ref_lora_trains_adapters  reference.py -lora -lora-init trains A and B only; the base stays bit for bit
"""
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
SCRIPTS = os.path.join(ROOT, "scripts")
PY = os.environ.get("PYTHON", "/usr/bin/python3")
import importlib.util  # noqa: E402

# Loaded by path: putting scripts/ first on sys.path would let scripts/tokenize.py shadow the stdlib's.
_spec = importlib.util.spec_from_file_location("reference", os.path.join(SCRIPTS, "reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)
lora_file = ref.lora_file
sys.path.insert(0, HERE)
from safetensors_plain import read_st, write_st  # noqa: E402


def st_arrays(path):
    """{name: float32 array} of an F32 safetensors file."""
    header, _, data = read_st(path)
    out = {}
    for name, e in header.items():
        if name != "__metadata__":
            assert e["dtype"] == "F32", "%s is %s" % (name, e["dtype"])
            b, end = e["data_offsets"]
            out[name] = np.frombuffer(data[b:end], "<f4").reshape(e["shape"])
    return out

TMP = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
FAILED = []
R = 4

# PEFT's module paths of each family's targets, with (in, out) features from the model's sizes.
PEFT_MODULES = {
    "gpt2": lambda c: [("transformer.h.%d.attn.c_attn", c.C, 3 * c.C), ("transformer.h.%d.attn.c_proj", c.C, c.C),
                       ("transformer.h.%d.mlp.c_fc", c.C, 4 * c.C), ("transformer.h.%d.mlp.c_proj", 4 * c.C, c.C)],
    "llama": lambda c: [("model.layers.%d.self_attn.q_proj", c.C, c.NH * c.D),
                        ("model.layers.%d.self_attn.k_proj", c.C, c.KV * c.D),
                        ("model.layers.%d.self_attn.v_proj", c.C, c.KV * c.D),
                        ("model.layers.%d.self_attn.o_proj", c.NH * c.D, c.C),
                        ("model.layers.%d.mlp.gate_proj", c.C, c.F), ("model.layers.%d.mlp.up_proj", c.C, c.F),
                        ("model.layers.%d.mlp.down_proj", c.F, c.C)],
}
PEFT_TARGETS = {"gpt2": ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"],
                "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
SPECS = {"gpt2": "L2C32H4V100T16", "llama": "llama:L2,C32,H4,K2,F48,V100,T16"}


def check(name, fn):
    try:
        fn()
        print("ok " + name)
    except Exception as e:   # a failed assertion or a crash: either is this check's FAIL
        why = str(e) or type(e).__name__
        print("FAIL %s: %s" % (name, why.splitlines()[0][:300]))
        traceback.print_exc(file=sys.stderr)
        FAILED.append(name)


def run(*args):
    return subprocess.run([PY] + list(args), capture_output=True, text=True)


def model(family, seed=0, scale=None):
    """A tiny model; scale: every tensor random and O(1) (norm weights around 1), so no gradient term is
    trivially 0; else the family's own init."""
    cfg = ref.parse_spec(SPECS[family])
    p = ref.random_params(cfg, seed)
    if scale:
        g = np.random.default_rng(seed)
        p = {n: (g.standard_normal(a.shape) * scale).astype(np.float32) + (1 if a.ndim <= 2 and "norm" in n or
                                                                          n.startswith("ln") and n.endswith("w")
                                                                          else 0) for n, a in p.items()}
    return cfg, p


def adapter(cfg, seed=1, alpha_x1000=8000, rslora=False, bits=None, b_scale=0.5):
    """Every target (or bits'), A and B random and nonzero."""
    bits = bits or (1 << len(lora_file.targets(cfg))) - 1
    a = lora_file.zero_adapter(cfg, R, alpha_x1000, rslora, bits, np.random.default_rng(seed))
    g = np.random.default_rng(seed + 100)
    for t in a.targets:
        A, B = a.weights[t.name]
        B[:] = (g.standard_normal(B.shape) * b_scale).astype(np.float32)
    return a


def save_pair(family, tag):
    cfg, p = model(family)
    base, ad = os.path.join(TMP, tag + ".bin"), os.path.join(TMP, tag + "_adapter.bin")
    ref.save_model(base, cfg, p, 3)
    a = adapter(cfg, alpha_x1000=12500 if family == "llama" else 8000, rslora=family == "llama")
    lora_file.write(ad, a)
    return cfg, p, a, base, ad


def read_adapter_plain(path, cfg, family):
    """The adapter file by docs/formats.md, with this file's own code: {(module path, 'A'|'B'): array}."""
    data = open(path, "rb").read()
    h = np.frombuffer(data[:1024], "<i4")
    rank, count, L, bits = (int(x) for x in h[2:6])
    modules = [m for i, m in enumerate(PEFT_MODULES[family](cfg)) if bits >> i & 1]
    assert count == len(modules) and L == cfg.L, "header %s" % h[:8]
    flat, pos, out = np.frombuffer(data, "<f4", offset=1024), 0, {}
    for l in range(L):
        for path_, IC, OC in modules:
            for which, shape in (("A", (rank, IC)), ("B", (OC, rank))):
                n = shape[0] * shape[1]
                out[(path_ % l, which)] = flat[pos:pos + n].reshape(shape)
                pos += n
    assert pos == flat.size, "%d floats, the layout takes %d" % (flat.size, pos)
    return out


def peft_roundtrip(family):
    def body():
        cfg, _, a, base, ad = save_pair(family, "rt_" + family)
        out, back = os.path.join(TMP, "peft_" + family), os.path.join(TMP, "back_%s.bin" % family)
        r = run(os.path.join(SCRIPTS, "export_hf.py"), base, out, "--adapter", ad, "--base-name", "tiny")
        assert r.returncode == 0, r.stderr
        conf = json.load(open(os.path.join(out, "adapter_config.json")))
        want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": 8 if family == "gpt2" else 12.5,
                "use_rslora": a.rslora, "lora_dropout": 0.0, "target_modules": PEFT_TARGETS[family], "bias": "none",
                "fan_in_fan_out": family == "gpt2", "base_model_name_or_path": "tiny"}
        bad = {k: (conf.get(k), v) for k, v in want.items() if conf.get(k) != v or type(conf.get(k)) != type(v)}
        assert not bad, "adapter_config.json (got, want): %s" % bad
        st = st_arrays(os.path.join(out, "adapter_model.safetensors"))
        values = read_adapter_plain(ad, cfg, family)
        names = set()
        for (module, which), v in values.items():
            name = "base_model.model.%s.lora_%s.weight" % (module, which)
            names.add(name)
            assert name in st, "%s missing" % name
            assert st[name].shape == v.shape, "%s: %s, want %s" % (name, st[name].shape, v.shape)
            assert np.array_equal(st[name].view(np.uint32), v.view(np.uint32)), "%s values" % name
        assert set(st) == names, "extra tensors %s" % sorted(set(st) - names)[:3]
        r = run(os.path.join(SCRIPTS, "import_hf.py"), "--adapter", out, back, "--base", base)
        assert r.returncode == 0, r.stderr
        assert open(back, "rb").read() == open(ad, "rb").read(), "import gave another adapter file"
    return body


def refused(args, out, needle):
    r = run(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], \
        "%s: rc %d, stderr %r" % (" ".join(args[1:]), r.returncode, r.stderr[-300:])
    assert not os.path.exists(out), "%s written" % out


def peft_refusals():
    cfg, p, a, base, ad = save_pair("gpt2", "bad")
    folder = os.path.join(TMP, "peft_bad")
    r = run(os.path.join(SCRIPTS, "export_hf.py"), base, folder, "--adapter", ad)
    assert r.returncode == 0, r.stderr
    imp, out = os.path.join(SCRIPTS, "import_hf.py"), os.path.join(TMP, "never.bin")
    for spec, what in (("L2C64H4V100T16", "has shape [4, 32]"), ("L3C32H4V100T16", "tensor base_model.model."
                                                                  "transformer.h.2.attn.c_attn.lora_A.weight is missing"),
                       ("L1C32H4V100T16", "not a LoRA weight")):
        other = os.path.join(TMP, "other.bin")
        ocfg = ref.parse_spec(spec)
        ref.save_model(other, ocfg, ref.random_params(ocfg, 0), 3)
        refused([imp, "--adapter", folder, out, "--base", other], out, what)
    conf = json.load(open(os.path.join(folder, "adapter_config.json")))
    llama = os.path.join(TMP, "llama_base.bin")
    lcfg = ref.parse_spec(SPECS["llama"])
    ref.save_model(llama, lcfg, ref.random_params(lcfg, 0), 3)
    refused([imp, "--adapter", folder, out, "--base", llama], out, "name no linear layer")
    edits = [({"r": 8}, "r 8"), ({"target_modules": ["c_attn", "attn.c_proj", "c_fc"]}, "not a LoRA weight"),
             ({"target_modules": ["q_proj", "v_proj"]}, "name no linear layer"),
             ({"target_modules": ".*c_attn"}, "target_modules"), ({"use_dora": True}, "use_dora"),
             ({"lora_alpha": 1e-4}, "multiple of 0.001"), ({"peft_type": "IA3"}, "peft_type")]
    for change, what in edits:
        edited = os.path.join(TMP, "peft_edit")
        os.makedirs(edited, exist_ok=True)
        json.dump(dict(conf, **change), open(os.path.join(edited, "adapter_config.json"), "w"))
        os.system("cp %s/adapter_model.safetensors %s/" % (folder, edited))
        refused([imp, "--adapter", edited, out, "--base", base], out, what)
    st = st_arrays(os.path.join(folder, "adapter_model.safetensors"))
    gone = "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"
    write_st(os.path.join(edited, "adapter_model.safetensors"), [(k, "F32", v) for k, v in st.items() if k != gone])
    json.dump(conf, open(os.path.join(edited, "adapter_config.json"), "w"))
    refused([imp, "--adapter", edited, out, "--base", base], out, gone + " is missing")


def logits_of(cfg, p, a=None, dtype=torch.float64, seed=0):
    m = ref.Model(cfg, p, dtype, "cpu", adapter=a)
    idx = torch.randint(0, cfg.V, (2, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return m(idx)[0]


def ref_zero_b_is_base():
    for family in ("gpt2", "llama"):
        cfg, p = model(family)
        a = adapter(cfg, b_scale=0.0)
        assert any(np.any(a.weights[t.name][0]) for t in a.targets), "A is zero"
        assert torch.equal(logits_of(cfg, p, a), logits_of(cfg, p)), "%s: logits differ" % family


def ref_lora_gradcheck(family):
    def body():
        cfg, p = model(family, scale=0.3)
        a = adapter(cfg, alpha_x1000=6000, rslora=family == "llama")
        m = ref.Model(cfg, p, torch.float64, "cpu", adapter=a)
        g = torch.Generator().manual_seed(0)
        idx, tgt = torch.randint(0, cfg.V, (2, 5), generator=g), torch.randint(0, cfg.V, (2, 5), generator=g)
        m(idx, tgt)[1].backward()
        assert all(q.grad is None for q in m.p.values()), "the frozen base got a gradient"
        h = 1e-5
        for name, q in m.trainable():
            d = torch.randn(q.shape, generator=g, dtype=torch.float64)
            d /= d.norm()   # a step of h in norm: the differences' error is then h^2 times a third derivative
            with torch.no_grad():
                q += h * d
                up = float(m(idx, tgt)[1])
                q -= 2 * h * d
                down = float(m(idx, tgt)[1])
                q += h * d
            fd, an = (up - down) / (2 * h), float((q.grad * d).sum())
            assert abs(fd - an) <= 1e-7 * max(1.0, abs(fd)), "%s: autograd %.10g, differences %.10g" % (name, an, fd)
            assert abs(an) > 1e-5, "%s: gradient along a random direction is %g" % (name, an)
    return body


def ref_merge_logits(family):
    def body():
        cfg, p = model(family, scale=0.3)
        for rslora in (False, True):
            a = adapter(cfg, alpha_x1000=7250, rslora=rslora)
            want = logits_of(cfg, p, a)
            got = logits_of(cfg, lora_file.merged(cfg, p, a))
            err = float((want - got).abs().max())
            moved = float((want - logits_of(cfg, p)).abs().max())
            assert err < 1e-10 and moved > 1e-2, "rslora %s: max difference %g (the adapter moves logits by %g)" \
                % (rslora, err, moved)
    return body


def export_merge(family):
    def body():
        cfg, p, a, base, ad = save_pair(family, "mg_" + family)
        folder, back = os.path.join(TMP, "merged_" + family), os.path.join(TMP, "merged_%s.bin" % family)
        r = run(os.path.join(SCRIPTS, "export_hf.py"), base, folder, "--adapter", ad, "--merge")
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(os.path.join(folder, "adapter_config.json")), "a merged folder has no adapter"
        r = run(os.path.join(SCRIPTS, "import_hf.py"), folder, back, "--fp32")
        assert r.returncode == 0, r.stderr
        mcfg, mp = ref.load_model(back)
        want = {n: v.astype(np.float32) for n, v in lora_file.merged(cfg, p, a).items()}
        for n in cfg.names:
            assert np.array_equal(mp[n].view(np.uint32), want[n].view(np.uint32)), "%s differs" % n
        err = float((logits_of(cfg, p, a) - logits_of(mcfg, mp)).abs().max())
        assert err < 1e-5, "merged logits differ by %g" % err
    return body


def ref_lora_trains_adapters():
    cfg, p, a, base, ad = save_pair("gpt2", "tr")
    shard, out = os.path.join(TMP, "tr_shard.bin"), os.path.join(TMP, "tr_out")
    r = run(os.path.join(SCRIPTS, "make_shard.py"), "-o", shard, "-n", "2000", "-V", "100", "--seed", "3")
    assert r.returncode == 0, r.stderr
    flags = ["-e", base, "-i", shard, "-b", "2", "-t", "8", "-x", "3", "-l", "1e-2", "-c", "0.1", "--quiet"]
    r = run(os.path.join(SCRIPTS, "reference.py"), *flags, "-lora", "4", "-lora-alpha", "8", "-lora-init", ad,
            "-o", out, "--save", os.path.join(TMP, "tr_saved.bin"))
    assert r.returncode == 0, r.stderr
    trained = lora_file.read(os.path.join(out, "lora_final.bin"), cfg)
    assert not os.path.exists(os.path.join(out, "model_final.bin")), "the frozen base was written"
    for t in a.targets:
        for before, after in zip(a.weights[t.name], trained.weights[t.name]):
            assert not np.array_equal(before, after), "%s did not train" % t.name
    bad = run(os.path.join(SCRIPTS, "reference.py"), *flags, "-lora", "8", "-lora-init", ad)
    assert bad.returncode == 1 and "rank" in bad.stderr, bad.stderr[-200:]


def main():
    if os.path.isdir(TMP) and os.listdir(TMP):
        sys.exit("lora_check.py: %s is not empty" % TMP)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(1)
    for family in ("gpt2", "llama"):
        check("peft_roundtrip_" + family, peft_roundtrip(family))
    check("peft_refusals", peft_refusals)
    check("ref_zero_b_is_base", ref_zero_b_is_base)
    for family in ("gpt2", "llama"):
        check("ref_lora_gradcheck_" + family, ref_lora_gradcheck(family))
        check("ref_merge_logits_" + family, ref_merge_logits(family))
        check("export_merge_" + family, export_merge(family))
    check("ref_lora_trains_adapters", ref_lora_trains_adapters)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
