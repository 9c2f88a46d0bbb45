#!/usr/bin/env bash
# Multi-node runs on one machine: two "hosts" made of network namespaces joined by a veth pair
# (tests/netns/hosts.sh), orted started on the second through an ssh-like launch agent
# (tests/netns/agent.sh), every byte between the ranks over TCP on the veth. 2 hosts x 2 ranks under -z 2
# and under -pp 2 log the same losses and norms, bit for bit, and end in the same checkpoint as 4 ranks on
# one host (same ranks, same reduction order); the ranks really ran 2 per namespace, node-local ranks 0 and
# 1 on each; the veth carried the traffic. A run over both hosts checkpoints into a shared -o and a second
# launch resumes from it, ending as the straight single-host run does. With storage that is not shared
# (each host sees its own directory at the -o path) the run is node-local: the same losses and files,
# each host holding its own ranks' state files; resumes from the checkpoint complete on both hosts, also
# when one host's newest is missing or damaged (one bit of a header included: damage, not another shape)
# and under another topology; one host alone stops with one line, and copying the files together makes an
# ordinary checkpoint. -qg 1's first all-to-all stays inside each host, its second crosses.
# -z 3 -hpz 2 over the two hosts ends as -z 3 on one, and its hpz groups send no
# cross-host bytes.
# Needs root, ip (iproute2), unshare and an MPI build; otherwise one "skip" line.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
skip() { t_skip t_multinode "$1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || { t_missing t_multinode "ip (iproute2)"; t_finish; }
command -v unshare >/dev/null 2>&1 || { t_missing t_multinode "unshare (util-linux)"; t_finish; }
mpi_or_skip t_multinode
export NETNS_A=gzt_a$$ NETNS_B=gzt_b$$   # this run's own pair: tests running side by side never meet
probe=gzt_p$$
err=$(ip netns add "$probe" 2>&1) || skip "ip netns add failed: $(printf '%s' "$err" | head -1)"
ip netns del "$probe"

hosts=tests/netns/hosts.sh
trap '"$hosts" down >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM
up=$("$hosts" up 2>&1) || { t_fail multinode_hosts_up "$up"; t_finish; }
t_ok multinode_hosts_up

$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 500 --seed 7 >/dev/null || t_fail shard "make_shard failed"
init_model L2C64H4V500T64 "$TMP/data.bin"
base=(-e "$MODEL" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 6 -l 1e-3 -u 2 -c 0.1 -v 0 -s 0)
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' > "$TMP/hostfile"
# mpirun runs on host a (the root namespace has no route to the hosts' network: its orted would never call
# back) and starts host b's orted through the agent; out-of-band and MPI traffic both on the veth subnet.
NET=(--mca plm_rsh_agent "$PWD/tests/netns/agent.sh" --mca plm_rsh_no_tree_spawn 1
     --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
MULTI=(--hostfile "$TMP/hostfile" -np 4 "${NET[@]}")
# Each rank first records where it runs: world rank, OpenMPI's node-local rank, network namespace, hostname.
cat > "$TMP/rank.sh" <<EOF
#!/bin/sh
echo "\$OMPI_COMM_WORLD_RANK \$OMPI_COMM_WORLD_LOCAL_RANK \$(ip netns identify \$\$ | grep . || echo root) \$(hostname)" > "\$WHERE.\$OMPI_COMM_WORLD_RANK"
exec "$PWD/train_gpt_cpu" "\$@"
EOF
chmod +x "$TMP/rank.sh"
fields() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
flip_bit() {   # file, byte offset: its lowest bit flipped
    $PYTHON -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(int(sys.argv[2])); b = f.read(1)[0] ^ 1; f.seek(int(sys.argv[2])); f.write(bytes([b]))" "$1" "$2"
}
first_error() { grep -m1 '^error' "$1" || tail -1 "$1"; }

two_hosts() {   # name, -o dir, flags...: 2 hosts x 2 ranks, started from host a
    local name=$1 out=$2; shift 2
    timeout -k 5 120 "$hosts" exec a "${MPIRUN[@]}" "${MULTI[@]}" -x WHERE="$TMP/$name.where" "$TMP/rank.sh" "${base[@]}" "$@" -o "$out" \
        > "$TMP/$name.txt" 2>&1
}
one_host() {   # name, -o dir, flags...: 4 ranks on this host
    local name=$1 out=$2; shift 2
    timeout -k 5 120 "${MPIRUN[@]}" -np 4 -x WHERE="$TMP/$name.where" "$TMP/rank.sh" "${base[@]}" "$@" -o "$out" > "$TMP/$name.txt" 2>&1
}
veth_bytes() {   # sent and received on host a's end of the veth
    local d=/sys/class/net/${NETNS_A}0/statistics
    echo $(( $(ip netns exec "$NETNS_A" cat $d/tx_bytes) + $(ip netns exec "$NETNS_A" cat $d/rx_bytes) ))
}

# Same log fields and the same checkpoint files at step STEP; the second run's files may be spread over
# several directories (hosts), each file taken from the first that holds it.
same_run() {   # name, straight dir, step, dir..., where the other run's files are
    local name=$1 a=$2 ck=ckpt_$(printf %06d "$3") bad="" f d g; shift 3
    [ "$(fields "$a/log.jsonl" | wc -l)" -eq 6 ] || bad="$a/log.jsonl has $(fields "$a/log.jsonl" | wc -l) steps, expected 6"
    [ -z "$bad" ] && ! diff <(fields "$a/log.jsonl") <(fields "$1/log.jsonl") > /dev/null && bad="losses or norms differ: $(diff <(fields "$a/log.jsonl") <(fields "$1/log.jsonl") | grep -m1 '^>')"
    for f in "$a/$ck"/model.bin "$a/$ck"/state_rank*.bin; do
        g=""
        for d in "$@"; do [ -z "$g" ] && [ -e "$d/$ck/$(basename "$f")" ] && g=$d/$ck/$(basename "$f"); done
        [ -z "$bad" ] && [ -z "$g" ] && bad="$ck/$(basename "$f") missing"
        [ -z "$bad" ] && ! cmp -s "$f" "$g" && bad="$ck/$(basename "$f") differs"
    done
    if [ -z "$bad" ]; then t_ok "$name"; else t_fail "$name" "$bad"; fi
}

# Ranks 0, 1 on host a and 2, 3 on host b, node-local ranks 0, 1 on each: what backend_create gets.
spans_hosts() {   # name, run
    local want got
    want=$(printf '0 0 %s %s\n1 1 %s %s\n2 0 %s %s\n3 1 %s %s' "$NETNS_A" "${NETNS_A//_/-}" "$NETNS_A" "${NETNS_A//_/-}" \
           "$NETNS_B" "${NETNS_B//_/-}" "$NETNS_B" "${NETNS_B//_/-}")
    got=$(cat "$TMP/$2.where".* 2>/dev/null | sort -n)
    t_check "$1" "[ \"\$got\" = \"\$want\" ]" "ranks ran at: $(printf '%s' "$got" | paste -sd';'), expected: $(printf '%s' "$want" | paste -sd';')"
}

for layout in z2 pp2; do
    case $layout in z2) flags=(-z 2) ;; pp2) flags=(-pp 2 -z 1 -ga 2) ;; esac
    bytes0=$(veth_bytes)
    two_hosts "two_$layout" "$TMP/two_$layout" "${flags[@]}"
    rc=$?
    bytes1=$(veth_bytes)
    one_host "one_$layout" "$TMP/one_$layout" "${flags[@]}" ||
        { t_fail "multinode_$layout" "single-host run failed: $(first_error "$TMP/one_$layout.txt")"; continue; }
    [ $rc = 0 ] || { t_fail "multinode_$layout" "two-host run failed (rc $rc): $(first_error "$TMP/two_$layout.txt")"; continue; }
    spans_hosts "multinode_${layout}_ranks_on_both_hosts" "two_$layout"
    t_check "multinode_${layout}_one_host_ran_here" "[ \"\$(cut -d' ' -f3 $TMP/one_$layout.where.* | sort -u)\" = root ]"
    # 4 ranks exchange about 2 x 137k fp32 values a step; half of each ring crosses the veth.
    t_check "multinode_${layout}_traffic_on_veth" "[ $((bytes1 - bytes0)) -gt 1000000 ]" "only $((bytes1 - bytes0)) bytes crossed the veth"
    same_run "multinode_${layout}_same_as_one_host" "$TMP/one_$layout" 6 "$TMP/two_$layout"
