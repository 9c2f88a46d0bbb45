#!/usr/bin/env bash
# The comm layer across processes: build/test_comm under mpirun with 1-4 ranks (and once with tiny MPI
# chunks, to exercise the splitting of large transfers; and in poison mode); misuses of start/wait, exchanges
# and the all-to-all; the device-memory staging path against the fenced CPU backend (a stand-in GPU); and the
# MPI-less backend must refuse a multi-rank launch. Each mpirun counts as one check here (its failing checks are
# shown); the single-process run is build/test_comm itself. A rank that dies or hangs: t_comm_ends.sh.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
# mpirun refuses to start as root without these; containers and CI often run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIN=build/test_comm
[ -x "$BIN" ] || { t_fail comm_binary "$BIN missing (make tests-bin)"; t_finish; }

# name, expected rank count, command...: passes when it exits 0, reports no FAIL and prints its summary.
run_ranks() {
    local name=$1 np=$2; shift 2
    local out="$TMP/$name.out" rc
    timeout 300 "$@" > "$out" 2>&1; rc=$?
    local checks
    checks=$(sed -n "s/^# test_comm: $np ranks, \([0-9]*\) checks, 0 failed$/\1/p" "$out")
    if [ "$rc" -eq 0 ] && [ -n "$checks" ] && ! grep -q '^FAIL' "$out"; then
        t_ok "$name ($checks checks)"
    else
        grep '^FAIL' "$out" | head -20 | sed 's/^FAIL /    /'
        t_fail "$name" "exit $rc; $(grep -c '^FAIL' "$out") failed checks; last line: $(tail -1 "$out")"
    fi
}

# The MPI-less backend: a world of one that refuses to be one of several ranks. (As rank 1, PMIX_RANK=1, it
# reports after fail()'s wait for rank 0, with its rank: common.h.)
check_single() {   # binary
    run_ranks comm_single_process 1 "$1"
    local v
    for v in OMPI_COMM_WORLD_SIZE=3 PMI_SIZE=2 PMIX_RANK=1; do
        env "$v" "$1" > "$TMP/single.out" 2>&1
        local rc=$?
        t_check "comm_single_refuses_${v%%=*}" \
            "[ $rc -eq 1 ] && grep -qE '^error: (rank 1: )?this binary was built without MPI; rebuild with OpenMPI' '$TMP/single.out'" \
            "exit $rc: $(head -c 200 "$TMP/single.out")"
    done
}

if ! ldd "$BIN" | grep -q libmpi; then
    t_missing comm_mpirun "MPI in $BIN (MPI=0, or no mpicc when it was built)"
    check_single "$BIN"
    t_finish
fi
if ! command -v mpirun > /dev/null; then
    t_fail comm_mpirun "$BIN links MPI but mpirun is not on PATH (apt-get install openmpi-bin)"
    t_finish
fi

for np in 1 2 3 4; do
    run_ranks "comm_mpirun_np$np" "$np" mpirun --oversubscribe -np "$np" "$BIN"
done
# 300 elements per MPI call: the 1031-element collectives go out in 4 pieces (the real limit is INT_MAX).
run_ranks comm_mpirun_np3_chunked 3 mpirun --oversubscribe -np 3 -x GPT_COMM_MAX_COUNT=300 "$BIN"
# Poison mode: every check still passes, and buffers in flight read as poison (test_async's extra checks).
run_ranks comm_mpirun_np3_poison 3 mpirun --oversubscribe -np 3 -x GPT_COMM_POISON=1 "$BIN"
run_ranks comm_mpirun_np2_poison_chunked 2 mpirun --oversubscribe -np 2 -x GPT_COMM_POISON=1 -x GPT_COMM_MAX_COUNT=300 "$BIN"

# The run log's comm_bytes record lists the all-to-all once a rank has sent by it (build/test_report_comm).
timeout 120 mpirun --oversubscribe -np 3 build/test_report_comm > "$TMP/report.out" 2>&1; rc=$?
t_check comm_report_alltoall_np3 "[ $rc -eq 0 ] && [ \$(grep -c '^ok report_comm_' '$TMP/report.out') -eq 2 ]" \
    "exit $rc: $(grep -m3 -E '^FAIL|error' "$TMP/report.out")"

