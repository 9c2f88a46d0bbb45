#!/usr/bin/env python3
"""Checks build/test_onebit --dump DIR against DeepSpeed's compressed all-reduce, reimplemented here.

The algorithm is DeepSpeed's torch_sim (tests/onebit/test_nccl_backend.py) with its errors carried from
round to round, as OnebitAdam's compressed_allreduce carries them: each worker adds its error, compresses the
whole buffer to scale * sign (scale = norm / sqrt(numel), sign(0) = +1) and keeps the rest as its error; the
compressed buffers are averaged; each server adds its error to its chunk of the average and compresses the
chunk the same way. Float64 here; the trainer's fp32 results must agree within 1e-6 (relative to 1).

usage: onebit_oracle.py DIR RANKS LEN ROUNDS
"""
import sys

import numpy as np


def compress(y):
    sign = np.where(y < 0, -1.0, 1.0)   # torch: y.sign().add_(1).bool(): 0 and -0 are +1
    scale = np.linalg.norm(y) / np.sqrt(y.size)
    return scale * sign


def main():
    folder, ranks, length, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    n = ranks * length
    record = 2 * n + length   # per round: the result, the worker error, the server error
    data = [np.fromfile(f"{folder}/rank{r}.f32", dtype=np.float32).astype(np.float64) for r in range(ranks)]
    if any(d.size != rounds * (n + record) for d in data):
        sys.exit(f"FAIL onebit_oracle_files: expected {rounds * (n + record)} floats per rank")
    worker_err = [np.zeros(n) for _ in range(ranks)]
    server_err = [np.zeros(length) for _ in range(ranks)]
    worst = 0.0
    for k in range(rounds):
        at = k * (n + record)
        compressed = []
        for r in range(ranks):
            y = data[r][at:at + n] + worker_err[r]
            c = compress(y)
            worker_err[r] = y - c
            compressed.append(c)
        average = sum(compressed) / ranks
        result = np.empty(n)
        for j in range(ranks):
            y = average[j * length:(j + 1) * length] + server_err[j]
            c = compress(y)
            server_err[j] = y - c
            result[j * length:(j + 1) * length] = c
        for r in range(ranks):
            got = data[r][at + n:at + n + record]
            want = np.concatenate([result, worker_err[r], server_err[r]])
            worst = max(worst, float(np.max(np.abs(got - want))))
    ok = worst <= 1e-6
    print(f"{'ok' if ok else 'FAIL'} onebit_matches_deepspeed_np{ranks}" + ("" if ok else f": max error {worst:.3e} > 1e-6"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
