#!/usr/bin/env bash
# The slow-link benches' cheap paths: scripts/bench_slow_link.sh and scripts/bench_convergence.sh refuse bad
# arguments with one line naming the problem before they build or run anything; a bench whose first run fails
# under a tc limit says why in one line and leaves no network namespace behind (root and MPI only).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

refused() {   # name, script, expected message (grep pattern), arguments...
    local name=$1 script=$2 want=$3 rc; shift 3
    bash "$script" "$@" > "$TMP/$name.txt" 2>&1
    rc=$?
    if [ $rc = 1 ] && [ "$(wc -l < "$TMP/$name.txt")" = 1 ] && grep -qF -- "$script: error: $want" "$TMP/$name.txt"; then
        t_ok "$name"
    else
        t_fail "$name" "rc $rc: $(head -2 "$TMP/$name.txt" | paste -sd'|')"
    fi
}
S=scripts/bench_slow_link.sh C=scripts/bench_convergence.sh
refused slow_link_bad_bandwidth $S "bandwidth '100Mbit' is not unlimited or a tc rate" -bw "unlimited 100Mbit"
refused slow_link_pair_without_other $S "-p needs \"BASE FLAGS;OTHER FLAGS\", got '-z 3;'" -p "-z 3;"
refused slow_link_no_step_after_warmup $S "-w 4 leaves none of the 4 steps to time" -x 4 -w 4
refused slow_link_default_pair_needs_warmup $S "-w 1: the default 1-bit Adam pair needs 2 steps" -w 1
refused slow_link_unknown_argument $S "unknown argument '-q'" -q
refused slow_link_missing_value $S "-timeout needs a value" -timeout
refused convergence_freeze_past_end $C "-freeze 6 exceeds the 5 steps" -x 5 -freeze 6
refused convergence_ranks_not_dividing_batch $C "-np 3 does not divide the quick start's 8 sequences" -np 3
refused convergence_config_without_flags $C "-c needs NAME=FLAGS" -c exact
refused convergence_one_rank $C "-np 1: the techniques need at least 2" -np 1

if [ "$(id -u)" != 0 ] || ! command -v tc >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
    t_skip slow_link_failed_run_tears_down "needs root, ip and tc"
elif ! mpi_available; then
    t_missing slow_link_failed_run_tears_down MPI
else
    $PYTHON scripts/make_shard.py -o "$TMP/d.bin" -n 5000 -V 500 --seed 3 >/dev/null
    before=$(ip netns list | grep -c '^gzs_' || true)
    timeout -k 5 60 bash $S -bw 1gbit -x 2 -w 1 -p "-z 3 -qw 7;-z 3" -o "$TMP/bench" -- \
        -e L2C64H4V500T64 -i "$TMP/d.bin" -j "" -t 32 > "$TMP/failed.txt" 2>&1
    rc=$?
    after=$(ip netns list | grep -c '^gzs_' || true)
    if [ $rc = 1 ] && [ "$before" = "$after" ] &&
        grep -qF "$S: error: 1gbit, -z 3 -qw 7: the run failed (rc 1): error: flag -qw = 7 is outside 0..1" "$TMP/failed.txt"; then
        t_ok slow_link_failed_run_tears_down
    else
        t_fail slow_link_failed_run_tears_down "rc $rc, namespaces gzs_* before $before after $after: $(grep -m1 error "$TMP/failed.txt")"
    fi
fi
t_finish
