#!/usr/bin/env bash
# ZeRO++'s quantized weight gathers (-qw 1 with -z 3, core/zero/qwz.h) on the CPU build over MPI:
# - quantization is on: the losses and gradient norms differ from the exact -z 3 run's, yet stay within 5e-3 of
#   them over 8 steps (fp32; bf16 within 1e-2 of bf16's), and every rank's all-gather bytes are exactly 17/64 of
#   fp32's and 17/32 of bf16's (int8 and one fp32 scale per 64 elements against 4 or 2 bytes);
# - the quantized values do not depend on the data-parallel size (blocks start at 64-element steps from each
#   section's start): 2 ranks at -ga 2 and 4 at -ga 1 log the same losses within 1e-5, as exact runs do;
# - with -hpz 2 the backward's gathers copy what the forward's dequantized: the same bits as -qw 1 alone;
# - the master weights never see quantization: a resume is bit-exact;
# - the round trip bound (absmax / 254 per block, fp32's rounding aside) on the trained model's real tensors,
#   cut as -qw cuts them (build/test_quantize MODEL.bin), in fp32 and bf16.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip qwz
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 40000 -V 512 --seed 5 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
base=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 8 -l 2e-3 -u 2 -v 0 -s 0 -z 3)
run() {   # dir, ranks, flags...
    local dir=$1 np=$2; shift 2
    train "$np" "$TMP/$dir" "$@" || t_fail "$dir" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
run exact 2 -ga 2
run qw 2 -ga 2 -qw 1 -n 4
run qw_np4 4 -ga 1 -qw 1
run qw_hpz2 4 -ga 1 -qw 1 -hpz 2
run exact_bf16 2 -ga 2 -p bf16
run qw_bf16 2 -ga 2 -p bf16 -qw 1
cp -r "$TMP/qw" "$TMP/qw_resumed" && rm -rf "$TMP/qw_resumed/ckpt_000008"
run qw_resumed 2 -ga 2 -qw 1 -y 1

compare_py log qw_within_5e-3_of_exact "$TMP/qw/log.jsonl" "$TMP/exact/log.jsonl" --steps 8 --tol 5e-3 --key loss --key grad_norm
t_check qw_is_not_exact "! diff -q <(fields '$TMP/qw/log.jsonl') <(fields '$TMP/exact/log.jsonl') > /dev/null" \
    "-qw 1 logged the exact run's losses bit for bit: nothing was quantized"
compare_py log qw_bf16_within_1e-2_of_bf16 "$TMP/qw_bf16/log.jsonl" "$TMP/exact_bf16/log.jsonl" --steps 8 --tol 1e-2 --key loss --key grad_norm
compare_py log qw_np4_same_values_as_np2 "$TMP/qw_np4/log.jsonl" "$TMP/qw/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm
t_check qw_hpz2_same_bits "diff -q <(fields '$TMP/qw_hpz2/log.jsonl') <(fields '$TMP/qw_np4/log.jsonl') > /dev/null &&
    cmp -s '$TMP/qw_hpz2/ckpt_000008/model.bin' '$TMP/qw_np4/ckpt_000008/model.bin'"
t_check qw_resume_bit_exact "grep -q 'resumed from .*ckpt_000004' '$TMP/qw_resumed.txt' &&
    diff -q <(fields '$TMP/qw_resumed/log.jsonl') <(fields '$TMP/qw/log.jsonl') > /dev/null &&
    cmp -s '$TMP/qw_resumed/ckpt_000008/model.bin' '$TMP/qw/ckpt_000008/model.bin'"
py_check qw_allgather_bytes "$TMP/qw/log.jsonl" "$TMP/exact/log.jsonl" "$TMP/qw_bf16/log.jsonl" "$TMP/exact_bf16/log.jsonl" <<'PY'
import json, sys
gathers = lambda p: [r["comm_bytes"]["allgather"] for r in map(json.loads, open(p)) if "comm_bytes" in r]
qw, exact, qw16, exact16 = (gathers(p) for p in sys.argv[1:5])
bad = [("fp32", s, q, e) for s, (q, e) in enumerate(zip(qw, exact)) if any(a * 64 != b * 17 or not a for a, b in zip(q, e))]
bad += [("bf16", s, q, e) for s, (q, e) in enumerate(zip(qw16, exact16)) if any(a * 32 != b * 17 or not a for a, b in zip(q, e))]
ok = len(qw) == len(exact) == len(qw16) == len(exact16) == 8
print("ok" if ok and not bad else "%d/%d/%d/%d records; %s: step %d all-gathers %s, exact %s" % ((len(qw), len(exact), len(qw16), len(exact16)) + (bad[0] if bad else ("", 0, [], []))))
PY
out=$(build/test_quantize "$TMP/qw/ckpt_000008/model.bin" 2>&1)
printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
printf '%s\n' "$out" | grep -q '^FAIL ' && FAILED=1
[ "$(printf '%s\n' "$out" | grep -c '^ok ')" -eq 2 ] || t_fail qwz_round_trip_on_model "test_quantize MODEL.bin: $(tail -1 <<< "$out")"
t_finish
