#!/usr/bin/env bash
# t_lora_reference.sh: LoRA (-lora) on one rank, fp32, against the float64 reference (scripts/reference.py) and
# through the scripts, as the README's LoRA variant of fine-tuning on conversations runs it: a Llama shape from
# a Hugging Face folder (tests/tools/make_tiny_llama.py: GQA, an untied head; every target, rsLoRA, -pack 1)
# and GPT-2 (qkv,proj,fcproj, -pack 0), both on conversations (scripts/tokenize.py --chat: masks), from
# adapter files whose B is not zero (so that A's gradient is not either):
# - step-0 logits, loss and each adapter tensor's gradient (the frozen base's exactly zero); 8 steps' loss,
#   gradient norm, LR and labels; the validation losses; the trained adapters; and the logits, loss and
#   gradients again at the trained adapters: all within 1e-5 of the reference;
# - the merged export (export_hf.py --merge) has the adapted model's logits, and -chat with the adapters
#   answers as the merged model does;
# - the base model file's bytes are the same after training and checkpoints, and the frozen base in memory
#   too: the validation loss after 8 steps is, bit for bit, the one a fresh run computes from the base file
#   and the step-8 adapters;
# - the checkpoint's adapters through PEFT's folder (export_hf.py --adapter, import_hf.py --adapter) come back
#   bit for bit.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    t_missing lora_reference "PyTorch (python3-torch)"
    t_finish
fi
BIN=./train_gpt_cpu
export OMP_NUM_THREADS=1   # tiny matrices: more threads only wait on each other
H=$TMP/hf D=$TMP/chat
mkdir -p "$H"
# tests/tools/lora_ref_check.py's commands, one a line (tab-separated), run together at the end.
: > "$TMP/checks.tsv"
later() { (IFS=$'\t'; echo "$*") >> "$TMP/checks.tsv"; }
fail_line() {   # name, output file: the first error line, else the last line
    t_fail "$1" "$(grep -m1 error "$2" || tail -1 "$2")"
}

# Conversations with something to learn; a tokenizer learned from them with Llama 3 Instruct's chat template;
# a Llama folder of that vocabulary; the conversations' shards with the masks of the assistants' turns.
"$PYTHON" tests/tools/capital_chats.py "$TMP/chats.jsonl" "$TMP/text.txt" -n 60 --countries 6 --llama3-config "$H/tokenizer_config.json"
"$PYTHON" tests/tools/make_tiny_tokenizer.py "$TMP/text.txt" "$H/tokenizer.json" --merges 60 \
    --special '<|start_header_id|>' --special '<|end_header_id|>' --special '<|eot_id|>' > /dev/null
"$PYTHON" tests/tools/make_tiny_llama.py "$H"
"$PYTHON" scripts/import_hf.py "$H" "$TMP/llama.bin" > "$TMP/import.txt" 2>&1 || fail_line hf_import "$TMP/import.txt"
"$PYTHON" scripts/tokenize.py --chat "$TMP/chats.jsonl" --tokenizer "$H/tokenizer.json" -o "$D" --name chat \
    --val-fraction 0.1 --quiet > "$TMP/tok.txt" 2>&1 || fail_line tokenize_chat "$TMP/tok.txt"
$BIN -e L2C64H4V512T64 -i "$D/chat_train_*.bin" -j "" -t 32 -pack 0 -x 0 -s 0 -o "$TMP/init" > "$TMP/init.txt" 2>&1 &&
    cp "$TMP/init/ckpt_000000/model.bin" "$TMP/gpt2.bin" || fail_line gpt2_init "$TMP/init.txt"
cp "$TMP/gpt2.bin" "$TMP/gpt2.orig"
cp "$TMP/llama.bin" "$TMP/llama.orig"

# A family's LoRA flags and its packing (into the arrays lora and data).
family() {   # gpt2 | llama
    if [ "$1" = gpt2 ]; then
        lora=(-e "$TMP/gpt2.bin" -lora 4 -lora-alpha 8 -lora-targets qkv,proj,fcproj)
        data=(-i "$D/chat_train_*.bin" -j "$D/chat_val_*.bin" -t 32 -pack 0)
    else
        lora=(-e "$TMP/llama.bin" -lora 3 -lora-alpha 6 -lora-rslora 1)
        data=(-i "$D/chat_train_*.bin" -j "$D/chat_val_*.bin" -t 64 -pack 1)
    fi
}
printf 'adapter\t%s\n' "$TMP/gpt2.bin	$TMP/gpt2_start.bin	4	8	0	qkv,proj,fcproj	5" \
    "$TMP/llama.bin	$TMP/llama_start.bin	3	6	1	q,k,v,o,gate,up,down	9" | "$PYTHON" tests/tools/lora_ref_check.py ||
    t_fail adapter_files "lora_ref_check.py adapter failed"
