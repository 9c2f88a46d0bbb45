#!/usr/bin/env python3
"""Writes an llm.c token shard of N seeded random tokens in [0, V), for tests.

  make_shard.py -o F -n N -V V [--seed S] [--token-bits 16|32]

--token-bits 16 (the default when V <= 65536): [20240520, 1, N] header, uint16 tokens; 32 (the default
above): llm.c's 32-bit format, [20240801, 7, N] header, uint32 tokens. The same seed gives the same tokens
in either format.
"""
import argparse
import os
import sys

import numpy as np

FORMATS = {16: (20240520, 1, np.uint16), 32: (20240801, 7, np.uint32)}   # bits: magic, version, token type


def fail(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", required=True)
    ap.add_argument("-n", type=int, required=True, help="number of tokens")
    ap.add_argument("-V", type=int, required=True, help="vocabulary size (tokens are < V)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-bits", type=int, metavar="{16,32}",
                    help="bits per token (default: 16 when V fits, else 32)")
    a = ap.parse_args()
    # The header holds n as int32; the trainer's vocabulary size is an int.
    if not 0 < a.V < 2**31 or not 0 <= a.n < 2**31:
        fail("need 0 < V < 2^31 and 0 <= n < 2^31 (got V=%d n=%d)" % (a.V, a.n))
    bits = a.token_bits if a.token_bits is not None else 16 if a.V <= 65536 else 32
    if bits not in FORMATS:
        fail("--token-bits must be 16 or 32 (got %d)" % bits)
    if bits == 16 and a.V > 65536:
        fail("--token-bits 16 cannot hold V=%d tokens; use 32" % a.V)
    magic, version, dtype = FORMATS[bits]
    toks = np.random.default_rng(a.seed).integers(0, a.V, size=a.n, dtype=np.int64).astype(dtype)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [magic, version, a.n]
    tmp = a.o + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(toks.tobytes())
        os.replace(tmp, a.o)
    except OSError as e:
        fail("cannot write %s: %s" % (a.o, e.strerror))


if __name__ == "__main__":
    main()
