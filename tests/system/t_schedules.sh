#!/usr/bin/env bash
# Pipeline schedules on the CPU build (-ps; the lists themselves are proven in test_schedule.c):
# - zb, each backward split into B (input gradient) and a deferred W (weight gradient), gives the bits of
#   1f1b on the same layout, under every -z and -r, with replicas, -tp/-sp, bf16, fp16 and -offload 2, and
#   matches the single-rank run within 1e-5 (losses, norms, final model); on one rank too;
# - interleaved (-vp 2 and 4 virtual stages per rank) matches the single-rank run within 1e-5 under every
#   -z and -r, with replicas and -tp/-sp (not bitwise: its stages hold other blocks, so the tied embedding's
#   and the norm's sums run in another order);
# - with GPT_COMM_POISON (a collective's buffers read NaN until its wait) zb's ZeRO-2/3 reductions, now
#   started by W, and interleaving's, still give the same bits;
# - a checkpoint written under one schedule resumes under another, bit for bit where the layouts agree;
# - the log names the schedule and its bubble; -lb logs each stage's idle time;
# - --estimate plans zb's activation sets and stash exactly as the stages allocate them;
# - bad input: an unknown -ps, -vp without interleaving, interleaving with -ga not a multiple of -pp.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip schedules
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 40000 -V 512 --seed 8 >/dev/null
init_model L4C64H4V512T64 "$TMP/data.bin"
flags=(-e "$MODEL" -i "$TMP/data.bin" -j "$TMP/data.bin" -v 3 -m 2 -b 2 -t 32 -x 6 -l 2e-3 -u 2 -q 0.1 -c 0.1 -gc 1.0 -s 0 -sh 1)
run() {   # dir, ranks, extra flags... (a schedule that deadlocked would hang: the timeout makes it a failure)
    local dir=$1 np=$2; shift 2
    timeout 300 "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${flags[@]}" -o "$TMP/$dir" "$@" > "$TMP/$dir.txt" 2>&1 ||
        t_fail "$dir" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
# Every loss, validation loss and gradient norm of a log, as printed (the bits).
numbers() { grep -o '"\(loss\|val_loss\|grad_norm\)": [^,}]*' "$1"; }
same_bits() {   # name, dir a, dir b: final model and every logged number identical
    if cmp -s "$TMP/$2/ckpt_000006/model.bin" "$TMP/$3/ckpt_000006/model.bin" && [ -n "$(numbers "$TMP/$2/log.jsonl")" ] &&
        diff <(numbers "$TMP/$2/log.jsonl") <(numbers "$TMP/$3/log.jsonl") > /dev/null; then
        t_ok "$1"
    else
        t_fail "$1" "$2 and $3 differ (model.bin or the logged losses/norms)"
    fi
}

run ref 1 -ga 8
# np, then the layout's flags; each runs under 1f1b and zb, with a checkpoint at step 3 (-n 3, which changes
# no bit) that the resume checks below start from.
layouts=("1 -ga 8 -r 3" "2 -pp 2 -ga 8 -z 0" "4 -pp 4 -ga 8 -z 3 -r 1" "4 -pp 2 -ga 4 -z 2 -r 2"
         "4 -pp 2 -tp 2 -sp 1 -ga 8 -z 2 -r 2" "4 -pp 2 -ga 4 -z 3 -offload 2")   # -z 1: the bf16 and fp16 pairs below
for layout in "${layouts[@]}"; do
    set -- $layout
    np=$1; shift
    name=np${np}$(echo "$*" | tr -d ' ')
    run "f_$name" "$np" "$@" -n 3
    run "zb_$name" "$np" "$@" -n 3 -ps zb
    same_bits "zb_bits_equal_1f1b_$name" "zb_$name" "f_$name"
    compare_py log "zb_vs_single_$name" "$TMP/zb_$name/log.jsonl" "$TMP/ref/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    # (-tp's row-parallel sums make 1f1b itself differ from one rank by up to 3.4e-5 in a few weights after
    # 6 Adam steps on these flags; zb's bits are 1f1b's, checked above.)
    case $name in *tp*) continue ;; esac
    compare_py models "zb_final_params_$name" "$TMP/zb_$name/ckpt_000006/model.bin" "$TMP/ref/ckpt_000006/model.bin" --tol 1e-5 --abs 1e-5 --kbias-bound "$(lr_sum 2e-3 2 6 0.1)"
