#!/usr/bin/env bash
# Document datasets (shards with .mask files) in the trainer: a packed row of two conversations gives each the
# loss it has alone (GPT-2's learned positions and the Llama family's RoPE both restart, attention stays in
# each document, only labels count); the progress line and log.jsonl show trained tokens; a step without
# labels leaves the model alone; -docmask 1 on plain shards; resume is bit-exact and refuses another -pack;
# the bad inputs are one-line errors.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
# docs.py DIR NAME SEED N MINLEN MAXLEN [untrained]: N conversations of random lengths, each a start token
# (1), a "user" part (not trained) and an "assistant" part (trained, with its closing token 2), written as
# DIR/NAME_train_000001.bin + .mask; prints each conversation's label count, space-separated.
cat > "$TMP/docs.py" <<'EOF'
import sys, numpy as np
d, name, seed, n, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
untrained = len(sys.argv) > 7
rng = np.random.default_rng(seed)
toks, mask, labels = [], [], []
for _ in range(n):
    L = int(rng.integers(lo, hi + 1))
    user = int(rng.integers(1, L - 1))
    t = [1] + list(rng.integers(3, 64, L - 2)) + [2]
    m = [2] + [0] * (user - 1) + [0 if untrained else 1] * (L - user)
    toks += t; mask += m; labels.append(sum(x == 1 for x in m))
def header(magic, version, ntok, set_id=0x5eed):
    h = np.zeros(256, np.int32); h[:5] = [magic, version, ntok, set_id & 0xffffffff, set_id >> 32]; return h.tobytes()
