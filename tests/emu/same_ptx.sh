#!/usr/bin/env bash
# same_ptx.sh BASE: whether every kernel nvcc compiles from kernels/backend_cuda.cu has the same PTX in the
# working tree as in commit BASE -- the proof that a change meant for the emulator's build alone (an
# `#ifdef GPT_EMU` in a PTX wrapper) leaves the GPU's code as it was. Entries are compared by name, after
# numbering labels afresh (they shift when kernels are added). Prints "ok same_ptx_NAME" or one FAIL per
# entry that differs or is missing; needs nvcc, not a GPU.
set -u
cd "$(dirname "$0")/../.."
base=${1:?usage: same_ptx.sh BASE}
NVCC=${NVCC:-nvcc}
work=$(mktemp -d /tmp/same_ptx.XXXXXX)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add --detach -q "$work/base" "$base" || { echo "FAIL same_ptx: cannot check out $base"; exit 1; }
ptx() {   # tree, out
    (cd "$1" && "$NVCC" -O3 -std=c++17 --expt-relaxed-constexpr -I. -arch=compute_90 -ptx kernels/backend_cuda.cu -o "$2")
}
ptx "$work/base" "$work/base.ptx" && ptx "$PWD" "$work/head.ptx" || { echo "FAIL same_ptx: nvcc failed"; exit 1; }
PYTHON=${PYTHON:-/usr/bin/python3}
"$PYTHON" - "$work/base.ptx" "$work/head.ptx" <<'EOF'
import re, sys

def entries(path):
    text = open(path).read()
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\((.*?)\n}\n", text, re.S):
        body = m.group(2)
        for pat in (r"\$L__BB\d+_", r"__local_depot\d+", r"\$L__tmp\d+"):
            seen = {}
            body = re.sub(pat + r"\d*", lambda x: seen.setdefault(x.group(0), "L%d" % len(seen)), body)
        out[m.group(1)] = body
    return out

base, head = entries(sys.argv[1]), entries(sys.argv[2])
bad = 0
for name in sorted(base):
    if name not in head:
        print("FAIL same_ptx_%s: missing in the working tree" % name); bad += 1
    elif base[name] != head[name]:
        print("FAIL same_ptx_%s: PTX differs" % name); bad += 1
print("%s same_ptx: %d of %d entries equal (%d new in the working tree)" % ("FAIL" if bad else "ok",
      len(base) - bad, len(base), len(set(head) - set(base))))
sys.exit(1 if bad else 0)
EOF
