#!/usr/bin/env bash
# The GPU build compiles and links on every CI run (nothing runs it here: CI has no GPU), with machine
# code for each architecture the Makefile names (sm_80, sm_90 by default) and warnings as errors.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1; then
    echo "skip build_cuda: nvcc not found (install the CUDA toolkit to build train_gpt)"
    t_finish
fi
if make -s train_gpt build/kernel_check_gpu > "$TMP/build.log" 2>&1; then t_ok build_cuda_links
else t_fail build_cuda_links "$(grep -m3 -E 'error|Error' "$TMP/build.log")"; fi
if command -v cuobjdump >/dev/null 2>&1 && [ -x train_gpt ]; then
    archs=$(cuobjdump --list-elf train_gpt 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')
    t_check build_cuda_has_sm80_sm90 "[[ '$archs' == *sm_80* && '$archs' == *sm_90* ]]" "machine code for: $archs"
fi
t_finish
