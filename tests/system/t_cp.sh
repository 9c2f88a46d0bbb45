#!/usr/bin/env bash
# -cp N -cpm ulysses: context parallelism (core/model/context_parallel.c). Against the one-rank run of the same
# global batch, from the same model file:
#   - losses and gradient norms within 1e-5 at every step (fp32; bf16 and fp16 within 2e-2), for GPT-2
#     (learned positions) and Llama with grouped kv heads (RoPE; at -cp 4 each kv head copied on two ranks), at
#     -cp 2 and 4, under -z 0..3, -r 0, 2 and 3, with two replicas, with -pp 2 (1f1b, zb and interleaved),
#     and inside -tp 2 and -tp 2 -sp 1 (each tensor rank's heads split further: at Llama's one kv head per
#     tensor rank each is copied on both context ranks, and with one kv head in the model on both tensor ranks
#     too); the validation loss too;
#   - a checkpoint written at -cp 2 resumes at -cp 1 and one written on one rank resumes at -cp 2, each ending
#     where the uninterrupted run does;
#   - the all-to-all bytes each rank logs per step equal the formula (four exchanges per block and
#     micro-batch, one or two more where -r recomputes attention) and --estimate's plan equals what the run
#     allocates;
#   - one-line errors for what does not divide and for what is not built yet.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip t_cp
source tests/system/cp_lib.sh
train_references
case_cp cp2_gpt2 2 "$GPT2" gpt2_ga1 1e-5 -cp 2 "${VAL[@]}"
val_losses_match cp2_gpt2_val_loss "$TMP/cp2_gpt2/log.jsonl" "$TMP/gpt2_ga1/log.jsonl"
case_cp cp4_gpt2_z1 4 "$GPT2" gpt2_ga1 1e-5 -cp 4 -z 1
case_cp cp2_gpt2_z2_r2 2 "$GPT2" gpt2_ga1 1e-5 -cp 2 -z 2 -r 2
case_cp cp4_gpt2_z3_r3 4 "$GPT2" gpt2_ga1 1e-5 -cp 4 -z 3 -r 3
case_cp cp2_dp2_gpt2_z2 4 "$GPT2" gpt2_ga2 1e-5 -cp 2 -z 2
case_cp cp2_pp2_gpt2 4 "$GPT2" gpt2_ga2 1e-5 -cp 2 -pp 2 -ga 2
case_cp cp2_pp2_zb_gpt2 4 "$GPT2" gpt2_ga2 1e-5 -cp 2 -pp 2 -ga 2 -ps zb
case_cp cp2_llama 2 "$LLAMA" llama_ga1 1e-5 -cp 2
case_cp cp2_gpt2_z1_offload1 2 "$GPT2" gpt2_ga1 1e-5 -cp 2 -z 1 -offload 1
case_cp cp2_llama_z3_offload2_act 2 "$LLAMA" llama_ga1 1e-5 -cp 2 -z 3 -offload 2 -r 3 -offload-act 1
case_cp cp2_gpt2_lora_z3_r3 2 "$GPT2" gpt2_lora 1e-5 -cp 2 -lora 4 -lora-alpha 8 -z 3 -r 3
case_cp cp4_llama_copies_z3_r3 4 "$LLAMA" llama_ga1 1e-5 -cp 4 -z 3 -r 3
case_cp cp2_llama_r2 2 "$LLAMA" llama_ga1 1e-5 -cp 2 -r 2 -z 1
case_cp cp2_llama_bf16 2 "$LLAMA" llama_bf16 2e-2 -cp 2 -p bf16
case_cp cp2_llama_fp16 2 "$LLAMA" llama_fp16 2e-2 -cp 2 -p fp16
case_cp cp2_tp2_gpt2 4 "$GPT2" gpt2_ga1 1e-5 -cp 2 -tp 2
case_cp cp2_tp2_sp_gpt2_z1 4 "$GPT2" gpt2_ga1 1e-5 -cp 2 -tp 2 -sp 1 -z 1
case_cp cp2_tp2_llama_r2 4 "$LLAMA" llama_ga1 1e-5 -cp 2 -tp 2 -r 2
case_cp cp2_tp2_sp_llama_z3 4 "$LLAMA" llama_ga1 1e-5 -cp 2 -tp 2 -sp 1 -z 3
case_cp cp2_tp2_sp_mqa 4 "$MQA" mqa_ga2 1e-5 -cp 2 -tp 2 -sp 1 -ga 2
case_cp cp2_pp2_interleaved_mqa 4 "$MQA" mqa_ga2 1e-5 -cp 2 -pp 2 -ps interleaved -vp 2 -ga 2
t_check cp_announced "grep -q '1 replica x 2 context ranks' '$TMP/cp2_gpt2.txt'"
t_check cp_logged "grep -q '\"cp\": 2' '$TMP/cp2_gpt2/log.jsonl'"
# ZeRO works over replicas x context ranks unchanged: each rank's memory and traffic as the table's.
for run in cp2_dp2_gpt2_z2 cp4_gpt2_z3_r3; do $PYTHON tests/tools/zero_check.py "$run" "$TMP/$run/log.jsonl" || FAILED=1; done

