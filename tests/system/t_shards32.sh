#!/usr/bin/env bash
# llm.c's 32-bit token shards ([20240801, 7, ntok] + uint32 tokens) in the trainer: a short training on them
# logs bit for bit the losses of the same tokens in 16-bit shards, train and validation, and so does a
# training whose shards mix the two formats; a token past the model's vocabulary (here one past 65,535,
# which a 16-bit read would wrap into it) is one line naming the shard and the position.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
MS="$PYTHON scripts/make_shard.py"
for bits in 16 32; do
    $MS -o "$TMP/train$bits.bin" -n 5000 -V 512 --seed 1 --token-bits $bits >/dev/null || t_fail make_shard "train, $bits bits"
    $MS -o "$TMP/val$bits.bin" -n 1000 -V 512 --seed 2 --token-bits $bits >/dev/null || t_fail make_shard "val, $bits bits"
done
t_check shards_differ_in_width_only '[ $(stat -c %s "$TMP/train32.bin") -eq $((1024 + 4 * 5000)) ] &&
    [ $(stat -c %s "$TMP/train16.bin") -eq $((1024 + 2 * 5000)) ] &&
    [ "$($PYTHON tests/tools/tokenizer_shards.py ids "$TMP/train32.bin")" = "$($PYTHON tests/tools/tokenizer_shards.py ids "$TMP/train16.bin")" ]' \
    "make_shard.py --token-bits 32 and 16 with one seed do not hold the same tokens"

# The 16-bit training stream cut in two: a 32-bit first half, a 16-bit second half.
mkdir "$TMP/mix"
$PYTHON - "$TMP/train16.bin" "$TMP/mix" <<'PY' || t_fail mix_shards "could not split the stream"
import sys
import numpy as np
src, out = sys.argv[1:3]
toks = np.fromfile(src, dtype="<u2", offset=1024)
for i, (part, magic, version, dtype) in enumerate([(toks[:2345], 20240801, 7, "<u4"), (toks[2345:], 20240520, 1, "<u2")]):
    head = np.zeros(256, dtype="<i4")
    head[:3] = [magic, version, len(part)]
    with open("%s/m_%d.bin" % (out, i), "wb") as f:
        f.write(head.tobytes() + part.astype(dtype).tobytes())
PY

train() {   # name, train glob, val glob
    ./train_gpt_cpu -e L2C64H4V512T64 -i "$2" -j "$3" -b 2 -t 32 -x 6 -v 3 -m 2 -s 0 -o "$TMP/$1" \
        > "$TMP/$1.out" 2>&1 || t_fail "$1_runs" "$(tail -1 "$TMP/$1.out")"
}
# Every step's loss and gradient norm, and every validation loss, as logged.
losses() { grep -o '"step": [0-9]*, "\(loss\|val_loss\)": [^,}]*\(, "lr": [^,]*, "grad_norm": [^,}]*\)\?' "$1"; }
same_losses() {   # name, run, reference run
    local a b
    a=$(losses "$TMP/$2/log.jsonl"); b=$(losses "$TMP/$3/log.jsonl")
    t_check "$1" '[ "$(grep -c val_loss <<< "$b")" -eq 3 ] && [ "$(grep -c grad_norm <<< "$b")" -eq 6 ] && [ "$a" = "$b" ]' \
        "$2: $(tr '\n' ' ' <<< "$a"); $3: $(tr '\n' ' ' <<< "$b")"
}
train u16 "$TMP/train16.bin" "$TMP/val16.bin"
train u32 "$TMP/train32.bin" "$TMP/val32.bin"
train mixed "$TMP/mix/m_*.bin" "$TMP/val32.bin"
same_losses shards32_same_losses_as_16 u32 u16
same_losses shards_mixed_widths_same_losses mixed u16

# Tokens up to 69,999: the vocabulary's default width is 32 bits.
$MS -o "$TMP/wide.bin" -n 3000 -V 70000 --seed 3 >/dev/null
t_check wide_shard_has_tokens_past_16_bits '[ "$(od -An -t d4 -N 8 "$TMP/wide.bin" | tr -s " ")" = " 20240801 7" ] &&
    [ "$($PYTHON tests/tools/tokenizer_shards.py ids "$TMP/wide.bin" | tr " " "\n" | sort -n | tail -1)" -ge 65536 ]' \
    "make_shard.py -V 70000 did not write a 32-bit shard with tokens past 65,535"
# Under a model of 65,536 tokens the first token past it (in the first window) is refused.
first=$($PYTHON -c "import numpy as np, sys; t = np.fromfile(sys.argv[1], '<u4', offset=1024); i = int(np.argmax(t >= 65536)); print(t[i], i)" "$TMP/wide.bin")
./train_gpt_cpu -e L2C64H4V65536T64 -i "$TMP/wide.bin" -j "" -b 2 -t 64 -x 1 -s 0 > /dev/null 2> "$TMP/refuse.err"; rc=$?
t_check shards32_token_past_vocab_refused '[ $rc -eq 1 ] && [ "$(wc -l < "$TMP/refuse.err")" -eq 1 ] &&
    grep -q "^error: token shard $TMP/wide.bin: token ${first% *} at position ${first#* } is >= vocab size 65536$" "$TMP/refuse.err"' \
    "exit $rc: $(head -2 "$TMP/refuse.err" | tr '\n' '|') (first token past 65535: ${first% *} at ${first#* })"
t_finish
