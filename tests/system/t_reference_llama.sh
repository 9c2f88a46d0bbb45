#!/usr/bin/env bash
# t_reference_llama.sh: scripts/reference.py's Llama family, checked without the trainer: against a second,
# plain float64 Llama (tests/tools/llama_plain.py) that reads the model files itself, and against values
# worked out by hand (tests/tools/llama_check.py: logits, loss, gradients and -dump files for GQA, one kv
# head, head_dim != C/NH, tied and untied heads, q/k norms, linear and llama3 RoPE scaling, a bf16 file;
# three AdamW steps; RoPE; Llama 3.1's frequency table; saved headers and sizes; bad specs and headers).
# Then the command line end to end: training from a spec, greedy decoding, the CPU bench.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
REF=scripts/reference.py

if ! "$PY" -c 'import torch' 2>/dev/null; then
    t_missing reference_llama "PyTorch (python3-torch)"
    t_finish
fi

# A crash without a FAIL line is still a FAIL.
out=$("$PY" tests/tools/llama_check.py "$TMP/check" 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
if printf '%s\n' "$out" | grep -q '^FAIL '; then FAILED=1
elif [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep -q '^ok '; then
    t_fail llama_check "exited $rc: $(printf '%s\n' "$out" | tail -1)"
fi

SPEC="llama:L2,C32,H4,K2,F48,V300,T32,qknorm,rope-llama38/1/4/16"
"$PY" scripts/make_shard.py -o "$TMP/train.bin" -n 4000 -V 300 --seed 3 > /dev/null
"$PY" $REF -e "$SPEC" -i "$TMP/train.bin" -b 2 -t 16 -ga 2 -x 4 -u 1 -c 0.1 --seed 9 --save "$TMP/init.bin" \
    -o "$TMP/run" --quiet > "$TMP/run.txt" 2>&1
t_check llama_cli_train "[ \$(wc -l < '$TMP/run/log.jsonl' 2>/dev/null || echo 0) -eq 4 ]" \
    "no 4-step log: $(tail -2 "$TMP/run.txt" | tr '\n' ' ')"
# The saved and the trained model differ in values only: the same header and size.
t_check llama_cli_final_model "[ -s '$TMP/run/model_final.bin' ] && cmp -s -n 1024 '$TMP/init.bin' '$TMP/run/model_final.bin' \
    && [ \$(stat -c %s '$TMP/init.bin') -eq \$(stat -c %s '$TMP/run/model_final.bin') ] \
    && ! cmp -s '$TMP/init.bin' '$TMP/run/model_final.bin'" "model_final.bin's header or size differs from --save's"
# Training from the saved file retraces training from the spec (same seed): the same log, bit for bit.
"$PY" $REF -e "$TMP/init.bin" -i "$TMP/train.bin" -b 2 -t 16 -ga 2 -x 4 -u 1 -c 0.1 -o "$TMP/run2" --quiet \
    > "$TMP/run2.txt" 2>&1
losses() { "$PY" -c 'import json, sys; print([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(sys.argv[1]))])' "$1" 2>&1; }
t_check llama_cli_file_equals_spec "[ \"\$(losses '$TMP/run/log.jsonl')\" = \"\$(losses '$TMP/run2/log.jsonl')\" ]" \
    "spec: $(losses "$TMP/run/log.jsonl"); file: $(losses "$TMP/run2/log.jsonl")"

"$PY" $REF -e "$TMP/init.bin" --greedy 5 --prompt-ids 1,2,3 -t 16 > "$TMP/greedy.txt" 2>&1
t_check llama_cli_greedy "grep -Eq '^ids: \[[0-9]+(, [0-9]+){4}\]$' '$TMP/greedy.txt' && grep -q '^min_gap: ' '$TMP/greedy.txt'" \
    "$(tail -2 "$TMP/greedy.txt" | tr '\n' ' ')"

"$PY" $REF -e "$SPEC" --bench --device cpu --dtype float32 -b 2 -t 16 -x 3 --bench-warmup 1 --quiet \
    --bench-out "$TMP/bench.jsonl" > "$TMP/bench.txt" 2>&1
t_check llama_cli_bench_cpu "grep -q '\"model\": \"llama L2 C32 NH4 KV2 D8 F48' '$TMP/bench.jsonl' 2>/dev/null" \
    "$(tail -2 "$TMP/bench.txt" | tr '\n' ' ')"
t_finish