# The all-to-all bytes per step on every rank: per block and micro-batch, the exchanges of q|k|v and of the
# attention output forward and of their gradients backward, each sending (N-1)/N of its buffer (B T/N rows
# of N (heads/N + 2 kv heads per rank) D, or of heads D, fp32; under -tp a tensor rank's heads); -r 2 redoes
# the output's exchange, -r 3 both.
traffic() {   # name, N, blocks per rank, micro-batches, recompute, heads, kv heads (per tensor rank), head size
    py_check "traffic_$1" "$TMP/$1/log.jsonl" "${@:2}" <<'PY'
import json, sys
path, (N, L, m, r, NH, KV, D) = sys.argv[1], map(int, sys.argv[2:9])
B, T, x = 2, 32, 4
nh, kv = NH // N, (KV // N if KV >= N else 1)
qkv, out = B * T // N * N * (nh + 2 * kv) * D * x, B * T // N * N * nh * D * x
per_block = 2 * qkv + 2 * out + (out if r == 2 else qkv + out if r == 3 else 0)
want = L * m * per_block * (N - 1) // N
recs = [json.loads(l) for l in open(path)]
sent = {k: [v for rec in recs if k in rec for v in rec[k].get("alltoall", [None])] for k in ("comm_bytes", "cp_comm_bytes")}
bad = ["%s %s" % (k, v) for k, vs in sent.items() for v in vs if v != want]
n = len(sent["comm_bytes"])
print("ok" if n and n == len(sent["cp_comm_bytes"]) and not bad else "want %d bytes per rank and step, got %s" % (want, bad[:3]))
PY
}
traffic cp2_gpt2 2 2 1 0 4 4 16
traffic cp2_gpt2_z2_r2 2 2 1 2 4 4 16
traffic cp4_gpt2_z3_r3 4 2 1 3 4 4 16
traffic cp2_pp2_gpt2 2 1 2 0 4 4 16
traffic cp4_llama_copies_z3_r3 4 2 1 3 4 2 16
traffic cp2_tp2_gpt2 2 2 1 0 2 2 16
traffic cp2_tp2_llama_r2 2 2 1 2 2 1 16
traffic cp2_tp2_sp_mqa 2 4 2 0 2 1 16

# Checkpoints are one format: saved at -cp 2 after step 4, resumed on one rank; saved on one rank (the
# reference's own checkpoint), resumed at -cp 2 -z 3. Each ends where the uninterrupted run does.
train 2 "$TMP/saved" -e "$LLAMA" -cp 2 -n 4 || t_fail cp_checkpoint "run failed: $(grep -m1 error "$TMP/saved.txt")"
resume_as cp_resume_on_one_rank saved 1
resume_as cp_resume_at_cp2_z3 llama_ga1 2 -cp 2 -z 3

