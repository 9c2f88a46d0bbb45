#!/usr/bin/env bash
# scripts/tokenize.py as a tool: shard layout and split, document separators, worker-count independence,
# set ids, one run per output directory, a replacement that a signal cannot cut in two (and the trainer's
# refusal of what a SIGKILL leaves: its switch marker, a mix of set ids), --raw files side by side, and the
# one-line errors that leave no half-written output behind.
# run_all: first
cd "$(dirname "$0")/../.." || exit 1
source tests/system/lib.sh
PY=${PYTHON:-/usr/bin/python3}
TOK="$PY scripts/tokenize.py"
SH="$PY $PWD/tests/tools/tokenizer_shards.py"
ids() { $SH ids "$@"; }
sets() { $SH sets "$@" | sort -u; }   # the distinct set ids among the shards
# DIR's shards NAME_{val,train}_N.bin in stream order (by N), as paths.
in_order() { (cd "$1" && ls | sed -nE 's/^(.+_(val|train)_([0-9]{6,})\.bin)$/\3 \1/p' | sort -n | cut -d" " -f2 | sed "s|^|$1/|"); }
# A shard or tokenizer file with the set id's bytes (12..19) zeroed: runs differ there only.
no_set() { head -c 12 "$1"; head -c 8 /dev/zero; tail -c +21 "$1"; }
same_but_sets() {   # dir1 dir2: the same file names, the same bytes but for the set ids
    [ "$(ls "$1")" = "$(ls "$2")" ] || return 1
    local f; for f in "$1"/*; do cmp -s <(no_set "$f") <(no_set "$2/${f##*/}") || return 1; done
}

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
t_check tokenizer_cli_no_leftovers '[ -z "$(ls -A "$TMP/out" | grep -v "^t_.*\.bin$" | grep -v "^gpt2_\(tokenizer\|merges\).bin$" | grep -v "^\.tokenize\.lock$")" ]' \
    "temporary files left in the output directory: $(ls -A "$TMP/out" | tr '\n' ' ')"
t_check tokenizer_cli_progress 'grep -q "MB/s" "$TMP/err"' "no throughput report on stderr"
set1=$(cd "$TMP/out" && sets $shards)
t_check tokenizer_cli_set_id '[ "$(echo "$set1" | wc -l)" -eq 1 ] && [ "$set1" != 0000000000000000 ]' \
    "expected one set id, not 0, in every shard; got: $(echo $set1)"

# --- --val-fraction; a rerun replaces the old shard set instead of mixing with it ---
n=$(echo "$expect" | wc -w)
$TOK "$TMP/in" -o "$TMP/out" --name t --val-fraction 0.25 -q
t_check tokenizer_cli_val_fraction '[ "$(cd "$TMP/out" && ls t_*.bin | tr "\n" " ")" = "t_train_000001.bin t_val_000000.bin " ] &&
    [ "$(ids "$TMP/out/t_val_000000.bin" | wc -w)" -eq $(( (n + 2) / 4 )) ] &&
    [ "$(cd "$TMP/out" && ids t_val_000000.bin t_train_000001.bin)" = "$expect" ]' \
    "with --val-fraction 0.25 of $n tokens: $(cd "$TMP/out" && ls | tr '\n' ' ')"
set2=$(sets "$TMP/out"/t_*.bin)
t_check tokenizer_cli_new_set_id '[ "$(echo "$set2" | wc -l)" -eq 1 ] && [ "$set2" != "$set1" ] && [ "$set2" != 0000000000000000 ]' \
    "a rerun's shards carry set ids $(echo $set2); the first run's: $set1"

