#!/usr/bin/env bash
# HellaSwag during training (-hs) on a synthetic set in HellaSwag's format (tests/tools/hellaswag_synth.py:
# 40 examples a briefly trained model partly knows, 2 longer than -t):
# - scripts/prepare_hellaswag.py writes the evaluation file from the jsonl, in 16-bit and 32-bit elements,
#   with GPT-2's tokenizer and with a tokenizer.json (tests/tools/make_tiny_tokenizer.py's, learned from the
#   set's text), and refuses bad input in one line without leaving an output file;
# - a GPT-2 model (GPT-2's tokenizer) and a Llama model (the tokenizer.json) trained on the set's text: the
#   trainer's count of correct examples at the last step equals scripts/reference.py's float64 count on the
#   saved model, it beats the untrained model's, and the examples longer than -t are left out and counted as
#   the reference counts them;
# - every layout (2 and 3 replicas under -z 0..3, -offload, -pp with 1f1b, interleaved and zb, -tp, -tp -sp,
#   -cp under Ulysses and the ring, alone, with 2 replicas and with -tp -sp, -b not a multiple of 4) gives the
#   one-rank count (at -cp 4 most endings cross a context rank's boundary: a rank's losses alone miss the
#   count); so do the 32-bit file and the fenced build (the host code's use of device memory, as on a GPU);
# - the accuracy is in log.jsonl at each -v step and on the console; a stop signal during an evaluation ends
#   it on every rank at the same forward, with a checkpoint and no accuracy logged;
# - bad evaluation files and flags are one-line errors before training.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip hellaswag
export OMP_NUM_THREADS=1

$PYTHON tests/tools/hellaswag_synth.py "$TMP/set"
TOK=$TMP/tokenizer.json
$PYTHON tests/tools/make_tiny_tokenizer.py "$TMP/set/corpus.txt" "$TOK" --merges 200 ||
    { t_fail tiny_tokenizer "make_tiny_tokenizer.py failed"; t_finish; }
{ $PYTHON scripts/tokenize.py --raw "$TMP/set/corpus.txt" -o "$TMP/corpus.bin" &&
  $PYTHON scripts/tokenize.py --raw "$TMP/set/corpus.txt" -o "$TMP/corpus_tok.bin" --tokenizer "$TOK"; } ||
    { t_fail tokenize_corpus "tokenize.py failed"; t_finish; }
$PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/set/synth.jsonl" -o "$TMP/hs16" > "$TMP/prep16.txt" 2>&1
$PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/set/synth.jsonl" -o "$TMP/hs32" --token-bits 32 > "$TMP/prep32.txt" 2>&1
$PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/set/synth.jsonl" -o "$TMP/hstok" --tokenizer "$TOK" > "$TMP/preptok.txt" 2>&1
HS=$TMP/hs16/hellaswag_val.bin
HS32=$TMP/hs32/hellaswag_val.bin
HSTOK=$TMP/hstok/hellaswag_val.bin
t_check prepare_writes_file "[ -s '$HS' ] && grep -q '^42 examples, 16-bit' '$TMP/prep16.txt'" "$(cat "$TMP/prep16.txt")"
t_check prepare_tokenizer_json "[ -s '$HSTOK' ] && ! cmp -s '$HS' '$HSTOK'" "$(cat "$TMP/preptok.txt")"

# The file as llm.c's reader takes it: header, then per example <0xFFFF><bytes><index><label><4><n><ctx>...,
# each ending the tokens of " " + ending; read back here with numpy, encoded here with tokenize.py (GPT-2's
# tokenizer, or the tokenizer.json), with no document start before the context.
py_check prepare_file_layout "$HS" "$HS32" "$TMP/set/synth.jsonl" "$HSTOK" "$TOK" <<'PY'
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("tk", "scripts/tokenize.py")
tk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tk)
rows = [json.loads(l) for l in open(sys.argv[3])]
texts = [t.encode() for r in rows for t in [r["ctx"]] + [" " + e for e in r["endings"]]]
gpt2, _ = tk.encode_texts(texts)
tokjson, _ = tk.encode_texts(texts, sys.argv[5])
for path, dtype, version, ids in ((sys.argv[1], "<u2", 1, gpt2), (sys.argv[2], "<u4", 2, gpt2), (sys.argv[4], "<u2", 1, tokjson)):
    data = open(path, "rb").read()
    h = np.frombuffer(data[:16], "<i4")
    el = np.frombuffer(data[1024:], dtype).tolist()
    pos, longest = 0, 0
    for i, r in enumerate(rows):
        want = [i, r["label"], 4, len(ids[5 * i])] + ids[5 * i]
        for e in ids[5 * i + 1:5 * i + 5]:
            want += [len(e)] + e
        width = 2 * version
        got = el[pos:pos + 2 + len(want)]
        if got != [(1 << 8 * width) - 1, width * (2 + len(want))] + want:
            sys.exit(print("%s: example %d is %s, not %s" % (path, i, got[:12], want[:10])))
        longest = max(longest, width * (2 + len(want)))
        pos += 2 + len(want)
    if list(h) != [20240522, version, len(rows), longest] or pos != len(el):
        sys.exit(print("%s: header %s, %d of %d elements" % (path, list(h), pos, len(el))))
