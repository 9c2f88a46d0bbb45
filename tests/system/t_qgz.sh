#!/usr/bin/env bash
# ZeRO++'s quantized gradient reduction (-qg 1 with -z 2/3, core/zero/qgz.h) on the CPU build over MPI, 4 ranks
# pretending to be 2 hosts x 2 (GPT_RANKS_PER_HOST=2):
# - quantization is on: the losses differ from the exact -z 2 run's, yet stay within 1e-3 (relative) of them
#   over 8 steps and the gradient norms within 5e-2 (int4 with error feedback);
# - the bytes: the intra-host all-to-all sends 9/32 and the inter-host one 9/64 byte per covered element
#   (int4 + one fp32 scale per 64 = 9/16 byte per element, (L-1) H and (H-1) pieces of n/4 leaving each rank),
#   where the exact reduce-scatter sends 3 (fp32: 3/4 of 4); what stays a reduce-scatter is the units under
#   256 elements per piece;
# - the error buffers are in the checkpoint: a resume is bit-exact; 2 ranks resume the 4 ranks' checkpoint,
#   resharding the errors, close to the straight run; a damaged error file, or one in qgZ's first format, is
#   refused in one line;
# - -z 3 with -qw 1 -hpz 2 in bf16 stays within 1e-2 of exact bf16;
# - fp16 from an absurd loss scale: overflowing steps dequantize to NaN, are skipped, and training follows;
# - pretended hosts that do not divide the group are refused in one line.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip qgz
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 40000 -V 512 --seed 5 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
base=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 8 -l 2e-3 -u 2 -v 0 -s 0 -z 2)
export GPT_RANKS_PER_HOST=2
run() {   # dir, ranks, flags...
    local dir=$1 np=$2; shift 2
    train "$np" "$TMP/$dir" "$@" || t_fail "$dir" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
refused() {   # name, pattern, ranks, dir, flags...: a one-line error, non-zero
    local name=$1 pattern=$2 np=$3 dir=$4; shift 4
    if train "$np" "$TMP/$dir" "$@"; then t_fail "$name" "it ran"; return; fi
    t_check "$name" "[ \$(grep -c '^error: .*$pattern' '$TMP/$dir.txt') -ge 1 ]" "$(grep -m1 error "$TMP/$dir.txt")"
}
run exact 4
run qg 4 -qg 1 -n 4 -lb 1
cp -r "$TMP/qg" "$TMP/qg_resumed" && rm -rf "$TMP/qg_resumed/ckpt_000008"
run qg_resumed 4 -qg 1 -y 1
run exact_bf16 4 -p bf16
run qg_z3_bf16 4 -p bf16 -z 3 -qg 1 -qw 1 -hpz 2

compare_py log qg_within_tolerance_of_exact "$TMP/qg/log.jsonl" "$TMP/exact/log.jsonl" --steps 8 --tol 1e-3 --key loss
compare_py log qg_grad_norm_within_5e-2 "$TMP/qg/log.jsonl" "$TMP/exact/log.jsonl" --steps 8 --tol 5e-2 --key grad_norm
t_check qg_is_not_exact "! diff -q <(fields '$TMP/qg/log.jsonl') <(fields '$TMP/exact/log.jsonl') > /dev/null" \
    "-qg 1 logged the exact run's losses bit for bit: nothing was quantized"
t_check qg_resume_bit_exact "grep -q 'resumed from .*ckpt_000004' '$TMP/qg_resumed.txt' &&
    diff -q <(fields '$TMP/qg_resumed/log.jsonl') <(fields '$TMP/qg/log.jsonl') > /dev/null &&
    cmp -s '$TMP/qg_resumed/ckpt_000008/model.bin' '$TMP/qg/ckpt_000008/model.bin'"
compare_py log qg_z3_qw_hpz_bf16_within_1e-2 "$TMP/qg_z3_bf16/log.jsonl" "$TMP/exact_bf16/log.jsonl" --steps 8 --tol 1e-2 --key loss
t_check qg_lb_shows_quantize_time "grep -q 'qgZ quantize [0-9.]* ms' '$TMP/qg.txt' && grep -q qgz_quantize_ms '$TMP/qg/log.jsonl'"
py_check qg_bytes_per_group "$TMP/qg/log.jsonl" "$TMP/exact/log.jsonl" <<'PY'
import json, sys
def records(path, key):
    return [r[key] for r in map(json.loads, open(path)) if key in r]
exact_rs = [r["reduce_scatter"] for r in records(sys.argv[2], "comm_bytes")]
qg_rs = [r["reduce_scatter"] for r in records(sys.argv[1], "dp_comm_bytes")]
intra = [r["alltoall"] for r in records(sys.argv[1], "qgz_intra_comm_bytes")]
inter = [r["alltoall"] for r in records(sys.argv[1], "qgz_inter_comm_bytes")]
bad = []
for s, (e, q, a, b) in enumerate(zip(exact_rs, qg_rs, intra, inter)):
    for rank in range(4):
        covered = (e[rank] - q[rank]) // 3   # fp32 elements whose reduce-scatter qgZ replaced
        if not covered or a[rank] * 32 != covered * 9 or b[rank] * 64 != covered * 9 or not q[rank]:
            bad.append("step %d rank %d: exact %d, left %d, intra %d, inter %d" % (s, rank, e[rank], q[rank], a[rank], b[rank]))
ok = len(exact_rs) == len(qg_rs) == len(intra) == len(inter) == 8
print("ok" if ok and not bad else "%d/%d/%d/%d records; %s" % (len(exact_rs), len(qg_rs), len(intra), len(inter), bad[:2]))
PY

# Another data-parallel size reshards the errors (core/zero/feedback_file.h): 2 ranks of 4 sequences resume the 4
# ranks' checkpoint at step 4, each starting from the writers' errors summed over 2, and end within 1e-3 of the
# straight 4-rank run (other ranks quantize other sums, so not bit for bit). test_feedback_file checks the values.
cp -r "$TMP/qg" "$TMP/qg_np2" && rm -rf "$TMP/qg_np2/ckpt_000008" "$TMP/qg_np2/log.jsonl"   # the log: steps 4.. only
run qg_np2 2 -qg 1 -y 1 -b 4
t_check qg_resume_resharded_4_to_2 "grep -q '^qgZ: the errors of 4 ranks resharded for 2' '$TMP/qg_np2.txt' &&
    [ -f '$TMP/qg_np2/ckpt_000008/qgz_rank1.bin' ] && [ ! -f '$TMP/qg_np2/ckpt_000008/qgz_rank2.bin' ]" "$(grep -m1 error "$TMP/qg_np2.txt")"
py_check qg_resharded_close_to_straight "$TMP/qg_np2/log.jsonl" "$TMP/qg/log.jsonl" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
resumed, straight = losses(sys.argv[1]), losses(sys.argv[2])
worst = max((abs(resumed[s] - straight[s]) / straight[s] for s in resumed), default=None)
print("ok" if sorted(resumed) == [4, 5, 6, 7] and worst < 1e-3 else "steps %s, worst relative difference %s" % (sorted(resumed), worst))
PY
cp -r "$TMP/qg" "$TMP/qg_old" && rm -rf "$TMP/qg_old/ckpt_000008"   # the first format's magic
printf 'QGZERR1\0' | dd of="$TMP/qg_old/ckpt_000004/qgz_rank0.bin" bs=1 conv=notrunc status=none
refused qg_earlier_format_refused "in an earlier format (QGZERR1): resume it with the binary that wrote it" 4 qg_old -qg 1 -y 1
cp -r "$TMP/qg" "$TMP/qg_damaged" && rm -rf "$TMP/qg_damaged/ckpt_000008"
printf '\x55' | dd of="$TMP/qg_damaged/ckpt_000004/qgz_rank1.bin" bs=1 seek=100 conv=notrunc status=none
refused qg_damaged_errors_refused "damaged (its CRC-32 does not match qgZ" 4 qg_damaged -qg 1 -y 1
cp -r "$TMP/qg" "$TMP/qg_off" && rm -rf "$TMP/qg_off/ckpt_000008"   # dropping -qg would drop its errors
refused qg_resume_without_qg_refused "would change -qg 1 -> 0" 4 qg_off -y 1
GPT_RANKS_PER_HOST=3 refused qg_pretended_hosts_must_divide "GPT_RANKS_PER_HOST=3: the ranks per pretended host must divide" 4 bad_hosts -qg 1

train 2 "$TMP/ovf" -b 1 -x 60 -p fp16 -ls 1e12 -qg 1 > /dev/null 2>&1 || t_fail qg_fp16_overflow "exited non-zero"
$PYTHON tests/tools/loss_scaler_check.py qg_fp16_overflow_skips_and_rescales "$TMP/ovf/log.jsonl" || FAILED=1
t_finish
