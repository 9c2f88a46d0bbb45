# lib.sh: sourced by tests/system/t_*.sh. Same protocol as testlib.h: one "ok NAME" / "FAIL NAME: why" per check.
FAILED=0
PYTHON=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d /tmp/gpt-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
t_ok() { echo "ok $1"; }
t_fail() { echo "FAIL $1: $2"; FAILED=1; }
t_check() { if eval "$2"; then t_ok "$1"; else t_fail "$1" "${3:-$2}"; fi; }   # name, shell condition[, why]
t_finish() { exit "$FAILED"; }
# A check that cannot run here: "skip NAME: why", counted apart from passes and failures. t_missing is for
# what scripts/install_deps.sh test installs: under GPT_TEST_STRICT=1 (.ci/run, which installed it) its
# absence is a failure, not a skip.
t_skip() { echo "skip $1: $2"; }
t_missing() {   # name, what is missing
    if [ "${GPT_TEST_STRICT:-0}" = 1 ]; then t_fail "$1" "$2 is missing, though scripts/install_deps.sh test installs it"
    else t_skip "$1" "$2 is missing (scripts/install_deps.sh test installs it)"; fi
}
# The sum of the learning rates of steps 0..X-1 under -l LR -u U -q Q with the default cosine schedule
# (Q = 1: constant after the warm-up), as config_lr_at computes them. Adam moves a parameter by about lr per
# step at most, so this bounds the drift of the key bias, whose exact gradient is 0 (compare.py --kbias-bound).
lr_sum() {   # LR U X [Q]
    $PYTHON -c "import math, sys
lr, u, X, q = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
print(sum(lr * (s + 1) / u if s < u else q * lr + 0.5 * (1 + math.cos(math.pi * (s - u) / max(1, X - u))) * (lr - q * lr) for s in range(X)))" \
        "$1" "$2" "$3" "${4:-1}"
}
# Multi-rank tests. mpi_available: true when mpirun and an MPI build of train_gpt_cpu are both here; it sets
# MPIRUN (root allowed, oversubscribed, one OpenMP thread per rank) either way.
mpi_available() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
    command -v mpirun >/dev/null 2>&1 && ldd ./train_gpt_cpu | grep -q libmpi
}
# The pid of world rank R among the processes whose command line matches PATTERN (pgrep -f), from the
# launcher's environment (mpirun itself has no OMPI_COMM_WORLD_RANK); empty when there is none.
rank_pid() {   # pattern, rank
    local p
    for p in $(pgrep -f "$1"); do
        if [ "$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = "$2" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# SIGTERM to world rank RANK of a run started in the background, once its loop's handler is in (a second after
# the start-up's memory line appears in its output OUT); sets VICTIM (empty: no such rank) and T0 (ms).
term_rank_when_running() {   # output file, pgrep pattern, rank
    for _ in $(seq 1200); do grep -q '^memory (rank 0)' "$1" && break; sleep 0.05; done
    sleep 1
    VICTIM=$(rank_pid "$2" "$3")
    T0=$(now_ms)
    [ -n "$VICTIM" ] && kill -TERM "$VICTIM"
}
mpi_or_skip() {   # name: prints a skip line and exits when MPI is missing
    if ! mpi_available; then
        t_missing "$1" "MPI (train_gpt_cpu was built without it: install openmpi-bin libopenmpi-dev and rebuild)"
        t_finish
    fi
}
# tests/tools/compare.py (log, models, grads, array, scalar: see its -h) as checks. One compare.py process serves
# a whole script ("compare.py serve", started on first use): its torch import, which the model comparisons
# need, takes longer than most comparisons. Call these in the script's own shell, not inside $(...): a
# process started in a subshell would be started again on every call.
compare_out() {   # compare.py arguments...: its output lines in CMP_OUT; status 1 on a FAIL or no answer
    if [ -z "${CMP_PID:-}" ] || [ -z "${CMP[1]:-}" ] || ! kill -0 "$CMP_PID" 2>/dev/null; then
        coproc CMP { exec "$PYTHON" tests/tools/compare.py serve; }
    fi
    local line args answered=0
    printf -v args '%s\t' "$@"
    printf '%s\n' "${args%$'\t'}" >&"${CMP[1]}"
    CMP_OUT=""
    while IFS= read -r line <&"${CMP[0]}"; do
        [ "$line" = "# compare.py done" ] && { answered=1; break; }
        CMP_OUT+=$line$'\n'
    done
    [ $answered = 1 ] || CMP_OUT+="FAIL $2: compare.py stopped without answering"$'\n'
    ! grep -q '^FAIL' <<< "$CMP_OUT" && grep -q '^ok' <<< "$CMP_OUT"
}
compare_py() {   # compare.py arguments...: prints its ok/FAIL lines and records a failure
    compare_out "$@" || FAILED=1
    grep -E '^(ok|FAIL) ' <<< "$CMP_OUT"
    grep -qE '^(ok|FAIL) ' <<< "$CMP_OUT" || t_fail "$2" "compare.py printed nothing"
}
# py_check NAME ARGS... <<'PY' ... PY: runs the Python program on stdin with ARGS. Its last line "ok" passes
# NAME; anything else (its reason, or the traceback when it crashed) fails it: a crashed check never vanishes.
py_check() {
    local name=$1 out; shift
    out=$($PYTHON - "$@" 2>&1)
    if [ "$(tail -1 <<< "$out")" = ok ]; then t_ok "$name"; else t_fail "$name" "$(tail -1 <<< "$out")"; fi
}
# Every validation loss of a run's log equals the reference log's, to 1e-5 relative.
val_losses_match() {   # name, log.jsonl, reference log.jsonl
    $PYTHON - "$1" "$2" "$3" <<'PY'
import json, sys
name, a, b = sys.argv[1:4]
val = lambda p: {r["step"]: r["val_loss"] for r in map(json.loads, open(p)) if "val_loss" in r}
x, y = val(a), val(b)
bad = [s for s in y if s not in x or abs(x[s] - y[s]) > 1e-5 * abs(y[s])]
print("ok %s" % name if y and not bad else "FAIL %s: steps %s differ (%d reference values)" % (name, bad, len(y)))
PY
    [ $? -eq 0 ] || FAILED=1
}
# A random-init model.bin for SPEC (an -e model string) written once, so every run of a test starts from the
# same weights whatever its layout; sets MODEL.
init_model() {   # spec, data shard
    ./train_gpt_cpu -e "$1" -i "$2" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/init" >/dev/null 2>&1
    MODEL="$TMP/init/ckpt_000000/model.bin"
    t_check init_model "[ -s '$MODEL' ]"
}
# The step records' loss, lr and grad_norm, as text (for bit-for-bit comparisons).
fields() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
# train_gpt_cpu with the script's flags (the array `base`) and these, on NP ranks (mpirun above one); its
# output in OUT.txt.
train() {   # ranks, out dir, flags...
    local np=$1 out=$2; shift 2
    if [ "$np" -gt 1 ]; then "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1
    else ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1; fi
}
# --estimate -w NP with the script's flags (the array `base`) and these into OUT_DIR/NAME.plan, then the run
# itself on NP ranks into OUT_DIR/NAME (its output in NAME.txt); status 1, the check NAME failed, when either
# fails.
plan_and_train() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    ./train_gpt_cpu "${base[@]}" "$@" --estimate -w "$np" > "$TMP/$name.plan" 2>&1 ||
        { t_fail "$name" "--estimate failed: $(tail -1 "$TMP/$name.plan")"; return 1; }
    if [ "$np" -gt 1 ]; then
        mpi_available || { t_missing "$name" MPI; return 1; }
        "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" > "$TMP/$name.txt" 2>&1
    else
        ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" > "$TMP/$name.txt" 2>&1
    fi || { t_fail "$name" "the run failed: $(grep -m1 error "$TMP/$name.txt")"; return 1; }
}
# Same log fields and same checkpoint files (model.bin, every state file) at step STEP.
same_run() {   # name, dir a, dir b, step
    local a=$2 b=$3 ck=ckpt_$(printf %06d "$4") bad=""
    [ -n "$(fields "$a/log.jsonl")" ] || bad="no steps in $a/log.jsonl"
    [ -z "$bad" ] && ! diff <(fields "$a/log.jsonl") <(fields "$b/log.jsonl") > /dev/null && bad="losses or norms differ"
    for f in "$a/$ck"/model.bin "$a/$ck"/state_rank*.bin; do
        [ -z "$bad" ] && { [ -s "$f" ] || bad="$f missing"; }
        [ -z "$bad" ] && ! cmp -s "$f" "$b/$ck/$(basename "$f")" && bad="$(basename "$f") differs"
    done
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad"; fi
}
