#!/usr/bin/env bash
# t_sft_layouts.sh: on a document dataset (-pack 1, shuffled, with validation on held-out conversations) every
# layout trains what one rank trains, and resume is bit-exact:
# - fp32, against one rank of the same global batch, within 1e-5 at each of 6 steps (loss, gradient norm, the
#   step's label count, every validation loss) and the final model within 1e-5 per tensor, 1e-4 per element
#   (-tp's: the log only, as t_schedules.sh): -z 0, 1, 2, 3 (2 and 4 replicas, -offload 1 and 2), -r 0..3,
#   -pp 2 under 1f1b, zb and interleaved, -tp 2 with and without -sp 1 (GPT-2; and Llama's grouped-query
#   attention under -pp -tp -sp);
# - bf16 against a bf16 one-rank run within 1e-2 (stochastic rounding moves weights by whole bf16 steps, as
#   t_tp.sh), and both bf16 runs' step-0 validation loss within 1e-3 of fp32's (a document mask missing in
#   the bf16 forward moves it by 2.5%);
# - resume: one rank 3 + 3 steps equal 6 straight, bit for bit (log, model, state); a -pp 2 1f1b checkpoint
#   resumed under zb, and a -z 2 -offload 1 checkpoint under -z 3, give the straight run's bits (the layouts
#   compute the same bits); one rank's checkpoint resumed at -pp 2 -tp 2 -z 3 follows one rank within 1e-5.
# The models' weights are N(0, 0.3^2) (tests/tools/doc_trainer_check.py model): there a missing document mask
# moves a window's loss by 1-9% and positions that keep counting by 2-6%, where a fresh model's move by 1e-4.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip sft_layouts
# Conversations of 11 to 20 tokens: rows of 32 hold two, so documents meet in nearly every row.
$PYTHON tests/tools/doc_dataset.py "$TMP/d" --seed 5 --conversations 200 --longest 20 --val 12 > /dev/null
$PYTHON tests/tools/doc_trainer_check.py model "$TMP/gpt2.bin" L4C64H4V512T64 \
    "$TMP/llama.bin" "llama:L2,C64,H4,K2,D32,F96,V512,T64,qknorm"
base=(-i "$TMP/d/chat_train_*.bin" -j "$TMP/d/chat_val_*.bin" -v 3 -m 2 -b 2 -t 32 -x 6 -l 2e-3 -u 2 -q 0.1 -c 0.1
      -gc 1.0 -s 0 -sh 1)
KB=$(lr_sum 2e-3 2 6 0.1)   # bound on the key bias's drift (compare.py --kbias-bound)
run() {   # name, model, ranks, flags...
    local name=$1 model=$2 np=$3; shift 3
    local launch=(); [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np")
    timeout 300 "${launch[@]}" ./train_gpt_cpu -e "$TMP/$model.bin" "${base[@]}" -o "$TMP/$name" "$@" > "$TMP/$name.txt" 2>&1 ||
        t_fail "$name" "exited non-zero: $(grep -m1 error "$TMP/$name.txt")"
}
same_as() {   # name, reference run, tolerance, "model" to compare the final models too
    compare_py log "$1_vs_one_rank" "$TMP/$1/log.jsonl" "$TMP/$2/log.jsonl" --steps 6 --tol "$3" --key loss --key grad_norm --key trained
    val_losses_match "$1_val_losses" "$TMP/$1/log.jsonl" "$TMP/$2/log.jsonl"
    # Each tensor within the tolerance relative; each element within 1e-4, a twentieth of the peak LR: Adam turns
    # another summation order's rounding in a gradient near 0 (a token seen once) into a part of one step.
    [ "${4:-}" = model ] && compare_py models "$1_final_model" "$TMP/$1/ckpt_000006/model.bin" "$TMP/$2/ckpt_000006/model.bin" \
        --tol "$3" --abs 1e-4 --kbias-bound "$KB"
}

run one gpt2 1 -ga 4 -n 3
# name | ranks | flags: every -z, -r, schedule and -tp/-sp at least once, with 1, 2 and 4 replicas.
for layout in "z1_r1_tp2_dp2|4|-ga 2 -z 1 -r 1 -tp 2" "z2_r2_offload_dp2|2|-ga 2 -z 2 -r 2 -offload 1 -n 3" \
              "z3_r3_offload2_dp4|4|-ga 1 -z 3 -r 3 -offload 2" "pp2_1f1b_z0|2|-ga 4 -pp 2 -n 3" "pp2_zb_tp2_sp|4|-ga 4 -pp 2 -ps zb -tp 2 -sp 1" \
              "pp2_interleaved|2|-ga 4 -pp 2 -ps interleaved -vp 2"; do
    IFS='|' read -r name np flags <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" gpt2 "$np" $flags
    case $name in *tp2*) same_as "$name" one 1e-5 ;; *) same_as "$name" one 1e-5 model ;; esac
