#!/usr/bin/env python3
"""Writes an llm.c token shard of N seeded random tokens in [0, V), for tests.

  make_shard.py -o F -n N -V V [--seed S]
"""
import argparse
import os
import sys

import numpy as np

SHARD_MAGIC = 20240520


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", required=True)
    ap.add_argument("-n", type=int, required=True, help="number of tokens")
    ap.add_argument("-V", type=int, required=True, help="vocabulary size (tokens are < V)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    # Tokens are stored as uint16, so the vocabulary must fit (GPT-2's 50257 does).
    if not 0 < a.V <= 65536 or not 0 <= a.n < 2**31:   # the header holds n as int32
        print("error: need 0 < V <= 65536 and 0 <= n < 2^31 (got V=%d n=%d)" % (a.V, a.n), file=sys.stderr)
        sys.exit(1)
    toks = np.random.default_rng(a.seed).integers(0, a.V, size=a.n, dtype=np.int64).astype(np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [SHARD_MAGIC, 1, a.n]
    tmp = a.o + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(toks.tobytes())
        os.replace(tmp, a.o)
    except OSError as e:
        print("error: cannot write %s: %s" % (a.o, e.strerror), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
