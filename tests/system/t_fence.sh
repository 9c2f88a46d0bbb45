#!/usr/bin/env bash
# The host code as a GPU sees it, without a GPU: build/train_gpt_fenced is train_gpt_cpu with backend memory
# that host code cannot read or write (kernels/backend_cpu.c, -DBACKEND_FENCE) and that reports itself as a
# GPU, so the comm layer stages through the host. Every layout below must run there and give the CPU build's
# bits: the same loss, norm, learning rate and validation loss at every step, and the same checkpoint files.
# A host read of device memory that the CPU build lets pass (a missing be_download) crashes it instead.
# build/fence_check first shows that the fence holds: a host read crashes, a wrong-side copy is an error.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
out=$(build/fence_check 2>&1); rc=$?
echo "$out" | grep -E '^(ok|FAIL) '
[ $rc = 0 ] || t_fail fence_check "exited $rc"
mpi_available; have_mpi=$?

$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 4 >/dev/null
base=(-e L4C64H4V512T64 -i "$TMP/data.bin" -j "$TMP/data.bin" -b 2 -t 32 -v 2 -m 2 -l 1e-3 -u 2)

# The fenced runs also poison every collective's buffers in flight (GPT_COMM_POISON: the comm stream's
# asynchrony, as the fence models the copy streams').
run() {   # binary, ranks, out dir, flags...
    local bin=$1 np=$2 dir=$3 poison=0; shift 3
    [ "$bin" = build/train_gpt_fenced ] && poison=1
    if [ "$np" -gt 1 ]; then GPT_COMM_POISON=$poison "${MPIRUN[@]}" -x GPT_COMM_POISON -np "$np" "$bin" "${base[@]}" "$@" -o "$dir" > "$dir.txt" 2>&1
    else GPT_COMM_POISON=$poison "$bin" "${base[@]}" "$@" -o "$dir" > "$dir.txt" 2>&1; fi
}

# Every step record's loss, grad_norm, lr and val_loss equal; the same steps; the same checkpoint files.
same_run() {   # name, fenced dir, cpu dir
    py_check "$1" "$2/log.jsonl" "$3/log.jsonl" <<'PY'
import json, sys
keys = ("step", "loss", "grad_norm", "lr", "val_loss")
rec = lambda p: [tuple(r.get(k) for k in keys) for r in map(json.loads, open(p)) if "loss" in r or "val_loss" in r]
a, b = rec(sys.argv[1]), rec(sys.argv[2])
print("ok" if a == b and len(b) >= 4 else "records differ: %s vs %s" % (a[:3], b[:3]))
PY
    local f diff=""
    for f in "$3"/ckpt_*/*.bin; do cmp -s "$f" "$2/${f#"$3"/}" || diff+=" ${f#"$3"/}"; done
    [ -z "$diff" ] || t_fail "$1_checkpoint" "differ:$diff"
}

case_run() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    if [ "$np" -gt 1 ] && [ $have_mpi != 0 ]; then t_missing "fence_$name" MPI; return; fi
    run ./train_gpt_cpu "$np" "$TMP/$name.cpu" "$@"
    if ! run build/train_gpt_fenced "$np" "$TMP/$name.fenced" "$@"; then
        t_fail "fence_$name" "the fenced run failed: $(grep -m1 -iE 'error|signal|fault' "$TMP/$name.fenced.txt" | cut -c1-200)"
        return
    fi
    same_run "fence_$name" "$TMP/$name.fenced" "$TMP/$name.cpu"
}

case_run fp32_samples 1 -x 6 -s 3 -g 8 -n 3
case_run bf16_recompute 1 -x 4 -p bf16 -r 3
case_run fp16_scaled 1 -x 4 -p fp16 -r 1
case_run offload 1 -x 4 -p bf16 -offload 1
case_run z2 2 -x 4 -p bf16 -z 2 -ga 2
case_run z3_offload_params_dpu 2 -x 5 -p bf16 -z 3 -offload 2 -dpu 1 -n 5
case_run pp2_zero_bubble 2 -x 4 -ga 4 -pp 2 -ps zb -s 2 -g 8
case_run pp2_interleaved_z1 4 -x 4 -ga 4 -pp 2 -ps interleaved -z 1 -n 4
case_run tp2_sp_pp2_z3 4 -x 4 -ga 2 -tp 2 -sp 1 -pp 2 -z 3 -p bf16 -n 4 -lb 1
# -nvme: the state and the parameter pieces on disk, each piece read into host memory and uploaded from
# there for the gathers; the optimizer's staging beside the disk's pass; -dpu's pass on its thread.
# -offload-act: the blocks' inputs down to host memory and back up through the copy streams.
case_run offload_act_recompute 1 -x 4 -p bf16 -r 3 -offload-act 1
# -lora: each unit gathered as two sections (the frozen base's pieces, the adapters'), from host memory.
case_run lora_z3_offload2 2 -x 4 -p bf16 -z 3 -offload 2 -lora 4 -n 4
case_run z3_offload2_nvme 2 -x 4 -p bf16 -z 3 -offload 2 -nvme "$TMP/nvme" -nvme-chunk 2048 -n 4
case_run offload_nvme_dpu 1 -x 5 -p bf16 -offload 1 -dpu 1 -nvme "$TMP/nvme" -nvme-chunk 2048 -n 5
# A resume on the fenced build (loading goes through the same host transfers) continues like the CPU build's.
if [ $have_mpi = 0 ]; then
    for b in cpu fenced; do
        bin=./train_gpt_cpu; [ $b = fenced ] && bin=build/train_gpt_fenced
        run $bin 2 "$TMP/resume.$b" -x 3 -ga 2 -pp 2 -z 2 -p bf16 -n 3 && run $bin 2 "$TMP/resume.$b" -x 6 -ga 2 -pp 2 -z 2 -p bf16 -n 3 -y 1 ||
            t_fail fence_resume_$b "a run failed: $(grep -m1 -iE 'error|signal|fault' "$TMP/resume.$b.txt" | cut -c1-200)"
    done
    t_check fence_resume_resumed "grep -q 'resum' '$TMP/resume.fenced.txt'" "the second fenced run did not resume"
    same_run fence_resume_pp2_z2 "$TMP/resume.fenced" "$TMP/resume.cpu"
fi
t_finish
