#!/usr/bin/env bash
# --autotune on 2 and 4 CPU ranks, launched as one process that runs each trial under mpirun itself: it lists
# only layouts whose --estimate plan fits -gpu-mem (context ranks inside tensor groups among them), the fastest
# command it prints runs as printed, its time is the table's best, a trial that fails is reported and skipped,
# and bad input is one line each. Timings on shared cores are noise: only their consistency is checked, never
# a speed.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip autotune
# The trials' plain `mpirun -np N` takes its options from the environment.
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 2 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -t 32 -v 0 -s 0)
tune=(--autotune -gpu-mem 0.0025 -autotune-trials 3 -autotune-steps 3 -x 3)

# Each listed layout's bytes are its --estimate plan's (the heaviest stage's device bytes), within -gpu-mem,
# and the budget left some out: the timed layouts, and four others spread over the list.
check_plans() {   # name, ranks, json
    local name=$1 np=$2 json=$3 i=0 flags
    $PYTHON -c "
import json, sys
ls = json.load(open(sys.argv[1]))['layouts']
step = max(1, len(ls) // 4)
for i, l in enumerate(ls):
    if l['ms'] is not None or l['error'] is not None or i % step == 0: print(l['flags'])" "$json" > "$TMP/$name.sample"
    while read -r flags; do
        ./train_gpt_cpu "${base[@]}" -x 1 $flags -w "$np" --estimate > "$TMP/$name.plan$i" 2>&1
        i=$((i + 1))
    done < "$TMP/$name.sample"
    local bad
    bad=$($PYTHON - "$json" "$TMP/$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
listed = {l['flags']: l['device_bytes'] for l in j['layouts']}
bad = [l['flags'] for l in j['layouts'] if l['device_bytes'] > j['gpu_mem_gib'] * 2**30]
if not j['too_large'] or len(listed) != j['fit']:
    bad.append('%d fit, %d over the budget' % (j['fit'], j['too_large']))
for i, flags in enumerate(open(sys.argv[2] + '.sample').read().split('\n')[:-1]):
    lines = open('%s.plan%d' % (sys.argv[2], i)).read().splitlines()
    stages = [l for l in lines if l.startswith('plan_stages: ')]
    plans = json.loads(stages[0][13:]) if stages else [json.loads(next(l for l in lines if l.startswith('plan: '))[6:])]
    planned = max(sum(v for k, v in p.items() if not k.startswith(('host_', 'disk_'))) for p in plans)
    if planned != listed[flags]:
        bad.append('%s: planned %d, listed %d' % (flags, planned, listed[flags]))
print('; '.join(bad))
PY
)
    t_check "${name}_lists_only_fitting_plans" "[ -z '$bad' ] && [ \$(grep -c . '$TMP/$name.sample') -ge 5 ]" "$bad"
}

# The printed command is the fastest timed layout's, and it runs as printed.
check_best() {   # name, ranks, output file, json
    local name=$1 np=$2 out=$3 json=$4 best
    best=$($PYTHON -c "
import json, sys
j = json.load(open(sys.argv[1]))
timed = [l for l in j['layouts'] if l['ms'] is not None]
fastest = min(timed, key=lambda l: l['ms'])
ok = j['best']['flags'] == fastest['flags'] and j['layouts'][0] is fastest and ('-np %s ' % sys.argv[2] in j['best']['command']) == (int(sys.argv[2]) > 1)
print('ok' if ok and len(timed) >= 2 else 'best %s, fastest %s of %d timed' % (j['best']['flags'], fastest['flags'], len(timed)))" "$json" "$np")
    t_check "${name}_chosen_is_fastest" "[ '$best' = ok ]" "$best"
    local command
    command=$(sed -n 's/^fastest: //p' "$out")
    t_check "${name}_prints_the_json_command" "[ -n \"\$command\" ] && grep -qF -- \"\$command\" '$json'" "printed: $command"
    (eval "$command") > "$TMP/$name.best.txt" 2>&1
    local flags
    flags=$($PYTHON -c "import json, sys; print(json.load(open(sys.argv[1]))['best']['flags'])" "$json")
    t_check "${name}_command_runs_as_printed" \
        "grep -q 'trained 3 steps' '$TMP/$name.best.txt' && grep -q '\"step\": 2, \"loss\"' '$(dirname "$json")/log.jsonl'" \
        "$command: $(tail -1 "$TMP/$name.best.txt")"
}

# 2 ranks: -b 2 on each as the global batch (4 sequences).
./train_gpt_cpu "${base[@]}" -b 2 "${tune[@]}" -w 2 -o "$TMP/np2" > "$TMP/np2.txt" 2>&1
t_check autotune_np2_runs "[ \$? = 0 ] && grep -q '^autotune: trial 3/3' '$TMP/np2.txt' && [ -f '$TMP/np2/autotune.json' ]" "$(tail -2 "$TMP/np2.txt")"
check_plans autotune_np2 2 "$TMP/np2/autotune.json"
check_best autotune_np2 2 "$TMP/np2.txt" "$TMP/np2/autotune.json"

# 4 ranks, -d 256: 8 sequences. The second trial's run directory is taken by a file, so its run fails: it is
# reported with the trainer's error and skipped, and the others still decide.
mkdir -p "$TMP/np4/autotune" && touch "$TMP/np4/autotune/trial2"
./train_gpt_cpu "${base[@]}" -d 256 "${tune[@]}" -w 4 -o "$TMP/np4" > "$TMP/np4.txt" 2>&1
t_check autotune_np4_runs "[ \$? = 0 ] && [ -f '$TMP/np4/autotune.json' ]" "$(tail -2 "$TMP/np4.txt")"
t_check autotune_failed_trial_reported_and_skipped \
    "grep -q '^autotune: trial 2/3: .* failed: error: .*trial2 exists and is not a directory' '$TMP/np4.txt' &&
     $PYTHON -c \"import json, sys; j = json.load(open(sys.argv[1])); f = [l for l in j['layouts'] if l['error']];
sys.exit(not (len(f) == 1 and 'not a directory' in f[0]['error'] and j['best']['flags'] != f[0]['flags']))\" '$TMP/np4/autotune.json'" \
    "$(grep 'trial 2/3' "$TMP/np4.txt")"
check_plans autotune_np4 4 "$TMP/np4/autotune.json"
check_best autotune_np4 4 "$TMP/np4.txt" "$TMP/np4/autotune.json"
# Context ranks inside a tensor group are layouts the trainer runs: planned and listed, not refused.
py_check autotune_np4_lists_cp_with_tp "$TMP/np4/autotune.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
both = [l["flags"] for l in j["layouts"] if "-tp 2" in l["flags"] and "-cp 2" in l["flags"]]
print("ok" if both else "no layout with -tp 2 -cp 2 among %d listed, %d refused" % (len(j["layouts"]), j["refused"]))
PY

# A budget nothing fits: one line naming the smallest plan, which is that layout's --estimate plan.
big=(-e L2C512H4V512T64 -i "$TMP/data.bin" -j "" -t 32 -v 0 -s 0)
./train_gpt_cpu "${big[@]}" -b 2 --autotune -w 2 -gpu-mem 0.001 > "$TMP/small.txt" 2>&1
rc=$?
smallest=$(sed -n 's/.*the smallest plan is \([0-9.]*\) GiB of device memory .* per rank, \(.*\)$/\1\t\2/p' "$TMP/small.txt")
gib=${smallest%%$'\t'*}
flags=${smallest#*$'\t'}
plan=$(./train_gpt_cpu "${big[@]}" -x 1 $flags -w 2 --estimate 2>&1 | sed -n 's/^  \(device \)\{0,1\}total *\([0-9.]*\) GiB$/\2/p' | head -1)
t_check autotune_nothing_fits_names_smallest_plan \
    "[ $rc = 1 ] && [ \$(grep -c . '$TMP/small.txt') = 1 ] && grep -q '^error: --autotune: none of the' '$TMP/small.txt' &&
     $PYTHON -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(not (abs(a - b) < 1e-3 and a > 0.001))' '$gib' '$plan'" \
    "rc $rc, smallest '$gib' ($flags), its plan '$plan': $(tail -1 "$TMP/small.txt")"

# Bad input: one line each, before anything runs.
bad_input() {   # name, expected message (grep pattern), flags...
    local name=$1 want=$2
    shift 2
    "$@" > "$TMP/$name.txt" 2>&1
    local rc=$?
    t_check "$name" "[ $rc = 1 ] && [ \$(grep -c . '$TMP/$name.txt') = 1 ] && grep -q -- '$want' '$TMP/$name.txt'" \
        "rc $rc: $(head -2 "$TMP/$name.txt")"
}
bad_input autotune_needs_gpu_mem "error: --autotune .* needs -gpu-mem" ./train_gpt_cpu "${base[@]}" --autotune -w 2
bad_input autotune_refuses_z "error: --autotune searches -z" ./train_gpt_cpu "${base[@]}" --autotune -w 2 -gpu-mem 1 -z 1
bad_input autotune_refuses_pp "error: --autotune searches -pp" ./train_gpt_cpu "${base[@]}" --autotune -w 2 -gpu-mem 1 -pp 2
bad_input autotune_world_splits_nothing "error: --autotune -w 3: no layout of 3 ranks splits a global batch of 8 sequences" \
    ./train_gpt_cpu "${base[@]}" -d 256 --autotune -w 3 -gpu-mem 1
bad_input autotune_not_with_estimate "error: --estimate prints one layout.s plan, --autotune searches" \
    ./train_gpt_cpu "${base[@]}" --autotune --estimate -gpu-mem 1
bad_input autotune_trials_need_autotune "error: -autotune-trials and -autotune-steps need --autotune" \
    ./train_gpt_cpu "${base[@]}" -autotune-trials 2
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" --autotune -w 2 -gpu-mem 1 > "$TMP/mpirun.txt" 2>&1
rc=$?
t_check autotune_not_under_mpirun "[ $rc != 0 ] && [ \$(grep -c '^error' '$TMP/mpirun.txt') = 1 ] &&
    grep -q '^error: --autotune runs in one process' '$TMP/mpirun.txt'" "rc $rc: $(grep error "$TMP/mpirun.txt")"
t_finish
