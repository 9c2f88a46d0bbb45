#!/usr/bin/env bash
# t_sft_reference.sh: training on documents (mask files, packing, document attention, positions per document,
# the loss over a step's labels) against the float64 reference, scripts/reference.py:
# - the reference's own document paths, worked by hand (tests/tools/doc_selftest.py);
# - one rank matches the reference within 1e-5 over 8 steps (step-0 logits, loss, every gradient; each step's
#   loss, gradient norm, LR and label count; the validation losses on held-out conversations at steps 0, 4 and
#   8; the final model within 1e-4): GPT-2 and Llama with -pack 1 (Llama with -long truncate), -pack 0 on the
#   same conversations, and -docmask 1 on plain shards;
# - a packed row gives each conversation the logits and the loss it has alone (GPT-2 and Llama, -b 1 runs of
#   the row and of each conversation);
# - the first assistant token's label is trained and the role header's is not: the trainer's step-0 loss is
#   the mean over exactly the positions whose next token is trained, from its own logits, and not the mean
#   of the labels shifted by one, without the first assistant tokens, or with the headers'
#   (tests/tools/doc_trainer_check.py).
# The data: tests/tools/doc_dataset.py's made-up conversations (a made-up template, no tokenizer).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
BIN=./train_gpt_cpu

if ! "$PY" -c 'import torch' 2>/dev/null; then
    t_missing sft_reference "PyTorch (python3-torch)"
    t_finish
