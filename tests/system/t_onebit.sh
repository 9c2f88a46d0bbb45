#!/usr/bin/env bash
# 1-bit Adam. The compressed all-reduce (core/comm/onebit.h): build/test_onebit on 2 and 3 ranks checks its
# identities (norm kept per compression, c + e_new = x + e_old, sign(0) = +1, the same result everywhere, the
# bytes of bits and scales), and tests/tools/onebit_oracle.py checks three rounds of every rank's results and
# errors against its own implementation of DeepSpeed's algorithm at 1e-6. The optimizer (-opt adam1bit
# -freeze S, core/zero/onebit_adam.h) on two ranks: S >= the run's steps is AdamW bit for bit; past S the
# loss falls under -z 0..3 in fp32, bf16 and fp16, and the gradients' reduce-scatters and all-reduces give
# way to the all-to-all of bits; a checkpoint after the freeze resumes bit-exactly, written under -z 1 and
# read under -z 3 (and 4 ranks reshard the errors of 2); --estimate counts the worker momentum and errors as the run allocates them; bad input is
# one line each.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
BIN=build/test_onebit
[ -x "$BIN" ] || { t_fail onebit_binary "$BIN missing (make tests-bin)"; t_finish; }
require_mpi() { mpi_available || { t_missing "$1" "MPI (train_gpt_cpu was built without it)"; return 1; }; }

if require_mpi onebit_allreduce; then
    for np in 2 3; do
        mkdir -p "$TMP/dump$np"
        if "${MPIRUN[@]}" -np $np "$BIN" --dump "$TMP/dump$np" > "$TMP/unit$np.out" 2>&1 &&
            grep -q "^# test_onebit: $np ranks, [0-9]* checks, 0 failed" "$TMP/unit$np.out"; then
            t_ok "onebit_identities_np$np"
        else
            t_fail "onebit_identities_np$np" "$(grep -m3 '^FAIL\|error' "$TMP/unit$np.out" | tr '\n' ' ')"
        fi
        out=$($PYTHON tests/tools/onebit_oracle.py "$TMP/dump$np" $np 40 3 2>&1)
        case "$out" in ok*) t_ok "${out#ok }" ;; *) t_fail "onebit_oracle_np$np" "$out" ;; esac
    done
fi

$PYTHON - "$TMP/pat.bin" <<'PY'
import sys
import numpy as np
n = 20000   # a bigram cycle through every token: learnable in a few steps, every embedding row trained
header = np.zeros(256, dtype=np.int32)
header[:3] = [20240520, 1, n]
tokens = np.zeros(n, dtype=np.uint16)
for i in range(1, n):
    tokens[i] = (tokens[i - 1] * 5 + 1) % 512
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes() + tokens.tobytes())
PY
base=(-e L2C32H2V512T32 -i "$TMP/pat.bin" -j "" -b 2 -t 32 -s 0 -v 0 -l 3e-3)
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/log.jsonl"; }

bad() {   # name, expected message (grep -E), flags...
    local name=$1 want=$2; shift 2
    ./train_gpt_cpu "${base[@]}" "$@" > "$TMP/bad.out" 2>&1
    local rc=$?
    t_check "$name" "[ $rc -ne 0 ] && [ \$(wc -l < '$TMP/bad.out') -eq 1 ] && grep -qE '$want' '$TMP/bad.out'" \
        "exit $rc: $(head -c 300 "$TMP/bad.out")"
}
bad onebit_freeze_needs_adam1bit '^error: -freeze 4 is 1-bit Adam.s warm-up: it needs -opt adam1bit' -x 8 -freeze 4
bad onebit_needs_freeze '^error: -opt adam1bit needs -freeze S >= 1' -x 8 -opt adam1bit
bad onebit_freeze_beyond_run '^error: -freeze 9 is beyond the run.s 8 steps' -x 8 -opt adam1bit -freeze 9
bad onebit_refuses_pipeline '^error: -opt adam1bit with -pp: not yet built' -x 8 -opt adam1bit -freeze 4 -pp 2

# --estimate: the plan counts the whole worker momentum and error and the server chunks (E elements in
# the layout, E/2 per rank's chunks on two ranks), and a run allocates what it planned.
plan() { ./train_gpt_cpu -e L2C32H2V512T32 -b 2 -t 32 --estimate -w 2 -z 2 -p fp16 "$@" | sed -n 's/^plan: //p'; }
plain_plan=$(plan) onebit_plan=$(plan -opt adam1bit -freeze 4)

