#!/usr/bin/env bash
# -lora (core/model/lora.h): step 0 is the base model's bit for bit (B starts at zero), from a model file
# (GPT-2, fp32 and bf16) and from a Llama shape; the frozen base gets no gradient and the adapters do; bad
# input and the layouts not yet built with it end in one line. The adapters' gradients themselves are
# checked against the merged model in tests/unit/test_lora.c.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 3 >/dev/null
init_model L2C64H4V512T64 "$TMP/data.bin"
run() {   # dump dir, flags...
    local d=$1; shift
    ./train_gpt_cpu -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 -v 0 -dump "$TMP/$d" "$@" > "$TMP/$d.txt" 2>&1
}
same_step0() {   # name, base dump, lora dump
    if cmp -s "$TMP/$2/logits0.f32" "$TMP/$3/logits0.f32" && cmp -s "$TMP/$2/loss0.txt" "$TMP/$3/loss0.txt"; then t_ok "$1"
    else t_fail "$1" "logits or loss differ ($(tail -1 "$TMP/$3.txt"))"; fi
}
run gpt2 -e "$MODEL"
run gpt2_lora -e "$MODEL" -lora 4 -lora-alpha 8
same_step0 gpt2_step0_logits_are_the_base_models gpt2 gpt2_lora
# Per layer: qkv 4x64 + 192x4, proj 4x64 + 64x4, fc 4x64 + 256x4, fcproj 4x256 + 64x4: 4096.
t_check setup_line_names_the_adapters "grep -q 'L=2 C=64 NH=4 V=512 Vp=512 maxT=64 + LoRA r=4 scale 2 on qkv,proj,fc,fcproj (8192 trained, the base frozen)' '$TMP/gpt2_lora.txt'" \
    "$(head -1 "$TMP/gpt2_lora.txt")"
run gpt2_bf16 -e "$MODEL" -p bf16
run gpt2_bf16_lora -e "$MODEL" -p bf16 -lora 2 -lora-targets fcproj,qkv -lora-rslora 1
same_step0 gpt2_bf16_step0_logits_are_the_base_models gpt2_bf16 gpt2_bf16_lora
llama=llama:L2,C64,H4,K2,F96,V512,T64,qknorm
run llama -e $llama
run llama_lora -e $llama -lora 3 -lora-targets q,k,v,o,gate,up,down
same_step0 llama_step0_logits_are_the_base_models llama llama_lora
# grads0.f32 (llm.c's order: the base's tensors, then the adapters'): nothing for the frozen base, something
# for the adapters (B's gradient is nonzero from step 0).
py_check gpt2_frozen_base_no_gradient_adapters_some "$TMP/gpt2/grads0.f32" "$TMP/gpt2_lora/grads0.f32" <<'PY'
import sys, numpy as np
base = np.fromfile(sys.argv[1], dtype=np.float32)[256:]
lora = np.fromfile(sys.argv[2], dtype=np.float32)[256:]
n = base.size
ok = lora.size > n and not lora[:n].any() and lora[n:].any() and base.any()
print("ok" if ok else "base %d, adapters %d, frozen nonzero %d, adapters nonzero %d" % (n, lora.size - n, np.count_nonzero(lora[:n]), np.count_nonzero(lora[n:])))
PY
# -lora-init: adapters with a nonzero B on qkv and fcproj (rank 2, alpha 6: scale 3) from an adapter file,
# against the base model with W += scale B A folded in (GPT-2's llm.c file, fp32: the kinds stacked in order).
$PYTHON - "$MODEL" "$TMP/adapters.bin" "$TMP/merged.bin" <<'PY'
import sys, numpy as np
L, C, V, T, R, alpha = 2, 64, 512, 64, 2, 6.0
raw = np.fromfile(sys.argv[1], dtype=np.int32)
assert raw[1] == 3, "an fp32 model file"
w = np.fromfile(sys.argv[1], dtype=np.float32)[256:].copy()
sizes = [("wte", V * C), ("wpe", T * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C),
         ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C),
         ("fcb", L * 4 * C), ("fcprojw", L * 4 * C * C)]
