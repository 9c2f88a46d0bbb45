#!/usr/bin/env bash
# Runs a fixed set of short trainings with two builds of the CPU trainer and compares, for each, the logged
# losses and gradient norms (every field but the timings) and every checkpoint file byte for byte: a
# refactoring that must not change a bit (a model family's seam, a moved kernel call) is checked with it.
#
#   tests/tools/same_bits.sh OLD_TRAIN_GPT_CPU NEW_TRAIN_GPT_CPU
#
# GPT-2 runs, then Llama-family runs (untied with q/k norms and q/k/v biases, tied, untied under -z 3).
#
# Prints "ok same_bits_NAME" or "FAIL same_bits_NAME: why" per run; exit 1 on any difference.
# SAME_BITS_RESULTS_ONLY=1 compares what the runs compute (losses, learning rates, gradient norms, every
# checkpoint byte) but not what they allocate and send (the memory records, peak_mem, comm_bytes): for a
# change meant to move or allocate differently with the same bits (its report says which runs' records change).
set -u
old=$(readlink -f "$1") new=$(readlink -f "$2")   # the runs start in a scratch directory
root=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d /tmp/same-bits.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
MPIRUN=(mpirun --oversubscribe --bind-to none)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
$PYTHON "$root/scripts/make_shard.py" -o "$tmp/data.bin" -n 40000 -V 512 --seed 5 >/dev/null
base=(-e L2C64H4V512T64 -i "$tmp/data.bin" -j "" -b 2 -t 32 -x 6 -l 2e-3 -u 2 -q 0.1 -c 0.1 -gc 1.0 -v 0 -s 0 -sh 1 -n 3)
runs=(
    "fp32|1|-ga 2"
    "bf16_r1|1|-p bf16 -r 1 -ga 2"
    "fp16_r2|1|-p fp16 -r 2 -ga 2"
    "r3|1|-r 3 -ga 2"
    "z3_np2|2|-z 3 -ga 1"
    "z2_offload_np2|2|-z 2 -offload 1 -ga 1"
    "dpu_np2|2|-z 1 -offload 1 -dpu 1 -ga 2"
    "pp2_zb|2|-pp 2 -ps zb -ga 4"
    "pp2_vp2|2|-pp 2 -ps interleaved -vp 2 -ga 4 -e L4C64H4V512T64"
    "tp2_sp|2|-tp 2 -sp 1 -ga 2"
    "pp2_tp2_z3|4|-pp 2 -tp 2 -z 3 -ga 2"
    "llama_untied_bf16|1|-p bf16 -r 2 -ga 2 -e llama:L2,C64,H4,K2,D32,F96,V512,T64,qknorm,qkvbias"
    "llama_tied_z3_np2|2|-z 3 -ga 1 -e llama:L2,C64,H4,K1,F96,V512,T64,tied"
    "llama_untied_z2_offload_np2|2|-z 2 -offload 1 -ga 1 -e llama:L2,C64,H4,K2,F96,V512,T64"
    "llama_untied_z3_np2|2|-z 3 -ga 2 -e llama:L2,C64,H4,K2,F96,V512,T64"
    "llama_tp2_sp_np2|2|-tp 2 -sp 1 -ga 2 -e llama:L2,C64,H4,K2,F96,V512,T64"
    "llama_pp2_1f1b_np2|2|-pp 2 -ga 4 -e llama:L2,C64,H4,K2,F96,V512,T64,qknorm"
)
# SAME_BITS_ONLY=regex runs only the runs whose name matches.
only=${SAME_BITS_ONLY:-.}
failed=0
# Timings vary; memory categories a later build added (host_activations, hpz_params) are dropped where they are
# zero, and so are the records of bytes per link class (link_bytes), which a later build added.
strip_times() {
    if [ "${SAME_BITS_RESULTS_ONLY:-0}" = 1 ]; then grep -v -e '"memory": ' -e 'comm_bytes": ' "$1" | sed -E 's/, "peak_mem": [0-9]+//'; else cat "$1"; fi |
        grep -v 'link_bytes": ' |
        sed -E 's/"(dt_ms|tok_s|mfu|elapsed_s|wall_s|time_s|[a-z_]*_ms)": [0-9.eE+-]+,? ?//g; s/"host_activations": 0, //; s/"hpz_params": 0, //'
}
for r in "${runs[@]}"; do
    IFS='|' read -r name np extra <<< "$r"
    [[ $name =~ $only ]] || continue
    for which in old new; do
        bin=$old; [ "$which" = new ] && bin=$new
        # shellcheck disable=SC2086
        (cd "$tmp" && "${MPIRUN[@]}" -np "$np" "$bin" "${base[@]}" $extra -o "$tmp/$which-$name" > "$tmp/$which-$name.txt" 2>&1) ||
            { echo "FAIL same_bits_$name: $which build exited non-zero: $(grep -m1 -i error "$tmp/$which-$name.txt")"; failed=1; continue 2; }
    done
    why=""
    steps=$(grep -c '"grad_norm"' "$tmp/new-$name/log.jsonl")
    [ "$steps" -ge 6 ] || why="only $steps steps logged;"
    [ -n "$(find "$tmp/new-$name" -path '*/ckpt_*' -name model.bin)" ] || why="$why no checkpoint written;"
    diff <(strip_times "$tmp/old-$name/log.jsonl") <(strip_times "$tmp/new-$name/log.jsonl") > "$tmp/diff" || why="log differs: $(head -c 300 "$tmp/diff")"
    for f in $(cd "$tmp/old-$name" && find . -path './ckpt_*' -type f | sort); do
        cmp -s "$tmp/old-$name/$f" "$tmp/new-$name/$f" || why="$why $f differs"
    done
    if [ -z "$why" ]; then echo "ok same_bits_$name"; else echo "FAIL same_bits_$name: $why"; failed=1; fi
done
exit $failed
