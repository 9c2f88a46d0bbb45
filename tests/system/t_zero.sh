#!/usr/bin/env bash
# ZeRO stages 0-3 on the CPU build over MPI:
# - equivalence: with the same global batch, -np 1 -ga 4, -np 2 -ga 2 and -np 4 -ga 1 under each stage give
#   the single-rank run's loss and gradient norm at each of 12 steps (relative difference < 1e-5) and its
#   final parameters;
# - memory and traffic: each rank's bytes per category and per collective equal the stage's formulas
#   (tests/tools/zero_check.py), for N = 1, 2, 4, and for an untied LM head under ZeRO-3;
# - resume across topologies: checkpoint at -np 4 -z 3, resume at -np 2 -z 1, same losses;
# - hpZ (-hpz N): the same bits as -z 3 (GPT-2, Llama, -offload 2, -pp 2, -tp 2, resume across -hpz), and
#   each rank's bytes per group and per link class;
# - a checkpoint missing a rank's state file is skipped for an older one.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip zero
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 40000 -V 512 --seed 5 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
flags=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 12 -l 2e-3 -u 3 -q 0.1 -c 0.1 -gc 1.0 -v 0 -s 0 -sh 1)
run() {   # dir, ranks, ga, extra flags...
    local dir=$1 np=$2 ga=$3; shift 3
    "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${flags[@]}" -ga "$ga" -o "$TMP/$dir" "$@" > "$TMP/$dir.txt" 2>&1 ||
        t_fail "$dir" "exited non-zero: $(grep -m1 error "$TMP/$dir.txt")"
}
run ref 1 4
for z in 0 1 2 3; do
    for np in 1 2 4; do
        name=z${z}_np${np}
        run "$name" "$np" $((4 / np)) -z "$z" -n 6   # -n 6: z3_np4's step-6 checkpoint starts the resume below
        compare_py log "${name}_vs_single" "$TMP/$name/log.jsonl" "$TMP/ref/log.jsonl" --steps 12 --tol 1e-5 --key loss --key grad_norm
        compare_py models "${name}_final_params" "$TMP/$name/ckpt_000012/model.bin" "$TMP/ref/ckpt_000012/model.bin" --tol 1e-5 --abs 1e-6 --kbias-bound "$(lr_sum 2e-3 3 12 0.1)"
        $PYTHON tests/tools/zero_check.py "$name" "$TMP/$name/log.jsonl" || FAILED=1
    done
done
# Overlap (stages 2-3 start collectives and wait for them later): in poison mode every buffer of a
# collective in flight reads as NaN until its wait, and a write into one is an error, so a wait that is
# missing or late in zero.c cannot pass by luck. Same bits as the unpoisoned runs above.
for z in 2 3; do
    name=z${z}_np4_poison
    "${MPIRUN[@]}" -x GPT_COMM_POISON=1 -np 4 ./train_gpt_cpu "${flags[@]}" -ga 1 -z "$z" -o "$TMP/$name" > "$TMP/$name.txt" 2>&1 ||
        t_fail "$name" "exited non-zero: $(grep -m1 error "$TMP/$name.txt")"
    t_check "${name}_same_bits" "cmp -s '$TMP/$name/ckpt_000012/model.bin' '$TMP/z${z}_np4/ckpt_000012/model.bin' &&
        diff <(grep -o '\"loss\".*\"grad_norm\": [^,]*' '$TMP/$name/log.jsonl') \
             <(grep -o '\"loss\".*\"grad_norm\": [^,]*' '$TMP/z${z}_np4/log.jsonl') > /dev/null" \
        "final parameters or losses differ from z${z}_np4's: $(grep -m1 error "$TMP/$name.txt")"
done
# An untied LM head (a Llama-family shape): the final unit, as large as the embedding unit, shares its slots,
# so the embedding unit is gathered again each micro-step. Each rank's bytes and gathers are the table's for
# an untied head; in poison mode the same bits (t_llama.sh compares -z 3's losses with one rank's).
untied=(-e llama:L2,C64,H4,K2,F96,V512,T64)
run untied_z3_np2 2 2 "${untied[@]}" -z 3
$PYTHON tests/tools/zero_check.py untied_z3_np2 "$TMP/untied_z3_np2/log.jsonl" --untied || FAILED=1
"${MPIRUN[@]}" -x GPT_COMM_POISON=1 -np 2 ./train_gpt_cpu "${flags[@]}" "${untied[@]}" -ga 2 -z 3 -o "$TMP/untied_poison" > "$TMP/untied_poison.txt" 2>&1 ||
    t_fail untied_poison "exited non-zero: $(grep -m1 error "$TMP/untied_poison.txt")"
t_check untied_z3_np2_poison_same_bits "cmp -s '$TMP/untied_poison/ckpt_000012/model.bin' '$TMP/untied_z3_np2/ckpt_000012/model.bin' &&
    diff <(fields '$TMP/untied_poison/log.jsonl') <(fields '$TMP/untied_z3_np2/log.jsonl') > /dev/null" \
    "final parameters or losses differ from untied_z3_np2's: $(grep -m1 error "$TMP/untied_poison.txt")"
