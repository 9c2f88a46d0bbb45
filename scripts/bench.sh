#!/usr/bin/env bash
# `make bench`: train_gpt's throughput, MFU and peak memory at T=1024 bf16 for GPT-2 124M (d12), 350M (d24) and
# 1558M (d48) and a Llama-style ~1B (Llama-3.2-1B's shape), then d12 under ZeRO-3 (against ZeRO-0 on one rank)
# and at each -r level (time and memory), next to the PyTorch reference (torch.compile, fused attention, fused
# AdamW) for d12 and the Llama on the same GPU in the same run. MFU by both formulas against the GPU's dense
# bf16 peak (H100/H200: 989 TFLOP/s): 6N + 12·L·A·T FLOPs per token (the trainer's; A = attention channels
# NH·D) and llm.c's 6N + 6·L·A·T. Writes a table to $BENCH_REPORT (default build/bench_report.md).
# BENCH_CASES="model B [flags] [NAME=value],..." and BENCH_STEPS choose the runs (NAME=value words are the run's
# environment: GPT_CUDA_VARIANTS=... times a kernel variant beside the default, as the default cases do for
# each); BENCH_REF_CASES="model B,..." the PyTorch rows. With --dry-run it runs tiny shapes with train_gpt_cpu,
# to prove the script end to end; without a GPU and without it, an error (scripts/gpu_mode.sh).
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
[ "$EMU" = 0 ] || { echo "error: scripts/bench.sh times a GPU; the kernel emulator proves what kernels compute, not their speed" >&2; exit 1; }
if [ "$DRY_RUN" = 1 ]; then
    BIN=./train_gpt_cpu; T=64; PREC=fp32; DEVICE=cpu; REF_FLAGS=(--dtype float32); STEPS=6
    small=L2C64H4T64 llama="llama:L2,C64,H4,K2,F160,T64"
    CASES=("$small 2" "$llama 2" "$small 2 -z 3" "$small 2 -r 1" "$small 2 -r 2" "$small 2 -r 3"
           "$small 2 GPT_CUDA_VARIANTS=${KERNEL_VARIANTS// /,}")
    REF_CASES=("$small 2" "$llama 2")
else
    BIN=./train_gpt; T=1024; PREC=bf16; DEVICE=cuda; REF_FLAGS=(--dtype bfloat16 --compile)
    CASES=("d12 16" "d24 8" "d48 4" "llama3.2-1b 4" "d12 16 -z 3" "d12 16 -r 1" "d12 16 -r 2" "d12 16 -r 3")
    # Each kernel variant beside the default (d12; cuDNN's attention on the Llama too), then those that keep
    # the bits from run to run together (all but lt_autotune).
    together="GPT_CUDA_VARIANTS=$(echo $KERNEL_VARIANTS | tr ' ' '\n' | grep -v '^lt_autotune$' | paste -sd,)"
    for v in $KERNEL_VARIANTS; do CASES+=("d12 16 GPT_CUDA_VARIANTS=$v"); done
    CASES+=("d12 16 $together" "llama3.2-1b 4 GPT_CUDA_VARIANTS=cudnn_attention" "llama3.2-1b 4 $together")
    REF_CASES=("d12 16" "llama3.2-1b 4")
    [ -n "${BENCH_CASES:-}" ] && IFS=, read -ra CASES <<< "$BENCH_CASES"   # e.g. BENCH_CASES="d12 16,d48 4 -r 1"
    [ -n "${BENCH_REF_CASES:-}" ] && IFS=, read -ra REF_CASES <<< "$BENCH_REF_CASES"
fi
$PY scripts/make_shard.py -o "$W/data.bin" -n 4000000 -V 50257 --seed 11 >/dev/null
rows=()
refs=()
n=0
for c in "${CASES[@]}"; do
    read -r model B extra <<< "$c"
    n=$((n + 1))
    # Words of the form NAME=value (GPT_CUDA_VARIANTS=...) are the run's environment; the rest are flags.
    envs=() args=()
    for word in $extra; do [[ "$word" =~ ^[A-Z_][A-Z0-9_]*= ]] && envs+=("$word") || args+=("$word"); done
    env "${envs[@]}" $BIN -e "$model" -i "$W/data.bin" -j "" -b "$B" -t "$T" -p "$PREC" -x "$STEPS" -v 0 -s 0 -l 1e-4 "${args[@]}" \
        -o "$W/run$n" > "$W/run$n.txt" 2>&1 || { tail -3 "$W/run$n.txt"; exit 1; }
    # Median over the steps after the first 5 (warm-up: cuBLASLt heuristics, page faults, clocks); the
    # second MFU takes 6·L·A·T per token off the first's FLOPs (the setup line gives L, NH and D).
    row=$($PY - "$W/run$n/log.jsonl" "$W/run$n.txt" "$model${extra:+ $extra}" "$B" "$T" <<'PY'
import json, re, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steady = recs[5:]
if not steady:
    sys.exit("error: %d steps leave none after the 5 warm-up steps (BENCH_STEPS > 5)" % len(recs))
setup = open(sys.argv[2]).readline()
L, C, NH = (int(re.search(r"\b%s=(\d+)" % k, setup).group(1)) for k in ("L", "C", "NH"))
D = int(re.search(r"\bD=(\d+)", setup).group(1)) if re.search(r"\bD=(\d+)", setup) else C // NH
T, peak = int(sys.argv[5]), 989e12
tok = statistics.median(r["tok_s"] for r in steady)
ms = statistics.median(r["dt_ms"] for r in steady)
mfu = statistics.median(r["mfu"] for r in steady)
mfu_llmc = mfu - 6.0 * L * NH * D * T * tok / peak if mfu > 0 else 0.0
peak_mem = max(r["peak_mem"] for r in recs) / 2**30
print("| train_gpt | %s | %s | %.1f | %.0f | %.1f%% | %.1f%% | %.2f |" % (sys.argv[3], sys.argv[4], ms, tok, 100 * mfu, 100 * mfu_llmc, peak_mem))
PY
)
    rows+=("$row")
    echo "$row"
done
for c in "${REF_CASES[@]}"; do
    read -r ref_model ref_B <<< "$c"
    rm -f "$W/ref.jsonl"
    $PY scripts/reference.py -e "$ref_model" --bench --device $DEVICE "${REF_FLAGS[@]}" -b "$ref_B" -t "$T" -x 20 --bench-warmup 8 \
        --bench-out "$W/ref.jsonl" > "$W/ref.txt" 2>&1 || { tail -5 "$W/ref.txt"; exit 1; }
    row=$($PY - "$W/ref.jsonl" "$ref_model" "$ref_B" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
mode = "torch %s, %s%s" % (r["torch"], r["dtype"], ", compiled" if r["compile"] else "")
print("| PyTorch reference (%s) | %s | %s | %.1f | %.0f | | | %.2f |" % (mode, sys.argv[2], sys.argv[3],
      r["ms_per_step_median"], r["tok_s"], r.get("peak_mem_gib", 0.0)))
PY
)
    rows+=("$row")
    echo "$row"
    refs+=("$(cat "$W/ref.jsonl")")
done
mkdir -p "$(dirname "$REPORT")"
{
    echo "# Benchmark"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "- device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "cpu (dry run)")"
    echo "- command: make bench (T=$T, $PREC, $STEPS steps, median after 5 warm-up steps)"
    echo
    echo "| program | model | B | ms/step | tokens/s | MFU 6N+12LAT | MFU 6N+6LAT (llm.c) | peak GiB |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    printf 'reference raw: %s\n' "${refs[@]}"
} > "$REPORT"
cat "$REPORT"
