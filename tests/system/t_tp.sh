#!/usr/bin/env bash
# -tp N: tensor parallelism (Megatron's column- then row-parallel pairs in every block; core/model/walk.c,
# core/model/model.c). Against the one-rank run of the same global batch, from the same model file:
#   - losses and gradient norms within 1e-5 at every step, and the final parameters within 1e-5 per tensor
#     (the key bias, whose exact gradient is 0, only within the LRs' sum: compare.py --kbias-bound);
#   - for -tp 2 and 4, alone and with 2 replicas, with -pp 2, under each -z, each -r, with -offload 2, and in
#     bf16 (losses and norms within 2e-2: stochastic rounding moves small weights by whole bf16 steps);
#   - not bitwise: a row-parallel projection sums N partial products where one rank sums one, so the
#     additions happen in another order;
#   - checkpoints are one format: a run saved at -tp 2 -pp 2 -z 3 resumes at -tp 1, at -tp 4 and on one
#     rank, and its model.bin equals the one-rank run's within the same tolerance;
#   - -sp 1 (sequence parallelism) likewise, and the bytes each rank sends in the tensor group per step, with
#     and without it, equal the formulas below;
#   - a bf16 model file (version 5) read at -tp 2 trains as it does on one rank;
#   - one-line errors for a -tp that does not divide the heads or the ranks.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip t_tp
# The checkpoints' guard against copies that drifted apart (tests/unit/test_copies.c): the group sees one changed
# element where its pick looks and only there.
for np in 2 3; do
    out=$("${MPIRUN[@]}" -np $np build/test_copies 2>&1); rc=$?
    echo "$out" | grep -E '^(ok|FAIL) '
    [ $rc = 0 ] && [ "$(grep -c '^ok ' <<< "$out")" = 12 ] || t_fail copies_np$np "exited $rc, or not 12 checks passed"
done
$PYTHON scripts/make_shard.py -o "$TMP/train.bin" -n 20000 -V 500 --seed 7 >/dev/null || t_fail shard "make_shard failed"
init_model L2C64H4V500T64 "$TMP/train.bin"
base=(-e "$MODEL" -i "$TMP/train.bin" -j "" -b 2 -t 32 -x 6 -l 1e-3 -u 2 -c 0.1 -v 0 -s 0 -gc 1.0)
KB=$(lr_sum 1e-3 2 6)   # bound on the key bias's drift