# Misuses of start/wait, exchanges and the all-to-all, each a one-line error and a non-zero exit.
misuse() {   # name, expected error (grep -E), env..., -- mode
    local name=$1 want=$2; shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=(-x "$1"); shift; done
    timeout 60 mpirun --oversubscribe -np 2 "${envs[@]}" "$BIN" --misuse "$2" > "$TMP/misuse.out" 2>&1
    local rc=$?
    t_check "$name" "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qE 'error: $want' '$TMP/misuse.out'" \
        "exit $rc: $(grep -m1 . "$TMP/misuse.out" | head -c 200)"
}
misuse comm_refuses_too_many_in_flight 'allgather: 16 collectives already in flight' -- too-many
misuse comm_exchange_order_refused 'rank 1: comm_exchange: from rank 0 came message 1 where message 2 was expected' -- exchange-order
misuse comm_exchange_overlap_refused '(rank 1: )?comm_exchange: messages 0 and 1 \(tags 1 and 1\) share memory' -- exchange-overlap
misuse comm_alltoall_overlap_refused 'comm_alltoall: out overlaps in \(the all-to-all is out of place\)' -- alltoall-overlap
misuse comm_alltoall_in_place_refused 'comm_alltoall: out overlaps in \(the all-to-all is out of place\)' -- alltoall-in-place
misuse comm_poison_detects_write_in_flight 'GPT_COMM_POISON: a buffer of a reduce_scatter in flight' GPT_COMM_POISON=1 -- write-in-flight
misuse comm_poison_detects_exchange_receive_written 'GPT_COMM_POISON: the buffer of message 5 \(64 bytes, a receive from rank [01]\) of an exchange in flight was written before comm_wait' GPT_COMM_POISON=1 -- exchange-receive-written
misuse comm_poison_detects_exchange_send_written 'GPT_COMM_POISON: the buffer of message 5 \(64 bytes, a send to rank [01]\) of an exchange in flight was written before comm_wait' GPT_COMM_POISON=1 -- exchange-send-written
# Without poison mode the same write goes unnoticed on the CPU (MPI works on a copy): the mode is needed.
# (Rank 0 prints the error; rank 1 would only after fail()'s wait, by which time mpirun has ended the job.)
timeout 60 mpirun --oversubscribe -np 2 "$BIN" --misuse write-in-flight > "$TMP/misuse.out" 2>&1
t_check comm_write_in_flight_unseen_without_poison "grep -q 'error: --misuse write-in-flight: not refused' '$TMP/misuse.out'" \
    "$(grep -m1 error "$TMP/misuse.out")"

# The GPU build's staging path (download, MPI on the host, upload), against the fenced CPU backend
# (kernels/backend_cpu.c with -DBACKEND_FENCE, tests/system/t_fence.sh): it says it is a GPU, and its memory faults
# on any access outside the backend's functions, so a device pointer handed to MPI or memcpy crashes.
if ${MPICC:-mpicc} -std=gnu11 -O1 -Wall -Wextra -Werror -fopenmp -DBACKEND_FENCE -I. tests/unit/test_comm.c core/comm/comm_mpi.c core/comm/launcher.c \
        core/comm/watchdog.c base/common.c base/gpu_variants.c kernels/backend_cpu.c -lm -o "$TMP/test_comm_staged" > "$TMP/cc.out" 2>&1; then
    run_ranks comm_staged_np3 3 mpirun --oversubscribe -np 3 "$TMP/test_comm_staged"
    run_ranks comm_staged_np4_chunked 4 mpirun --oversubscribe -np 4 -x GPT_COMM_MAX_COUNT=300 "$TMP/test_comm_staged"
    run_ranks comm_staged_np3_poison 3 mpirun --oversubscribe -np 3 -x GPT_COMM_POISON=1 "$TMP/test_comm_staged"
else
    t_fail comm_staged_builds "$(head -3 "$TMP/cc.out")"
fi

# A plain start (no launcher) is an isolated singleton: OpenMPI starts no daemon beside it (it would be a child
# of the trainer for the whole run); with the setting given explicitly as 0, the daemon is there (the check sees it).
singleton_daemons() {   # environment assignments...: the number of children named orted once the run trains
    $PYTHON scripts/make_shard.py -o "$TMP/one.bin" -n 4000 -V 256 --seed 2 > /dev/null
    env "$@" ./train_gpt_cpu -e L1C32H2V256T32 -i "$TMP/one.bin" -b 1 -t 16 -x 100000 -v 0 -s 0 > "$TMP/single.out" 2>&1 &
    local pid=$! n=0
    for _ in $(seq 300); do grep -q '^step  *1/' "$TMP/single.out" && break; sleep 0.1; done   # MPI_Init is behind it
    n=$(pgrep -c -P "$pid" orted)
    kill "$pid"; wait "$pid" 2>/dev/null
    echo "$n"
}
n_iso=$(singleton_daemons OMP_NUM_THREADS=1)
n_daemon=$(singleton_daemons OMP_NUM_THREADS=1 OMPI_MCA_ess_singleton_isolated=0)
t_check comm_singleton_starts_no_daemon "[ '$n_iso' = 0 ] && [ '$n_daemon' = 1 ]" \
    "orted children: $n_iso by default, $n_daemon with OMPI_MCA_ess_singleton_isolated=0"

# The MPI-less backend, built on the side (it is not what the Makefile links when MPI is there).
if ${CC:-gcc} -std=gnu11 -O1 -Wall -Wextra -Werror -fopenmp -I. tests/unit/test_comm.c core/comm/comm_single.c core/comm/launcher.c \
        base/common.c base/gpu_variants.c kernels/backend_cpu.c -lm -o "$TMP/test_comm_single" > "$TMP/cc.out" 2>&1; then
    check_single "$TMP/test_comm_single"
else
    t_fail comm_single_builds "$(head -3 "$TMP/cc.out")"
fi
t_finish
