#!/usr/bin/env bash
# Training across a slow link, measured: two hosts made of network namespaces (tests/netns/hosts.sh) joined by a
# veth pair whose both ends `tc` limits (tbf) to each bandwidth given, 2 ranks on each host, and per bandwidth
# each pair of configurations run side by side (a baseline and the technique that should beat it there): the
# median step time after the warm-up, the bytes per step per link class (log.jsonl's link_bytes, summed over
# the ranks) and the bytes that crossed the veth; then per pair its ratio of cross-host bytes and the bandwidths
# at which it was faster (table.md). Needs root, ip and tc (iproute2), unshare and an MPI build. Time it on an
# otherwise idle machine.
#
#   scripts/bench_slow_link.sh [-bw "BW..."] [-p "BASE;OTHER"]... [-x STEPS] [-w WARMUP] [-o DIR] [-- FLAGS...]
#
#   -bw "BW..."   bandwidths: unlimited or tc rates (100mbit, 1gbit, 500kbit) (default "unlimited 1gbit 100mbit")
#   -p "BASE;OTHER"  a pair of configurations (repeatable). Default: "-z 3;-z 3 -hpz 2 -qw 1" (with -qg 1
#                 when the binary knows it) and "-z 2;-z 2 -opt adam1bit -freeze W"
#   -x STEPS      steps per run (default 8); -w WARMUP steps left out of the median and the bytes (default 3;
#                 the default pair's -freeze is WARMUP - 1, so 1-bit Adam's measured steps are its compressed
#                 ones after the first, which also all-reduces the frozen variance)
#   -o DIR        where the runs and table.md go (default build/bench_slow_link)
#   -timeout S    a run's wall-clock limit in seconds (default 900)
#   -- FLAGS      trainer flags after the defaults, which they override: the quick start's model on its data
#                 (scripts/quickstart.sh), -b 2 -t 128 per rank (its 8 sequences a step over 4 ranks)
#
# It removes the namespaces (and with them the veth and its limits) on every exit, Ctrl-C included.
# GPT_BIN picks the binary (default ./train_gpt_cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
me=scripts/bench_slow_link.sh
die() { echo "$me: error: $*" >&2; exit 1; }
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=${GPT_BIN:-./train_gpt_cpu}
BANDWIDTHS="unlimited 1gbit 100mbit" STEPS=8 WARMUP=3 OUT=build/bench_slow_link RUN_TIMEOUT=900
pairs=() extra=()
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"; }
while [ $# -gt 0 ]; do
    case $1 in
        --) shift; extra=("$@"); break ;;
        -bw | -p | -x | -w | -o | -timeout) [ $# -ge 2 ] || die "$1 needs a value" ;;
    esac
    case $1 in
        -bw) BANDWIDTHS=$2 ;;
        -p) base=${2%%;*} other=${2#*;}
            [[ $2 == *";"* && $other != *";"* && $base =~ [^[:space:]] && $other =~ [^[:space:]] ]] ||
                die "-p needs \"BASE FLAGS;OTHER FLAGS\", got '$2'"
            pairs+=("$2") ;;
        -x) positive "$1" "$2"; STEPS=$2 ;;
        -w) [[ $2 =~ ^[0-9]+$ ]] || die "-w needs a count of steps, got '$2'"; WARMUP=$2 ;;
        -o) OUT=$2 ;;
        -timeout) positive "$1" "$2"; RUN_TIMEOUT=$2 ;;
        *) die "unknown argument '$1' (see the comment at the top of $me)" ;;
    esac
    shift 2
