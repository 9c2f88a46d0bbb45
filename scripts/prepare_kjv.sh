#!/usr/bin/env bash
# The quick start's offline corpus: the King James Bible (public domain) from Debian's bible-kjv package,
# one document per book (66), tokenized into data/kjv/: kjv_val_000000.bin (first 5% of tokens, i.e. most
# of Genesis), kjv_train_000001.bin and gpt2_tokenizer.bin. Silent when they already exist; installs
# nothing (CI and the README say which packages to install).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=data/kjv
PYTHON=${PYTHON:-/usr/bin/python3}

# The train shard is renamed into place last, so its presence means the previous run finished.
if [ -f "$OUT/kjv_train_000001.bin" ] && [ -f "$OUT/kjv_val_000000.bin" ] && [ -f "$OUT/gpt2_tokenizer.bin" ] \
    && [ -f "$OUT/gpt2_merges.bin" ]; then
    exit 0
fi
if ! command -v bible >/dev/null; then
    echo "error: the 'bible' command is missing; install Debian's bible-kjv package (apt-get install bible-kjv)" >&2
    exit 1
fi
echo "preparing $OUT from the King James Bible (bible-kjv) ..." >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# -l0: verses unwrapped, so the text does not depend on $COLUMNS. Gen 1:1 to Rev 22:21 is the whole book.
bible -l0 gen1:1-rev22:21 > "$tmp/kjv.txt"
[ -s "$tmp/kjv.txt" ] || { echo "error: bible printed nothing" >&2; exit 1; }

# A heading "<Book> 1" opens a book. Blank lines are held back so no book ends with the separator.
mkdir "$tmp/books"
awk -v dir="$tmp/books" '
    /^[^ ].* 1$/ { n++; file = sprintf("%s/%02d.txt", dir, n); blank = 0 }
    /^$/         { blank++; next }
    file         { while (blank > 0) { print "" > file; blank-- }; print > file }
' "$tmp/kjv.txt"
[ "$(ls "$tmp/books" | wc -l)" -eq 66 ] || { echo "error: expected 66 books from bible" >&2; exit 1; }

"$PYTHON" scripts/tokenize.py "$tmp/books" -o "$OUT" --name kjv --val-fraction 0.05