# --- --token-bits 32: llm.c's 32-bit shards ([20240801, 7, ntok] + uint32) of the same ids under the same
# names; GPT-2's vocabulary fits 16 bits, so 16 is the default, byte for byte ---
hdr() { od -An -t d4 -N 12 "$1" | tr -s ' '; }   # " magic version ntok"
shards_are() {   # dir, magic version, bytes per token: every t_ shard's header and size
    local f; for f in "$1"/t_*.bin; do
        [ "$(hdr "$f")" = " $2 $(ids "$f" | wc -w)" ] && [ "$(stat -c %s "$f")" -eq $((1024 + $3 * $(ids "$f" | wc -w))) ] || return 1
    done
}
for bits in 16 32 default; do
    $TOK "$TMP/in" -o "$TMP/bits$bits" --name t --shard-size 4 $([ $bits = default ] || echo --token-bits $bits) -q
done
$TOK --raw "$TMP/d4.txt" -o "$TMP/raw16.bin" && $TOK --raw "$TMP/d4.txt" -o "$TMP/raw32.bin" --token-bits 32
t_check tokenizer_cli_token_bits_16_default 'same_but_sets "$TMP/bits16" "$TMP/bitsdefault" && shards_are "$TMP/bitsdefault" "20240520 1" 2' \
    "the default output is not --token-bits 16's: $(for f in "$TMP"/bitsdefault/t_*.bin; do hdr "$f"; done | tr '\n' '|')"
t_check tokenizer_cli_token_bits_32 '[ "$(ls "$TMP/bits32")" = "$(ls "$TMP/bits16")" ] && shards_are "$TMP/bits32" "20240801 7" 4 &&
    [ "$(ids $(in_order "$TMP/bits32"))" = "$expect" ] && [ "$(sets "$TMP"/bits32/t_*.bin | wc -l)" -eq 1 ]' \
    "32-bit shards $(ls "$TMP/bits32" | tr '\n' ' '): ids $(ids $(in_order "$TMP/bits32")), headers $(for f in "$TMP"/bits32/t_*.bin; do hdr "$f"; done | tr '\n' '|')"
t_check tokenizer_cli_raw_token_bits_32 '[ "$(hdr "$TMP/raw32.bin")" = " 20240801 7 $(ids "$TMP/raw16.bin" | wc -w)" ] &&
    [ "$(ids "$TMP/raw32.bin")" = "$(ids "$TMP/raw16.bin")" ]' "--raw --token-bits 32: $(hdr "$TMP/raw32.bin"): $(ids "$TMP/raw32.bin")"

# --- the same bytes whatever the worker count (a long document is cut into chunks across threads) ---
for i in $(seq 1 400); do cat "$TMP/in/a.txt" "$TMP/in/sub/b.txt"; printf '  indented %d \n\n' "$i"; done > "$TMP/long.txt"
for i in 1 2 3 4 5 6 7 8; do cat "$TMP/long.txt"; done > "$TMP/long8.txt"
for i in 1 2 3 4 5 6 7 8 9 10; do cat "$TMP/long8.txt"; done > "$TMP/long.txt"
$TOK "$TMP/long.txt" "$TMP/in" -o "$TMP/j1" --name d --shard-size 50000 -j 1 -q
$TOK "$TMP/long.txt" "$TMP/in" -o "$TMP/j2" --name d --shard-size 50000 -j 2 -q
$TOK --raw "$TMP/long.txt" -o "$TMP/long1.bin" -j 1
$TOK --raw "$TMP/long.txt" -o "$TMP/long3.bin" -j 3
t_check tokenizer_cli_deterministic 'same_but_sets "$TMP/j1" "$TMP/j2" && cmp -s <(no_set "$TMP/long1.bin") <(no_set "$TMP/long3.bin") &&
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
t_check tokenizer_err_no_partial_shards '[ -z "$(ls -A "$TMP/e1" | grep -v "^gpt2_\(tokenizer\|merges\).bin$" | grep -v "^\.tokenize\.lock$")" ]' \
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
# Inputs that are not regular files (a FIFO's size reads as 0, and reading one can block), given or found
# in a directory; JSONL text that no UTF-8 can hold. timeout: a FIFO opened by mistake would hang.
mkfifo "$TMP/fifo"
mkdir "$TMP/withfifo" && cp "$TMP/good.txt" "$TMP/withfifo/" && mkfifo "$TMP/withfifo/pipe"
expect_error tokenizer_err_fifo 'fifo: not a regular file (a FIFO)' timeout 20 $TOK "$TMP/fifo" -o "$TMP/e8"
expect_error tokenizer_err_fifo_in_dir 'withfifo/pipe: not a regular file (a FIFO)' timeout 20 $TOK "$TMP/withfifo" -o "$TMP/e8"
expect_error tokenizer_err_raw_fifo 'fifo: not a regular file (a FIFO)' timeout 20 $TOK --raw "$TMP/fifo" -o "$TMP/e8.bin"
expect_error tokenizer_err_device '/dev/null: not a regular file (a character device)' $TOK /dev/null -o "$TMP/e8"
# --tokenizer likewise: /dev/zero read whole would grow without end (ulimit -v: a regression fails, not the
# machine), a FIFO would wait for a writer forever (-k: a read never ends for SIGTERM).
mkdir "$TMP/tokdir"
for tk in /dev/zero:'a character device' "$TMP/fifo":'a FIFO' "$TMP/tokdir":'a directory'; do
    expect_error "tokenizer_err_tokenizer_${tk##* }" "${tk%%:*}: not a regular file (${tk#*:})" \
        bash -c 'ulimit -v 2000000 && exec timeout -k 2 10 "$@"' - $TOK "$TMP/good.txt" -o "$TMP/e8" --tokenizer "${tk%%:*}"
