#!/usr/bin/env bash
# `make bench-offload`: what -offload buys on one GPU, in one command that fits a per-command time limit.
#   1. d48 (GPT-2 1.5B) at T=1024, bf16: on the device alone (-z 0), -offload 1, and -z 3 -offload 2;
#   2. the largest GPT-2/GPT-3 shape --estimate says fits this GPU and this host's free memory under
#      -z 3 -offload 2 -r 3, without and with -dpu; and the largest on the device alone, for scale.
# Each case runs $STEPS steps with -lb $LB (every LB-th step synchronized and broken down). Throughput is the
# median of the other steps after 2 of warm-up. MFU is printed with both formulas: ours, 6N + 12·L·C·T
# FLOPs per token, and llm.c's, 6N + 6·L·C·T. The breakdown columns are medians of the -lb steps: the host
# update (optimizer phase) and the time the launch thread still waited on offload's copies.
# Writes $BENCH_REPORT (default build/bench_offload.md). OFFLOAD_B, OFFLOAD_GA and OFFLOAD_STEPS change the
# batch. With --dry-run it runs tiny shapes on train_gpt_cpu, to prove the script end to end; without a GPU and
# without it, an error (scripts/gpu_mode.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT=${BENCH_REPORT:-build/bench_offload.md}
STEPS=${OFFLOAD_STEPS:-12}
LB=4
B=${OFFLOAD_B:-4}
GA=${OFFLOAD_GA:-8}
PY=python3
python3 -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3   # make_shard.py needs numpy
W=$(mktemp -d /tmp/bench_offload.XXXXXX)
trap 'rm -rf "$W"' EXIT
source scripts/gpu_mode.sh
dry_run_or_gpu scripts/bench_offload.sh "${1:-}"
[ "$EMU" = 0 ] || { echo "error: scripts/bench_offload.sh times a GPU; the kernel emulator proves what kernels compute, not their speed" >&2; exit 1; }
if [ "$DRY_RUN" = 1 ]; then
    # The capacity lookup runs as on a GPU (for a 16 GiB one); the runs use tiny shapes.
    BIN=./train_gpt_cpu T=64 D48=L4C64H4V512 V=512 DEVICE="cpu (dry run)" GPU_GIB=16 STEPS=8 B=2 GA=2
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
    BIN=./train_gpt T=1024 D48=d48 V=50257
    DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    # 90% of the GPU: the CUDA context, cuBLASLt's workspace and fragmentation take the rest.
    GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.0f", $1 / 1024 * 0.9}')
fi
[ -x "$BIN" ] || { echo "error: $BIN not built (make ${BIN#./})" >&2; exit 1; }
# What this host can give: 90% of MemAvailable now, less what the data and the process itself need.
HOST_GIB=$(awk '/^MemAvailable:/ {printf "%.0f", $2 / 1048576 * 0.9}' /proc/meminfo)
$PY scripts/make_shard.py -o "$W/data.bin" -n 2000000 -V "$V" --seed 11 >/dev/null
common=(-i "$W/data.bin" -j "" -b "$B" -t "$T" -ga "$GA" -v 0 -s 0 -l 1e-4 -p bf16 -lb "$LB" -sh 1)
BIG_STEPS=8   # the largest shapes: a step takes seconds, and the whole command minutes

# The largest ladder shape in --estimate's capacity table for ZeRO stage $1, offload $2, at -r $3 ("-" if none).
largest() {
    local est
    est=$($BIN -b "$B" -t "$T" -p bf16 --estimate -gpu-mem "$GPU_GIB" -host-mem "$HOST_GIB" -w 1 2>&1) ||
        { echo "error: --estimate failed: $est" >&2; exit 1; }
    echo "$est" | awk -v z="$1" -v o="$2" -v r="$3" '$1 == z && $2 == o && NF == 6 {print $(3 + r)}'
}
# Ladder names to -e shapes (GPT-2's ladder: LADDER in core/models/gpt2/family.c).
shape_of() {
    [ "$DEVICE" = "cpu (dry run)" ] && { echo L4C128H4V512; return; }   # the ladder starts at 124M
    case $1 in
        124M) echo L12C768H12;; 350M) echo L24C1024H16;; 774M) echo L36C1280H20;; 1.6B) echo L48C1600H25;;
        2.7B) echo L32C2560H32;; 6.7B) echo L32C4096H32;; 13B) echo L40C5120H40;; 30B) echo L48C7168H56;;
        65B) echo L80C8192H64;; 175B) echo L96C12288H96;; *) echo "$1";;
    esac
}

