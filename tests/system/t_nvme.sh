#!/usr/bin/env bash
# -nvme DIR keeps each rank's fp32 master and Adam m, v (and under -offload 2 -z 3 its parameter pieces) in
# files under DIR, streamed through a fixed pool of host buffers. It may change nothing but where the bytes
# are: the same losses, norms and checkpoint files bit for bit as -offload alone, for every -z on 1, 2 and 4
# ranks, with a pipeline, recompute, bf16, fp16 and -dpu (chunks of 2048 elements, so units span several);
# checkpoints move freely between the two. Checked beside that: -lb's disk times, the plan (host bytes held
# to the pool however large the model, disk bytes per rank, DIR's free space, the largest model per layout
# under a disk budget), and the faults: a full disk mid-step, a state file changed or truncated behind the
# run, a filesystem without O_DIRECT, one in memory, two runs given the same DIR, and DIR removed mid-run.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 6 >/dev/null || t_fail shard "make_shard failed"
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -v 0 -s 0 -l 1e-3 -u 2 -c 0.1 -sh 1)
have_mpi=0
mpi_available && have_mpi=1
NV=(-nvme-chunk 2048)
# A run started in the background with `train ... &` (pid: the subshell) and the trainer inside it, once its
# log shows step STEP.
started() {   # subshell pid, out file, step
    local t=0
    until grep -q "^step  *$3/" "$2" 2>/dev/null || [ $t -gt 300 ]; do sleep 0.1; t=$((t + 1)); done
    pgrep -P "$1" -f train_gpt_cpu || echo "$1"
}

# -offload alone against -offload with -nvme, 4 steps; the disk directory is left empty at the end.
pair() {   # name, ranks, flags...
    local name=$1 np=$2; shift 2
    if [ "$np" -gt 1 ] && [ $have_mpi = 0 ]; then t_missing "$name" MPI; return; fi
    train "$np" "$TMP/${name}_mem" -x 4 "$@" || { t_fail "$name" "run without -nvme failed: $(tail -1 "$TMP/${name}_mem.txt")"; return; }
    train "$np" "$TMP/${name}_disk" -x 4 "$@" -nvme "$TMP/nvme_$name" "${NV[@]}" ||
        { t_fail "$name" "-nvme run failed: $(tail -1 "$TMP/${name}_disk.txt")"; return; }
    [ -z "$(ls -A "$TMP/nvme_$name")" ] || { t_fail "$name" "files left in the -nvme directory: $(ls "$TMP/nvme_$name")"; return; }
    same_run "$name" "$TMP/${name}_mem" "$TMP/${name}_disk" 4
}
for z in 0 1 2 3; do pair "nvme_np1_z$z" 1 -z $z -offload 1; done
pair nvme_np2_z1 2 -z 1 -offload 1
pair nvme_np2_z2_offload2 2 -z 2 -offload 2
pair nvme_np1_z3_offload2 1 -z 3 -offload 2                    # the parameter pieces on disk too
pair nvme_np2_z3_offload2_bf16 2 -z 3 -offload 2 -p bf16
pair nvme_np4_z3_offload2_bf16 4 -z 3 -offload 2 -p bf16 -ga 2
pair nvme_np2_pp2_z3_offload2 2 -pp 2 -z 3 -offload 2 -ga 2    # the tied embedding's mirror
pair nvme_np1_z2_r3 1 -z 2 -offload 1 -r 3
pair nvme_np1_z1_fp16 1 -z 1 -offload 1 -p fp16
pair nvme_np1_z3_offload2_dpu 1 -z 3 -offload 2 -dpu 1 -p bf16  # the pass on -dpu's thread, the landing's copies
pair nvme_np2_z1_dpu 2 -z 1 -offload 1 -dpu 2
t_check nvme_losses_vary "[ \$(fields $TMP/nvme_np1_z0_disk/log.jsonl | cut -d, -f2 | sort -u | wc -l) -ge 4 ]"
t_check nvme_announced "grep -q '^-nvme: state in $TMP/nvme_nvme_np1_z0/gpt-nvme-rank0 (.* GiB per rank), O_DIRECT reads and writes' $TMP/nvme_np1_z0_disk.txt"

