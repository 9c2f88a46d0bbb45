#!/usr/bin/env python3
"""Several scripts/reference.py command lines in one process, so that PyTorch is imported once: one run per
stdin line, its arguments tab-separated. Prints "ran LINE" or "FAIL reference_run_LINE: why" per line (line
numbers from 1); exit 1 if any failed.   Usage: printf 'ARGS\\tARGS\\n...' | reference_runs.py
"""
import contextlib
import importlib.util
import io
import os
import sys

# Loaded by path: putting scripts/ on sys.path would let scripts/tokenize.py shadow the stdlib's.
_spec = importlib.util.spec_from_file_location(
    "reference", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def main():
    failed = 0
    for n, line in enumerate(sys.stdin, 1):
        args = line.rstrip("\n").split("\t")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ref.main(args)
            print("ran %d" % n)
        except SystemExit as e:
            if e.code:
                failed += 1
                print("FAIL reference_run_%d: exit %s: %s" % (n, e.code, err.getvalue().strip()[-300:]))
            else:
                print("ran %d" % n)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
