#!/usr/bin/env bash
# The monitors beside log.jsonl (core/util/monitors.h): a run with -o writes a TensorBoard event file under
# tb/ and one CSV per scalar under csv/, read back by an independent reader (tests/tools/tfevents_read.js:
# TFRecord framing and CRC-32C checked there, Events decoded by npm's protobufjs) and found to hold exactly
# log.jsonl's numbers (float32 in the event file, the log's text in the CSVs; tests/tools/monitors_check.py):
# - one rank with -lb and fp16 (phase times, loss scale, validation loss);
# - a resume from a checkpoint behind the log's end: no step twice, and the resumed steps' loss, lr, norm
#   and validation loss equal the uninterrupted run's;
# - -ow 1 over that run: its monitors replaced with the log;
# - two ranks: rank 0 alone writes, each rank's memory tagged with its rank.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
if ! command -v node >/dev/null || [ ! -d .npm/node_modules/protobufjs ]; then
    t_missing monitors "Node.js with npm's protobufjs in .npm/"
    t_finish
fi
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 8 >/dev/null
base=(-e L2C32H2V512T32 -i "$TMP/data.bin" -j "$TMP/data.bin" -v 2 -m 2 -b 2 -t 32 -s 0 -l 1e-3)
monitors_match() {   # name, run dir
    local files=("$2"/tb/events.out.tfevents.*)
    if [ ${#files[@]} -ne 1 ] || [ ! -f "${files[0]}" ]; then t_fail "$1" "tb/ holds ${#files[@]} event files, not 1"; return; fi
    if ! node tests/tools/tfevents_read.js "${files[0]}" > "$2.events.json" 2> "$2.events.err"; then
        t_fail "$1" "$(tail -1 "$2.events.err")"
        return
    fi
    local why
    why=$($PYTHON tests/tools/monitors_check.py "$2" "$2.events.json" 2>&1)
    if [ "$why" = ok ]; then t_ok "$1"; else t_fail "$1" "$(tail -1 <<< "$why")"; fi
}

train 1 "$TMP/one" -x 6 -lb 2 -p fp16 -n 3 || t_fail one_rank "exited non-zero: $(grep -m1 error "$TMP/one.txt")"
monitors_match monitors_equal_log "$TMP/one"
t_check monitors_hold_phase_times_and_loss_scale "[ -s '$TMP/one/csv/breakdown_ms_forward.csv' ] && [ -s '$TMP/one/csv/loss_scale.csv' ] && [ -s '$TMP/one/csv/val_loss.csv' ]"

# An interrupted run: its log and monitors run past its newest checkpoint (step 3).
cp -r "$TMP/one" "$TMP/cut"
rm -rf "$TMP/cut/ckpt_000006"
train 1 "$TMP/cut" -x 6 -lb 2 -p fp16 -n 3 -y 1 || t_fail resume "exited non-zero: $(grep -m1 error "$TMP/cut.txt")"
monitors_match resumed_monitors_equal_log "$TMP/cut"
py_check resumed_steps_equal_uninterrupted "$TMP/one.events.json" "$TMP/cut.events.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["scalars"] for p in sys.argv[1:3])
pick = lambda s: [x for x in s if x[1] in ("loss", "lr", "grad_norm", "val_loss")]
print("ok" if pick(a) == pick(b) and len(pick(a)) == 6 * 3 + 4 else "differ: %s vs %s" % (pick(a)[-3:], pick(b)[-3:]))
PY

# -ow 1 starts the monitors afresh with the log: no event file or CSV row of the run it replaced.
cp -r "$TMP/one" "$TMP/over"
train 1 "$TMP/over" -x 2 -ow 1 || t_fail start_over "exited non-zero: $(grep -m1 error "$TMP/over.txt")"
monitors_match start_over_replaces_monitors "$TMP/over"

if mpi_available; then
    train 2 "$TMP/two" -x 2 -z 1 || t_fail two_ranks "exited non-zero: $(grep -m1 error "$TMP/two.txt")"
    monitors_match two_ranks_rank0_writes "$TMP/two"
    t_check two_ranks_memory_per_rank "[ -s '$TMP/two/csv/rank1_memory_params.csv' ]"
else
    t_missing two_ranks_rank0_writes "MPI"
fi
t_finish
