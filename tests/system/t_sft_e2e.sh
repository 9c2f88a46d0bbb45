#!/usr/bin/env bash
# Fine-tuning a published model on one's own conversations, end to end, as the README's "Fine-tuning a
# published model on your conversations" section does it: a small made-up LlamaForCausalLM folder with a real
# chat template (Llama 3 Instruct's, tests/data/chat/llama3_instruct.json) and a tokenizer.json learned from the
# conversations plus the template's special tokens -> scripts/import_hf.py -> scripts/tokenize.py --chat ->
# fine-tuning on 2 ranks with -z 2 -> -chat through chat_format.json -> scripts/export_hf.py.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip sft_e2e
export OMP_NUM_THREADS=1
H=$TMP/hf C=$TMP/chats.jsonl
mkdir -p "$H"
# Made-up conversations with something to learn, sometimes with a second turn (tests/tools/capital_chats.py).
"$PYTHON" tests/tools/capital_chats.py "$C" "$TMP/text.txt" -n 240 --thanks-every 4 --llama3-config "$H/tokenizer_config.json"
"$PYTHON" tests/tools/make_tiny_tokenizer.py "$TMP/text.txt" "$H/tokenizer.json" --merges 150 \
    --special '<|start_header_id|>' --special '<|end_header_id|>' --special '<|eot_id|>' ||
    { t_fail tiny_tokenizer "make_tiny_tokenizer.py failed"; t_finish; }
"$PYTHON" tests/tools/make_tiny_llama.py "$H" || t_fail hf_folder "could not write the folder"

"$PYTHON" scripts/import_hf.py "$H" "$TMP/start.bin" > "$TMP/import.txt" 2>&1 || t_fail hf_import "$(tail -1 "$TMP/import.txt")"
"$PYTHON" scripts/tokenize.py --chat "$C" --tokenizer "$H/tokenizer.json" -o "$TMP/data" --name chat --val-fraction 0.1 \
    > "$TMP/tok.txt" 2>&1 || t_fail tokenize_chat "$(tail -1 "$TMP/tok.txt")"
t_check chat_shards_with_masks "ls '$TMP'/data/chat_train_*.mask '$TMP'/data/chat_val_*.mask '$TMP/data/chat_format.json' > /dev/null" \
    "$(ls "$TMP/data" | tr '\n' ' ')"

run=(-e "$TMP/start.bin" -i "$TMP/data/chat_train_*.bin" -j "$TMP/data/chat_val_*.bin" -b 4 -t 64 -l 3e-3 -u 5 -v 10 -s 0)
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${run[@]}" -z 2 -x 30 -o "$TMP/run" > "$TMP/train.txt" 2>&1 ||
    t_fail finetune_2_ranks_z2 "$(grep -m1 error "$TMP/train.txt")"
t_check packed_conversations "grep -qE '^data: [0-9]+ documents packed into [0-9]+ rows of -t 64' '$TMP/train.txt'" \
    "$(grep -m1 '^data' "$TMP/train.txt")"
t_check finetuning_learns_the_answers "$PYTHON -c \"
import json, sys
r = list(map(json.loads, open('$TMP/run/log.jsonl')))
v = [x['val_loss'] for x in r if 'val_loss' in x]
t = [x['trained_tok_s'] for x in r if 'trained_tok_s' in x]
sys.exit(0 if len(v) >= 2 and v[-1] < v[0] - 1.0 and t and min(t) > 0 else 1)\"" \
    "validation losses: $(grep -o '"val_loss": [0-9.]*' "$TMP/run/log.jsonl" | tr '\n' ' ')"
trained=$TMP/run/ckpt_000030/model.bin

# -chat through the shards' tokenizer.json and chat_format.json: the prompt's ids are those tokenize.py gives the
# same question (its rendering up to the assistant's header), and a reply follows.
Q="What is the capital of Japan?"
./train_gpt_cpu -e "$trained" -tk "$TMP/data/tokenizer.json" -b 1 -t 64 -g 12 -temp 0 -chat "$Q" -chat-ids 1 \
    > "$TMP/chat.txt" 2>&1 || t_fail chat "$(grep -m1 error "$TMP/chat.txt")"
printf '{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "The capital of Japan is Tokyo."}]}\n' "$Q" \
    > "$TMP/one.jsonl"
"$PYTHON" scripts/tokenize.py --chat "$TMP/one.jsonl" --tokenizer "$H/tokenizer.json" -o "$TMP/one" --name one --val-fraction 0 \
    --quiet > "$TMP/one.txt" 2>&1 || t_fail tokenize_one "$(tail -1 "$TMP/one.txt")"
got=$(sed -n 's/^prompt: [0-9]* tokens \[\(.*\)\]$/\1/p' "$TMP/chat.txt")
t_check chat_prompt_is_the_templates "$PYTHON -c \"
import numpy as np, sys
got = [int(x) for x in '$got'.split(',') if x.strip()]
shard = np.fromfile('$(ls "$TMP"/one/one_train_*.bin | head -1)', dtype=np.uint16, offset=1024).tolist()
sys.exit(0 if got and shard[:len(got)] == got and len(shard) > len(got) else 1)\"" "prompt ids [$got]"
t_check chat_replies "[ \$(grep -cv '^prompt:' '$TMP/chat.txt') -ge 1 ]" "$(cat "$TMP/chat.txt")"

# Back to Hugging Face, with the chat template beside the weights.
"$PYTHON" scripts/export_hf.py "$TMP/run/ckpt_000030" "$TMP/out" --tokenizer "$H" > "$TMP/export.txt" 2>&1 ||
    t_fail hf_export "$(tail -1 "$TMP/export.txt")"
t_check exported_folder_has_chat_template "cmp -s '$H/tokenizer_config.json' '$TMP/out/tokenizer_config.json' && [ -s '$TMP/out/model.safetensors' ]" \
    "$(ls "$TMP/out" | tr '\n' ' ')"
t_finish