print("ok")
PY

# Training: the accuracy at steps 0 and 60, against the reference on the step-60 model. GPT-2 reads GPT-2's
# encoding, Llama the tokenizer.json's (its vocabulary: build/tokenizer --info).
flags=(-j "" -t 32 -s 0)
gpt2_data=(-i "$TMP/corpus.bin" -hs "$HS")
llama_data=(-i "$TMP/corpus_tok.bin" -hs "$HSTOK")
train() {   # dir, model spec, data flags...
    local dir=$1 model=$2; shift 2
    ./train_gpt_cpu -e "$model" "$@" "${flags[@]}" -b 8 -x 60 -l 3e-3 -u 5 -v 30 -o "$TMP/$dir" > "$TMP/$dir.txt" 2>&1 ||
        t_fail "${dir}_trained" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
# "C T D G": the step-60 count, its total, the dropped count the trainer printed, and the step-0 count.
trainer_counts() {   # dir
    $PYTHON - "$TMP/$1/log.jsonl" "$TMP/$1.txt" <<'PY'
import json, re, sys
hs = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "hellaswag_acc" in r}
m = re.search(r"^hellaswag: .*; (\d+) longer than -t 32 left out$", open(sys.argv[2]).read(), re.M)
last = hs.get(60, {})
print(last.get("hellaswag_correct", -1), last.get("hellaswag_total", -1), m.group(1) if m else -1,
      hs.get(0, {}).get("hellaswag_correct", -1))
PY
}
against_reference() {   # name, dir, evaluation file
    local name=$1 dir=$2 c t d g rc rt rd rs
    read -r c t d g <<< "$(trainer_counts "$dir")"
    $PYTHON scripts/reference.py -e "$TMP/$dir/ckpt_000060/model.bin" -t 32 --hellaswag "$3" > "$TMP/$dir.ref" 2>&1 ||
        t_fail "${name}_reference" "$(tail -1 "$TMP/$dir.ref")"
    read -r rc rt rd rs <<< "$(sed -n 's|^hellaswag: \([0-9]*\)/\([0-9]*\) correct, \([0-9]*\) dropped, \([0-9]*\) by the summed loss|\1 \2 \3 \4|p' "$TMP/$dir.ref")"
    local gap; gap=$(sed -n 's/^min_gap: //p' "$TMP/$dir.ref")
    t_check "${name}_equals_reference" "[ '$c' = '$rc' ] && [ '$t' = '$rt' ] && [ '$t' = 40 ]" \
        "trainer $c/$t, reference $rc/$rt"
    # The set tells the mean loss per ending token (llm.c's acc_norm) from the summed loss (its acc).
    t_check "${name}_mean_not_sum" "[ -n '$rs' ] && [ '$rs' != '$rc' ]" "the summed loss also gets $rs right"
    t_check "${name}_dropped_as_reference" "[ '$d' = '$rd' ] && [ '$d' -gt 0 ]" "trainer printed $d, reference $rd"
    # The counts are compared exactly: no example's two best scores may be within float32's reach.
    t_check "${name}_no_near_tie" "$PYTHON -c 'import sys; sys.exit(not float(\"$gap\") > 1e-4)'" "min_gap $gap"
    t_check "${name}_learned_not_all" "[ '$c' -gt '$g' ] && [ '$c' -lt '$t' ]" "step 0: $g, step 60: $c of $t"
}
gpt2="L4C64H4V4096T64"
llama="llama:L4,C64,H4,K2,F128,V$(build/tokenizer "$TOK" --info | sed -n 's/^vocab_size //p'),T64,tied"
train gpt2 "$gpt2" "${gpt2_data[@]}"
train llama "$llama" "${llama_data[@]}"
against_reference gpt2 gpt2 "$HS"
against_reference llama llama "$HSTOK"
t_check hellaswag_on_console "grep -q '^step 60 | hellaswag [0-9]*/40 = 0\.[0-9]*$' '$TMP/gpt2.txt'" "$(grep -m1 'hellaswag [0-9]' "$TMP/gpt2.txt")"
t_check hellaswag_logged_each_eval "[ \$(grep -c '\"hellaswag_acc\"' '$TMP/gpt2/log.jsonl') = 3 ]" \
    "$(grep -c hellaswag_acc "$TMP/gpt2/log.jsonl") records, not 3 (steps 0, 30, 60)"

