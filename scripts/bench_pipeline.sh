#!/usr/bin/env bash
# The pipeline bubble each schedule (-ps) leaves, measured on the CPU build against its theory: for P = 2
# and 4 stages and m = 4, 8, 16 micro-batches, a short run with -lb 1 logs every stage's forward, backward
# and waiting time per step; the measured bubble is a stage's waiting time over its compute time (the
# Megatron definition: idle / useful), averaged over the stages and over the steps after the first two.
#
#   bash scripts/bench_pipeline.sh [out.md]       (needs an MPI build of train_gpt_cpu; a quiet machine)
#
# Each rank runs one OpenMP thread and MPI waits with sched_yield, so a waiting stage gives its core away.
# With more ranks than cores (P = 4 on a 2-core machine) stages that should compute at once share a core:
# their compute time stretches and the measured bubble understates the schedule's; the table says how many
# cores the run had.
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-/dev/stdout}
PYTHON=${PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
[ -x ./train_gpt_cpu ] && ldd ./train_gpt_cpu | grep -q libmpi || { echo "error: build an MPI train_gpt_cpu first (make train_gpt_cpu)" >&2; exit 1; }
W=$(mktemp -d /tmp/bench-pipeline.XXXXXX)
trap 'rm -rf "$W"' EXIT
$PYTHON scripts/make_shard.py -o "$W/data.bin" -n 400000 -V 512 --seed 3 > /dev/null
MODEL=L8C128H4V512T64
STEPS=8
run() {   # name, P, m, schedule flags...
    local name=$1 P=$2 m=$3; shift 3
    mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS -np "$P" ./train_gpt_cpu \
        -e $MODEL -i "$W/data.bin" -j "" -b 4 -t 64 -x $STEPS -v 0 -s 0 -lb 1 -pp "$P" -ga "$m" "$@" -o "$W/$name" \
        > "$W/$name.txt" 2>&1 || { echo "error: run $name failed: $(grep -m1 error "$W/$name.txt")" >&2; exit 1; }
}
for P in 2 4; do
    for m in 4 8 16; do
        run "1f1b_${P}_$m" $P $m -ps 1f1b
        run "interleaved_${P}_$m" $P $m -ps interleaved -vp 2
        run "zb_${P}_$m" $P $m -ps zb
    done
done
$PYTHON - "$W" "$(getconf _NPROCESSORS_ONLN)" "$MODEL" "$STEPS" > "$OUT" <<'PY'
import json, os, sys
w, cores, model, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
print("Measured with `bash scripts/bench_pipeline.sh` on %d cores: %s, b=4 t=64, %d steps (the first two dropped), "
      "one thread per rank.\n" % (cores, model, steps))
print("| P | m | schedule | theory | measured (mean over stages) | worst stage | step ms |")
print("|---|---|---|---|---|---|---|")
for P in (2, 4):
    for m in (4, 8, 16):
        for sched, label in (("1f1b", "1f1b"), ("interleaved", "interleaved -vp 2"), ("zb", "zb")):
            recs = [json.loads(l) for l in open(os.path.join(w, "%s_%d_%d" % (sched, P, m), "log.jsonl"))]
            pipe = [r["pipeline_ms"] for r in recs if "pipeline_ms" in r][2:]
            step_ms = [r["dt_ms"] for r in recs if "dt_ms" in r][2:]
            ratios = [[s["wait"] / (s["forward"] + s["backward"]) for s in p["stages"]] for p in pipe]
            per_stage = [sum(r[i] for r in ratios) / len(ratios) for i in range(P)]
            mean = sum(per_stage) / P
            print("| %d | %d | %s | %.1f%% | %.1f%% | %.1f%% | %.0f |" % (P, m, label, 100 * pipe[0]["bubble_theory"], 100 * mean,
                  100 * max(per_stage), sum(step_ms) / len(step_ms)))
PY