done

# hpZ across hosts: -z 3 -hpz host (2 here) on 2 hosts x 2 ranks ends as -z 3 on one host, bit for bit; the backward's
# gathers run in the hpz groups, one per host, which send nothing across hosts, while the forward's gathers
# and the reduce-scatters cross (comm.h's link classes, logged per group).
one_host one_z3 "$TMP/one_z3" -z 3 || t_fail multinode_hpz2 "single-host -z 3 run failed: $(first_error "$TMP/one_z3.txt")"
if two_hosts two_hpz2 "$TMP/two_hpz2" -z 3 -hpz host; then   # a host's ranks: groups of 2
    t_check multinode_hpz_host_is_two "grep -q 'hpZ groups of 2' '$TMP/two_hpz2.txt'" "$(grep -m1 'ranks (' "$TMP/two_hpz2.txt")"
    same_run multinode_hpz2_same_as_z3_one_host "$TMP/one_z3" 6 "$TMP/two_hpz2"
    py_check multinode_hpz2_backward_stays_on_host "$TMP/two_hpz2/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
get = lambda key: [r[key] for r in recs if key in r]
hpz, hpz_links, dp_links, dp = get("hpz_comm_bytes"), get("hpz_link_bytes"), get("dp_link_bytes"), get("dp_comm_bytes")
bad = [] if len(hpz_links) >= 6 and len(dp_links) == len(hpz_links) else ["%d hpz_link_bytes records" % len(hpz_links)]
for g, gl, d, dl in zip(hpz, hpz_links, dp, dp_links):
    for r in range(4):
        if gl["cross_host"][r] or not g["allgather"][r] or gl["intra_host"][r] != sum(v[r] for v in g.values()):
            bad.append("hpz group, rank %d: %s %s" % (r, gl, g))
        if dl["intra_host"][r] or dl["cross_host"][r] != sum(v[r] for v in d.values()) or not d["allgather"][r]:
            bad.append("dp group, rank %d: %s %s" % (r, dl, d))