# --estimate: each rank's activations hold t/N positions, the kept exchanged q|k|v and attention outputs, the
# exchange's two buffers and the positions; the plan equals the allocation.
estimate_case estimate_cp2_r2 2 -e "$GPT2" -x 1 -cp 2 -r 2
estimate_case estimate_cp4_llama_z3 4 -e "$LLAMA" -x 1 -cp 4 -z 3
estimate_case estimate_cp2_tp2_sp_llama_r2 4 -e "$LLAMA" -x 1 -cp 2 -tp 2 -sp 1 -r 2

# One-line errors, from --estimate (no ranks launched) where the plan finds them.
bad cp_t_not_divisible "-t 30 does not split into -cp 4 equal parts" -e "$GPT2" -t 30 -cp 4 --estimate -w 4
bad cp_heads_not_divisible "-cp 8 does not divide the model's 4 attention heads" -e "$GPT2" -cp 8 --estimate -w 8
bad cp_kv_heads "-cp 2 and 3 kv heads: one must divide the other" -e "llama:L2,C96,H6,K3,D16,F96,V512,T64" -cp 2 --estimate -w 2
bad cp_world "-cp 2 does not divide the 3 ranks into context groups of 2" -e "$GPT2" -cp 2 --estimate -w 3
bad cp_tp_heads "-cp 4 does not divide the 2 attention heads per tensor rank (the model's 4 over -tp 2)" -e "$GPT2" -cp 4 -tp 2 \
    --estimate -w 8
bad cp_tp_kv_heads "-cp 2 and 3 kv heads per tensor rank (the model's 6 over -tp 2): one must divide the other" \
    -e "llama:L2,C96,H12,K6,D8,F96,V512,T64" -cp 2 -tp 2 --estimate -w 4
bad cp_with_lora_dropout "-cp 2 with -lora-dropout: not yet built" -e "$GPT2" -cp 2 -lora 4 -lora-dropout 0.1 --estimate -w 2
bad cp_with_dump "-cp 2 with -dump: not yet built" -e "$GPT2" -cp 2 -dump "$TMP/d" --estimate -w 2
# -gpu-mem's longest sequences: each cell is the planner's own boundary, the -t whose plan fits the budget with
# the next step's not (or the model's positions reached), and more context ranks train longer sequences.
./train_gpt_cpu --estimate -e L2C64H4V512T8192 -b 2 -t 64 -s 0 -w 2 -gpu-mem 0.1 > "$TMP/longest.txt" 2>&1
py_check cp_longest_sequence_is_the_plans_boundary "$TMP/longest.txt" <<'PY'
import json, subprocess, sys
lines = open(sys.argv[1]).read().splitlines()
at = next(i for i, l in enumerate(lines) if l.startswith("longest -t per rank"))
rows = {int(l.split()[0]): l.split()[1:] for l in lines[at + 2:at + 4]}
def device(cp, r, t, act):
    cmd = ["./train_gpt_cpu", "--estimate", "-e", "L2C64H4V512T8192", "-b", "2", "-t", str(t), "-s", "0", "-w", "2",
           "-cp", str(cp), "-r", str(r)] + (["-offload-act", "1"] if act else [])
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    plan = json.loads(next(l for l in out.splitlines() if l.startswith("plan: "))[6:])
    return sum(v for k, v in plan.items() if not k.startswith(("host_", "disk_")))
budget, bad = 0.1 * 2**30, []
for cp, cells in rows.items():
    for col, cell in enumerate(cells):
        r, act, t = min(col, 3), col == 4, int(cell)
        if device(cp, r, t, act) > budget: bad.append("-cp %d col %d: -t %d does not fit" % (cp, col, t))
        if t < 8192 and device(cp, r, t + 1024, act) <= budget: bad.append("-cp %d col %d: -t %d fits too" % (cp, col, t + 1024))
if sorted(rows) != [1, 2] or int(rows[2][0]) <= int(rows[1][0]): bad.append("rows %s" % rows)
print("ok" if not bad else "; ".join(bad[:3]))
PY
t_finish
