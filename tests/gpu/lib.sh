# lib.sh: sourced by the GPU test scripts (run_gpu.sh, run_variants.sh): the set-up, the pass/fail rows, the
# comparisons and the report. Run from the repository root.

# gpu_test_setup NAME [--dry-run]: PY (the Python with numpy and torch: the GPU machine's python3, or Debian's
# /usr/bin/python3 here; exported so check_kernels.sh uses the same one), GPU (the binary under test: train_gpt,
# or with --dry-run the fenced CPU build), DRY ("--dry-run" or ""), W (a scratch directory removed at exit).
gpu_test_setup() {
    PY=python3
    python3 -c 'import numpy, torch' 2>/dev/null || PY=/usr/bin/python3
    export PYTHON=$PY
    GPU=./train_gpt
    DRY=""
    source scripts/gpu_mode.sh
    dry_run_or_gpu "$1" "${2:-}"
    if [ "$EMU" = 1 ]; then
        DRY="--emu"; GPU=build/train_gpt_emu
        [ -x "$GPU" ] || { echo "error: --emu runs $GPU: build it first (make test-emu builds it)" >&2; exit 1; }
    elif [ "$DRY_RUN" = 1 ]; then
        DRY="--dry-run"; GPU=build/train_gpt_fenced
        [ -x "$GPU" ] || { echo "error: --dry-run runs $GPU: build it first (make tests-bin)" >&2; exit 1; }
    fi
    # The test models (cpu_reference_runs, run_gpu.sh): under the emulator, which runs every GPU thread on
    # the CPU, smaller ones that still take every kernel path (head size 64 for the tensor-core attention,
    # 128 for the Llama's, grouped-query heads, 4 layers for -pp 4).
    if [ "$EMU" = 1 ]; then
        GSPEC=L4C128H2T64 BT=(-b 2 -t 32)
        LSPEC="llama:L2,C128,H4,K2,D128,F256,V50257,T64,qknorm"
        KSPEC="llama:L2,C128,H4,K1,D32,F256,V50257,T64,qkvbias"
    else
        GSPEC=L4C128H4T256 BT=(-b 4 -t 128)
        LSPEC="llama:L2,C256,H4,K2,D128,F512,V50257,T256,qknorm"
        KSPEC="llama:L2,C128,H4,K1,D32,F256,V50257,T256,qkvbias"
    fi
    W=$(mktemp -d /tmp/gpu-test.XXXXXX)
    trap 'rm -rf "$W"' EXIT
    ROWS=()
    passed=0
    failed=0
}

record() {   # name, status (ok|FAIL), detail
    ROWS+=("| $1 | $2 | $3 |")
    if [ "$2" = ok ]; then passed=$((passed + 1)); echo "ok $1"; else failed=$((failed + 1)); echo "FAIL $1: $3"; fi
}

check() {   # name, compare.py arguments...: its ok/FAIL lines become one row
    local name=$1 out; shift
    out=$($PY tests/tools/compare.py "$@" 2>&1)
    if [ $? -eq 0 ]; then record "$name" ok "$(echo "$out" | grep -v '^ok' | tr '\n' ' ' | cut -c1-200)"
    else record "$name" FAIL "$(echo "$out" | grep '^FAIL' | tr '\n' ' ' | cut -c1-300)"; fi
}

steplog() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
fields() { grep -o '"step": [0-9]*, "\(loss\|val_loss\)": [^,}]*\(, "lr": [^,]*, "grad_norm": [^,]*\)\?' "$1"; }

same_steps() {   # name, log, reference log
    if [ -n "$(steplog "$2")" ] && diff <(steplog "$2") <(steplog "$3") >/dev/null; then record "$1" ok "identical losses and norms"
    else record "$1" FAIL "$(grep -m1 error "${2%/log.jsonl}.txt" || echo 'losses or norms differ')"; fi
}

# The test models and data, and the CPU build's fp32 runs every GPU run is compared with: a GPT-2 (MODEL, its
# flags `flags`, runs in $W/cpu) and a Llama with q/k norms and 2 kv heads of 4 at head size 128 (LMODEL,
# `lflags`, $W/lcpu); both dump their step-0 gradients.
cpu_reference_runs() {
    $PY scripts/make_shard.py -o "$W/data.bin" -n 200000 -V 50257 --seed 7 >/dev/null
    ./train_gpt_cpu -e "$GSPEC" -i "$W/data.bin" -j "" -x 0 -s 0 "${BT[@]}" -o "$W/init" >/dev/null 2>&1
    MODEL="$W/init/ckpt_000000/model.bin"
    flags=(-e "$MODEL" -i "$W/data.bin" -j "" "${BT[@]}" -ga 2 -x 6 -l 1e-3 -u 2 -c 0.1 -gc 1.0 -s 0)
    ./train_gpt_cpu "${flags[@]}" -p fp32 -o "$W/cpu" -dump "$W/cpu" > "$W/cpu.txt" 2>&1 || record step_cpu_run FAIL "$(tail -1 "$W/cpu.txt")"
    ./train_gpt_cpu -e "$LSPEC" -i "$W/data.bin" -j "" -x 0 -s 0 "${BT[@]}" -o "$W/linit" >/dev/null 2>&1
    LMODEL="$W/linit/ckpt_000000/model.bin"
    lflags=("${flags[@]}" -e "$LMODEL")
    ./train_gpt_cpu "${lflags[@]}" -p fp32 -o "$W/lcpu" -dump "$W/lcpu" > "$W/lcpu.txt" 2>&1 || record llama_cpu_run FAIL "$(tail -1 "$W/lcpu.txt")"
}

# write_report COMMAND: the pass/fail table with the date, commit and device to $REPORT, and on the console.
write_report() {
    mkdir -p "$(dirname "$REPORT")"
    {
        echo "# GPU test report"
        echo
        echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "- commit: ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
        if [ "$EMU" = 1 ]; then echo "- device: none: the kernel emulator (tests/emu) runs train_gpt's kernels on the CPU"
        else echo "- device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "none (dry run: the fenced CPU build stands in)")"; fi
        echo "- command: $1"
        echo
        echo "| check | result | detail |"
        echo "|---|---|---|"
        printf '%s\n' "${ROWS[@]}"
        echo
        echo "$passed passed, $failed failed"
    } > "$REPORT"
    echo "report: $REPORT"
    printf '%s\n' "${ROWS[@]}"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