done
printf '{"text": "fine"}\n{"text": "\\ud800 alone"}\n' > "$TMP/surrogate.jsonl"
expect_error tokenizer_err_jsonl_surrogate 'surrogate.jsonl:2: the text holds a lone surrogate U+D800 (character 0), which is not valid Unicode' \
    $TOK "$TMP/surrogate.jsonl" -o "$TMP/e9"
expect_error tokenizer_err_token_bits '--token-bits must be 16 or 32 (got 24)' $TOK "$TMP/good.txt" -o "$TMP/e10" --token-bits 24
printf '{"text": "caf\xe9"}\n' > "$TMP/latin1.jsonl"
expect_error tokenizer_err_jsonl_not_utf8 'latin1.jsonl:1: not valid UTF-8 at byte 13 of the line' $TOK "$TMP/latin1.jsonl" -o "$TMP/e9"

# --- one run per output directory: a second run into a directory in use stops at once (two would rename
# and delete each other's shards), and the directory holds the first run's set alone ---
head -c 20000000 /dev/urandom | base64 -w 76 > "$TMP/racea.txt"   # 27 MB of text: seconds of work at -j 1
stream_sum() { local f; for f in $(in_order "$1"); do tail -c +1025 "$f"; done | sha256sum; }   # DIR's tokens
$TOK "$TMP/racea.txt" -o "$TMP/raceref" --val-fraction 0.1 -q
why=""
for rep in 1 2; do
    d=$TMP/race$rep
    $TOK "$TMP/racea.txt" -o "$d" --val-fraction 0.1 -j 1 -q 2> "$TMP/racea.err" & a=$!
    until [ -e "$d/gpt2_merges.bin" ] || ! kill -0 $a 2>/dev/null; do sleep 0.01; done
    $TOK "$TMP/good.txt" "$TMP/in" -o "$d" --val-fraction 0.5 -q 2> "$TMP/raceb.err"; rcb=$?
    kill -0 $a 2>/dev/null; overlap=$?   # 0: the first run was still under way when the second ended
    wait $a; rca=$?
    [ $overlap -eq 0 ] || why+="rep $rep: the first run ended before the second (no overlap to test); "
    [ $rca -eq 0 ] || why+="rep $rep: the first run exited $rca: $(head -1 "$TMP/racea.err"); "
    { [ $rcb -eq 1 ] && [ "$(wc -l < "$TMP/raceb.err")" -eq 1 ] &&
      grep -q "^error: $d is in use by another tokenize.py (process $a holds $d/.tokenize.lock)" "$TMP/raceb.err"; } ||
        why+="rep $rep: the second run exited $rcb: $(head -2 "$TMP/raceb.err" | tr '\n' '|'); "
    { [ "$(sets "$d"/data_*.bin | wc -l)" -eq 1 ] && [ "$(ls "$d" | grep -c '^data_')" -eq 2 ] &&
      [ "$(stream_sum "$d")" = "$(stream_sum "$TMP/raceref")" ]; } ||
        why+="rep $rep: not the first run's set alone: $(ls -A "$d" | tr '\n' ' '); "
    [ $rep -eq 1 ] || rm -rf "$d"