# Checkpoints move between the two: a run stopped at step 3 resumes with, or without, the state on disk,
# and ends as the straight run does.
cross() {   # name, -nvme of the first half (0/1), of the second; flags...
    local name=$1 first=$2 second=$3; shift 3
    local d1=() d2=()
    [ "$first" = 1 ] && d1=(-nvme "$TMP/nvme_$name" "${NV[@]}")
    [ "$second" = 1 ] && d2=(-nvme "$TMP/nvme_$name")
    train 1 "$TMP/${name}_straight" -x 6 "$@" || { t_fail "$name" "straight run failed"; return; }
    train 1 "$TMP/$name" -x 6 -n 3 "${d1[@]}" "$@" || { t_fail "$name" "first half failed: $(tail -1 "$TMP/$name.txt")"; return; }
    rm -rf "$TMP/$name/ckpt_000006"
    train 1 "$TMP/$name" -x 6 -y 1 "${d2[@]}" "$@" || { t_fail "$name" "resume failed: $(tail -1 "$TMP/$name.txt")"; return; }
    grep -q 'resumed from .*ckpt_000003 at step 3' "$TMP/$name.txt" || { t_fail "$name" "did not resume at step 3"; return; }
    same_run "$name" "$TMP/${name}_straight" "$TMP/$name" 6
}
cross nvme_resume_disk_to_memory_bf16_z3 1 0 -z 3 -offload 2 -p bf16
cross nvme_resume_memory_to_disk_z1 0 1 -z 1 -offload 1
cross nvme_resume_disk_to_disk_z0 1 1 -offload 1

# -lb: the disk's read, write and update time and the wait for the disk, every step.
train 1 "$TMP/lb" -x 3 -z 3 -offload 2 -nvme "$TMP/nvme_lb" "${NV[@]}" -lb 1 || t_fail nvme_breakdown "run failed"
py_check nvme_breakdown "$TMP/lb/log.jsonl" <<'PY'
import json, sys
recs = [r["nvme_ms"] for r in map(json.loads, open(sys.argv[1])) if "nvme_ms" in r]
bad = [r for r in recs if not (r["read"] >= 0 and r["write"] > 0 and r["pass"] > 0 and 0 <= r["disk_wait"] <= r["pass"]
                                 and abs(r["update"] + r["disk_wait"] - r["pass"]) < 0.01)]
print("ok" if len(recs) == 3 and not bad else "%d records, inconsistent: %s" % (len(recs), bad[:1]))
PY
t_check nvme_breakdown_printed "grep -q 'nvme: read .* ms, write .* ms, update .* ms; the pass took .* ms, .* of them waiting for the disk' $TMP/lb.txt"

# The plan is what the run allocates (host pool and disk files included), and the host's bytes are held to
# the pool: a model 16 times larger needs 16 times the disk and not one byte more of host memory, while
# without -nvme its host bytes grow with it.
plan_of() { grep '^plan: ' "$1" | cut -c7-; }
./train_gpt_cpu "${base[@]}" -x 1 -z 3 -offload 2 -p bf16 -nvme "$TMP/nvme_est" --estimate -w 2 > "$TMP/est.plan" 2>&1
train 2 "$TMP/est" -x 1 -z 3 -offload 2 -p bf16 -nvme "$TMP/nvme_est" || t_fail nvme_estimate_exact "run failed"
py_check nvme_estimate_exact "$(plan_of "$TMP/est.plan")" "$TMP/est/log.jsonl" <<'PY'
import json, sys
plan = json.loads(sys.argv[1])
mem = [json.loads(l)["memory"] for l in open(sys.argv[2]) if '"memory"' in l]
bad = ["%s: allocated %d, planned %d" % (k, m[k], v) for m in mem for k, v in plan.items() if m[k] != v]
print("ok" if len(mem) == 2 and plan["disk_state"] > 0 and not bad else "; ".join(bad) or "%d records" % len(mem))
PY
for m in d12 L48C768H12; do
    for d in 0 1; do
        flags=(-e "$m" -b 4 -t 1024 -p bf16 -z 3 -offload 2 --estimate); [ $d = 1 ] && flags+=(-nvme "$TMP/nvme_plan")
        ./train_gpt_cpu "${flags[@]}" > "$TMP/plan_${m}_$d.txt" 2>&1 || t_fail nvme_host_bounded "--estimate failed"
    done
