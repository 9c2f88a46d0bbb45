"""fp16's dynamic loss scaling from an absurd initial scale (-ls 1e12), as a run's log.jsonl records it:
overflowing steps are skipped (no finite norm logged), the scale halves after every second overflow, and
training follows. Prints "ok NAME" or "FAIL NAME: why"; exit 1 on a failure.

Usage: loss_scaler_check.py NAME LOG.jsonl
"""
import json, sys
name, path = sys.argv[1], sys.argv[2]
steps = [json.loads(l) for l in open(path) if '"loss"' in l]
bad = []
scale, left = 1e12, 2
for r in steps:
    if abs(r["loss_scale"] - scale) > 1e-6 * scale:
        bad.append("step %d: scale %g, expected %g" % (r["step"], r["loss_scale"], scale))
        break
    if r.get("skipped"):
        left -= 1
        if left == 0:
            scale, left = max(scale / 2, 1.0), 2
skipped = sum(1 for r in steps if r.get("skipped"))
if not 2 <= skipped < len(steps) - 5:
    bad.append("%d of %d steps skipped" % (skipped, len(steps)))
if any(r["grad_norm"] is not None for r in steps if r.get("skipped")):
    bad.append("a skipped step logged a finite norm")
print("ok " + name if not bad else "FAIL %s: %s" % (name, "; ".join(bad)))
sys.exit(1 if bad else 0)
