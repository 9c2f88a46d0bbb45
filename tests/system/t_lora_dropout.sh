#!/usr/bin/env bash
# -lora-dropout P (core/model/lora.h): the mask is the reference's element for element (build/test_lora_dropout
# mask against scripts/reference.py's lora_dropout_keep); from adapters with a nonzero B, the trainer follows
# scripts/reference.py (float64, the same mask) within 1e-5 over 4 steps at P = 0.1 with -ga 2 (step-0 logits,
# the adapters' step-0 gradients, losses, norms, validation losses), on GPT-2 and a Llama shape (q, k and v each
# masked apart on their shared input); dropout changes training but not validation; -r 3 and a resume are bit
# for bit an uninterrupted -r 0 run's; two data-parallel ranks draw one rank's -ga 2 masks.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1   # tiny matrices: more threads only wait on each other (the bits do not depend on it)
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 3 >/dev/null

py_check mask_equals_reference build/test_lora_dropout <<'PY'
import importlib.util, subprocess, sys
import numpy as np
spec = importlib.util.spec_from_file_location("reference", "scripts/reference.py")
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
# (seed, position, layer, target, P, rows, cols): a seed and a position past 2^32 too.
for case in [(1337, 0, 0, 0, 0.1, 64, 96), ((5 << 32) + 3, (1 << 33) + 7, 11, 6, 0.5, 33, 17)]:
    out = subprocess.run([sys.argv[1], "mask"] + [str(v) for v in case], capture_output=True, check=True).stdout
    kept = np.frombuffer(out, np.float32).reshape(case[-2:]) != 0
    want = ref.lora_dropout_keep(*case)
    if not (kept == want).all() or want.all():
        sys.exit("case %s: %d of %d elements differ" % (case, (kept != want).sum(), want.size))
print("ok")
PY

# Adapters on every target with A and B uniform in +-0.2 (B nonzero: the adapters change step 0's logits).
adapters() {   # model file, adapter file, rank
    $PYTHON - "$@" <<'PY'
import sys
sys.path.append("scripts")
import numpy as np
import families, lora_file
cfg, _ = families.load_model(sys.argv[1])
R, rng = int(sys.argv[3]), np.random.default_rng(11)
a = lora_file.zero_adapter(cfg, R, 8000, 0, (1 << len(lora_file.targets(cfg))) - 1)
a.weights = {t.name: (rng.uniform(-0.2, 0.2, (cfg.L, R, t.IC)).astype(np.float32),
                      rng.uniform(-0.2, 0.2, (cfg.L, t.OC, R)).astype(np.float32)) for t in a.targets}
lora_file.write(sys.argv[2], a)
PY
}
# The runs' flags but -x, in FLAGS: family NAME's model and adapters, -ga GA, the seed under the flag SEED_FLAG
# (the trainer's -seed, the reference's --seed).
set_flags() {   # name, ga, seed flag
    FLAGS=(-e "$TMP/$1_init/ckpt_000000/model.bin" -i "$TMP/data.bin" -j "$TMP/data.bin" -v 2 -m 2 -b 2 -t 32 -ga "$2"
           -l 1e-3 "$3" 5 -lora 4 -lora-alpha 8 -lora-dropout 0.1 -lora-init "$TMP/$1.lora")
}
# One family: trainer and reference from the same model file and adapters, compared.
against_reference() {   # name, model spec
    local name=$1 model=$TMP/$1_init/ckpt_000000/model.bin
    ./train_gpt_cpu -e "$2" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/${name}_init" > /dev/null 2>&1
    adapters "$model" "$TMP/$name.lora" 4
    mkdir -p "$TMP/${name}_cd"
    set_flags "$name" 2 -seed
    ./train_gpt_cpu "${FLAGS[@]}" -x 4 -s 0 -o "$TMP/${name}_c" -dump "$TMP/${name}_cd" > "$TMP/${name}_c.txt" 2>&1 ||
        t_fail "${name}_trainer_run" "$(tail -1 "$TMP/${name}_c.txt")"
    set_flags "$name" 2 --seed
    $PYTHON scripts/reference.py "${FLAGS[@]}" -x 4 --quiet -o "$TMP/${name}_r" -dump "$TMP/${name}_rd" > "$TMP/${name}_r.txt" 2>&1 ||
        t_fail "${name}_reference_run" "$(tail -1 "$TMP/${name}_r.txt")"
    compare_py array "${name}_dropout_logits_step0" "$TMP/${name}_cd/logits0.f32" "$TMP/${name}_rd/logits0.f32" --tol 1e-5
    # grads0.f32: a header, the frozen base's zeros, then the adapters' gradients in the reference's order (each
    # target's A then B, stacked over layers): as many as the adapter file holds.
    py_check "${name}_dropout_adapter_grads_step0" "$TMP/${name}_cd/grads0.f32" "$TMP/${name}_rd/grads0.f32" "$TMP/$name.lora" <<'PY'
import os, sys
import numpy as np
c, r = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
n = os.path.getsize(sys.argv[3]) // 4 - 256
mine = c[-n:]
err = np.linalg.norm(mine - r) / np.linalg.norm(r) if r.size == n else np.inf
ok = not c[256:-n].any() and err < 1e-5
print("ok" if ok else "%d adapter gradients, the reference's %d, relative error %.3g" % (n, r.size, err))
PY
    compare_py log "${name}_dropout_vs_reference" "$TMP/${name}_c/log.jsonl" "$TMP/${name}_r/log.jsonl" --steps 4 --tol 1e-5 \
        --key loss --key grad_norm
    val_losses_match "${name}_dropout_val_losses_vs_reference" "$TMP/${name}_c/log.jsonl" "$TMP/${name}_r/log.jsonl"
}
against_reference gpt2 L2C64H4V512T64
against_reference llama llama:L2,C64,H4,K2,F96,V512,T64