fi
# A Python checker's ok/FAIL lines; a crash without a FAIL line is still a FAIL.
run_checker() {   # name, args...
    local name=$1; shift
    local out rc
    out=$("$PY" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|#) '
    if printf '%s\n' "$out" | grep -q '^FAIL '; then FAILED=1
    elif [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep -q '^ok '; then
        t_fail "$name" "exited $rc: $(printf '%s\n' "$out" | tail -1)"; fi
}
run_checker doc_selftest tests/tools/doc_selftest.py "$TMP/self"

# 60 conversations of up to 40 tokens (some longer than -t 32) over two train shards, 8 for validation; the
# same as plain shards (documents start at BOS, token 1) with a tokenizer whose document-start token is 1.
D=$TMP/chat
$PY tests/tools/doc_dataset.py "$D" -V 500 --seed 3 --conversations 68 --longest 40 --val 8 > /dev/null
$PY tests/tools/doc_dataset.py "$TMP/plain" -V 500 --seed 3 --conversations 68 --longest 40 --val 8 --plain > /dev/null
$PY - "$TMP/tok1.bin" <<'PY'
import sys, numpy as np
h = np.zeros(256, np.int32)
h[:4] = [20240328, 2, 512, 1]   # llm.c's tokenizer file: vocabulary 512, end-of-text (document start) 1
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes() + b"".join(bytes([len(b"t%d" % i)]) + b"t%d" % i for i in range(512)))
PY
gpt2=L2C64H4V500T64
llama="llama:L2,C64,H4,K2,D32,F96,V512,T64,qknorm,rope-llama3:8/1/4/32"
for fam in gpt2 llama; do
    $BIN -e "${!fam}" -i "$D/chat_train_*.bin" -j "" -v 0 -s 0 -t 32 -x 0 -o "$TMP/init_$fam" > "$TMP/init_$fam.txt" 2>&1 ||
        t_fail "init_$fam" "$(tail -1 "$TMP/init_$fam.txt")"
done
common=(-b 2 -t 32 -ga 2 -x 8 -l 1e-3 -u 3 -q 0.1 -k cosine -c 0.5 -gc 0.5)
# Each case: name | model | data | flags for both. The trainer's runs first, then every reference run in one
# process (tests/tools/reference_runs.py: PyTorch imported once).
cases=("gpt2_pack1|gpt2|$D|-pack 1" "llama_pack1_truncate|llama|$D|-pack 1 -long truncate" "gpt2_pack0|gpt2|$D|-pack 0"
       "llama_docmask|llama|$TMP/plain|-docmask 1")
: > "$TMP/ref_runs.tsv"
for c in "${cases[@]}"; do
    IFS='|' read -r name fam data extra <<< "$c"
    # shellcheck disable=SC2206
    flags=(-e "$TMP/init_$fam/ckpt_000000/model.bin" -i "$data/chat_train_*.bin" -j "$data/chat_val_*.bin" -v 4 -m 2
           "${common[@]}" $extra)
    tk=(); [ "$name" = llama_docmask ] && tk=(-tk "$TMP/tok1.bin")   # -docmask's document-start token
    $BIN "${flags[@]}" "${tk[@]}" -s 0 -o "$TMP/c_$name" -dump "$TMP/cd_$name" > "$TMP/c_$name.txt" 2>&1 ||
        t_fail "${name}_trainer" "$(grep -m1 error "$TMP/c_$name.txt")"
    ref_flags=("${flags[@]}" --quiet -o "$TMP/r_$name" -dump "$TMP/rd_$name")
    [ "$name" = llama_docmask ] && ref_flags+=(--doc-start 1)
    (IFS=$'\t'; echo "${ref_flags[*]}") >> "$TMP/ref_runs.tsv"
done
$PY tests/tools/reference_runs.py < "$TMP/ref_runs.tsv" > "$TMP/ref_runs.txt" 2>&1
grep '^FAIL' "$TMP/ref_runs.txt" && FAILED=1
# Tolerances as t_reference.sh's and t_llama.sh's: fp32 against float64.
for c in "${cases[@]}"; do
    IFS='|' read -r name fam _ <<< "$c"
    model=$TMP/init_$fam/ckpt_000000/model.bin
    compare_py array "${name}_logits_step0" "$TMP/cd_$name/logits0.f32" "$TMP/rd_$name/logits0.f32" --tol 1e-5
    compare_py scalar "${name}_loss_step0" "$TMP/cd_$name/loss0.txt" "$TMP/rd_$name/loss0.txt" --tol 1e-5
    compare_py grads "${name}_grads_step0" "$TMP/cd_$name/grads0.f32" "$TMP/rd_$name/grads0.f32" "$model" --tol 1e-5
    trained=(--key trained); [ "$name" = llama_docmask ] && trained=()   # the trainer logs it for masks only
    compare_py log "${name}_8_steps" "$TMP/c_$name/log.jsonl" "$TMP/r_$name/log.jsonl" --steps 8 --tol 1e-5 \
        --key loss --key grad_norm --key lr "${trained[@]}" --clip 0.5
    val_losses_match "${name}_val_losses" "$TMP/c_$name/log.jsonl" "$TMP/r_$name/log.jsonl"
    compare_py models "${name}_final_model" "$TMP/c_$name/ckpt_000008/model.bin" "$TMP/r_$name/model_final.bin" \
        --tol 1e-4 --abs 1e-4 --kbias-bound "$(lr_sum 1e-3 3 8 0.1)"
done
# The trainer counts what the reference's packing makes: the documents left out or cut, the rows.
py_check pack_counts_as_reference "$D/chat_train_*.bin" "$TMP/c_gpt2_pack1.txt" "$TMP/c_llama_pack1_truncate.txt" <<'PY'
import sys
sys.path.append("scripts")   # last: scripts/tokenize.py must not shadow the standard library's
import reference_data
stream = reference_data.Stream(sys.argv[1], 500)
bad = []
for out, how, verb in ((sys.argv[2], "drop", "left out"), (sys.argv[3], "truncate", "cut to their first 32 tokens")):
    rows, longer, ndocs = reference_data.pack(stream, 32, how)
    text = open(out).read()
    want = ["data: %d of %d documents longer than -t 32 %s" % (longer, ndocs, verb),
            "data: %d documents packed into %d rows of -t 32" % (ndocs - (longer if how == "drop" else 0), rows.tokens.shape[0])]
    bad += ["%s: no line '%s'" % (out, w) for w in want if w not in text]
print("; ".join(bad) if bad or longer == 0 else "ok")
PY

# Three short conversations in one row and each alone (-b 1, one step), on models of O(1) weights.
$PY tests/tools/doc_dataset.py "$TMP/row" --seed 9 --conversations 3 --longest 16 --shards 1 --alone > /dev/null
$PY tests/tools/doc_trainer_check.py model "$TMP/big_gpt2.bin" "$gpt2" "$TMP/big_llama.bin" "$llama"
for fam in gpt2 llama; do
    for data in chat chat_alone0 chat_alone1 chat_alone2; do
        $BIN -e "$TMP/big_$fam.bin" -i "$TMP/row/${data}_train_*.bin" -j "" -v 0 -s 0 -b 1 -t 48 -x 1 -o "$TMP/${data}_$fam" \
            -dump "$TMP/${data}_$fam/d" > "$TMP/${data}_$fam.txt" 2>&1 || t_fail "${fam}_$data" "$(grep -m1 error "$TMP/${data}_$fam.txt")"
    done
    run_checker "${fam}_documents" tests/tools/doc_trainer_check.py check "$fam" "$TMP/row/chat_train_*.bin" 48 \
        "$TMP/chat_$fam/d" "$TMP/chat_alone0_$fam/d" "$TMP/chat_alone1_$fam/d" "$TMP/chat_alone2_$fam/d"
done
t_finish
