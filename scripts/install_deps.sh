#!/usr/bin/env bash
# Installs the Debian packages a fresh machine lacks, and nothing when they are all there.
#   install_deps.sh run    what `make run` needs (compiler, Python for the tokenizer, the KJV corpus)
#   install_deps.sh test   what `make test` needs besides (PyTorch for the reference model, OpenMPI)
set -euo pipefail
mode=${1:-run}
[ "$mode" = run ] || [ "$mode" = test ] || { echo "error: install_deps.sh takes run or test, not '$mode'" >&2; exit 2; }
want=(build-essential python3 python3-numpy python3-regex bible-kjv openmpi-bin libopenmpi-dev)
[ "$mode" = test ] && want+=(python3-torch python3-matplotlib afl++ clang iproute2)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
