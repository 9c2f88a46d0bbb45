#!/usr/bin/env bash
# LoRA against full fine-tuning on the CPU build: for the same model and layout, each rank's memory (the
# trainer's own records: the log's "memory" line per rank, what "memory (rank 0)" prints for rank 0) and the
# step time, side by side.
#
#   scripts/bench_lora.sh                 times LORA_STEPS steps per case (run it on an otherwise idle machine)
#   scripts/bench_lora.sh --memory-only   takes no step (-x 0): the memory columns alone, in seconds
#
# Cases: one rank (-z 0) and, with MPI, 2 ranks under -z 1 and -z 2 (LORA_LAYOUTS: "ranks:flags;..."). Model
# LORA_MODEL (default smollm2-135m, random init), bf16, b=LORA_B t=LORA_T, -lora LORA_RANK on every target.
# Step time: the median dt_ms of the steps after 2 of warm-up. Writes $BENCH_REPORT (default
# build/bench_lora.md) and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMORY_ONLY=0
case "${1:-}" in
    --memory-only) MEMORY_ONLY=1 ;;
    "") ;;
    *) echo "error: unknown argument '$1' (scripts/bench_lora.sh [--memory-only])" >&2; exit 1 ;;
esac
REPORT=${BENCH_REPORT:-build/bench_lora.md}
BIN=${LORA_BIN:-./train_gpt_cpu}
MODEL=${LORA_MODEL:-smollm2-135m}
RANK=${LORA_RANK:-16}
B=${LORA_B:-2}
T=${LORA_T:-256}
STEPS=${LORA_STEPS:-8}
LAYOUTS=${LORA_LAYOUTS:-"1:-z 0;2:-z 1;2:-z 2"}
[ "$MEMORY_ONLY" = 1 ] && STEPS=0
[ "$MEMORY_ONLY" = 1 ] || [ "$STEPS" -ge 3 ] || { echo "error: LORA_STEPS=$STEPS leaves no step after 2 of warm-up" >&2; exit 1; }
PY=python3
python3 -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3   # make_shard.py needs numpy
[ -x "$BIN" ] || { echo "error: $BIN not built (make train_gpt_cpu)" >&2; exit 1; }
W=$(mktemp -d /tmp/bench_lora.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
have_mpi=0
command -v mpirun >/dev/null 2>&1 && ldd "$BIN" | grep -q libmpi && have_mpi=1
# The model's vocabulary, from its own plan (a shape or a catalog name alike).
V=$($BIN -e "$MODEL" -b "$B" -t "$T" --estimate 2>&1 | sed -n 's/^memory plan per rank.* V=\([0-9]*\) .*/\1/p')
[ -n "$V" ] || { echo "error: $BIN -e $MODEL --estimate gave no plan: $($BIN -e "$MODEL" -b "$B" -t "$T" --estimate 2>&1 | tail -1)" >&2; exit 1; }
$PY scripts/make_shard.py -o "$W/data.bin" -n $(( (STEPS + 1) * B * T * 2 + T + 1 )) -V "$V" --seed 13 >/dev/null
common=(-e "$MODEL" -i "$W/data.bin" -j "" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -l 1e-4 -p bf16)

rows=()
run_case() {   # layout label, ranks, mode (full|lora), flags...
    local label=$1 np=$2 mode=$3; shift 3
    local dir="$W/run${#rows[@]}" extra=()
    [ "$mode" = lora ] && extra=(-lora "$RANK")
    echo "== $label, $mode: $BIN ${common[*]} ${extra[*]} $* (ranks $np)" >&2
    local launch=("$BIN")
    if [ "$np" -gt 1 ]; then launch=("${MPIRUN[@]}" -np "$np" "$BIN"); fi
    if ! OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))} \
        "${launch[@]}" "${common[@]}" "${extra[@]}" "$@" -o "$dir" > "$dir.txt" 2>&1; then
        rows+=("| $label | $mode | failed: $(grep -m1 -i error "$dir.txt" | cut -c1-120 || tail -1 "$dir.txt") | | | | | | | |")
        return
    fi
    rows+=("$($PY - "$dir/log.jsonl" "$dir.txt" "$label" "$mode" "$np" "$MEMORY_ONLY" <<'PY'
import json, re, statistics, sys
log, out, label, mode, np, memory_only = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1"
recs = [json.loads(l) for l in open(log) if l.strip()]
mem = sorted((r for r in recs if "memory" in r), key=lambda r: r["rank"])
if len(mem) != np: sys.exit("error: %d memory records for %d ranks in %s" % (len(mem), np, log))
trained = re.search(r"\((\d+) trained, the base frozen\)", open(out).read())
params = next(r["layout"]["params"] for r in recs if "layout" in r)
mib = lambda b: b / 2**20
heavy = max(mem, key=lambda r: r["total"])["memory"]
per_rank = " / ".join("%.1f" % mib(r["total"]) for r in mem)
steps = [r for r in recs if "loss" in r and "dt_ms" in r][2:]
ms = statistics.median(r["dt_ms"] for r in steps) if steps and not memory_only else None
tok = statistics.median(r["tok_s"] for r in steps) if steps and not memory_only else None
print("| %s | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %s | %s |" % (
    label, mode, trained.group(1) if trained else params, per_rank, mib(heavy["params"]), mib(heavy["grads"]),
    mib(heavy["master"] + heavy["optimizer"]), mib(heavy["activations"]),
    "—" if ms is None else "%.0f" % ms, "—" if tok is None else "%.0f" % tok))
PY
)")
    echo "${rows[-1]}" >&2
    rm -rf "$dir"   # a full fine-tuning checkpoint is 16 bytes per parameter
}

IFS=';' read -ra layouts <<< "$LAYOUTS"
for layout in "${layouts[@]}"; do
    np=${layout%%:*}
    read -ra flags <<< "${layout#*:}"
    label="$np rank"
    [ "$np" = 1 ] || label+=s
    label+=" ${flags[*]}"
    if [ "$np" -gt 1 ] && [ $have_mpi = 0 ]; then
        rows+=("| $label | | skipped: $BIN without MPI or no mpirun | | | | | | | |")
        continue
    fi
    run_case "$label" "$np" full "${flags[@]}"
    run_case "$label" "$np" lora "${flags[@]}"
done

mkdir -p "$(dirname "$REPORT")"
{
    echo "# LoRA against full fine-tuning (CPU build)"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(nproc) cores"
    echo "- model: $MODEL (random init), bf16, b=$B t=$T; LoRA: -lora $RANK on every target (the base frozen)"
    if [ "$MEMORY_ONLY" = 1 ]; then echo "- command: scripts/bench_lora.sh --memory-only (no step: memory only)"
    else echo "- command: scripts/bench_lora.sh ($STEPS steps; ms/step and tokens/s: medians after 2 of warm-up)"; fi
    echo "- MiB per rank: each rank's device total (rank 0 first), from the trainer's memory records; the columns after it: the heaviest rank's"
    echo
    echo "| layout | training | trained parameters | MiB per rank | params | grads | master + optimizer | activations | ms/step | tokens/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} > "$REPORT"
cat "$REPORT"
