#!/usr/bin/env bash
# The kernel variants' rows of `make test-gpu` (GPT_CUDA_VARIANTS, base/gpu_variants.h; the list is
# $KERNEL_VARIANTS in scripts/gpu_mode.sh). A variant becomes the default only after these rows pass on a GPU
# and make bench times it faster beside the default. Each variant on its own:
#   - every kernel against its CPU twin (check_kernels.sh, seed 1, fp32 and bf16, deterministic kernels rerun
#     for identical bits);
#   - the test GPT-2's fp32 steps (losses and gradient norms to 1e-4, step-0 gradients per tensor) and bf16
#     steps (1e-2), and the test Llama's bf16 steps, against the CPU build's fp32 runs;
#   - determinism: a second bf16 run gives the same losses, norms and model bits (not for lt_autotune, whose
#     choice of algorithm follows timings, so two runs may choose differently);
#   - the banner names the variant (the environment reached the program).
# For cudnn_attention, first cudnn_graph_check: each graph's descriptors, and on a GPU each graph's
# deterministic plan; and its training runs must not have left a bf16 shape to the built-in kernels.
# Writes $VARIANTS_REPORT (default build/gpu_variants_report.md). --dry-run: the fenced CPU build stands in.
set -u
cd "$(dirname "$0")/../.."
REPORT=${VARIANTS_REPORT:-build/gpu_variants_report.md}   # apart from run_gpu.sh's $REPORT: make test-gpu runs both
source tests/gpu/lib.sh
gpu_test_setup tests/gpu/run_variants.sh "${1:-}"
cpu_reference_runs

cudnn_graphs() {
    if [ ! -x build/cudnn_graph_check ]; then
        ROWS+=("| cudnn_attention_graphs | skip | build/cudnn_graph_check not built: no cuDNN found (make CUDNN=1 CUDNN_HOME=DIR) |")
        return
    fi
    local plan=--plan out rc
    [ -n "$DRY" ] && plan=""
    out=$(build/cudnn_graph_check $plan 2>&1); rc=$?
    echo "$out"
    if [ $rc -eq 0 ]; then record cudnn_attention_graphs ok "$(echo "$out" | tail -1)${plan:+, plans on the GPU}"
    else record cudnn_attention_graphs FAIL "$(echo "$out" | grep -m3 -E '^FAIL|error' | tr '\n' ' ' | cut -c1-300)"; fi
}

variant_kernels() {   # variant
    local out rc
    out=$(SEEDS=1 DTYPES="fp32 bf16" KC_FALLBACK=0 KC_BENCH=0 GPT_CUDA_VARIANTS=$1 bash tests/gpu/check_kernels.sh $DRY 2>&1); rc=$?
    echo "$out" | grep -E '^(FAIL|note)' | head -20
    local sum
    sum=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
    [ $rc -eq 0 ] && record "variant_$1_kernels" ok "$sum" || record "variant_$1_kernels" FAIL "${sum:-no summary}"
}

variant_run() {   # variant, name, flags...: one training run under the variant; the banner must name it
    local v=$1 name=$2; shift 2
    GPT_CUDA_VARIANTS=$v $GPU "$@" -o "$W/$name" > "$W/$name.txt" 2>&1 || { record "${name}_run" FAIL "$(grep -m1 error "$W/$name.txt")"; return; }
    grep -q "^kernel variants: $v" "$W/$name.txt" || record "${name}_banner" FAIL "the banner does not name $v"
}

variant_steps() {   # variant
    local v=$1
    variant_run "$v" "v_${v}_fp32" "${flags[@]}" -p fp32 -dump "$W/v_${v}_fp32"
    check "variant_${v}_fp32_vs_cpu" log "v_${v}_fp32" "$W/v_${v}_fp32/log.jsonl" "$W/cpu/log.jsonl" --steps 6 --tol 1e-4 --key loss --key grad_norm
    check "variant_${v}_fp32_grads_vs_cpu" grads "v_${v}_grads" "$W/v_${v}_fp32/grads0.f32" "$W/cpu/grads0.f32" "$MODEL" --tol 1e-4
    variant_run "$v" "v_${v}_bf16" "${flags[@]}" -p bf16
    check "variant_${v}_bf16_vs_cpu" log "v_${v}_bf16" "$W/v_${v}_bf16/log.jsonl" "$W/cpu/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
    variant_run "$v" "v_${v}_llama" "${lflags[@]}" -p bf16
    check "variant_${v}_llama_bf16_vs_cpu" log "v_${v}_llama" "$W/v_${v}_llama/log.jsonl" "$W/lcpu/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
}

variant_determinism() {   # variant
    local v=$1
    if [ "$v" = lt_autotune ]; then
        ROWS+=("| variant_${v}_determinism | skip | by design: the algorithm chosen follows timings, so two runs may differ within the tolerances |")
        return
    fi
    variant_run "$v" "v_${v}_bf16_again" "${flags[@]}" -p bf16
    if [ -n "$(fields "$W/v_${v}_bf16/log.jsonl")" ] && diff <(fields "$W/v_${v}_bf16/log.jsonl") <(fields "$W/v_${v}_bf16_again/log.jsonl") >/dev/null &&
       cmp -s "$W/v_${v}_bf16/ckpt_000006/model.bin" "$W/v_${v}_bf16_again/ckpt_000006/model.bin"; then
        record "variant_${v}_determinism" ok "two bf16 runs: identical losses, norms and model bits"
    else
        record "variant_${v}_determinism" FAIL "two identical bf16 runs differ"
    fi
}

# cudnn_attention: the bf16 runs' attention went through cuDNN (a shape left to the built-in kernels says so on stderr).
cudnn_ran() {
    [ -n "$DRY" ] && { ROWS+=("| variant_cudnn_attention_used | skip | dry run: the CPU build has no cuDNN |"); return; }
    local notes
    notes=$(grep -h "note: cudnn_attention" "$W/v_cudnn_attention_bf16.txt" "$W/v_cudnn_attention_llama.txt" | sort -u)
    [ -z "$notes" ] && record variant_cudnn_attention_used ok "every bf16 attention call of GPT-2 and the Llama ran through cuDNN" ||
        record variant_cudnn_attention_used FAIL "$(echo "$notes" | head -2 | tr '\n' ' ' | cut -c1-300)"
}

cudnn_graphs
for v in $KERNEL_VARIANTS; do
    echo "== variant $v"
    variant_kernels "$v"
    variant_steps "$v"
    variant_determinism "$v"
    [ "$v" = cudnn_attention ] && cudnn_ran
done
write_report "make test-gpu (kernel variants: tests/gpu/run_variants.sh)"
