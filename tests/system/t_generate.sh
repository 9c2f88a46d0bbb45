#!/usr/bin/env bash
# -prompt TEXT: generation from a model file. The prompt is encoded in C (core/tokenizer/bpe.c, with the merges
# file scripts/tokenize.py writes) exactly as tokenize.py encodes it; -temp 0 continues with the most likely
# token at every step, the same ids scripts/reference.py's float64 --greedy picks (the window sliding past
# -t included); sampling is reproducible from -seed and changes with it; -topk 1 is greedy; a pipeline
# generates what one rank does; bad input is one line.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
# A small GPT-2-vocabulary model trained a little on a text, so its most likely tokens stand well apart.
mkdir -p "$TMP/text" "$TMP/data"
for i in $(seq 1 60); do echo "In the beginning the cat sat on the mat, and the dog lay by the door. Number $i."; done > "$TMP/text/a.txt"
$PYTHON scripts/tokenize.py "$TMP/text" -o "$TMP/data" --name t --val-fraction 0.1 --quiet > "$TMP/tok.txt" 2>&1 ||
    { t_fail tokenize "$(tail -1 "$TMP/tok.txt")"; t_finish; }
t_check merges_written "[ -s $TMP/data/gpt2_merges.bin ]"
./train_gpt_cpu -e L2C64H2T64 -i "$TMP/data/t_train_*.bin" -j "" -b 4 -t 32 -x 40 -l 3e-3 -u 5 -v 0 -s 0 -o "$TMP/run" \
    > "$TMP/train.txt" 2>&1 || { t_fail train "$(tail -1 "$TMP/train.txt")"; t_finish; }
MODEL=$TMP/run/ckpt_000040/model.bin
gen() {   # out file, flags...
    local out=$1; shift
    ./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 "$@" > "$out" 2> "$out.err"
}
ids() { grep '^ids: ' "$1"; }
PROMPT="The dog lay by the door, and the"

# The fenced build (device memory the host cannot touch, tests/system/t_fence.sh) generates the same text, sampled
# and greedy: generation reads no device memory behind the backend's back.
for how in "-temp 0.8 -topk 40" "-temp 0"; do
    # shellcheck disable=SC2086
    build/train_gpt_fenced -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 -prompt "$PROMPT" $how \
        2> "$TMP/fenced.err" | grep -v '^model ' > "$TMP/fenced"   # the setup line names the device
    gen "$TMP/plain" -prompt "$PROMPT" $how
    grep -v '^model ' "$TMP/plain" > "$TMP/plain.text"
    t_check "fenced_generates_the_same_${how// /_}" "grep -q '^ids: ' '$TMP/plain.text' && cmp -s '$TMP/fenced' '$TMP/plain.text'" \
        "$(diff "$TMP/fenced" "$TMP/plain.text" | head -3) $(head -c 200 "$TMP/fenced.err")"
done

