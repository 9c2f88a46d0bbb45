#!/usr/bin/env bash
# run_emu.sh [--ci]: the kernel emulator's own checks. make test-emu runs them, then make test-gpu's script
# on the emulator (tests/gpu/run_gpu.sh --emu: every kernel at every small shape and dtype, the fallbacks,
# the step rows); tests/system/t_emu.sh, in `make test`, runs --ci: section 3 at one shape of each kind, no plants.
#   1. the runtime's own semantics (build/emu/test_runtime: each case, and each fault it must report)
#   2. the PTX layouts against plain products, the cuBLASLt stand-in against a float64 reference
#   3. kernel_check under the emulator against the CPU twins at make test-gpu's tolerances, with its
#      determinism rows (each kernel twice, the second in another thread and block order): with --ci, the
#      default kernels; in full, the kernel variants that are not library calls (GPT_CUDA_VARIANTS)
#   4. with --ci, the trainer on the emulated kernels against the CPU build (make test-emu: run_gpu.sh --emu)
#   5. in full, planted bugs, each reported (tests/emu/plant.sh)
# Protocol: "ok NAME" / "FAIL NAME: why" lines (tests/unit/testlib.h); exit 1 on any failure.
set -u
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-/usr/bin/python3}
ci=0
[ "${1:-}" = --ci ] && ci=1
failed=0
fail() { echo "FAIL $1: $2"; failed=1; }
# Shapes of tests/gpu/kernel_check.c, every path covered: tails (odd, hs64tail), head sizes 24/64/128 on the
# scalar and tensor-core attention, grouped-query ratios 1, 2, 3 and 4 (gqa4x2d64, gqa9x3d64, mqa4x1d32, gqa8x2d128), the
# norms' one-pass accumulators (norm400...), vocabulary tails, documents over four tiles (docs4x2d64; every shape
# also runs its kernels with documents), attention in chunks (chunk4x2d40, chunk3x3d128). --ci keeps one of each kind.
# The variants that are not library calls (cuDNN is not emulated): base/gpu_variants.h.
EMU_VARIANTS=bias_grad_epilogue,lt_plan_cache,lt_autotune,norm_one_pass,adamw_multi
if [ $ci = 1 ]; then
    SHAPES="odd,hs64tail,gqa9x3d64,docs4x2d64,chunk4x2d40" DTYPES="bf16" VARIANTS=""
else
    SHAPES="odd,hs24,hs128,hs64tail,norm400,norm1600,normrows,gqa8x2d128,gqa9x3d64,gqa4x2d64,mqa4x1d32,docs4x2d64,chunk4x2d40,chunk3x3d128"
    DTYPES="fp32 bf16 fp16" VARIANTS=$EMU_VARIANTS
fi

# 1. The runtime: cases that pass, and cases that must fault with the line naming the problem.
declare -A MUST_FAULT=(
    [missing_barrier]="race on shared memory"
    [warp_race]="race on shared memory"
    [write_write_race]="race on shared memory"
    [mask_mismatch]="names lanes that have returned"
    [bad_width]="width 12: the width must be a power of two"
    [global_oob]="past the end of the 400-byte allocation"
    [shared_oob]="past the block's 64 bytes"
    [host_touch]="host code touched device memory"
)
for c in $(build/emu/test_runtime list); do
    out=$(timeout 60 build/emu/test_runtime "$c" 2>&1); rc=$?
    if [ -n "${MUST_FAULT[$c]:-}" ]; then
        if [ $rc -eq 1 ] && grep -q "^emulator: .*${MUST_FAULT[$c]}" <<< "$out"; then echo "ok emu_runtime_$c"
        else fail "emu_runtime_$c" "expected a fault naming '${MUST_FAULT[$c]}', got (rc $rc): $(head -c 300 <<< "$out")"; fi
    elif [ $rc -eq 0 ] && grep -q "^ok $c" <<< "$out"; then echo "ok emu_runtime_$c"
    else fail "emu_runtime_$c" "rc $rc: $(head -c 300 <<< "$out")"; fi
done

