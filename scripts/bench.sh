#!/usr/bin/env bash
# `make bench`: train_gpt's throughput, MFU and peak memory for GPT-2 124M (d12) and 350M (d24) at T=1024,
# next to the PyTorch reference (torch.compile, fused attention) on the same GPU in the same run.
# MFU counts 6N + 12·L·C·T FLOPs per token against the GPU's dense bf16 peak (H100/H200: 989 TFLOP/s).
# Writes a table to $BENCH_REPORT (default build/bench_report.md). BENCH_CASES="model B,..." and
# BENCH_STEPS choose the runs. With --dry-run it runs tiny shapes with
# train_gpt_cpu, to prove the script end to end; without a GPU and without it, an error (scripts/gpu_mode.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT=${BENCH_REPORT:-build/bench_report.md}
STEPS=${BENCH_STEPS:-30}
PY=python3
python3 -c 'import torch' 2>/dev/null || PY=/usr/bin/python3
W=$(mktemp -d /tmp/bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
source scripts/gpu_mode.sh
dry_run_or_gpu scripts/bench.sh "${1:-}"
if [ "$DRY_RUN" = 1 ]; then
    BIN=./train_gpt_cpu; T=64; CASES=("L2C64H4T64 2"); DEVICE=cpu; REF_FLAGS=(--dtype float32); STEPS=6
else
    BIN=./train_gpt; T=1024; CASES=("d12 16" "d24 8"); DEVICE=cuda; REF_FLAGS=(--dtype bfloat16 --compile)
    [ -n "${BENCH_CASES:-}" ] && IFS=, read -ra CASES <<< "$BENCH_CASES"   # e.g. BENCH_CASES="d12 16,d48 4"
fi
$PY scripts/make_shard.py -o "$W/data.bin" -n 4000000 -V 50257 --seed 11 >/dev/null
rows=()
for c in "${CASES[@]}"; do
    set -- $c
    model=$1 B=$2
    $BIN -e "$model" -i "$W/data.bin" -j "" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -l 1e-4 -o "$W/$model" > "$W/$model.txt" 2>&1 ||
        { tail -3 "$W/$model.txt"; exit 1; }
    # Median over the steps after the first 5 (warm-up: cuBLASLt heuristics, page faults, clocks).
    row=$($PY - "$W/$model/log.jsonl" "$model" "$B" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steady = recs[5:]
if not steady:
    sys.exit("error: %d steps leave none after the 5 warm-up steps (BENCH_STEPS > 5)" % len(recs))
tok = statistics.median(r["tok_s"] for r in steady)
ms = statistics.median(r["dt_ms"] for r in steady)
mfu = statistics.median(r["mfu"] for r in steady)
peak = max(r["peak_mem"] for r in recs) / 2**30
print("| train_gpt | %s | %s | %.1f | %.0f | %.1f%% | %.2f |" % (sys.argv[2], sys.argv[3], ms, tok, 100 * mfu, peak))
PY
)
    rows+=("$row")
    echo "$row"
done
ref_model=${CASES[0]%% *}
ref_B=${CASES[0]##* }
$PY scripts/reference.py -e "$ref_model" --bench --device $DEVICE "${REF_FLAGS[@]}" -b "$ref_B" -t "$T" -x 20 --bench-warmup 8 \
    --bench-out "$W/ref.jsonl" > "$W/ref.txt" 2>&1 || { tail -5 "$W/ref.txt"; exit 1; }
row=$($PY - "$W/ref.jsonl" "$ref_model" "$ref_B" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
mode = "torch %s, %s%s" % (r["torch"], r["dtype"], ", compiled" if r["compile"] else "")
print("| PyTorch reference (%s) | %s | %s | %.1f | %.0f | | %.2f |" % (mode, sys.argv[2], sys.argv[3],
      r["ms_per_step_median"], r["tok_s"], r.get("peak_mem_gib", 0.0)))
PY
)
rows+=("$row")
mkdir -p "$(dirname "$REPORT")"
{
    echo "# Benchmark"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "- device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "cpu (dry run)")"
    echo "- command: make bench (T=$T, $STEPS steps, median after 5 warm-up steps)"
    echo
    echo "| program | model | B | ms/step | tokens/s | MFU | peak GiB |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "reference raw: $(cat "$W/ref.jsonl")"
} > "$REPORT"
cat "$REPORT"