done
t_check tokenizer_lock_refuses_second_run '[ -z "$why" ]' "$why"
# The lock goes with its run: the next run into the directory works (and replaces the set).
$TOK "$TMP/good.txt" "$TMP/in" -o "$TMP/race1" --val-fraction 0.5 -q 2> "$TMP/err"; rc=$?
t_check tokenizer_lock_released '[ $rc -eq 0 ] && [ "$(ls "$TMP/race1" | grep -c "^data_")" -eq 2 ] &&
    [ "$(sets "$TMP/race1"/data_*.bin | wc -l)" -eq 1 ]' "exit $rc: $(head -1 "$TMP/err"); $(ls -A "$TMP/race1" | tr '\n' ' ')"

# --- SIGTERM while tokenizing: one line, the old set untouched, none of the run's files left ---
cp -a "$TMP/race1" "$TMP/term"
old_set=$(sets "$TMP/term"/data_*.bin); old_sum=$(stream_sum "$TMP/term")
$TOK "$TMP/racea.txt" -o "$TMP/term" --val-fraction 0.1 -j 1 -q 2> "$TMP/term.err" & a=$!
until [ -n "$(ls -A "$TMP/term" | grep '^\.' | grep -v '^\.tokenize\.lock$')" ] || ! kill -0 $a 2>/dev/null; do sleep 0.01; done
kill -TERM $a; wait $a; rc=$?
t_check tokenizer_sigterm_cleans_up '[ $rc -eq 143 ] && [ "$(wc -l < "$TMP/term.err")" -eq 1 ] &&
    grep -q "^error: interrupted by SIGTERM; the shards in $TMP/term were left as they were$" "$TMP/term.err" &&
    [ "$(sets "$TMP/term"/data_*.bin)" = "$old_set" ] && [ "$(stream_sum "$TMP/term")" = "$old_sum" ] &&
    [ -z "$(ls -A "$TMP/term" | grep -v "^data_\|^gpt2_\|^\.tokenize\.lock$")" ]' \
    "exit $rc, stderr: $(head -2 "$TMP/term.err" | tr '\n' '|'); left: $(ls -A "$TMP/term" | tr '\n' ' ')"