done
run llama_one llama 1 -ga 4
run llama_pp2_zb_tp2_sp_r2 llama 4 -ga 4 -pp 2 -ps zb -tp 2 -sp 1 -r 2
same_as llama_pp2_zb_tp2_sp_r2 llama_one 1e-5

run one_bf16 gpt2 1 -ga 4 -p bf16
run tp2_z2_dp2_bf16 gpt2 4 -ga 2 -tp 2 -z 2 -p bf16
compare_py log tp2_z2_dp2_bf16_vs_one_rank "$TMP/tp2_z2_dp2_bf16/log.jsonl" "$TMP/one_bf16/log.jsonl" --steps 6 --tol 1e-2 --key loss
py_check bf16_step0_val_loss_as_fp32 "$TMP/one/log.jsonl" "$TMP/one_bf16/log.jsonl" "$TMP/tp2_z2_dp2_bf16/log.jsonl" <<'PY'
import json, sys
val0 = lambda p: next(r["val_loss"] for r in map(json.loads, open(p)) if r.get("step") == 0 and "val_loss" in r)
want = val0(sys.argv[1])
got = [val0(p) for p in sys.argv[2:]]
bad = [g for g in got if abs(g - want) > 1e-3 * want]
print("bf16 %s vs fp32 %.7g" % (got, want) if bad else "ok")
PY

# Resume. One rank: its step-3 checkpoint continued gives the straight run's bits.
cp -r "$TMP/one" "$TMP/one_resumed" && rm -rf "$TMP/one_resumed/ckpt_000006"
run one_resumed gpt2 1 -ga 4 -y 1
t_check resume_one_rank_announced "grep -q 'resumed from .*ckpt_000003 at step 3' '$TMP/one_resumed.txt'"
same_run resume_one_rank_bit_exact "$TMP/one_resumed" "$TMP/one" 6
# Across layouts that compute the same bits: 1f1b's checkpoint under zb, -z 2 -offload 1's under -z 3.
resume_as() {   # name, source run, ranks, flags...
    local name=$1 src=$2 np=$3; shift 3
    cp -r "$TMP/$src" "$TMP/$name" && rm -rf "$TMP/$name/ckpt_000006"
    run "$name" gpt2 "$np" -y 1 "$@"
    t_check "${name}_bit_exact" "grep -q 'resumed from .*ckpt_000003' '$TMP/$name.txt' && cmp -s '$TMP/$name/ckpt_000006/model.bin' \
        '$TMP/$src/ckpt_000006/model.bin' && diff <(fields '$TMP/$name/log.jsonl') <(fields '$TMP/$src/log.jsonl') > /dev/null" \
        "model.bin or the steps' losses differ from $src's"
}
resume_as resume_1f1b_as_zb pp2_1f1b_z0 2 -ga 4 -pp 2 -ps zb
resume_as resume_z2_offload_as_z3 z2_r2_offload_dp2 2 -ga 2 -z 3 -r 2
# One rank's checkpoint at 4 ranks of another topology: the same training within 1e-5.
cp -r "$TMP/one" "$TMP/resume_np4" && rm -rf "$TMP/resume_np4/ckpt_000006"
run resume_np4 gpt2 4 -y 1 -ga 4 -pp 2 -tp 2 -z 3
compare_py log resume_one_rank_at_pp2_tp2_z3 "$TMP/resume_np4/log.jsonl" "$TMP/one/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
t_finish
