#!/usr/bin/env bash
# Resume: 10 steps straight vs 5 steps + resume + 5 steps give identical bits in the log (loss, lr,
# grad_norm, val_loss) and in the final model and optimizer state, for fp32 and bf16 storage.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/train.bin" -n 30000 -V 512 --seed 3 >/dev/null || t_fail shard "make_shard failed"
common=(-e L2C64H4V512T64 -i "$TMP/train.bin" -j "$TMP/train.bin" -b 2 -t 32 -ga 2 -l 1e-3 -u 2 -q 0.1 -c 0.1 -v 3 -m 2 -s 0 -sh 1)
fields() { grep -o '"step": [0-9]*, "\(loss\|val_loss\)": [^,}]*\(, "lr": [^,]*, "grad_norm": [^,]*\)\?' "$1"; }
for p in fp32 bf16; do
    ./train_gpt_cpu "${common[@]}" -p $p -x 10 -o "$TMP/straight_$p" >/dev/null || t_fail "resume_$p" "straight run failed"
    # The interrupted run: same schedule (-x 10), checkpoint at 5, then everything after step 5 is lost.
    ./train_gpt_cpu "${common[@]}" -p $p -x 10 -n 5 -o "$TMP/split_$p" >/dev/null || t_fail "resume_$p" "first run failed"
    rm -rf "$TMP/split_$p/ckpt_000010"
    ./train_gpt_cpu "${common[@]}" -p $p -x 10 -o "$TMP/split_$p" -y 1 > "$TMP/resumed_$p.txt" || t_fail "resume_$p" "resumed half failed"
    t_check "resume_${p}_announced" "grep -q 'resumed from .*ckpt_000005 at step 5' '$TMP/resumed_$p.txt'"
    t_check "resume_${p}_log_identical" "[ -n \"\$(fields $TMP/straight_$p/log.jsonl)\" ] && diff <(fields $TMP/straight_$p/log.jsonl) <(fields $TMP/split_$p/log.jsonl) >/dev/null" "logs differ"
    t_check "resume_${p}_log_has_10_steps" "[ \$(grep -c '\"loss\"' $TMP/split_$p/log.jsonl) -eq 10 ]"
    t_check "resume_${p}_model_identical" "cmp -s $TMP/straight_$p/ckpt_000010/model.bin $TMP/split_$p/ckpt_000010/model.bin"
    t_check "resume_${p}_state_identical" "cmp -s $TMP/straight_$p/ckpt_000010/state_rank0.bin $TMP/split_$p/ckpt_000010/state_rank0.bin"
done
# The run must actually learn something for the comparison to mean anything: losses differ across steps.
t_check resume_losses_vary "[ \$(fields $TMP/straight_fp32/log.jsonl | grep '\"loss\"' | cut -d, -f2 | sort -u | wc -l) -ge 9 ]"
# A one-layer model: its block tensors are still per-layer kinds in the state files (taken for single
# tensors when L = 1, their optimizer state would be dropped).
one=("${common[@]}" -e L1C64H4V512T64)
./train_gpt_cpu "${one[@]}" -x 4 -o "$TMP/l1_straight" > /dev/null 2>&1
./train_gpt_cpu "${one[@]}" -x 2 -o "$TMP/l1_split" > /dev/null 2>&1
./train_gpt_cpu "${one[@]}" -x 4 -o "$TMP/l1_split" -y 1 > /dev/null 2>&1
t_check resume_one_layer_model_identical "[ -s $TMP/l1_straight/ckpt_000004/model.bin ] && cmp -s $TMP/l1_straight/ckpt_000004/model.bin $TMP/l1_split/ckpt_000004/model.bin"
# A crash mid-checkpoint leaves a temporary directory behind; resume must ignore it and use the last complete one.
mkdir -p "$TMP/split_fp32/ckpt_tmp" && touch "$TMP/split_fp32/ckpt_tmp/model.bin"
mkdir -p "$TMP/split_fp32/ckpt_000011"   # incomplete: no DONE
./train_gpt_cpu "${common[@]}" -x 10 -o "$TMP/split_fp32" -y 1 > "$TMP/again.txt" 2>&1
t_check resume_skips_incomplete "grep -q 'resumed from .*ckpt_000010 at step 10' '$TMP/again.txt'"
t_finish
