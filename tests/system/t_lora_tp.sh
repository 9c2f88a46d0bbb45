#!/usr/bin/env bash
# -lora with -tp and -sp (core/model/lora.c's cuts, core/model/lora_steps.c): a column-parallel layer's B is
# cut by rows as its weight is (Llama's q|k|v and gate|up blocks, GPT-2's qkv sections, kv-head copies
# included), its A whole; a row-parallel layer's A by columns, its B whole. Against one rank from the same
# base, over 8 steps (fp32):
#   - losses and gradient norms within 1e-5, and the final adapters.bin (whole adapters at any -tp) within
#     1e-5 per element: GPT-2 at -tp 2, -tp 2 -sp 1, -tp 2 with 2 replicas (-z 2); a Llama shape with fewer kv
#     heads than heads and than tensor ranks (each kv head copied) at -tp 2 and -tp 2 -sp 1 -r 3; GPT-2 with
#     -lora-dropout 0.1 at -tp 2;
#   - the adapters' traffic in the tensor group: one (B*T, R) all-reduce per adapted target, block and
#     micro-batch in the backward, on top of t_tp.sh's formulas;
#   - a checkpoint written at -tp 2 resumes on one rank (and one at -tp 2 x 2 replicas on one rank with
#     -ga 2) within 1e-5, and at -tp 2 bit for bit;
#   - -lora-init of trained adapters (B nonzero) at -tp 2: step 0's loss, logits and every adapter's gradient
#     equal one rank's within 1e-5; from their PEFT folder (-lora-init DIR) the adapter file's, bit for bit.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
mpi_or_skip t_lora_tp
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 3 >/dev/null || t_fail shard "make_shard failed"
init_model L2C64H4V512T64 "$TMP/data.bin"
llama=llama:L2,C64,H4,K1,F96,V512,T64
base=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -x 8 -l 1e-2 -v 0 -s 0 -lora 4 -lora-alpha 8)
gpt2=(-e "$MODEL")
run() {   # ranks, name, flags...: trains into $TMP/name, or fails the check `name`
    local np=$1 name=$2; shift 2
    train "$np" "$TMP/$name" "$@" || { t_fail "$name" "run failed: $(grep -m1 -i error "$TMP/$name.txt")"; return 1; }
}
same_adapters() {   # name, adapters.bin, reference adapters.bin[, tolerance]: same header, every value within 1e-5
    py_check "$1" "$2" "$3" "${4:-1e-5}" <<'PY'
import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
tol = float(sys.argv[3])
same_head = a.size == b.size and (a[:256].view(np.int32) == b[:256].view(np.int32)).all()
err = np.abs(a[256:] - b[256:]).max() if same_head else float("inf")
print("ok" if same_head and err <= tol and np.abs(b[256:]).max() > 1e-2 else "header or size differs, or worst value off by %.3g" % err)
PY
}
case_tp() {   # name, ranks, reference, flags...: the log and the final adapters against the reference's
    local name=$1 np=$2 ref=$3 tol=${ADAPTER_TOL:-1e-5}; shift 3
    run "$np" "$name" "$@" || return
    compare_out log "$name" "$TMP/$name/log.jsonl" "$TMP/$ref/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm ||
        { t_fail "$name" "$(grep FAIL <<< "$CMP_OUT" | cut -c1-300)"; return; }
    same_adapters "${name}_adapters" "$TMP/$name/ckpt_000008/adapters.bin" "$TMP/$ref/ckpt_000008/adapters.bin" "$tol"
    t_ok "$name"
}
run 1 g_ref "${gpt2[@]}" -ga 1 || t_fail reference "one-rank run failed"
run 1 g_ref_ga2 "${gpt2[@]}" -ga 2 || t_fail reference "one-rank run failed"
run 1 l_ref -e $llama || t_fail reference "one-rank Llama run failed"
case_tp g_tp2 2 g_ref "${gpt2[@]}" -tp 2
case_tp g_tp2_sp 2 g_ref "${gpt2[@]}" -tp 2 -sp 1
case_tp g_tp2_dp2_z2 4 g_ref_ga2 "${gpt2[@]}" -tp 2 -z 2 -n 4
case_tp l_tp2 2 l_ref -e $llama -tp 2 -n 4
case_tp l_tp2_sp_r3 2 l_ref -e $llama -tp 2 -sp 1 -r 3
# Dropout: a row-parallel target's shard of the input draws its columns' place in one rank's mask (drawn at
# column 0 instead, the losses part by 2e-5 at step 1 and 1e-3 by step 5). The dropped gradients carry the
# row-parallel sums' other rounding further: the adapters within 1e-4 after 8 steps.
run 1 g_drop_ref "${gpt2[@]}" -ga 1 -lora-dropout 0.1 || t_fail reference "one-rank dropout run failed"
ADAPTER_TOL=1e-4 case_tp g_drop_tp2 2 g_drop_ref "${gpt2[@]}" -tp 2 -lora-dropout 0.1
# The tensor group's bytes per step: t_tp.sh's (blocks: 4 all-reduces of (B*T, C), or reduce-scatters and
# all-gathers under -sp; the vocabulary-parallel ends) but for -sp's sums of the LayerNorms' gradients,
# which the frozen base has none of, and the adapters' all-reduce of (B*T, R) per target.
py_check lora_tp_traffic "$TMP" <<'PY'
import json, sys
def rows(run):
    return [r["tp_comm_bytes"] for r in map(json.loads, open("%s/%s/log.jsonl" % (sys.argv[1], run))) if "tp_comm_bytes" in r]