# 8 steps with warm-up, cosine decay, weight decay and clipping (-gc 0.25 is below most steps' norms); then one
# step from the trained adapters, for their gradients and for the validation loss a fresh run computes.
train=(-b 2 -ga 2 -x 8 -l 1e-3 -u 3 -q 0.1 -k cosine -c 0.5 -gc 0.25 -v 4 -m 1)
again=(-b 2 -x 1 -v 1 -m 1)
: > "$TMP/ref_runs.tsv"
for fam in gpt2 llama; do
    family $fam
    for run in train again; do
        start=$TMP/${fam}_start.bin steps=("${train[@]}")
        [ $run = again ] && start=$TMP/c_${fam}_train/ckpt_000008/adapters.bin steps=("${again[@]}")
        args=("${lora[@]}" "${data[@]}" "${steps[@]}" -lora-init "$start")
        $BIN "${args[@]}" -s 0 -o "$TMP/c_${fam}_$run" -dump "$TMP/cd_${fam}_$run" > "$TMP/c_${fam}_$run.txt" 2>&1 ||
            fail_line "${fam}_${run}_trainer" "$TMP/c_${fam}_$run.txt"
        (IFS=$'\t'; echo "${args[*]}"$'\t'--quiet$'\t'-o$'\t'"$TMP/r_${fam}_$run"$'\t'-dump$'\t'"$TMP/rd_${fam}_$run") >> "$TMP/ref_runs.tsv"
    done
done
"$PYTHON" tests/tools/reference_runs.py < "$TMP/ref_runs.tsv" > "$TMP/ref_runs.txt" 2>&1
grep '^FAIL' "$TMP/ref_runs.txt" && FAILED=1

# Tolerances: fp32 against float64, as t_reference.sh's.
for fam in gpt2 llama; do
    c=$TMP/c_${fam}_train r=$TMP/r_${fam}_train
    model=$TMP/$fam.bin
    for run in train again; do
        compare_py array "${fam}_${run}_logits_step0" "$TMP/cd_${fam}_$run/logits0.f32" "$TMP/rd_${fam}_$run/logits0.f32" --tol 1e-5
        compare_py scalar "${fam}_${run}_loss_step0" "$TMP/cd_${fam}_$run/loss0.txt" "$TMP/rd_${fam}_$run/loss0.txt" --tol 1e-5
    done
    later grads "${fam}_adapter_grads_step0" "$model" "$TMP/${fam}_start.bin" "$TMP/cd_${fam}_train/grads0.f32" \
        "$TMP/rd_${fam}_train/grads0.f32" 1e-5
    later grads "${fam}_adapter_grads_after_8_steps" "$model" "$TMP/${fam}_start.bin" "$TMP/cd_${fam}_again/grads0.f32" \
        "$TMP/rd_${fam}_again/grads0.f32" 1e-5
    compare_py log "${fam}_8_steps" "$c/log.jsonl" "$r/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm \
        --key lr --key trained --clip 0.25
    later val "${fam}_val_losses" "$c/log.jsonl" "$r/log.jsonl" 1e-5
    later adapters "${fam}_trained_adapters" "$model" "$c/ckpt_000008/adapters.bin" "$r/lora_final.bin" \
        "$TMP/${fam}_start.bin" 1e-5
    # The frozen base: its file as it was, and in memory too.
    t_check "${fam}_base_file_unchanged" "cmp -s '$model' '$TMP/$fam.orig' && [ ! -e '$c/ckpt_000008/model.bin' ]" \
        "$model changed, or the checkpoint holds a model.bin"
    at8=$(grep -o '"step": 8, "val_loss": [^}]*' "$c/log.jsonl" | sed 's/.*: //')
    fresh=$(grep -o '"step": 0, "val_loss": [^}]*' "$TMP/c_${fam}_again/log.jsonl" | sed 's/.*: //')
    t_check "${fam}_base_in_memory_unchanged" "[ -n '$at8' ] && [ '$at8' = '$fresh' ]" \
        "validation loss $at8 after 8 steps, $fresh from the base file and the step-8 adapters"
