#!/usr/bin/env python3
"""The include graph against the layers of docs/ARCHITECTURE.md: an #include may point down or sideways,
never up. Layers, bottom to top:

  0 base/            fail() and checked stdio/allocation; includes nothing of the project
  1 kernels/         the backend contract (kernels.h, dtype.h) and each layer's CPU twin and CUDA kernels
  2 core/            the orchestration modules
  3 zero.h, zero.c   the ZeRO policy
  4 train_gpt.cu     the trainer

  check_layers.py [ROOT]      one "ok layers_*" / "FAIL layers_*: why" line per check; exit 1 on failure
  check_layers.py --self-test the checker finds an upward include planted in a scratch tree

KNOWN lists the upward includes that remain (--estimate's planner, which runs ZeRO's allocation code in
counting mode). A new upward include fails; so does a KNOWN one that is gone, so the list only shrinks.
"""
import os
import re
import shutil
import sys
import tempfile

KNOWN = set()
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer(path):
    if path.startswith("base/"):
        return 0
    if path.startswith("kernels/"):
        return 1
    if path.startswith("core/"):
        return 2
    if path in ("zero.h", "zero.c"):
        return 3
    if path == "train_gpt.cu":
        return 4
    return None  # tests, tools: outside the layering


def resolve(root, src, name):
    """The repository path an #include "name" in src names: beside src, then -I. and -Icore, as the Makefile."""
    for base in (os.path.dirname(src), "", "core"):
        rel = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None


def upward_includes(root):
    found, unresolved = set(), []
    for top in ("base", "kernels", "core", "."):
        for name in sorted(os.listdir(os.path.join(root, top))):
            src = os.path.normpath(os.path.join(top, name))
            if not name.endswith(SOURCES) or layer(src) is None:
                continue
            for inc in INCLUDE.findall(open(os.path.join(root, src), encoding="utf-8").read()):
                dst = resolve(root, src, inc)
                if dst is None:
                    unresolved.append("%s: %s" % (src, inc))
                elif layer(dst) is not None and layer(dst) > layer(src):
                    found.add((src, dst))
    return found, unresolved


def check(root):
    found, unresolved = upward_includes(root)
    bad = []
    new, gone = sorted(found - KNOWN), sorted(KNOWN - found)
    print("ok layers_no_new_upward_include" if not new else
          "FAIL layers_no_new_upward_include: " + ", ".join("%s includes %s" % e for e in new))
    print("ok layers_known_list_current" if not gone else
          "FAIL layers_known_list_current: no longer upward, remove from KNOWN in tests/check_layers.py: " +
          ", ".join("%s -> %s" % e for e in gone))
    print("ok layers_includes_resolve" if not unresolved else
          "FAIL layers_includes_resolve: " + ", ".join(unresolved))
    return not (new or gone or unresolved)


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    scratch = tempfile.mkdtemp()
    try:
        for d in ("base", "kernels", "core"):
            shutil.copytree(os.path.join(root, d), os.path.join(scratch, d))
        for f in ("zero.h", "zero.c", "train_gpt.cu"):
            shutil.copy(os.path.join(root, f), scratch)
        with open(os.path.join(scratch, "kernels", "planted.h"), "w") as f:
            f.write('#include "core/gpt.h"\n')
        found, _ = upward_includes(scratch)
        ok = ("kernels/planted.h", "core/gpt.h") in found
        print("ok layers_checker_finds_planted_include" if ok else
              "FAIL layers_checker_finds_planted_include: a kernels/ header including core/gpt.h went unnoticed")
        return ok
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    sys.exit(0 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) else 1)
