#!/usr/bin/env bash
# agent.sh: an OpenMPI launch agent for the two hosts of tests/netns/hosts.sh. OpenMPI calls it as it
# would ssh (`agent [ssh options] HOST COMMAND...`) to start orted on HOST; it runs COMMAND there through
# `hosts.sh exec HOST` (that host's network, hostname and mounts) with a clean environment, as a login
# over ssh would have, in the repository. Use it with
#   mpirun --mca plm_rsh_agent "$PWD/tests/netns/agent.sh" --hostfile HOSTFILE ...
# run inside host a (tests/netns/hosts.sh exec a mpirun ...): see tests/system/t_multinode.sh for the full line.
# Carried into the remote environment: PATH, HOME, USER, LOGNAME, LANG, SHELL, TMPDIR, LD_LIBRARY_PATH, the
# root permission for OpenMPI (OMPI_ALLOW_RUN_AS_ROOT*), NETNS_* (for a daemon that starts others), and the
# variables named in NETNS_AGENT_ENV (space-separated). Variables for the ranks themselves: mpirun -x NAME.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$(dirname "$here")")
while [ $# -gt 0 ]; do   # ssh options OpenMPI or a user may pass: those with a value, then flags
    case $1 in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "agent.sh: error: usage: agent.sh [options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift
"$here/hosts.sh" ns "$host" >/dev/null || exit 255   # its one-line error names the host
keep=()
for v in PATH HOME USER LOGNAME LANG SHELL TMPDIR LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
         $(compgen -e | grep '^NETNS_') ${NETNS_AGENT_ENV:-}; do
    [ -n "${!v+x}" ] && keep+=("$v=${!v}")
done
# ssh joins its arguments into one line for the remote shell, and OpenMPI quotes for that shell.
exec "$here/hosts.sh" exec "$host" env -i "${keep[@]}" /bin/sh -c "cd '$repo' && $*"