print("ok" if not bad else "; ".join(bad[:2]))
PY
else
    t_fail multinode_hpz2 "two-host run failed: $(first_error "$TMP/two_hpz2.txt")"
fi
# qgZ across hosts: its first all-to-all runs inside each host and sends nothing across, its second runs
# among the ranks of one local index, one per host, and sends everything across.
if two_hosts two_qg "$TMP/two_qg" -z 2 -qg 1; then
    py_check multinode_qg_hosts_by_link "$TMP/two_qg/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
get = lambda key: [r[key] for r in recs if key in r]
intra, inter = get("qgz_intra_link_bytes"), get("qgz_inter_link_bytes")
bad = [] if len(intra) >= 6 and len(inter) == len(intra) else ["%d qgz link records" % len(intra)]
for a, b in zip(intra, inter):
    for r in range(4):
        if a["cross_host"][r] or not a["intra_host"][r] or b["intra_host"][r] or not b["cross_host"][r]:
            bad.append("rank %d: intra %s, inter %s" % (r, a, b))
print("ok" if not bad else "; ".join(bad[:2]))
PY
else
    t_fail multinode_qg "two-host -qg run failed: $(first_error "$TMP/two_qg.txt")"
fi

# Checkpoints across hosts with one shared -o: a run checkpoints at step 3, a second two-host launch resumes
# from there with -y 1 and ends as the straight single-host run does.
two_hosts shared_first "$TMP/shared_run" -z 2 -n 3 || t_fail multinode_resume_shared_fs "first run failed: $(first_error "$TMP/shared_first.txt")"
rm -rf "$TMP/shared_run/ckpt_000006"
if ! two_hosts shared_resumed "$TMP/shared_run" -z 2 -n 3 -y 1; then
    t_fail multinode_resume_shared_fs "resume failed: $(first_error "$TMP/shared_resumed.txt")"