require_mpi onebit_training || t_finish
run2() { "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" "$@"; }
run2 -x 8 -z 2 -o "$TMP/adamw" > "$TMP/adamw.out" 2>&1
run2 -x 8 -z 2 -o "$TMP/warm" -opt adam1bit -freeze 8 > "$TMP/warm.out" 2>&1
t_check onebit_warmup_is_adamw "[ -s '$TMP/adamw/log.jsonl' ] && diff <(losses '$TMP/adamw') <(losses '$TMP/warm') > /dev/null" \
    "$(tail -1 "$TMP/warm.out")"

# Past the freeze (step 6 of 16): the loss falls by more than 0.3 (AdamW's run falls by 0.5), the step's
# gradient bytes are the all-to-all's bits and no reduce-scatter or all-reduce of the gradients is left.
for setting in "z0|-z 0" "z1_bf16|-z 1 -p bf16" "z2_fp16|-z 2 -p fp16" "z3|-z 3"; do
    name=${setting%%|*}
    run2 -x 16 -freeze 6 -opt adam1bit ${setting#*|} -o "$TMP/$name" > "$TMP/$name.out" 2>&1
    why=$($PYTHON - "$TMP/$name/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
comm = {r["step"]: r["comm_bytes"] for r in rows if "comm_bytes" in r}
late = comm.get(10, {})
if len(loss) != 16 or not loss[15] < loss[0] - 0.3:
    print(f"losses {loss.get(0)} -> {loss.get(15)} ({len(loss)} steps)")
elif late.get("reduce_scatter", [1])[0] or late.get("allreduce", [1])[0] or not late.get("alltoall", [0])[0]:
    print(f"step 10's bytes {late}")
PY
)
    t_check "onebit_trains_$name" "[ -z '$why' ]" "${why:-$(tail -1 "$TMP/$name.out")}"
done
grep -o '"rank": 0, "memory": {[^}]*}' "$TMP/z2_fp16/log.jsonl" | sed 's/.*"memory": //' > "$TMP/allocated.json"
elements=$(grep -o '"elements": [0-9]*' "$TMP/z3/log.jsonl" | head -1 | grep -o '[0-9]*$')
why=$($PYTHON - "$plain_plan" "$onebit_plan" "$TMP/allocated.json" "${elements:-0}" <<'PY'
import json, sys
plain, onebit, allocated, e = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.load(open(sys.argv[3])), int(sys.argv[4])
grown = (onebit["optimizer"] - plain["optimizer"], onebit["grads"] - plain["grads"])
if onebit != allocated:
    print(f"plan {onebit}, allocated {allocated}")
elif grown != ((2 * e + e // 2) * 4, e * 4):
    print(f"optimizer and gradient bytes grew by {grown} for {e} elements")
PY
)
t_check onebit_estimate_counts_buffers "[ -z '$why' ]" "$why"

# A checkpoint at step 10 (past the freeze), written under -z 1 and resumed under -z 3, continues exactly as
# the straight -z 3 run (onebit_trains_z3).
run2 -x 16 -freeze 6 -opt adam1bit -z 1 -n 10 -o "$TMP/split" > "$TMP/split1.out" 2>&1
rm -rf "$TMP/split/ckpt_000016"
run2 -x 16 -freeze 6 -opt adam1bit -z 3 -o "$TMP/split" -y 1 > "$TMP/split2.out" 2>&1
t_check onebit_resume_bit_exact_z1_to_z3 "grep -q 'resumed from' '$TMP/split2.out' && [ -f '$TMP/split/ckpt_000010/onebit_rank1.bin' ] && diff <(losses '$TMP/z3') <(losses '$TMP/split') > /dev/null" \
    "$(tail -1 "$TMP/split2.out")"
# Another data-parallel size reshards the errors (feedback_file.h): 4 ranks resume the 2 ranks' checkpoint at step
# 10, each worker error the writers' mean and the server chunks recut; the run continues within 2e-2 of the
# straight 2-rank run (4 workers compress differently, so not bit for bit).
cp -r "$TMP/split" "$TMP/wide" && rm -rf "$TMP/wide/ckpt_000016"
$PYTHON - "$TMP/wide/log.jsonl" <<'PY'   # steps 10.. only from the resume: a refused one leaves a gap
import json, sys
keep = [l for l in open(sys.argv[1]) if json.loads(l).get("step", 0) < 10]
open(sys.argv[1], "w").writelines(keep)
PY
"${MPIRUN[@]}" -np 4 ./train_gpt_cpu "${base[@]}" -b 1 -x 16 -freeze 6 -opt adam1bit -z 3 -o "$TMP/wide" -y 1 > "$TMP/wide.out" 2>&1
t_check onebit_resume_resharded_2_to_4 "grep -q 'errors of 2 ranks resharded for 4' '$TMP/wide.out' && [ -f '$TMP/wide/ckpt_000016/onebit_rank3.bin' ]" \
    "$(grep -m1 error "$TMP/wide.out")"
compare_py log onebit_resharded_close_to_straight "$TMP/wide/log.jsonl" "$TMP/z3/log.jsonl" --steps 16 --tol 2e-2 --key loss
# Positions past -t never get a gradient: their variance freezes at 0, and the compressed momentum's sign(0) = +1
# times a scale, over sqrt(0) + eps, would throw those rows far. Masked by v = 0, they end where they began
# (no weight decay here), and the loss stays finite.
./train_gpt_cpu -e L2C32H2V512T64 -i "$TMP/pat.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/t64init" > /dev/null 2>&1
"${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -e "$TMP/t64init/ckpt_000000/model.bin" -x 16 -freeze 6 -opt adam1bit -z 1 -c 0 \
    -o "$TMP/t64" > "$TMP/t64.out" 2>&1
py_check onebit_unused_positions_stay "$TMP/t64init/ckpt_000000/model.bin" "$TMP/t64/ckpt_000016/model.bin" "$TMP/t64/log.jsonl" <<'PY'
import json, math, sys
import numpy as np
def wpe_tail(path):   # GPT-2: header, wte (Vp x C), wpe (maxT x C); rows 32.. of wpe
    a = np.fromfile(path, dtype=np.float32, offset=1024)
    return a[512 * 32 + 32 * 32: 512 * 32 + 64 * 32]
before, after = wpe_tail(sys.argv[1]), wpe_tail(sys.argv[2])
losses = [r["loss"] for r in map(json.loads, open(sys.argv[3])) if "loss" in r]
moved = float(np.abs(after - before).max())
print("ok" if moved == 0.0 and len(losses) == 16 and all(map(math.isfinite, losses)) and before.any()
      else "unused wpe rows moved by up to %g; %d losses, last %s" % (moved, len(losses), losses[-1:] if losses else None))
PY
# The run record holds -opt (fixed: its error files) and -freeze (a change needs -y 2); a damaged error file is
# one line naming it.
refused() {   # name, expected text, flags...: a resume of split's checkpoint at 10 refused in one line
    local name=$1 want=$2; shift 2
    cp -r "$TMP/split" "$TMP/$name" && rm -rf "$TMP/$name/ckpt_000016"
    run2 -x 16 -o "$TMP/$name" "$@" > "$TMP/$name.out" 2>&1
    local rc=$?
    t_check "$name" "[ $rc -ne 0 ] && grep -q -- '$want' '$TMP/$name.out' && [ \$(grep -c '^error' '$TMP/$name.out') -ge 1 ]" \
        "$(grep -m1 error "$TMP/$name.out")"
}
refused onebit_resume_as_adamw_refused "would change -opt adam1bit -> adamw" -z 3 -y 1
refused onebit_resume_other_freeze_refused "would change -freeze 6 -> 8" -freeze 8 -opt adam1bit -z 3 -y 1
cp -r "$TMP/split" "$TMP/damaged" && rm -rf "$TMP/damaged/ckpt_000016"
printf '\x01' | dd of="$TMP/damaged/ckpt_000010/onebit_rank1.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
run2 -x 16 -freeze 6 -opt adam1bit -z 3 -o "$TMP/damaged" -y 1 > "$TMP/damaged.out" 2>&1
t_check onebit_damaged_errors_refused "grep -q 'onebit_rank1.bin: damaged' '$TMP/damaged.out'" "$(grep -m1 error "$TMP/damaged.out")"
t_finish