at = dict(zip([n for n, _ in sizes], np.cumsum([0] + [s for _, s in sizes])[:-1]))
targets = [("qkvw", C, 3 * C), ("fcprojw", 4 * C, C)]   # (base matrix, in, out): targets qkv (bit 0), fcproj (bit 3)
rng = np.random.default_rng(7)
header = np.zeros(256, np.int32)
header[:8] = [20261130, 1, R, 2, L, 0b1001, int(alpha * 1000), 0]
body = []
for l in range(L):
    for name, n_in, n_out in targets:
        A = rng.uniform(-0.2, 0.2, (R, n_in)).astype(np.float32)
        B = rng.uniform(-0.2, 0.2, (n_out, R)).astype(np.float32)
        body += [A.ravel(), B.ravel()]
        W = w[at[name] + l * n_out * n_in: at[name] + (l + 1) * n_out * n_in].reshape(n_out, n_in)
        W += (alpha / R * (B.astype(np.float64) @ A.astype(np.float64))).astype(np.float32)
np.concatenate([header.view(np.float32)] + body).tofile(sys.argv[2])
np.concatenate([raw[:256].view(np.float32), w]).tofile(sys.argv[3])
PY
run merged -e "$TMP/merged.bin"
run from_file -e "$MODEL" -lora 2 -lora-alpha 6 -lora-targets qkv,fcproj -lora-init "$TMP/adapters.bin"
py_check lora_init_equals_merged_model "$TMP/merged" "$TMP/from_file" "$TMP/gpt2" <<'PY'
import sys, numpy as np
m, f, b = (np.fromfile(d + "/logits0.f32", dtype=np.float32) for d in sys.argv[1:4])
lm, lf = (float(open(d + "/loss0.txt").read().split()[0]) for d in sys.argv[1:3])
err = np.abs(m - f).max() / np.abs(m).max()
ok = m.size == f.size and err < 1e-5 and abs(lm - lf) < 1e-5 * abs(lm) and np.abs(m - b).max() > 1e-3
print("ok" if ok else "logits differ by %.3g (relative), losses %r %r" % (err, lm, lf))
PY
./train_gpt_cpu -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 3 -s 0 -v 0 -e "$MODEL" -lora 4 > "$TMP/train.txt" 2>&1
t_check lora_trains "[ $? -eq 0 ] && grep -q 'trained 3 steps' '$TMP/train.txt'" "$(tail -1 "$TMP/train.txt")"

# Data parallelism: every unit holds frozen tensors, so each is all-reduced and each rank takes its share of
# the adapters' gradients (zero.c); two ranks with -z 0, 1, 2 give one rank's -ga 2 losses and norms.
if mpi_available; then
    steps() { grep -o 'loss [0-9.]* | lr [^|]*| norm [0-9.]*' "$1"; }
    dp=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -x 3 -s 0 -v 0 -e "$MODEL" -lora 4 -lora-alpha 8)
    ./train_gpt_cpu "${dp[@]}" -ga 2 > "$TMP/dp1.txt" 2>&1
    for z in 0 1 2; do
        "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${dp[@]}" -z $z > "$TMP/dp2_z$z.txt" 2>&1
        t_check lora_np2_z${z}_equals_one_rank "[ -n \"\$(steps $TMP/dp1.txt)\" ] && diff <(steps $TMP/dp1.txt) <(steps $TMP/dp2_z$z.txt) >/dev/null" \
            "$(steps "$TMP/dp2_z$z.txt" | tail -1) vs $(steps "$TMP/dp1.txt" | tail -1)"
    done
else
    t_skip lora_data_parallel "no MPI"
fi

# Checkpoints hold the adapters (adapters.bin, the adapter file) and their AdamW state, not the base; the
# manifest names the base and its CRC-32. A resume continues bit for bit and refuses another base.
ck=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-2 -e "$MODEL" -lora 4 -lora-alpha 8 -n 2)
./train_gpt_cpu "${ck[@]}" -x 4 -o "$TMP/ck_all" > "$TMP/ck_all.txt" 2>&1
./train_gpt_cpu "${ck[@]}" -x 2 -o "$TMP/ck_half" > "$TMP/ck_half.txt" 2>&1
./train_gpt_cpu "${ck[@]}" -x 4 -o "$TMP/ck_half" -y 1 > "$TMP/ck_resumed.txt" 2>&1
a=$TMP/ck_all/ckpt_000004 b=$TMP/ck_half/ckpt_000004
crc=$($PYTHON -c 'import sys, zlib; print("%08x" % zlib.crc32(open(sys.argv[1], "rb").read()))' "$MODEL")
t_check lora_checkpoint_holds_adapters_not_base "[ \$(stat -c %s $a/adapters.bin) -eq \$((1024 + 8192 * 4)) ] && [ ! -e $a/model.bin ] &&
    grep -qF '\"base\": {\"model\": \"$MODEL\", \"crc32\": \"$crc\"}' $a/manifest.json" "$(ls "$a"); $(grep base "$a/manifest.json")"