elif ! grep -q 'resumed from .*ckpt_000003 at step 3' "$TMP/shared_resumed.txt"; then
    t_fail multinode_resume_shared_fs "did not resume at step 3: $(head -1 "$TMP/shared_resumed.txt")"
else
    same_run multinode_resume_shared_fs "$TMP/one_z2" 6 "$TMP/shared_run"
fi

# No shared filesystem: the same path, $TMP/shared, is host a's directory ($TMP/host_a) on host a and host
# b's ($TMP/host_b) on host b (a bind mount in each host's mount namespace). The trainer finds that -o is
# not shared and runs node-local: each host's lowest rank manages its host's directory, every rank writes
# its state file there, model.bin and the log land in rank 0's, and a resume agrees on the newest
# checkpoint complete on every host, each state file read where it lies and broadcast.
A=$TMP/host_a B=$TMP/host_b
mkdir -p "$TMP/shared" "$A" "$B"
export NETNS_BIND_A=$A:$TMP/shared NETNS_BIND_B=$B:$TMP/shared

listing() { (cd "$1" 2>/dev/null && ls -A | paste -sd' '); }
# Host a holds ranks 0 and 1's state files and model.bin, host b ranks 2 and 3's; both the manifest and
# DONE; the log and its monitors (tb/, csv/) and nothing temporary on host a, none of them on host b.
own_files() {   # name, run
    local bad="" ck
    for ck in ckpt_000003 ckpt_000006; do
        [ "$(listing "$A/$2/$ck")" = "DONE manifest.json model.bin state_rank0.bin state_rank1.bin" ] || bad="$bad host a $ck: $(listing "$A/$2/$ck");"
        [ "$(listing "$B/$2/$ck")" = "DONE manifest.json state_rank2.bin state_rank3.bin" ] || bad="$bad host b $ck: $(listing "$B/$2/$ck");"
    done
    [ "$(listing "$A/$2")" = "ckpt_000003 ckpt_000006 csv lock log.jsonl tb" ] || bad="$bad host a: $(listing "$A/$2");"
    [ "$(listing "$B/$2")" = "ckpt_000003 ckpt_000006 lock" ] || bad="$bad host b: $(listing "$B/$2");"
    cmp -s "$A/$2/ckpt_000006/manifest.json" "$B/$2/ckpt_000006/manifest.json" || bad="$bad the hosts' manifests differ;"
    grep -q '"host_dirs": 2,' "$A/$2/ckpt_000006/manifest.json" || bad="$bad the manifest lacks \"host_dirs\": 2;"
    if [ -z "$bad" ]; then t_ok "$1"; else t_fail "$1" "$bad"; fi
}
# A second launch resumes from the per-host directories at step 3 and ends as the straight single-host run.
resumed_at_3() {   # name, run, layout, pattern the output must hold ('' for none), flags...
    local name=$1 run=$2 layout=$3 want=$4 rc out=$TMP/$1.txt
    shift 4
    two_hosts "$name" "$TMP/shared/$run" "$@" -n 3 -y 1
    rc=$?
    if [ $rc != 0 ]; then t_fail "$name" "resume failed (rc $rc): $(first_error "$out")"
    elif ! grep -q "resumed from $TMP/shared/$run/ckpt_000003 at step 3 " "$out"; then
        t_fail "$name" "did not resume at step 3: $(grep -m1 -e resumed -e '^error' "$out")"
    elif [ -n "$want" ] && ! grep -q -- "$want" "$out"; then t_fail "$name" "no '$want' in the output: $(grep -m1 warning "$out")"
    else same_run "$name" "$TMP/one_$layout" 6 "$A/$run" "$B/$run"; fi
}

