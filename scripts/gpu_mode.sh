# gpu_mode.sh: sourced by the scripts that need a GPU (tests/gpu/*.sh, scripts/bench*.sh).
# dry_run_or_gpu NAME [ARG]: DRY_RUN=1 for `--dry-run` (a CPU build stands in, proving the script end
# to end) and for `--emu` (EMU=1: the CUDA build's own kernels, run by the kernel emulator, tests/emu),
# DRY_RUN=0 where nvidia-smi finds a GPU; anywhere else the script ends with one error line: a GPU test
# quietly run on the CPU build would compare that build with itself and pass.
dry_run_or_gpu() {
    EMU=0
    if [ "${2:-}" = "--dry-run" ]; then DRY_RUN=1
    elif [ "${2:-}" = "--emu" ]; then DRY_RUN=1 EMU=1
    elif command -v nvidia-smi >/dev/null 2>&1; then DRY_RUN=0
    else
        echo "error: $1 needs a GPU (nvidia-smi is not here); '$1 --dry-run' runs it on a CPU build, '$1 --emu' on the kernel emulator" >&2
        exit 1
    fi
}

# The CUDA backend's opt-in kernel variants (GPT_CUDA_VARIANTS, base/gpu_variants.h), each checked and timed
# beside the default by make test-gpu and make bench. tests/system/t_variants.sh holds this list to the binary's.
KERNEL_VARIANTS="cudnn_attention bias_grad_epilogue lt_plan_cache lt_autotune norm_one_pass adamw_multi"
