#!/usr/bin/env python3
"""The include graph against the layers of docs/ARCHITECTURE.md, by directory: an #include may point down
or sideways (the same layer), never up. Layers, bottom to top:

   0 base/              fail(), checked stdio and allocation, CRC-32; includes nothing of the project
   1 kernels/           the backend contract (kernels.h, dtype.h) and each layer's CPU twin and CUDA kernels
   2 core/util/         files, JSON, phase timing, threads, randomness, the log
   3 core/comm/         the collectives (MPI, NCCL, one rank) and the rank grid
   4 core/model/        shapes and the parameter layout, activation memory, batch I/O, the walk (walk.c)
   5 core/data/         token shards                         } one layer: none includes another
     core/tokenizer/    BPE encoding and llm.c's decoding file }
     core/models/       the model families (one folder each) and their catalog }
   6 core/pipeline/     schedules as action lists and their executor
   7 core/zero/         ZeRO's helpers: model state, optimizer, delayed update, gradient landing, pieces, gradient and parameter slots
   8 core/run/          flags, the report, the memory estimate, generation
   9 core/checkpoint/   checkpoints, their files, the run directory and the run record
  10 zero.h, zero.c     the ZeRO policy
  11 train_gpt.cu       the trainer

  check_layers.py [ROOT]      one "ok layers_*" / "FAIL layers_*: why" line per check; exit 1 on failure
  check_layers.py --self-test the checker finds upward includes planted in a scratch tree

KNOWN lists upward includes that remain (none). A new upward include fails; so does a KNOWN one that is
gone, so the list only shrinks. Every include is written from the repository's root ("core/zero/optimizer.h"),
the one include path the Makefile gives (-I.).
"""
import os
import re
import shutil
import sys
import tempfile

KNOWN = set()
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


LAYERS = [("base/", 0), ("kernels/", 1), ("core/util/", 2), ("core/comm/", 3), ("core/model/", 4),
          ("core/data/", 5), ("core/tokenizer/", 5), ("core/models/", 5), ("core/pipeline/", 6), ("core/zero/", 7), ("core/run/", 8),
          ("core/checkpoint/", 9), ("zero.h", 10), ("zero.c", 10), ("train_gpt.cu", 11)]


def layer(path):
    for prefix, rank in LAYERS:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return rank
    if path.startswith("core/"):
        return -1   # a core/ file outside every named folder: reported, not ranked
    return None     # tests, tools: outside the layering


def resolve(root, src, name):
    """The repository path an #include "name" in src names: from the root (-I.), else beside src."""
    for base in ("", os.path.dirname(src)):
        rel = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None


def layered_sources(root):
    for top in ["base", "kernels", "."] + ["core/" + d for d in sorted(os.listdir(os.path.join(root, "core")))]:
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for name in sorted(os.listdir(os.path.join(root, top))):
            src = os.path.normpath(os.path.join(top, name))
            if name.endswith(SOURCES) and layer(src) is not None:
                yield src


def upward_includes(root):
    found, unresolved, unplaced = set(), [], []
    for src in layered_sources(root):
        if layer(src) < 0:
            unplaced.append(src)
            continue
        for inc in INCLUDE.findall(open(os.path.join(root, src), encoding="utf-8").read()):
            dst = resolve(root, src, inc)
            if dst is None or dst != os.path.normpath(inc):
                unresolved.append("%s: %s" % (src, inc))   # missing, or not written from the root
            elif layer(dst) is not None and layer(dst) > layer(src):
                found.add((src, dst))
    return found, unresolved, unplaced


def check(root):
    found, unresolved, unplaced = upward_includes(root)
    bad = []
    new, gone = sorted(found - KNOWN), sorted(KNOWN - found)
    print("ok layers_no_new_upward_include" if not new else
          "FAIL layers_no_new_upward_include: " + ", ".join("%s includes %s" % e for e in new))
    print("ok layers_known_list_current" if not gone else
          "FAIL layers_known_list_current: no longer upward, remove from KNOWN in tests/tools/check_layers.py: " +
          ", ".join("%s -> %s" % e for e in gone))
    print("ok layers_includes_resolve" if not unresolved else
          "FAIL layers_includes_resolve (each include exists and is written from the root): " + ", ".join(unresolved))
    print("ok layers_every_core_file_placed" if not unplaced else
          "FAIL layers_every_core_file_placed: core/ files outside the layered folders: " + ", ".join(unplaced))
    return not (new or gone or unresolved or unplaced)


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    scratch = tempfile.mkdtemp()
    try:
        for d in ("base", "kernels", "core"):
            shutil.copytree(os.path.join(root, d), os.path.join(scratch, d))
        for f in ("zero.h", "zero.c", "train_gpt.cu"):
            shutil.copy(os.path.join(root, f), scratch)
        plants = [("kernels/planted.h", "core/model/walk.h"), ("core/comm/planted.h", "core/zero/optimizer.h"),
                  ("core/data/planted.h", "core/pipeline/schedule.h")]
        for src, dst in plants:
            with open(os.path.join(scratch, src), "w") as f:
                f.write('#include "%s"\n' % dst)
        found, _, _ = upward_includes(scratch)
        missed = [p for p in plants if p not in found]
        print("ok layers_checker_finds_planted_includes" if not missed else
              "FAIL layers_checker_finds_planted_includes: unnoticed: " + ", ".join("%s -> %s" % p for p in missed))
        return not missed
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    sys.exit(0 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) else 1)
