#!/usr/bin/env bash
# A rank that dies mid-run must end the whole job, non-zero, within seconds; the hang watchdog must name a
# stopped rank, and a deadlock's waits (build/test_comm's --die and --hang under mpirun).
# run_all: alone
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIN=build/test_comm
[ -x "$BIN" ] || { t_fail comm_binary "$BIN missing (make tests-bin)"; t_finish; }

# A dying rank: rank 1 of 3 ends while the others wait in an all-reduce. OpenMPI's mpirun kills the job
# when a rank exits non-zero, is killed by a signal, or exits without MPI_Finalize, even with status 0.
# mpirun merges the ranks' streams, so rank 0's line can follow a piece of rank 1's backtrace: no '^'.
for mode in abort exit3 exit0 fail kill; do
    start=$(date +%s%N)
    timeout 60 mpirun --oversubscribe -np 3 "$BIN" --die "$mode" > "$TMP/die.out" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    t_check "comm_dead_rank_${mode}_ends_job" "grep -q 'die: 3 ranks up$' $TMP/die.out && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $ms -lt 30000 ]" \
        "mpirun exit $rc after $ms ms (124 = still hanging at the 60 s timeout); $(grep -m1 'die:' "$TMP/die.out" || echo 'the ranks never came up')"
    echo "# dead rank ($mode): mpirun exit $rc after $ms ms"
done

# The hang watchdog at 1 s. Rank 1 of 3 stops (SIGSTOP) while ranks 0 and 2 wait in an all-reduce: one line
# names it, from whichever of the two reports, and the job ends within the timeout plus the 2 s ask window
# (and mpirun's teardown). Ranks 0 and 1 of 2 each wait to receive from the other: every rank answers, and a
# second question finds that none moved on; the line names both waits.
for mode in stop deadlock; do
    np=$([ $mode = stop ] && echo 3 || echo 2)
    start=$(date +%s%N)
    timeout 60 mpirun --oversubscribe -np "$np" "$BIN" --hang "$mode" > "$TMP/hang.out" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [ $mode = stop ]; then
        line='^error: rank 1 stopped answering: rank [02] waited [0-9.]* s in all-reduce over the world (hang test)$'
    else
        line='^error: every rank answers but none moves on (their waits do not match): rank [01] waited [0-9.]* s in receive from rank [01] (hang test); rank [01] waits in receive from rank [01] (hang test)$'
    fi
    t_check "comm_watchdog_${mode}" "grep -q 'hang: $np ranks up$' $TMP/hang.out && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $ms -lt 20000 ] && \
        [ \$(grep -c '^error:' $TMP/hang.out) -eq 1 ] && grep -q '$line' $TMP/hang.out" \
        "mpirun exit $rc after $ms ms: $(grep -a -m1 -E '^error|hang:' "$TMP/hang.out" || echo 'the ranks never came up')"
done
t_finish