with open(f"{d}/{name}_train_000001.bin", "wb") as f: f.write(header(20240520, 1, len(toks)) + np.array(toks, np.uint16).tobytes())
with open(f"{d}/{name}_train_000001.mask", "wb") as f: f.write(header(20261129, 1, len(toks)) + np.array(mask, np.uint8).tobytes())
print(" ".join(map(str, labels)))
EOF
docs() { $PYTHON "$TMP/docs.py" "$TMP" "$@"; }
first_loss() { losses "$1" | cut -d' ' -f1; }
losses() { $PYTHON -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1/log.jsonl"; }
close() { $PYTHON -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * max(1, abs(b)))" "$1" "$2"; }
all_close() { $PYTHON -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(len(a) != len(b) or len(a) == 0 or any(abs(float(x) - float(y)) > 1e-5 * max(1, abs(float(y))) for x, y in zip(a, b)))" "$1" "$2"; }
GPT=L2C32H2V64T32
LLAMA=llama:L2,C32,H2,K1,F64,V64,T32
quiet=(-j "" -v 0 -s 0 -t 32)

# One conversation alone and the same two packed into one row (25 of 32 tokens; A's row has padding too).
read -r nA <<< "$(docs A 1 1 11 11)"
read -r nB <<< "$(docs B 2 1 14 14)"
$PYTHON - "$TMP" <<'EOF'
import sys, shutil
d = sys.argv[1]
for ext in ("bin", "mask"):   # AB = A's stream then B's: one header each
    import numpy as np
    a, b = open(f"{d}/A_train_000001.{ext}", "rb").read(), open(f"{d}/B_train_000001.{ext}", "rb").read()
    h = np.frombuffer(a[:1024], np.int32).copy(); h[2] += np.frombuffer(b[:1024], np.int32)[2]
    open(f"{d}/AB_train_000001.{ext}", "wb").write(h.tobytes() + a[1024:] + b[1024:])
EOF
for m in gpt:$GPT llama:$LLAMA; do
    fam=${m%%:*} e=${m#*:}
    for d in A B AB; do
        ./train_gpt_cpu -e "$e" -i "$TMP/${d}_train_*.bin" "${quiet[@]}" -b 1 -x 1 -o "$TMP/$fam$d" > "$TMP/$fam$d.txt" 2>&1 ||
            t_fail "packed_${fam}_run_$d" "$(grep -m1 error "$TMP/$fam$d.txt")"
    done
    lA=$(first_loss "$TMP/${fam}A") lB=$(first_loss "$TMP/${fam}B") lAB=$(first_loss "$TMP/${fam}AB")
    alone=$($PYTHON -c "print(($lA * $nA + $lB * $nB) / ($nA + $nB))")
    t_check "packed_row_each_conversation_as_alone_$fam" "close $lAB $alone" "packed $lAB, alone $alone (A $lA x $nA, B $lB x $nB)"
done
t_check packed_row_counts_labels "grep -q '\"trained\": $((nA + nB)),' $TMP/gptAB/log.jsonl"
t_check packed_row_printed "grep -q '^data: 2 documents packed into 1 rows of -t 32 (78.1% tokens' $TMP/gptAB.txt"
t_check memory_counts_document_arrays "grep -q 'activations_saved.: 0}' $TMP/gptAB/log.jsonl"
t_check progress_trained_tok_s "grep -q 'tok/s, [0-9]* trained tok/s' $TMP/gptAB.txt && grep -q '\"trained_tok_s\": ' $TMP/gptAB/log.jsonl"

# Every layout against one rank and the float64 reference: t_sft_layouts.sh, t_sft_reference.sh.
docs C 3 30 4 24 > /dev/null

# Resume: 2 + 2 steps equal 4 straight, bit for bit; another -pack is a change -y 1 refuses.
r=("${quiet[@]}" -e $GPT -i "$TMP/C_train_*.bin" -b 2 -x 4 -sh 1 -l 1e-2 -long truncate -t 16)
./train_gpt_cpu "${r[@]}" -o "$TMP/straight" > /dev/null 2>&1
./train_gpt_cpu "${r[@]}" -n 2 -o "$TMP/split" > /dev/null 2>&1 && rm -rf "$TMP/split/ckpt_000004"
./train_gpt_cpu "${r[@]}" -o "$TMP/split" -y 1 > "$TMP/resumed.txt" 2>&1
t_check resume_documents_bit_exact "grep -q 'resumed from .*ckpt_000002' $TMP/resumed.txt && cmp -s $TMP/straight/ckpt_000004/model.bin $TMP/split/ckpt_000004/model.bin"
./train_gpt_cpu "${r[@]}" -o "$TMP/split" -y 1 -x 6 -pack 0 > "$TMP/repack.txt" 2>&1
t_check resume_refuses_other_pack "grep -q -- '-pack' $TMP/repack.txt && ! grep -q 'resumed from' $TMP/repack.txt"

# A step whose conversations have no label: no update, not even weight decay's (the model after it is the initial one).
docs U 4 4 12 12 untrained > /dev/null
u=(-e $GPT -i "$TMP/U_train_*.bin" "${quiet[@]}" -b 1 -l 1e-1 -c 0.1)
./train_gpt_cpu "${u[@]}" -x 1 -o "$TMP/u1" > "$TMP/u.txt" 2>&1
./train_gpt_cpu "${u[@]}" -x 0 -o "$TMP/u0" > /dev/null 2>&1
t_check step_without_labels_no_update "grep -q 'no trained token in this step' $TMP/u.txt && grep -q '\"loss\": null' $TMP/u1/log.jsonl && cmp -s $TMP/u0/ckpt_000000/model.bin $TMP/u1/ckpt_000001/model.bin"

# -docmask 1 on plain shards: without the document token the same losses as without documents; with it, others.
$PYTHON scripts/make_shard.py -o "$TMP/plain.bin" -n 3000 -V 50000 --seed 5 > /dev/null
pl=(-e L1C32H2V50304T32 -i "$TMP/plain.bin" "${quiet[@]}" -b 2 -x 2 -l 1e-2)
./train_gpt_cpu "${pl[@]}" -o "$TMP/p0" > /dev/null 2>&1
./train_gpt_cpu "${pl[@]}" -docmask 1 -o "$TMP/p1" > "$TMP/p1.txt" 2>&1
t_check docmask_no_start_token_same_losses "all_close '$(losses "$TMP/p1")' '$(losses "$TMP/p0")'"
$PYTHON - "$TMP" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
raw = bytearray(open(f"{d}/plain.bin", "rb").read())
t = np.frombuffer(raw, np.uint16, offset=1024).copy(); t[::9] = 50256
open(f"{d}/plain_eot.bin", "wb").write(bytes(raw[:1024]) + t.tobytes())
EOF
pe=(-e L1C32H2V50304T32 -i "$TMP/plain_eot.bin" "${quiet[@]}" -b 2 -x 2 -l 1e-2)
./train_gpt_cpu "${pe[@]}" -o "$TMP/e0" > /dev/null 2>&1
./train_gpt_cpu "${pe[@]}" -docmask 1 -o "$TMP/e1" > /dev/null 2>&1
t_check docmask_start_token_changes_losses "[ -n \"\$(losses $TMP/e1)\" ] && ! all_close '$(losses "$TMP/e1")' '$(losses "$TMP/e0")'"

# Bad input: one line, exit 1.
err() {   # name, expected text, flags...
    local name=$1 want=$2; shift 2
    ./train_gpt_cpu "$@" > "$TMP/$name.out" 2> "$TMP/$name.err"; local rc=$?
    t_check "$name" "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/$name.err) -eq 1 ] && grep -q -- '$want' $TMP/$name.err" "rc $rc: $(cat "$TMP/$name.err")"
}
cp "$TMP/A_train_000001.bin" "$TMP/M_train_000001.bin"; cp "$TMP/B_train_000001.bin" "$TMP/M_train_000002.bin"
cp "$TMP/A_train_000001.mask" "$TMP/M_train_000001.mask"
err error_mask_missing "M_train_000002.bin has none" -e $GPT -i "$TMP/M_train_*.bin" "${quiet[@]}" -b 1 -x 1
cp "$TMP/A_train_000001.mask" "$TMP/M_train_000002.mask"
err error_mask_mismatched "is for 11 tokens but its shard" -e $GPT -i "$TMP/M_train_*.bin" "${quiet[@]}" -b 1 -x 1
err error_docmask_no_token "-docmask 1: no tokenizer file" -e $GPT -i "$TMP/plain.bin" "${quiet[@]}" -b 1 -x 1 -docmask 1
err error_val_plain_train_documents "both splits must be document datasets" -e $GPT -i "$TMP/A_train_*.bin" -j "$TMP/plain.bin" \
    -v 1 -s 0 -t 32 -b 1 -x 1
err error_documents_longer_than_t "none of their 1 documents fits -t 8" -e $GPT -i "$TMP/B_train_*.bin" "${quiet[@]}" -t 8 -b 1 -x 1
t_finish
