#!/usr/bin/env bash
# scripts/tokenize.py as a tool: shard layout and split, document separators, worker-count independence,
# and the one-line errors that leave no half-written output behind.
cd "$(dirname "$0")/.." || exit 1
source tests/lib.sh
PY=${PYTHON:-/usr/bin/python3}
TOK="$PY scripts/tokenize.py"
SH="$PY $PWD/tests/tokenizer_shards.py"
ids() { $SH ids "$@"; }

# --- layout: files, a nested directory and JSONL in; EOT before every document; first shard = val ---
mkdir -p "$TMP/in/sub"
printf 'Hello world\n' > "$TMP/in/a.txt"
printf 'Second  doc\r\n' > "$TMP/in/sub/b.txt"
printf '{"text": "third"}\n\n{"text": "fourth <|endoftext|> \\u00e9"}\n' > "$TMP/in/c.jsonl"
printf 'third' > "$TMP/d3.txt"; printf 'fourth <|endoftext|> \xc3\xa9' > "$TMP/d4.txt"
for f in "$TMP/in/a.txt" "$TMP/d3.txt" "$TMP/d4.txt" "$TMP/in/sub/b.txt"; do   # sorted paths: a, c.jsonl, sub/b
    $TOK --raw "$f" -o "$TMP/raw.bin" && printf '50256 %s ' "$(ids "$TMP/raw.bin")"
done > "$TMP/expect"
expect=$(cat "$TMP/expect"); expect=${expect% }
$TOK "$TMP/in" -o "$TMP/out" --name t --shard-size 4 2>"$TMP/err"; rc=$?
shards=$(cd "$TMP/out" 2>/dev/null && { ls t_val_*.bin; ls t_train_*.bin; } | tr '\n' ' ')
t_check tokenizer_cli_runs '[ $rc -eq 0 ]' "exit $rc: $(head -1 "$TMP/err")"
t_check tokenizer_cli_stream '[ "$(cd "$TMP/out" && ids $shards)" = "$expect" ]' \
    "shards' ids are not EOT + each document's ids in path order"
t_check tokenizer_cli_val_first '[ "$(echo $shards | cut -d" " -f1)" = t_val_000000.bin ] &&
    [ "$(echo $shards | cut -d" " -f2)" = t_train_000001.bin ] && [ "$(ids "$TMP/out/t_val_000000.bin" | wc -w)" -eq 4 ]' \
    "expected t_val_000000.bin (4 tokens) then t_train_000001.bin..., got: $shards"
t_check tokenizer_cli_no_leftovers '[ -z "$(ls -A "$TMP/out" | grep -v "^t_.*\.bin$" | grep -v "^gpt2_\(tokenizer\|merges\).bin$")" ]' \
    "temporary files left in the output directory: $(ls -A "$TMP/out" | tr '\n' ' ')"
t_check tokenizer_cli_progress 'grep -q "MB/s" "$TMP/err"' "no throughput report on stderr"

# --- --val-fraction; a rerun replaces the old shard set instead of mixing with it ---
n=$(echo "$expect" | wc -w)
$TOK "$TMP/in" -o "$TMP/out" --name t --val-fraction 0.25 -q
t_check tokenizer_cli_val_fraction '[ "$(cd "$TMP/out" && ls t_*.bin | tr "\n" " ")" = "t_train_000001.bin t_val_000000.bin " ] &&
    [ "$(ids "$TMP/out/t_val_000000.bin" | wc -w)" -eq $(( (n + 2) / 4 )) ] &&
    [ "$(cd "$TMP/out" && ids t_val_000000.bin t_train_000001.bin)" = "$expect" ]' \
    "with --val-fraction 0.25 of $n tokens: $(cd "$TMP/out" && ls | tr '\n' ' ')"