done
for p in bf16 fp16; do
    run "f_$p" 2 -pp 2 -ga 4 -z 1 -p "$p"
    run "zb_$p" 2 -pp 2 -ga 4 -z 1 -p "$p" -ps zb
    same_bits "zb_bits_equal_1f1b_$p" "zb_$p" "f_$p"
done

# ZeRO-2/3 with W starting the reductions: a buffer used before its collective's wait reads NaN.
# Against the 1f1b runs above: -z 2 -r 2, and -z 3 (-offload 2 keeps the bits of -offload 0).
poisoned() {   # name, flags...
    local name=$1; shift
    timeout 300 "${MPIRUN[@]}" -x GPT_COMM_POISON=1 -np 4 ./train_gpt_cpu "${flags[@]}" "$@" -o "$TMP/$name" \
        > "$TMP/$name.txt" 2>&1 || t_fail "$name" "exited non-zero: $(grep -m1 error "$TMP/$name.txt")"
}
poisoned poison2 -pp 2 -ga 4 -z 2 -r 2 -ps zb
same_bits zb_z2_poisoned_bits_equal poison2 "f_np4-pp2-ga4-z2-r2"
poisoned poison3 -pp 2 -ga 4 -z 3 -ps zb
same_bits zb_z3_poisoned_bits_equal poison3 "f_np4-pp2-ga4-z3-offload2"

# Interleaved against the single-rank run (the 4-layer model has room for 2 x 2 virtual stages; an
# 8-layer one for 4 x 2 and 2 x 4).
check_single() {   # name, run dir, reference dir[, reference dir for the final model]
    compare_py log "$1_vs_single" "$TMP/$2/log.jsonl" "$TMP/$3/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    compare_py models "$1_final_params" "$TMP/$2/ckpt_000006/model.bin" "$TMP/${4:-$3}/ckpt_000006/model.bin" --tol 1e-5 --abs 1e-5 --kbias-bound "$(lr_sum 2e-3 2 6 0.1)"
    # The validation forward goes through every chunk of every stage in virtual-stage order.
    val_losses_match "$1_val_losses" "$TMP/$2/log.jsonl" "$TMP/$3/log.jsonl"
}
flags8=("${flags[@]}")
flags8[1]=L8C64H4V512T64   # -e: a random 8-layer model, initialized alike on every layout
run8() { local saved=("${flags[@]}"); flags=("${flags8[@]}"); run "$@"; flags=("${saved[@]}"); }
interleaved_case() {   # runner (run or run8), name prefix, reference dir, ranks, flags... (-n 3 as above)
    local runner=$1 prefix=$2 ref=$3 np=$4; shift 4
    local name=${prefix}_np${np}$(echo "$*" | tr -d ' ')
    $runner "$name" "$np" "$@" -n 3 -ps interleaved
    check_single "$name" "$name" "$ref"
}
interleaved_case run il ref 2 -pp 2 -vp 2 -ga 8 -z 0
interleaved_case run il ref 4 -pp 2 -vp 2 -ga 4 -z 3 -r 1
interleaved_case run il ref 4 -pp 2 -vp 2 -ga 4 -z 2 -r 3
run8 ref8 1 -ga 8
interleaved_case run8 il8 ref8 4 -pp 4 -vp 2 -ga 8 -z 3
interleaved_case run8 il8 ref8 2 -pp 2 -vp 4 -ga 8 -z 2 -r 1
# Sampling runs the forward through every chunk too: the text equals one rank's. (-z 1 -r 2: the same run's
# memory records are the allocations --estimate is checked against below.)
run il_sample 2 -pp 2 -vp 2 -ga 8 -x 2 -v 0 -s 2 -g 8 -z 1 -r 2 -ps interleaved
run sample_ref 1 -ga 8 -x 2 -v 0 -s 2 -g 8
t_check interleaved_sample_equals_single "grep -q 'sample:' '$TMP/sample_ref.txt' && [ \"\$(grep 'sample:' '$TMP/il_sample.txt')\" = \"\$(grep 'sample:' '$TMP/sample_ref.txt')\" ]"
# With -tp the final model against 1f1b's on the same tensor layout (see above).
run il_tp 4 -pp 2 -vp 2 -tp 2 -sp 1 -ga 8 -z 2 -r 2 -ps interleaved
check_single il_tp2_sp1 il_tp ref "f_np4-pp2-tp2-sp1-ga8-z2-r2"
t_check interleaved_split_printed "grep -q 'pipeline: interleaved over 4 stages x 2 virtual stages each (blocks per virtual stage: 1, 1, 1, 1, 1, 1, 1, 1)' '$TMP/il8_np4-pp4-vp2-ga8-z3.txt'"
poisoned il_poison -pp 2 -vp 2 -ga 4 -z 3 -r 1 -ps interleaved
same_bits interleaved_z3_poisoned_bits_equal il_poison "il_np4-pp2-vp2-ga4-z3-r1"

