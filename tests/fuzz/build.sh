#!/usr/bin/env bash
# Builds the fuzz harnesses with AFL++'s compiler wrapper, AddressSanitizer and UBSan (every UB report
# aborts, so the fuzzer sees it as a crash), into build/fuzz/ (override with FUZZ_BUILD=DIR).
# Independent of the Makefile on purpose: other flags, another compiler, and it must build while the
# trainer's own build is mid-change. Usage: bash tests/fuzz/build.sh [harness ...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${FUZZ_BUILD:-build/fuzz}
CC=${FUZZ_CC:-afl-clang-fast}
command -v "$CC" >/dev/null || { echo "error: $CC not found (Debian package afl++)" >&2; exit 1; }
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
BASE="-g -O1 -std=gnu11 -I. $SAN"
# The project's own sources: their warnings are the Makefile's business (gcc, -Werror); clang's extra
# opinions must not stop the fuzzing. No -fopenmp: no reader needs threads, and threads do not survive
# the fork server's fork().
# They go into one archive, so each harness links only what its reader reaches.
# Every core module (the model families too) but the MPI and NCCL collectives and the tokenizer helper's own main.
PROJ="base/*.c $(ls core/*/*.c core/models/*/*.c | grep -v -e /comm_mpi.c -e /comm_nccl.c -e /watchdog.c -e /tokenizer_tool.c | tr '\n' ' ') zero.c
      $(ls kernels/*.c)"
HARNESSES=${*:-dataloader model tokenizer checkpoint evalfile}
mkdir -p "$OUT/obj"
export AFL_QUIET=1
objs=()
pids=()
for src in $PROJ tests/fuzz/harness.c; do
    o="$OUT/obj/$(echo "$src" | tr / _).o"
    [ "$src" = tests/fuzz/harness.c ] || objs+=("$o")
    warn="-w"
    [ "$src" = tests/fuzz/harness.c ] && warn="-Wall -Wextra -Werror"
    $CC $BASE $warn -c "$src" -o "$o" &
    pids+=($!)
    # Two compilers at a time: the machines this runs on have two cores.
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
rm -f "$OUT/libproj.a"
ar rcs "$OUT/libproj.a" "${objs[@]}"
for h in $HARNESSES; do
    $CC $BASE -Wall -Wextra -Werror -o "$OUT/fuzz_$h" "tests/fuzz/fuzz_$h.c" "$OUT/obj/tests_fuzz_harness.c.o" "$OUT/libproj.a" -lm
done
echo "built: $(for h in $HARNESSES; do printf '%s ' "$OUT/fuzz_$h"; done)"
