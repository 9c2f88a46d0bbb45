#!/usr/bin/env bash
# Activation recompute (-r 0..3) on the CPU backend:
# - every level gives bit-identical losses, gradient norms, step-0 gradients and final parameters to -r 0,
#   in fp32 and bf16, and under ZeRO-3 on 2 ranks (whose gathered block serves the recompute too);
# - the activation bytes each level allocates equal an independent per-token formula from the shape
#   (tests/tools/recompute_check.py), and decrease with the level.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 30000 -V 512 --seed 9 >/dev/null
flags=(-e L3C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 48 -ga 2 -x 5 -l 2e-3 -c 0.1 -v 0 -s 0)
fields() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
same_run() {   # name, dir, reference dir
    t_check "$1" "[ -n \"\$(fields $3/log.jsonl)\" ] && diff <(fields $2/log.jsonl) <(fields $3/log.jsonl) >/dev/null &&
        cmp -s $2/d/grads0.f32 $3/d/grads0.f32 && cmp -s $2/ckpt_000005/model.bin $3/ckpt_000005/model.bin" "differs from -r 0"
}
for p in fp32 bf16; do
    for r in 0 1 2 3; do
        ./train_gpt_cpu "${flags[@]}" -p $p -r $r -o "$TMP/${p}_r$r" -dump "$TMP/${p}_r$r/d" > /dev/null 2>&1 || t_fail "run_${p}_r$r" "failed"
        [ $r -gt 0 ] && same_run "recompute_${p}_r${r}_bit_identical" "$TMP/${p}_r$r" "$TMP/${p}_r0"
    done
    $PYTHON tests/tools/recompute_check.py "activation_bytes_$p" "$TMP"/${p}_r{0,1,2,3}/log.jsonl || FAILED=1
done
if ! command -v mpirun >/dev/null 2>&1 || ! ldd ./train_gpt_cpu | grep -q libmpi; then
    t_missing recompute_zero3 MPI
    t_finish
fi
for r in 0 3; do
    mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np 2 ./train_gpt_cpu "${flags[@]}" -ga 1 -z 3 -r $r \
        -o "$TMP/z3_r$r" -dump "$TMP/z3_r$r/d" > /dev/null 2>&1 || t_fail "run_z3_r$r" "failed"
done
same_run recompute_zero3_np2_r3_bit_identical "$TMP/z3_r3" "$TMP/z3_r0"
t_finish
