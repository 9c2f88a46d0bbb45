#!/usr/bin/env python3
"""The trainer's LoRA numbers against scripts/reference.py's, for tests/system/t_lora_reference.sh (numpy only).
One command per stdin line, its arguments tab-separated; each check prints "ok NAME" or "FAIL NAME: why" (a
crash too), and the exit status is 1 after any FAIL.   Usage: printf 'CMD\\tARGS...\\n...' | lora_ref_check.py

  adapter MODEL OUT R ALPHA RSLORA TARGETS SEED
      writes an adapter file for MODEL: A uniform in +-1/sqrt(in) (PEFT's init), B uniform in +-0.1 (not zero,
      so that A's gradient is not zero either and the adapters change the logits; small enough that the
      adapters do not swamp the base, where fp32 and float64 trajectories part faster)
  grads NAME MODEL ADAPTER TRAINER_GRADS REF_GRADS TOL
      TRAINER_GRADS (-dump's grads0.f32: the base's tensors, then the adapters') against REF_GRADS (the
      reference's: the adapters' only), both the adapters of ADAPTER's targets, each kind stacked over the
      layers (lora_A.<t>, then lora_B.<t>, target by target): the frozen base's gradient is exactly zero, and
      each adapter tensor's is nonzero and within TOL (||a - b|| / ||b||)
  adapters NAME MODEL TRAINED REF START TOL
      two adapter files (the trainer's checkpoint's adapters.bin, the reference's lora_final.bin): the same
      header, each tensor within TOL (||a - b|| / ||b||, and every element within TOL), and training moved each
      one from START by more than 10 TOL somewhere
  val NAME LOG REF_LOG TOL
      every validation loss of REF_LOG (log.jsonl) at the same step of LOG, within TOL (relative)
  learns NAME LOG DROP
      LOG's last validation loss is below its first by more than DROP
"""
import json
import os
import sys
import traceback

import numpy as np

# Last on the path: scripts/tokenize.py must not shadow the standard library's tokenize.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import families  # noqa: E402
import lora_file  # noqa: E402


class Failed(Exception):
    pass


def rel_err(a, b):
    nb = np.linalg.norm(b)
    return np.linalg.norm(a - b) / nb if nb else float("inf")


def make_adapter(model, out, R, alpha, rslora, names, seed):
    cfg, _ = families.read_model_header(model)
    bits = lora_file.target_bits(cfg, names.split(","))
    a = lora_file.zero_adapter(cfg, int(R), lora_file.alpha_x1000("alpha", float(alpha)), int(rslora), bits,
                               np.random.default_rng(int(seed)))
    rng = np.random.default_rng(int(seed) + 1)
    for t in a.targets:
        B = a.weights[t.name][1]
        B[:] = rng.uniform(-0.1, 0.1, B.shape)
    lora_file.write(out, a)


def f32(path):
    if not os.path.isfile(path):
        raise Failed("%s is missing" % path)
    return np.fromfile(path, np.float32).astype(np.float64)


def grads(model, adapter, trainer_path, ref_path, tol):
    cfg, _ = families.read_model_header(model)
    a = lora_file.read(adapter, cfg)
    sizes = [("lora_%s.%s" % (w, t.name), arr.size) for t in a.targets for w, arr in zip("AB", a.weights[t.name])]
    total, base = sum(n for _, n in sizes), cfg.numel()
    got, want = f32(trainer_path), f32(ref_path)
    if got.size != base + total or want.size != total:
        raise Failed("%d and %d floats; the base has %d and the adapters %d" % (got.size, want.size, base, total))
    bad = []
    frozen = np.count_nonzero(got[:base])
    if frozen:
        bad.append("the frozen base has %d nonzero gradients" % frozen)
    got, at = got[base:], 0
    for kind, n in sizes:
        x, y = got[at:at + n], want[at:at + n]
        at += n
        e = rel_err(x, y)
        print("#   grad %-12s rel err %.3e  |ref| %.3e" % (kind, e, np.linalg.norm(y)))
        if not (np.all(np.isfinite(x)) and np.any(y) and e < tol):
            bad.append("%s rel err %.3e (tol %.0e, |ref| %.3e)" % (kind, e, tol, np.linalg.norm(y)))
    return bad


def adapters(model, trained, ref, start, tol):
    cfg, _ = families.read_model_header(model)
    got, want, first = (lora_file.read(p, cfg) for p in (trained, ref, start))
    if not np.array_equal(got.header(), want.header()):
        raise Failed("headers differ: %s vs ref %s" % (got.header()[:8], want.header()[:8]))
    bad = []
    for t in got.targets:
        for i, w in enumerate("AB"):
            x, y, s = (a.weights[t.name][i].astype(np.float64) for a in (got, want, first))
            e, m, moved = rel_err(x, y), np.abs(x - y).max(), np.abs(y - s).max()
            print("#   lora_%s.%-7s rel err %.3e  max abs diff %.3e  moved %.3e" % (w, t.name, e, m, moved))
            if not (e < tol and m < tol and moved > 10 * tol):
                bad.append("lora_%s.%s rel err %.3e, max abs diff %.3e, moved %.3e (tol %.0e)" % (w, t.name, e, m, moved, tol))
    return bad


def val_losses(path):
    if not os.path.isfile(path):
        raise Failed("%s is missing" % path)
    with open(path) as f:
        return {r["step"]: r["val_loss"] for r in map(json.loads, f) if "val_loss" in r}


def val(log, ref_log, tol):
    got, want = val_losses(log), val_losses(ref_log)
    if not want:
        raise Failed("%s has no validation losses" % ref_log)
    return ["step %d: %s vs ref %.9g" % (s, got.get(s), v) for s, v in sorted(want.items())
            if s not in got or not abs(got[s] - v) <= tol * abs(v)]


def learns(log, drop):
    v = [x for _, x in sorted(val_losses(log).items())]
    return [] if len(v) >= 2 and v[-1] < v[0] - drop else ["validation losses %s" % v]


CHECKS = {"grads": (grads, 5), "adapters": (adapters, 5), "val": (val, 3), "learns": (learns, 2)}


def run(fields):
    """One stdin line; True when it passed."""
    cmd, args = fields[0], fields[1:]
    if cmd == "adapter" and len(args) == 7:
        make_adapter(*args)
        return True
    if cmd not in CHECKS or len(args) != CHECKS[cmd][1] + 1:
        raise Failed("unknown command or wrong argument count: %s" % " ".join(fields))
    fn, _ = CHECKS[cmd]
    name = args[0]
    try:
        bad = fn(*args[1:-1], float(args[-1]))
    except Failed as e:
        bad = [str(e)]
    print("FAIL %s: %s" % (name, "; ".join(bad)) if bad else "ok %s" % name)
    return not bad


def main():
    failed = False
    for line in sys.stdin:
        fields = line.rstrip("\n").split("\t")
        try:
            failed |= not run(fields)
        except (Exception, SystemExit):   # lora_file's errors exit with a message: still this line's FAIL
            name = fields[1] if fields[0] in CHECKS and len(fields) > 1 else fields[0]
            print("FAIL %s: %s" % (name, traceback.format_exc().strip().splitlines()[-1]))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
