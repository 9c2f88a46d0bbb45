#!/usr/bin/env bash
# t_cp_docs.sh: -cp with documents (context_parallel.h): every context rank reads its positions' tokens, targets,
# masks and positions in their documents, and its attention the whole rows' document starts. On a packed
# conversation dataset (rows of 32 hold two or three documents, so documents cross the chunks of -cpm ring and
# the ranks' boundaries) and on plain shards read with -docmask 1, against one rank of the same batch, fp32,
# within 1e-5 at each of 4 steps (loss, gradient norm, the step's label count) and in every validation loss:
#   GPT-2 (learned positions) at -cp 2 Ulysses and -cp 4 ring; Llama (RoPE, 2 kv heads) at -cp 2 ring under
#   -z 3 -r 3 and -cp 4 Ulysses (kv heads copied); -docmask 1 at -cp 4 ring.
# The models' weights are N(0, 0.3^2) (tests/tools/doc_trainer_check.py model), where a rank reading positions
# that keep counting across documents, or attending across them, moves the losses by percents.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip t_cp_docs
$PYTHON tests/tools/doc_dataset.py "$TMP/d" -V 500 --seed 5 --conversations 120 --longest 20 --val 12 > /dev/null
$PYTHON tests/tools/doc_dataset.py "$TMP/plain" -V 500 --seed 5 --conversations 120 --longest 20 --val 12 --plain > /dev/null
$PYTHON tests/tools/doc_trainer_check.py model "$TMP/gpt2.bin" L2C64H4V512T64 \
    "$TMP/llama.bin" "llama:L2,C64,H4,K2,D16,F96,V512,T64,qknorm"
$PYTHON - "$TMP/tok1.bin" <<'PY'
import sys, numpy as np
h = np.zeros(256, np.int32)
h[:4] = [20240328, 2, 512, 1]   # llm.c's tokenizer file: vocabulary 512, end-of-text (document start) 1
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes() + b"".join(bytes([len(b"t%d" % i)]) + b"t%d" % i for i in range(512)))
PY
base=(-v 2 -m 2 -b 2 -t 32 -x 4 -l 2e-3 -u 2 -c 0.1 -gc 1.0 -s 0)
SFT=(-i "$TMP/d/chat_train_*.bin" -j "$TMP/d/chat_val_*.bin" -pack 1)
PLAIN=(-i "$TMP/plain/chat_train_*.bin" -j "$TMP/plain/chat_val_*.bin" -docmask 1 -tk "$TMP/tok1.bin")

same_as() {   # name, reference run
    compare_py log "$1_vs_one_rank" "$TMP/$1/log.jsonl" "$TMP/$2/log.jsonl" --steps 4 --tol 1e-5 --key loss --key grad_norm "${@:3}"
    val_losses_match "$1_val_losses" "$TMP/$1/log.jsonl" "$TMP/$2/log.jsonl"
}
case_cp() {   # name, reference, ranks, model, flags...
    local name=$1 ref=$2 np=$3 model=$4; shift 4
    train "$np" "$TMP/$name" -e "$TMP/$model.bin" "$@" || { t_fail "$name" "run failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    same_as "$name" "$ref" "${TRAINED[@]}"
}

train 1 "$TMP/gpt2_one" -e "$TMP/gpt2.bin" "${SFT[@]}" || t_fail reference "$(grep -m1 error "$TMP/gpt2_one.txt")"
train 1 "$TMP/llama_one" -e "$TMP/llama.bin" "${SFT[@]}" || t_fail reference "$(grep -m1 error "$TMP/llama_one.txt")"
train 1 "$TMP/llama_docmask_one" -e "$TMP/llama.bin" "${PLAIN[@]}" || t_fail reference "$(grep -m1 error "$TMP/llama_docmask_one.txt")"
TRAINED=(--key trained)   # the trainer logs the label count for masked shards only
case_cp uly2_gpt2 gpt2_one 2 gpt2 "${SFT[@]}" -cp 2
case_cp ring4_gpt2 gpt2_one 4 gpt2 "${SFT[@]}" -cp 4 -cpm ring
case_cp ring2_llama_z3_r3 llama_one 2 llama "${SFT[@]}" -cp 2 -cpm ring -z 3 -r 3
case_cp uly4_llama llama_one 4 llama "${SFT[@]}" -cp 4
TRAINED=()
case_cp ring4_llama_docmask llama_docmask_one 4 llama "${PLAIN[@]}" -cp 4 -cpm ring
t_finish
