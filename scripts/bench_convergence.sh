#!/usr/bin/env bash
# The cost in convergence of the slow-link techniques: the quick start's model and data (scripts/quickstart.sh)
# trained from one initial model.bin, on NP data-parallel ranks with one global batch and one data order,
# once exactly (-z 3) and once per technique; the validation loss at the same steps, side by side, with each
# one's distance from the exact run's. The losses do not depend on the link, so the ranks run on this host.
#
#   scripts/bench_convergence.sh [-x STEPS] [-v N] [-m N] [-freeze S] [-np N] [-b N] [-o DIR] [-c NAME=FLAGS]...
#
#   -x STEPS    steps (default 160); the warm-up -u is a tenth of them, as the quick start's 50 of 600
#   -v N        validation loss every N steps (default 20); -m N validation batches (default 20)
#   -freeze S   1-bit Adam's exact warm-up (default a fifth of the steps)
#   -np N       data-parallel ranks (default 4); -b N each rank's micro-batch (default 8 / NP: the quick
#               start's 8 sequences a step)
#   -o DIR      where the runs go (default build/bench_convergence); kept, each run in DIR/NAME
#   -c NAME=FLAGS  a configuration (repeatable; the first is the reference). Default: exact=-z 3,
#               qwZ=-z 3 -qw 1, hpZ+qwZ=-z 3 -hpz 2 -qw 1, qgZ=-z 3 -qg 1 and qwZ+qgZ=-z 3 -qw 1 -qg 1 when the
#               binary knows -qg, 1-bit Adam=-z 3 -opt adam1bit -freeze S
#
# Prints a Markdown table (also in DIR/table.md): per validation step, each configuration's loss and its
# difference from the reference's. GPT_BIN picks the binary (default ./train_gpt_cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
me=scripts/bench_convergence.sh
die() { echo "$me: error: $*" >&2; exit 1; }
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=${GPT_BIN:-./train_gpt_cpu}
STEPS=160 EVERY=20 VAL_BATCHES=20 FREEZE="" NP=4 MICRO="" OUT=build/bench_convergence
configs=()
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"; }
while [ $# -gt 0 ]; do
    case $1 in -x | -v | -m | -freeze | -np | -b | -o | -c) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case $1 in
        -x) positive "$1" "$2"; STEPS=$2 ;;
        -v) positive "$1" "$2"; EVERY=$2 ;;
        -m) positive "$1" "$2"; VAL_BATCHES=$2 ;;
        -freeze) positive "$1" "$2"; FREEZE=$2 ;;
        -np) positive "$1" "$2"; NP=$2 ;;
        -b) positive "$1" "$2"; MICRO=$2 ;;
        -o) OUT=$2 ;;
        -c) [[ $2 =~ ^[A-Za-z0-9_+.-]+=.+ ]] || die "-c needs NAME=FLAGS (NAME of letters, digits, _+.-), got '$2'"
            configs+=("$2") ;;
        *) die "unknown argument '$1' (see the comment at the top of $me)" ;;
    esac
    shift 2
done
[ "$NP" -ge 2 ] || die "-np $NP: the techniques need at least 2 data-parallel ranks"
if [ -z "$MICRO" ]; then
    [ $((8 % NP)) = 0 ] || die "-np $NP does not divide the quick start's 8 sequences a step: give -b"
    MICRO=$((8 / NP))
fi
FREEZE=${FREEZE:-$(( STEPS / 5 > 0 ? STEPS / 5 : 1 ))}
[ "$FREEZE" -le "$STEPS" ] || die "-freeze $FREEZE exceeds the $STEPS steps"
[ -x "$BIN" ] || die "$BIN not built (make train_gpt_cpu)"
command -v mpirun >/dev/null 2>&1 && ldd "$BIN" | grep libmpi >/dev/null || die "$BIN has no MPI, or mpirun is missing"
if [ ${#configs[@]} = 0 ]; then
    configs=("exact=-z 3" "qwZ=-z 3 -qw 1" "hpZ+qwZ=-z 3 -hpz 2 -qw 1")
    if "$BIN" -h 2>&1 | grep -- '^  -qg ' >/dev/null; then configs+=("qgZ=-z 3 -qg 1" "qwZ+qgZ=-z 3 -qw 1 -qg 1"); fi
    configs+=("1-bit-Adam=-z 3 -opt adam1bit -freeze $FREEZE")
fi
bash scripts/prepare_kjv.sh

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np "$NP")
mkdir -p "$OUT"
# One initial model for every run: the quick start's shape, -seed's initialization.
"$BIN" -e L4C128H4T256 -b "$MICRO" -t 128 -x 0 -s 0 -v 0 -ow 1 -o "$OUT/init" > "$OUT/init.txt" 2>&1 ||
    die "writing the initial model failed: $(tail -1 "$OUT/init.txt")"
init=$OUT/init/ckpt_000000/model.bin
# The quick start's schedule (-l 2e-3, warm-up a twelfth, decay to 0.1 of it, -c 0.1) over STEPS.
common=(-e "$init" -b "$MICRO" -t 128 -x "$STEPS" -l 2e-3 -u $(( STEPS / 12 > 0 ? STEPS / 12 : 1 )) -q 0.1 -c 0.1
        -v "$EVERY" -m "$VAL_BATCHES" -s 0 -n 0 -ow 1)
logs=()
for c in "${configs[@]}"; do
    name=${c%%=*}
    read -ra flags <<< "${c#*=}"
    echo "$me: $name: ${MPIRUN[*]} $BIN ${common[*]} ${flags[*]} -o $OUT/$name" >&2
    "${MPIRUN[@]}" "$BIN" "${common[@]}" "${flags[@]}" -o "$OUT/$name" > "$OUT/$name.txt" 2>&1 ||
        die "$name failed: $(grep -m1 '^error' "$OUT/$name.txt" || tail -1 "$OUT/$name.txt")"
    logs+=("$name=$OUT/$name/log.jsonl")
done
"$PYTHON" - "${logs[@]}" > "$OUT/table.md" <<'PY'
import json, sys
runs = [a.split("=", 1) for a in sys.argv[1:]]
val = {name: {r["step"]: r["val_loss"] for r in map(json.loads, open(path)) if "val_loss" in r} for name, path in runs}
ref_name = runs[0][0]
ref = val[ref_name]
print("| step | " + " | ".join([ref_name] + ["%s (- %s)" % (n, ref_name) for n, _ in runs[1:]]) + " |")
print("|---" * len(runs) + "|---|")
for s in sorted(ref):
    cells = ["%.6f" % ref[s]]
    for n, _ in runs[1:]:
        v = val[n].get(s)
        cells.append("missing" if v is None else "%.6f (%+.6f)" % (v, v - ref[s]))
    print("| %d | %s |" % (s, " | ".join(cells)))
PY
cat "$OUT/table.md"
