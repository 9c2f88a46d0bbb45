#!/usr/bin/env bash
# The quick start: install what is missing, build train_gpt_cpu, prepare the King James Bible into
# data/kjv/ (once), then train a small GPT-2 on it on the CPU, logging and checkpointing to out/quickstart.
# Extra arguments are passed to the trainer (e.g. -x 50 for a shorter run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh run
make -s train_gpt_cpu
bash scripts/prepare_kjv.sh
exec ./train_gpt_cpu -e L4C128H4T256 -b 8 -t 128 -x 600 -l 2e-3 -u 50 -q 0.1 -c 0.1 -v 100 -m 20 -s 200 -g 96 \
    -n 200 -o out/quickstart "$@"