done
py_check nvme_host_bounded "$TMP" <<'PY'
import json, sys
p = lambda m, d: json.loads(next(l for l in open("%s/plan_%s_%d.txt" % (sys.argv[1], m, d)) if l.startswith("plan: "))[6:])
host = lambda r: r["host_state"] + r["host_params"]
small, big, small0, big0 = p("d12", 1), p("L48C768H12", 1), p("d12", 0), p("L48C768H12", 0)
bad = []
if host(small) != host(big): bad.append("host bytes %d and %d: not held to the pool" % (host(small), host(big)))
if not big["disk_state"] > 3 * small["disk_state"]: bad.append("disk bytes %d and %d" % (small["disk_state"], big["disk_state"]))
if not host(big0) > 3 * host(small0): bad.append("without -nvme host bytes %d and %d" % (host(small0), host(big0)))
if not host(small) < host(small0) / 4: bad.append("host bytes %d with -nvme, %d without" % (host(small), host(small0)))
print("ok" if not bad else "; ".join(bad))
PY
t_check nvme_estimate_prints_disk "grep -q '^  disk total' $TMP/plan_d12_1.txt && grep -q '^disk GiB per rank' $TMP/plan_d12_1.txt &&
    grep -q 'free on the filesystem of $TMP/nvme_plan' $TMP/plan_d12_1.txt"

# With a disk budget the capacity table has -nvme rows, each the planner's own answer for its budgets: under
# a small host budget the disk holds a larger model than the host does.
./train_gpt_cpu -e d12 --estimate -w 8 -gpu-mem 80 -host-mem 16 -disk-mem 2000 -p bf16 -b 4 -t 1024 > "$TMP/cap.txt" 2>&1
py_check nvme_capacity "$TMP/cap.txt" <<'PY'
import sys
ladder = ["-", "124M", "350M", "774M", "1.6B", "2.7B", "6.7B", "13B", "30B", "65B", "175B"]
lines = open(sys.argv[1]).read().split("largest gpt2 shape")[1].split("\n\n")[0].splitlines()[2:]   # to the table's end
rows = {}
for l in lines:
    f = l.split()
    if len(f) == 6 and f[0].isdigit(): rows[(int(f[0]), f[1])] = [ladder.index(c) for c in f[2:]]
bad = []
for z in range(4):
    for lvl in (["1", "2"] if z >= 2 else ["1"]):
        if (z, lvl + "+nvme") not in rows: bad.append("no -nvme row for -z %d -offload %s" % (z, lvl)); continue
        if any(d < h for d, h in zip(rows[(z, lvl + "+nvme")], rows[(z, lvl)])): bad.append("-z %d -offload %s: the disk fits less" % (z, lvl))
if not bad and rows[(3, "2+nvme")][3] <= rows[(3, "2")][3]: bad.append("-z 3 -offload 2 -r 3: the disk fits no larger model under -host-mem 16")
print("ok" if not bad else "; ".join(bad))
PY

# Faults. DIR's free space is checked before anything is allocated: a filesystem of 1 MiB (tmpfs, as root).
mnt="$TMP/small"
mkdir -p "$mnt"
if mount -t tmpfs -o size=1m tmpfs "$mnt" 2>/dev/null; then
    train 1 "$TMP/full" -x 2 -z 1 -offload 1 -nvme "$mnt/dir" 2> /dev/null; rc=$?
    t_check nvme_free_space_checked "[ $rc -eq 1 ] && [ \$(grep -c . $TMP/full.txt) -eq 1 ] &&
        grep -q '^error: -nvme $mnt/dir: this rank.s state files need .* GiB, but the filesystem has .* GiB free' $TMP/full.txt"
    umount "$mnt"
else
    t_skip nvme_free_space_checked "cannot mount a small tmpfs (not root)"
fi