# Layouts: the trained model evaluated once (-x 0) in each, against one rank.
eval_count() {   # name, model, ranks, flags...: the count the run printed, in COUNT
    local name=$1 model=$2 np=$3; shift 3
    "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu -e "$model" "${flags[@]}" -x 0 -v 1 "$@" > "$TMP/$name.txt" 2>&1 ||
        t_fail "$name" "exited non-zero: $(grep -m1 error "$TMP/$name.txt")"
    COUNT=$(sed -n 's|^step 0 \| hellaswag \([0-9]*/[0-9]*\) = .*|\1|p' "$TMP/$name.txt")
}
layouts() {   # family, model, layouts "name|ranks|flags"...: the family's data flags come from ${family}_data
    local family=$1 model=$2 ref; shift 2
    local -n data="${family}_data"
    eval_count "${family}_one_rank" "$model" 1 "${data[@]}" -b 8
    ref=$COUNT
    trained=$(sed -n 's|^step 60 \| hellaswag \([0-9]*/[0-9]*\) = .*|\1|p' "$TMP/$family.txt")
    t_check "${family}_one_rank_as_trained" "[ -n '$ref' ] && [ '$ref' = '$trained' ]" "one rank $ref, at the end of training $trained"
    for layout in "$@"; do
        IFS='|' read -r name np extra <<< "$layout"
        # shellcheck disable=SC2086
        eval_count "${family}_$name" "$model" "$np" "${data[@]}" $extra
        t_check "${family}_${name}_as_one_rank" "[ -n '$COUNT' ] && [ '$COUNT' = '$ref' ]" "$COUNT, one rank $ref"
    done
}
layouts gpt2 "$TMP/gpt2/ckpt_000060/model.bin" "b3|1|-b 3" "z0|2|-b 8 -z 0" "z1_3replicas|3|-b 4 -z 1" "z2|2|-b 8 -z 2" \
    "z3_3replicas|3|-b 5 -z 3" "offload|2|-b 8 -z 2 -offload 2" "pp2|2|-b 8 -pp 2" "pp2_zb|2|-b 8 -pp 2 -ps zb" \
    "pp2_interleaved|2|-b 8 -ga 2 -pp 2 -ps interleaved -vp 2" "tp2|2|-b 8 -tp 2" "tp2_sp|2|-b 8 -tp 2 -sp 1" \
    "pp2_tp2_z3|4|-b 8 -pp 2 -tp 2 -z 3" "cp4|4|-b 8 -cp 4" "cp2_ring_2replicas|4|-b 4 -cp 2 -cpm ring -z 1"
layouts llama "$TMP/llama/ckpt_000060/model.bin" "z3|2|-b 8 -z 3" "pp2_interleaved|2|-b 8 -ga 2 -pp 2 -ps interleaved -vp 2" \
    "tp2_sp|2|-b 8 -tp 2 -sp 1" "pp2_tp2_zb|4|-b 8 -pp 2 -tp 2 -ps zb -z 1" \
    "cp2_tp2_sp|4|-b 8 -cp 2 -tp 2 -sp 1"
