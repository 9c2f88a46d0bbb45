#!/usr/bin/env bash
# --estimate allocates nothing and predicts each rank's bytes per category; a real run of the same flags
# must allocate exactly that (the plan runs the allocation code, so it is exact, not merely within 1%).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 2 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -v 0 -s 0)
compare() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    plan_and_train "$name" "$np" "$@" || return
    # Exact: the plan runs the allocation code.
    py_check "$name" "$name" "$TMP/$name.plan" "$TMP/$name/log.jsonl" "$np" <<'PY'
import json, sys
name, plan_path, log_path, np = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = json.loads(next(l for l in open(plan_path) if l.startswith("plan: "))[6:])
mem = [json.loads(l) for l in open(log_path) if '"memory"' in l]
bad = ["rank %d %s: allocated %d, planned %d" % (r["rank"], k, r["memory"][k], v)
       for r in mem for k, v in plan.items() if r["memory"][k] != v]
if len(mem) != np:
    bad.append("%d memory records for %d ranks" % (len(mem), np))
print("ok" if not bad else "; ".join(bad[:3]))
PY
}
compare estimate_np1_z0 1
compare estimate_np1_z0_bf16_r3 1 -p bf16 -r 3
compare estimate_np2_z1 2 -z 1
compare estimate_np2_z2_bf16 2 -z 2 -p bf16
compare estimate_np4_z3_r2 4 -z 3 -r 2
compare estimate_np2_z2_bf16_offload 2 -z 2 -p bf16 -offload 1   # host_state planned as allocated too
compare estimate_np2_z3_bf16_offload2 2 -z 3 -p bf16 -offload 2   # and host_grads, host_params
compare estimate_np2_z2_bf16_nvme 2 -z 2 -p bf16 -offload 1 -nvme "$TMP/nvme" -nvme-chunk 4096   # the disk's pool and files
compare estimate_np4_z3_hpz2 4 -z 3 -hpz 2                         # hpZ's secondary shard (hpz_params)
compare estimate_np2_z3_qw_bf16 2 -z 3 -qw 1 -p bf16                # qwZ's packets beside the gathered units
compare estimate_np2_z2_qg 2 -z 2 -qg 1                              # qgZ's errors (grads) and packets (comm)
compare estimate_np4_tp2_z2 4 -tp 2 -z 2                           # a tensor rank's shards and activations
compare estimate_np2_tp2_sp_r1 2 -tp 2 -sp 1 -r 1                    # and its rows under -sp
llama=llama:L2,C64,H4,K2,D32,F96,V512,T64,qknorm
compare estimate_llama_np1_r1 1 -e "$llama" -r 1                    # a Llama block's table, its RoPE table
compare estimate_llama_np2_tp2_z3 2 -e "$llama" -tp 2 -z 3          # its shards, the untied head's rows
compare estimate_llama_kv_copies_np4_tp4 4 -e "$llama,qkvbias" -tp 4 -sp 1   # kv heads copied on 2 ranks each, their scratch
compare estimate_llama_np2_z3_nvme 2 -e "$llama" -z 3 -offload 2 -nvme "$TMP/nvme3" -nvme-chunk 4096   # the untied head's slots
# ZeRO-3 holds the embedding unit and an untied LM head whole only while the walk uses them, in one slot they
# share: Llama-3.1-8B's plan on 64 ranks holds, beside its pieces, two blocks and one wte-sized unit of parameters
# and of gradients (and one fp32 gradient piece), not the embedding, the head and two rotating slots sized for it.
./train_gpt_cpu -e llama3.1-8b -t 8192 -b 1 -r 3 -z 3 -w 64 --estimate > "$TMP/llama8b.txt" 2>&1
py_check estimate_llama8b_z3_edge_units_once "$TMP/llama8b.txt" <<'PY'
import json, sys
plan = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("plan: "))[6:])
C, F, V, KV, D, P, N, x = 4096, 14336, 128256, 8, 128, 8030261248, 64, 4   # fp32
block = C * (C + 2 * KV * D) + C * C + 3 * C * F + 2 * C   # q, k, v; o; the MLP; two norms
piece = (V * C + C) // N   # of the largest unit, the final one
bound = {"params": x * (P // N + 2 * block + V * C + C), "grads": 4 * P // N + 4 * piece + x * (2 * block + V * C + C)}
bad = ["%s %.2f GiB, at most %.2f" % (k, plan[k] / 2**30, 1.001 * v / 2**30) for k, v in bound.items() if plan[k] > 1.001 * v]
print("ok" if not bad else "; ".join(bad))
PY
# The plan needs no data and no device: it works with a shard pattern that matches nothing.
./train_gpt_cpu -e d48 -i "$TMP/none_*.bin" -b 4 -t 1024 -z 3 -w 64 --estimate > "$TMP/d48.txt" 2>&1
t_check estimate_needs_no_data "grep -q '^plan: ' '$TMP/d48.txt' && grep -q 'ZeRO-3' '$TMP/d48.txt'"
# -gpu-mem/-host-mem: the largest GPT-2/GPT-3 shape (-e's family's ladder) per ZeRO stage, -offload and -r. Each cell must be the
# planner's own answer: the chosen shape's plan fits the budgets and the next larger shape's does not; and
# more sharding, offload or recompute never fits a smaller model.
cap=(--estimate -w 8 -gpu-mem 80 -host-mem 128 -p bf16 -b 4 -t 1024)
./train_gpt_cpu -e d12 "${cap[@]}" > "$TMP/cap.txt" 2>&1
$PYTHON - "$TMP/cap.txt" <<'PY'
import json, subprocess, sys
ladder = ["124M", "350M", "774M", "1.6B", "2.7B", "6.7B", "13B", "30B", "65B", "175B"]
specs = ["L12C768H12", "L24C1024H16", "L36C1280H20", "L48C1600H25", "L32C2560H32", "L32C4096H32", "L40C5120H40",
         "L48C7168H56", "L80C8192H64", "L96C12288H96"]
lines = open(sys.argv[1]).read().split("largest gpt2 shape")[1].splitlines()[2:12]
table = {(int(l.split()[0]), int(l.split()[1])): l.split()[2:6] for l in lines}
bad = []
rank = lambda name: ladder.index(name) if name in ladder else -1
for (z, o), cells in table.items():
    for r in range(3):
        if rank(cells[r + 1]) < rank(cells[r]): bad.append("z%d o%d: -r %d fits less than -r %d" % (z, o, r + 1, r))
    # -offload 1 moves the state off the device, which 128 GiB of host holds at these sizes; -offload 2 also moves
    # the gradient and parameter pieces, which may not fit the host where level 1 does (checked below without it).
    if o == 1 and any(rank(a) < rank(b) for a, b in zip(cells, table[(z, 0)])): bad.append("z%d: offload 1 fits less" % z)
    if z > 0 and (z - 1, o) in table and any(rank(a) < rank(b) for a, b in zip(cells, table[(z - 1, o)])):
        bad.append("z%d o%d: fits less than z%d" % (z, o, z - 1))
def plan(spec, z, o, r):
    out = subprocess.run(["./train_gpt_cpu", "-e", spec + "T1024", "--estimate", "-w", "8", "-z", str(z), "-offload", str(o),
                          "-r", str(r), "-p", "bf16", "-b", "4", "-t", "1024"], capture_output=True, text=True).stdout
    p = json.loads(out.split("plan: ")[1].splitlines()[0])
    host = sum(v for k, v in p.items() if k.startswith("host_"))
    return (sum(p.values()) - host) / 2**30, host / 2**30
# The plans asked for below, two processes at a time (each mostly waits in start-up).
cases = [(z, o, r, rank(table[(z, o)][r])) for z, o, r in [(3, 1, 3), (1, 0, 0), (0, 1, 2), (3, 2, 3), (2, 2, 1)]]
asks = [(specs[j], z, o, r) for z, o, r, i in cases for j in (i, i + 1) if j < len(specs)]
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(2) as pool:
    plans = dict(zip(asks, pool.map(lambda a: plan(*a), asks)))
for z, o, r, i in cases:
    dev, host = plans[(specs[i], z, o, r)]
    if not (dev <= 80 and host <= 128): bad.append("z%d o%d r%d: %s needs %.1f/%.1f GiB" % (z, o, r, ladder[i], dev, host))
    if i + 1 < len(specs):
        dev, host = plans[(specs[i + 1], z, o, r)]
        if dev <= 80 and host <= 128: bad.append("z%d o%d r%d: %s fits too (%.1f/%.1f GiB)" % (z, o, r, ladder[i + 1], dev, host))
if sorted(table) != [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]:
    bad.append("rows %s" % sorted(table))
print("ok estimate_largest_model_table" if not bad else "FAIL estimate_largest_model_table: " + "; ".join(bad))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
# Without -host-mem only the device binds, and each offload level keeps less there: it never fits less.
./train_gpt_cpu -e d12 --estimate -w 8 -gpu-mem 80 -p bf16 -b 4 -t 1024 > "$TMP/cap_device.txt" 2>&1
$PYTHON - "$TMP/cap_device.txt" <<'PY'
import sys
ladder = ["124M", "350M", "774M", "1.6B", "2.7B", "6.7B", "13B", "30B", "65B", "175B"]
lines = open(sys.argv[1]).read().split("largest gpt2 shape")[1].splitlines()[2:12]
table = {(int(l.split()[0]), int(l.split()[1])): [ladder.index(c) if c in ladder else -1 for c in l.split()[2:6]] for l in lines}
bad = ["z%d o%d fits less than o%d" % (z, o, o - 1) for (z, o), cells in table.items() if o > 0
       and any(a < b for a, b in zip(cells, table[(z, o - 1)]))]
if table.get((3, 2), [-1] * 4)[3] <= table.get((3, 1), [99] * 4)[3]: bad.append("z3: offload 2 fits no larger model than offload 1 at -r 3")
print("ok estimate_offload_levels_fit_more" if not bad else "FAIL estimate_offload_levels_fit_more: " + "; ".join(bad))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
# A Llama-family -e climbs the Llama family's shapes; at z3 -offload 2 -r 3 the cell is the planner's answer.
./train_gpt_cpu -e llama3.2-1b --estimate -w 8 -gpu-mem 80 -p bf16 -b 1 -t 4096 > "$TMP/cap_llama.txt" 2>&1
$PYTHON - "$TMP/cap_llama.txt" <<'PY'
import json, subprocess, sys
ladder = ["135M", "360M", "1B", "3B", "8B", "70B", "405B"]
specs = ["smollm2-135m", "smollm2-360m", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b",
         "llama:L80,C8192,H64,K8,F28672,V128256,T131072,theta500000", "llama:L126,C16384,H128,K8,F53248,V128256,T131072,theta500000"]
text = open(sys.argv[1]).read()
bad = [] if "largest llama shape" in text else ["no llama table"]
lines = text.split("largest llama shape")[-1].splitlines()[2:12]
cells = {(int(l.split()[0]), int(l.split()[1])): l.split()[2:6] for l in lines}
bad += ["z%d o%d: %s is not a llama rung" % (z, o, c) for (z, o), cs in cells.items() for c in cs if c not in ladder + ["-"]]
def device_gib(spec):
    out = subprocess.run(["./train_gpt_cpu", "-e", spec, "--estimate", "-w", "8", "-z", "3", "-offload", "2", "-r", "3",
                          "-p", "bf16", "-b", "1", "-t", "4096"], capture_output=True, text=True).stdout
    p = json.loads(out.split("plan: ")[1].splitlines()[0])
    return sum(v for k, v in p.items() if not k.startswith("host_")) / 2**30
i = ladder.index(cells.get((3, 2), ["-"] * 4)[3]) if cells.get((3, 2), ["-"] * 4)[3] in ladder else -1
if i < 0: bad.append("no z3 o2 -r 3 cell")
elif device_gib(specs[i]) > 80 or (i + 1 < len(specs) and device_gib(specs[i + 1]) <= 80):
    bad.append("z3 o2 -r 3: %s is not the largest rung within 80 GiB" % ladder[i])
print("ok estimate_largest_llama_table" if not bad else "FAIL estimate_largest_llama_table: " + "; ".join(bad))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || FAILED=1
./train_gpt_cpu -e d12 -gpu-mem 80 > /dev/null 2> "$TMP/gm.err"
t_check estimate_gpu_mem_needs_estimate "[ \$(wc -l < $TMP/gm.err) -eq 1 ] && grep -q 'with --estimate or --autotune only' $TMP/gm.err"
t_finish
