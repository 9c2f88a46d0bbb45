#!/usr/bin/env bash
# Context parallelism on the CPU build: one rank against -cp 2 and -cp 4 in each mode (ulysses, ring) at a long
# -t, side by side: each rank's step time, its memory (the trainer's own "memory" record of rank 0: every
# context rank holds as much), and what each rank sends per step inside the context group (cp_comm_bytes: the
# all-to-alls, or the ring's passes).
#
#   scripts/bench_cp.sh     times CP_STEPS steps per case (run it on an otherwise idle machine)
#
# Model CP_MODEL (default a 4-block GPT-2 of width 256, random init), fp32, b=1 t=CP_T (default 2048). The
# one-rank run takes every core (OMP threads); a -cp N run one thread per rank, N ranks (more ranks than cores
# are oversubscribed, and the table says so). Step time: the median dt_ms after 2 steps of warm-up. Writes
# $BENCH_REPORT (default build/bench_cp.md) and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 0 ] || { echo "error: scripts/bench_cp.sh takes no arguments (CP_MODEL, CP_T, CP_STEPS, CP_CASES)" >&2; exit 1; }
REPORT=${BENCH_REPORT:-build/bench_cp.md}
BIN=${CP_BIN:-./train_gpt_cpu}
MODEL=${CP_MODEL:-L4C256H8V4096T8192}
T=${CP_T:-2048}
STEPS=${CP_STEPS:-6}
CASES=${CP_CASES:-"1:;2:-cp 2 -cpm ulysses;2:-cp 2 -cpm ring;4:-cp 4 -cpm ulysses;4:-cp 4 -cpm ring"}
[ "$STEPS" -ge 3 ] || { echo "error: CP_STEPS=$STEPS leaves no step after 2 of warm-up" >&2; exit 1; }
PY=python3
python3 -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3   # make_shard.py needs numpy
[ -x "$BIN" ] || { echo "error: $BIN not built (make train_gpt_cpu)" >&2; exit 1; }
command -v mpirun >/dev/null 2>&1 && ldd "$BIN" | grep -q libmpi || { echo "error: $BIN has no MPI (the -cp cases need it)" >&2; exit 1; }
W=$(mktemp -d /tmp/bench_cp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
V=$($BIN -e "$MODEL" -b 1 -t "$T" -s 0 --estimate 2>&1 | sed -n 's/^memory plan per rank.* V=\([0-9]*\) .*/\1/p')
[ -n "$V" ] || { echo "error: $BIN -e $MODEL --estimate gave no plan" >&2; exit 1; }
$PY scripts/make_shard.py -o "$W/data.bin" -n $(( (STEPS + 1) * T * 4 + T + 1 )) -V "$V" --seed 17 >/dev/null
common=(-e "$MODEL" -i "$W/data.bin" -j "" -b 1 -t "$T" -x "$STEPS" -v 0 -s 0 -l 1e-4)
cores=$(nproc)

rows=()
IFS=';' read -ra cases <<< "$CASES"
for c in "${cases[@]}"; do
    np=${c%%:*}
    read -ra flags <<< "${c#*:}"
    dir="$W/run${#rows[@]}"
    threads=$(( cores / np > 0 ? cores / np : 1 ))
    echo "== $np rank(s) ${flags[*]:-}: OMP_NUM_THREADS=$threads" >&2
    launch=("$BIN")
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$BIN")
    if ! OMP_NUM_THREADS=$threads "${launch[@]}" "${common[@]}" "${flags[@]}" -o "$dir" > "$dir.txt" 2>&1; then
        rows+=("| $np | ${flags[*]:-one rank} | failed: $(grep -m1 -i error "$dir.txt" | cut -c1-120 || tail -1 "$dir.txt") | | | | |")
        continue
    fi
    rows+=("$($PY - "$dir/log.jsonl" "$np" "${flags[*]:-one rank}" "$threads" "$cores" <<'PY'
import json, statistics, sys
path, np, label, threads, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
recs = [json.loads(l) for l in open(path)]
steps = [r["dt_ms"] for r in recs if "dt_ms" in r and r.get("step", 0) >= 2]
mem = next(r["memory"] for r in recs if "memory" in r and r.get("rank", 0) == 0)
device = sum(v for k, v in mem.items() if not k.startswith(("host_", "disk_")))
sent = [sum(sum(v) if isinstance(v, list) else v for v in r["cp_comm_bytes"].values()) / np for r in recs if "cp_comm_bytes" in r]
mib = lambda b: "%.1f" % (b / 2**20)
placement = "%d x %d thread%s%s" % (np, threads, "s" if threads > 1 else "", ", oversubscribed" if np > cores else "")
print("| %d | %s | %s | %.0f | %s | %s | %s |" % (np, label, placement, statistics.median(steps), mib(mem["activations"]),
                                             mib(device), mib(sent[-1]) if sent else "0"))
PY
)")
done
{
    echo "Context parallelism on the CPU build: $MODEL, fp32, b=1 t=$T, $STEPS steps (median dt after 2), $(date -u +%Y-%m-%d),"
    echo "$(nproc) cores, $BIN."
    echo
    echo "| ranks | layout | placement | ms/step | activations MiB/rank | device MiB/rank | context-group MiB sent/rank/step |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$REPORT"
