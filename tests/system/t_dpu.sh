#!/usr/bin/env bash
# -dpu W: from step W on, each step's host update runs while the next step computes, so it lands one step
# late; every update lands before a checkpoint and at the end. Checked here:
#   - the semantics, against scripts/reference.py -dpu (float64, the same delay written out in PyTorch):
#     losses, norms and the final model, with clipping, decay and gradient accumulation;
#   - the delay is real: steps up to W equal the undelayed run bit for bit, step W+1 does not;
#   - the arithmetic does not depend on where the state lives: identical bits for -z 0..3 and -offload 1, 2
#     on 1 and 2 ranks, with a pipeline, and in bf16;
#   - a run stopped at a checkpoint and resumed equals the straight run (the update lands before the save);
#   - the host buffers of the update in flight are planned and allocated as --estimate says.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
have_mpi=0
mpi_available && have_mpi=1
fields() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }

$PYTHON scripts/make_shard.py -o "$TMP/train.bin" -n 20000 -V 500 --seed 7 >/dev/null || t_fail shard "make_shard failed"
init_model L2C64H4V500T64 "$TMP/train.bin"

# 1. Against the reference: W = 2, a checkpoint (and so a landing) after step 6 of 10.
FLAGS=(-e "$MODEL" -i "$TMP/train.bin" -b 4 -t 32 -ga 2 -x 10 -l 1e-3 -u 3 -q 0.1 -k cosine -c 0.5 -gc 0.5 -n 6)
./train_gpt_cpu "${FLAGS[@]}" -j "" -v 0 -s 0 -offload 1 -dpu 2 -o "$TMP/c" > "$TMP/c.txt" 2>&1 || t_fail dpu_run "$(tail -1 "$TMP/c.txt")"
$PYTHON scripts/reference.py "${FLAGS[@]}" -dpu 2 --quiet -o "$TMP/r" > "$TMP/r.txt" 2>&1 || t_fail dpu_reference_run "$(tail -1 "$TMP/r.txt")"
compare_py log dpu_vs_reference "$TMP/c/log.jsonl" "$TMP/r/log.jsonl" --steps 10 --tol 1e-5 --key loss --key grad_norm
KB=$(lr_sum 1e-3 3 10 0.1)
compare_py models dpu_final_model_vs_reference "$TMP/c/ckpt_000010/model.bin" "$TMP/r/model_final.bin" \
    --tol 1e-4 --abs 1e-4 --kbias-bound "$KB"
t_check dpu_announced "grep -q 'updates one step late from step 2' '$TMP/c.txt'"

# -lb: the wait for the landing is a phase of its own, and the host update's own time is reported beside
# the phases of each step an update lands in: from step 3 (-dpu 2), except step 6, before which the
# checkpoint (-n 6) landed step 5's.
./train_gpt_cpu "${FLAGS[@]}" -j "" -v 0 -s 0 -offload 1 -dpu 2 -lb 1 -o "$TMP/lb" > "$TMP/lb.txt" 2>&1 ||
    t_fail dpu_breakdown_run "$(tail -1 "$TMP/lb.txt")"
py_check dpu_breakdown "$TMP/lb/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
waits = [r["step"] for r in recs if "update_wait" in r.get("breakdown_ms", {})]
over = sorted(r["step"] for r in recs if "host_update_overlapped_ms" in r and r["host_update_overlapped_ms"] > 0)
bad = []
if waits != list(range(10)): bad.append("update_wait in the breakdowns of steps %s" % waits)
if over != [3, 4, 5, 7, 8, 9]: bad.append("host update reported for steps %s, expected 3..5, 7..9" % over)
print("ok" if not bad else "; ".join(bad))
PY

# 2. The delay is real: the first W+1 steps (0..2) compute on the same parameters as without it, the next does not.
./train_gpt_cpu "${FLAGS[@]}" -j "" -v 0 -s 0 -offload 1 -o "$TMP/c0" > "$TMP/c0.txt" 2>&1 || t_fail undelayed_run "$(tail -1 "$TMP/c0.txt")"
t_check dpu_same_until_w "diff <(fields $TMP/c/log.jsonl | head -3) <(fields $TMP/c0/log.jsonl | head -3) > /dev/null"
t_check dpu_differs_after_w "! diff <(fields $TMP/c/log.jsonl | sed -n 4p) <(fields $TMP/c0/log.jsonl | sed -n 4p) > /dev/null"