# GPT-2: without dropout step 0 trains on other values (its loss differs) but validates the same (validation
# drops nothing); -r 3 recomputes the forward's masks, a resume draws the masks of its steps; two ranks of -ga 1
# draw one rank's -ga 2 masks.
set_flags gpt2 2 -seed
./train_gpt_cpu "${FLAGS[@]}" -x 4 -s 0 -lora-dropout 0 -o "$TMP/p0" > "$TMP/p0.txt" 2>&1
py_check dropout_trains_apart_validates_alike "$TMP/gpt2_c/log.jsonl" "$TMP/p0/log.jsonl" <<'PY'
import json, sys
drop, none = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
first = lambda log, key: next(r[key] for r in log if key in r and r["step"] == 0)
ok = first(drop, "loss") != first(none, "loss") and first(drop, "val_loss") == first(none, "val_loss")
print("ok" if ok else "step 0: losses %r %r, val losses %r %r" % (first(drop, "loss"), first(none, "loss"),
                                                                  first(drop, "val_loss"), first(none, "val_loss")))
PY
same_as_uninterrupted() {   # name, run directory
    t_check "$1" "[ -n \"\$(fields $TMP/gpt2_c/log.jsonl)\" ] && diff <(fields $TMP/gpt2_c/log.jsonl) <(fields $2/log.jsonl) >/dev/null" \
        "$(fields "$2/log.jsonl" | tail -1) vs $(fields "$TMP/gpt2_c/log.jsonl" | tail -1)"
}
./train_gpt_cpu "${FLAGS[@]}" -x 4 -s 0 -r 3 -o "$TMP/r3" > "$TMP/r3.txt" 2>&1
same_as_uninterrupted dropout_r3_equals_r0_bit_for_bit "$TMP/r3"
./train_gpt_cpu "${FLAGS[@]}" -x 2 -s 0 -n 2 -o "$TMP/half" > "$TMP/half.txt" 2>&1
./train_gpt_cpu "${FLAGS[@]}" -x 4 -s 0 -n 2 -o "$TMP/half" -y 1 > "$TMP/resumed.txt" 2>&1
same_as_uninterrupted dropout_resume_bit_for_bit "$TMP/half"
# P is recorded: a resume with another refuses it unless told, and the PEFT folder exported from the
# checkpoint's adapters carries it (lora_dropout, which PEFT applies when training goes on).
./train_gpt_cpu "${FLAGS[@]}" -lora-dropout 0.2 -x 6 -s 0 -o "$TMP/half" -y 1 > /dev/null 2> "$TMP/refused.err"
rc=$?
t_check dropout_resume_refuses_another_p "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/refused.err) -eq 1 ] && grep -q -- '-lora-dropout' $TMP/refused.err" \
    "$(cat "$TMP/refused.err")"
$PYTHON scripts/export_hf.py "$TMP/gpt2_init/ckpt_000000/model.bin" "$TMP/peft" --adapter "$TMP/half/ckpt_000004/adapters.bin" > /dev/null 2>&1
py_check dropout_exported_in_peft_config "$TMP/peft/adapter_config.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["lora_dropout"]
print("ok" if p == 0.1 else "lora_dropout %r" % p)
PY
if mpi_available; then
    set_flags gpt2 1 -seed
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${FLAGS[@]}" -x 4 -s 0 -o "$TMP/np2" > "$TMP/np2.txt" 2>&1
    compare_py log dropout_np2_equals_one_rank "$TMP/np2/log.jsonl" "$TMP/gpt2_c/log.jsonl" --steps 4 --tol 1e-6 --key loss --key grad_norm
else
    t_missing dropout_np2_equals_one_rank "MPI"
fi
t_finish