for layout in z2 pp2; do
    case $layout in z2) flags=(-z 2) ;; pp2) flags=(-pp 2 -z 1 -ga 2) ;; esac
    run=nl_$layout
    if ! two_hosts "$run" "$TMP/shared/$run" "${flags[@]}" -n 3; then
        t_fail "multinode_nodelocal_$layout" "two-host run failed: $(first_error "$TMP/$run.txt")"
        continue
    fi
    same_run "multinode_nodelocal_${layout}_same_as_one_host" "$TMP/one_$layout" 6 "$A/$run" "$B/$run"
    own_files "multinode_nodelocal_${layout}_own_files_per_host" "$run"
    case $layout in
    z2)   # host b lost its newest checkpoint: both hosts resume from the one they share
        rm -rf "$B/$run/ckpt_000006"
        resumed_at_3 multinode_nodelocal_z2_resume_newest_missing_on_b "$run" z2 "" "${flags[@]}"
        # a state file on no host: the newest is skipped with a warning naming it
        rm -f "$B/$run/ckpt_000006/state_rank3.bin"
        resumed_at_3 multinode_nodelocal_z2_resume_state_file_lost "$run" z2 \
            "warning: skipping checkpoints incomplete on some host: .*ckpt_000006: state_rank3.bin is on no host" "${flags[@]}"
        # one bit of model.bin's header (its layer count) on host a: damage, told by the checksum, not another shape
        flip_bit "$A/$run/ckpt_000006/model.bin" 16
        resumed_at_3 multinode_nodelocal_z2_resume_model_header_damaged "$run" z2 \
            "warning: skipping checkpoints incomplete on some host: .*ckpt_000006: on the host of rank 0: model.bin is damaged: its CRC-32" "${flags[@]}" ;;
    pp2)  # host b's newest is incomplete (no DONE): host a's complete one is not taken alone
        rm -f "$B/$run/ckpt_000006/DONE"
        resumed_at_3 multinode_nodelocal_pp2_resume_newest_incomplete_on_b "$run" pp2 \
            "warning: skipping checkpoints incomplete on some host: .*ckpt_000006: on the host of rank 2: no DONE marker" "${flags[@]}"
        # a state file damaged on the host that holds it, in one bit of its header (the parameter count): its
        # holder's check of the CRC-32, before the header is read, names it
        flip_bit "$B/$run/ckpt_000006/state_rank3.bin" 16
        resumed_at_3 multinode_nodelocal_pp2_resume_state_file_damaged "$run" pp2 \
            "warning: skipping checkpoints incomplete on some host: .*ckpt_000006: state_rank3.bin is damaged: its CRC-32" "${flags[@]}" ;;
    esac
    own_files "multinode_nodelocal_${layout}_own_files_after_resume" "$run"
done

# bf16: the working copy of the pieces other replicas own comes only from their state files (rounded
# stochastically, it is not model.bin's fp32 rounded), on the other host: a resume still ends bit for bit
# as the run it continues.
if two_hosts nl_bf16 "$TMP/shared/nl_bf16" -z 1 -p bf16 -n 3; then
    mkdir -p "$TMP/bf16_straight/ckpt_000006"
    cp "$A/nl_bf16/log.jsonl" "$TMP/bf16_straight/"
    cp "$A/nl_bf16/ckpt_000006/"* "$B/nl_bf16/ckpt_000006/"state_rank*.bin "$TMP/bf16_straight/ckpt_000006/"
    rm -rf "$A/nl_bf16/ckpt_000006" "$B/nl_bf16/ckpt_000006"
    two_hosts nl_bf16_resumed "$TMP/shared/nl_bf16" -z 1 -p bf16 -n 3 -y 1
    rc=$?
    if [ $rc != 0 ] || ! grep -q "resumed from $TMP/shared/nl_bf16/ckpt_000003 at step 3 " "$TMP/nl_bf16_resumed.txt"; then
        t_fail multinode_nodelocal_bf16_resume "rc $rc: $(grep -m1 -e resumed -e '^error' "$TMP/nl_bf16_resumed.txt")"
    else
        same_run multinode_nodelocal_bf16_resume "$TMP/bf16_straight" 6 "$A/nl_bf16" "$B/nl_bf16"
    fi