# 3. Where the state lives changes nothing: the same bits for every -z and offload level, per topology.
base=(-e "$MODEL" -i "$TMP/train.bin" -j "" -b 2 -t 32 -x 6 -l 1e-3 -u 2 -c 0.1 -v 0 -s 0 -dpu 1)
train() {   # ranks, out dir, flags...
    local np=$1 out=$2; shift 2
    if [ "$np" -gt 1 ]; then "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1
    else ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1; fi
}
same_bits() {   # name, dir a, dir b
    local bad=""
    [ -n "$(fields "$2/log.jsonl")" ] || bad="no steps in $2/log.jsonl"
    [ -z "$bad" ] && ! diff <(fields "$2/log.jsonl") <(fields "$3/log.jsonl") > /dev/null && bad="losses or norms differ"
    [ -z "$bad" ] && ! cmp -s "$2/ckpt_000006/model.bin" "$3/ckpt_000006/model.bin" && bad="final model.bin differs"
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad"; fi
}
layouts() {   # name, ranks, common flags, then "flags of one layout" ...: each against the first
    local name=$1 np=$2 common=$3; shift 3
    if [ "$np" -gt 1 ] && [ $have_mpi = 0 ]; then t_missing "$name" MPI; return; fi
    train "$np" "$TMP/${name}_0" $common $1 || { t_fail "$name" "run failed: $(tail -1 "$TMP/${name}_0.txt")"; return; }
    local i=1 first=$1; shift
    for l in "$@"; do
        train "$np" "$TMP/${name}_$i" $common $l || { t_fail "${name}_$i" "run failed: $(tail -1 "$TMP/${name}_$i.txt")"; continue; }
        same_bits "${name}: $first vs $l" "$TMP/${name}_0" "$TMP/${name}_$i"
        i=$((i + 1))
    done
}
# On one rank without accumulation (and per pipeline stage) every -z sums alike; across replicas the stages
# add the gradient norm's parts in different orders, and with -ga they accumulate micro-steps differently,
# so there each -z is compared with itself, offload 1 against 2, and 2 ranks against one rank accumulating
# the same global batch within 1e-5.
layouts dpu_np1 1 "" "-z 0 -offload 1" "-z 3 -offload 1" "-z 2 -offload 2" "-z 3 -offload 2"
layouts dpu_np2_z2 2 "" "-z 2 -offload 1" "-z 2 -offload 2"
layouts dpu_np2_z3 2 "" "-z 3 -offload 1" "-z 3 -offload 2"
layouts dpu_np2_z3_bf16 2 "-p bf16 -ga 2" "-z 3 -offload 1" "-z 3 -offload 2"
layouts dpu_np2_pp2 2 "-pp 2 -ga 2" "-z 0 -offload 1" "-z 3 -offload 2"
if [ $have_mpi = 1 ]; then
    train 1 "$TMP/np1_ga2" -ga 2 -z 3 -offload 2 || t_fail dpu_np2_vs_np1 "one-rank run failed"
    compare_py log dpu_np2_vs_np1 "$TMP/dpu_np2_z3_0/log.jsonl" "$TMP/np1_ga2/log.jsonl" --steps 6 --tol 1e-5 \
        --key loss --key grad_norm
fi

# 4. Resume: a checkpoint at step 3 (the update in flight lands first), resumed to 6, ends as the straight run.
train 1 "$TMP/straight" -n 3 -offload 1 || t_fail dpu_resume "straight run failed"
train 1 "$TMP/halves" -n 3 -offload 1 -x 6 && rm -rf "$TMP/halves/ckpt_000006" &&
    train 1 "$TMP/halves" -n 3 -offload 1 -y 1 || t_fail dpu_resume "split run failed: $(tail -1 "$TMP/halves.txt")"
t_check dpu_resumed_at_3 "grep -q 'resumed from .*ckpt_000003 at step 3' '$TMP/halves.txt'"
same_bits dpu_resume_equals_straight "$TMP/straight" "$TMP/halves"

# 5. Memory: the update in flight keeps a gradient (fp32 under -z >= 2) and a working copy per state element
# on the host, planned as allocated.
est() { ./train_gpt_cpu "${base[@]}" -p bf16 "$@" --estimate -w 2 | sed -n 's/^plan: //p'; }
py_check dpu_estimate_host_buffers "$(est -z 2 -offload 1 -dpu 0)" "$(est -z 2 -offload 1 -dpu 1)" <<'PY'
import json, sys
off, on = json.loads(sys.argv[1]), json.loads(sys.argv[2])
# bf16 under -z 2 -offload 1, fewer than 2^20 state elements: master, m, v (12) and two staging buffers (2 x (4 + 2))
# per element.
state = off["host_state"] // 24
want = state * (4 + 2)   # the update in flight: an fp32 gradient and a bf16 working copy per element
rest = lambda m: {k: v for k, v in m.items() if k != "host_state"}
bad = []
if off["host_state"] != 24 * state or state == 0: bad.append("host_state %d is not 24 bytes per element" % off["host_state"])
if on["host_state"] - off["host_state"] != want: bad.append("host_state grew by %d, expected %d" % (on["host_state"] - off["host_state"], want))
if rest(on) != rest(off): bad.append("other categories changed: %s vs %s" % (rest(on), rest(off)))
print("ok" if not bad else "; ".join(bad))
PY
if [ $have_mpi = 1 ]; then
    ./train_gpt_cpu "${base[@]}" -p bf16 -z 2 -offload 1 -dpu 1 --estimate -w 2 > "$TMP/plan.txt" 2>&1
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -p bf16 -z 2 -offload 1 -dpu 1 -x 1 -o "$TMP/mem" > "$TMP/mem.txt" 2>&1 ||
        t_fail dpu_plan_run "$(grep -m1 error "$TMP/mem.txt")"
    py_check dpu_plan_is_allocation "$TMP/plan.txt" "$TMP/mem/log.jsonl" <<'PY'
import json, sys
plan = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("plan: "))[6:])
mem = [json.loads(l)["memory"] for l in open(sys.argv[2]) if '"memory"' in l]
bad = ["%s: allocated %d, planned %d" % (k, m[k], v) for m in mem for k, v in plan.items() if m[k] != v]
print("ok" if mem and not bad else "; ".join(bad[:3]) or "no memory records")
PY
fi
t_finish