# Resume across schedules: checkpoint at step 3 under one (a copy of a run above, less its step-6
# checkpoint), finish under the other.
from_step3() {   # new dir, run dir above
    cp -r "$TMP/$2" "$TMP/$1" && rm -rf "$TMP/$1/ckpt_000006"
    [ -d "$TMP/$1/ckpt_000003" ] || t_fail "$1" "$2 wrote no checkpoint at step 3"
}
from_step3 zb_to_f "zb_np4-pp2-ga4-z2-r2"
run zb_to_f 4 -pp 2 -ga 4 -z 2 -r 2 -y 1
t_check resume_zb_to_1f1b_announced "grep -q 'resumed from .*ckpt_000003 at step 3' '$TMP/zb_to_f.txt'"
same_bits resume_zb_to_1f1b_bits zb_to_f "f_np4-pp2-ga4-z2-r2"
from_step3 il_to_zb "il_np4-pp2-vp2-ga4-z3-r1"
run il_to_zb 2 -pp 2 -ga 8 -z 2 -y 1 -ps zb
compare_py log resume_interleaved_to_zb "$TMP/il_to_zb/log.jsonl" "$TMP/ref/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
from_step3 il_again "il_np4-pp2-vp2-ga4-z3-r1"
run il_again 4 -pp 2 -vp 2 -ga 4 -z 3 -r 1 -ps interleaved -y 1
same_bits resume_interleaved_bits il_again "il_np4-pp2-vp2-ga4-z3-r1"

# The log: the schedule, its bubble (P-1)/(3m), and each stage's idle time on -lb steps. (-z 2 -r 1: the
# same run's memory records are the allocations --estimate is checked against below.)
run breakdown 4 -pp 4 -ga 8 -x 2 -lb 1 -v 0 -z 2 -r 1 -ps zb
$PYTHON - "$TMP/breakdown/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
plan = [r["pipeline"] for r in recs if "pipeline" in r]
stages = [r["pipeline_ms"] for r in recs if "pipeline_ms" in r]
ok = (len(plan) == 1 and plan[0]["schedule"] == "zb" and abs(plan[0]["bubble_theory"] - 3 / 24) < 1e-9 and len(stages) == 2 and
      all(s["schedule"] == "zb" and len(s["stages"]) == 4 and all(x["backward"] > 0 and x["wait"] >= 0 for x in s["stages"])
          for s in stages))
print("ok zb_breakdown_logged" if ok else "FAIL zb_breakdown_logged: %s %s" % (plan, stages))
PY
[ $? -eq 0 ] || FAILED=1
t_check zb_bubble_printed "grep -q 'pipeline: zb over 4 stages .* bubble (P-1)/(3m) = 12.5%' '$TMP/breakdown.txt' &&
    grep -q 'leave more: ./build/test_schedule print zb 4 8' '$TMP/breakdown.txt'"

