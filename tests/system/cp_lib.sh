# cp_lib.sh: sourced by the context-parallel tests (t_cp.sh, t_cp_ring.sh) after lib.sh: their data, their three
# models (GPT2: learned positions; LLAMA: RoPE, 2 kv heads for 4 query heads; MQA: one kv head, fewer than -tp 2,
# and 4 layers for -pp 2 -vp 2), the flags every run shares (the array `base`: 8 steps of -b 2 -t 32) and the
# checks they share.
$PYTHON scripts/make_shard.py -o "$TMP/train.bin" -n 20000 -V 500 --seed 7 >/dev/null || t_fail shard "make_shard failed"
init_model L2C64H4V500T64 "$TMP/train.bin"
GPT2=$MODEL
./train_gpt_cpu -e "llama:L2,C64,H4,K2,D16,F96,V512,T64,qknorm" -i "$TMP/train.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/init_llama" >/dev/null 2>&1
LLAMA="$TMP/init_llama/ckpt_000000/model.bin"
t_check init_llama "[ -s '$LLAMA' ]"
./train_gpt_cpu -e "llama:L4,C64,H4,K1,D16,F96,V512,T64" -i "$TMP/train.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/init_mqa" >/dev/null 2>&1
MQA="$TMP/init_mqa/ckpt_000000/model.bin"
t_check init_mqa "[ -s '$MQA' ]"
base=(-i "$TMP/train.bin" -j "" -b 2 -t 32 -x 8 -l 1e-3 -u 2 -c 0.1 -v 0 -s 0 -gc 1.0)
VAL=(-j "$TMP/train.bin" -v 4 -m 2)   # validation: every rank's share of each window's losses, summed

# The one-rank references, per model and global batch (-ga replicas x stages' micro-batches).
train_references() {
    train 1 "$TMP/gpt2_ga1" -e "$GPT2" -ga 1 "${VAL[@]}" || t_fail reference "one-rank run failed"
    train 1 "$TMP/gpt2_ga2" -e "$GPT2" -ga 2 || t_fail reference "one-rank run failed"
    train 1 "$TMP/llama_ga1" -e "$LLAMA" -ga 1 -n 4 || t_fail reference "one-rank run failed"
    train 1 "$TMP/llama_bf16" -e "$LLAMA" -p bf16 || t_fail reference "one-rank run failed"
    train 1 "$TMP/llama_fp16" -e "$LLAMA" -p fp16 || t_fail reference "one-rank run failed"
    train 1 "$TMP/gpt2_lora" -e "$GPT2" -ga 1 -lora 4 -lora-alpha 8 || t_fail reference "one-rank run failed"
    train 1 "$TMP/mqa_ga2" -e "$MQA" -ga 2 || t_fail reference "one-rank run failed"
}

compare_logs() {   # name, dir, reference dir, tolerance
    compare_out log "$1" "$2/log.jsonl" "$3/log.jsonl" --steps 8 --tol "$4" --key loss --key grad_norm &&
        t_ok "$1" || t_fail "$1" "$(grep FAIL <<< "$CMP_OUT" | cut -c1-300)"
}
case_cp() {   # name, ranks, model, reference, tolerance, flags...
    local name=$1 np=$2 model=$3 ref=$4 tol=$5; shift 5
    train "$np" "$TMP/$name" -e "$model" "$@" || { t_fail "$name" "run failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    compare_logs "$name" "$TMP/$name" "$TMP/$ref" "$tol"
}

# A checkpoint written by run `saved` after step 4, resumed on `ranks` with `flags`, ends where the reference
# llama_ga1 (one rank, uninterrupted) does.
resume_as() {   # name, saved run, ranks, flags...
    local name=$1 saved=$2 np=$3; shift 3
    mkdir -p "$TMP/$name" && cp -r "$TMP/$saved/ckpt_000004" "$TMP/$saved/log.jsonl" "$TMP/$name/"
    train "$np" "$TMP/$name" -e "$LLAMA" -y 1 "$@" || { t_fail "$name" "resume failed: $(grep -m1 error "$TMP/$name.txt")"; return; }
    grep -q 'resumed from .*ckpt_000004 at step 4' "$TMP/$name.txt" || { t_fail "$name" "did not resume at step 4"; return; }
    compare_logs "$name" "$TMP/$name" "$TMP/llama_ga1" 1e-5
}

# --estimate's plan equals what every rank of the run allocates.
estimate_case() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    plan_and_train "$name" "$np" "$@" || return
    py_check "$name" "$TMP/$name.plan" "$TMP/$name/log.jsonl" "$np" <<'PY'
import json, sys
plan_path, log_path, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = json.loads(next(l for l in open(plan_path) if l.startswith("plan: "))[6:])
mem = [json.loads(l) for l in open(log_path) if '"memory"' in l]
bad = ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], v) for r in mem for k, v in plan.items() if r["memory"][k] != v]
print("ok" if len(mem) == np and not bad else "; ".join(bad[:3]) or "%d memory records" % len(mem))
PY
}

# A one-line error naming the problem and a non-zero exit (from --estimate where the plan finds it).
bad() {   # name, expected message, flags...
    local name=$1 want=$2; shift 2
    local out; out=$(./train_gpt_cpu "${base[@]}" "$@" 2>&1); local rc=$?
    [ $rc -ne 0 ] && [ "$(grep -c . <<< "$out")" -le 2 ] && grep -qF -- "$want" <<< "$out" && t_ok "$name" ||
        t_fail "$name" "rc $rc: $(tail -1 <<< "$out")"
}