train() {   # ranks, out dir, flags...
    local np=$1 out=$2; shift 2
    if [ "$np" -gt 1 ]; then "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1
    else ./train_gpt_cpu "${base[@]}" "$@" -o "$out" > "$out.txt" 2>&1; fi
}
compare_runs() {   # name, dir, reference dir, tolerance ("losses" as a 5th argument: the log only)
    compare_out log "$1" "$2/log.jsonl" "$3/log.jsonl" --steps 6 --tol "$4" --key loss --key grad_norm ||
        { t_fail "$1" "$(grep FAIL <<< "$CMP_OUT" | cut -c1-300)"; return; }
    [ "${5:-}" = losses ] && { t_ok "$1"; return; }
    compare_out models "$1" "$2/ckpt_000006/model.bin" "$3/ckpt_000006/model.bin" --tol "$4" --abs "$4" --kbias-bound "$KB" &&
        t_ok "$1" || t_fail "$1" "final model: $(grep FAIL <<< "$CMP_OUT" | cut -c1-300)"
}
# The one-rank references: one per global batch (-ga replicas) and precision. ref_ga1 also dumps step 0's
# logits (-dump, checked against -tp 2's below; it changes no bit of the run).
train 1 "$TMP/ref_ga1" -ga 1 -dump "$TMP/dump1.d" || t_fail reference "one-rank run failed"
train 1 "$TMP/ref_ga2" -ga 2 || t_fail reference "one-rank run failed"
train 1 "$TMP/ref_bf16" -p bf16 || t_fail reference "one-rank bf16 run failed"
case_tp() {   # name, ranks, reference, tolerance, flags...
    local name=$1 np=$2 ref=$3 tol=$4 what=""; shift 4
    [ "$ref" = ref_bf16 ] && what=losses   # bf16's stochastic rounding makes small weights differ by whole steps
    train "$np" "$TMP/$name" "$@" || { t_fail "$name" "run failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    compare_runs "$name" "$TMP/$name" "$TMP/$ref" "$tol" $what
}
case_tp tp2 2 ref_ga1 1e-5 -tp 2
case_tp tp4 4 ref_ga1 1e-5 -tp 4
for z in 1 2 3; do case_tp "tp2_dp2_z$z" 4 ref_ga2 1e-5 -tp 2 -z $z; done
case_tp tp2_pp2 4 ref_ga2 1e-5 -tp 2 -pp 2 -ga 2
case_tp tp2_pp2_dp2_z3 8 ref_ga2 1e-5 -tp 2 -pp 2 -z 3
# (tp2_r1 also dumps step 0's logits: its -tp traffic is not checked, and the dump's gather adds to it.)
case_tp tp2_r1 2 ref_ga1 1e-5 -tp 2 -r 1 -dump "$TMP/dump2.d"
for r in 2 3; do case_tp "tp2_r$r" 2 ref_ga1 1e-5 -tp 2 -r $r; done
case_tp tp4_z3_r3_offload2 4 ref_ga1 1e-5 -tp 4 -z 3 -r 3 -offload 2
case_tp tp2_bf16 2 ref_bf16 2e-2 -tp 2 -p bf16
# A bf16 model file (version 5, as import_hf.py --bf16 writes): -tp 2 reads each shard's runs (a row's
# columns of the row-parallel projections, q, k and v's rows) through bf16 scratch, one rank reads whole
# tensors; both then train alike. The file is $MODEL rounded to bf16 (nearest even). 2e-5: from these
# rounded weights fcb's small entries carry the reordered sums' error relatively further than elsewhere
# (how far depends on the CPU's vector width under -march=native); a wrong shard is off by far more.
$PYTHON - "$MODEL" "$TMP/model_v5.bin" <<'PY'
import sys, numpy as np
h = np.fromfile(sys.argv[1], dtype=np.int32, count=256)
u = np.fromfile(sys.argv[1], dtype=np.uint32, offset=1024).astype(np.uint64)
h[1] = 5
with open(sys.argv[2], "wb") as f:
    f.write(h.tobytes())
    f.write(((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes())
PY
train 1 "$TMP/ref_v5" -ga 1 -e "$TMP/model_v5.bin" || t_fail reference "one-rank run from the bf16 file failed"
case_tp tp2_from_bf16_file 2 ref_v5 2e-5 -tp 2 -e "$TMP/model_v5.bin"
# -sp 1: the LayerNorms and residual adds on each rank's rows; reduce-scatter and all-gather instead of
# all-reduce; the LayerNorms' parameter gradients summed over the group.
case_tp sp_tp2 2 ref_ga1 1e-5 -tp 2 -sp 1
case_tp sp_tp4_z3 4 ref_ga1 1e-5 -tp 4 -sp 1 -z 3
case_tp sp_tp2_dp2_z2_r2 4 ref_ga2 1e-5 -tp 2 -sp 1 -z 2 -r 2
case_tp sp_tp2_r3 2 ref_ga1 1e-5 -tp 2 -sp 1 -r 3
case_tp sp_tp2_pp2 4 ref_ga2 1e-5 -tp 2 -sp 1 -pp 2 -ga 2
case_tp sp_tp2_bf16 2 ref_bf16 2e-2 -tp 2 -sp 1 -p bf16
# Traffic in the tensor group per micro-batch, S = B*T*C*x bytes of one activation, ring collectives (an
# all-reduce sends 2(T-1)/T of its bytes, a reduce-scatter or all-gather (T-1)/T):
#   -sp 0: per block 4 all-reduces of S (2 forward, 2 backward), 5 with -r 3 (the recomputed attention
#          projection); 1 more on the stage with the embeddings (the vocabulary-parallel lookup's sum) and 1
#          on the stage with the head (d(lnf), a sum of the ranks' vocabulary columns' products);
#   -sp 1: per block 4 reduce-scatters of S (5 with -r 3) and 4 all-gathers of S (+2 with -r 2 or 3: the
#          recomputed LayerNorms), 2 all-reduces of a LayerNorm's 2C gradients; plus, with the head and the
#          embeddings on the stage, 2 all-gathers of S (lnf, the encoder's gradient), 1 all-reduce of 2C and
#          2 reduce-scatters of S (the lookup and d(lnf), as the two all-reduces above);
#   both:  on the stage with the head, the vocabulary-parallel cross-entropy's all-reduce (max) of B*T fp32
#          and all-gather of every rank's 3 B*T fp32 (two-float normalizer and target logit).
# Nothing else moves in the tensor group: the logits (B*T x Vp) never do.
$PYTHON - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
def check(run, tp, ga, blocks, r=0, sp=0, stages=1, dp=1, B=2, T=32, C=64, x=4):
    S, ring, N = B * T * C * x, (tp - 1) / tp, B * T
    recs = [json.loads(l) for l in open("%s/%s/log.jsonl" % (d, run))]
    rows = [r["tp_comm_bytes"] for r in recs if "tp_comm_bytes" in r]
    bad = []
    for rank in range(tp * dp * stages):
        stage = rank // (tp * dp)
        enc, head = int(stage == 0), int(stage == stages - 1)
        if sp:
            want = {"allgather": blocks * (4 + (2 if r >= 2 else 0)) + enc + head,
                    "reduce_scatter": blocks * (4 + (r == 3)) + enc + head}
            want = {k: ga * n * ring * S for k, n in want.items()}
            want["allreduce"] = ga * ((2 * blocks + head) * 2 * ring * 2 * C * x + head * 2 * ring * N * 4)
        else:
            want = {"allreduce": ga * ((blocks * (4 + (r == 3)) + enc + head) * 2 * ring * S + head * 2 * ring * N * 4),
                    "allgather": 0}
        want["allgather"] += ga * head * ring * tp * 3 * N * 4
        bad += ["step %d rank %d: %s %d, expected %d" % (i, rank, k, row.get(k, [0] * (rank + 1))[rank], v)
                for i, row in enumerate(rows) for k, v in want.items() if row.get(k, [0] * (rank + 1))[rank] != v]
        bad += ["step %d rank %d: %s %d, expected 0" % (i, rank, k, vals[rank])
                for i, row in enumerate(rows) for k, vals in row.items() if k not in want and vals[rank] != 0]
    if len(rows) != 6: bad.append("%d tp_comm_bytes records" % len(rows))
    print("ok tp_traffic_%s" % run if not bad else "FAIL tp_traffic_%s: %s" % (run, "; ".join(bad[:3])))
    return not bad
ok = check("tp2", 2, 1, 2) & check("tp4", 4, 1, 2) & check("tp2_r3", 2, 1, 2, r=3) & check("tp2_pp2", 2, 2, 1, stages=2)
ok &= check("sp_tp2", 2, 1, 2, sp=1) & check("sp_tp4_z3", 4, 1, 2, sp=1) & check("sp_tp2_r3", 2, 1, 2, r=3, sp=1)
ok &= check("sp_tp2_dp2_z2_r2", 2, 1, 2, r=2, sp=1, dp=2)
# Between pipeline stages each rank sends its own rows only: half of what -sp 0 sends at -tp 2.
sends = [[r["comm_bytes"]["send"] for r in map(json.loads, open("%s/%s/log.jsonl" % (d, run))) if "comm_bytes" in r]
         for run in ("tp2_pp2", "sp_tp2_pp2")]
halved = len(sends[0]) == 6 and sends[0] == [[2 * v for v in row] for row in sends[1]] and min(sends[1][0]) > 0
print("ok sp_pipeline_sends_own_rows" if halved else "FAIL sp_pipeline_sends_own_rows: %s vs %s" % (sends[0][:1], sends[1][:1]))
ok &= halved
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] || FAILED=1
# Each rank's bytes per memory category, and its data-parallel group's bytes per collective, are ZeRO's
# table's for its shard (zero_check.py; the tensor group's traffic is checked above).
for z in 1 2 3; do $PYTHON tests/tools/zero_check.py "tp2_dp2_z$z" "$TMP/tp2_dp2_z$z/log.jsonl" || FAILED=1; done
t_check tp_announced "grep -q 'x 2 tensor ranks' '$TMP/tp2.txt'"
t_check tp_logged "grep -q '\"tp\": 2' '$TMP/tp2/log.jsonl'"

# Checkpoints: saved at -tp 2 -pp 2 -z 3 after step 3 (of 6), resumed under other layouts; each ends where
# the one-rank run does.
train 4 "$TMP/saved" -tp 2 -pp 2 -z 3 -ga 2 -n 3 || t_fail tp_checkpoint "run failed: $(grep -m1 error "$TMP/saved.txt")"
resume_as() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    mkdir -p "$TMP/$name" && cp -r "$TMP/saved/ckpt_000003" "$TMP/$name/"
    cp "$TMP/saved/log.jsonl" "$TMP/$name/log.jsonl"
    train "$np" "$TMP/$name" -y 1 "$@" || { t_fail "$name" "resume failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    grep -q 'resumed from .*ckpt_000003 at step 3' "$TMP/$name.txt" || { t_fail "$name" "did not resume at step 3"; return; }
    compare_runs "$name" "$TMP/$name" "$TMP/ref_ga2" 1e-5
}
resume_as tp_resume_on_one_rank 1 -ga 2
resume_as tp_resume_at_tp4 4 -tp 4 -ga 2
resume_as tp_resume_at_tp2_dp2_z1 4 -tp 2 -z 1

# The logits are each rank's vocabulary columns, (B*T, Vp/tp): doubling the vocabulary (Vp 512 -> 1024) adds
# B*T * 512/tp * 4 bytes of activations on every rank, where a whole-vocabulary head would add B*T * 512 * 4.
# The V=500 runs are ref_ga1, tp2 and tp4 above (the memory record does not depend on -x).
./train_gpt_cpu -e L2C64H4V1000T64 -i "$TMP/train.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/init_v1000" >/dev/null 2>&1
MODEL_V1000="$TMP/init_v1000/ckpt_000000/model.bin"
for tp in 1 2 4; do
    [ "$tp" -gt 1 ] && tpf=(-tp "$tp") || tpf=()
    train "$tp" "$TMP/mem_tp${tp}_v1000" -e "$MODEL_V1000" -x 1 "${tpf[@]}" || t_fail "logits_per_rank_tp$tp" "run failed"
done
$PYTHON - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
def acts(run):
    return [r["memory"]["activations"] for r in map(json.loads, open("%s/%s/log.jsonl" % (d, run))) if "memory" in r]
for tp in (1, 2, 4):
    small, big = acts({1: "ref_ga1", 2: "tp2", 4: "tp4"}[tp]), acts("mem_tp%d_v1000" % tp)
    want = 2 * 32 * (1024 - 512) // tp * 4
    got = [b - a for a, b in zip(small, big)]
    ok = len(got) == tp and all(g == want for g in got)
    print("ok logits_per_rank_tp%d" % tp if ok else "FAIL logits_per_rank_tp%d: activations grew by %s, expected %d per rank" % (tp, got, want))
PY
[ $? -eq 0 ] || FAILED=1

# -dump's logits (B*T x V) are whole rows under -tp too: each rank's columns, assembled (ref_ga1's and
# tp2_r1's dumps).
$PYTHON - "$TMP" <<'PY'
import sys, numpy as np
d = sys.argv[1]
a, b = (np.fromfile("%s/dump%d.d/logits0.f32" % (d, k), dtype=np.float32) for k in (1, 2))
ok = a.size == 2 * 32 * 500 and a.size == b.size and np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max())
print("ok tp_dump_logits" if ok else "FAIL tp_dump_logits: sizes %d %d, max diff %g" % (a.size, b.size, np.abs(a - b).max() if a.size == b.size else -1))
PY
[ $? -eq 0 ] || FAILED=1

# Bad layouts: one line each.
"${MPIRUN[@]}" -np 3 ./train_gpt_cpu "${base[@]}" -tp 3 > /dev/null 2> "$TMP/heads.err"
t_check tp_must_divide_heads "grep -q 'error: -tp 3 does not divide the model.s 4 attention heads' '$TMP/heads.err'"
./train_gpt_cpu "${base[@]}" -sp 1 > /dev/null 2> "$TMP/sp.err"
t_check sp_needs_tp "grep -q 'error: -sp 1 splits the rows over the tensor group: it needs -tp 2 or more' '$TMP/sp.err'"
./train_gpt_cpu "${base[@]}" -tp 2 > /dev/null 2> "$TMP/ranks.err"
t_check tp_must_divide_ranks "[ \$(wc -l < '$TMP/ranks.err') -eq 1 ] && grep -q 'error: -tp 2 does not divide the 1 ranks' '$TMP/ranks.err'"
# A -tp that does not split the padded vocabulary into equal multiples of 8 rows (Vp 128 over 3 ranks):
# one line, from the real run and from --estimate alike.
$PYTHON scripts/make_shard.py -o "$TMP/v100.bin" -n 2000 -V 100 --seed 7 >/dev/null || t_fail shard "make_shard failed"
vocab_err='error: -tp 3 does not split the padded vocabulary of 128 rows into equal multiples of 8 (it needs a multiple of 24)'
"${MPIRUN[@]}" -np 3 ./train_gpt_cpu -e L1C48H3V100T64 -i "$TMP/v100.bin" -j "" -b 2 -t 32 -x 1 -tp 3 -o "$TMP/v100" > /dev/null 2> "$TMP/vocab.err"
t_check tp_must_split_vocab "grep -q '$vocab_err' '$TMP/vocab.err'"   # every rank's line, mpirun's after them
./train_gpt_cpu -e L1C48H3V100T64 -b 2 -t 32 -tp 3 --estimate -w 3 > /dev/null 2> "$TMP/vocab_est.err"
t_check tp_must_split_vocab_estimate "[ \$(wc -l < '$TMP/vocab_est.err') -eq 1 ] && grep -q '$vocab_err' '$TMP/vocab_est.err'"
t_finish
