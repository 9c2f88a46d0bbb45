#!/usr/bin/env bash
# -lora with -z 3: the frozen base is sharded over the data-parallel ranks in the run's dtype and gathered
# unit by unit like any -z 3 parameter, the adapters sharded with it, each rank a half of both. Two ranks
# give one rank's -ga 2 losses and norms within 1e-5 (the norm adds two halves) and its adapters bit for bit
# (GPT-2 from adapters with a nonzero B; a Llama shape, whose untied head has an edge slot of its own, with
# -r 3); bf16 gives -z 2's bits; a checkpoint written under -z 2 resumes under -z 3 and the other way, and
# one written on two ranks resumes on one; rank 0 holds 1/2 of the base plus the gathered units, as
# --estimate plans; -z 3 -offload 2 keeps the pieces in host memory.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip lora_z3
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 3 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
base=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-2 -e "$MODEL" -lora 4 -lora-alpha 8)
same_steps() {   # name, log a, log b
    if [ -n "$(fields "$2")" ] && diff <(fields "$2") <(fields "$3") >/dev/null; then t_ok "$1"
    else t_fail "$1" "$(fields "$3" | tail -1) vs $(fields "$2" | tail -1)"; fi
}
near_steps() {   # name, log, the reference log, steps: losses and norms within 1e-5
    compare_py log "$1" "$2" "$3" --steps "$4" --tol 1e-5 --key loss --key grad_norm
}
# A state file's spans and values past its header, whose last field is the ZeRO stage that wrote it.
same_state() { cmp -s <(tail -c +65 "$1") <(tail -c +65 "$2"); }

# Checkpoints at step 2 and 4: uninterrupted under -z 2, and half under each stage, resumed under the other.
train 2 "$TMP/z2" -z 2 -x 4 -n 2
train 2 "$TMP/z2_z3" -z 2 -x 2 -n 2
train 2 "$TMP/z2_z3" -z 3 -x 4 -n 2 -y 1
train 2 "$TMP/z3_z2" -z 3 -x 2 -n 2
cp -r "$TMP/z3_z2" "$TMP/z3_one"
train 2 "$TMP/z3_z2" -z 2 -x 4 -n 2 -y 1
train 1 "$TMP/z3_one" -ga 2 -x 4 -n 2 -y 1
a=$TMP/z2/ckpt_000004
for run in z2_z3 z3_z2; do
    b=$TMP/$run/ckpt_000004
    t_check lora_resume_${run} "grep -q 'resumed from .*ckpt_000002' '$TMP/$run.txt' && [ -n \"\$(fields $TMP/z2/log.jsonl)\" ] &&
        diff <(fields $TMP/z2/log.jsonl) <(fields $TMP/$run/log.jsonl) >/dev/null && cmp -s $a/adapters.bin $b/adapters.bin &&
        same_state $a/state_rank0.bin $b/state_rank0.bin && same_state $a/state_rank1.bin $b/state_rank1.bin" "$(tail -1 "$TMP/$run.txt")"
done
t_check lora_resume_z3_two_ranks_on_one "grep -q 'resumed from .*ckpt_000002' '$TMP/z3_one.txt' &&
    cmp -s $a/adapters.bin $TMP/z3_one/ckpt_000004/adapters.bin" "$(tail -1 "$TMP/z3_one.txt")"
near_steps lora_resume_z3_two_ranks_on_one_steps "$TMP/z3_one/log.jsonl" "$TMP/z2/log.jsonl" 4

# Rank 0's parameters under -z 3 (the resumed half of z2_z3): its pieces, 1/2 of the whole layout that -z 2
# holds, base included, plus the gathered units: two block slots and the embedding and final units' own,
# which for two blocks and a tied head is the whole layout again.
py_check lora_z3_params_are_pieces_of_the_base "$TMP/z2/log.jsonl" "$TMP/z2_z3/log.jsonl" <<'PY'
import json, sys
mem = lambda p: [r["memory"]["params"] for r in map(json.loads, open(p)) if r.get("rank") == 0 and "memory" in r][-1]
whole, z3 = mem(sys.argv[1]), mem(sys.argv[2])
print("ok" if 2 * z3 == 3 * whole else "-z 3 params %d bytes, -z 2 %d (expected %d)" % (z3, whole, whole * 3 // 2))
PY
./train_gpt_cpu "${base[@]}" -z 3 --estimate -w 2 > "$TMP/plan.txt" 2>&1
py_check lora_z3_estimate_is_the_runs_memory "$TMP/plan.txt" "$TMP/z2_z3/log.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
plan = json.loads(next(l for l in lines if l.startswith("plan: "))[6:])
runs = {}
for r in map(json.loads, open(sys.argv[2])):
    if "memory" in r: runs[r["rank"]] = r["memory"]   # the resumed half's, the last per rank
bad = ["rank %d: plan %s, run %s" % (k, plan, runs.get(k)) for k in range(2) if plan != runs.get(k)]
print("ok" if len(runs) == 2 and not bad else "; ".join(bad) or "memory records of ranks %s" % sorted(runs))
PY

# From adapters with a nonzero B: two ranks under -z 3 take one rank's -ga 2 steps.
init=(-lora-init "$a/adapters.bin" -x 3)
train 1 "$TMP/one" "${init[@]}" -ga 2
train 2 "$TMP/two_z3" "${init[@]}" -z 3
near_steps lora_z3_np2_equals_one_rank "$TMP/two_z3/log.jsonl" "$TMP/one/log.jsonl" 3
t_check lora_z3_np2_adapters_equal_one_rank "cmp -s $TMP/one/ckpt_000003/adapters.bin $TMP/two_z3/ckpt_000003/adapters.bin"
train 2 "$TMP/bf16_z2" "${init[@]}" -p bf16 -z 2
train 2 "$TMP/bf16_z3" "${init[@]}" -p bf16 -z 3
same_steps lora_z3_bf16_equals_z2 "$TMP/bf16_z2/log.jsonl" "$TMP/bf16_z3/log.jsonl"
# -offload 2 -z 3: the parameter pieces, base included, in host memory.
train 2 "$TMP/offload" "${init[@]}" -z 3 -offload 2
if grep -q -- '-offload: not yet with -lora' "$TMP/offload.txt"; then t_skip lora_z3_offload2_equals_one_rank "-offload is refused with -lora"
else near_steps lora_z3_offload2_equals_one_rank "$TMP/offload/log.jsonl" "$TMP/one/log.jsonl" 3; fi

base=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-2 -e llama:L2,C64,H4,K2,F96,V512,T64,qknorm -lora 3 -x 3)
train 1 "$TMP/llama_one" -ga 2
train 2 "$TMP/llama_z3" -z 3 -r 3
near_steps lora_z3_llama_np2_equals_one_rank "$TMP/llama_z3/log.jsonl" "$TMP/llama_one/log.jsonl" 3
t_finish