# hpZ (-hpz N): the backward gathers each unit inside N consecutive ranks from their secondary shards, so
# losses, norms and every checkpoint's model and state files are the plain -z 3 run's, bit for bit: GPT-2 at
# 4 ranks (in poison mode, so a wait on the wrong group or a shard read before its gather cannot pass), Llama's
# untied head, -offload 2, -pp 2 and -tp 2; resumed under another -hpz (the shard is not checkpointed). Each
# rank's all-gather bytes are the forward's over the data-parallel group plus the backward's inside the hpz
# group, and on one host every byte is intra-host.
same_bits_as() {   # name, run, reference run: the same losses and norms, and the same files in each checkpoint
    local bad="" f n=0
    diff <(fields "$TMP/$2/log.jsonl") <(fields "$TMP/$3/log.jsonl") > /dev/null || bad="losses or norms differ;"
    [ "$(fields "$TMP/$2/log.jsonl" | wc -l)" -ge 12 ] || bad="$bad $(fields "$TMP/$2/log.jsonl" | wc -l) steps logged;"
    for f in $(cd "$TMP/$3" && ls ckpt_*/model.bin ckpt_*/state_rank*.bin 2>/dev/null); do
        n=$((n + 1))
        cmp -s "$TMP/$2/$f" "$TMP/$3/$f" || bad="$bad $f differs;"
    done
    [ $n -gt 0 ] || bad="$bad $3 has no checkpoint;"
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad $(grep -m1 error "$TMP/$2.txt")"; fi
}
"${MPIRUN[@]}" -x GPT_COMM_POISON=1 -np 4 ./train_gpt_cpu "${flags[@]}" -ga 1 -z 3 -hpz 2 -n 6 -o "$TMP/hpz2_np4" > "$TMP/hpz2_np4.txt" 2>&1 ||
    t_fail hpz2_np4 "exited non-zero: $(grep -m1 error "$TMP/hpz2_np4.txt")"
same_bits_as hpz2_np4_same_bits hpz2_np4 z3_np4
run hpz_host_np4 4 1 -z 3 -hpz host -n 6   # one host: a group of all 4
t_check hpz_host_one_group_of_4 "grep -q 'hpZ groups of 4' '$TMP/hpz_host_np4.txt'" "$(grep -m1 'ranks (' "$TMP/hpz_host_np4.txt")"
same_bits_as hpz_host_np4_same_bits hpz_host_np4 z3_np4
cp -r "$TMP/hpz2_np4" "$TMP/hpz4_resumed" && rm -rf "$TMP/hpz4_resumed/ckpt_000012"
run hpz4_resumed 4 1 -z 3 -hpz 4 -n 6 -y 1
t_check hpz4_resumed_at_6 "grep -q 'resumed from .*ckpt_000006 at step 6' '$TMP/hpz4_resumed.txt'"
same_bits_as hpz2_to_hpz4_resume_same_bits hpz4_resumed z3_np4
$PYTHON - "$TMP/hpz2_np4/log.jsonl" "$TMP/z3_np4/log.jsonl" <<'PY' || FAILED=1
import json, sys
recs = lambda p, key: {r["step"]: r[key] for r in map(json.loads, open(p)) if key in r}
hpz, dp, hpz_links, links, total = (recs(sys.argv[1], k) for k in ("hpz_comm_bytes", "dp_comm_bytes", "hpz_link_bytes", "link_bytes", "comm_bytes"))
plain = recs(sys.argv[2], "comm_bytes")
bad = [] if plain and set(plain) == set(hpz) else ["steps with records: %s, -z 3's: %s" % (sorted(hpz), sorted(plain))]
for s in sorted(plain):
    for r in range(4):
        # A gather's bytes are (n-1)/n of the unit: 3/4 over the 4 ranks, 1/2 inside a group of 2.
        if dp[s]["allgather"][r] + hpz[s]["allgather"][r] * 3 // 2 != plain[s]["allgather"][r] or not hpz[s]["allgather"][r]:
            bad.append("step %d rank %d: all-gathers %d over dp + %d over hpz, -z 3's %d" % (s, r, dp[s]["allgather"][r], hpz[s]["allgather"][r], plain[s]["allgather"][r]))
        if links[s]["cross_host"][r] or links[s]["intra_host"][r] != sum(total[s][k][r] for k in total[s]) or hpz_links[s]["cross_host"][r]:
            bad.append("step %d rank %d: links %s, bytes %s" % (s, r, links[s], total[s]))
