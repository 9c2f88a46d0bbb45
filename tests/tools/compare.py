#!/usr/bin/env python3
"""Numeric comparisons for tests: prints "ok NAME" or "FAIL NAME: why" per check; exit 1 on any FAIL.

  compare.py array  NAME A.f32 REF.f32 --tol 1e-5            relative error ||a-b||/||b|| of raw float32
  compare.py grads  NAME A.f32 REF.f32 MODEL.bin --tol 1e-4  per tensor, split by MODEL.bin's header
  compare.py log    NAME A.jsonl REF.jsonl --steps 10 --tol 1e-4 [--key loss] [--clip GC]
  compare.py models NAME A.bin REF.bin --tol 1e-4 [--abs 1e-5]   per tensor, see models() for the measure
  compare.py scalar NAME A.txt REF.txt --tol 1e-5
  compare.py serve      one comparison per stdin line (its arguments, tab-separated), each answer followed
                        by a line "# compare.py done"; tests/system/lib.sh keeps one such process per test script

The second file is the reference (the denominator). Errors are reported with the worst element.
"""
import argparse
import json
import os
import sys

import numpy as np

import importlib.util  # noqa: E402


def _load_reference():
    # Loaded by path: putting scripts/ on sys.path would let scripts/tokenize.py shadow the stdlib's.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "reference.py")
    spec = importlib.util.spec_from_file_location("reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Reference:
    """scripts/reference.py, loaded on first use: it imports torch (over a second on a small machine), which
    only the model and gradient comparisons need (file formats, tensor names and shapes live there, once)."""
    mod = None

    def __getattr__(self, name):
        if _Reference.mod is None:
            _Reference.mod = _load_reference()
        return getattr(_Reference.mod, name)


ref = _Reference()

FAILED = []


class BadInput(Exception):
    """A file to compare is missing or malformed: reported as a FAIL of the check that needed it."""


def ok(name):
    print("ok " + name)


def fail(name, why):
    print("FAIL %s: %s" % (name, why))
    FAILED.append(name)


def read_f32(path, count=None):
    if not os.path.isfile(path):
        raise BadInput("%s is missing" % path)
    size = os.path.getsize(path)
    if size % 4:
        raise BadInput("%s has %d bytes, not a whole number of float32" % (path, size))
    if count is not None and size != 4 * count:
        raise BadInput("%s has %d floats, expected %d" % (path, size // 4, count))
    return np.fromfile(path, dtype=np.float32).astype(np.float64)


def rel_err(a, b):
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    if nb == 0:
        return 0.0 if d == 0 else float("inf")
    return d / nb


def worst(a, b):
    i = int(np.argmax(np.abs(a - b)))
    return "worst at flat index %d: %.9g vs ref %.9g" % (i, a.flat[i], b.flat[i])


def finite(name, a):
    if not np.all(np.isfinite(a)):
        fail(name, "%d non-finite values" % int(np.sum(~np.isfinite(a))))
        return False
    return True


def cmd_array(a):
    x, y = read_f32(a.a), read_f32(a.ref)
    if x.size != y.size:
        return fail(a.name, "%d floats vs ref %d" % (x.size, y.size))
    if not finite(a.name, x):
        return
    e = rel_err(x, y)
    if e < a.tol:
        ok(a.name)
        print("#   %s rel err %.3e (tol %.0e)" % (a.name, e, a.tol))
    else:
        fail(a.name, "rel err %.3e >= %.0e; %s" % (e, a.tol, worst(x, y)))


def cmd_grads(a):
    cfg, _ = ref.read_model_header(a.model)
    x, y = read_f32(a.a, cfg.numel()), read_f32(a.ref, cfg.numel())
    gx, gy = ref.split_payload(x, cfg), ref.split_payload(y, cfg)
    bad = []
    for n in cfg.names:
        if not np.all(np.isfinite(gx[n])):
            bad.append("%s non-finite" % n)
            continue
        e = rel_err(gx[n], gy[n])
        print("#   grad %-9s rel err %.3e  |ref| %.3e" % (n, e, np.linalg.norm(gy[n])))
        if not e < a.tol:
            bad.append("%s rel err %.3e (%s)" % (n, e, worst(gx[n], gy[n])))
    if bad:
        fail(a.name, "tol %.0e: " % a.tol + "; ".join(bad))
    else:
        ok(a.name)


def read_log(path):
    if not os.path.isfile(path):
        raise BadInput("%s is missing" % path)
    recs = {}
    with open(path) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                raise BadInput("%s line %d is not JSON: %.80s" % (path, i + 1, line))
            # Other records (memory, val_loss, comm bytes) share the file; training steps carry "loss".
            if "loss" in r and "step" in r:
                recs[int(r["step"])] = r
    return recs


def cmd_log(a):
    x, y = read_log(a.a), read_log(a.ref)
    steps = list(range(a.steps))
    missing = [s for s in steps if s not in x or s not in y]
    if missing:
        return fail(a.name, "steps %s missing (have %d vs ref %d training records)" % (missing[:5], len(x), len(y)))
    bad = []
    for key in a.key:
        errs = []
        for s in steps:
            vx, vy = float(x[s][key]), float(y[s][key])
            e = abs(vx - vy) / max(abs(vy), 1e-30)
            errs.append(e)
            if not (np.isfinite(vx) and e < a.tol):
                bad.append("%s step %d: %.9g vs ref %.9g (rel %.2e)" % (key, s, vx, vy, e))
        print("#   %s max rel diff over %d steps %.3e" % (key, len(steps), max(errs)))
    if a.clip is not None:
        clipped = [s for s in steps if float(x[s]["grad_norm"]) > a.clip]
        print("#   clipping (grad_norm > %g) active at steps %s" % (a.clip, clipped))
        if not clipped:
            bad.append("grad_norm never exceeded -gc %g, so clipping was not exercised" % a.clip)
    if bad:
        fail(a.name, "tol %.0e: " % a.tol + "; ".join(bad[:6]))
    else:
        ok(a.name)


def cmd_models(a):
    """Per tensor: ||a-b||/||b|| < tol and max|a-b| < abs. Elementwise relative error is meaningless for
    parameters that start at 0 (biases) or sit near 0, so the elementwise bound is absolute.

    The key bias (the middle third of each layer's qkvb) is carved out: adding a constant to every key
    shifts each query's scores by the same amount, which softmax ignores, so its true gradient is exactly
    0 and any implementation's value is rounding noise. Adam divides by sqrt(v)+eps and turns that noise
    into updates of up to ~lr per step, different in every implementation. It is checked only to be
    finite and within --kbias-bound (the sum of the LRs: Adam moves a parameter at most ~lr per step)."""
    cx, px = ref.load_model(a.a)
    cy, py = ref.load_model(a.ref)
    hx = (cx.maxT, cx.V, cx.L, cx.NH, cx.C, cx.Vp)
    hy = (cy.maxT, cy.V, cy.L, cy.NH, cy.C, cy.Vp)
    if hx != hy:
        return fail(a.name, "headers differ: %s vs ref %s" % (cx, cy))
    bad = []
    for n in cx.names:
        x, y = px[n].astype(np.float64), py[n].astype(np.float64)
        if n == "qkvb" and a.kbias_bound is not None:
            C = cx.C
            kx, ky = x[:, C:2 * C], y[:, C:2 * C]
            km = float(np.max(np.abs(kx - ky)))
            print("#   model qkvb key-bias slice max abs diff %.3e (bound %.3e, gradient is 0 in exact math)"
                  % (km, a.kbias_bound))
            if not (np.all(np.isfinite(kx)) and km <= a.kbias_bound):
                bad.append("qkvb key-bias slice max abs diff %.3e > bound %.3e" % (km, a.kbias_bound))
            x = np.concatenate([x[:, :C], x[:, 2 * C:]], axis=1)
            y = np.concatenate([y[:, :C], y[:, 2 * C:]], axis=1)
        if not np.all(np.isfinite(x)):
            bad.append("%s non-finite" % n)
            continue
        e, m = rel_err(x, y), float(np.max(np.abs(x - y)))
        print("#   model %-9s rel err %.3e  max abs diff %.3e" % (n, e, m))
        if not (e < a.tol and m < a.abs):
            bad.append("%s rel err %.3e max abs %.3e (%s)" % (n, e, m, worst(x, y)))
    if bad:
        fail(a.name, "tol rel %.0e abs %.0e: " % (a.tol, a.abs) + "; ".join(bad))
    else:
        ok(a.name)


def cmd_scalar(a):
    vals = []
    for p in (a.a, a.ref):
        if not os.path.isfile(p):
            raise BadInput("%s is missing" % p)
        try:
            vals.append(float(open(p).read().split()[0]))
        except (OSError, ValueError, IndexError):
            raise BadInput("%s does not hold a number" % p)
    e = abs(vals[0] - vals[1]) / max(abs(vals[1]), 1e-30)
    if e < a.tol:
        ok(a.name)
    else:
        fail(a.name, "%.9g vs ref %.9g (rel %.2e >= %.0e)" % (vals[0], vals[1], e, a.tol))


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("array", "grads", "log", "models", "scalar"):
        p = sub.add_parser(c)
        p.add_argument("name")
        p.add_argument("a")
        p.add_argument("ref")
        if c == "grads":
            p.add_argument("model")
        p.add_argument("--tol", type=float, required=True)
        if c == "log":
            p.add_argument("--steps", type=int, required=True)
            p.add_argument("--key", action="append", default=None)
            p.add_argument("--clip", type=float)
        if c == "models":
            p.add_argument("--abs", type=float, default=float("inf"))
            p.add_argument("--kbias-bound", type=float)
    sub.add_parser("serve")
    return ap


def run(a):
    if a.cmd == "log" and not a.key:
        a.key = ["loss"]
    try:
        {"array": cmd_array, "grads": cmd_grads, "log": cmd_log, "models": cmd_models, "scalar": cmd_scalar}[a.cmd](a)
    except BadInput as e:
        fail(a.name, str(e))


def serve(ap):
    """One comparison per line, as if each were its own command; whatever goes wrong in one (bad arguments,
    an exception) is a FAIL of that one, named by its second argument."""
    for line in sys.stdin:
        argv = line.rstrip("\n").split("\t")
        name = argv[1] if len(argv) > 1 else "compare"
        try:
            a = ap.parse_args(argv)
            if a.cmd == "serve":
                raise ValueError("serve inside serve")
            run(a)
        except SystemExit:
            fail(name, "compare.py %s: exited (bad arguments or an unreadable file: see stderr)" % " ".join(argv))
        except Exception as e:  # noqa: BLE001 -- reported as the check's failure, the next line still runs
            fail(name, "compare.py raised %s: %s" % (type(e).__name__, e))
        print("# compare.py done", flush=True)


def main():
    ap = parser()
    a = ap.parse_args()
    if a.cmd == "serve":
        serve(ap)
        sys.exit(0)
    run(a)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
