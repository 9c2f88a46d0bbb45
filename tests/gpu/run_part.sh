#!/usr/bin/env bash
# The GPU checks in three parts, one per invocation, each short enough for a per-command time limit: each
# builds for this GPU's architecture only and copies its report, stamped with date, device and commit, to
# $OUT (default build/gpu_parts).
#
#   bash tests/gpu/run_part.sh test       make test-gpu-core (kernel checks: seed 1, fp32 and bf16)
#   bash tests/gpu/run_part.sh variants   make test-gpu-variants: the kernel variants' rows
#   bash tests/gpu/run_part.sh bench      make bench: d12 and d24 beside the PyTorch reference
#   bash tests/gpu/run_part.sh offload    make bench-offload: d48 with and without -offload, the largest model
#
# Commit the reports under reports/ with the date and device in the name, and set each prediction's outcome
# in reports/perf_notes.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
part=${1:-}
case "$part" in
    test) target=test-gpu-core; report=build/gpu_report.md ;;
    variants) target=test-gpu-variants; report=build/gpu_variants_report.md ;;
    bench) target=bench; report=build/bench_report.md ;;
    offload) target=bench-offload; report=build/bench_offload.md ;;
    *) echo "usage: bash tests/gpu/run_part.sh test|variants|bench|offload" >&2; exit 2 ;;
esac
command -v nvidia-smi >/dev/null 2>&1 || { echo "error: no GPU here (nvidia-smi not found)" >&2; exit 1; }
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
[[ "$cap" =~ ^[0-9]+$ ]] || { echo "error: cannot read the GPU's compute capability (got '$cap')" >&2; exit 1; }
device=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit + uncommitted changes"
out=${OUT:-build/gpu_parts}
mkdir -p "$out" build
log="$out/${part}.log"
rm -f "$report"   # a warm machine keeps build/: never stamp an earlier call's report as this one's
start=$(date +%s)
set +e
SEEDS=1 DTYPES="fp32 bf16" make -s -j"$(nproc)" GPU_ARCHS="$cap" "$target" > "$log" 2>&1
rc=$?
set -e
{
    echo "<!-- run_part.sh $part: $(date -u +%Y-%m-%dT%H:%MZ), $device (sm_$cap), commit $commit, exit $rc, $(( $(date +%s) - start )) s -->"
    [ -f "$report" ] && cat "$report" || echo "(no report: see ${part}.log)"
} > "$out/${part}_report.md"
tail -3 "$log"
echo "report: $out/${part}_report.md (exit $rc)"
exit $rc
