#!/usr/bin/env bash
# t_lora_scripts.sh: LoRA in the scripts (tests/tools/lora_check.py): the adapter file and PEFT's adapter folder
# both ways (export_hf.py --adapter, import_hf.py --adapter: PEFT's names, shapes and config keys; back bit for
# bit; another base or rank refused in one line), export_hf.py --merge, and reference.py's LoRA (B = 0 is the
# base model bit for bit, A and B gradients against finite differences, the merged model's logits, a frozen
# base), on tiny GPT-2 and Llama models. Needs no trainer.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
out=$("$PY" tests/tools/lora_check.py "$TMP/lora" 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
if ! printf '%s\n' "$out" | grep -q '^FAIL ' && [ "$rc" -ne 0 ]; then
    t_fail lora_check "exited $rc: $(printf '%s\n' "$out" | tail -1)"
fi
printf '%s\n' "$out" | grep -q '^FAIL ' && FAILED=1
t_finish
