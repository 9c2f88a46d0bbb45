#!/usr/bin/env bash
# scripts/plot.py: a PNG from synthetic logs (steps, evaluations, HellaSwag accuracies and the records it
# must skip), a HellaSwag panel exactly when a log has accuracies, and one-line errors for a missing log, a
# log without training steps and a garbled line.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
PLOT=scripts/plot.py

mkdir -p "$TMP/run1" "$TMP/run2"
"$PYTHON" - "$TMP" <<'PY'
import json, math, sys
tmp = sys.argv[1]
for run, scale in (("run1", 1.0), ("run2", 0.9)):
    with open("%s/%s/log.jsonl" % (tmp, run), "w") as f:
        f.write('{"step": 0, "layout": {"elements": 1000, "params": 900, "ranks": 1, "zero": 0}}\n')
        f.write('{"step": 0, "rank": 0, "memory": {"params": 4000, "grads": 4000}, "total": 8000}\n')
        for s in range(60):
            loss = scale * (4 + 6 * math.exp(-s / 15))
            f.write(json.dumps({"step": s, "loss": loss, "lr": 3e-4, "grad_norm": 1.0, "dt_ms": 50,
                                "tok_s": 20000 + 500 * math.sin(s)}) + "\n")
            f.write('{"step": %d, "comm_bytes": {"allreduce": 123}}\n' % s)
            if s % 20 == 0:
                f.write(json.dumps({"step": s, "val_loss": loss + 0.2}) + "\n")
                if run == "run1":
                    f.write(json.dumps({"step": s, "hellaswag_acc": 0.25 + s / 400, "hellaswag_correct": 10 + s // 10,
                                        "hellaswag_total": 40}) + "\n")
        f.write('{"step": 60, "loss": nan, "lr": 3e-4, "grad_norm": inf, "dt_ms": 50, "tok_s": 20000}\n')
PY
"$PYTHON" $PLOT "$TMP/run1/log.jsonl" "$TMP/run2/log.jsonl" -o "$TMP/loss.png" 2>"$TMP/err"
rc=$?
t_check plot_exit0 "[ $rc -eq 0 ]" "exit $rc: $(head -2 "$TMP/err")"
t_check plot_png "[ \"\$(head -c 8 '$TMP/loss.png' | od -An -c | tr -d ' ')\" = '211PNG\r\n032\n' ]" "not a PNG"
# A blank 1000x700 canvas compresses to a few KiB; curves, legend and tick labels make it much larger.
size=$(stat -c %s "$TMP/loss.png" 2>/dev/null || echo 0)
t_check plot_nontrivial "[ $size -gt 20000 ]" "PNG is only $size bytes"
# The PNG's height (IHDR): 900 pixels with the HellaSwag panel, 700 without.
png_height() { "$PYTHON" -c "import struct, sys; print(struct.unpack('>I', open(sys.argv[1], 'rb').read()[20:24])[0])" "$1"; }
"$PYTHON" $PLOT "$TMP/run2/log.jsonl" -o "$TMP/no_hs.png" 2>"$TMP/err"
t_check plot_hellaswag_panel "[ \"\$(png_height '$TMP/loss.png')\" = 900 ] && [ \"\$(png_height '$TMP/no_hs.png')\" = 700 ]" \
    "heights $(png_height "$TMP/loss.png") with accuracies, $(png_height "$TMP/no_hs.png") without: $(head -2 "$TMP/err")"

expect_error() {   # name, regex, args...
    local name=$1 re=$2; shift 2
    "$PYTHON" $PLOT -o "$TMP/bad.png" "$@" >/dev/null 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -Eq "^error: .*($re)" "$TMP/err"; then
        t_ok "$name"
    else
        t_fail "$name" "exit $rc, stderr: $(head -3 "$TMP/err" | tr '\n' '|')"
    fi
}
expect_error plot_missing_log "cannot read" "$TMP/none/log.jsonl"
mkdir -p "$TMP/empty"
printf '{"step": 0, "rank": 0, "memory": {"params": 1}}\n{"step": 0, "val_loss": 3.5}\n' >"$TMP/empty/log.jsonl"
expect_error plot_no_steps "no training steps" "$TMP/empty/log.jsonl"
mkdir -p "$TMP/garbled"
printf '{"step": 0, "loss": 1}\nnot json\n{"step": 1, "loss": 1}\n' >"$TMP/garbled/log.jsonl"
expect_error plot_garbled_line "garbled/log.jsonl:2" "$TMP/garbled/log.jsonl"
printf '{"step": 0, "loss": 1}\n{"step": 0, "hellaswag_acc": "high"}\n' >"$TMP/garbled/log.jsonl"
expect_error plot_non_numeric_accuracy "garbled/log.jsonl:2 has a non-numeric" "$TMP/garbled/log.jsonl"
# An output format matplotlib cannot write (this -o comes last, so it wins).
expect_error plot_unknown_format "cannot write .*bad.xyz: Format 'xyz' is not supported" "$TMP/run1/log.jsonl" -o "$TMP/bad.xyz"
t_finish