# Encoding: the ids the trainer prints are tokenize.py's for the same text.
gen "$TMP/g0" -prompt "$PROMPT" -temp 0 || t_fail generate_runs "$(cat "$TMP/g0.err")"
printf '%s' "$PROMPT" > "$TMP/prompt.txt"
$PYTHON scripts/tokenize.py --raw "$TMP/prompt.txt" -o "$TMP/prompt.bin" --quiet > /dev/null 2>&1
want=$($PYTHON -c "
import numpy as np, sys
d = np.fromfile('$TMP/prompt.bin', dtype=np.uint16, offset=1024)
print('prompt: %d tokens [%s]' % (len(d), ', '.join(map(str, d))))")
t_check prompt_encoded_like_tokenize_py "grep -qxF '$want' $TMP/g0" "trainer: $(grep '^prompt' "$TMP/g0"); tokenize.py: $want"
t_check generation_prints_text "grep -F '$PROMPT' $TMP/g0 | grep -v '^prompt' | awk '{ exit !(length(\$0) > ${#PROMPT}) }'"

# Greedy against the float64 reference, over 24 tokens of a 16-token window (it slides after 8).
prompt_ids=$(grep '^prompt' "$TMP/g0" | sed 's/.*\[\(.*\)\]/\1/; s/ //g')
$PYTHON scripts/reference.py -e "$MODEL" --greedy 24 --prompt-ids "$prompt_ids" -t 16 > "$TMP/ref.txt" 2>&1
gap=$(sed -n 's/^min_gap: //p' "$TMP/ref.txt")
t_check greedy_margin_clear "$PYTHON -c 'import sys; sys.exit(0 if float(\"$gap\") > 1e-3 else 1)'" "the two best logits come within $gap: the comparison would not mean anything"
t_check greedy_matches_reference "[ \"\$(ids $TMP/g0)\" = \"\$(ids $TMP/ref.txt)\" ]" "trainer $(ids "$TMP/g0"); reference $(ids "$TMP/ref.txt")"

# Sampling: the same seed gives the same tokens, another seed others; greedy ignores the seed; top-k 1 is greedy.
gen "$TMP/s1" -prompt "$PROMPT" -seed 1
gen "$TMP/s1b" -prompt "$PROMPT" -seed 1
gen "$TMP/s2" -prompt "$PROMPT" -seed 2
gen "$TMP/g2" -prompt "$PROMPT" -temp 0 -seed 2
gen "$TMP/k1" -prompt "$PROMPT" -topk 1 -seed 3
t_check sampling_reproducible "[ -n \"\$(ids $TMP/s1)\" ] && [ \"\$(ids $TMP/s1)\" = \"\$(ids $TMP/s1b)\" ]"
t_check sampling_follows_seed "[ -n \"\$(ids $TMP/s2)\" ] && [ \"\$(ids $TMP/s1)\" != \"\$(ids $TMP/s2)\" ]"
t_check greedy_ignores_seed "[ \"\$(ids $TMP/g0)\" = \"\$(ids $TMP/g2)\" ]"
t_check topk1_is_greedy "[ \"\$(ids $TMP/g0)\" = \"\$(ids $TMP/k1)\" ]"

# -s's samples during training draw with -temp and -topk too: greedy, the seed changes nothing (fp32, no
# shuffling: both seeds train the same model).
train_sample() {   # out file, flags...
    local out=$1; shift
    ./train_gpt_cpu -e "$MODEL" -i "$TMP/data/t_train_*.bin" -j "" -b 1 -t 16 -x 1 -s 1 -g 12 "$@" > "$out" 2>&1
}
smp() { sed -n '/^step 1 | sample: /,/^trained /p' "$1" | grep -v '^trained '; }
train_sample "$TMP/ts0" -temp 0 -seed 1
train_sample "$TMP/ts0b" -temp 0 -seed 2
train_sample "$TMP/ts1" -seed 1
train_sample "$TMP/ts1b" -seed 2
t_check training_sample_greedy_ignores_seed "[ -n \"\$(smp $TMP/ts0)\" ] && [ \"\$(smp $TMP/ts0)\" = \"\$(smp $TMP/ts0b)\" ]" "$(smp "$TMP/ts0") / $(smp "$TMP/ts0b")"
t_check training_sample_follows_seed "[ -n \"\$(smp $TMP/ts1)\" ] && [ -n \"\$(smp $TMP/ts1b)\" ] && [ \"\$(smp $TMP/ts1)\" != \"\$(smp $TMP/ts1b)\" ]"

# Output that cannot be written is an error, not a short text and exit 0.
./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 -prompt "$PROMPT" > /dev/full 2> "$TMP/full.err"
t_check generation_full_disk_fails "[ $? -eq 1 ] && grep -q '^error: cannot write to standard output' $TMP/full.err" "$(cat "$TMP/full.err")"

# A pipeline of 2 stages generates what one rank does.
if mpi_available; then
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 -prompt "$PROMPT" -seed 1 \
        -pp 2 > "$TMP/pp.txt" 2>&1
    t_check pipeline_generates_the_same "[ \"\$(ids $TMP/pp.txt)\" = \"\$(ids $TMP/s1)\" ]" "pp2: $(ids "$TMP/pp.txt")"
    # Each tensor rank holds a slice of the vocabulary's logits; the sampler sees the whole rows.
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 -prompt "$PROMPT" -seed 1 \
        -tp 2 > "$TMP/tp.txt" 2>&1
    t_check tensor_parallel_generates_the_same "[ \"\$(ids $TMP/tp.txt)\" = \"\$(ids $TMP/s1)\" ]" "tp2: $(ids "$TMP/tp.txt")"
    # Each context rank feeds its positions of the window; the rank holding the last one draws, sampled (its
    # seed's stream kept in step on every rank) and greedy, past the window's slide; -s's training samples too.
    for cpm in ulysses ring; do
        for how in "-seed 1:s1" "-temp 0:g0"; do
            # shellcheck disable=SC2086
            "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 24 -prompt "$PROMPT" \
                ${how%:*} -cp 2 -cpm $cpm > "$TMP/cp.txt" 2>&1
            t_check "context_parallel_${cpm}_generates_the_same_${how#*:}" "[ -n \"\$(ids $TMP/cp.txt)\" ] &&
                [ \"\$(ids $TMP/cp.txt)\" = \"\$(ids $TMP/${how#*:})\" ]" "cp2 $cpm: $(ids "$TMP/cp.txt") $(grep -m1 error "$TMP/cp.txt")"
        done
        "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$MODEL" -i "$TMP/data/t_train_*.bin" -j "" -b 1 -t 16 -x 1 -s 1 -g 12 -seed 1 \
            -cp 2 -cpm $cpm > "$TMP/cp_train.txt" 2>&1
        t_check "context_parallel_${cpm}_training_sample" "[ -n \"\$(smp $TMP/ts1)\" ] && [ \"\$(smp $TMP/cp_train.txt)\" = \"\$(smp $TMP/ts1)\" ]" \
            "$(smp "$TMP/cp_train.txt") / $(smp "$TMP/ts1") $(grep -m1 error "$TMP/cp_train.txt")"
    done
else
    t_missing pipeline_and_tensor_parallel_generate MPI
fi

# SIGTERM (or Ctrl-C) ends the text where it is: the ids so far, exit 0.
./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 1000000 -prompt "$PROMPT" > "$TMP/long.txt" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q "^$PROMPT" "$TMP/long.txt" 2>/dev/null && break; sleep 0.1; done
sleep 0.5; kill -TERM $pid
for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && { kill -KILL $pid; echo "(still generating 10 s after SIGTERM)" >> "$TMP/long.txt"; }
wait $pid; rc=$?
t_check generation_stops_on_sigterm "[ $rc -eq 0 ] && [ \$(ids $TMP/long.txt | tr ',' '\n' | wc -l) -ge 1 ]" "rc $rc: $(tail -c 200 "$TMP/long.txt")"

# A shape instead of weights samples from a random model: said on stderr, once; a model file says nothing.
./train_gpt_cpu -e L2C64H2T64 -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 -g 4 -prompt "$PROMPT" > "$TMP/spec.txt" 2> "$TMP/spec.err"
t_check prompt_from_shape_warns "[ $? -eq 0 ] && [ \$(grep -c 'warning: -e L2C64H2T64 is a shape, not weights' $TMP/spec.err) -eq 1 ] && ! grep -q warning $TMP/g0.err" \
    "$(cat "$TMP/spec.err")"
# A tokenizer smaller than the model (200 tokens): ids beyond it are shown as <id N>, not dropped from the text.
mkdir -p "$TMP/small" && cp "$TMP/data/gpt2_merges.bin" "$TMP/small/"
$PYTHON - "$TMP/data/gpt2_tokenizer.bin" "$TMP/small/gpt2_tokenizer.bin" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
body, pos = data[1024:], 0
for _ in range(200):
    pos += 1 + body[pos]
open(sys.argv[2], "wb").write(struct.pack("<4i", 20240328, 2, 200, 0).ljust(1024, b"\0") + body[:pos])
PY
gen "$TMP/small.txt" -prompt "$PROMPT" -temp 0 -tk "$TMP/small/gpt2_tokenizer.bin"
$PYTHON - "$TMP/small.txt" > "$TMP/small.check" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
ids = [int(x) for x in re.search(r"^ids: \[(.*)\]$", text, re.M).group(1).split(", ")]
shown = [int(x) for x in re.findall(r"<id (\d+)>", text)]
print("ok" if shown == [i for i in ids if i >= 200] and shown else "ids %s, shown %s" % (ids, shown))
PY
t_check ids_beyond_tokenizer_shown "[ \"\$(cat $TMP/small.check)\" = ok ]" "$(cat "$TMP/small.check")"

# Bad input: one line each.
expect_error() {   # name, pattern, flags...
    local name=$1 pattern=$2; shift 2
    ./train_gpt_cpu -e "$MODEL" -tk "$TMP/data/gpt2_tokenizer.bin" -b 1 -t 16 "$@" > /dev/null 2> "$TMP/err"
    local rc=$?
    t_check "$name" "[ $rc -ne 0 ] && [ \$(wc -l < $TMP/err) -eq 1 ] && grep -q '$pattern' $TMP/err" "rc $rc: $(cat "$TMP/err")"
}
expect_error prompt_takes_no_run_dir "writes no run directory" -prompt "hi" -o "$TMP/x"
expect_error prompt_invalid_utf8 "not valid UTF-8 at byte 2" -prompt $'hi\xff'
cp "$TMP/data/gpt2_tokenizer.bin" "$TMP/lonely_tokenizer.bin"
expect_error prompt_needs_merges "no .*gpt2_merges.bin beside the tokenizer" -prompt "hi" -tk "$TMP/lonely_tokenizer.bin"
t_finish
