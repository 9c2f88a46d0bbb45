#!/usr/bin/env python3
"""compare_kernels.py: compare kernel_check outputs of two builds (CPU twin = reference, GPU = candidate).

    compare_kernels.py REF_DIR CAND_DIR DTYPE [LABEL]

Every tensor listed in REF_DIR/index.txt must exist in both directories with the listed size. For each,
rel err = ||cand - ref|| / ||ref|| (float64) must be under the dtype's threshold, and neither side may hold
NaN or Inf (the outputs were poisoned with NaN, so an unwritten element fails here). Prints a table
"kernel tensor relerr threshold PASS/FAIL", then one "ok NAME" / "FAIL NAME: why" line per tensor
(tests/unit/testlib.h protocol). Exits 1 on any failure.
"""
import os
import sys

import numpy as np

# fp32: both sides compute in fp32 (cuBLASLt with CUBLAS_COMPUTE_32F, no TF32); only summation order and
# libm differ. bf16/fp16: one rounding of the stored result differs now and then (bf16 ulp is 2^-8).
THRESHOLDS = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-2}


def threshold(dtype, kernel, tensor):
    base = kernel.split("_", 1)[1]   # strip the shape prefix ("odd_", "gpt2_", ...)
    # Conversions are pure rounding, and the loss-only classifier must leave its logits alone: same bits. LoRA's
    # dropout is an integer hash and one fp32 product: same bits (one element masked apart is below a norm's
    # tolerance). Quantization's max, division, rint and product are exact IEEE operations: same bits.
    if base.startswith(("convert_", "lora_dropout", "quantize_")) or (base in ("classifier_loss_only", "classifier_vocab_finish_loss_only")
                                                         and tensor == "logits"):
        return 0.0
    return THRESHOLDS[dtype]


def load(path, n):
    if not os.path.exists(path):
        return None, "missing file %s" % path
    a = np.fromfile(path, dtype=np.float32)
    if a.size != n:
        return None, "%s has %d floats, index says %d" % (path, a.size, n)
    return a.astype(np.float64), None


def main():
    if len(sys.argv) < 4:
        print("usage: compare_kernels.py REF_DIR CAND_DIR DTYPE [LABEL]", file=sys.stderr)
        return 2
    ref_dir, cand_dir, dtype = sys.argv[1:4]
    label = sys.argv[4] if len(sys.argv) > 4 else dtype
    if dtype not in THRESHOLDS:
        print("unknown dtype %s" % dtype, file=sys.stderr)
        return 2
    results = []   # (kernel, tensor, relerr or None, threshold, why or None)
    index = os.path.join(ref_dir, "index.txt")
    if not os.path.exists(index):
        print("FAIL compare_%s: no index.txt in %s" % (label, ref_dir))
        return 1
    entries = []
    for line in open(index):
        parts = line.split()
        if len(parts) == 3:
            entries.append((parts[0], parts[1], int(parts[2])))
    cand_index = os.path.join(cand_dir, "index.txt")
    cand_entries = set()
    if os.path.exists(cand_index):
        cand_entries = {tuple(l.split()[:2]) for l in open(cand_index) if len(l.split()) == 3}
    for kernel, tensor, n in entries:
        thr = threshold(dtype, kernel, tensor)
        fname = "%s.%s.f32" % (kernel, tensor)
        ref, why = load(os.path.join(ref_dir, fname), n)
        cand, why2 = load(os.path.join(cand_dir, fname), n) if ref is not None else (None, None)
        why = why or why2
        if why is None and (kernel, tensor) not in cand_entries:
            why = "not listed in %s" % cand_index
        if why is None:
            bad_ref = int(np.count_nonzero(~np.isfinite(ref)))
            bad_cand = int(np.count_nonzero(~np.isfinite(cand)))
            if bad_ref or bad_cand:
                first = int(np.argmax(~np.isfinite(cand))) if bad_cand else int(np.argmax(~np.isfinite(ref)))
                why = "non-finite values: %d in reference, %d in candidate (first at %d)" % (bad_ref, bad_cand, first)
        if why is not None:
            results.append((kernel, tensor, None, thr, why))
            continue
        diff = cand - ref
        nref = float(np.linalg.norm(ref))
        err = float(np.linalg.norm(diff)) / nref if nref > 0 else float(np.linalg.norm(diff))
        why = None
        if not err <= thr:
            worst = int(np.argmax(np.abs(diff)))
            why = "relerr %.3e > %.1e (worst at %d: ref %.6g cand %.6g)" % (err, thr, worst, ref[worst], cand[worst])
        results.append((kernel, tensor, err, thr, why))
    # Tensors the candidate wrote that the reference did not: a sign the two builds ran different checks.
    for kernel, tensor in sorted(cand_entries - {(k, t) for k, t, _ in entries}):
        results.append((kernel, tensor, None, 0.0, "only in candidate"))

    print("%-44s %-10s %11s %9s  %s" % ("kernel", "tensor", "relerr", "threshold", "result"))
    for kernel, tensor, err, thr, why in results:
        e = "%.3e" % err if err is not None else "-"
        print("%-44s %-10s %11s %9.1e  %s" % (kernel, tensor, e, thr, "PASS" if why is None else "FAIL"))
    failed = 0
    for kernel, tensor, err, thr, why in results:
        name = "%s_%s.%s" % (label, kernel, tensor)
        if why is None:
            print("ok %s" % name)
        else:
            failed += 1
            print("FAIL %s: %s" % (name, why))
    if not results:
        print("FAIL compare_%s: nothing to compare" % label)
        return 1
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
