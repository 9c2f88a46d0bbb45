#!/usr/bin/env bash
# t_hf_llama.sh: scripts/export_hf.py and scripts/import_hf.py for the Llama family: LlamaForCausalLM
# (untied with llama3 RoPE, tied with linear RoPE), Qwen3ForCausalLM (q/k norms, head_dim != C/H) and
# Qwen2ForCausalLM (q/k/v biases). The models are trained a few steps first, by one rank and by the
# layouts -z 2 (Qwen2), -pp 2 (tied) and -tp 2 (Qwen3) (their consolidated model.bin); a trained GPT-2 of one
# rank and of -tp 2 round-trips bit for bit too. tests/tools/hf_llama_check.py then checks:
# export then import gives each file back byte for byte (F32; BF16 for a bf16 file; F16 and sharded folders
# read back and written again identically); the folders' safetensors, names, shapes and config.json; a
# Hugging Face forward written in the checker reads each folder and gives the trainer's step-0 logits within
# 1e-5; reference.py -e FOLDER gives the logits reference.py -e MODEL.bin gives, and the trainer's step-0
# logits and gradients of a model with q/k/v biases equal reference.py's; Hugging Face folders written by
# the checker (bf16 tied Llama, F16 Qwen3 in three shards, F32 Qwen2) import and export back to the same
# tensor names, shapes, dtypes and values, and import to files whose step-0 logits equal the folder's HF
# forward; each refused config.json key, missing, extra or misshapen tensor and bad index is one `error:`
# line naming it, with nothing written.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
BIN=./train_gpt_cpu
[ -x "$BIN" ] || { t_fail trainer_built "$BIN is missing (run: make train_gpt_cpu)"; t_finish; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
"$PYTHON" scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 500 --seed 11 > /dev/null ||
    { t_fail shard "make_shard.py failed"; t_finish; }
untied="llama:L2,C64,H4,K2,F160,V500,T64,rope-llama3:8/1/4/32"
tied="llama:L2,C64,H4,K1,F160,V500,T64,tied,rope-linear:2"
qknorm="llama:L2,C64,H4,K2,D32,F160,V500,T64,qknorm,theta1000000,eps1e-6"
flags=(-i "$TMP/data.bin" -j "" -b 2 -t 32 -l 2e-3 -s 0 -v 0)
models=()
train() {   # name, spec, steps, ranks, trainer flags...: trains, then adds NAME=its final model.bin to models
    local name=$1 spec=$2 steps=$3 np=$4 launch=(); shift 4
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np")
    if "${launch[@]}" "$BIN" -e "$spec" "${flags[@]}" -x "$steps" -o "$TMP/$name" "$@" > "$TMP/$name.txt" 2>&1; then
        models+=("$name=$TMP/$name/ckpt_$(printf %06d "$steps")/model.bin")
    else t_fail "train_$name" "$(grep -m1 error "$TMP/$name.txt")"; fi
}
train untied "$untied" 3 1
train tied "$tied" 3 1
train qknorm "$qknorm" 3 1
train gpt2 L2C64H4V500T64 3 1
qkvbias="llama:L2,C64,H4,K2,F160,V500,T64,tied,qkvbias"
train qkvbias "$qkvbias" 3 1
# The model.bin that a ZeRO-2 run, a pipeline (its tied head mirrored on the last stage) and tensor ranks
# consolidate.
if mpi_available; then
    train z2 "$qkvbias" 2 2 -z 2
    train pp2 "$tied" 2 2 -pp 2
    train tp2 "$qknorm" 2 2 -tp 2
    train gpt2_tp2 L2C64H4V500T64 2 2 -tp 2
else
    t_missing hf_llama_layouts "MPI (train_gpt_cpu was built without it)"
fi
out=$("$PYTHON" tests/tools/hf_llama_check.py "$TMP/check" "$BIN" "$TMP/data.bin" "${models[@]}" 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(ok|FAIL|#) '
if printf '%s\n' "$out" | grep -q '^FAIL '; then FAILED=1
elif [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep -q '^ok '; then
    t_fail hf_llama_check "exited $rc: $(printf '%s\n' "$out" | tail -1)"
fi
t_finish
