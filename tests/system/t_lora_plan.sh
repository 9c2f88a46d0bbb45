#!/usr/bin/env bash
# --estimate with -lora: the plan is what every rank of a -lora run allocates (the ranks hold equal halves of
# the adapters' state under -z 1: each unit's trained section splits evenly), the frozen base costs no
# gradient buffer, and -gpu-mem's table answers with LoRA's adapters on each shape of the ladder.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 5 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -v 0 -s 0 -lora 4 -lora-alpha 8)
compare() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    plan_and_train "$name" "$np" "$@" || return
    # Exact: every rank allocates the plan.
    py_check "$name" "$name" "$TMP/$name.plan" "$TMP/$name/log.jsonl" "$np" "$TMP/$name.txt" <<'PY'
import json, sys
name, plan_path, log_path, np, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
lines = open(plan_path).read().splitlines()
plan = json.loads(next(l for l in lines if l.startswith("plan: "))[6:])
mem = sorted((json.loads(l) for l in open(log_path) if '"memory"' in l), key=lambda r: r["rank"])
bad = [] if len(mem) == np else ["%d memory records for %d ranks" % (len(mem), np)]
bad += ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], plan[k])
        for r in mem for k in plan if r["memory"][k] != plan[k]]
# The console's line for rank 0 shows its own allocation.
line = next((l for l in open(out) if l.startswith("memory (rank 0)")), "")
if mem and "params %.1f " % (mem[0]["memory"]["params"] / 2**20) not in line: bad.append("memory line: " + line.strip())
print("ok" if not bad else "; ".join(bad[:3]))
PY
}
compare lora_plan_np1_z0 1
compare lora_plan_np1_z2_bf16_r1 1 -z 2 -p bf16 -r 1
compare lora_plan_np2_z1 2 -z 1
compare lora_plan_np3_z2_bf16 3 -z 2 -p bf16 -lora-targets q,down -e llama:L2,C64,H4,K2,F96,V512,T64
py_check lora_plan_np2_z1_halves_the_adapters_state "$TMP/lora_plan_np1_z0.plan" "$TMP/lora_plan_np2_z1.plan" <<'PY'
import json, sys
plan = lambda p: json.loads(next(l for l in open(p) if l.startswith("plan: "))[6:])
one, two = plan(sys.argv[1]), plan(sys.argv[2])
ok = one["optimizer"] > 0 and all(2 * two[k] == one[k] for k in ("master", "optimizer"))
print("ok" if ok else "one rank: master %d, optimizer %d; each of two: %d, %d" % (one["master"], one["optimizer"], two["master"], two["optimizer"]))
PY

# The frozen base has no gradient: under -z 2 one rank's gradient buffers are the adapters' fp32 accumulator,
# one block's adapters in fp32 (the reduced share being added) and two rotating block slots, nothing sized by
# the frozen embedding (Llama-3.1-8B: 2 GiB in fp32).
./train_gpt_cpu -e llama3.1-8b -lora 16 -z 2 -p bf16 -b 1 -t 2048 --estimate > "$TMP/z2.txt" 2>&1
py_check lora_plan_z2_frozen_base_no_gradient_buffers "$TMP/z2.txt" <<'PY'
import json, sys
plan = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("plan: "))[6:])
C, F, KV, D, L, R = 4096, 14336, 8, 128, 32, 16
block = R * ((C + C) * 2 + (C + KV * D) * 2 + (C + F) * 2 + (F + C))   # q, o; k, v; gate, up; down
want = 4 * L * block + 4 * block + 2 * 2 * block + 4   # accumulator, fp32 share, two bf16 slots, the norm's float
print("ok" if plan["grads"] == want else "grads %d bytes (%.3f GiB), the adapters' %d" % (plan["grads"], plan["grads"] / 2**30, want))
PY

# -gpu-mem with -lora: each cell is the planner's own answer for LoRA (the rung's -lora plan fits, the next
# rung's does not), a row -lora is not built for says so and the run refuses it, and Llama-3.1-8B with LoRA
# fits one 24 GiB GPU and one 80 GiB GPU.
cap=(-lora 16 -p bf16 -b 1 -t 2048 --estimate)
./train_gpt_cpu -e llama3.1-8b "${cap[@]}" -w 1 -gpu-mem 24 > "$TMP/cap24.txt" 2>&1
./train_gpt_cpu -e llama3.1-8b "${cap[@]}" -w 1 -gpu-mem 80 > "$TMP/cap80.txt" 2>&1
$PYTHON - "$TMP/cap24.txt" "$TMP/cap80.txt" <<'PY'
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
ladder = ["135M", "360M", "1B", "3B", "8B", "70B", "405B"]
specs = ["smollm2-135m", "smollm2-360m", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b",
         "llama:L80,C8192,H64,K8,F28672,V128256,T131072,theta500000", "llama:L126,C16384,H128,K8,F53248,V128256,T131072,theta500000"]