B, T, C, R, x, blocks, targets, ring = 2, 32, 64, 4, 4, 2, 4, 0.5
N, S = B * T, B * T * C * x
lora = blocks * targets * 2 * ring * N * R * x
want = {"g_tp2": {"allreduce": (4 * blocks + 2) * 2 * ring * S + 2 * ring * N * 4 + lora, "allgather": ring * 2 * 3 * N * 4},
        "g_tp2_sp": {"allreduce": 2 * ring * N * 4 + lora,
                     "reduce_scatter": (4 * blocks + 2) * ring * S, "allgather": (4 * blocks + 2) * ring * S + ring * 2 * 3 * N * 4}}
bad = ["%s step %d rank %d: %s %d, expected %d" % (run, i, rank, k, row.get(k, [0, 0])[rank], v)
       for run, w in want.items() for i, row in enumerate(rows(run)) for rank in (0, 1)
       for k, v in list(w.items()) + [(k, 0) for k in row if k not in w] if row.get(k, [0, 0])[rank] != v]
print("ok" if not bad and all(len(rows(r)) == 8 for r in want) else "; ".join(bad[:3]) or "not 8 records")
PY
# Resume: the checkpoint of step 4 at -tp 2 on one rank and at -tp 2 again; -tp 2 x 2 replicas' on one rank.
resume() {   # name, ranks, from run, flags...: must resume at step 4 (-y 1 starts at 0 without a checkpoint)
    local name=$1 np=$2 from=$3; shift 3
    rm -rf "$TMP/$name" && cp -r "$TMP/$from" "$TMP/$name" && rm -rf "$TMP/$name/ckpt_000008" &&
        train "$np" "$TMP/$name" -y 1 "$@" && grep -q "^resumed from .*ckpt_000004 at step 4" "$TMP/$name.txt" ||
        { t_fail "$name" "no resume at step 4: $(grep -m1 -iE 'error|resumed' "$TMP/$name.txt")"; return 1; }
}
resume l_tp2_on_one 1 l_tp2 -e $llama &&
    compare_py log l_resume_tp2_on_one_rank "$TMP/l_tp2_on_one/log.jsonl" "$TMP/l_ref/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm
