#!/usr/bin/env bash
# What a person watching a run sees: one progress line per step with the fields a run is judged by, a time
# breakdown every -lb steps whose phases add up to the step's time, and a plot of a real run's log.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 6 >/dev/null
./train_gpt_cpu -e L2C64H4V512T64 -i "$TMP/data.bin" -j "$TMP/data.bin" -v 3 -m 2 -b 2 -t 32 -x 6 -s 0 -lb 3 -o "$TMP/run" > "$TMP/out.txt" 2>&1
t_check progress_line_per_step "[ \$(grep -cE '^step +[0-9]+/6 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| norm [0-9.]+ \| [0-9.]+ ms \| [0-9]+ tok/s \| mem [0-9]+ MiB \| eta [0-9]+s$' $TMP/out.txt) -eq 6 ]"
$PYTHON - "$TMP/run/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = {r["step"]: r for r in recs if "loss" in r}
bds = [r for r in recs if "breakdown_ms" in r]
bad = []
if [r["step"] for r in bds] != [2, 5]:
    bad.append("breakdowns at steps %s, expected [2, 5]" % [r["step"] for r in bds])
for r in bds:
    total, dt = sum(r["breakdown_ms"].values()), steps[r["step"]]["dt_ms"]
    if not 0.9 * dt - 0.5 <= total <= dt * 1.01 + 0.5:   # measured: 0.999..1.0 of the step
        bad.append("step %d: phases add to %.2f ms, the step took %.2f ms" % (r["step"], total, dt))
print("ok breakdown_every_lb_steps" if not bad else "FAIL breakdown_every_lb_steps: " + "; ".join(bad))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
$PYTHON scripts/plot.py "$TMP/run/log.jsonl" -o "$TMP/loss.png" > /dev/null 2>&1
t_check plot_real_run "[ \$(stat -c %s $TMP/loss.png 2>/dev/null || echo 0) -gt 10000 ]"
t_finish
