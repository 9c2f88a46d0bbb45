#!/usr/bin/env bash
# The quick start: install what is missing, build train_gpt_cpu, prepare the King James Bible into
# data/kjv/ (once), then train a small GPT-2 on it on the CPU, logging and checkpointing to out/quickstart.
# Run it again and it continues from its last checkpoint (-y 1); a finished run has nothing left to do.
# Extra arguments go to the trainer after these and win: e.g. `-x 20 -o /tmp/qs` for a short run elsewhere
# (CI does that), `-ow 1` to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh run
make -s -j"$(nproc)" train_gpt_cpu
bash scripts/prepare_kjv.sh
exec ./train_gpt_cpu -e L4C128H4T256 -b 8 -t 128 -x 600 -l 2e-3 -u 50 -q 0.1 -c 0.1 -v 100 -m 20 -s 200 -g 96 \
    -n 200 -y 1 -o out/quickstart "$@"
