#!/usr/bin/env bash
# `make bench-cpu`: the host AdamW step of -offload (kernels/adamw_host.h) on N parameters, against the
# memory-bandwidth floor measured in the same run and PyTorch's CPU AdamW (foreach) on as many parameters,
# all with the same thread count. Run it on an idle machine: a timing taken beside other work means nothing.
#   BENCH_PARAMS (default 124475904, GPT-2 124M), OMP_NUM_THREADS (default: every core)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${BENCH_PARAMS:-124475904}
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS
make -s build/bench_adamw
echo "# $(date -u +%F) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads"
build/bench_adamw "$N" fp32
build/bench_adamw "$N" bf16
/usr/bin/python3 bench/bench_adamw_torch.py "$N" "$THREADS"
