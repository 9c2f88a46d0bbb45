#!/usr/bin/env bash
# -lora-init DIR (core/model/lora_peft.h): the trainer reads a PEFT adapter folder itself. A folder that
# scripts/export_hf.py --adapter made of an adapter file with a nonzero B starts a run exactly as the file does
# (step 0's logits, loss and gradients bit for bit), for GPT-2 (c_attn, attn.c_proj and mlp.c_proj: PEFT's
# dotted-tail names) and a Llama shape (q and v in the fused q|k|v, up in gate|up, rsLoRA), with its tensors
# stored F32, BF16 or F16; every folder of another adapter or a broken one ends in one line naming the problem.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 3 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
llama=llama:L2,C64,H4,K2,F96,V512,T64
./train_gpt_cpu -e $llama -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/llama_init" >/dev/null 2>&1
LLAMA=$TMP/llama_init/ckpt_000000/model.bin

# An adapter file of each model whose A and B are random multiples of 2^-11 below 1/8: nonzero, and exact in
# BF16 and F16, so the folders stored in those dtypes hold the file's values exactly.
make_adapter() {   # model, out, rank, alpha x 1000, rslora, targets
    $PYTHON - "$@" <<'PY'
import sys, numpy as np
sys.path.insert(0, "scripts")
import families, lora_file
model, out, names = sys.argv[1], sys.argv[2], sys.argv[6]
R, ax, rslora = (int(x) for x in sys.argv[3:6])
cfg, _ = families.read_model_header(model)
adapter = lora_file.zero_adapter(cfg, R, ax, rslora, lora_file.target_bits(cfg, names.split(",")))
rng = np.random.default_rng(11)
for A, B in adapter.weights.values():
    for a in (A, B):
        a[...] = rng.integers(-255, 256, a.shape) / 2048
lora_file.write(out, adapter)
PY
}
make_adapter "$MODEL" "$TMP/gpt2.bin" 2 6000 0 qkv,proj,fcproj
make_adapter "$LLAMA" "$TMP/llama.bin" 3 5000 1 q,v,o,up,down
$PYTHON scripts/export_hf.py "$MODEL" "$TMP/gpt2_peft" --adapter "$TMP/gpt2.bin" >/dev/null
$PYTHON scripts/export_hf.py "$LLAMA" "$TMP/llama_peft" --adapter "$TMP/llama.bin" >/dev/null
$PYTHON tests/tools/peft_variants.py "$TMP/gpt2_peft" "$TMP/v"