# The disk fills up mid-step (GPT_NVME_FAIL_WRITE: with one chunk per unit, 4 writes at start-up and 4 per
# step, the 14th is in step 2's pass: it writes half its bytes and fails with ENOSPC): one line, the
# checkpoint of step 2 intact, and the run resumed from it ends as the straight run does: nothing
# half-written is taken for state.
train 1 "$TMP/enospc_straight" -x 4 -z 1 -offload 1 || t_fail nvme_disk_full "straight run failed"
GPT_NVME_FAIL_WRITE=14 train 1 "$TMP/enospc" -x 4 -n 2 -z 1 -offload 1 -nvme "$TMP/nvme_full"; rc=$?
t_check nvme_disk_full_one_line "[ $rc -eq 1 ] && [ \$(grep -c '^error' $TMP/enospc.txt) -eq 1 ] && grep -q '^step     1/' $TMP/enospc.txt &&
    ! grep -q '^step     2/' $TMP/enospc.txt && [ -f $TMP/enospc/ckpt_000002/DONE ] &&
    grep -q '^error: -nvme: no space left on the filesystem of .*state.bin writing chunk' $TMP/enospc.txt" "rc $rc: $(tail -1 "$TMP/enospc.txt")"
train 1 "$TMP/enospc" -x 4 -y 1 -z 1 -offload 1 -nvme "$TMP/nvme_full" || t_fail nvme_disk_full_resumes "$(tail -1 "$TMP/enospc.txt")"
if grep -q 'resumed from .*ckpt_000002 at step 2' "$TMP/enospc.txt"; then same_run nvme_disk_full_resumes "$TMP/enospc_straight" "$TMP/enospc" 4
else t_fail nvme_disk_full_resumes "did not resume at step 2"; fi

# A state file changed or truncated behind the run: the run is stopped after step 2 (SIGSTOP) and the file
# damaged: a byte changed in every chunk (the few a pass holds in flight are written back whole, the others
# are read again), or cut to nothing (the write-backs in flight leave it ending before the pass's next read).
# That read fails its checksum, or comes up short: one line, exit 1.
damage() {   # name, command run on state.bin, expected text
    local name=$1 dir="$TMP/nvme_$1"
    train 1 "$TMP/$name" -x 100000 -z 1 -offload 1 -nvme "$dir" "${NV[@]}" & local pid=$!
    local trainer; trainer=$(started $pid "$TMP/$name.txt" 2)
    kill -STOP "$trainer"
    $2 "$dir/gpt-nvme-rank0/state.bin"
    kill -CONT "$trainer"
    wait $pid; local rc=$?
    t_check "$name" "[ $rc -eq 1 ] && [ \$(grep -c '^error' $TMP/$name.txt) -eq 1 ] && grep -q '$3' $TMP/$name.txt" "rc $rc: $(tail -1 "$TMP/$name.txt")"
}
flip_every_chunk() {   # chunks of 2048 elements: records of 3 x 8192 bytes
    local k
    for ((k = 0; k * 24576 < $(stat -c %s "$1"); k++)); do
        printf '\x5a' | dd of="$1" bs=1 seek=$((k * 24576 + 100)) conv=notrunc status=none
    done
}
cut_to_nothing() { truncate -s 0 "$1"; }
damage nvme_changed_behind_the_run flip_every_chunk '^error: -nvme: .*state.bin changed behind the run: chunk [0-9]* (.*) does not match the checksum'
damage nvme_truncated_behind_the_run cut_to_nothing '^error: -nvme: .*state.bin ends at byte [0-9]*, inside chunk .*truncated behind the run'

# DIR removed while the run uses it (the run stopped after step 2 meanwhile, and not yet finished): its files
# stay open, so the run trains to the end and writes its last checkpoint; the directory missing at the end
# is one warning, and the exit is 0.
train 1 "$TMP/removed" -x 60 -z 1 -offload 1 -nvme "$TMP/nvme_removed" & pid=$!
trainer=$(started $pid "$TMP/removed.txt" 2)
kill -STOP "$trainer"
finished=$(grep -c '^trained' "$TMP/removed.txt")
rm -rf "$TMP/nvme_removed"
kill -CONT "$trainer"
wait $pid; rc=$?
t_check nvme_dir_removed_mid_run "[ $finished -eq 0 ] && [ $rc -eq 0 ] && [ -f $TMP/removed/ckpt_000060/DONE ] && ! grep -q '^error' $TMP/removed.txt &&
    [ \$(grep -c '^warning: -nvme: $TMP/nvme_removed/gpt-nvme-rank0 was removed while the run used it;' $TMP/removed.txt) -eq 1 ]" \
    "finished before the removal: $finished, rc $rc: $(tail -1 "$TMP/removed.txt")"

