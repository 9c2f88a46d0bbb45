#!/usr/bin/env bash
# Continuing a Hugging Face model on one's own text, end to end, as the README's "Continue training a Hugging
# Face model" section does it: a small made-up LlamaForCausalLM folder (weights written here, a tokenizer.json
# learned from the text by tests/tools/make_tiny_tokenizer.py) -> scripts/import_hf.py -> scripts/tokenize.py
# --tokenizer -> training on 2 ranks with -z 2 -> -prompt through the same tokenizer.json -> scripts/export_hf.py
# -> scripts/reference.py loads the exported folder, and its logits on the same tokens equal the trainer's.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip hf_e2e
export OMP_NUM_THREADS=1
H=$TMP/hf T=$TMP/text
mkdir -p "$H" "$T"
"$PYTHON" - "$T/own.txt" <<'PY'
import random, sys
random.seed(5)
who = ["The cat", "A DOG", "My neighbour's horse", "The old miller", "Zoë", "The café owner"]
did = ["sat on the mat", "ran to the river", "DIDN'T stop at the gate", "counted 12345 sheep", "sang all night"]
when = ["in the morning", "at 7 o'clock", "on day 2026", "when it rained", "before the harvest"]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for i in range(400):
        f.write("%s %s %s.%s" % (random.choice(who), random.choice(did), random.choice(when), "\r\n" if i % 7 == 0 else "\n"))
PY
"$PYTHON" tests/tools/make_tiny_tokenizer.py "$T/own.txt" "$H/tokenizer.json" --merges 200 ||
    { t_fail tiny_tokenizer "make_tiny_tokenizer.py failed"; t_finish; }

# The folder: a made-up LlamaForCausalLM beside that tokenizer (GQA, untied head, BF16 weights).
"$PYTHON" tests/tools/make_tiny_llama.py "$H" || t_fail hf_folder "could not write the folder"

"$PYTHON" scripts/import_hf.py "$H" "$TMP/start.bin" > "$TMP/import.txt" 2>&1 || t_fail hf_import "$(tail -1 "$TMP/import.txt")"
"$PYTHON" scripts/tokenize.py "$T" -o "$TMP/data" --name own --tokenizer "$H/tokenizer.json" --val-fraction 0.1 --quiet \
    > "$TMP/tok.txt" 2>&1 || t_fail tokenize_with_tokenizer_json "$(tail -1 "$TMP/tok.txt")"
run=(-e "$TMP/start.bin" -i "$TMP/data/own_train_*.bin" -j "$TMP/data/own_val_*.bin" -b 4 -t 32 -l 3e-3 -u 5 -v 10 -s 0)
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${run[@]}" -z 2 -x 30 -o "$TMP/run" > "$TMP/train.txt" 2>&1 ||
    t_fail train_2_ranks_z2 "$(grep -m1 error "$TMP/train.txt")"
t_check continued_training_learns "$PYTHON -c \"
import json, sys
v = [r['val_loss'] for r in map(json.loads, open('$TMP/run/log.jsonl')) if 'val_loss' in r]
sys.exit(0 if len(v) >= 2 and v[-1] < v[0] - 0.5 else 1)\"" "validation losses: $(grep -o '"val_loss": [0-9.]*' "$TMP/run/log.jsonl" | tr '\n' ' ')"
trained=$TMP/run/ckpt_000030/model.bin

# -prompt through the folder's tokenizer.json: its ids, greedily continued, decoded by the same file.
PROMPT="The café owner DIDN'T stop at"
./train_gpt_cpu -e "$trained" -tk "$H/tokenizer.json" -b 1 -t 32 -g 12 -temp 0 -prompt "$PROMPT" > "$TMP/gen.txt" 2>&1 ||
    t_fail generate "$(grep -m1 error "$TMP/gen.txt")"
t_check generated_text_follows_prompt "grep -qF \"$PROMPT\" '$TMP/gen.txt' && grep -q '^ids: \[[0-9]' '$TMP/gen.txt'" "$(tail -3 "$TMP/gen.txt")"
if command -v node > /dev/null 2>&1 && [ -d .npm/node_modules/@huggingface/tokenizers ]; then
    printf '%s' "$PROMPT" > "$TMP/prompt.txt"
    node tests/tools/hf_reference.js encode "$H/tokenizer.json" "$TMP/prompt.txt" "$TMP/prompt.u32" > /dev/null
    want=$("$PYTHON" -c "import numpy as np; print(', '.join(map(str, np.fromfile('$TMP/prompt.u32', dtype=np.uint32))))")
    t_check prompt_encoded_as_reference "grep -qF '[$want]' '$TMP/gen.txt'" "trainer: $(grep '^prompt' "$TMP/gen.txt"); reference: [$want]"
else
    t_missing prompt_encoded_as_reference "node and npm's @huggingface/tokenizers (.npm/)"
fi

# Back to Hugging Face, and the reference's logits from the exported folder equal the trainer's.
"$PYTHON" scripts/export_hf.py "$TMP/run/ckpt_000030" "$TMP/out" --tokenizer "$H" > "$TMP/export.txt" 2>&1 ||
    t_fail hf_export "$(tail -1 "$TMP/export.txt")"
t_check exported_folder_has_tokenizer "cmp -s '$H/tokenizer.json' '$TMP/out/tokenizer.json' && [ -s '$TMP/out/model.safetensors' ]"
dump=(-i "$TMP/data/own_val_*.bin" -b 2 -t 32 -x 1 -l 1e-3)
mkdir -p "$TMP/td"
./train_gpt_cpu -e "$trained" "${dump[@]}" -j "" -v 0 -s 0 -o "$TMP/tr" -dump "$TMP/td" > "$TMP/td.txt" 2>&1 || t_fail trainer_dump "$(grep -m1 error "$TMP/td.txt")"
"$PYTHON" scripts/reference.py -e "$TMP/out" "${dump[@]}" --quiet -o "$TMP/rr" -dump "$TMP/rd" > "$TMP/rd.txt" 2>&1 ||
    t_fail reference_reads_export "$(tail -1 "$TMP/rd.txt")"
compare_py array exported_logits_equal_trainer "$TMP/td/logits0.f32" "$TMP/rd/logits0.f32" --tol 1e-5
t_finish