run() {   # dump dir, flags...
    local d=$1; shift
    ./train_gpt_cpu -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 -v 0 -dump "$TMP/$d" "$@" > "$TMP/$d.txt" 2>&1
}
same_dump() {   # name, dump of the file's run, dump of the folder's run
    local bad="" f
    [ -s "$TMP/$2/logits0.f32" ] || bad="no logits in $2 ($(tail -1 "$TMP/$2.txt"))"
    [ -z "$bad" ] && [ ! -s "$TMP/$3/logits0.f32" ] && bad="no logits in $3 ($(tail -1 "$TMP/$3.txt"))"
    for f in "$TMP/$2"/*; do
        [ -z "$bad" ] && ! cmp -s "$f" "$TMP/$3/$(basename "$f")" && bad="$(basename "$f") differs ($(tail -1 "$TMP/$3.txt"))"
    done
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad"; fi
}
gpt2=(-e "$MODEL" -lora 2 -lora-alpha 6 -lora-targets qkv,proj,fcproj)
run gpt2_file "${gpt2[@]}" -lora-init "$TMP/gpt2.bin"
run gpt2_dir "${gpt2[@]}" -lora-init "$TMP/gpt2_peft"
same_dump gpt2_peft_folder_equals_adapter_file gpt2_file gpt2_dir
run gpt2_bf16 "${gpt2[@]}" -lora-init "$TMP/v/bf16"
same_dump gpt2_peft_bf16_tensors_equal_adapter_file gpt2_file gpt2_bf16
run gpt2_f16 "${gpt2[@]}" -lora-init "$TMP/v/f16"
same_dump gpt2_peft_f16_tensors_equal_adapter_file gpt2_file gpt2_f16
llama_flags=(-e "$LLAMA" -lora 3 -lora-alpha 5 -lora-rslora 1 -lora-targets q,v,o,up,down)
run llama_file "${llama_flags[@]}" -lora-init "$TMP/llama.bin"
run llama_dir "${llama_flags[@]}" -lora-init "$TMP/llama_peft"
same_dump llama_peft_folder_equals_adapter_file llama_file llama_dir

expect_error() {   # name, regex the error must match, args...
    local name=$1 pattern=$2; shift 2
    timeout -k 5 60 ./train_gpt_cpu -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
    local lines; lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: -lora-init .*$pattern" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err")"; fi
}
dir=(-lora-init "$TMP/gpt2_peft")
peft() {   # name, regex, folder under $TMP/v, other flags...
    local name=$1 pattern=$2 folder=$3; shift 3
    expect_error "$name" "$pattern" "${gpt2[@]}" "$@" -lora-init "$TMP/v/$folder"
}
expect_error peft_other_rank "adapter_config.json: r 2, the run's -lora is 3" "${gpt2[@]}" -lora 3 "${dir[@]}"
expect_error peft_other_alpha "adapter_config.json: lora_alpha 6, the run's -lora-alpha is 4" "${gpt2[@]}" -lora-alpha 4 "${dir[@]}"
expect_error peft_other_rslora "adapter_config.json: use_rslora false, the run's -lora-rslora is 1" "${gpt2[@]}" -lora-rslora 1 "${dir[@]}"
expect_error peft_other_targets "target_modules select qkv,proj,fcproj; the run's -lora-targets are qkv,fc" "${gpt2[@]}" -lora-targets qkv,fc "${dir[@]}"
expect_error peft_other_base "tensor base_model.model.transformer.h.0.attn.c_attn.lora_A.weight has shape \[2, 64\], the run's adapters make it \[2, 128\]" \
    "${gpt2[@]}" -e L2C128H4V512T64 "${dir[@]}"
expect_error peft_folder_of_fewer_layers "tensor base_model.model.transformer.h.2.attn.c_attn.lora_A.weight is missing" "${gpt2[@]}" -e L3C64H4V512T64 "${dir[@]}"
expect_error peft_llama_folder_on_gpt2 "target_modules entry \"q_proj\" is none of this gpt2 model's LoRA targets \(attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj in each block\)" \
    "${gpt2[@]}" -lora 3 -lora-alpha 5 -lora-rslora 1 -lora-init "$TMP/llama_peft"
peft peft_not_lora "adapter_config.json: peft_type is \"LOHA\"; only LORA adapters are read" loha
peft peft_dora "adapter_config.json: use_dora is true; the trainer's adapters are plain LoRA" dora
peft peft_bias "adapter_config.json: bias is \"all\"; the trainer's adapters have none" bias
peft peft_stray_module "target_modules entry \"lm_head\" is none of this gpt2 model's LoRA targets" stray_module
peft peft_regex_target_modules "target_modules is \".\*c_attn\"; want a list of module names" regex
peft peft_one_block "target_modules select attn.c_attn in 1 of the 2 layers; the trainer adapts every layer" one_block
peft peft_missing_tensor "adapter_model.safetensors: tensor base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight is missing" missing_tensor
peft peft_extra_tensor "tensor base_model.model.lm_head.lora_A.weight is none of the run's adapters \(2 layers of qkv,proj,fcproj" extra_tensor
peft peft_int_tensor "tensor base_model.model.transformer.h.0.attn.c_attn.lora_A.weight is I32; F32, BF16 and F16 are read" int_tensor
peft peft_truncated "adapter_model.safetensors: truncated: [0-9]+ bytes, tensor .* ends at byte [0-9]+" truncated
peft peft_short_header "adapter_model.safetensors: truncated: 20 bytes, its header alone takes [0-9]+" short_header
peft peft_no_config "adapter_config.json is missing \(a PEFT adapter folder holds adapter_config.json and adapter_model.safetensors\)" no_config
t_finish