cap = ["-lora", "16", "-p", "bf16", "-b", "1", "-t", "2048", "--estimate", "-w", "1"]
def table(path):
    text = open(path).read()
    head = "largest llama shape with LoRA r=16 on q,k,v,o,gate,up,down per rank"
    if head not in text: return None
    rows = {}
    for l in text.split(head)[1].splitlines()[2:]:
        f = l.split()
        if len(f) < 3 or not f[0].isdigit(): break
        rows[(int(f[0]), int(f[1]))] = f[2:]
    return rows
def run(args):
    return subprocess.run(["./train_gpt_cpu"] + list(args), capture_output=True, text=True)
def device_gib(spec, z, r):
    out = run(["-e", spec, "-z", str(z), "-r", str(r)] + cap).stdout
    p = json.loads(out.split("plan: ")[1].splitlines()[0])
    return sum(v for k, v in p.items() if not k.startswith(("host_", "disk_"))) / 2**30
bad, asks, refusals = [], [], []
tables = {24: table(sys.argv[1]), 80: table(sys.argv[2])}
for gpu, rows in tables.items():
    if not rows:
        bad.append("%d GiB: no LoRA table" % gpu)
        continue
    if sorted(rows) != [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]:
        bad.append("%d GiB rows %s" % (gpu, sorted(rows)))
    for (z, o), cells in rows.items():
        if cells[:4] == ["not", "yet", "with", "-lora"]:
            refusals.append((z, o, " ".join(cells[4:]).strip("()")))
            continue
        if any(c not in ladder + ["-"] for c in cells) or len(cells) != 4:
            bad.append("%d GiB z%d o%d: cells %s" % (gpu, z, o, cells))
            continue
        rank = [ladder.index(c) if c in ladder else -1 for c in cells]
        if any(b < a for a, b in zip(rank, rank[1:])): bad.append("%d GiB z%d o%d: more recompute fits less" % (gpu, z, o))
        if o == 0:   # cells the device alone decides (-z 0's, and -r 3's of the others): the largest rung that fits
            asks += [(gpu, z, r, i) for r, i in enumerate(rank) if z == 0 or r == 3]
    if "8B" not in rows.get((0, 0), []): bad.append("%d GiB: Llama-3.1-8B with LoRA fits no -r at -z 0" % gpu)
plans = sorted({(specs[j], z, r) for gpu, z, r, i in asks for j in (i, i + 1) if 0 <= j < len(specs)})
with ThreadPoolExecutor(2) as pool:
    gib = dict(zip(plans, pool.map(lambda a: device_gib(*a), plans)))
for gpu, z, r, i in asks:
    if i >= 0 and gib[(specs[i], z, r)] > gpu: bad.append("%d GiB z%d -r %d: %s needs %.2f GiB" % (gpu, z, r, ladder[i], gib[(specs[i], z, r)]))
    if i + 1 < len(specs) and gib[(specs[i + 1], z, r)] <= gpu:
        bad.append("%d GiB z%d -r %d: %s fits too (%.2f GiB)" % (gpu, z, r, ladder[i + 1], gib[(specs[i + 1], z, r)]))
for z, o, flag in sorted(set(refusals)):   # a row marked "not yet" is one the run itself refuses
    err = run(["-e", "llama3.1-8b", "-z", str(z), "-offload", str(o)] + cap).stderr
    if "%s: not yet with -lora" % flag not in err: bad.append("z%d o%d marked not yet (%s), the run says: %s" % (z, o, flag, err.strip()))
print("ok lora_plan_largest_llama_with_lora" if not bad else "FAIL lora_plan_largest_llama_with_lora: " + "; ".join(bad[:4]))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
# A rank larger than a small rung's layers leaves that rung out rather than ending the table: r=512 is above
# SmolLM2's k layers (192 and 320 rows), which alone would fit 2 GiB.
./train_gpt_cpu -e llama3.2-1b -lora 512 -p bf16 -b 1 -t 2048 --estimate -gpu-mem 2 > "$TMP/big_rank.txt" 2>&1
t_check lora_plan_rank_above_small_rungs "[ $? -eq 0 ] && grep -A2 'with LoRA r=512' '$TMP/big_rank.txt' | grep -Eq '^ +0 +0 +- +- +- +-$'" \
    "$(tail -2 "$TMP/big_rank.txt")"
t_finish