resume g_dp2_on_one 1 g_tp2_dp2_z2 "${gpt2[@]}" -ga 2 &&
    compare_py log g_resume_tp2_dp2_on_one_rank "$TMP/g_dp2_on_one/log.jsonl" "$TMP/g_ref_ga2/log.jsonl" --steps 8 --tol 1e-5 --key loss --key grad_norm
resume l_tp2_again 2 l_tp2 -e $llama -tp 2
bad=""
[ "$(fields "$TMP/l_tp2/log.jsonl" | wc -l)" = 8 ] || bad="not 8 steps in l_tp2's log"
diff <(fields "$TMP/l_tp2_again/log.jsonl") <(fields "$TMP/l_tp2/log.jsonl") > /dev/null || bad="losses or norms differ"
for f in adapters.bin state_rank0.bin state_rank1.bin; do
    cmp -s "$TMP/l_tp2_again/ckpt_000008/$f" "$TMP/l_tp2/ckpt_000008/$f" || bad="$bad $f differs"
done
t_check l_resume_tp2_bit_exact "[ -z '$bad' ]" "$bad"
# -lora-init of the trained adapters (B nonzero): step 0 dumped on one rank and at -tp 2.
base=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 -v 0 -lora 4 -lora-alpha 8 -lora-init "$TMP/l_ref/ckpt_000008/adapters.bin")
run 1 init_one -e $llama -dump "$TMP/init_one.d"
run 2 init_tp2 -e $llama -tp 2 -dump "$TMP/init_tp2.d"
py_check lora_init_tp2_step0 "$TMP/init_one.d" "$TMP/init_tp2.d" <<'PY'
import sys, numpy as np
one, tp = sys.argv[1:3]
f = lambda d, n: np.fromfile("%s/%s" % (d, n), dtype=np.float32)
rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
loss = [float(open(d + "/loss0.txt").read().split()[0]) for d in (one, tp)]
g1, g2 = f(one, "grads0.f32")[256:], f(tp, "grads0.f32")[256:]
nz = np.flatnonzero(g1)   # the adapters' gradients: the frozen base's are zeros
errs = {"loss": abs(loss[0] - loss[1]) / abs(loss[0]), "logits": rel(f(tp, "logits0.f32"), f(one, "logits0.f32")),
        "adapter grads": np.abs(g2 - g1).max() / np.abs(g1).max()}
ok = g1.size == g2.size and nz.size > 0 and all(e <= 1e-5 for e in errs.values())
print("ok" if ok else "relative errors %s" % errs)
PY
# The same for a PEFT folder (-lora-init DIR) at -tp 2: GPT-2's trained adapters exported by export_hf.py
# --adapter give the step-0 logits and gradients of their adapter file, bit for bit.
$PYTHON scripts/export_hf.py "$MODEL" "$TMP/g_peft" --adapter "$TMP/g_ref/ckpt_000008/adapters.bin" > "$TMP/peft.txt" 2>&1 ||
    t_fail peft_export "$(tail -1 "$TMP/peft.txt")"
base=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 -v 0 -lora 4 -lora-alpha 8 "${gpt2[@]}" -tp 2)
run 2 init_file_tp2 -lora-init "$TMP/g_ref/ckpt_000008/adapters.bin" -dump "$TMP/init_file_tp2.d"
run 2 init_dir_tp2 -lora-init "$TMP/g_peft" -dump "$TMP/init_dir_tp2.d"
t_check lora_init_peft_folder_tp2_is_the_files "cmp -s $TMP/init_file_tp2.d/logits0.f32 $TMP/init_dir_tp2.d/logits0.f32 &&
    cmp -s $TMP/init_file_tp2.d/grads0.f32 $TMP/init_dir_tp2.d/grads0.f32 && [ -s $TMP/init_dir_tp2.d/grads0.f32 ]" \
    "$(grep -m1 -i error "$TMP/init_dir_tp2.txt")"
t_finish
