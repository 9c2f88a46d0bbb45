#!/usr/bin/env bash
# Signals and the first hour: SIGINT during start-up ends the trainer at once; from the training loop on, one
# SIGTERM finishes the step and exits 0, a second one ends the process at once (tests/system/t_faults.sh checks the
# checkpoint and resume of the first), and a SIGTERM during a long validation stops it between two rounds on
# every rank. Under mpirun an error every rank hits is printed once, as one whole
# line, and one only rank 1 hits is still printed; each rank runs cores/ranks OpenMP threads unless
# OMP_NUM_THREADS says otherwise. Every run sits under `timeout` so a trainer that ignores its signals fails
# the test instead of hanging it.
# run_all: alone
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 3 >/dev/null

# Starts the trainer under `timeout` in the background (which also gives it SIGINT's default action: a
# script's background jobs start with SIGINT ignored); sets TPID (timeout's pid) and PID (the trainer's).
start_trainer() {   # name, args...
    local name=$1; shift
    timeout -k 5 120 ./train_gpt_cpu "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
    TPID=$!
    PID=
    for _ in $(seq 100); do PID=$(pgrep -P "$TPID") && break; sleep 0.05; done
}
wait_for_step_line() {   # name: until the first training step is reported (then the loop's handler is in)
    for _ in $(seq 1200); do grep -qE '^step +[0-9]+/[0-9]+ \| loss' "$TMP/$1.out" && return 0; sleep 0.05; done
    return 1
}

# (a) Start-up: d12's random init takes several seconds here; SIGINT one second in must end it at once.
start_trainer startup -e d12 -i "$TMP/data.bin" -j "" -b 1 -t 64 -x 1 -s 0
sleep 1
in_startup=$(grep -c '^model ' "$TMP/startup.out")
t0=$(now_ms)
kill -INT "$PID"
wait "$TPID"; rc=$?
ms=$(( $(now_ms) - t0 ))
t_check sigint_during_startup_ends_at_once "[ '$in_startup' = 0 ] && [ $rc -eq 130 ] && [ $ms -lt 2000 ]" \
    "still in start-up: $in_startup = 0; exit $rc (130 = SIGINT), $ms ms after the signal"

# (b) A step of several seconds (attention over t=512 on 2 cores).
long=(-e L4C512H8V512T512 -i "$TMP/data.bin" -j "" -b 3 -t 512 -x 6 -s 0 -v 0)
start_trainer twice "${long[@]}"
if wait_for_step_line twice; then
    kill -TERM "$PID"
    sleep 0.5
    t0=$(now_ms)
    kill -TERM "$PID"
    wait "$TPID"; rc=$?
    ms=$(( $(now_ms) - t0 ))
    t_check second_sigterm_ends_step_at_once "[ $rc -eq 143 ] && [ $ms -lt 2000 ]" "exit $rc (143 = SIGTERM), $ms ms after the second signal"
else
    kill -KILL "$PID" 2>/dev/null; wait "$TPID"
    t_fail second_sigterm_ends_step_at_once "no training step reported: $(head -c 300 "$TMP/twice.err")"
fi

start_trainer once "${long[@]}"
if wait_for_step_line once; then
    kill -TERM "$PID"
    wait "$TPID"; rc=$?
    t_check one_sigterm_finishes_step "[ $rc -eq 0 ] && grep -q 'stopped by a signal after step' '$TMP/once.out'" \
        "exit $rc; $(tail -c 300 "$TMP/once.out") $(head -c 300 "$TMP/once.err")"
else
    kill -KILL "$PID" 2>/dev/null; wait "$TPID"
    t_fail one_sigterm_finishes_step "no training step reported: $(head -c 300 "$TMP/once.err")"
fi

# SIGINT is caught the same way (a small model: only the exit path matters here).
start_trainer sigint -e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 100000 -s 0 -v 0
if wait_for_step_line sigint; then
    kill -INT "$PID"
    wait "$TPID"; rc=$?
    t_check one_sigint_finishes_step "[ $rc -eq 0 ] && grep -q 'stopped by a signal after step' '$TMP/sigint.out'" "exit $rc"
else
    kill -KILL "$PID" 2>/dev/null; wait "$TPID"
    t_fail one_sigint_finishes_step "no training step reported: $(head -c 300 "$TMP/sigint.err")"
fi

# The OpenMP threads per rank, from the setup line. One process without OMP_NUM_THREADS: every usable
# core (nproc counts the affinity mask, and OMP_NUM_THREADS too, hence env -u).
small=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 1 -t 32 -x 0 -s 0)
cores=$(env -u OMP_NUM_THREADS nproc)
threads_word() { [ "$1" -gt 1 ] && echo "$1 threads" || echo "1 thread"; }
env -u OMP_NUM_THREADS timeout 60 ./train_gpt_cpu "${small[@]}" > "$TMP/th1.out" 2>&1
t_check threads_one_process_uses_all_cores "grep -q '| $(threads_word "$cores") per rank |' '$TMP/th1.out'" "$(grep -m1 '^model' "$TMP/th1.out")"