done
later learns llama_lora_learns "$TMP/c_llama_train/log.jsonl" 0.05

# The merged export (fp32, so that the merge is rounded once) has the adapted model's logits; -chat with
# the adapters answers as the merged model does.
for fam in gpt2 llama; do
    ad=$TMP/c_${fam}_train/ckpt_000008/adapters.bin
    family $fam
    tok=(); [ $fam = llama ] && tok=(--tokenizer "$H")   # the folder's tokenizer beside the weights, as the README's
    "$PYTHON" scripts/export_hf.py "$TMP/$fam.bin" "$TMP/merged_$fam" --adapter "$ad" --merge --dtype fp32 "${tok[@]}" \
        > "$TMP/merge_$fam.txt" 2>&1 || fail_line "${fam}_export_merge" "$TMP/merge_$fam.txt"
    "$PYTHON" scripts/import_hf.py "$TMP/merged_$fam" "$TMP/merged_$fam.bin" > "$TMP/merged_$fam.txt" 2>&1 ||
        fail_line "${fam}_import_merged" "$TMP/merged_$fam.txt"
    $BIN -e "$TMP/merged_$fam.bin" "${data[@]}" "${again[@]}" -s 0 -dump "$TMP/md_$fam" > "$TMP/md_$fam.txt" 2>&1 ||
        fail_line "${fam}_merged_trainer" "$TMP/md_$fam.txt"
    compare_py array "${fam}_merged_export_logits" "$TMP/md_$fam/logits0.f32" "$TMP/cd_${fam}_again/logits0.f32" --tol 1e-5
done
chat=(-tk "$D/tokenizer.json" -b 1 -t 64 -g 12 -temp 0 -chat "What is the capital of Japan?" -chat-ids 1)
family llama
$BIN "${lora[@]}" -lora-init "$TMP/c_llama_train/ckpt_000008/adapters.bin" "${chat[@]}" > "$TMP/chat_lora.txt" 2>&1 ||
    fail_line chat_lora "$TMP/chat_lora.txt"
$BIN -e "$TMP/merged_llama.bin" "${chat[@]}" > "$TMP/chat_merged.txt" 2>&1 || fail_line chat_merged "$TMP/chat_merged.txt"
t_check chat_with_adapters_is_merged_models "grep -q '^ids: \[[0-9]' '$TMP/chat_lora.txt' && cmp -s '$TMP/chat_lora.txt' '$TMP/chat_merged.txt'" \
    "$(grep '^ids' "$TMP/chat_lora.txt") vs merged $(grep '^ids' "$TMP/chat_merged.txt")"

# The checkpoint's adapters as PEFT's folder and back.
ad=$TMP/c_llama_train/ckpt_000008/adapters.bin
"$PYTHON" scripts/export_hf.py "$TMP/llama.bin" "$TMP/peft" --adapter "$ad" > "$TMP/peft.txt" 2>&1 ||
    fail_line export_adapter "$TMP/peft.txt"
"$PYTHON" scripts/import_hf.py --adapter "$TMP/peft" "$TMP/back.bin" --base "$TMP/llama.bin" > "$TMP/back.txt" 2>&1 ||
    fail_line import_adapter "$TMP/back.txt"
t_check peft_folder_round_trip "[ -s '$TMP/peft/adapter_model.safetensors' ] && cmp -s '$ad' '$TMP/back.bin'" \
    "$(ls "$TMP/peft" | tr '\n' ' ')"

out=$("$PYTHON" tests/tools/lora_ref_check.py < "$TMP/checks.tsv" 2>&1) || FAILED=1
grep -E "^(ok|FAIL|#) " <<< "$out"
[ "$(grep -cE '^(ok|FAIL) ' <<< "$out")" = "$(wc -l < "$TMP/checks.tsv")" ] ||
    t_fail lora_ref_checks "$(wc -l < "$TMP/checks.tsv") checks, $(grep -cE '^(ok|FAIL) ' <<< "$out") answered: $(tail -1 <<< "$out")"
t_finish
