#!/usr/bin/env bash
# The C test programs again, built with AddressSanitizer, LeakSanitizer and UBSan into build/asan (-O1):
# what their own checks cannot see, because the values still come out right, fails here: a read or write
# past a buffer (a loop bound off by one that reads the next allocation, or a binary search one slot too
# far), a leak (a scratch buffer or a schedule's tables never freed), a use after free, undefined behaviour.
# One "ok sanitize_<program>" per program whose checks all pass with no sanitizer report. The programs that
# start MPI (test_comm, test_copies) run without leak detection: MPI's own allocations, some in plugins it
# has unloaded by then, read as leaks. A missing libasan is a
# failure, not a skip. The kernels' operands are be_malloc'd with 64-byte rounding, which hides a small
# overrun from ASan; test_kernels' own guard pages (its *_bounds_* checks) cover those.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
AB=build/asan
PROGS=()   # every tests/unit/test_*.c
for f in tests/unit/test_*.c; do PROGS+=("$(basename "$f" .c)"); done
starts_mpi() { grep -q 'comm_init_world' "tests/unit/$1.c"; }
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# CFLAGS from the environment takes the place of the Makefile's -O3 -march=native (its warnings, includes
# and -fopenmp are still added); CC carries the sanitizers to the link. .SECONDARY keeps the test objects,
# so a second run rebuilds only what changed.
if ! CFLAGS="-O1 -g" make -s B=$AB CC="${CC:-gcc} $SAN" --eval=.SECONDARY: "${PROGS[@]/#/$AB/}" > "$TMP/build.log" 2>&1; then
    t_fail sanitize_build "the sanitizer build failed (is libasan installed?): $(grep -m1 -i error "$TMP/build.log")"
    t_finish
fi
export UBSAN_OPTIONS=print_stacktrace=1
for p in "${PROGS[@]}"; do
    leaks=1; starts_mpi "$p" && leaks=0
    out=$(ASAN_OPTIONS=detect_leaks=$leaks "$AB/$p" 2>&1); rc=$?
    report=$(grep -m1 -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' <<< "$out")
    nfail=$(grep -c '^FAIL' <<< "$out")
    if [ $rc -eq 0 ] && [ -z "$report" ] && [ "$nfail" -eq 0 ] && grep -q '^ok' <<< "$out"; then
        t_ok "sanitize_$p"
    else
        t_fail "sanitize_$p" "exit $rc, $nfail FAIL lines; ${report:-$(grep -m1 '^FAIL' <<< "$out")} $(grep -m2 -E '^ +#[0-9]+ ' <<< "$out" | tr -s ' ' | tr '\n' ' ')"
    fi
done
t_finish
