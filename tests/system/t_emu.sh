#!/usr/bin/env bash
# The kernel emulator (tests/emu/README.md) in `make test`: its runtime's semantics and faults, the PTX and
# cuBLASLt stand-ins, and the CUDA kernels' own source at one shape of each kind against the CPU twins
# (tests/emu/run_emu.sh --ci). make test-emu runs the whole: every shape and dtype, the kernel variants,
# the planted bugs and make test-gpu's step rows. And every kernel file compiles alone (make kernels-alone, the
# emulator's clang on each kernels/*.cuh and kernels/variants/*.cuh as a translation unit of its one #include), so
# none depends on what another included before it or on struct Backend's fields.
cd "$(dirname "$0")/../.."
source tests/system/lib.sh
for b in build/kernel_check_emu build/emu/test_runtime build/emu/test_ptx build/emu/test_cublaslt; do
    if [ ! -x "$b" ]; then
        command -v clang++ >/dev/null || { t_missing emu "clang++ (Debian's clang)"; t_finish; }
        t_fail emu_built "$b is missing (make tests-bin builds it)"
        t_finish
    fi
done
if make -s -j2 kernels-alone > "$TMP/alone.log" 2>&1; then t_ok kernels_compile_alone
else t_fail kernels_compile_alone "$(grep -m3 -E 'error|Error' "$TMP/alone.log")"; fi
out=$(bash tests/emu/run_emu.sh --ci 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) '
printf '%s\n' "$out" | grep -q '^FAIL ' && FAILED=1
[ $rc -eq 0 ] || { printf '%s\n' "$out" | grep -q '^FAIL ' || t_fail emu_run_emu "run_emu.sh --ci exited $rc"; }
t_finish