# 2. The PTX and the cuBLASLt stand-in.
for t in test_ptx test_cublaslt; do
    out=$(timeout 300 "build/emu/$t" 2>/dev/null); rc=$?
    grep -E '^(ok|FAIL) ' <<< "$out" | sed "s/^\(ok\|FAIL\) /\1 emu_${t#test_}_/"
    [ $rc -eq 0 ] || fail "emu_$t" "exited $rc"
done

# 3. kernel_check under the emulator against the CPU twins.
work=$(mktemp -d /tmp/emu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
for dt in $DTYPES; do
    KERNEL_CHECK_SHAPES=$SHAPES GPT_CUDA_VARIANTS=$VARIANTS timeout 1500 build/kernel_check_emu "$work/emu_$dt" 11 "$dt" \
        > "$work/emu_$dt.log" 2>&1
    rc=$?
    grep -E '^(ok|FAIL) ' "$work/emu_$dt.log" | sed "s/^\(ok\|FAIL\) /\1 emu_${dt}_/"
    if [ $rc -ne 0 ]; then
        fail "emu_kernel_check_$dt" "kernel_check_emu exited $rc: $(grep -m1 '^emulator: \|error' "$work/emu_$dt.log")"
        continue
    fi
    KERNEL_CHECK_SHAPES=$SHAPES build/kernel_check_cpu "$work/cpu_$dt" 11 "$dt" > "$work/cpu_$dt.log" 2>&1 \
        || { fail "emu_kernel_check_cpu_$dt" "kernel_check_cpu failed"; continue; }
    "$PYTHON" tests/gpu/compare_kernels.py "$work/cpu_$dt" "$work/emu_$dt" "$dt" > "$work/cmp_$dt.log" 2>&1
    rc=$?
    n_ok=$(grep -c '^ok ' "$work/cmp_$dt.log")
    grep '^FAIL ' "$work/cmp_$dt.log"
    if [ $rc -eq 0 ] && [ "$n_ok" -gt 0 ]; then echo "ok emu_vs_cpu_$dt: $n_ok tensors within make test-gpu's tolerances${VARIANTS:+ (variants $VARIANTS)}"
    else fail "emu_vs_cpu_$dt" "compare_kernels.py exited $rc ($n_ok tensors passed)"; fi
done

# 4 (--ci). The trainer on the emulated kernels, device memory fenced from its host code: a GPT-2 in fp32 and
# a Llama (grouped-query heads of size 128, q/k norms) in bf16, three steps each against the CPU build.
# make test-emu runs make test-gpu's rows instead (run_gpu.sh --emu).
if [ $ci = 1 ]; then
    "$PYTHON" scripts/make_shard.py -o "$work/data.bin" -n 20000 -V 512 --seed 3 > /dev/null
    for m in "gpt2 L2C128H2V512T64 fp32 1e-5" "llama llama:L2,C128,H4,K2,D128,F256,V512,T64,qknorm bf16 1e-2"; do
        set -- $m
        ./train_gpt_cpu -e "$2" -i "$work/data.bin" -j "" -x 0 -s 0 -b 2 -t 32 -o "$work/init_$1" > /dev/null 2>&1
        run=(-e "$work/init_$1/ckpt_000000/model.bin" -i "$work/data.bin" -j "" -b 2 -t 32 -x 3 -s 0 -l 1e-3)
        ./train_gpt_cpu "${run[@]}" -p fp32 -o "$work/cpu_$1" > "$work/cpu_$1.txt" 2>&1
        timeout 600 build/train_gpt_emu "${run[@]}" -p "$3" -o "$work/emu_$1" > "$work/emu_$1.txt" 2>&1 ||
            { fail "emu_trainer_$1_$3" "train_gpt_emu failed: $(grep -m1 'error\|emulator:' "$work/emu_$1.txt")"; continue; }
        out=$("$PYTHON" tests/tools/compare.py log "emu_trainer_$1_$3_vs_cpu" "$work/emu_$1/log.jsonl" "$work/cpu_$1/log.jsonl" \
            --steps 3 --tol "$4" --key loss --key grad_norm 2>&1) || failed=1
        printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
    done
fi

# 5. Planted bugs.
if [ $ci = 0 ]; then bash tests/emu/plant.sh || failed=1; fi
exit $failed
