# lib.sh: sourced by tests/t_*.sh. Same protocol as testlib.h: one "ok NAME" / "FAIL NAME: why" per check.
FAILED=0
PYTHON=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d /tmp/gpt-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
t_ok() { echo "ok $1"; }
t_fail() { echo "FAIL $1: $2"; FAILED=1; }
t_check() { if eval "$2"; then t_ok "$1"; else t_fail "$1" "${3:-$2}"; fi; }   # name, shell condition[, why]
t_finish() { exit "$FAILED"; }