# --- a replacement cut by a signal: all old or all new. One token per shard, so the old set has over a
# thousand shards and the switch (renames, then deletions) lasts long enough for a signal to land inside it ---
for i in $(seq 1 600); do printf 'w%d ' $i; done > "$TMP/old.txt"
for i in $(seq 1 400); do printf 'x%d ' $i; done > "$TMP/new.txt"
$TOK "$TMP/old.txt" -o "$TMP/swold" --name n --shard-size 1 -q
$TOK "$TMP/new.txt" -o "$TMP/swnew" --name n --shard-size 1 -q
old_ids=$(ids $(in_order "$TMP/swold")); new_ids=$(ids $(in_order "$TMP/swnew"))
# switch_signal DIR SIGNAL CORPUS ERRFILE: re-tokenizes CORPUS into DIR (--name n, one token per shard) and
# sends SIGNAL the moment one of DIR's shards is renamed over or deleted, i.e. once the switch began;
# prints the run's exit status and how many shard names had changed by then. DIR's mtime says when to look.
switch_signal() {
    $PY - "$@" <<'PY'
import os, re, signal, subprocess, sys, time
d, sig, corpus, err = sys.argv[1:5]
shard = re.compile(r'n_(val|train)_[0-9]{6}\.bin')
def names():
    return {e.name: e.inode() for e in os.scandir(d) if shard.fullmatch(e.name)}
before, changed, seen = names(), 0, None
signal.signal(signal.SIGINT, signal.SIG_DFL)   # not ignored, as it is in a background job's launch: the child inherits it
with open(err, 'w') as f:
    p = subprocess.Popen([sys.executable, 'scripts/tokenize.py', corpus, '-o', d, '--name', 'n', '--shard-size', '1',
                          '-q'], stderr=f)
while p.poll() is None:
    mtime = os.stat(d).st_mtime_ns
    if mtime == seen:
        time.sleep(0.0005)
        continue
    seen, now = mtime, names()
    if now != before:
        p.send_signal(getattr(signal, 'SIG' + sig))
        changed = sum(now.get(n) != i for n, i in before.items())
        break
print(p.wait(), changed)
PY
}
which_set() {   # DIR: old, new or a mix
    local got; got=$(ids $(in_order "$1"))
    if [ "$got" = "$old_ids" ]; then echo old; elif [ "$got" = "$new_ids" ]; then echo new
    else echo "a mix ($(sets $(in_order "$1") | wc -l) set ids)"; fi
}
for sig in INT TERM; do
    rm -rf "$TMP/sw" && cp -a "$TMP/swold" "$TMP/sw"
    read -r rc changed < <(switch_signal "$TMP/sw" $sig "$TMP/new.txt" "$TMP/sw.err")
    state=$(which_set "$TMP/sw")
    t_check tokenizer_switch_sig${sig,,}_completes '[ "$state" = new ] && [ "$(sets $(in_order "$TMP/sw") | wc -l)" -eq 1 ] &&
        [ "$rc" -eq $((128 + $(kill -l $sig))) ] && [ "$(wc -l < "$TMP/sw.err")" -eq 1 ] &&
        grep -q "^error: interrupted by SIG$sig during the switch, which was completed: $TMP/sw holds the new set of [0-9]* shards$" "$TMP/sw.err" &&
        [ -z "$(ls -A "$TMP/sw" | grep "^\.tokenize-")" ]' \
        "SIG$sig after $changed shard names changed: exit $rc, the directory holds $state; stderr: $(head -2 "$TMP/sw.err" | tr '\n' '|')"
done

