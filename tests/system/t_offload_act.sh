#!/usr/bin/env bash
# -offload-act 1 (core/model/act_offload.h): with -r 3 the blocks' inner inputs live in host memory, copied
# down after each block's forward and up one block ahead of its backward through three device slots. The
# copies move bits unchanged, so every run equals the same run without it bit for bit (losses, norms,
# validation, the checkpoint): GPT-2 and Llama, fp32 and bf16, zb's two backward walks and interleaved
# chunks on two stages, -z 3 on two ranks; the CPU backend runs an asynchronous copy as late as it may and
# poisons its destination at issue, so a missing wait changes the bits here. The plan is the allocation:
# the device keeps each set's first input and output and the three slots, the host (L-1) inputs per set.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 4 >/dev/null
base=(-i "$TMP/data.bin" -j "$TMP/data.bin" -b 2 -t 32 -v 2 -m 2 -s 0 -l 1e-3 -x 4 -r 3)

run() {   # ranks, out dir, flags...
    local np=$1 out=$2; shift 2
    if [ "$np" -gt 1 ]; then "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1
    else ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1; fi
}
same() {   # name, ranks, flags...: the run with -offload-act 1 and without, bit for bit
    local name=$1 np=$2; shift 2
    run "$np" "$TMP/$name.off" "$@" && run "$np" "$TMP/$name.on" "$@" -offload-act 1 ||
        { t_fail "$name" "a run failed: $(grep -m1 -iE 'error|fault' "$TMP/$name.on.txt" "$TMP/$name.off.txt" | cut -c1-200)"; return; }
    local bad=""
    [ -n "$(fields "$TMP/$name.off/log.jsonl")" ] && diff <(fields "$TMP/$name.off/log.jsonl") <(fields "$TMP/$name.on/log.jsonl") >/dev/null ||
        bad="losses or norms differ"
    diff <(grep -o '"val_loss": [^,}]*' "$TMP/$name.off/log.jsonl") <(grep -o '"val_loss": [^,}]*' "$TMP/$name.on/log.jsonl") >/dev/null ||
        bad="validation losses differ"
    cmp -s "$TMP/$name.off/ckpt_000004/model.bin" "$TMP/$name.on/ckpt_000004/model.bin" || bad="${bad:-the checkpoint models differ}"
    if [ -z "$bad" ]; then t_ok "$name"; else t_fail "$name" "$bad"; fi
}

same offload_act_gpt2_fp32 1 -e L6C64H4V512T64
same offload_act_llama_bf16 1 -e llama:L6,C64,H4,K2,F96,V512,T64 -p bf16
if mpi_available; then
    same offload_act_pp2_zb 2 -e L8C64H4V512T64 -pp 2 -ps zb -ga 4
    same offload_act_pp2_interleaved 2 -e L8C64H4V512T64 -pp 2 -ps interleaved -vp 2 -ga 4
    same offload_act_z3_np2 2 -e llama:L6,C64,H4,K2,F96,V512,T64 -z 3
else
    t_missing offload_act_pp2_zb MPI
fi

# The plan against the allocation, and what moved: one set of a 6-block stage keeps 2 inputs and 3 slots on
# the device instead of 7 inputs, and 5 inputs (b*t rows of C in fp32) on the host.
./train_gpt_cpu "${base[@]}" -e L6C64H4V512T64 -offload-act 1 --estimate > "$TMP/plan.txt" 2>&1
py_check offload_act_plan_is_the_allocation "$TMP/plan.txt" "$TMP/offload_act_gpt2_fp32.on/log.jsonl" "$TMP/offload_act_gpt2_fp32.off/log.jsonl" <<'PY'
import json, sys
plan = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("plan: "))[6:])
mem = lambda p: next(json.loads(l)["memory"] for l in open(p) if '"memory"' in l)
on, off = mem(sys.argv[2]), mem(sys.argv[3])
slice_bytes = 2 * 32 * 64 * 4
bad = [k for k in plan if plan[k] != on[k]]
if bad: print("plan %s, run %s" % ({k: plan[k] for k in bad}, {k: on[k] for k in bad}))
elif on["host_activations"] != 5 * slice_bytes: print("host_activations %d, 5 inputs are %d" % (on["host_activations"], 5 * slice_bytes))
elif off["activations"] - on["activations"] != 2 * slice_bytes: print("device activations %d with, %d without" % (on["activations"], off["activations"]))
else: print("ok")
PY
./train_gpt_cpu "${base[@]}" -e L6C64H4V512T64 -offload-act 1 -r 2 > /dev/null 2> "$TMP/err.txt"
rc=$?
t_check offload_act_needs_r3 "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/err.txt) -eq 1 ] && grep -q 'needs -r 3' $TMP/err.txt" "rc $rc: $(cat "$TMP/err.txt")"
t_finish