print("ok hpz2_np4_bytes_per_group_and_link" if not bad else "FAIL hpz2_np4_bytes_per_group_and_link: " + "; ".join(bad[:3]))
sys.exit(1 if bad else 0)
PY
run untied_hpz2_np2 2 2 "${untied[@]}" -z 3 -hpz 2
same_bits_as untied_hpz2_np2_same_bits untied_hpz2_np2 untied_z3_np2
run z3_np2_hpz2_offload2 2 2 -z 3 -hpz 2 -offload 2 -n 6
same_bits_as hpz2_offload2_same_bits z3_np2_hpz2_offload2 z3_np2
for layout in pp2 tp2; do
    case $layout in pp2) lf=(-pp 2) ;; tp2) lf=(-tp 2 "${untied[@]}") ;; esac
    run "${layout}_z3" 4 2 "${lf[@]}" -z 3 -n 6
    run "${layout}_hpz2" 4 2 "${lf[@]}" -z 3 -hpz 2 -n 6
    same_bits_as "${layout}_hpz2_same_bits" "${layout}_hpz2" "${layout}_z3"
done
# Checkpoint at 4 ranks, ZeRO-3 (z3_np4's); lose everything after step 6; resume at 2 ranks, ZeRO-1.
cp -r "$TMP/z3_np4" "$TMP/split" && rm -rf "$TMP/split/ckpt_000012"
run split 2 2 -z 1 -y 1
t_check resume_np4z3_to_np2z1_announced "grep -q 'resumed from .*ckpt_000006 at step 6 (written by 4' '$TMP/split.txt'"
compare_py log resume_np4z3_to_np2z1_losses "$TMP/split/log.jsonl" "$TMP/ref/log.jsonl" --steps 12 --tol 1e-5 --key loss --key grad_norm
# Streaming export of the sharded state: the master equals the consolidated model file bit for bit, and the
# 4-rank ZeRO-3 run's Adam moments match the 1-rank ZeRO-0 run's.
$PYTHON scripts/export_checkpoint.py "$TMP/z3_np4/ckpt_000012" "$TMP/x4" > /dev/null && $PYTHON scripts/export_checkpoint.py "$TMP/z0_np1/ckpt_000012" "$TMP/x1" > /dev/null
t_check export_master_is_model "cmp -s $TMP/x4_model.bin $TMP/z3_np4/ckpt_000012/model.bin"
$PYTHON - "$TMP/x4_adam.bin" "$TMP/x1_adam.bin" <<'PY'
import struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
n = struct.unpack_from("<3i", a)[2]
x, y = (struct.unpack_from("<%df" % (2 * n), d, 1024) for d in (a, b))
num = sum((p - q) ** 2 for p, q in zip(x, y)) ** 0.5
den = sum(q * q for q in y) ** 0.5
ok = den > 0 and num / den < 1e-4 and len(a) == len(b)
print("ok export_adam_np4z3_matches_np1" if ok else "FAIL export_adam_np4z3_matches_np1: rel err %g" % (num / max(den, 1e-30)))
PY
[ $? -eq 0 ] || FAILED=1
# Rank 0's file in rank 2's place: as many elements as before, but some twice and some never.
# The manifest's checksums are made to match, to reach the check behind them.
cp "$TMP/z3_np4/ckpt_000012/state_rank0.bin" "$TMP/z3_np4/ckpt_000012/state_rank2.bin"
$PYTHON - "$TMP/z3_np4/ckpt_000012" <<'PY'
import json, sys, zlib
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
m["crc32"]["state_rank2.bin"] = m["crc32"]["state_rank0.bin"]
text = json.dumps(m).encode()
open(d + "/manifest.json", "wb").write(text)
open(d + "/DONE", "w").write('{"manifest.json": "%08x"}\n' % zlib.crc32(text))
PY
$PYTHON scripts/export_checkpoint.py "$TMP/z3_np4/ckpt_000012" "$TMP/x6" > /dev/null 2> "$TMP/x6.err"
t_check export_detects_overlapping_spans "grep -q 'the state files hold twice parameters' $TMP/x6.err && [ ! -e $TMP/x6_model.bin ]" "$(cat "$TMP/x6.err")"
rm "$TMP/z3_np4/ckpt_000012/state_rank2.bin"
$PYTHON scripts/export_checkpoint.py "$TMP/z3_np4/ckpt_000012" "$TMP/x5" > /dev/null 2> "$TMP/x5.err"
t_check export_detects_missing_spans "grep -q 'the state files miss parameters' $TMP/x5.err && [ ! -e $TMP/x5_model.bin ]" "$(cat "$TMP/x5.err")"

# A checkpoint whose rank-1 state file is missing is skipped, with a warning, for the older one (written
# by 4 ranks); the run then ends where the uninterrupted one does.
rm "$TMP/split/ckpt_000012/state_rank1.bin"
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${flags[@]}" -ga 2 -z 1 -o "$TMP/split" -y 1 > "$TMP/missing.txt" 2>&1
rc=$?
t_check missing_state_file_falls_back "[ $rc -eq 0 ] && grep -q 'warning: skipping damaged checkpoints: .*ckpt_000012: state_rank1.bin is missing' '$TMP/missing.txt' && grep -q 'resumed from .*ckpt_000006' '$TMP/missing.txt' && [ -f '$TMP/split/ckpt_000012/state_rank1.bin' ]"
t_finish
