#!/usr/bin/env python3
"""The family seam (docs/ARCHITECTURE.md, "A model family"): what a family owns stays in core/models/.

  - ModelShape (core/model/family.h) holds only the fields every family has; a family's own parameters
    live in its FamilyParams block, which only its folder reads.
  - The Width enum (core/model/block.h) lists only the walk's widths; a family numbers its own from
    W_FAMILY.
  - The walk (core/model/walk.c, activations.c) reads nothing of a ModelFamily but its block: the kinds it embeds and
    projects with are the ends' (core/model/ends.c, or the family's own hooks).
  - No file outside core/models/ includes a family's folder (only the catalog), so no generic code can
    name a family's parameters: with the first check, the compiler enforces the seam.

  check_family_seam.py [ROOT]      one "ok seam_*" / "FAIL seam_*: why" line per check; exit 1 on failure
  check_family_seam.py --self-test the checker finds leaks planted in a scratch copy
"""
import contextlib
import io
import os
import re
import shutil
import sys
import tempfile

COMMON_SHAPE_FIELDS = {"family", "L", "C", "NH", "V", "Vp", "maxT", "tied", "params"}
WALK_WIDTHS = {"W_1", "W_C", "W_NHA", "W_KVA_COPIED", "W_VPA", "W_VSTAT", "W_CP_QKV", "W_CP_ATT", "W_CP_SEND", "W_CP_RECV", "W_FAMILY"}
WALK_FAMILY_MEMBERS = {"block"}
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read(root, path):
    return open(os.path.join(root, path), encoding="utf-8").read()


def strip_comments(text):
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def struct_members(text, name):
    """Member names of `typedef struct { ... } name;` (one level: no nested structs)."""
    m = re.search(r"typedef struct\s*\{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", strip_comments(text))
    if not m:
        return None
    names = []
    for decl in m.group(1).split(";"):
        decl = re.sub(r"_Alignas\([^)]*\)", "", decl).strip()
        if not decl:
            continue
        first, *more = decl.split(",")
        names.append(re.sub(r"\[.*", "", first).split()[-1].lstrip("*"))
        names += [re.sub(r"\[.*", "", d).strip().lstrip("*") for d in more]
    return names


def width_names(text):
    """The constants of the enum that holds W_1 (the generic widths)."""
    for body in re.findall(r"enum\s*\{([^}]*)\}", strip_comments(text)):
        names = [n.split("=")[0].strip() for n in body.split(",") if n.strip()]
        if "W_1" in names:
            return names
    return None


def generic_sources(root):
    for top in ["base", "kernels", "."] + ["core/" + d for d in sorted(os.listdir(os.path.join(root, "core")))]:
        if top == "core/models" or not os.path.isdir(os.path.join(root, top)):
            continue
        for name in sorted(os.listdir(os.path.join(root, top))):
            if name.endswith(SOURCES):
                yield os.path.normpath(os.path.join(top, name))


def check(root):
    results = []
    members = struct_members(read(root, "core/model/family.h"), "ModelShape")
    extra = sorted(set(members or []) - COMMON_SHAPE_FIELDS)
    results.append(("seam_model_shape_common_fields",
                    "ModelShape not found in core/model/family.h" if members is None else
                    extra and "ModelShape holds a family's fields (belong in its FamilyParams): " + ", ".join(extra)))
    widths = width_names(read(root, "core/model/block.h"))
    extra = sorted(set(widths or []) - WALK_WIDTHS)
    results.append(("seam_width_enum_walk_only",
                    "the Width enum (with W_1) not found in core/model/block.h" if widths is None else
                    extra and "the generic Width enum lists a family's widths: " + ", ".join(extra)))
    walk = strip_comments(read(root, "core/model/walk.c") + read(root, "core/model/activations.c"))
    used = sorted(set(re.findall(r"\b(?:family|fam)\s*->\s*(\w+)", walk)) - WALK_FAMILY_MEMBERS)
    results.append(("seam_walk_reads_only_the_block",
                    used and "core/model/walk.c or activations.c reads ModelFamily fields: " + ", ".join(used)))
    leaks = ["%s includes %s" % (src, inc) for src in generic_sources(root)
             for inc in INCLUDE.findall(read(root, src))
             if inc.startswith("core/models/") and inc != "core/models/catalog.h"]
    results.append(("seam_family_folders_private", leaks and "; ".join(leaks)))
    for name, why in results:
        print("ok " + name if not why else "FAIL %s: %s" % (name, why))
    return all(not why for _, why in results)


def plant(root, path, old, new):
    text = read(root, path)
    if old not in text:
        raise SystemExit("FAIL seam_checker_finds_planted_leaks: cannot plant into %s: '%s' is not there" % (path, old))
    with open(os.path.join(root, path), "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    src_root = os.path.dirname(os.path.dirname(here))
    scratch = tempfile.mkdtemp()
    try:
        for d in ("base", "kernels", "core"):
            shutil.copytree(os.path.join(src_root, d), os.path.join(scratch, d))
        plant(scratch, "core/model/family.h", "    int tied;", "    int tied;\n    int KV, D;")
        plant(scratch, "core/model/block.h", "W_VSTAT,", "W_VSTAT, W_QKVA,")
        plant(scratch, "core/model/walk.c", "static int head_unit(", "static int wte_kind(const Model* g) { return g->shape.family->wte; }\nstatic int head_unit(")
        plant(scratch, "core/run/report.c", "#include", '#include "core/models/llama/llama.h"\n#include')
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            check(scratch)
        want = ["seam_model_shape_common_fields: ModelShape holds a family's fields (belong in its FamilyParams): D, KV",
                "seam_width_enum_walk_only: the generic Width enum lists a family's widths: W_QKVA",
                "seam_walk_reads_only_the_block: core/model/walk.c or activations.c reads ModelFamily fields: wte",
                "seam_family_folders_private: core/run/report.c includes core/models/llama/llama.h"]
        missed = [w for w in want if "FAIL " + w not in out.getvalue().splitlines()]
        print("ok seam_checker_finds_planted_leaks" if not missed else
              "FAIL seam_checker_finds_planted_leaks: unnoticed: " + "; ".join(missed))
        return not missed
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    sys.exit(0 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) else 1)