eval_count gpt2_32bit "$TMP/gpt2/ckpt_000060/model.bin" 1 -i "$TMP/corpus.bin" -hs "$HS32" -b 8
t_check gpt2_32bit_file_as_16bit "[ -n '$COUNT' ] && grep -q \"^step 0 | hellaswag $COUNT \" '$TMP/gpt2_one_rank.txt'" "$COUNT"
# The fenced build (the host code as a GPU sees it, tests/system/t_fence.sh) on 2 stages, collectives poisoned.
GPT_COMM_POISON=1 "${MPIRUN[@]}" -x GPT_COMM_POISON -np 2 build/train_gpt_fenced -e "$TMP/gpt2/ckpt_000060/model.bin" "${flags[@]}" \
    "${gpt2_data[@]}" -x 0 -v 1 -b 8 -pp 2 > "$TMP/fenced.txt" 2>&1 || t_fail gpt2_fenced "exited non-zero: $(grep -m1 error "$TMP/fenced.txt")"
t_check gpt2_fenced_as_one_rank "[ \"\$(grep '^step 0 | hellaswag' '$TMP/fenced.txt')\" = \"\$(grep '^step 0 | hellaswag' '$TMP/gpt2_one_rank.txt')\" ]" \
    "$(grep -m1 'hellaswag [0-9]' "$TMP/fenced.txt")"

# SIGTERM to rank 1 during a long evaluation (the set 100 times, one row per forward): the ranks agree between
# forwards and leave it together, log no accuracy, checkpoint step 0 and exit 0 soon after the signal.
for _ in $(seq 100); do cat "$TMP/set/synth.jsonl"; done > "$TMP/big.jsonl"
$PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/big.jsonl" -o "$TMP/big" > /dev/null
timeout -k 5 120 "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$TMP/gpt2/ckpt_000060/model.bin" "${flags[@]}" -i "$TMP/corpus.bin" -b 1 -x 2 -v 1 \
    -hs "$TMP/big/hellaswag_val.bin" -o "$TMP/stop" > "$TMP/stop.txt" 2>&1 &
pid=$!
term_rank_when_running "$TMP/stop.txt" "train_gpt_cpu .*$TMP/stop" 1   # step 0's evaluation runs for many seconds
victim=$VICTIM
wait $pid
rc=$?
ms=$(( $(now_ms) - T0 ))
t_check sigterm_during_hellaswag_stops_soon "[ -n '$victim' ] && [ $rc -eq 0 ] && [ $ms -lt 3000 ] && \
    grep -q '^step 0 | hellaswag stopped by a signal: no accuracy' '$TMP/stop.txt' && \
    grep -q 'stopped by a signal after step 0 (during evaluation); checkpoint written' '$TMP/stop.txt'" \
    "victim '$victim', exit $rc $ms ms after the signal: $(grep -a -E 'hellaswag|stopped|error' "$TMP/stop.txt" | head -c 300)"
t_check sigterm_during_hellaswag_logs_nothing "! grep -q hellaswag_acc '$TMP/stop/log.jsonl' && [ -f '$TMP/stop/ckpt_000000/DONE' ]"

# Bad files and flags: one line, before training.
expect_error() {   # name, regex, trainer args...
    local name=$1 re=$2; shift 2
    timeout -k 5 60 ./train_gpt_cpu -e "$gpt2" "${flags[@]}" -i "$TMP/corpus.bin" -b 8 -x 1 -v 1 "$@" > "$TMP/out" 2> "$TMP/err"
    local rc=$? lines; lines=$(wc -l < "$TMP/err")
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: .*$re" "$TMP/err" && ! grep -q '^step' "$TMP/out"; then
        t_ok "$name"
    else
        t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err"), stdout: $(grep -m1 '^step' "$TMP/out")"
    fi
}
bad() {   # name, python expression of the good file's bytes `d`: writes $TMP/NAME.bin
    $PYTHON -c "import sys; d = open(sys.argv[1], 'rb').read(); open(sys.argv[2], 'wb').write($2)" "$HS" "$TMP/$1.bin"
}
bad magic "b'\x01\x02\x03\x04' + d[4:]"
expect_error hs_wrong_magic "wrong magic 67305985" -hs "$TMP/magic.bin"
bad truncated "d[:-8]"
expect_error hs_truncated "truncated: example 41 ends past the end" -hs "$TMP/truncated.bin"
bad trailing "d + bytes(2)"
expect_error hs_trailing_bytes "2 bytes after its last example" -hs "$TMP/trailing.bin"
bad label "d[:1030] + bytes([7, 0]) + d[1032:]"
expect_error hs_label_outside "example 0 has label 7, outside 0..3" -hs "$TMP/label.bin"
bad endings "d[:1032] + bytes([3, 0]) + d[1034:]"
expect_error hs_not_four_endings "example 0 has 3 endings, not 4" -hs "$TMP/endings.bin"
bad version "d[:4] + bytes([3, 0, 0, 0]) + d[8:]"
expect_error hs_bad_version "version 3" -hs "$TMP/version.bin"
$PYTHON scripts/make_shard.py -o "$TMP/small_vocab.bin" -n 3000 -V 1024 --seed 1 > /dev/null
expect_error hs_token_outside_vocab "has token [0-9]*, outside the model's vocabulary of 1024" -hs "$HS" -e L2C64H4V1024T64 -i "$TMP/small_vocab.bin"
expect_error hs_nothing_fits "each of its 42 examples is longer than -t 2" -hs "$HS" -t 2
expect_error hs_missing_file "nothing.bin" -hs "$TMP/nothing.bin"
expect_error hs_without_validation "-hs .* -v 0 turns off" -hs "$HS" -v 0
expect_error hs_with_prompt "runs no evaluation \(drop -hs\)" -hs "$HS" -prompt hi

