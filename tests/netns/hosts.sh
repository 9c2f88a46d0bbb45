#!/usr/bin/env bash
# hosts.sh: two "hosts" on one Linux machine, for multi-node runs without a second machine (root only).
#
#   tests/netns/hosts.sh up              network namespaces gz_a and gz_b, joined by a veth pair:
#                                          gz_a 10.77.0.1/24 (interface gz_a0), gz_b 10.77.0.2/24 (gz_b0),
#                                          loopback up in each; /etc/netns/<ns>/hosts names both hosts
#   tests/netns/hosts.sh down            removes them (and the hosts files)
#   tests/netns/hosts.sh status          prints the two hosts; exit 1 unless both are up
#   tests/netns/hosts.sh ns HOST         prints HOST's namespace; exit 1 for an unknown host
#   tests/netns/hosts.sh exec HOST CMD   runs CMD "on" HOST: in its network namespace, in a UTS namespace
#                                          whose hostname is the namespace's name with - for _ (gz-a),
#                                          in a mount namespace of its own
#
# HOST is a, b, the namespace's name (gz_a, gz_b), its hostname (gz-a, gz-b) or its address (10.77.0.1,
# 10.77.0.2); inside either namespace the names resolve (ip netns exec mounts /etc/netns/<ns>/hosts).
# NETNS_BIND_A / NETNS_BIND_B=SRC:DST: exec bind-mounts SRC on DST (an existing directory) for that host
# only, so the two hosts see different files at one path: storage that is not shared.
# NETNS_A, NETNS_B override the namespace names. up and down are idempotent; errors are one line.
set -u
NS_A=${NETNS_A:-gz_a}
NS_B=${NETNS_B:-gz_b}
IP_A=10.77.0.1
IP_B=10.77.0.2
PREFIX=24
me=$(basename "$0")

die() { echo "$me: error: $*" >&2; exit 1; }

# a or b for a host name, namespace or address; empty when unknown.
host_side() {
    case $1 in
        a | "$NS_A" | "${NS_A//_/-}" | "$IP_A") echo a ;;
        b | "$NS_B" | "${NS_B//_/-}" | "$IP_B") echo b ;;
    esac
}
ns_of() { [ "$1" = a ] && echo "$NS_A" || echo "$NS_B"; }

ns_exists() { [ -e "/run/netns/$1" ]; }

# Runs a command; on failure dies with the command's first line of stderr.
try() {
    local err
    if ! err=$("$@" 2>&1 >/dev/null); then
        die "$* failed: $(printf '%s' "$err" | head -1)"
    fi
}

is_up() {
    ns_exists "$NS_A" && ns_exists "$NS_B" &&
        ip netns exec "$NS_A" ip -o addr show dev "${NS_A}0" 2>/dev/null | grep -q " $IP_A/$PREFIX " &&
        ip netns exec "$NS_B" ip -o addr show dev "${NS_B}0" 2>/dev/null | grep -q " $IP_B/$PREFIX " &&
        ip netns exec "$NS_A" ip -o link show dev "${NS_A}0" 2>/dev/null | grep -q 'state UP'
}

hosts_file() {   # the system's /etc/hosts plus both hosts, for ip netns exec to mount in each namespace
    cat /etc/hosts 2>/dev/null
    printf '%s %s %s\n' "$IP_A" "$NS_A" "${NS_A//_/-}" "$IP_B" "$NS_B" "${NS_B//_/-}"
}

down() {
    local ns
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then try ip netns del "$ns"; fi
        rm -rf "/etc/netns/$ns"
    done
    rmdir /etc/netns 2>/dev/null || true   # only when no other namespace keeps files there
}

up() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"
    command -v ip >/dev/null 2>&1 || die "no ip command (install iproute2)"
    if is_up; then
        echo "hosts up (already): $NS_A $IP_A, $NS_B $IP_B"
        return 0
    fi
    down   # a half-built pair from an interrupted run
    try ip netns add "$NS_A"
    try ip netns add "$NS_B"
    try ip link add "${NS_A}0" netns "$NS_A" type veth peer name "${NS_B}0" netns "$NS_B"
    try ip -n "$NS_A" addr add "$IP_A/$PREFIX" dev "${NS_A}0"
    try ip -n "$NS_B" addr add "$IP_B/$PREFIX" dev "${NS_B}0"
    local ns
    for ns in "$NS_A" "$NS_B"; do
        try ip -n "$ns" link set lo up
        try ip -n "$ns" link set "${ns}0" up
        mkdir -p "/etc/netns/$ns" && hosts_file > "/etc/netns/$ns/hosts" || die "cannot write /etc/netns/$ns/hosts"
    done
    is_up || die "the veth pair did not come up"
    echo "hosts up: $NS_A $IP_A (${NS_A}0), $NS_B $IP_B (${NS_B}0)"
}

run_on() {   # host, command...
    local side ns bind
    side=$(host_side "$1")
    [ -n "$side" ] || die "unknown host '$1' (expected a, b, $NS_A, $NS_B, ${NS_A//_/-}, ${NS_B//_/-}, $IP_A or $IP_B)"
    ns=$(ns_of "$side")
    ns_exists "$ns" || die "host $1: namespace $ns does not exist (run: $0 up)"
    shift
    [ $# -gt 0 ] || die "exec: no command"
    if [ "$side" = a ]; then bind=${NETNS_BIND_A:-}; else bind=${NETNS_BIND_B:-}; fi
    # ip netns exec gives the command its own mount namespace already (to remount /sys); unshare adds a
    # UTS namespace for the hostname and makes the mounts private, so a bind mount stays on this host.
    exec ip netns exec "$ns" unshare --mount --uts --propagation private /bin/sh -c '
        ns=$1 bind=$2; shift 2
        hostname "$(echo "$ns" | tr _ -)" || exit 1
        if [ -n "$bind" ]; then
            src=${bind%%:*} dst=${bind#*:}
            mount --bind "$src" "$dst" || { echo "hosts.sh: error: host $ns: cannot bind $src on $dst" >&2; exit 1; }
        fi
        exec "$@"' sh "$ns" "$bind" "$@"
}

case ${1:-} in
    up) up ;;
    down) down; echo "hosts down: $NS_A, $NS_B" ;;
    status)
        if is_up; then echo "hosts up: $NS_A $IP_A, $NS_B $IP_B"; else echo "hosts down"; exit 1; fi ;;
    ns)
        side=$(host_side "${2:-}")
        [ -n "$side" ] || die "unknown host '${2:-}' (expected a, b, $NS_A, $NS_B, ${NS_A//_/-}, ${NS_B//_/-}, $IP_A or $IP_B)"
        ns_of "$side" ;;
    exec) shift; run_on "$@" ;;
    *) echo "usage: $me up | down | status | ns HOST | exec HOST COMMAND..." >&2; exit 2 ;;
esac