rows=()
run_case() {   # label, model, steps, flags...
    local label=$1 model=$2 steps=$3; shift 3
    local dir="$W/case${#rows[@]}"
    echo "== $label: $BIN -e $model ${common[*]} -x $steps $*" >&2
    if ! $BIN -e "$model" "${common[@]}" -x "$steps" "$@" -o "$dir" > "$dir.txt" 2>&1; then
        rows+=("| $label | $model | $* | failed: $(grep -m1 -i error "$dir.txt" | cut -c1-120 || tail -1 "$dir.txt") | | | | | | | |")
        return
    fi
    rows+=("$($PY - "$dir/log.jsonl" "$label" "$model" "$*" "$LB" <<'PY'
import json, statistics, sys
path, label, model, flags, lb = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
recs = [json.loads(l) for l in open(path) if l.strip()]
lay = next(r["layout"] for r in recs if "layout" in r)
mem = next(r for r in recs if "memory" in r)
steps = [r for r in recs if "loss" in r and "dt_ms" in r]
free = [r for r in steps[2:] if lb == 0 or r["step"] % lb != 0]
if not free:
    sys.exit("error: %d steps leave none after the 2 warm-up steps and the -lb ones (OFFLOAD_STEPS)" % len(steps))
med = lambda xs: statistics.median(xs) if xs else float("nan")
ms, tok, mfu = med([r["dt_ms"] for r in free]), med([r["tok_s"] for r in free]), med([r["mfu"] for r in free])
N, L, C, T = lay["params"], lay["L"], lay["C"], lay["T"]
mfu_llmc = mfu * (6 * N + 6 * L * C * T) / (6 * N + 12 * L * C * T)
opt = med([r["breakdown_ms"]["optimizer"] for r in recs if "breakdown_ms" in r])
copies = med([r["offload_host_copies_ms"] for r in recs if "offload_host_copies_ms" in r])
dev = max(r["peak_mem"] for r in steps) / 2**30
host = sum(v for k, v in mem["memory"].items() if k.startswith("host_")) / 2**30
fmt = lambda x: "" if x != x else "%.1f" % x
print("| %s | %s (%.2fB) | %s | %.1f | %.0f | %.1f%% / %.1f%% | %.2f | %.2f | %s | %s |" % (
    label, model, N / 1e9, flags, ms, tok, 100 * mfu, 100 * mfu_llmc, dev, host, fmt(opt), fmt(copies)))
PY
)")
    echo "${rows[-1]}" >&2
}

run_case "device alone" "$D48" "$STEPS" -z 0
run_case "-offload 1" "$D48" "$STEPS" -z 0 -offload 1
run_case "-offload 2" "$D48" "$STEPS" -z 3 -offload 2
big=$(largest 3 2 3)
alone=$(largest 3 0 3)
if [ -z "$big" ] || [ "$big" = "-" ]; then
    rows+=("| largest with -offload 2 | none fits: --estimate -gpu-mem $GPU_GIB -host-mem $HOST_GIB | | | | | | | | |")
else
    run_case "largest, -offload 2" "$(shape_of "$big")" $BIG_STEPS -z 3 -offload 2 -r 3
    run_case "largest, -offload 2 -dpu 3" "$(shape_of "$big")" $BIG_STEPS -z 3 -offload 2 -r 3 -dpu 3
fi
if [ -n "$alone" ] && [ "$alone" != "-" ]; then
    run_case "largest on the device alone" "$(shape_of "$alone")" $BIG_STEPS -z 3 -r 3
fi

mkdir -p "$(dirname "$REPORT")"
{
    echo "# Offload benchmark"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "- device: $DEVICE ($GPU_GIB GiB offered to --estimate); host memory offered: $HOST_GIB GiB (90% of MemAvailable)"
    echo "- largest shape --estimate fits at -r 3: with -z 3 -offload 2 ${big:--}, on the device alone ${alone:--}"
    echo "- command: make bench-offload (bf16, b=$B, t=$T, -ga $GA, $STEPS steps ($BIG_STEPS for the largest), -lb $LB; medians of the unsynchronized steps after 2)"
    echo "- MFU: ours (6N + 12·L·C·T per token) / llm.c's (6N + 6·L·C·T), against the GPU's dense bf16 peak"
    echo
    echo "| case | model | flags | ms/step | tokens/s | MFU | device peak GiB | host GiB | host update ms | copy wait ms |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} > "$REPORT"
cat "$REPORT"
