#!/usr/bin/env python3
"""Activation bytes per recompute level: the trainer's logged "activations" bytes must equal a per-token
count written here from the model's shape, independently of the C code, and must decrease with the level.

  recompute_check.py NAME LOG_r0 LOG_r1 LOG_r2 LOG_r3
"""
import json
import sys


def predicted(lay, B, T):
    """Per token: the block inputs (L+1 of them) always; per layer what the level keeps; one slot of each
    tensor the level recomputes; and the buffers every level needs (final LayerNorm, logits, gradients)."""
    x, L, C, NH, Vp, r = lay["dtype_bytes"], lay["L"], lay["C"], lay["NH"], lay["Vp"], lay["recompute"]
    layers = lambda kept: L if kept else 1
    ln = 2 * (C * x + 8)            # ln1, ln2 and their mean/rstd (fp32)
    att = C * x + 4 * NH            # attention output, log-sum-exp (fp32)
    mid = (3 * C + C + 4 * C) * x   # qkv, resid2, fch
    gelu = 4 * C * x                # fch_gelu
    per_token = ((L + 1) * C * x + layers(r < 2) * ln + layers(r < 2) * att + layers(r < 3) * mid
                 + layers(r < 1) * gelu)
    fixed = (C * x + 8) + Vp * x + 3 * 4 + 3 * C * x + 4 * C * x + 4 * NH  # lnf, logits, ids, proj/d*, dbig, scratch
    return B * T * (per_token + fixed)


def main():
    name, logs = sys.argv[1], sys.argv[2:]
    bad, got = [], []
    for level, path in enumerate(logs):
        recs = [json.loads(l) for l in open(path) if l.strip()]
        lay = next(r["layout"] for r in recs if "layout" in r)
        act = next(r["memory"]["activations"] for r in recs if "memory" in r)
        if lay["recompute"] != level:
            bad.append("%s ran at -r %d, expected %d" % (path, lay["recompute"], level))
        want = predicted(lay, lay["B"], lay["T"])
        got.append(act)
        print("#   -r %d: %d activation bytes (predicted %d)" % (level, act, want))
        if act != want:
            bad.append("-r %d: %d bytes allocated, %d predicted" % (level, act, want))
    for level, path in enumerate(logs):   # the log's own "bytes saved" record agrees with the -r 0 run
        rec = next((json.loads(l) for l in open(path) if '"activations_saved"' in l), None)
        if rec is None or rec["activations_saved"] != got[0] - got[level] or rec["activations_keep_all"] != got[0]:
            bad.append("-r %d: logged saving %s, measured %d" % (level, rec and rec["activations_saved"], got[0] - got[level]))
    if any(b >= a for a, b in zip(got, got[1:])):
        bad.append("activation bytes do not decrease with the level: %s" % got)
    print(("ok %s" % name) if not bad else "FAIL %s: %s" % (name, "; ".join(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
