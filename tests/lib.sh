# lib.sh: sourced by tests/t_*.sh. Same protocol as testlib.h: one "ok NAME" / "FAIL NAME: why" per check.
FAILED=0
PYTHON=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d /tmp/gpt-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
t_ok() { echo "ok $1"; }
t_fail() { echo "FAIL $1: $2"; FAILED=1; }
t_check() { if eval "$2"; then t_ok "$1"; else t_fail "$1" "${3:-$2}"; fi; }   # name, shell condition[, why]
t_finish() { exit "$FAILED"; }
# Multi-rank tests: sets MPIRUN (root allowed, oversubscribed, one OpenMP thread per rank), or prints a skip
# line and exits when mpirun or an MPI build of train_gpt_cpu is missing.
mpi_or_skip() {   # name
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
    if ! command -v mpirun >/dev/null 2>&1 || ! ldd ./train_gpt_cpu | grep -q libmpi; then
        echo "skip $1: train_gpt_cpu was built without MPI (install openmpi-bin libopenmpi-dev and rebuild)"
        t_finish
    fi
}
