#!/usr/bin/env bash
# The hang watchdog (-wd): a rank stopped with SIGSTOP (mid-training, mid-checkpoint, or during start-up) ends
# the job with one line naming that rank, the newest checkpoint staying complete, while a checkpoint,
# validation or start-up longer than -wd ends nothing.
# run_all: alone
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 4 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -s 0 -v 0 -l 1e-3)
have_mpi=0
mpi_available && have_mpi=1

# The hang watchdog (-wd). A rank stopped with SIGSTOP leaves the others spinning in a collective; the job
# must end within the timeout plus the ask window (2 s at these timeouts), non-zero, with one line that
# names the stopped rank and what the waiting one waited in, and leave the newest checkpoint complete.
if [ $have_mpi = 1 ]; then
    # Starts a 2-rank (or NP-rank) run in the background under a time limit: sets RUN_PID.
    start_ranks() {   # name, ranks, args...
        local name=$1 np=$2; shift 2
        timeout -k 5 120 "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "$@" -o "$TMP/$name" > "$TMP/$name.txt" 2> "$TMP/$name.err" &
        RUN_PID=$!
    }
    wait_for_file() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.05; done; return 1; }
    # Ends the run: sets RC and MS (since START, when the rank was stopped); the stopped rank is gone after.
    end_run() {   # stopped pid
        wait "$RUN_PID"; RC=$?
        MS=$(( $(now_ms) - START ))
        [ -n "$1" ] && kill -KILL "$1" 2> /dev/null
    }
    error_lines() { grep -c '^error:' "$1"; }
    newest_ckpt() { ls -d "$1"/ckpt_[0-9]* 2> /dev/null | sort | tail -1; }

    # Mid-training: rank 1 stops; rank 0 reports it.
    start_ranks wd 2 "${base[@]}" -x 300 -n 20 -wd 3
    wait_for_file "$TMP/wd/ckpt_000020/DONE"
    victim=$(rank_pid "train_gpt_cpu .*$TMP/wd" 1)
    START=$(now_ms)
    [ -n "$victim" ] && kill -STOP "$victim"
    end_run "$victim"
    named=0
    grep -qE '^error: rank 1 stopped answering: rank 0 waited [0-9.]+ s in [a-z].* \((step|checkpoint at step) [0-9]+' "$TMP/wd.err" && named=1
    # Steps are milliseconds here, so the stop can land in a checkpoint (every 20 steps), whose waits get
    # 10 x the timeout: the bound follows the phase the line names.
    bound=15000
    grep -q '(checkpoint at step' "$TMP/wd.err" && bound=45000
    t_check watchdog_names_stopped_rank "[ -n '$victim' ] && [ $RC -ne 0 ] && [ $RC -ne 124 ] && [ $MS -ge 3000 ] && [ $MS -lt $bound ] && \
        [ \$(error_lines $TMP/wd.err) -eq 1 ] && [ $named = 1 ]" \
        "victim '$victim', exit $RC after $MS ms (timeout 3 s, or 30 s in a checkpoint, + 2 s to ask): $(grep -a '^error' "$TMP/wd.err" | head -c 300)"
    newest=$(newest_ckpt "$TMP/wd")
    t_check watchdog_newest_checkpoint_complete "[ -n '$newest' ] && [ -f '$newest/DONE' ] && [ ! -f '$TMP/wd/ckpt_tmp/DONE' ]" "newest: '$newest'"
    timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -x 300 -n 20 -wd 3 -o "$TMP/wd" -y 1 > "$TMP/wd2.txt" 2>&1
    t_check watchdog_then_resume "[ $? -eq 0 ] && grep -q 'resumed from $newest at' '$TMP/wd2.txt' && [ -f '$TMP/wd/ckpt_000300/DONE' ]" \
        "$(grep -a -m1 -E 'resumed|error' "$TMP/wd2.txt")"

    # Three ranks, rank 1 stopped: ranks 0 and 2 both wait, and the job still ends with one line.
    start_ranks wd3 3 "${base[@]}" -b 1 -x 100000 -wd 2
    wait_for_file "$TMP/wd3/log.jsonl"
    for _ in $(seq 200); do grep -q 'step  *5/' "$TMP/wd3.txt" && break; sleep 0.05; done
    victim=$(rank_pid "train_gpt_cpu .*$TMP/wd3" 1)
    START=$(now_ms)
    [ -n "$victim" ] && kill -STOP "$victim"
    end_run "$victim"
    t_check watchdog_one_line_for_three_ranks "[ -n '$victim' ] && [ $RC -ne 0 ] && [ $RC -ne 124 ] && [ $MS -lt 15000 ] && \
        [ \$(error_lines $TMP/wd3.err) -eq 1 ] && grep -q '^error: rank 1 stopped answering: rank [02] waited' $TMP/wd3.err" \
        "victim '$victim', exit $RC after $MS ms: $(grep -a '^error' "$TMP/wd3.err" | head -c 400)"

    # Rank 0 stops while it writes a checkpoint (a model large enough for the write to be caught): the wait
    # there gets 10 x the timeout, then the job ends without publishing the checkpoint; the previous one
    # resumes.
    big=("${base[@]}" -e L4C512H8V512T64 -x 4 -n 2 -wd 1)
    start_ranks wdck 2 "${big[@]}"
    wait_for_file "$TMP/wdck/ckpt_000002/DONE"
    for _ in $(seq 2000); do [ -d "$TMP/wdck/ckpt_tmp" ] && break; sleep 0.01; done
    victim=$(rank_pid "train_gpt_cpu .*$TMP/wdck" 0)
    START=$(now_ms)
    [ -n "$victim" ] && kill -STOP "$victim"
    end_run "$victim"
    named=0
    grep -qE '^error: rank 0 stopped answering: rank 1 waited [0-9.]+ s in .*\(checkpoint at step 4\)' "$TMP/wdck.err" && named=1
    t_check watchdog_during_checkpoint "[ -n '$victim' ] && [ $RC -ne 0 ] && [ $RC -ne 124 ] && [ $MS -ge 10000 ] && [ $MS -lt 30000 ] && \
        [ \$(error_lines $TMP/wdck.err) -eq 1 ] && [ $named = 1 ]" \
        "victim '$victim', exit $RC after $MS ms (10 x 1 s + 2 s to ask): $(grep -a '^error' "$TMP/wdck.err" | head -c 300)"
    t_check watchdog_checkpoint_not_published "[ ! -e '$TMP/wdck/ckpt_000004' ] && [ ! -f '$TMP/wdck/ckpt_tmp/DONE' ] && [ -f '$TMP/wdck/ckpt_000002/DONE' ]" \
        "$(ls "$TMP/wdck" "$TMP/wdck/ckpt_tmp" 2>&1 | tr '\n' ' ')"
    timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${big[@]}" -o "$TMP/wdck" -y 1 > "$TMP/wdck2.txt" 2>&1
    t_check watchdog_checkpoint_then_resume "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt_000002 at' '$TMP/wdck2.txt' && [ -f '$TMP/wdck/ckpt_000004/DONE' ]" \
        "$(grep -a -m1 -E 'resumed|error' "$TMP/wdck2.txt")"
    rm -rf "$TMP/wdck"

    # A checkpoint write that stalls for 3 s (rank 0 stopped and continued: a slow disk, as the others see
    # it) is legitimately longer than -wd 1, and must not end the run.
    start_ranks wdslow 2 "${big[@]}"
    wait_for_file "$TMP/wdslow/ckpt_000002/DONE"
    for _ in $(seq 2000); do [ -d "$TMP/wdslow/ckpt_tmp" ] && break; sleep 0.01; done
    victim=$(rank_pid "train_gpt_cpu .*$TMP/wdslow" 0)
    START=$(now_ms)
    [ -n "$victim" ] && kill -STOP "$victim" && sleep 3 && kill -CONT "$victim"
    end_run ""
    t_check watchdog_spares_slow_checkpoint "[ -n '$victim' ] && [ $RC -eq 0 ] && [ \$(error_lines $TMP/wdslow.err) -eq 0 ] && [ -f '$TMP/wdslow/ckpt_000004/DONE' ]" \
        "victim '$victim', exit $RC: $(grep -a '^error' "$TMP/wdslow.err" | head -c 300)"
    rm -rf "$TMP/wdslow"

    # Start-up is watched too. Rank 1 stops right after launch, before step 0: once rank 0 has made the run
    # directory's lock, which it does after the ranks' first collectives (so rank 1 is past MPI_Init, which
    # nothing can watch), and before the rest of start-up, which takes milliseconds here: no sleep and no
    # process started between the lock and the stop (the line's phase says where it landed). Start-up is a
    # long phase: the job ends after 10 x -wd and the ask window, with the line naming rank 1 and a start-up
    # phase. A time limit of its own, and every rank killed after, so that a regression fails instead of
    # hanging the suite. Sets VICTIM, RANK0, START.
    stop_in_startup() {   # name, -wd
        local name=$1 lock=$TMP/$1/lock
        timeout -k 2 30 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -x 3 -wd "$2" -o "$TMP/$name" > "$TMP/$name.txt" 2> "$TMP/$name.err" &
        RUN_PID=$!
        VICTIM=""
        for _ in $(seq 2000); do VICTIM=$(rank_pid "train_gpt_cpu .*$TMP/$name" 1) && break; sleep 0.005; done
        for ((i = 0; i < 5000000; i++)); do [ -e "$lock" ] && break; done
        [ -n "$VICTIM" ] && kill -STOP "$VICTIM"
        START=$(now_ms)
        RANK0=$(rank_pid "train_gpt_cpu .*$TMP/$name" 0)
    }
    kill_ranks() { for p in "$VICTIM" "$RANK0"; do [ -n "$p" ] && kill -KILL "$p" 2> /dev/null; done; }
    stop_in_startup wdstart 0.2
    end_run ""
    kill_ranks
    t_check watchdog_during_startup "[ -n '$VICTIM' ] && [ $RC -ne 0 ] && [ $RC -ne 124 ] && [ $MS -ge 2000 ] && [ $MS -lt 12000 ] && \
        [ \$(error_lines $TMP/wdstart.err) -eq 1 ] && ! grep -q '^step' $TMP/wdstart.txt && \
        grep -qE '^error: rank 1 stopped answering: rank 0 waited [0-9.]+ s in .*\(start-up: ' $TMP/wdstart.err" \
        "victim '$VICTIM', exit $RC after $MS ms (10 x 0.2 s + 2 s to ask): $(grep -a '^error' "$TMP/wdstart.err" | head -c 300)"
    # A start-up stalled longer than -wd plus the ask window (rank 1 stopped for 3.5 s, then continued: a slow
    # filesystem, as the others see it) is healthy, and must not end the run: only 10 x -wd does. (Had the
    # stop landed in a step, the watchdog would end the run; had the run been over, it would end in < 3.5 s.)
    stop_in_startup wdslowstart 0.5
    [ -n "$VICTIM" ] && sleep 3.5 && kill -CONT "$VICTIM"
    end_run ""
    kill_ranks
    t_check watchdog_spares_slow_startup "[ -n '$VICTIM' ] && [ $RC -eq 0 ] && [ $MS -ge 3500 ] && [ \$(error_lines $TMP/wdslowstart.err) -eq 0 ] && \
        [ -f '$TMP/wdslowstart/ckpt_000003/DONE' ]" "victim '$VICTIM', exit $RC after $MS ms: $(grep -a '^error' "$TMP/wdslowstart.err" | head -c 300)"

    # A validation longer than -wd 1 (every rank evaluates, with a stop check between rounds) must not either.
    $PYTHON scripts/make_shard.py -o "$TMP/val.bin" -n 40000 -V 512 --seed 6 >/dev/null
    SECONDS=0
    timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e L4C256H4V512T64 -i "$TMP/data.bin" -j "$TMP/val.bin" -b 4 -t 64 -x 1 \
        -v 1 -m 100 -s 0 -wd 1 > "$TMP/wdval.txt" 2>&1; rc=$?
    t_check watchdog_spares_long_validation "[ $rc -eq 0 ] && [ \$(grep -c 'val loss' $TMP/wdval.txt) -eq 2 ] && [ $SECONDS -ge 2 ]" \
        "exit $rc after $SECONDS s (must be over 1 s to mean anything): $(grep -a -m1 error "$TMP/wdval.txt")"
else
    echo "skip the watchdog checks: no MPI"
fi
t_finish
