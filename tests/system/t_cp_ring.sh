#!/usr/bin/env bash
# -cp N -cpm ring: ring attention with Megatron's causal load balance (core/model/context_ring.c). Against the
# one-rank run of the same global batch, from the same model file:
#   - losses and gradient norms within 1e-5 at every step (fp32; bf16 and fp16 within 2e-2), for GPT-2 (learned
#     positions) and Llama with grouped kv heads (RoPE; 2 kv heads, also on 4 ranks), at -cp 2 and 4, under
#     -z 1, 2 and 3, -r 2 and 3, -pp 2 (1f1b and zb), inside -tp 2 and -tp 2 -sp 1 (a tensor rank's heads round
#     the ring; one kv head in the model, copied on both tensor ranks), and LoRA's adapters under -offload 2;
#     the validation loss too. A rank holding the wrong chunks, a d(k|v) left one hop short of home or a merge
#     with a stale lse each moves them past 1e-5;
#   - the fenced build (host code as on a GPU) gives the CPU build's bits;
#   - each hop overlaps the attention (started before it, waited for after): in poison mode, where a receive
#     reads as NaN until its wait, the ring's runs are the plain runs' bits;
#   - a checkpoint written by the ring resumes under Ulysses at -cp 2 and on one rank, and one rank's resumes
#     under the ring at -cp 4 -z 3, each ending where the uninterrupted run does;
#   - the bytes each rank sends round the ring per step equal the formula, --estimate's plan equals what the run
#     allocates;
#   - one-line errors for a -t that does not cut into 2N chunks and for -cpm ring without -cp.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip t_cp_ring
source tests/system/cp_lib.sh
train_references
RING=(-cpm ring)
case_cp ring2_gpt2 2 "$GPT2" gpt2_ga1 1e-5 -cp 2 "${RING[@]}" "${VAL[@]}"
val_losses_match ring2_gpt2_val_loss "$TMP/ring2_gpt2/log.jsonl" "$TMP/gpt2_ga1/log.jsonl"
case_cp ring4_gpt2_z1 4 "$GPT2" gpt2_ga1 1e-5 -cp 4 "${RING[@]}" -z 1
case_cp ring2_gpt2_z2_r2 2 "$GPT2" gpt2_ga1 1e-5 -cp 2 "${RING[@]}" -z 2 -r 2
case_cp ring2_pp2_gpt2 4 "$GPT2" gpt2_ga2 1e-5 -cp 2 "${RING[@]}" -pp 2 -ga 2
case_cp ring2_pp2_zb_gpt2 4 "$GPT2" gpt2_ga2 1e-5 -cp 2 "${RING[@]}" -pp 2 -ga 2 -ps zb
case_cp ring2_llama 2 "$LLAMA" llama_ga1 1e-5 -cp 2 "${RING[@]}" -n 4
case_cp ring4_llama_z3_r3 4 "$LLAMA" llama_ga1 1e-5 -cp 4 "${RING[@]}" -z 3 -r 3
case_cp ring2_llama_bf16 2 "$LLAMA" llama_bf16 2e-2 -cp 2 "${RING[@]}" -p bf16
case_cp ring2_llama_fp16 2 "$LLAMA" llama_fp16 2e-2 -cp 2 "${RING[@]}" -p fp16
case_cp ring2_gpt2_lora_offload2 2 "$GPT2" gpt2_lora 1e-5 -cp 2 "${RING[@]}" -lora 4 -lora-alpha 8 -z 2 -offload 2
case_cp ring2_tp2_gpt2_z2 4 "$GPT2" gpt2_ga1 1e-5 -cp 2 "${RING[@]}" -tp 2 -z 2
case_cp ring2_tp2_llama_r3 4 "$LLAMA" llama_ga1 1e-5 -cp 2 "${RING[@]}" -tp 2 -r 3
case_cp ring2_tp2_sp_llama 4 "$LLAMA" llama_ga1 1e-5 -cp 2 "${RING[@]}" -tp 2 -sp 1
case_cp ring2_tp2_sp_mqa 4 "$MQA" mqa_ga2 1e-5 -cp 2 "${RING[@]}" -tp 2 -sp 1 -ga 2
# The host code as a GPU runs it (t_fence.sh): device memory the host cannot touch, the ring's messages staged
# through the host, in poison mode (below); the CPU build's bits.
GPT_COMM_POISON=1 "${MPIRUN[@]}" -x GPT_COMM_POISON -np 2 build/train_gpt_fenced "${base[@]}" -e "$LLAMA" -cp 2 "${RING[@]}" -n 4 -o "$TMP/ring2_fenced" > "$TMP/ring2_fenced.txt" 2>&1
fenced=$(fields "$TMP/ring2_fenced/log.jsonl") cpu=$(fields "$TMP/ring2_llama/log.jsonl")
t_check ring2_fenced_bits '[ -n "$fenced" ] && [ "$fenced" = "$cpu" ]' "fenced: $(grep -m1 -i error "$TMP/ring2_fenced.txt")"