# --- a SIGKILL cannot be held: the switch marker, and the set ids, make the trainer refuse what it leaves ---
trainer() { ./train_gpt_cpu -i "$1" -j '' -e L2C64H4 -b 1 -t 8 -x 1 -s 0 > /dev/null 2> "$TMP/train.err"; }
if [ -x ./train_gpt_cpu ]; then
    # By hand, deterministic: five shards of a new set over an old set's.
    $TOK "$TMP/old.txt" -o "$TMP/mix" --name n --shard-size 64 -q
    $TOK "$TMP/new.txt" -o "$TMP/mixnew" --name n --shard-size 64 -q
    old_set=$(sets "$TMP/mix"/n_*.bin); new_set=$(sets "$TMP/mixnew"/n_*.bin)
    cp "$TMP"/mixnew/n_train_00000[1-5].bin "$TMP/mix/"
    n_old=$(( $(ls "$TMP/mix" | grep -c '^n_train_') - 5 ))
    trainer "$TMP/mix/n_train_*.bin"; rc=$?
    t_check tokenizer_mix_refused_by_trainer '[ $rc -eq 1 ] && [ "$(wc -l < "$TMP/train.err")" -eq 1 ] &&
        grep -q "^error: token shards n_{train,val}_\*\.bin in $TMP/mix mix two shard sets: 5 of set $new_set and $n_old of set $old_set; .*run tokenize.py again$" "$TMP/train.err"' \
        "exit $rc: $(head -2 "$TMP/train.err" | tr '\n' '|')"
    # For real: kill -9 once the switch began. The switch marker it leaves refuses the directory.
    rm -rf "$TMP/sw" && cp -a "$TMP/swold" "$TMP/sw"
    read -r rc changed < <(switch_signal "$TMP/sw" KILL "$TMP/new.txt" "$TMP/sw.err")
    state=$(which_set "$TMP/sw")
    trainer "$TMP/sw/n_train_*.bin"; trc=$?
    refused_by_marker() {   # DIR: the trainer's one line for the marker a killed switch of n's shards left in DIR
        [ $trc -eq 1 ] && [ "$(wc -l < "$TMP/train.err")" -eq 1 ] &&
            grep -q "^error: $1: a tokenize.py run stopped while replacing the shards n_{train,val}_\*\.bin there ($1/\.tokenize-[0-9]*/SWITCHING): run tokenize.py again$" "$TMP/train.err"
    }
    t_check tokenizer_sigkill_mix_refused '[ "$rc" -eq -9 ] && { refused_by_marker "$TMP/sw" ||
        { [ $trc -eq 0 ] && { [ "$state" = new ] || [ "$state" = old ]; }; }; }' \
        "killed after $changed shard names changed (exit $rc), the directory holds $state; the trainer exited $trc: $(head -1 "$TMP/train.err")"

    # A first run into an empty directory, killed during its switch: a part of the new set, all of one set
    # id. The marker refuses it; a rerun that fails, or one of another --name, leaves the marker; a rerun of n
    # that completes clears it.
    for i in $(seq 1 1500); do printf 'f%d ' $i; done > "$TMP/first.txt"
    why="the SIGKILL never landed inside the switch:"
    for try in 1 2 3; do
        rm -rf "$TMP/first" && mkdir "$TMP/first"
        read -r rc changed < <(switch_signal "$TMP/first" KILL "$TMP/first.txt" "$TMP/first.err")
        if [ -n "$(ls "$TMP/first"/.tokenize-*/SWITCHING 2>/dev/null)" ]; then why=""; break; fi
        why+=" try $try: exit $rc with $(ls -A "$TMP/first" | grep -c '^n_') of 1501 shards in place, no marker;"
    done
    left=$(ls "$TMP/first" | grep -c '^n_')
    trainer "$TMP/first/n_*.bin"; trc=$?
    t_check tokenizer_sigkill_first_run_refused '[ -z "$why" ] && [ "$rc" -eq -9 ] && refused_by_marker "$TMP/first"' \
        "${why:-killed with $left of 1501 shards in place (exit $rc);} the trainer exited $trc: $(head -2 "$TMP/train.err" | tr '\n' '|')"
    $TOK "$TMP/bad.txt" -o "$TMP/first" --name n -q 2> "$TMP/err"; rc=$?
    trainer "$TMP/first/n_*.bin"; trc=$?
    t_check tokenizer_failed_rerun_keeps_marker '[ $rc -eq 1 ] && refused_by_marker "$TMP/first" &&
        [ "$(ls -A "$TMP/first"/.tokenize-*)" = SWITCHING ]' \
        "the rerun exited $rc: $(head -1 "$TMP/err"); the trainer exited $trc: $(head -1 "$TMP/train.err"); staging: $(ls -A "$TMP/first"/.tokenize-* 2>/dev/null | tr '\n' ' ')"
    $TOK "$TMP/old.txt" -o "$TMP/first" --name other --shard-size 64 -q 2> "$TMP/err"; rc=$?
    trainer "$TMP/first/n_*.bin"; trc=$?
    t_check tokenizer_other_name_keeps_marker '[ $rc -eq 0 ] && refused_by_marker "$TMP/first"' \
        "the run of --name other exited $rc: $(head -1 "$TMP/err"); the trainer exited $trc: $(head -1 "$TMP/train.err")"
    $TOK "$TMP/new.txt" -o "$TMP/first" --name n --shard-size 64 -q 2> "$TMP/err"; rc=$?
    trainer "$TMP/first/n_*.bin"; trc=$?
    t_check tokenizer_rerun_clears_marker '[ $rc -eq 0 ] && [ $trc -eq 0 ] && [ -z "$(ls -A "$TMP/first" | grep "^\.tokenize-")" ] &&
        [ "$(ids $(in_order "$TMP/first" | grep "/n_"))" = "$new_ids" ]' \
        "the rerun exited $rc: $(head -1 "$TMP/err"); the trainer exited $trc: $(head -1 "$TMP/train.err"); left: $(ls -A "$TMP/first" | grep "^\.")"

    # A run killed before its switch leaves its private directory without a marker: the old set is whole
    # and trains; the next run removes the directory.
    rm -rf "$TMP/pre" && cp -a "$TMP/swold" "$TMP/pre"
    $TOK "$TMP/racea.txt" -o "$TMP/pre" --name n -j 1 -q 2> /dev/null & a=$!
    until [ -n "$(ls "$TMP/pre"/.tokenize-*/spool 2>/dev/null)" ] || ! kill -0 $a 2>/dev/null; do sleep 0.01; done
    kill -KILL $a; { wait $a; } 2>/dev/null; rc=$?
    trainer "$TMP/pre/n_*.bin"; trc=$?
    t_check tokenizer_staging_without_marker_trains '[ $rc -eq 137 ] && [ -n "$(ls -d "$TMP/pre"/.tokenize-*)" ] &&
        [ -z "$(ls "$TMP/pre"/.tokenize-*/SWITCHING 2>/dev/null)" ] && [ $trc -eq 0 ] && [ "$(which_set "$TMP/pre")" = old ]' \
        "killed with exit $rc, left $(ls -A "$TMP/pre" | grep "^\.tokenize-" | tr '\n' ' '); the trainer exited $trc: $(head -1 "$TMP/train.err")"
    $TOK "$TMP/new.txt" -o "$TMP/pre" --name n --shard-size 64 -q 2> "$TMP/err"; rc=$?
    trainer "$TMP/pre/n_*.bin"; trc=$?
    t_check tokenizer_rerun_clears_staging '[ $rc -eq 0 ] && [ $trc -eq 0 ] && [ -z "$(ls -A "$TMP/pre" | grep "^\.tokenize-")" ]' \
        "the rerun exited $rc: $(head -1 "$TMP/err"); the trainer exited $trc: $(head -1 "$TMP/train.err"); left: $(ls -A "$TMP/pre" | grep "^\.")"

    # --raw files are sets of their own: several in one directory train together.
    mkdir "$TMP/raws"
    $TOK --raw "$TMP/old.txt" -o "$TMP/raws/a.bin" && $TOK --raw "$TMP/new.txt" -o "$TMP/raws/b.bin"
    trainer "$TMP/raws/*.bin"; trc=$?
    t_check tokenizer_raw_files_train_together '[ $trc -eq 0 ] && [ "$(sets "$TMP"/raws/*.bin | wc -l)" -eq 2 ]' \
        "the trainer exited $trc: $(head -1 "$TMP/train.err")"
    # 32-bit shards train, and so do 32-bit and 16-bit --raw files together.
    trainer "$TMP/bits32/t_*.bin"; trc=$?
    trainer "$TMP/raw[13]*.bin"; trc2=$?
    t_check tokenizer_token_bits_32_trains '[ $trc -eq 0 ] && [ $trc2 -eq 0 ]' \
        "the trainer exited $trc on t_*.bin, $trc2 on raw16.bin + raw32.bin: $(head -1 "$TMP/train.err")"
else
    t_fail tokenizer_mix_refused_by_trainer "./train_gpt_cpu is missing (make train_gpt_cpu)"
fi
t_finish