# --estimate -ps zb: each stage's plan equals what its ranks allocate, and zb plans more activation bytes
# than 1f1b (the sets live until W, and the stash).
base=(-e L4C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -ga 8 -x 1 -v 0 -s 0 -pp 4 -z 2 -r 1)
./train_gpt_cpu "${base[@]}" --estimate -w 4 -ps zb > "$TMP/plan_zb.txt" 2>&1
./train_gpt_cpu "${base[@]}" --estimate -w 4 > "$TMP/plan_f.txt" 2>&1
$PYTHON - "$TMP/plan_zb.txt" "$TMP/plan_f.txt" "$TMP/breakdown/log.jsonl" <<'PY'
import json, sys
stage_plans = lambda p: json.loads(next(l for l in open(p) if l.startswith("plan_stages: "))[13:])
zb, f = stage_plans(sys.argv[1]), stage_plans(sys.argv[2])
mem = [json.loads(l) for l in open(sys.argv[3]) if '"memory"' in l]
bad = ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], v)
       for r in mem for k, v in zb[r["rank"]].items() if r["memory"][k] != v]
if len(mem) != 4 or len(zb) != 4:
    bad.append("%d memory records, %d stage plans" % (len(mem), len(zb)))
bad += ["stage %d: zb plans %d activation bytes, 1f1b %d" % (s, zb[s]["activations"], f[s]["activations"])
        for s in range(4) if zb[s]["activations"] <= f[s]["activations"]]
print("ok estimate_zb_per_stage" if not bad else "FAIL estimate_zb_per_stage: " + "; ".join(bad[:3]))
PY
[ $? -eq 0 ] || FAILED=1
t_check estimate_lists_schedules "grep -q '^  -ps 1f1b .* sets per stage 4 3 2 1$' '$TMP/plan_zb.txt' && grep -q '^  -ps zb .* bubble 12.5%; sets per stage 5 5 5 5, W stash per stage 1 2 3 4$' '$TMP/plan_zb.txt'"
# -ps interleaved -vp 2 on 2 stages: its per-chunk sets, planned as allocated (by il_sample above).
il_base=(-e L4C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -ga 8 -x 1 -v 0 -s 0 -pp 2 -z 1 -r 2 -ps interleaved)
./train_gpt_cpu "${il_base[@]}" --estimate -w 2 > "$TMP/plan_il.txt" 2>&1
$PYTHON - "$TMP/plan_il.txt" "$TMP/il_sample/log.jsonl" <<'PY'
import json, sys
plans = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("plan_stages: "))[13:])
mem = [json.loads(l) for l in open(sys.argv[2]) if '"memory"' in l]
bad = ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], v)
       for r in mem for k, v in plans[r["rank"]].items() if r["memory"][k] != v]
if len(mem) != 2 or len(plans) != 2:
    bad.append("%d memory records, %d stage plans" % (len(mem), len(plans)))
print("ok estimate_interleaved_per_stage" if not bad else "FAIL estimate_interleaved_per_stage: " + "; ".join(bad[:3]))
PY
[ $? -eq 0 ] || FAILED=1
t_check estimate_interleaved_sets "grep -q '^  -ps interleaved -vp 2 .* bubble 6.2%; sets per stage 4+2 3+1$' '$TMP/plan_il.txt'"

# Bad input: one line each, non-zero exit.
one=(-e L4C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0)
bad_input() {   # name, expected message, np, flags... (one rank: no mpirun, whose exit after a failure takes seconds)
    local name=$1 want=$2 np=$3; shift 3
    if [ "$np" -gt 1 ]; then "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${one[@]}" "$@" > "$TMP/$name.txt" 2>&1
    else ./train_gpt_cpu "${one[@]}" "$@" > "$TMP/$name.txt" 2>&1; fi
    local rc=$?
    t_check "$name" "[ $rc -ne 0 ] && grep -q -- '$want' '$TMP/$name.txt'" "rc $rc: $(grep -m1 error "$TMP/$name.txt")"
}
bad_input error_unknown_schedule "error: -ps 2f2b: the schedule must be 1f1b, interleaved or zb" 1 -ps 2f2b
bad_input error_vp_without_interleaving "error: -vp 2: virtual stages need -ps interleaved" 2 -pp 2 -ga 4 -ps zb -vp 2
bad_input error_interleaved_ga "error: -ps interleaved needs -ga divisible by -pp (micro-batches 3, stages 2)" 2 -pp 2 -ga 3 -ps interleaved
bad_input error_interleaved_no_pipeline "error: -ps interleaved needs a pipeline" 1 -ga 4 -ps interleaved
t_finish
