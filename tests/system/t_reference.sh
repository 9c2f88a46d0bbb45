#!/usr/bin/env bash
# t_reference.sh: train_gpt_cpu's numbers vs the independent float64 PyTorch reference (scripts/reference.py):
# step-0 logits, every parameter's gradient, 10 AdamW steps' losses (warm-up, cosine, clipping, decay) and
# the final models. First checks the reference itself (tests/tools/ref_selftest.py), and the scripts' family
# seam: generic code names no family, and the families' -e grammar is the trainer's
# (tests/tools/family_seam_check.py). A missing trainer is a FAIL, never a skip: `make` builds it before the
# tests run.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
BIN=./train_gpt_cpu

# Runs a Python checker that prints its own ok/FAIL lines; a crash without a FAIL line is still a FAIL.
run_checker() {   # name, args...: a Python checker script printing its own ok/FAIL lines
    local name=$1; shift
    local out rc
    out=$("$PY" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|#) '
    if printf '%s\n' "$out" | grep -q '^FAIL '; then FAILED=1
    elif [ "$rc" -ne 0 ]; then t_fail "$name" "exited $rc: $(printf '%s\n' "$out" | tail -1)"; fi
}
run_or_fail() {   # name, log file, command...: runs it, FAILs with the last lines of its output if it fails
    local name=$1 log=$2; shift 2
    if "$@" >"$log" 2>&1; then return 0; fi
    t_fail "$name" "'$*' failed: $(tail -3 "$log" | tr '\n' ' ')"
    return 1
}

run_checker ref_selftest tests/tools/ref_selftest.py "$TMP/self"

if [ ! -x "$BIN" ]; then
    t_fail trainer_built "$BIN is missing (run: make train_gpt_cpu)"
    t_finish
fi
run_checker family_seam tests/tools/family_seam_check.py "$TMP/seam" "$BIN"

# V=500 is not a multiple of 128, so the model is padded to Vp=512 and the padding path is exercised;
# T=32 < maxT=64 leaves part of wpe unused; ga=2 exercises accumulation.
run_or_fail shard "$TMP/shard.log" "$PY" scripts/make_shard.py -o "$TMP/train.bin" -n 20000 -V 500 --seed 7 || t_finish
run_or_fail init "$TMP/init.log" $BIN -e L2C64H4V500T64 -i "$TMP/train.bin" -j "" -v 0 -s 0 -t 32 -x 0 -o "$TMP/init" \
    || t_finish
MODEL=$TMP/init/ckpt_000000/model.bin
t_check model_created "[ -s '$MODEL' ]" "$BIN -x 0 -o wrote no $MODEL"
[ -s "$MODEL" ] || t_finish

# -c 0.5 makes decoupled decay shrink the matrices by ~0.3% over the run, well above the final-model
# tolerance, so decay missing (or applied to biases / LayerNorm) fails. -gc 0.5 is below the step-0 norm
# of a fresh model on random tokens (~1.1), so clipping is active; the log comparison asserts that it was.
LR=1e-3
FLAGS=(-e "$MODEL" -i "$TMP/train.bin" -b 4 -t 32 -ga 2 -x 10 -l $LR -u 3 -q 0.1 -k cosine -c 0.5 -gc 0.5)
mkdir -p "$TMP/cd"   # the trainer does not create the -dump directory itself
run_or_fail trainer_run "$TMP/c.log" $BIN "${FLAGS[@]}" -j "" -v 0 -s 0 -o "$TMP/c" -dump "$TMP/cd" || t_finish
run_or_fail reference_run "$TMP/r.log" "$PY" scripts/reference.py "${FLAGS[@]}" --quiet -o "$TMP/r" -dump "$TMP/rd" \
    || t_finish

# (compare_py: tests/system/lib.sh, one compare.py process for all five.)
# Tolerances: the trainer computes in fp32, the reference in float64. A float32 run of the reference
# itself lands at ~3e-7 (logits) and ~6e-7 (per-tensor gradients), so 1e-5 / 1e-4 leave room for a
# different summation order while any real bug (a wrong term, a missed mask, one layer off) is far above.
compare_py array logits_step0 "$TMP/cd/logits0.f32" "$TMP/rd/logits0.f32" --tol 1e-5
compare_py scalar loss_step0 "$TMP/cd/loss0.txt" "$TMP/rd/loss0.txt" --tol 1e-5
compare_py grads grads_step0 "$TMP/cd/grads0.f32" "$TMP/rd/grads0.f32" "$MODEL" --tol 1e-4
compare_py log log_10_steps "$TMP/c/log.jsonl" "$TMP/r/log.jsonl" --steps 10 \
    --tol 1e-4 --key loss --key grad_norm --key lr --clip 0.5

# Final models: per tensor ||a-b||/||b|| < 1e-4 and every element within 1e-4 absolute (a tenth of one
# step's peak LR: Adam moves each element by at most ~lr per step, so a wrong update shows up there).
# The key bias is only bounded by the sum of the LRs: its exact gradient is 0 (see compare.py).
KB=$(lr_sum "$LR" 3 10 0.1)
FINAL=$TMP/c/ckpt_000010/model.bin
t_check final_checkpoint "[ -s '$FINAL' ]" "trainer wrote no $FINAL"
[ -s "$FINAL" ] && compare_py models final_model "$FINAL" "$TMP/r/model_final.bin" \
    --tol 1e-4 --abs 1e-4 --kbias-bound "$KB"
# Bad input to the reference: one line each.
ref_error() {   # name, regex, args...
    local name=$1 re=$2; shift 2
    "$PY" scripts/reference.py "$@" > /dev/null 2> "$TMP/referr"
    local rc=$?
    t_check "$name" "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/referr) -eq 1 ] && grep -Eq '^error: .*$re' $TMP/referr" "rc $rc: $(head -3 "$TMP/referr")"
}
ref_error reference_greedy_id_outside_vocab "token 99 is outside the model.s vocabulary of 16" -e L1C8H2V16T8 -t 8 -x 0 --greedy 2 --prompt-ids 1,99
ref_error reference_greedy_id_not_a_number "expected comma-separated token ids" -e L1C8H2V16T8 -t 8 -x 0 --greedy 2 --prompt-ids 1,x
ref_error reference_greedy_t_beyond_maxT "-t 64 exceeds the model.s maxT 8" -e L1C8H2V16T8 -t 64 -x 0 --greedy 2 --prompt-ids 1
touch "$TMP/afile"
ref_error reference_o_is_a_file "-o .*afile exists and is not a directory" -e L1C8H2V16T8 -t 8 -x 0 -o "$TMP/afile"
ref_error reference_save_missing_dir "cannot write .*nodir/m.bin" -e L1C8H2V16T8 -t 8 -x 0 --save "$TMP/nodir/m.bin"
t_finish
