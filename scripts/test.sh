#!/usr/bin/env bash
# The test command of the README: install what a fresh machine lacks, then `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh test
exec make -s test