# Each hop starts before the chunk pair's attention and is waited for after it (comm_exchange_start). Under
# GPT_COMM_POISON a receive reads as NaN until its wait and a send written in flight is an error, so a wait
# missing, late or misplaced cannot pass by luck: the poisoned runs equal the plain ones bit for bit (losses,
# norms, the model and every rank's state), forward and backward, with the forward again in the backward (-r 3).
poison_ring() {   # name, ranks, plain run, flags...
    local name=$1 np=$2 plain=$3; shift 3
    GPT_COMM_POISON=1 "${MPIRUN[@]}" -x GPT_COMM_POISON -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" \
        > "$TMP/$name.txt" 2>&1 || { t_fail "$name" "run failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    same_run "$name" "$TMP/$plain" "$TMP/$name" 8
}
poison_ring ring2_llama_poison_same_bits 2 ring2_llama -e "$LLAMA" -cp 2 "${RING[@]}" -n 4
poison_ring ring4_llama_z3_r3_poison_same_bits 4 ring4_llama_z3_r3 -e "$LLAMA" -cp 4 "${RING[@]}" -z 3 -r 3

# The bytes each rank sends round the ring per step ("send" in cp_comm_bytes): per block and micro-batch, with
# K = its k|v (B T/N rows of 2 KV D, KV a tensor rank's kv heads, fp32 or bf16), the forward passes K N-1 times, the backward K and its
# d(k|v) N-1 times and the d(k|v) home once, and -r 2 and 3 run the forward again in the backward.
traffic() {   # name, N, blocks per rank, micro-batches, recompute, kv heads, head size, bytes per value
    py_check "traffic_$1" "$TMP/$1/log.jsonl" "${@:2}" <<'PY'
import json, sys
path, (N, L, m, r, KV, D, x) = sys.argv[1], map(int, sys.argv[2:9])
B, T = 2, 32
K = B * T // N * 2 * KV * D * x
passes = (N - 1) + 2 * (N - 1) + 1 + ((N - 1) if r >= 2 else 0)
want = L * m * passes * K
recs = [json.loads(l) for l in open(path)]
sent = [v for rec in recs if "cp_comm_bytes" in rec for v in rec["cp_comm_bytes"].get("send", [None])]
bad = [v for v in sent if v != want]
print("ok" if sent and not bad else "want %d bytes per rank and step, got %s" % (want, bad[:3]))
PY
}
traffic ring2_gpt2 2 2 1 0 4 16 4
traffic ring4_gpt2_z1 4 2 1 0 4 16 4
traffic ring2_gpt2_z2_r2 2 2 1 2 4 16 4
traffic ring2_pp2_gpt2 2 1 2 0 4 16 4
traffic ring4_llama_z3_r3 4 2 1 3 2 16 4
traffic ring2_llama_bf16 2 2 1 0 2 16 2
traffic ring2_tp2_gpt2_z2 2 2 1 0 2 16 4
traffic ring2_tp2_sp_mqa 2 4 2 0 1 16 4

# One checkpoint format: the ring's, saved after step 4 (ring2_llama's -n 4), resumed by Ulysses at -cp 2 and
# by one rank; one rank's (the reference's own) resumed by the ring at -cp 4 -z 3.
resume_as ring_resume_as_ulysses ring2_llama 2 -cp 2 -cpm ulysses
resume_as ring_resume_on_one_rank ring2_llama 1
resume_as ring_resume_from_one_rank llama_ga1 4 -cp 4 "${RING[@]}" -z 3

# --estimate: the ring keeps nothing per block; its work buffers, the lse scratch and the positions are planned
# as allocated.
estimate_case estimate_ring2_r2 2 -e "$GPT2" -x 1 -cp 2 "${RING[@]}" -r 2
estimate_case estimate_ring4_llama_z3 4 -e "$LLAMA" -x 1 -cp 4 "${RING[@]}" -z 3
estimate_case estimate_ring2_tp2_sp_mqa_r2 4 -e "$MQA" -x 1 -cp 2 "${RING[@]}" -tp 2 -sp 1 -r 2

bad ring_t_not_in_2n_chunks "-t 36 does not split into the 8 chunks of -cp 4 -cpm ring" -e "$GPT2" -t 36 -cp 4 "${RING[@]}" --estimate -w 4
bad ring_without_cp "-cpm ring passes k|v round the context ranks: it needs -cp 2 or more" -e "$GPT2" "${RING[@]}" --estimate
# The ring splits no heads: 8 ranks share a model of 4 heads, which Ulysses refuses.
./train_gpt_cpu "${base[@]}" -e "$GPT2" -cp 8 "${RING[@]}" --estimate -w 8 > "$TMP/ring8.plan" 2>&1
t_check ring_splits_no_heads "grep -q '^plan: ' '$TMP/ring8.plan'" "$(tail -1 "$TMP/ring8.plan")"
t_finish
