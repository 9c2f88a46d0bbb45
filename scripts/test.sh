#!/usr/bin/env bash
# The test command of the README: install what a fresh machine lacks, then `make test`. The programs are
# built first on every core (the tests themselves run one at a time: their timings and rank counts assume it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh test
make -s -j"$(nproc)" tests-bin
exec make -s test
