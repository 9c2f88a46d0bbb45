#!/usr/bin/env bash
# Multi-node runs on one machine: two "hosts" made of network namespaces joined by a veth pair
# (scripts/netns_hosts.sh), orted started on the second through an ssh-like launch agent
# (scripts/netns_agent.sh), every byte between the ranks over TCP on the veth. 2 hosts x 2 ranks under -z 2
# and under -pp 2 log the same losses and norms, bit for bit, and end in the same checkpoint as 4 ranks on
# one host (same ranks, same reduction order); the ranks really ran 2 per namespace, node-local ranks 0 and
# 1 on each; the veth carried the traffic. A run over both hosts checkpoints into a shared -o and a second
# launch resumes from it, ending as the straight single-host run does. With storage that is not shared
# (each host sees its own directory at the -o path) the trainer refuses at start-up with one line.
# Needs root, ip (iproute2), unshare and an MPI build; otherwise one "skip" line.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
skip() { echo "skip t_multinode: $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip command (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no unshare command (util-linux)"
mpi_available || skip "needs mpirun and train_gpt_cpu built with MPI"
export NETNS_A=gzt_a$$ NETNS_B=gzt_b$$   # this run's own pair: tests running side by side never meet
probe=gzt_p$$
err=$(ip netns add "$probe" 2>&1) || skip "ip netns add failed: $(printf '%s' "$err" | head -1)"
ip netns del "$probe"

hosts=scripts/netns_hosts.sh
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
MULTI=(--hostfile "$TMP/hostfile" -np 4 --mca plm_rsh_agent "$PWD/scripts/netns_agent.sh" --mca plm_rsh_no_tree_spawn 1
       --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
# Each rank first records where it runs: world rank, OpenMPI's node-local rank, network namespace, hostname.
cat > "$TMP/rank.sh" <<EOF
#!/bin/sh
echo "\$OMPI_COMM_WORLD_RANK \$OMPI_COMM_WORLD_LOCAL_RANK \$(ip netns identify \$\$ | grep . || echo root) \$(hostname)" > "\$WHERE.\$OMPI_COMM_WORLD_RANK"
exec "$PWD/train_gpt_cpu" "\$@"
EOF
chmod +x "$TMP/rank.sh"
fields() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
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

# No shared filesystem: the same path, $TMP/shared, is host a's directory on host a and host b's on host b
# (a bind mount in each host's mount namespace). Every rank writes its state file into -o and loading may
# read any rank's, so the trainer refuses at start-up, before any step, with one line naming -o; node-local
# checkpoint directories are not supported.
mkdir -p "$TMP/shared" "$TMP/host_a" "$TMP/host_b"
export NETNS_BIND_A=$TMP/host_a:$TMP/shared NETNS_BIND_B=$TMP/host_b:$TMP/shared
two_hosts split "$TMP/shared" -z 2 -n 3
rc=$?
t_check multinode_unshared_out_dir_refused "[ $rc -ne 0 ] && grep -q '^error: rank [23]: -o $TMP/shared is not shared: this rank does not see' '$TMP/split.txt' && \
    [ ! -e '$TMP/host_a/ckpt_000003' ] && ! grep -q '\"step\": 0, \"loss' '$TMP/host_a/log.jsonl' 2>/dev/null" \
    "rc $rc: $(first_error "$TMP/split.txt")"
t_check multinode_shared_path_untouched "[ -z \"\$(ls -A $TMP/shared)\" ]" "$TMP/shared holds files: the bind mounts leaked"
t_finish