# tmpfs is memory: it works (here with O_DIRECT, which kernels from 6.6 take on tmpfs) and says so. ramfs
# refuses O_DIRECT: the run falls back to the page cache and says so. Both give the same bits.
shm=$(mktemp -d /dev/shm/gpt-nvme-test.XXXXXX)
pair_dir() {   # name, directory
    train 1 "$TMP/$1" -x 4 -z 3 -offload 2 -nvme "$2" "${NV[@]}" || { t_fail "$1" "$(tail -1 "$TMP/$1.txt")"; return 1; }
    same_run "$1" "$TMP/nvme_np1_z3_offload2_mem" "$TMP/$1" 4
}
pair_dir nvme_on_tmpfs "$shm/d" && t_check nvme_tmpfs_note "grep -q '^-nvme: state in .*; note: tmpfs is memory, so these files take host memory after all' $TMP/nvme_on_tmpfs.txt"
rm -rf "$shm"
mkdir -p "$TMP/ramfs"
if mount -t ramfs ramfs "$TMP/ramfs" 2>/dev/null; then
    pair_dir nvme_on_ramfs "$TMP/ramfs/d" &&
        t_check nvme_no_direct_io_note "grep -q 'buffered reads and writes: its filesystem does not take O_DIRECT, so they go through the page cache; note: ramfs is memory' $TMP/nvme_on_ramfs.txt"
    umount "$TMP/ramfs"
else
    t_skip nvme_on_ramfs "cannot mount ramfs (not root)"
fi

# Two runs given the same DIR: the second is refused with one line naming the first; the lock dies with its
# holder, so a third run after the first was killed starts.
train 1 "$TMP/first" -x 100000 -z 1 -offload 1 -nvme "$TMP/nvme_shared" 2> /dev/null & first=$!
holder=$(started $first "$TMP/first.txt" 0)
train 1 "$TMP/second" -x 1 -z 1 -offload 1 -nvme "$TMP/nvme_shared"; rc=$?
t_check nvme_same_dir_refused "[ $rc -eq 1 ] && [ \$(grep -c . $TMP/second.txt) -eq 1 ] &&
    grep -q '^error: -nvme $TMP/nvme_shared is in use by another run (process $holder holds ' $TMP/second.txt" "rc $rc: $(tail -1 "$TMP/second.txt")"
kill -9 "$holder"; wait $first 2>/dev/null
train 1 "$TMP/third" -x 1 -z 1 -offload 1 -nvme "$TMP/nvme_shared"
t_check nvme_lock_dies_with_its_run "[ $? -eq 0 ]"

# Bad input: one line each, exit 1.
bad() {   # name, expected text, flags...
    local name=$1 want=$2; shift 2
    ./train_gpt_cpu "${base[@]}" -x 1 "$@" > "$TMP/$name.txt" 2>&1; local rc=$?
    t_check "$name" "[ $rc -eq 1 ] && [ \$(grep -c . $TMP/$name.txt) -eq 1 ] && grep -q '$want' $TMP/$name.txt" "rc $rc: $(head -1 "$TMP/$name.txt")"
}
touch "$TMP/a_file"
bad nvme_needs_offload '^error: -nvme .* it needs -offload 1 or 2' -nvme "$TMP/x"
bad nvme_chunk_multiple '^error: -nvme-chunk 3000 is not a multiple of 2048' -offload 1 -nvme "$TMP/x" -nvme-chunk 3000
bad nvme_chunk_needs_nvme '^error: -nvme-chunk sizes the transfers of -nvme' -offload 1 -nvme-chunk 4096
bad nvme_empty_dir '^error: -nvme needs a directory name' -offload 1 -nvme ""
bad nvme_dir_is_a_file "^error: .*$TMP/a_file.* not a directory" -offload 1 -nvme "$TMP/a_file"
bad nvme_disk_mem_needs_gpu_mem '^error: -disk-mem needs -gpu-mem' --estimate -disk-mem 10
t_finish