t_check lora_resume_bit_exact "[ -n \"\$(fields $TMP/ck_all/log.jsonl)\" ] && diff <(fields $TMP/ck_all/log.jsonl) <(fields $TMP/ck_half/log.jsonl) >/dev/null &&
    cmp -s $a/adapters.bin $b/adapters.bin && cmp -s $a/state_rank0.bin $b/state_rank0.bin" "$(tail -1 "$TMP/ck_resumed.txt")"
./train_gpt_cpu -e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 0 -s 0 -seed 9 -o "$TMP/other" > /dev/null 2>&1
other=$TMP/other/ckpt_000000/model.bin

base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0)
expect_error() {   # name, regex the error must match, args...
    local name=$1 pattern=$2; shift 2
    timeout -k 5 60 ./train_gpt_cpu "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
    local lines; lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: .*$pattern" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err")"; fi
}
expect_error lora_unknown_target "-lora-targets q,fc: gpt2 has no target 'q' \(its targets: qkv,proj,fc,fcproj\)" "${base[@]}" -lora 2 -lora-targets q,fc
expect_error lora_llama_target_on_gpt2 "has no target 'gate'" "${base[@]}" -lora 2 -lora-targets gate
expect_error lora_target_twice "'fc' given twice" "${base[@]}" -lora 2 -lora-targets fc,fc
expect_error lora_rank_zero "-lora 0: the rank must be at least 1" "${base[@]}" -lora 0
expect_error lora_rank_too_large "-lora 65: larger than target qkv's layer \(192 x 64\)" "${base[@]}" -lora 65
expect_error lora_alpha_without_lora "-lora-alpha sets up LoRA's adapters: it needs -lora R" "${base[@]}" -lora-alpha 16
expect_error lora_targets_without_lora "-lora-targets sets up" "${base[@]}" -lora-targets fc
ckx=("${ck[@]}" -x 6 -o "$TMP/ck_half" -y 1)
expect_error lora_resume_refuses_another_base "checkpoint .*ckpt_000004 adapts the base $MODEL \(crc32 [0-9a-f]{8}\); -e $other is another \(crc32 [0-9a-f]{8}\)" "${ckx[@]}" -e "$other"
expect_error lora_resume_refuses_without_lora "a LoRA run's checkpoint \(adapters.bin\): resume it with -lora" \
    -i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-2 -e "$MODEL" -n 2 -x 6 -o "$TMP/ck_half" -y 1
init=(-lora 2 -lora-alpha 6 -lora-targets qkv,fcproj -lora-init "$TMP/adapters.bin")
expect_error lora_init_without_lora "-lora-init sets up" "${base[@]}" -lora-init "$TMP/adapters.bin"
expect_error lora_init_other_rank "rank 2, the run's -lora is 3" "${base[@]}" "${init[@]}" -lora 3
expect_error lora_init_other_targets "targets qkv,fcproj \(bits 9, 2 targets\), the run's -lora-targets are qkv,fc" "${base[@]}" "${init[@]}" -lora-targets qkv,fc
expect_error lora_init_other_alpha "alpha 6, the run's -lora-alpha is 2" "${base[@]}" "${init[@]}" -lora-alpha 2
expect_error lora_init_other_layers "2 layers, the model has 3" "${base[@]}" "${init[@]}" -e L3C64H4V512T64
head -c 2000 "$TMP/adapters.bin" > "$TMP/short.bin"
expect_error lora_init_short_file "2000 bytes, the run's adapters take" "${base[@]}" "${init[@]}" -lora-init "$TMP/short.bin"
expect_error lora_init_not_adapters "not an adapter file" "${base[@]}" "${init[@]}" -lora-init "$MODEL"
cp "$MODEL" "$TMP/moved.bin"   # the same base under another path: its bytes are what count
./train_gpt_cpu "${ck[@]}" -e "$TMP/moved.bin" -x 6 -o "$TMP/ck_half" -y 1 > "$TMP/moved.txt" 2>&1
t_check lora_resume_on_moved_base "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt_000004' '$TMP/moved.txt'" "$(tail -1 "$TMP/moved.txt")"
t_finish
