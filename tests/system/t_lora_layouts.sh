#!/usr/bin/env bash
# -lora under the layouts that keep whole tensors: -pp with each schedule, -offload 1 and 2, -nvme, -dpu;
# and -pp with -tp or with -z 3.
# - every layout follows one rank (-ga matching) within 1e-5 in losses, norms and adapters; zb gives 1f1b's
#   bits, -offload 1 and 2 those without offload, and -nvme -offload's (a rank whose ZeRO pieces hold frozen
#   tensors only holds no state: its store is empty);
# - -dpu with LoRA lands each update one step late as scripts/reference.py -dpu does, and a pipeline with
#   -offload 1 -dpu 1 follows it;
# - a pipeline's checkpoint holds every stage's adapters in adapters.bin: -lora-init FILE under -pp writes
#   FILE back bit for bit; it resumes bit for bit under its own layout, and across layouts on one rank, on 2
#   data-parallel ranks with -offload 2 -nvme and under the interleaved schedule (one rank's checkpoint too).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip lora_layouts
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 3 >/dev/null
init_model L4C64H4V512T64 "$TMP/data.bin"   # 4 blocks: 2 stages x 2 virtual stages under interleaving
base=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-2 -lora 4 -lora-alpha 8 -x 4 -n 2)
ck=ckpt_000004
ran() {   # name, ranks, out dir, flags...: train, a failure named
    local name=$1; shift
    train "$@" || t_fail "$name" "exited non-zero: $(grep -m1 error "$2.txt")"
}
# Losses and norms of every step and the adapters at step 4 within 1e-5 (relative; the adapters' values
# 1e-5 (1 + |b|)); the adapter files must also be those of a trained run, not zeros.
near() {   # name, run dir a, run dir b[, adapter file of a, of b]
    py_check "$1" "$2/log.jsonl" "$3/log.jsonl" "${4:-$2/$ck/adapters.bin}" "${5:-$3/$ck/adapters.bin}" <<'PY'
import json, sys, numpy as np
def steps(p):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r and "grad_norm" in r}
la, lb = steps(sys.argv[1]), steps(sys.argv[2])
a, b = (np.fromfile(p, dtype=np.float32)[256:].astype(np.float64) for p in sys.argv[3:5])
bad = [s for s in lb if s not in la or any(abs(x - y) > 1e-5 * abs(y) for x, y in zip(la[s], lb[s]))]
if not lb or set(la) != set(lb): print("steps %s, the reference's %s" % (sorted(la), sorted(lb)))
elif bad: print("steps %s differ: %s vs %s" % (bad, [la[s] for s in bad], [lb[s] for s in bad]))
elif a.size != b.size or not b.any(): print("adapters: %d and %d values, the reference's all zero: %s" % (a.size, b.size, not b.any()))
else:
    err = (np.abs(a - b) / (1 + np.abs(b))).max()
    print("ok" if err <= 1e-5 else "adapters differ by %.3g" % err)
PY
}
# The same bits: logged numbers, adapters.bin and every state file at step 4.
same() {   # name, run dir a, run dir b
    local bad="" f
    [ -n "$(fields "$2/log.jsonl")" ] || bad="no steps in $2/log.jsonl"
    [ -z "$bad" ] && ! diff <(fields "$2/log.jsonl") <(fields "$3/log.jsonl") > /dev/null && bad="losses or norms differ"
    for f in "$2/$ck"/adapters.bin "$2/$ck"/state_rank*.bin; do
        [ -z "$bad" ] && ! cmp -s "$f" "$3/$ck/$(basename "$f")" && bad="$(basename "$f") differs or is missing"
    done
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad"; fi
}

ran one 1 "$TMP/one" -ga 4
ran offload1 1 "$TMP/offload1" -ga 4 -offload 1
same lora_offload1_bits_equal_one_rank "$TMP/offload1" "$TMP/one"
for ps in 1f1b zb interleaved; do
    ran "pp_$ps" 2 "$TMP/pp_$ps" -ga 4 -pp 2 -ps "$ps"
    near "lora_pp2_${ps}_equals_one_rank" "$TMP/pp_$ps" "$TMP/one"
