#!/usr/bin/env bash
# Regenerates the tokenizer test expectations from independent implementations (needs Node + npm, the
# `bible` command from bible-kjv, and optionally python3-regex for a third opinion):
#   tests/data/tokenizer_expected.json  ids of varied hard texts from npm's tiktoken (gpt-3-encoder checked)
#   tests/data/kjv_ids.sha256           sha256 of tiktoken's ids (uint16 LE) for `bible -l0 gen1:1-rev22:21`
# The tests themselves need neither Node nor the network.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d node_modules/tiktoken ] && [ -d node_modules/gpt-3-encoder ] ||
    npm install --no-save --no-package-lock --prefix . tiktoken gpt-3-encoder >/dev/null
node tests/tools/gen_tokenizer_expected.js
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -l0 gen1:1-rev22:21 > "$tmp/kjv.txt"
node scripts/tiktoken_encode.js "$tmp/kjv.txt" "$tmp/kjv.u16"
sha256sum < "$tmp/kjv.u16" | cut -d' ' -f1 > tests/data/kjv_ids.sha256
echo "kjv ids sha256 $(cat tests/data/kjv_ids.sha256)" >&2
if /usr/bin/python3 -c 'import regex' 2>/dev/null; then
    /usr/bin/python3 tests/tools/gpt2_ref_encoder.py tests/data/tokenizer_expected.json >&2
else
    echo "python3-regex not installed: skipped the third opinion" >&2
fi
