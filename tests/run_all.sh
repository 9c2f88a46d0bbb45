#!/usr/bin/env bash
# Runs every CPU test: the C test programs in build/, then each tests/system/t_*.sh script. Every check prints
# "ok NAME" or "FAIL NAME: why"; a program or script that exits non-zero without printing a FAIL counts
# as one failure of its own; "skip NAME: why" is a check that cannot run here. Each program's or script's
# wall time follows as a "# NAME: N s" line. Last line: "N passed, N failed, N skipped". Exit status 1 if
# anything failed.
set -u
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-/usr/bin/python3}
passed=0
failed=0
skipped=0
run_one() {   # name, command...
    local name=$1; shift
    local out rc start=$SECONDS
    out=$("$@" 2>&1); rc=$?
    echo "# $name: $((SECONDS - start)) s"   # where the suite's time goes
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) ' || true
    local p f s
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^skip ')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited $rc without reporting a failure; last lines:"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
        f=1
    fi
    if [ "$rc" -eq 0 ] && [ "$f" -ne 0 ]; then
        echo "FAIL $name: reported failures but exited 0"
        f=$((f + 1))
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}
for t in build/test_*; do
    [ -x "$t" ] && run_one "$(basename "$t")" "$t"
done
for s in tests/system/t_*.sh; do
    [ -f "$s" ] && run_one "$(basename "$s")" bash "$s"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