done
[ "$WARMUP" -lt "$STEPS" ] || die "-w $WARMUP leaves none of the $STEPS steps to time"
[ "$WARMUP" -ge 2 ] || [ ${#pairs[@]} -gt 0 ] || die "-w $WARMUP: the default 1-bit Adam pair needs 2 steps of warm-up (-freeze 1 and its first compressed step)"
read -ra bandwidths <<< "$BANDWIDTHS"
[ ${#bandwidths[@]} -gt 0 ] || die "-bw gives no bandwidth"
for bw in "${bandwidths[@]}"; do
    [[ $bw =~ ^(unlimited|[1-9][0-9]*(kbit|mbit|gbit))$ ]] || die "bandwidth '$bw' is not unlimited or a tc rate like 100mbit"
done
[ "$(id -u)" = 0 ] || die "must run as root (network namespaces, tc)"
for tool in ip tc unshare mpirun; do command -v "$tool" >/dev/null 2>&1 || die "no $tool command"; done
[ -x "$BIN" ] || die "$BIN not built (make train_gpt_cpu)"
BIN=$(readlink -f "$BIN")   # host b's ranks start in the repository, so the path must not be relative
ldd "$BIN" | grep libmpi >/dev/null || die "$BIN has no MPI (install openmpi-bin libopenmpi-dev and rebuild)"
if [ ${#pairs[@]} = 0 ]; then
    qg=""
    if "$BIN" -h 2>&1 | grep -- '^  -qg ' >/dev/null; then qg=" -qg 1"; fi
    pairs=("-z 3;-z 3 -hpz 2 -qw 1$qg" "-z 2;-z 2 -opt adam1bit -freeze $((WARMUP - 1))")
fi
[[ " ${extra[*]} " == *" -i "* ]] || bash scripts/prepare_kjv.sh

hosts=tests/netns/hosts.sh
export NETNS_A=gzs_a$$ NETNS_B=gzs_b$$   # this run's own pair: nothing else running here meets it
run_pid=""
cleanup() {   # under set -e: every status here is handled, so the namespaces always go
    if [ -n "$run_pid" ]; then
        kill -TERM -- "-$run_pid" 2>/dev/null || true
        wait "$run_pid" 2>/dev/null || true
    fi
    "$hosts" down >/dev/null 2>&1 || echo "$me: warning: could not remove the namespaces $NETNS_A, $NETNS_B" >&2
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$hosts" up >/dev/null || die "the two hosts did not come up"

# Both ends of the veth limited: each direction carries at most BW. tbf's bucket holds 10 ms at the rate (at
# least 64 KiB, so a full-size segment always fits).
limit() {   # bandwidth
    local ns dev bits
    for ns in "$NETNS_A" "$NETNS_B"; do
        dev=${ns}0
        if [ "$1" = unlimited ]; then
            if ip netns exec "$ns" tc qdisc show dev "$dev" | grep tbf >/dev/null; then
                ip netns exec "$ns" tc qdisc del dev "$dev" root || die "tc could not remove the limit on $dev"
            fi
            continue
        fi
        bits=${1%bit}
        case $bits in *k) bits=$(( ${bits%k} * 1000 )) ;; *m) bits=$(( ${bits%m} * 1000000 )) ;; *g) bits=$(( ${bits%g} * 1000000000 )) ;; esac
        ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$1" burst $(( bits / 800 > 65536 ? bits / 800 : 65536 )) \
            latency 100ms || die "tc could not limit $dev to $1"
    done
}
veth_bytes() {   # sent and received on host a's end of the veth
    local d=/sys/class/net/${NETNS_A}0/statistics
    echo $(( $(ip netns exec "$NETNS_A" cat $d/tx_bytes) + $(ip netns exec "$NETNS_A" cat $d/rx_bytes) ))
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mkdir -p "$OUT"
out_abs=$(cd "$OUT" && pwd)
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' > "$OUT/hostfile"
# mpirun on host a starts host b's orted through the agent; all traffic on the veth (tests/system/t_multinode.sh).
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS --hostfile "$out_abs/hostfile" -np 4
        --mca plm_rsh_agent "$PWD/tests/netns/agent.sh" --mca plm_rsh_no_tree_spawn 1
        --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
common=(-e L4C128H4T256 -b 2 -t 128 -x "$STEPS" -l 1e-4 -v 0 -s 0 -n 0 -ow 1)

runs=()
for bw in "${bandwidths[@]}"; do
    limit "$bw"
    mkdir -p "$out_abs/$bw"
    for p in "${pairs[@]}"; do
        for role in base other; do
            if [ $role = base ]; then cfg=${p%%;*}; else cfg=${p#*;}; fi
            read -ra flags <<< "$cfg"
            dir=$out_abs/$bw/$(echo "$cfg" | tr -c 'A-Za-z0-9\n' _)
            echo "$me: $bw: ${flags[*]}" >&2
            before=$(veth_bytes)
            setsid timeout -k 5 "$RUN_TIMEOUT" "$hosts" exec a "${MPIRUN[@]}" "$BIN" "${common[@]}" "${flags[@]}" \
                "${extra[@]}" -o "$dir" > "$dir.txt" 2>&1 &
            run_pid=$!
            rc=0
            wait "$run_pid" || rc=$?
            run_pid=""
            [ $rc = 0 ] || die "$bw, ${flags[*]}: the run failed (rc $rc): $(grep -m1 '^error' "$dir.txt" || grep -m1 -v '^-*$' "$dir.txt")"
            runs+=("$bw	$role	$cfg	$dir/log.jsonl	$(( $(veth_bytes) - before ))")
        done
    done
done

printf '%s\n' "${runs[@]}" > "$OUT/runs.tsv"
"$PYTHON" - "$WARMUP" "$OUT/runs.tsv" > "$OUT/table.md" <<'PY'
import json, statistics, sys
warmup, runs = int(sys.argv[1]), sys.argv[2]
MB = 1e6

def measure(log):   # median step ms, mean MB per step per link class (all ranks), after the warm-up
    recs = [json.loads(l) for l in open(log)]
    ms = [r["dt_ms"] for r in recs if "dt_ms" in r and r["step"] >= warmup]
    links = [r["link_bytes"] for r in recs if "link_bytes" in r and r["step"] >= warmup]
    if not ms or not links:
        sys.exit("error: %s has no timed steps or no link_bytes after step %d" % (log, warmup))
    per_step = {k: sum(sum(l[k]) for l in links) / len(links) / MB for k in ("intra_host", "cross_host")}
    return statistics.median(ms), per_step

print("| bandwidth | configuration | median step ms | speed-up over the baseline | intra-host MB/step | cross-host MB/step | veth MB (run) |")
print("|---|---|---|---|---|---|---|")
base = None
pays = {}   # (baseline, other): [(bandwidth, speed-up, cross-host bytes of the baseline over the other's)]
for line in open(runs):
    bw, role, cfg, log, veth = line.rstrip("\n").split("\t")
    ms, per_step = measure(log)
    if role == "base":
        base = (cfg, ms, per_step["cross_host"])
        speedup = "1.00"
    else:
        pays.setdefault((base[0], cfg), []).append((bw, base[1] / ms, base[2] / max(per_step["cross_host"], 1e-12)))
        speedup = "%.2f" % (base[1] / ms)
    print("| %s | `%s` | %.1f | %s | %.2f | %.2f | %.2f |" % (bw, cfg, ms, speedup, per_step["intra_host"],
          per_step["cross_host"], int(veth) / MB))
print()
for (b, o), rows in pays.items():
    faster = [bw for bw, x, _ in rows if x > 1]
    print("- `%s` against `%s`: %.2fx fewer cross-host bytes; faster at %s" % (o, b, rows[0][2], ", ".join(faster) or "none of the bandwidths"))
PY
cat "$OUT/table.md"
