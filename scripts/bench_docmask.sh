#!/usr/bin/env bash
# Document masking's cost on the CPU build: the same token stream trained with block-diagonal causal attention
# (a document dataset read as stream windows, -pack 0, every token but a document's first trained) and with
# full causal attention (the same shards without their mask files), side by side, alternating, REPEAT times.
# Documents are 96-160 tokens, about four to a row of -t 512. Run it on an idle machine.
#   BENCH_MODEL (default L4C256H4V512T512), BENCH_STEPS (default 6), REPEAT (default 3), OMP_NUM_THREADS (default: every core)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${BENCH_MODEL:-L4C256H4V512T512} STEPS=${BENCH_STEPS:-6} REPEAT=${REPEAT:-3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
make -s train_gpt_cpu
D=$(mktemp -d /tmp/bench-docmask.XXXXXX)
trap 'rm -rf "$D"' EXIT
mkdir -p "$D/docs" "$D/plain"
/usr/bin/python3 - "$D/docs/d_train_000001" <<'PY'
import sys
import numpy as np
rng = np.random.default_rng(1)
lengths = rng.integers(96, 161, size=400)
tokens = np.concatenate([np.concatenate([[1], rng.integers(10, 512, size=n - 1)]) for n in lengths]).astype(np.uint16)
mask = np.concatenate([np.concatenate([[2], np.ones(n - 1)]) for n in lengths]).astype(np.uint8)
for ext, magic, body in ((".bin", 20240520, tokens), (".mask", 20261129, mask)):
    head = np.zeros(256, dtype=np.int32)
    head[:3] = magic, 1, len(tokens)
    with open(sys.argv[1] + ext, "wb") as f:
        f.write(head.tobytes() + body.tobytes())
PY
cp "$D/docs/d_train_000001.bin" "$D/plain/"
echo "# $(date -u +%F) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $OMP_NUM_THREADS threads; -e $MODEL -b 4 -t 512, $STEPS steps"
median_ms() {   # log.jsonl: the median step time past step 0
    /usr/bin/python3 -c "import json, statistics, sys
print('%.1f' % statistics.median(r['dt_ms'] for r in map(json.loads, open(sys.argv[1])) if 'dt_ms' in r and r['step'] > 0))" "$1"
}
for r in $(seq "$REPEAT"); do
    for kind in docs plain; do
        extra=()
        [ $kind = docs ] && extra=(-pack 0)
        ./train_gpt_cpu -e "$MODEL" -i "$D/$kind/d_train_*.bin" -j "" -v 0 -s 0 -b 4 -t 512 -x "$STEPS" "${extra[@]}" \
            -o "$D/run_$kind" > "$D/out_$kind.txt" 2>&1 || { tail -3 "$D/out_$kind.txt"; exit 1; }
        echo "$kind ($([ $kind = docs ] && echo "document masking" || echo "full causal")): $(median_ms "$D/run_$kind/log.jsonl") ms/step (round $r)"
        rm -rf "$D/run_$kind"
    done
done