# --- the same bytes whatever the worker count (a long document is cut into chunks across threads) ---
for i in $(seq 1 400); do cat "$TMP/in/a.txt" "$TMP/in/sub/b.txt"; printf '  indented %d \n\n' "$i"; done > "$TMP/long.txt"
for i in 1 2 3 4 5 6 7 8; do cat "$TMP/long.txt"; done > "$TMP/long8.txt"
for i in 1 2 3 4 5 6 7 8 9 10; do cat "$TMP/long8.txt"; done > "$TMP/long.txt"
$TOK "$TMP/long.txt" "$TMP/in" -o "$TMP/j1" --name d --shard-size 50000 -j 1 -q
$TOK "$TMP/long.txt" "$TMP/in" -o "$TMP/j2" --name d --shard-size 50000 -j 2 -q
$TOK --raw "$TMP/long.txt" -o "$TMP/long1.bin" -j 1
$TOK --raw "$TMP/long.txt" -o "$TMP/long3.bin" -j 3
t_check tokenizer_cli_deterministic 'diff -r "$TMP/j1" "$TMP/j2" >/dev/null && cmp -s "$TMP/long1.bin" "$TMP/long3.bin" &&
    [ "$(ls "$TMP/j1" | wc -l)" -gt 3 ]' "output differs between -j 1 and -j 2/3"

# --- bad input: one "error: ..." line, non-zero exit, nothing left under a final (or temporary) name ---
expect_error() {   # name, pattern the message must contain, command...
    local name=$1 pat=$2; shift 2
    "$@" >/dev/null 2>"$TMP/err"; local rc=$?
    if [ $rc -ne 0 ] && [ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "^error: .*$pat" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "exit $rc, stderr: $(head -3 "$TMP/err" | tr '\n' '|')"; fi
}
printf 'good text\n' > "$TMP/good.txt"
printf 'caf\xe9 latin-1\n' > "$TMP/bad.txt"
: > "$TMP/empty.txt"
expect_error tokenizer_err_not_utf8 'bad.txt: not valid UTF-8 at byte 3' $TOK "$TMP/good.txt" "$TMP/bad.txt" -o "$TMP/e1"
t_check tokenizer_err_no_partial_shards '[ -z "$(ls -A "$TMP/e1" | grep -v "^gpt2_\(tokenizer\|merges\).bin$")" ]' \
    "left behind: $(ls -A "$TMP/e1" | tr '\n' ' ')"
expect_error tokenizer_err_raw_not_utf8 'not valid UTF-8' $TOK --raw "$TMP/bad.txt" -o "$TMP/e2.bin"
t_check tokenizer_err_raw_no_output '[ -z "$(ls "$TMP" | grep "^e2")" ]' "--raw left $(ls "$TMP" | grep "^e2")"
expect_error tokenizer_err_empty 'empty file' $TOK "$TMP/empty.txt" -o "$TMP/e3"
expect_error tokenizer_err_raw_empty 'empty file' $TOK --raw "$TMP/empty.txt" -o "$TMP/e3.bin"
expect_error tokenizer_err_missing 'no such file' $TOK "$TMP/nope.txt" -o "$TMP/e4"
expect_error tokenizer_err_unwritable_dir 'cannot' $TOK "$TMP/good.txt" -o "$TMP/good.txt/sub"
expect_error tokenizer_err_unwritable_raw 'cannot write' $TOK --raw "$TMP/good.txt" -o "$TMP/good.txt/x.bin"
printf '{"txt": "no text field"}\n' > "$TMP/bad.jsonl"
expect_error tokenizer_err_jsonl 'bad.jsonl:1: not a JSON object' $TOK "$TMP/bad.jsonl" -o "$TMP/e5"
expect_error tokenizer_err_too_small 'cannot be split' $TOK "$TMP/good.txt" -o "$TMP/e6"
mkdir "$TMP/vocab" && cp data/tokenizer/encoder.json data/tokenizer/vocab.bpe "$TMP/vocab/"
printf 'x' >> "$TMP/vocab/vocab.bpe"
expect_error tokenizer_err_sha256 'vocab.bpe: sha256' env GPT2_TOKENIZER_DIR="$TMP/vocab" $TOK --raw "$TMP/good.txt" -o "$TMP/e7.bin"
t_finish
