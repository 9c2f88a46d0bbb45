#!/usr/bin/env bash
# -lora in 16 bits: the frozen base in bf16 or fp16 and the adapters' fp32 masters follow the fp32 run; under
# fp16 the dynamic loss scale works on the adapters' gradients alone (an overflow in the activations'
# gradients through the frozen layers skips the step on every rank and halves the scale), and two ranks
# under -z 2 follow one rank's -ga 2.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 5 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
base=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -s 0 -v 0 -l 1e-2 -lora 4 -lora-alpha 8)
for p in fp32 bf16 fp16; do train 1 "$TMP/$p" -x 8 -p $p; done
# 16-bit activations and base against fp32, in loss and gradient norm: fp16 within 2e-3 (as full training's in
# t_faults.sh), bf16's 8-bit mantissa within 1e-2.
compare_py log lora_fp16_tracks_fp32 "$TMP/fp16/log.jsonl" "$TMP/fp32/log.jsonl" --steps 8 --tol 2e-3 --key loss --key grad_norm
compare_py log lora_bf16_tracks_fp32 "$TMP/bf16/log.jsonl" "$TMP/fp32/log.jsonl" --steps 8 --tol 1e-2 --key loss --key grad_norm
# From 1e12 the scale takes about 54 steps of halving every second overflow to stop overflowing.
train 1 "$TMP/ovf" -x 70 -p fp16 -ls 1e12
$PYTHON tests/tools/loss_scaler_check.py lora_fp16_overflow_skips_and_rescales "$TMP/ovf/log.jsonl" || FAILED=1
if mpi_available; then
    base=("${base[@]}" -b 1)
    train 1 "$TMP/one_ga2" -x 8 -p fp16 -ga 2
    train 2 "$TMP/two_z2" -x 8 -p fp16 -z 2
    # Not bit for bit in 16 bits: the micro-batches' gradients are summed elsewhere (one rank's 16-bit
    # accumulation, two ranks' reduction).
    compare_py log lora_fp16_np2_z2_follows_one_rank "$TMP/two_z2/log.jsonl" "$TMP/one_ga2/log.jsonl" --steps 8 --tol 1e-3 --key loss --key grad_norm
else
    t_skip lora_fp16_np2 "no MPI"
fi
t_finish
