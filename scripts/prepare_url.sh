#!/usr/bin/env bash
# Downloads a text file and tokenizes it into data/NAME/ (NAME_val_000000.bin, NAME_train_000001.bin,
# gpt2_tokenizer.bin). Extra arguments go to scripts/tokenize.py (default: --val-fraction 0.1).
# The download is kept (data/NAME/NAME.txt), so a rerun only re-tokenizes.
#   scripts/prepare_url.sh https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt tinyshakespeare
# For a local file or directory, call the tokenizer directly:
#   /usr/bin/python3 scripts/tokenize.py my_corpus/ -o data/mine --name mine --val-fraction 0.1
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then echo "usage: $0 URL NAME [tokenize.py options]" >&2; exit 2; fi
URL=$1; NAME=$2; shift 2
[ $# -gt 0 ] || set -- --val-fraction 0.1
OUT=data/$NAME
mkdir -p "$OUT"
if [ ! -s "$OUT/$NAME.txt" ]; then
    if command -v curl >/dev/null; then curl -fsSL "$URL" -o "$OUT/$NAME.txt.part" ||
        { echo "error: download of $URL failed" >&2; rm -f "$OUT/$NAME.txt.part"; exit 1; }
    elif command -v wget >/dev/null; then wget -q "$URL" -O "$OUT/$NAME.txt.part" ||
        { echo "error: download of $URL failed" >&2; rm -f "$OUT/$NAME.txt.part"; exit 1; }
    else echo "error: neither curl nor wget is installed" >&2; exit 1; fi
    mv "$OUT/$NAME.txt.part" "$OUT/$NAME.txt"
fi
exec "${PYTHON:-/usr/bin/python3}" scripts/tokenize.py "$OUT/$NAME.txt" -o "$OUT" --name "$NAME" "$@"
