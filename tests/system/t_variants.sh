#!/usr/bin/env bash
# GPT_CUDA_VARIANTS (base/gpu_variants.h), the CUDA backend's opt-in kernel variants, as every build reads it:
# an unknown name is one line listing the known ones, and that list is the one the GPU scripts run
# ($KERNEL_VARIANTS, scripts/gpu_mode.sh); named variants are printed and logged; the CPU build, which has one
# kernel each, says they change nothing there and gives the same bits as without them. On a GPU,
# tests/gpu/run_variants.sh checks each variant against the CPU twins. In the CUDA backend's source, each variant
# is one file that registers itself, and no kernel file asks at run time which variants are on.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
source scripts/gpu_mode.sh
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 3 >/dev/null
run() {   # out dir, then env assignments before the program via env
    local out=$1; shift
    env "$@" ./train_gpt_cpu -e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 3 -s 0 -o "$TMP/$out" > "$TMP/$out.txt" 2>&1
}

run bad GPT_CUDA_VARIANTS=cudnn_attention,no_such_variant
rc=$?
t_check variants_unknown_name_one_line "[ $rc -eq 1 ] && [ \$(wc -l < '$TMP/bad.txt') -eq 1 ] && grep -q \"^error: GPT_CUDA_VARIANTS names 'no_such_variant'\" '$TMP/bad.txt'" \
    "exit $rc: $(head -c 300 "$TMP/bad.txt")"
known=$(sed -n 's/.*(known: \(.*\))$/\1/p' "$TMP/bad.txt" | tr ',' ' ')
t_check variants_list_matches_gpu_scripts "[ -n '$known' ] && [ '$known' = '$KERNEL_VARIANTS' ]" \
    "the binary knows '$known', scripts/gpu_mode.sh runs '$KERNEL_VARIANTS'"
t_check variants_nothing_written_on_error "[ ! -e '$TMP/bad' ]" "a refused run left $TMP/bad: $(ls "$TMP/bad" 2>&1 | head -3)"

run plain
run all "GPT_CUDA_VARIANTS=${KERNEL_VARIANTS// /,}"
t_check variants_banner_names_them "grep -q '^kernel variants: ${KERNEL_VARIANTS// /,} (the CPU build has one kernel each: they change nothing here)$' '$TMP/all.txt'" \
    "$(grep -m1 'variants' "$TMP/all.txt" || tail -1 "$TMP/all.txt")"
t_check variants_logged "grep -q '\"kernel_variants\": \"${KERNEL_VARIANTS// /,}\"' '$TMP/all/log.jsonl'" "no kernel_variants record in log.jsonl"
t_check variants_no_banner_without "! grep -q 'kernel variants' '$TMP/plain.txt' && ! grep -q kernel_variants '$TMP/plain/log.jsonl'" \
    "a run without GPT_CUDA_VARIANTS mentions variants"
t_check variants_same_bits_on_cpu "cmp -s '$TMP/plain/ckpt_000003/model.bin' '$TMP/all/ckpt_000003/model.bin' && \
    diff <(grep -o '\"loss\": [^,]*' '$TMP/plain/log.jsonl') <(grep -o '\"loss\": [^,]*' '$TMP/all/log.jsonl') >/dev/null" \
    "the CPU build's bits changed with GPT_CUDA_VARIANTS set"
# The CUDA backend chooses every op's implementation once, when it fills its kernel table in backend_create
# (kernels/cuda_backend.cuh): each variant is kernels/variants/NAME.cuh with its NAME_register, listed among
# backend_create's registrations, and no kernel file reads the environment or names a variant (the test hooks
# are read with the variants, base/gpu_variants.c).
unregistered=""
for v in $KERNEL_VARIANTS; do
    grep -q "^static void ${v}_register(Backend\* be, KernelTable\* t)" "kernels/variants/$v.cuh" 2>/dev/null &&
        grep -q "{VARIANT_[A-Z_]*, ${v}_register}" kernels/backend_cuda.cu || unregistered="$unregistered $v"
done
t_check variants_each_register_itself "[ -z '$unregistered' ]" "not a file of its own registered in backend_create:$unregistered"
asks=$(grep -nE 'getenv|variant_on|\bVARIANT_[A-Z_]+' kernels/*.cuh kernels/variants/*.cuh 2>/dev/null | head -3)
t_check variants_chosen_once_in_backend_create "[ -z \"\$asks\" ] && ! grep -q getenv kernels/backend_cuda.cu" \
    "a kernel file chooses at run time: $asks"
run commas GPT_CUDA_VARIANTS=,norm_one_pass,,
t_check variants_empty_names_ignored "grep -q '^kernel variants: norm_one_pass ' '$TMP/commas.txt'" "$(tail -1 "$TMP/commas.txt")"
t_finish
