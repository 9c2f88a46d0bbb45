#!/usr/bin/env bash
# Fuzzes every file reader (token shards, model files, tokenizer files, checkpoint directories, evaluation
# files) with AFL++ under AddressSanitizer + UBSan: one "ok fuzz_<reader>" per reader when the campaign found no
# crash, sanitizer report, broken exit contract (see tests/fuzz/harness.h) or hang.
#   bash tests/system/t_fuzz.sh                     ~10 s per reader, two at a time (the default for make test)
#   FUZZ_SECONDS=600 bash tests/system/t_fuzz.sh    deeper runs
#   FUZZ_READERS="model tokenizer"           a subset; FUZZ_JOBS=N readers at a time (default 2)
# Findings stay in build/fuzz/out/<reader>/default/{crashes,hangs}; replay one with
#   build/fuzz/fuzz_<reader> FILE
# A missing afl++ is a failure, not a skip: the readers would go unchecked.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
SECONDS_EACH=${FUZZ_SECONDS:-10}
READERS=${FUZZ_READERS:-dataloader model tokenizer checkpoint evalfile}
JOBS=${FUZZ_JOBS:-2}
FB=${FUZZ_BUILD:-build/fuzz}   # build.sh reads the same variable

if ! command -v afl-fuzz >/dev/null || ! command -v afl-clang-fast >/dev/null; then
    t_fail fuzz_tools "afl-fuzz / afl-clang-fast not found: install the Debian package afl++"
    t_finish
fi
if ! bash tests/fuzz/build.sh $READERS >"$TMP/build.log" 2>&1; then
    t_fail fuzz_build "tests/fuzz/build.sh failed: $(tail -3 "$TMP/build.log" | tr '\n' ' ')"
    t_finish
fi
rm -rf "$FB/seeds" "$FB"/*.dict
"$PYTHON" tests/fuzz/make_seeds.py "$FB" || { t_fail fuzz_seeds "make_seeds.py failed"; t_finish; }

# The harness's own exit check (harness.h) aborts on a broken contract; replays print what the reader said.
export ASAN_OPTIONS=abort_on_error=1:symbolize=0:detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=2048
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1:symbolize=0
export TMPDIR=$TMP   # the harnesses' scratch directories, including any a crash leaves behind

# Before fuzzing: valid seeds load, bad ones end in one "error:" line. Otherwise the harness never gets
# past the first check and the fuzzing proves nothing.
for r in $READERS; do
    bad=""
    ls "$FB/seeds/$r"/valid_* "$FB/seeds/$r"/bad_* > /dev/null 2>&1 || bad=" (no valid_ and bad_ seeds to check)"
    for f in "$FB/seeds/$r"/*; do
        "$FB/fuzz_$r" "$f" >/dev/null 2>"$TMP/seed.err"; rc=$?
        case "$(basename "$f")" in
            valid_*) [ $rc -eq 0 ] || bad="$bad $(basename "$f")(exit $rc: $(head -1 "$TMP/seed.err"))" ;;
            bad_*) [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/seed.err")" -eq 1 ] && grep -q '^error: ' "$TMP/seed.err" ||
                bad="$bad $(basename "$f")(exit $rc)" ;;
        esac
    done
    if [ -z "$bad" ]; then t_ok "fuzz_seeds_$r"; else t_fail "fuzz_seeds_$r" "$bad"; fi
done

export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_FAST_CAL=1
fuzz_one() {   # reader
    local r=$1
    rm -rf "$FB/out/$r"
    mkdir -p "$FB/out"
    # -t: a generous per-input limit (ms) for ASan on a loaded 2-core machine; a real hang is unbounded.
    timeout -k 10 $((SECONDS_EACH + 120)) afl-fuzz -i "$FB/seeds/$r" -o "$FB/out/$r" -x "$FB/$r.dict" -m none \
        -t 2000 -V "$SECONDS_EACH" -- "$FB/fuzz_$r" @@ >"$FB/out/$r.log" 2>&1
    echo $? >"$FB/out/$r.rc"
}
running=0
for r in $READERS; do
    fuzz_one "$r" &
    running=$((running + 1))
    if [ $running -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait

afl_stat() { sed -n "s/^$2 *: *//p" "$FB/out/$1/default/fuzzer_stats" 2>/dev/null; }
for r in $READERS; do
    if [ ! -f "$FB/out/$r/default/fuzzer_stats" ]; then
        t_fail "fuzz_$r" "afl-fuzz did not run (exit $(cat "$FB/out/$r.rc")): $(grep -m1 -E 'PROGRAM ABORT|ERROR' "$FB/out/$r.log")"
        continue
    fi
    crashes=$(find "$FB/out/$r/default/crashes" -name 'id:*' | wc -l)
    hangs=$(find "$FB/out/$r/default/hangs" -name 'id:*' | wc -l)
    echo "# fuzz $r: $(afl_stat "$r" execs_done) inputs in $(afl_stat "$r" run_time) s, $(afl_stat "$r" corpus_count) in corpus," \
         "$(afl_stat "$r" bitmap_cvg) coverage, $crashes crashes, $hangs hangs"
    execs=$(afl_stat "$r" execs_done)
    if [ "$(cat "$FB/out/$r.rc")" != 0 ] || [ "${execs:-0}" -eq 0 ]; then
        t_fail "fuzz_$r" "afl-fuzz exited $(cat "$FB/out/$r.rc") after ${execs:-0} inputs: $(grep -m1 -E 'PROGRAM ABORT|ERROR' "$FB/out/$r.log")"
    elif [ "$crashes" -eq 0 ] && [ "$hangs" -eq 0 ]; then
        t_ok "fuzz_$r"
    else
        first=$(find "$FB/out/$r/default/crashes" "$FB/out/$r/default/hangs" -name 'id:*' | head -1)
        why=$(ASAN_OPTIONS=${ASAN_OPTIONS/symbolize=0/symbolize=1} timeout 10 "$FB/fuzz_$r" "$first" 2>&1 |
              grep -m1 -E 'ERROR: AddressSanitizer|runtime error|fuzz:|SUMMARY' || echo "timed out")
        t_fail "fuzz_$r" "$crashes crashes, $hangs hangs in $FB/out/$r/default; e.g. $first: $why"
    fi
done
t_finish
