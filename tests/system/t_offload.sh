#!/usr/bin/env bash
# -offload 1 keeps each rank's fp32 master and Adam m, v in host memory and runs AdamW there (adamw_host, the
# CPU twin's own code); -offload 2 (-z 2, 3) also accumulates the reduced gradient pieces on the host
# (host_accumulate, the same fp32 additions) and with -z 3 keeps the parameter pieces there. On the CPU build
# neither may change anything but where the bytes are: the same losses and norms, and the same final
# model.bin and state files bit for bit, for every -z on 1, 2 and 4 ranks, with a pipeline (the tied
# embedding's sum), recompute, bf16 and fp16; checkpoints written with either resume without it and the other
# way round; the memory record and --estimate move exactly the bytes each level names to the host.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 5 >/dev/null || t_fail shard "make_shard failed"
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-3 -u 2 -c 0.1 -sh 1)
have_mpi=0
mpi_available && have_mpi=1

pair() {   # name, ranks, offload level, flags...: offload off vs on over 6 steps
    local name=$1 np=$2 level=$3; shift 3
    if [ "$np" -gt 1 ] && [ $have_mpi = 0 ]; then t_missing "$name" MPI; return; fi
    [ -d "$TMP/${name}_off" ] || train "$np" "$TMP/${name}_off" -x 6 "$@" ||
        { t_fail "$name" "offload 0 run failed: $(tail -1 "$TMP/${name}_off.txt")"; return; }
    train "$np" "$TMP/${name}_on" -x 6 -offload "$level" "$@" ||
        { t_fail "$name" "offload $level run failed: $(tail -1 "$TMP/${name}_on.txt")"; return; }
    same_run "$name" "$TMP/${name}_off" "$TMP/${name}_on" 6
}

for z in 0 1 2 3; do
    pair "offload_np1_z$z" 1 1 -z $z
    pair "offload_np2_z$z" 2 1 -z $z
done
pair offload_np4_z3 4 1 -z 3
pair offload_np2_pp2_z1 2 1 -pp 2 -z 1 -ga 2
pair offload_np2_z2_r3 2 1 -z 2 -r 3
pair offload_np2_z1_bf16 2 1 -z 1 -p bf16
pair offload_np2_z3_bf16 2 1 -z 3 -p bf16
pair offload_np1_z0_fp16 1 1 -p fp16
pair offload_np2_z2_fp16 2 1 -z 2 -p fp16
# -offload 2: gradient pieces on the host at -z 2, parameter pieces too at -z 3.
for z in 2 3; do
    pair "offload2_np1_z$z" 1 2 -z $z
    pair "offload2_np2_z$z" 2 2 -z $z
    pair "offload2_np4_z${z}_bf16" 4 2 -z $z -p bf16
done
pair offload2_np2_pp2_z3 2 2 -pp 2 -z 3 -ga 2
pair offload2_np4_pp2_z3_bf16 4 2 -pp 2 -z 3 -ga 2 -p bf16
pair offload2_np2_z3_r3 2 2 -z 3 -r 3
pair offload2_np2_z2_r2_bf16 2 2 -z 2 -r 2 -p bf16 -ga 2
pair offload2_np2_z3_fp16 2 2 -z 3 -p fp16
# The run must learn for the comparison to mean anything: its losses change from step to step.
t_check offload_losses_vary "[ \$(fields $TMP/offload_np1_z0_on/log.jsonl | cut -d, -f2 | sort -u | wc -l) -ge 6 ]"

# -lb: the walk's copies to and from the host (-offload 2) are reported within the forward and backward,
# every step; nothing of the kind without them.
train 1 "$TMP/lb2" -x 4 -z 3 -offload 2 -lb 1 && train 1 "$TMP/lb0" -x 4 -z 3 -lb 1 || t_fail offload2_breakdown "run failed"
t_check offload2_breakdown_shows_host_copies "[ \$(grep -c '\"offload_host_copies_ms\": [0-9.]*[1-9]' $TMP/lb2/log.jsonl) -eq 4 ] &&
    [ \$(grep -c offload_host_copies_ms $TMP/lb0/log.jsonl) -eq 0 ] && grep -q 'host copies .* ms, within them' $TMP/lb2.txt"

# Each rank's memory record: what zero_check.py's table says, host_state included.
zero_check() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    if [ "$np" -gt 1 ] && [ $have_mpi = 0 ]; then t_missing "$name" MPI; return; fi
    train "$np" "$TMP/$name" -x 1 "$@" || { t_fail "$name" "run failed"; return; }
    $PYTHON tests/tools/zero_check.py "$name" "$TMP/$name/log.jsonl" | grep -v _comm || FAILED=1
}
zero_check offload_np2_z1_bf16 2 -z 1 -p bf16 -offload 1
zero_check offload2_np2_z2_bf16 2 -z 2 -p bf16 -offload 2
zero_check offload2_np2_z3_fp32 2 -z 3 -offload 2
zero_check offload2_np1_z3_bf16 1 -z 3 -p bf16 -offload 2