else
    t_fail multinode_nodelocal_bf16_resume "two-host run failed: $(first_error "$TMP/nl_bf16.txt")"
fi

# Another topology over the same two hosts: 1 rank each under -z 1 (same tokens per step) resumes from
# the -z 2 run's step 3, each state file read on the host that has it; the losses match the straight run
# within 1e-5 (other ranks, other sums).
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$TMP/hostfile1"
rm -rf "$A/nl_z2/ckpt_000006" "$B/nl_z2/ckpt_000006"
timeout -k 5 120 "$hosts" exec a "${MPIRUN[@]}" --hostfile "$TMP/hostfile1" -np 2 "${NET[@]}" ./train_gpt_cpu "${base[@]}" -z 1 -ga 2 \
    -o "$TMP/shared/nl_z2" -n 3 -y 1 > "$TMP/nl_topology.txt" 2>&1
rc=$?
close=$($PYTHON - "$TMP/one_z2/log.jsonl" "$A/nl_z2/log.jsonl" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print(int(sorted(a) == sorted(b) == list(range(6)) and all(abs(a[s] - b[s]) <= 1e-5 for s in a)))
PY
)
t_check multinode_nodelocal_resume_other_topology "[ $rc = 0 ] && [ '$close' = 1 ] && \
    grep -q 'resumed from $TMP/shared/nl_z2/ckpt_000003 at step 3 (written by 4 ranks' '$TMP/nl_topology.txt'" \
    "rc $rc, losses within 1e-5: $close: $(first_error "$TMP/nl_topology.txt")"

# One host alone cannot resume what two hosts wrote into their own directories: one line naming the state
# file that is on the other host and what to do, before any step.
timeout -k 5 120 "$hosts" exec a "${MPIRUN[@]}" -np 4 ./train_gpt_cpu "${base[@]}" -pp 2 -z 1 -ga 2 -o "$TMP/shared/nl_pp2" -y 1 \
    > "$TMP/nl_one_host.txt" 2>&1
rc=$?
t_check multinode_nodelocal_one_host_refused "[ $rc -ne 0 ] && [ \$(grep -c '^error' '$TMP/nl_one_host.txt') = 1 ] && \
    grep -q '^error: no usable checkpoint in $TMP/shared/nl_pp2 (.*state_rank2.bin is missing: the checkpoint was written into 2 hosts. own directories; copy .* onto one shared filesystem' '$TMP/nl_one_host.txt' && \
    ! grep -q '^step ' '$TMP/nl_one_host.txt'" "rc $rc: $(first_error "$TMP/nl_one_host.txt")"
# The way out that line names: host b's state files copied beside host a's make an ordinary checkpoint,
# and 4 ranks on host a resume from it, ending as the straight run.
cp "$B/nl_pp2/ckpt_000003/"state_rank*.bin "$A/nl_pp2/ckpt_000003/"
rm -rf "$A/nl_pp2/ckpt_000006"
timeout -k 5 120 "$hosts" exec a "${MPIRUN[@]}" -np 4 ./train_gpt_cpu "${base[@]}" -pp 2 -z 1 -ga 2 -o "$TMP/shared/nl_pp2" -y 1 \
    > "$TMP/nl_copied.txt" 2>&1
rc=$?
if [ $rc != 0 ] || ! grep -q "resumed from $TMP/shared/nl_pp2/ckpt_000003 at step 3 " "$TMP/nl_copied.txt"; then
    t_fail multinode_nodelocal_copied_resumes_on_one_host "rc $rc: $(grep -m1 -e resumed -e '^error' "$TMP/nl_copied.txt")"
else
    same_run multinode_nodelocal_copied_resumes_on_one_host "$TMP/one_pp2" 6 "$A/nl_pp2"
fi
t_check multinode_shared_path_untouched "[ -z \"\$(ls -A $TMP/shared)\" ]" "$TMP/shared holds files: the bind mounts leaked"
t_finish
