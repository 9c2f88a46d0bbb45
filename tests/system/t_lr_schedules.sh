#!/usr/bin/env bash
# -k's learning-rate schedules against tests/tools/lr_schedules.py, an implementation written from DeepSpeed's
# and Hugging Face's definitions: every step's logged lr (and under onecycle beta1) is the formula's value
# rounded to float32, for a few settings of each schedule; beta1's cycle reaches AdamW (the losses move);
# a resume in the middle of onecycle and of wsd's decay continues the schedule exactly; bad values are one
# line each. -lr-range: every step's lr is LRRangeTest's, the run stops at the first diverged step (4x the
# lowest loss before it, or not finite) and suggests a tenth of the lr at the lowest smoothed loss, both
# recomputed here from the logged losses; scripts/plot.py --lr-range plots it.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 8 >/dev/null
X=12
base=(-e L2C32H2V512T32 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x $X -s 0 -l 1e-3)
follows() {   # name, run dir, schedule flags...: the run's lr (and beta1) per step are the formulas'
    local name=$1 dir=$2; shift 2
    local why
    why=$($PYTHON tests/tools/lr_schedules.py "$dir/log.jsonl" $X -l 1e-3 "$@" 2>&1)
    if [ "$why" = ok ]; then t_ok "$name"; else t_fail "$name" "$(tail -1 <<< "$why")"; fi
}
settings=("wsd_linear|-k wsd -u 2 -q 0.1 -wsd-decay 0.4" "wsd_1_sqrt|-k wsd -wsd-shape 1-sqrt -q 0 -u 1"
          "wsd_one_step|-k wsd -wsd-decay 0.01 -q 0.5"
          "warmup_log|-k warmup -u 5" "warmup_linear|-k warmup -u 4 -warmup-type linear -warmup-min-lr 1e-4"
          "warmup_decay_log|-k warmup-decay -u 3" "warmup_decay_linear|-k warmup-decay -u 6 -warmup-type linear"
          "onecycle_decay|-k onecycle -cycle-first 3 -cycle-second 4 -cycle-min-lr 1e-4 -decay-step 2 -decay-lr-rate 0.5 -decay-mom-rate 0.01"
          "onecycle_no_momentum|-k onecycle -cycle-first 4 -cycle-mom 0 -cycle-min-lr 2e-4"
          "onecycle_flat_after_cycle|-k onecycle -cycle-first 2 -cycle-second 3 -cycle-min-mom 0.85 -cycle-max-mom 0.95"
          "cosine_restarts|-k cosine-restarts -u 2 -cycles 3"
          "polynomial_square|-k polynomial -u 2 -power 2 -lr-end 1e-5" "polynomial_linear|-k polynomial -lr-end 0"
          "cosine|-k cosine -u 2 -q 0.1")
