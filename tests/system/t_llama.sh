#!/usr/bin/env bash
# The Llama family (models/llama) on the CPU build:
# - layouts: with grouped-query attention (2 kv heads of 4), a head size other than C/H, q/k norms, llama3
#   rope scaling and an untied head, every layout -r 1..3, -z 3, -offload, -pp (1f1b, zb, interleaved), -tp,
#   -tp -sp gives the one-rank run's loss and gradient norm at each step (relative 1e-5); a tied head through
#   the pipeline's mirror likewise; resume across layouts continues the straight run;
# - one kv head (with Qwen2's q/k/v biases) under -tp 2 and 4: copies of the kv head on several ranks, in
#   every layout equal to one rank, resumed at -tp 4 from a one-rank checkpoint;
# - bf16 (recompute's same bits; -tp, -pp -z 3 within bf16's rounding) and fp16 with its loss scale on 2 ranks;
# - -lb's breakdown per step and stage; -dpu against the reference's delayed update, and on 2 ranks -z 3
#   with offloaded parameters;
# - generation from a prompt: greedy ids equal the reference's; -pp 2 -tp 2 prints the one-rank text;
# - one rank in fp32 against the float64 reference (scripts/reference.py): step-0 logits, loss and every
#   gradient, 8 AdamW steps with -ga 2 (losses, gradient norms) and the final model;
# - the fenced build gives the CPU build's bits for a Llama run;
# - --estimate prints the published parameter counts of the named shapes;
# - bad shapes are one-line errors that name the field.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip llama
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 40000 -V 512 --seed 6 >/dev/null
untied="llama:L4,C64,H4,K2,D32,F96,V512,T64,qknorm,rope-llama3:8/1/4/32"
tied="llama:L4,C64,H4,K1,F96,V512,T64,tied"
flags=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -x 6 -l 2e-3 -u 2 -q 0.1 -c 0.1 -gc 1.0 -v 0 -s 0 -sh 1)
run() {   # dir, model, ranks, flags...
    local dir=$1 model=$2 np=$3; shift 3
    "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu -e "$model" "${flags[@]}" -o "$TMP/$dir" "$@" > "$TMP/$dir.txt" 2>&1 ||
        t_fail "$dir" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
same_as() {   # dir, reference dir
    compare_py log "$1_vs_one_rank" "$TMP/$1/log.jsonl" "$TMP/$2/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
}

run ref "$untied" 1 -ga 4 -n 3
for layout in "r1|1|-ga 4 -r 1" "r2|1|-ga 4 -r 2" "r3|1|-ga 4 -r 3" "z3|2|-ga 2 -z 3" "z2_offload|2|-ga 2 -z 2 -offload 1" \
              "pp2|2|-ga 4 -pp 2" "pp2_zb|2|-ga 4 -pp 2 -ps zb" "tp2|2|-ga 4 -tp 2" "tp2_sp|2|-ga 4 -tp 2 -sp 1" \
              "pp2_tp2_z3|4|-ga 4 -pp 2 -tp 2 -z 3"; do
    IFS='|' read -r name np extra <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$untied" "$np" $extra
    same_as "$name" ref
done
run tied_ref "$tied" 1 -ga 4
run tied_pp2 "$tied" 2 -ga 4 -pp 2
same_as tied_pp2 tied_ref
run tied_interleaved "$tied" 2 -ga 4 -pp 2 -ps interleaved -vp 2
same_as tied_interleaved tied_ref

# Resume: the one-rank run's step-3 checkpoint continued under -pp 2 -z 1 gives the straight run's steps 3..5.
cp -r "$TMP/ref" "$TMP/resumed"
rm -rf "$TMP/resumed/ckpt_000006" "$TMP/resumed/log.jsonl"
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$untied" "${flags[@]}" -ga 4 -pp 2 -z 1 -o "$TMP/resumed" -y 1 > "$TMP/resumed.txt" 2>&1 ||
    t_fail resumed "exited non-zero: $(grep -m1 error "$TMP/resumed.txt")"
# A resumed run's log: steps 3..5 only, each loss within 1e-5 of the straight run's.
resumed_as_straight() {   # name, resumed log, straight log
    py_check "$1" "$2" "$3" <<'PY'
import json, sys
def steps(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "grad_norm" in r}
got, ref = steps(sys.argv[1]), steps(sys.argv[2])
bad = [s for s in range(3, 6) if s not in got or abs(got[s]["loss"] - ref[s]["loss"]) > 1e-5 * abs(ref[s]["loss"])]
if sorted(got) != [3, 4, 5]:
    print("the resumed run logged steps %s, not 3..5" % sorted(got))
else:
    print("steps %s differ from the straight run" % bad if bad else "ok")
PY
}
resumed_as_straight llama_resume_across_layouts "$TMP/resumed/log.jsonl" "$TMP/ref/log.jsonl"

# Fewer kv heads than tensor ranks (one kv head, Qwen2's q/k/v biases, q/k norms): each kv head is copied on
# tp ranks, whose gradients for it are summed; every layout matches one rank, and a one-rank checkpoint
# resumes at -tp 4 (the copies load the same master and moments).
copied="llama:L2,C64,H4,K1,D32,F96,V512,T64,qknorm,qkvbias"
run copied_ref "$copied" 1 -ga 4 -n 3
for layout in "copied_tp2|2|-ga 4 -tp 2" "copied_tp4_sp|4|-ga 4 -tp 4 -sp 1" "copied_pp2_tp2_zb|4|-ga 4 -pp 2 -tp 2 -ps zb -z 1" \
              "copied_tp2_dp2_z3|4|-ga 2 -tp 2 -z 3"; do
    IFS='|' read -r name np extra <<< "$layout"
    # shellcheck disable=SC2086
    run "$name" "$copied" "$np" $extra
    same_as "$name" copied_ref
done
cp -r "$TMP/copied_ref" "$TMP/copied_resumed"
rm -rf "$TMP/copied_resumed/ckpt_000006" "$TMP/copied_resumed/log.jsonl"
run copied_resumed "$copied" 4 -ga 4 -tp 4 -y 1
resumed_as_straight llama_kv_copies_resume_at_tp4 "$TMP/copied_resumed/log.jsonl" "$TMP/copied_ref/log.jsonl"

# bf16 and fp16: recompute gives the same bits; -tp and the pipeline follow the one-rank run (bf16's
# stochastic rounding moves small weights by whole steps, so within 2e-2 as GPT-2's t_tp.sh); fp16 with its
# loss scale (no overflow: still the initial 65536) on 2 ranks follows one rank within 5e-3 (an 11-bit
# mantissa, micro-batches accumulated in another order).
run bf16_ref "$untied" 1 -ga 4 -p bf16
run bf16_r3 "$untied" 1 -ga 4 -p bf16 -r 3
t_check llama_bf16_recompute_same_bits "cmp -s '$TMP/bf16_ref/ckpt_000006/model.bin' '$TMP/bf16_r3/ckpt_000006/model.bin'"
run bf16_tp2 "$untied" 2 -ga 4 -p bf16 -tp 2
compare_py log llama_bf16_tp2 "$TMP/bf16_tp2/log.jsonl" "$TMP/bf16_ref/log.jsonl" --steps 6 --tol 2e-2 --key loss
run bf16_pp2_z3 "$untied" 4 -ga 2 -p bf16 -pp 2 -z 3
compare_py log llama_bf16_pp2_z3 "$TMP/bf16_pp2_z3/log.jsonl" "$TMP/bf16_ref/log.jsonl" --steps 6 --tol 2e-2 --key loss
run fp16_ref "$untied" 1 -ga 4 -p fp16
run fp16_z2 "$untied" 2 -ga 2 -p fp16 -z 2
compare_py log llama_fp16_z2 "$TMP/fp16_z2/log.jsonl" "$TMP/fp16_ref/log.jsonl" --steps 6 --tol 5e-3 --key loss --key grad_norm
t_check llama_fp16_loss_scaled "grep -q '\"loss_scale\": *65536' '$TMP/fp16_z2/ckpt_000006/manifest.json'" \
    "$(grep -o '"loss_scale[^,]*' "$TMP/fp16_z2/ckpt_000006/manifest.json")"

# -lb: the phase breakdown of each step and each pipeline stage, and the same training as without it.
run lb "$untied" 4 -ga 4 -pp 2 -tp 2 -lb 1 -x 3
run nolb "$untied" 4 -ga 4 -pp 2 -tp 2 -x 3
t_check llama_breakdown_each_step "[ \$(grep -c '^step .* breakdown (synchronized' '$TMP/lb.txt') = 3 ] && [ \$(grep -c '^  stage [01]: forward' '$TMP/lb.txt') = 6 ]" \
    "$(grep -m2 breakdown "$TMP/lb.txt")"
t_check llama_breakdown_same_training "cmp -s '$TMP/lb/ckpt_000003/model.bin' '$TMP/nolb/ckpt_000003/model.bin'"

# Against the float64 reference: the same model file, data and flags.
./train_gpt_cpu -e "$untied" -i "$TMP/data.bin" -j "" -v 0 -s 0 -t 32 -x 0 -o "$TMP/init" > "$TMP/init.txt" 2>&1 || t_fail init "exited non-zero"
model=$TMP/init/ckpt_000000/model.bin
rflags=(-e "$model" -i "$TMP/data.bin" -b 2 -t 32 -ga 2 -x 8 -l 1e-3 -u 3 -q 0.1 -k cosine -c 0.5 -gc 0.5)
mkdir -p "$TMP/cd"
./train_gpt_cpu "${rflags[@]}" -j "" -v 0 -s 0 -o "$TMP/c" -dump "$TMP/cd" > "$TMP/c.txt" 2>&1 || t_fail trainer_run "exited non-zero"
$PYTHON scripts/reference.py "${rflags[@]}" --quiet -o "$TMP/r" -dump "$TMP/rd" > "$TMP/r.txt" 2>&1 ||
    t_fail reference_run "$(tail -2 "$TMP/r.txt")"
compare_py array llama_logits_step0 "$TMP/cd/logits0.f32" "$TMP/rd/logits0.f32" --tol 1e-5
compare_py scalar llama_loss_step0 "$TMP/cd/loss0.txt" "$TMP/rd/loss0.txt" --tol 1e-5
compare_py grads llama_grads_step0 "$TMP/cd/grads0.f32" "$TMP/rd/grads0.f32" "$model" --tol 1e-5
compare_py log llama_log_8_steps "$TMP/c/log.jsonl" "$TMP/r/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm --key lr --clip 0.5
compare_py models llama_final_model "$TMP/c/ckpt_000008/model.bin" "$TMP/r/model_final.bin" --tol 1e-4 --abs 1e-4

# -dpu: the update lands one step late from step 2, as the reference's delayed update; 2 ranks with -z 3 and
# offloaded parameters accumulate the same global batch as one.
./train_gpt_cpu "${rflags[@]}" -j "" -v 0 -s 0 -offload 1 -dpu 2 -o "$TMP/cdpu" > "$TMP/cdpu.txt" 2>&1 || t_fail dpu_run "$(grep -m1 error "$TMP/cdpu.txt")"
$PYTHON scripts/reference.py "${rflags[@]}" -dpu 2 --quiet -o "$TMP/rdpu" > "$TMP/rdpu.txt" 2>&1 || t_fail dpu_reference "$(tail -1 "$TMP/rdpu.txt")"
compare_py log llama_dpu_vs_reference "$TMP/cdpu/log.jsonl" "$TMP/rdpu/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${rflags[@]}" -ga 1 -j "" -v 0 -s 0 -z 3 -offload 2 -dpu 2 -o "$TMP/cdpu2" > "$TMP/cdpu2.txt" 2>&1 ||
    t_fail dpu_np2 "$(grep -m1 error "$TMP/cdpu2.txt")"
compare_py log llama_dpu_np2_z3_offload2 "$TMP/cdpu2/log.jsonl" "$TMP/cdpu/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm

# The fenced build (device memory the host cannot touch) gives the CPU build's bits.
build/train_gpt_fenced -e "$untied" "${flags[@]}" -ga 2 -o "$TMP/fenced" > "$TMP/fenced.txt" 2>&1 || t_fail fenced "exited non-zero"
./train_gpt_cpu -e "$untied" "${flags[@]}" -ga 2 -o "$TMP/plain" > "$TMP/plain.txt" 2>&1 || t_fail plain "exited non-zero"
t_check llama_fenced_same_bits "cmp -s '$TMP/fenced/ckpt_000006/model.bin' '$TMP/plain/ckpt_000006/model.bin'"

# Generation from a prompt: a tied Llama with GPT-2's vocabulary trained a little on a text continues a prompt
# greedily with the float64 reference's ids, and -pp 2 with copied kv heads (-tp 2 of one kv head) prints
# the one-rank text.
mkdir -p "$TMP/text" "$TMP/tok"
for i in $(seq 1 60); do echo "In the beginning the cat sat on the mat, and the dog lay by the door. Number $i."; done > "$TMP/text/a.txt"
$PYTHON scripts/tokenize.py "$TMP/text" -o "$TMP/tok" --name t --val-fraction 0.1 --quiet > "$TMP/tok.txt" 2>&1 || t_fail tokenize "$(tail -1 "$TMP/tok.txt")"
"${MPIRUN[@]}" -np 1 ./train_gpt_cpu -e "llama:L2,C64,H4,K1,F128,T64,tied" -i "$TMP/tok/t_train_*.bin" -j "" -b 4 -t 32 -x 40 -l 3e-3 -u 5 \
    -v 0 -s 0 -o "$TMP/gen" > "$TMP/gen.txt" 2>&1 || t_fail generation_model "$(grep -m1 error "$TMP/gen.txt")"
gmodel=$TMP/gen/ckpt_000040/model.bin
generate() {   # out, ranks, flags...
    local out=$1 np=$2; shift 2
    "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu -e "$gmodel" -tk "$TMP/tok/gpt2_tokenizer.bin" -b 1 -t 16 -g 20 -temp 0 \
        -prompt "The dog lay by the door, and the" "$@" > "$out" 2>&1
}
generate "$TMP/g1" 1
generate "$TMP/g4" 4 -pp 2 -tp 2
prompt_ids=$(grep '^prompt' "$TMP/g1" | sed 's/.*\[\(.*\)\]/\1/; s/ //g')
$PYTHON scripts/reference.py -e "$gmodel" --greedy 20 --prompt-ids "$prompt_ids" -t 16 > "$TMP/gref.txt" 2>&1
t_check llama_greedy_matches_reference "[ -n \"\$(grep '^ids: ' $TMP/g1)\" ] && [ \"\$(grep '^ids: ' $TMP/g1)\" = \"\$(grep '^ids: ' $TMP/gref.txt)\" ]" \
    "trainer $(grep '^ids: ' "$TMP/g1"); reference $(grep '^ids: ' "$TMP/gref.txt"; tail -1 "$TMP/gref.txt")"
t_check llama_generation_pp2_tp2_as_one_rank "[ -n \"\$(grep '^ids: ' $TMP/g4)\" ] && diff <(sed -n '/^prompt: /,\$p' $TMP/g1) <(sed -n '/^prompt: /,\$p' $TMP/g4) >/dev/null"

# --estimate: the published parameter counts (their model cards and config.json files).
for pair in smollm2-135m:134515008 smollm2-360m:361821120 smollm2-1.7b:1711376384 llama3.2-1b:1235814400 \
            llama3.2-3b:3212749824 llama3.1-8b:8030261248 qwen3-0.6b:596049920 qwen3-1.7b:1720574976; do
    name=${pair%%:*} want=${pair#*:}
    got=$(./train_gpt_cpu -e "$name" --estimate -b 1 -t 64 2>&1 | sed -n 's/^model: .*, \([0-9]*\) parameters .*/\1/p')
    t_check "llama_estimate_params_$name" "[ '$got' = '$want' ]" "got '$got', published $want"
done

# Bad shapes: one line naming the field, exit 1.
bad() {   # name, expected message part, model, extra flags...
    local name=$1 want=$2 model=$3; shift 3
    local err rc
    err=$("${MPIRUN[@]}" -np "${NP:-1}" ./train_gpt_cpu -e "$model" "${flags[@]}" -x 1 "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 0 ] && [ "$(grep -c '^error: ' <<< "$err")" -ge 1 ] && grep -q -- "$want" <<< "$err"; then t_ok "llama_error_$name"
    else t_fail "llama_error_$name" "rc $rc, stderr: $(head -c 300 <<< "$err")"; fi
}
bad kv_heads_divide_heads "n_kv_heads 3 does not divide the 4 heads" "llama:L2,C64,H4,K3,F96,V512,T64"
bad head_size "head size 12 must be a multiple of 8" "llama:L2,C48,H4,F96,V512,T64"
bad missing_field "L, C, H and F are required" "llama:L2,C64,H4,V512"
bad unknown_field "unknown field 'Z9'" "llama:L2,C64,H4,F96,Z9"
$PYTHON -c "import sys, numpy as np
h = np.fromfile(sys.argv[1], dtype=np.int32); h[21] = 2; h.tofile(sys.argv[2])" "$model" "$TMP/bad_flag.bin"
bad header_flag "header slot 21 (qkv_bias) is 2, not 0 or 1" "$TMP/bad_flag.bin"
NP=2 bad tp_kv_heads "-tp 2 and n_kv_heads 3: one must divide the other" "llama:L2,C96,H6,K3,F96,V512,T64" -tp 2
NP=2 bad tp_intermediate "does not divide the MLP's intermediate size 97" "llama:L2,C64,H4,K2,F97,V512,T64" -tp 2
t_finish
