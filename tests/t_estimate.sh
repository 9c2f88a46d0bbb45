#!/usr/bin/env bash
# --estimate allocates nothing and predicts each rank's bytes per category; a real run of the same flags
# must allocate exactly that (the issue asks within 1%; the plan runs the allocation code, so it is exact).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 2 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -v 0 -s 0)
have_mpi=0
mpi_available && have_mpi=1
compare() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    ./train_gpt_cpu "${base[@]}" "$@" --estimate -w "$np" > "$TMP/$name.plan" 2>&1 || { t_fail "$name" "--estimate failed"; return; }
    if [ "$np" -gt 1 ]; then
        [ $have_mpi = 1 ] || { echo "skip $name: no MPI"; return; }
        "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" > /dev/null 2>&1
    else
        ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" > /dev/null 2>&1
    fi
    $PYTHON - "$name" "$TMP/$name.plan" "$TMP/$name/log.jsonl" "$np" <<'PY'
import json, sys
name, plan_path, log_path, np = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = json.loads(next(l for l in open(plan_path) if l.startswith("plan: "))[6:])
mem = [json.loads(l) for l in open(log_path) if '"memory"' in l]
bad = ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], v)
       for r in mem for k, v in plan.items() if abs(r["memory"][k] - v) > 0.01 * max(v, 1)]
if len(mem) != np:
    bad.append("%d memory records for %d ranks" % (len(mem), np))
print("ok %s" % name if not bad else "FAIL %s: %s" % (name, "; ".join(bad[:3])))
PY
}
compare estimate_np1_z0 1
compare estimate_np1_z0_bf16_r3 1 -p bf16 -r 3
compare estimate_np2_z1 2 -z 1
compare estimate_np2_z2_bf16 2 -z 2 -p bf16
compare estimate_np4_z3_r2 4 -z 3 -r 2
compare estimate_np2_z2_bf16_offload 2 -z 2 -p bf16 -offload 1   # host_state planned as allocated too
# The plan needs no data and no device: it works with a shard pattern that matches nothing.
./train_gpt_cpu -e d48 -i "$TMP/none_*.bin" -b 4 -t 1024 -z 3 -w 64 --estimate > "$TMP/d48.txt" 2>&1
t_check estimate_needs_no_data "grep -q '^plan: ' '$TMP/d48.txt' && grep -q 'ZeRO-3' '$TMP/d48.txt'"
t_finish