mpi_or_skip signals_mpi
# Two ranks, no OMP_NUM_THREADS: the cores are shared (at least 1 each); an explicit value wins.
half=$(( cores / 2 > 1 ? cores / 2 : 1 ))
env -u OMP_NUM_THREADS timeout 60 mpirun --oversubscribe --bind-to none -np 2 ./train_gpt_cpu "${small[@]}" > "$TMP/th2.out" 2>&1
t_check threads_two_ranks_share_cores "grep -q '| $(threads_word $half) per rank |' '$TMP/th2.out'" "$(grep -m1 -E '^model|error' "$TMP/th2.out")"
OMP_NUM_THREADS=2 timeout 60 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${small[@]}" > "$TMP/th3.out" 2>&1
t_check threads_explicit_wins "grep -q '| 2 threads per rank |' '$TMP/th3.out'" "$(grep -m1 -E '^model|error' "$TMP/th3.out")"

# SIGTERM during a long validation (852 batches: about 15 s here) to rank 1 alone: the ranks agree between
# rounds and leave the validation together (one rank leaving alone would leave the other waiting in the next
# round's collective), log no partial validation loss, checkpoint step 0 and exit 0 within about 2 s of the
# signal, where they once finished the validation and a step first; the resumed run validates step 0 again.
$PYTHON scripts/make_shard.py -o "$TMP/val.bin" -n 220000 -V 512 --seed 5 >/dev/null
evalrun=(-e L4C256H4V512T64 -i "$TMP/data.bin" -j "$TMP/val.bin" -b 4 -t 64 -x 4 -v 2 -s 0 -o "$TMP/val_stop")
timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${evalrun[@]}" -m 852 > "$TMP/val_stop.txt" 2>&1 &
pid=$!
term_rank_when_running "$TMP/val_stop.txt" "train_gpt_cpu .*$TMP/val_stop" 1   # step 0's validation runs for many seconds
victim=$VICTIM
wait $pid; rc=$?
ms=$(( $(now_ms) - T0 ))
t_check sigterm_during_validation_stops_soon "[ -n '$victim' ] && [ $rc -eq 0 ] && [ $ms -lt 2500 ] && \
    grep -q 'stopped by a signal after step 0 (during evaluation); checkpoint written' '$TMP/val_stop.txt'" \
    "victim '$victim', exit $rc $ms ms after the signal: $(grep -a -E 'stopped|error' "$TMP/val_stop.txt" | head -c 300)"
t_check sigterm_during_validation_logs_no_val_loss "! grep -q '| val loss [0-9]' '$TMP/val_stop.txt' && ! grep -q val_loss '$TMP/val_stop/log.jsonl' && \
    [ -f '$TMP/val_stop/ckpt_000000/DONE' ]" "$(grep -a 'val' "$TMP/val_stop.txt" | head -c 300)"
timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${evalrun[@]}" -m 20 -y 1 > "$TMP/val_resume.txt" 2>&1
t_check sigterm_during_validation_resumes "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt_000000 at step 0' '$TMP/val_resume.txt' && \
    [ \$(grep -c '\"step\": 0, \"val_loss\"' '$TMP/val_stop/log.jsonl') -eq 1 ]" "$(grep -a -m1 -E 'resumed|error' "$TMP/val_resume.txt")"

# An error every rank hits: one whole line, printed by rank 0 alone (mpirun adds its own lines, which do
# not start with "error:").
timeout 60 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${small[@]}" -qq 3 > /dev/null 2> "$TMP/mpi_err"; rc=$?
t_check mpi_error_printed_once_whole "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ \$(grep -c '^error:' '$TMP/mpi_err') -eq 1 ] && \
    grep -qx \"error: unknown flag '-qq' (see -h)\" '$TMP/mpi_err'" "exit $rc: $(grep -a error "$TMP/mpi_err" | head -c 300)"
# An error only rank 1 hits (its own command line, mpirun's MPMD syntax): printed after its wait, with
# its rank, while rank 0 waits in a collective until mpirun ends the job.
timeout 60 "${MPIRUN[@]}" -np 1 ./train_gpt_cpu "${small[@]}" : -np 1 ./train_gpt_cpu "${small[@]}" -qq 3 \
    > /dev/null 2> "$TMP/mpi_err1"; rc=$?
t_check mpi_error_of_one_rank_printed "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ \$(grep -c '^error:' '$TMP/mpi_err1') -eq 1 ] && \
    grep -qx \"error: rank 1: unknown flag '-qq' (see -h)\" '$TMP/mpi_err1'" "exit $rc: $(grep -a error "$TMP/mpi_err1" | head -c 300)"
t_finish