done
same lora_pp2_zb_bits_equal_1f1b "$TMP/pp_zb" "$TMP/pp_1f1b"
ran dp 2 "$TMP/dp" -ga 2 -z 2
near lora_dp2_z2_equals_one_rank "$TMP/dp" "$TMP/one"
# The ranks reduce-scatter the adapters' gradients and all-gather the adapters they updated, never the frozen
# base (each unit's trained section, cut evenly): an all-gather whose buffer is the adapters' fp32 bytes at
# every step (a ring sends (N - 1)/N of it per rank), no all-reduce, no broadcast.
py_check lora_dp2_sends_adapters_not_base "$TMP/dp/log.jsonl" "$TMP/dp.txt" <<'PY'
import json, re, sys
trained = int(re.search(r"\((\d+) trained", open(sys.argv[2]).read()).group(1))
steps = [r["comm_bytes"] for r in map(json.loads, open(sys.argv[1])) if "comm_bytes" in r]
bad = [c for c in steps if sum(c["allreduce"]) or sum(c["broadcast"]) or any(2 * b != 4 * trained for b in c["allgather"])]
print("ok" if steps and not bad else "%d records, %s (adapters: %d bytes)" % (len(steps), bad[:1], 4 * trained))
PY
ran dp_offload2 2 "$TMP/dp_offload2" -ga 2 -z 2 -offload 2
same lora_dp2_offload2_bits_equal_no_offload "$TMP/dp_offload2" "$TMP/dp"
ran dp_nvme 2 "$TMP/dp_nvme" -ga 2 -z 2 -offload 2 -nvme "$TMP/nvme"
same lora_dp2_nvme_bits_equal_offload2 "$TMP/dp_nvme" "$TMP/dp_offload2"
# The dimensions together on 4 ranks: stages with tensor ranks (the adapters cut inside each stage), and
# stages with -z 3 replicas (each stage's frozen base sharded across its replicas).
# -tp's row-parallel sums round in another order than one rank, which Adam's first steps bring to 3e-5 in
# a few adapter values here: the pipeline is held to -tp 2 alone.
ran tp 2 "$TMP/tp" -ga 4 -tp 2
ran pp_tp 4 "$TMP/pp_tp" -ga 4 -pp 2 -tp 2
near lora_pp2_tp2_equals_tp2 "$TMP/pp_tp" "$TMP/tp"
ran pp_z3 4 "$TMP/pp_z3" -ga 2 -pp 2 -z 3
near lora_pp2_z3_dp2_equals_one_rank "$TMP/pp_z3" "$TMP/one"

# -lora-init under a pipeline: each stage reads its own layers (interleaved: blocks 0 and 2 on stage 0) and
# writes them back into adapters.bin in place.
trained=$TMP/one/$ck/adapters.bin   # a nonzero B
ran init_pp 2 "$TMP/init_pp" -ga 4 -pp 2 -ps interleaved -lora-init "$trained" -x 0
t_check lora_init_pp2_checkpoint_is_the_file "cmp -s '$trained' '$TMP/init_pp/ckpt_000000/adapters.bin'" \
    "$(cmp "$trained" "$TMP/init_pp/ckpt_000000/adapters.bin" 2>&1)"

# -dpu 1 from that adapter file: against the reference's delayed update, then a pipeline against one rank.
dpu=(-ga 2 -x 3 -n 0 -lora-init "$trained" -offload 1 -dpu 1)
ran dpu 1 "$TMP/dpu" "${dpu[@]}"
$PYTHON scripts/reference.py -e "$MODEL" -i "$TMP/data.bin" -b 2 -t 32 -ga 2 -x 3 -l 1e-2 -lora 4 -lora-alpha 8 \
    -lora-init "$trained" -dpu 1 --quiet -o "$TMP/ref" > "$TMP/ref.txt" 2>&1 || t_fail dpu_reference "$(tail -1 "$TMP/ref.txt")"
last=ckpt_000003/adapters.bin
near lora_dpu_equals_reference "$TMP/dpu" "$TMP/ref" "$TMP/dpu/$last" "$TMP/ref/lora_final.bin"
ran dpu_pp 2 "$TMP/dpu_pp" "${dpu[@]}" -pp 2
near lora_pp2_offload1_dpu_equals_one_rank "$TMP/dpu_pp" "$TMP/dpu" "$TMP/dpu_pp/$last" "$TMP/dpu/$last"

# Step 2's checkpoint of a run, resumed (the later one removed; the log's later steps are dropped on resume).
resume() {   # name, ranks, new run dir, the run dir whose checkpoint it resumes, flags...: 0 when it resumed
    local name=$1 np=$2 dir=$3 src=$4; shift 4
    { cp -r "$src" "$dir" && rm -r "$dir/$ck"; } 2> /dev/null || { t_fail "$name" "no checkpoint at step 4 in $src"; return 1; }
    train "$np" "$dir" "$@" -y 1 && grep -q "resumed from .*ckpt_000002" "$dir.txt" && return 0
    t_fail "$name" "$(grep -m1 error "$dir.txt" || echo "no resume from step 2")"
    return 1
}
resume lora_pp2_resume_bit_exact 2 "$TMP/rs_pp" "$TMP/pp_1f1b" -ga 4 -pp 2 &&
    same lora_pp2_resume_bit_exact "$TMP/rs_pp" "$TMP/pp_1f1b"
resume lora_pp2_checkpoint_resumed_on_one_rank 1 "$TMP/rs_one" "$TMP/pp_1f1b" -ga 4 &&
    near lora_pp2_checkpoint_resumed_on_one_rank "$TMP/rs_one" "$TMP/one"
resume lora_pp2_checkpoint_resumed_on_dp2_nvme 2 "$TMP/rs_dp" "$TMP/pp_1f1b" -ga 2 -z 2 -offload 2 -nvme "$TMP/nvme_rs" &&
    near lora_pp2_checkpoint_resumed_on_dp2_nvme "$TMP/rs_dp" "$TMP/one"
resume lora_one_rank_checkpoint_resumed_interleaved 2 "$TMP/rs_il" "$TMP/one" -ga 4 -pp 2 -ps interleaved &&
    near lora_one_rank_checkpoint_resumed_interleaved "$TMP/rs_il" "$TMP/one"
t_finish