for s in "${settings[@]}"; do
    name=${s%%|*} flags=${s#*|}
    train 1 "$TMP/$name" $flags -n 6 || t_fail "$name" "exited non-zero: $(grep -m1 error "$TMP/$name.txt")"
    follows "lr_formula_$name" "$TMP/$name" $flags
done
# beta1's cycle reaches the optimizer: the same lr with beta1 fixed trains otherwise from step 1 on.
train 1 "$TMP/fixed" -k onecycle -cycle-first 3 -cycle-second 4 -cycle-min-lr 1e-4 -decay-step 2 -decay-lr-rate 0.5 -cycle-mom 0 ||
    t_fail fixed "exited non-zero"
py_check onecycle_beta1_reaches_adamw "$TMP/onecycle_decay/log.jsonl" "$TMP/fixed/log.jsonl" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
same_lr = all(x["lr"] == y["lr"] for x, y in zip(a, b))
print("ok" if same_lr and a[0]["loss"] == b[0]["loss"] and a[2]["loss"] != b[2]["loss"] else
      "losses %s vs %s (same lr: %s)" % (a[2]["loss"], b[2]["loss"], same_lr))
PY

# A resume from step 6 (the runs above checkpointed there) continues the schedule: the cut run's log, from
# step 6 on written by the resumed run, still follows the formulas and equals the uninterrupted run's.
for s in "${settings[7]}" "${settings[1]}"; do
    name=${s%%|*} flags=${s#*|}
    cp -r "$TMP/$name" "$TMP/cut_$name"
    rm -rf "$TMP/cut_$name/ckpt_0000$X"
    train 1 "$TMP/cut_$name" $flags -n 6 -y 1 || t_fail "resume_$name" "exited non-zero: $(grep -m1 error "$TMP/cut_$name.txt")"
    follows "resume_continues_$name" "$TMP/cut_$name" $flags
    t_check "resume_equals_uninterrupted_$name" "diff <(fields '$TMP/$name/log.jsonl') <(fields '$TMP/cut_$name/log.jsonl') >/dev/null"
done
# A resume that would give the steps taken another rate (or beta1) is refused under -y 1.
cp -r "$TMP/onecycle_decay" "$TMP/changed"
train 1 "$TMP/changed" -k onecycle -cycle-first 3 -cycle-second 4 -cycle-min-lr 1e-4 -decay-step 2 -decay-lr-rate 0.5 -cycle-min-mom 0.7 -x 14 -y 1
t_check resume_refuses_changed_momentum_cycle "grep -q 'error: .*-cycle-min-mom' '$TMP/changed.txt'" "$(tail -1 "$TMP/changed.txt")"

# -lr-range: a gentle range (all STEPS steps) and a steep one (stops when the loss diverges).
range_run() {   # name, MIN,MAX,STEPS
    local out=$TMP/$1
    timeout 120 ./train_gpt_cpu -e L2C32H2V512T32 -i "$TMP/data.bin" -j "" -b 2 -t 32 -s 0 -lr-range "$2" -o "$out" > "$out.txt" 2>&1 ||
        t_fail "$1" "exited non-zero: $(grep -m1 error "$out.txt")"
    py_check "$1_follows_the_rules" "$out" "$2" <<'PY'
import json, math, os, sys
import numpy as np
out, spec = sys.argv[1:3]
lo, hi, steps = float(np.float32(spec.split(",")[0])), float(np.float32(spec.split(",")[1])), int(spec.split(",")[2])
recs = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
step_recs = [r for r in recs if "lr" in r]
result = [r["lr_range"] for r in recs if "lr_range" in r]
# DeepSpeed's LRRangeTest: min_lr * (1 + step_rate * s / step_size), step size 1.
rate = (hi / lo - 1) / (steps - 1)
bad_lr = [r["step"] for r in step_recs if np.float32(r["lr"]) != np.float32(lo * (1 + rate * r["step"]))]
losses = [math.nan if r["loss"] is None else r["loss"] for r in step_recs]
stop = next((s for s in range(len(losses)) if not math.isfinite(losses[s]) or (s and losses[s] > 4 * min(losses[:s]))), None)
want_steps = list(range(steps if stop is None else stop + 1))
kept = losses[:stop] if stop is not None else losses
avg, smooth = 0.0, []
for s, x in enumerate(kept):
    avg = 0.9 * avg + 0.1 * x
    smooth.append(avg / (1 - 0.9 ** (s + 1)))
low = min(range(len(smooth)), key=smooth.__getitem__)
want = step_recs[low]["lr"] / 10
if bad_lr: print("lr differs from LRRangeTest at steps %s" % bad_lr)
elif [r["step"] for r in step_recs] != want_steps: print("steps %s, the rule stops after %s" % ([r["step"] for r in step_recs], stop))
elif len(result) != 1 or result[0]["diverged"] != (stop is not None): print("lr_range record %s (stop %s)" % (result, stop))
elif abs(result[0]["suggested_lr"] - want) > 1e-6 * want: print("suggested %g, the rule %g" % (result[0]["suggested_lr"], want))
elif any(n.startswith("ckpt_") for n in os.listdir(out)): print("a range test wrote a checkpoint")
else: print("ok")
PY
}
range_run range_gentle 1e-4,1e-2,8
range_run range_diverges 1e-3,10,20
t_check range_diverges_stops_early "grep -q '\"diverged\": 1' '$TMP/range_diverges/log.jsonl' && ! grep -q '\"step\": 19, \"loss' '$TMP/range_diverges/log.jsonl'"
t_check range_prints_suggestion "grep -q '^suggested peak lr: ' '$TMP/range_gentle.txt'"
if $PYTHON -c "import matplotlib" 2>/dev/null; then
    $PYTHON scripts/plot.py "$TMP/range_diverges/log.jsonl" --lr-range -o "$TMP/range.png" > "$TMP/plot.txt" 2>&1
    t_check range_plotted "[ -s '$TMP/range.png' ]" "$(tail -1 "$TMP/plot.txt")"
else
    t_missing range_plotted "matplotlib"
fi

expect_error() {   # name, regex the error must match, args...
    local name=$1 pattern=$2; shift 2
    timeout 60 ./train_gpt_cpu "${ebase[@]}" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
    local lines; lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: .*$pattern" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err")"; fi
}
ebase=("${base[@]}")
expect_error unknown_schedule "-k expects cosine\|linear.*polynomial, got 'step'" -k step
expect_error wsd_decay_zero "-wsd-decay = 0 is outside \(0, 1\]" -k wsd -wsd-decay 0
expect_error wsd_shape_unknown "-wsd-shape expects linear\|1-sqrt, got 'cosine'" -k wsd -wsd-shape cosine
expect_error option_of_another_schedule "-wsd-decay 0.5 shapes another schedule than -k cosine" -wsd-decay 0.5
expect_error warmup_type_unknown "-warmup-type expects log\|linear, got 'exp'" -k warmup -warmup-type exp
expect_error polynomial_end_above_peak "-lr-end 0.01 must be below -l 0.001" -k polynomial -lr-end 1e-2
expect_error onecycle_min_above_peak "-cycle-min-lr 0.01 must not exceed -l 0.001" -k onecycle -cycle-min-lr 1e-2
expect_error onecycle_momenta_crossed "-cycle-min-mom 0.95 must not exceed -cycle-max-mom 0.9" -k onecycle -cycle-min-mom 0.95
expect_error onecycle_beta1_reaches_one "-decay-mom-rate 1 raises beta1 to 1.* at step 3" -k onecycle -cycle-first 1 -decay-step 1 -decay-mom-rate 1
expect_error cycles_zero "-cycles = 0 is outside 1\.\." -k cosine-restarts -cycles 0
expect_error power_zero "-power = 0 is outside \(0, 1000\]" -k polynomial -power 0
ebase=(-e L2C32H2V512T32 -i "$TMP/data.bin" -j "" -b 2 -t 32 -s 0)   # -lr-range sets -x and the rates
expect_error range_min_not_below_max "-lr-range 1e-2,1e-3,10: MIN 0.01 must be below MAX 0.001" -lr-range 1e-2,1e-3,10
expect_error range_equal_bounds "MIN 0.001 must be below MAX 0.001" -lr-range 1e-3,1e-3,10
expect_error range_malformed "-lr-range 1e-3:1: expected MIN,MAX,STEPS" -lr-range 1e-3:1
expect_error range_one_step "-lr-range 1e-4,1e-3,1: STEPS must be 2\.\." -lr-range 1e-4,1e-3,1
expect_error range_with_schedule "-lr-range 1e-4,1e-3,5 sets the learning rate and the steps itself: drop -k" -lr-range 1e-4,1e-3,5 -k linear
expect_error range_with_steps "drop -x" -lr-range 1e-4,1e-3,5 -x 3
expect_error range_with_checkpoints "writes no checkpoint: drop -n" -lr-range 1e-4,1e-3,5 -n 2 -o "$TMP/range_n"
t_finish
