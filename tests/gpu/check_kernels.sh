#!/usr/bin/env bash
# check_kernels.sh: every kernel of the CUDA backend against its CPU twin. Builds nothing (make does:
# build/kernel_check_cpu and build/kernel_check_gpu). For each seed and dtype it runs both binaries on the
# same seeded inputs and compares their outputs with compare_kernels.py; then once more with the fused
# cuBLASLt epilogues and the tensor-core attention switched off, to check the explicit fallbacks.
#
#   bash tests/gpu/check_kernels.sh [--dry-run|--emu]
#
# With --dry-run the CPU binary stands in for the GPU one: the comparison is CPU against CPU, which
# proves the scripts end to end (without a GPU and without --dry-run: an error, scripts/gpu_mode.sh). Environment: SEEDS (default "1 2"),
# DTYPES (default "fp32 bf16 fp16"), KERNEL_CHECK_SHAPES (default all; e.g. "odd,hs24"), KC_KEEP=1 keeps
# the output directories, KC_FALLBACK=0 skips the fallback pass, KC_BENCH=0 the timings that end a GPU run
# (KC_BENCH_VARIANTS names the kernel variants timed beside the default). Output: the comparison
# tables, "ok NAME" / "FAIL NAME: why" lines, and last "N passed, N failed". Exit status 1 on any failure.
set -u
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-"1 2"}
DTYPES=${DTYPES:-"fp32 bf16 fp16"}
CPU_BIN=build/kernel_check_cpu
GPU_BIN=build/kernel_check_gpu
source scripts/gpu_mode.sh
dry_run_or_gpu tests/gpu/check_kernels.sh "${1:-}"
DRY=$DRY_RUN
if [ "$EMU" = 1 ]; then
    echo "check_kernels: the CUDA kernels under the kernel emulator (tests/emu) against the CPU build"
    GPU_BIN=build/kernel_check_emu
    SEEDS=${SEEDS_EMU:-1}
    export KERNEL_CHECK_SHAPES=${KERNEL_CHECK_SHAPES:-odd,hs24,hs128,hs64tail,norm400,normrows,gqa8x2d128,gqa9x3d64,gqa4x2d64,mqa4x1d32,docs4x2d64,chunk4x2d40,chunk3x3d128}
elif [ "$DRY" = 1 ]; then
    echo "check_kernels: dry run (no GPU): comparing the CPU build against itself"
    GPU_BIN=$CPU_BIN
fi
# python3 with numpy: the GPU machine's python3 has it; elsewhere fall back to the system one.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import numpy' 2>/dev/null; then PY=/usr/bin/python3; fi

WORK=$(mktemp -d /tmp/kernel_check.XXXXXX)
[ "${KC_KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0
count() {   # add up the ok / FAIL lines of a log; a non-zero exit without a FAIL line is a failure too
    local log=$1 rc=$2 name=$3 p f
    grep -E '^(ok|FAIL) ' "$log" | grep -v '^ok ' || true
    p=$(grep -c '^ok ' "$log")
    f=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited $rc without reporting a failure; last lines:"
        tail -5 "$log" | sed 's/^/    /'
        f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
}

for f in "$CPU_BIN" "$GPU_BIN"; do
    if [ ! -x "$f" ]; then
        echo "FAIL check_kernels: $f is missing (make $f)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

# run_pair LABEL SEED DTYPE [ENV...]: both builds on one seed and dtype, then the comparison.
run_pair() {
    local label=$1 seed=$2 dt=$3; shift 3
    local ref=$WORK/cpu_$label cand=$WORK/gpu_$label
    local t0=$SECONDS
    # The two binaries use different hardware, so they run side by side.
    "$CPU_BIN" "$ref" "$seed" "$dt" >"$WORK/cpu_$label.log" 2>&1 &
    local cpu_pid=$!
    env "$@" "$GPU_BIN" "$cand" "$seed" "$dt" >"$WORK/gpu_$label.log" 2>&1
    local grc=$?
    wait "$cpu_pid"
    local crc=$?
    echo "== $label: seed $seed, $dt ($((SECONDS - t0)) s to run both builds)"
    count "$WORK/cpu_$label.log" "$crc" "kernel_check_cpu_$label"
    count "$WORK/gpu_$label.log" "$grc" "kernel_check_gpu_$label"
    "$PY" tests/gpu/compare_kernels.py "$ref" "$cand" "$dt" "$label" >"$WORK/cmp_$label.log" 2>&1
    local rc=$?
    grep -v -E '^(ok|FAIL) ' "$WORK/cmp_$label.log"
    count "$WORK/cmp_$label.log" "$rc" "compare_$label"
    [ "${KC_KEEP:-0}" = 1 ] || rm -rf "$ref" "$cand"
}

for seed in $SEEDS; do
    for dt in $DTYPES; do
        run_pair "${dt}_s${seed}" "$seed" "$dt"
    done
done
# The fallback paths on one seed: plain products + separate GELU / bias-gradient kernels, and the
# CUDA-core attention forward where the tensor-core one would run (KC_FALLBACK=0 skips them).
first_seed=${SEEDS%% *}
if [ "${KC_FALLBACK:-1}" = 1 ]; then
    for dt in $DTYPES; do
        run_pair "${dt}_s${first_seed}_fallback" "$first_seed" "$dt" GPT_CUDA_NO_FUSED_EPILOGUES=1 GPT_CUDA_ATTENTION_SCALAR=1
    done
fi

# Timings at GPT-2 124M training sizes (GPU only; KC_BENCH=0 skips): the default kernels, then each kernel
# variant of KC_BENCH_VARIANTS (default: every one, $KERNEL_VARIANTS of gpu_mode.sh) in the same run, side by side.
if [ "$DRY" = 0 ] && [ "${KC_BENCH:-1}" = 1 ]; then
    for variant in default ${KC_BENCH_VARIANTS-$KERNEL_VARIANTS}; do
        [ "$variant" = default ] && set_variant="" || set_variant=$variant
        for dt in bf16 fp32; do
            echo "== bench $dt, kernels: $variant (B=8, T=1024, C=768, NH=12)"
            GPT_CUDA_VARIANTS=$set_variant KERNEL_CHECK_BENCH=1 KERNEL_CHECK_SHAPES=none "$GPU_BIN" "$WORK/bench_$dt" 1 "$dt" \
                >"$WORK/bench_$dt.log" 2>&1
            rc=$?
            grep '^bench ' "$WORK/bench_$dt.log" | sed "s/^bench /bench [$variant] /"
            count "$WORK/bench_$dt.log" "$rc" "bench_${dt}_$variant"
        done
    done
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