# Cross-resume: a checkpoint at step 3 of a run without offload, resumed with it, ends as the straight run
# does (and the other way round).
cross() {   # name, offload of the first half, of the second; flags...
    local name=$1 first=$2 second=$3; shift 3
    train 1 "$TMP/${name}_straight" -x 6 "$@" || { t_fail "$name" "straight run failed"; return; }
    train 1 "$TMP/$name" -x 6 -n 3 -offload "$first" "$@" || { t_fail "$name" "first half failed"; return; }
    rm -rf "$TMP/$name/ckpt_000006"
    train 1 "$TMP/$name" -x 6 -y 1 -offload "$second" "$@" || { t_fail "$name" "resume failed: $(tail -1 "$TMP/$name.txt")"; return; }
    grep -q 'resumed from .*ckpt_000003 at step 3' "$TMP/$name.txt" || { t_fail "$name" "did not resume at step 3"; return; }
    same_run "$name" "$TMP/${name}_straight" "$TMP/$name" 6
}
cross offload_resume_off_to_on_bf16 0 1 -p bf16
cross offload_resume_on_to_off_bf16 1 0 -p bf16
cross offload_resume_on_to_off_fp32_z1 1 0 -z 1
cross offload_resume_2_to_0_bf16_z3 2 0 -z 3 -p bf16
cross offload_resume_0_to_2_bf16_z3 0 2 -z 3 -p bf16
cross offload_resume_2_to_1_fp32_z2 2 1 -z 2

# --estimate: -offload 1 moves the master and Adam bytes (those of the plan without it) into host_state, next
# to the two staging buffers (each min(state, 2^20) elements of a gradient, 4 bytes at most, and a working value);
# the backend's bytes drop by exactly the bytes moved.
estimate_moves() {   # name, ranks, bytes per value of -p, flags...
    local name=$1 np=$2 x=$3; shift 3
    ./train_gpt_cpu "${base[@]}" -x 1 "$@" --estimate -w "$np" > "$TMP/$name.off" 2>&1 || { t_fail "$name" "--estimate failed"; return; }
    ./train_gpt_cpu "${base[@]}" -x 1 "$@" -offload 1 --estimate -w "$np" > "$TMP/$name.on" 2>&1 || { t_fail "$name" "--estimate -offload 1 failed"; return; }
    py_check "$name" "$name" "$TMP/$name.off" "$TMP/$name.on" "$x" <<'PY'
import json, sys
name, x = sys.argv[1], int(sys.argv[4])
off, on = [json.loads(next(l for l in open(p) if l.startswith("plan: "))[6:]) for p in sys.argv[2:4]]
device = lambda m: sum(v for k, v in m.items() if k != "host_state")
moved = off["master"] + off["optimizer"]
state = off["optimizer"] // 8
bad = []
if off["host_state"] != 0: bad.append("host_state %d without -offload" % off["host_state"])
if on["master"] or on["optimizer"]: bad.append("device master %d, optimizer %d with -offload" % (on["master"], on["optimizer"]))
if device(off) - device(on) != moved: bad.append("device bytes dropped by %d, moved %d" % (device(off) - device(on), moved))
# fp32 master weights aliased the parameters on the device; on the host they are a buffer of their own.
master = moved - 8 * state if off["master"] else 4 * state
stage = 2 * min(state, 1 << 20) * (4 + x)
if on["host_state"] != 8 * state + master + stage: bad.append("host_state %d, expected %d" % (on["host_state"], 8 * state + master + stage))
print("ok" if not bad else "; ".join(bad))
PY
}
estimate_moves offload_estimate_np2_z1_bf16 2 2 -z 1 -p bf16
estimate_moves offload_estimate_np1_z0_fp32 1 4
estimate_moves offload_estimate_np4_z3_bf16 4 2 -z 3 -p bf16
estimate_moves offload_estimate_np4_pp2_z2_fp16 4 2 -pp 2 -z 2 -p fp16
./train_gpt_cpu "${base[@]}" -x 1 -z 1 -p bf16 -offload 1 --estimate -w 2 > "$TMP/est.txt" 2>&1
t_check offload_estimate_prints_host "grep -q '^  host total' '$TMP/est.txt' && grep -q '^host GiB per rank' '$TMP/est.txt'"

# The host's memory is checked before the state is allocated: one line, not the OOM killer. The host this
# test plays has 1 MB available (GPT_HOST_MEM_AVAILABLE); the model's state needs several.
GPT_HOST_MEM_AVAILABLE=1000000 ./train_gpt_cpu "${base[@]}" -x 1 -offload 1 > /dev/null 2> "$TMP/host.err"
rc=$?
t_check offload_host_memory_checked "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/host.err) -eq 1 ] && grep -q '^error: -offload 1: this rank.s host state needs .* GiB, but the host has' $TMP/host.err"
GPT_HOST_MEM_AVAILABLE=1000000 ./train_gpt_cpu "${base[@]}" -x 1 > /dev/null 2>&1
t_check offload_host_check_only_with_offload "[ $? -eq 0 ]"
GPT_HOST_MEM_AVAILABLE=100000000000 ./train_gpt_cpu "${base[@]}" -x 1 -offload 1 > /dev/null 2>&1
t_check offload_host_memory_enough_runs "[ $? -eq 0 ]"
# make bench-offload's script end to end (tiny shapes on the CPU build): six cases, each with its numbers,
# the -offload 2 cases with the copy wait, and the ladder shape --estimate picked for a 16 GiB GPU.
BENCH_REPORT="$TMP/bench_offload.md" bash scripts/bench_offload.sh --dry-run > "$TMP/bench_offload.txt" 2>&1
measured=$(grep -cE '^\| [^|]+ \| L4C[0-9]+H4V512 \(0\.00B\) \|[^|]*\| [0-9.]+ \| [0-9]+ \|' "$TMP/bench_offload.md")
copy_waits=$(grep -cE 'offload 2.*\| [0-9.]+ \|$' "$TMP/bench_offload.md")
picked=$(grep -cE 'with -z 3 -offload 2 [0-9.]+[MB], on the device alone [0-9.]+[MB]' "$TMP/bench_offload.md")
t_check bench_offload_dry_run "[ '$measured $copy_waits $picked' = '6 3 1' ]" \
    "rows with numbers, copy waits, estimate line: $measured $copy_waits $picked (want 6 3 1); $(tail -1 "$TMP/bench_offload.txt")"
t_finish
