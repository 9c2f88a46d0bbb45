#!/usr/bin/env bash
# `make bench-nvme`: -nvme's host update (the optimizer's pass over state on disk) on N parameters against
# the sequential read and write bandwidth of the same disk, measured in the same run with transfers of the
# pass's size, and against the same update on state in host memory (bench/bench_nvme.c). Run it on an idle
# machine, with BENCH_NVME_DIR on the disk to measure (not tmpfs: that is memory).
#   BENCH_NVME_DIR (default build/nvme-bench), BENCH_PARAMS (default 124475904, GPT-2 124M),
#   BENCH_DTYPE (fp32|bf16, default bf16), OMP_NUM_THREADS (default: every core)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${BENCH_NVME_DIR:-build/nvme-bench}
N=${BENCH_PARAMS:-124475904}
DTYPE=${BENCH_DTYPE:-bf16}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
make -s build/bench_nvme
mkdir -p "$DIR"
echo "# $(date -u +%F) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $OMP_NUM_THREADS threads;" \
     "$DIR on $(df --output=source,fstype "$DIR" | tail -1 | tr -s ' ')"
build/bench_nvme "$DIR" "$N" "$DTYPE"