# prepare_hellaswag.py's errors: one line, exit 1, and no output file.
prep_error() {   # name, regex, jsonl text (or "" with extra args), extra args...
    local name=$1 re=$2 text=$3; shift 3
    printf '%s\n' "$text" > "$TMP/bad.jsonl"
    rm -rf "$TMP/prep_out"
    $PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/bad.jsonl" -o "$TMP/prep_out" "$@" > /dev/null 2> "$TMP/err"
    local rc=$? lines; lines=$(wc -l < "$TMP/err")
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: .*$re" "$TMP/err" && [ ! -e "$TMP/prep_out/hellaswag_val.bin" ]; then
        t_ok "$name"
    else
        t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err")"
    fi
}
good='{"ctx": "The man", "endings": ["goes home.", "a", "b", "c"], "label": 0}'
prep_error prep_missing_key 'bad.jsonl:2: missing key "label"' "$good"$'\n''{"ctx": "a", "endings": ["a", "b", "c", "d"]}'
prep_error prep_label_outside 'bad.jsonl:1: "label" 4 is outside 0..3' '{"ctx": "a", "endings": ["a", "b", "c", "d"], "label": 4}'
prep_error prep_three_endings 'bad.jsonl:1: "endings" has 3 endings, not 4' '{"ctx": "a", "endings": ["a", "b", "c"], "label": 1}'
prep_error prep_not_json 'bad.jsonl:1: not a JSON object' '["ctx"]'
prep_error prep_tokenizer_missing "nothing.json: No such file" "$good" --tokenizer "$TMP/nothing.json"
# A download that fails (a port nothing listens on) and one that works (a file: URL).
rm -rf "$TMP/dl"
$PYTHON scripts/prepare_hellaswag.py --url http://127.0.0.1:9/hellaswag_val.jsonl -o "$TMP/dl" > /dev/null 2> "$TMP/err"
rc=$?
t_check prep_download_fails "[ $rc = 1 ] && [ \$(wc -l < '$TMP/err') = 1 ] && grep -q '^error: cannot download http://127.0.0.1:9/' '$TMP/err' && [ ! -e '$TMP/dl/hellaswag_val.bin' ]" \
    "rc=$rc: $(head -c 300 "$TMP/err")"
$PYTHON scripts/prepare_hellaswag.py --url "file://$TMP/set/synth.jsonl" -o "$TMP/dl" > /dev/null 2>&1
t_check prep_download_file_url "cmp -s '$TMP/dl/hellaswag_val.bin' '$HS'"
# A failed run leaves an earlier file as it was.
cp "$HS" "$TMP/dl/hellaswag_val.bin"
printf '{"ctx": "a"}\n' > "$TMP/bad.jsonl"
$PYTHON scripts/prepare_hellaswag.py --jsonl "$TMP/bad.jsonl" -o "$TMP/dl" > /dev/null 2>&1
t_check prep_error_keeps_old_file "cmp -s '$TMP/dl/hellaswag_val.bin' '$HS'"
t_finish
