#!/usr/bin/env bash
# Runs every CPU test: the C test programs in build/, then each tests/system/t_*.sh script. Every check prints
# "ok NAME" or "FAIL NAME: why"; a program or script that exits non-zero without printing a FAIL counts
# as one failure of its own; "skip NAME: why" is a check that cannot run here. Each program's or script's
# times follow as a "# NAME: N s, cpu M s" line (wall; user + system, its children's included). Last line: "N passed, N failed, N skipped". Exit status 1 if
# anything failed.
#
# GPT_TEST_JOBS (default: the number of cores) programs and scripts run at once, each one's lines printed
# together when it ends; most use one core, waiting on the next process to start. A script whose header has
# the line "# run_all: alone" runs with nothing beside it: it times a hang or a signal against its bounds.
# One with "# run_all: first" is among the longest and starts before the others.
set -u
cd "$(dirname "$0")/.."
export PYTHON=${PYTHON:-/usr/bin/python3}
jobs=${GPT_TEST_JOBS:-$(nproc)}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "GPT_TEST_JOBS=$jobs is not a positive number" >&2; exit 2; }
out_dir=$(mktemp -d /tmp/gpt-run-all.XXXXXX)
trap 'rm -rf "$out_dir"' EXIT
passed=0 failed=0 skipped=0
running=()

# Runs one program or script into out_dir/NAME.{out,rc,s}, with an OpenMPI session directory of its own: two
# jobs at once (singleton MPI_Init included) could otherwise pick the same one and fail to start.
run_one() {   # name, command...
    local name=$1; shift
    local start=$SECONDS TIMEFORMAT='%U %S'
    mkdir -p "$out_dir/$name.ompi"
    { time OMPI_MCA_orte_tmpdir_base="$out_dir/$name.ompi" "$@" > "$out_dir/$name.out" 2>&1; } 2> "$out_dir/$name.cpu"
    echo $? > "$out_dir/$name.rc.tmp"
    echo "$((SECONDS - start)) s, cpu $(awk '{printf "%.0f", $1 + $2}' "$out_dir/$name.cpu") s" > "$out_dir/$name.s"
    mv "$out_dir/$name.rc.tmp" "$out_dir/$name.rc"
}

# Prints a finished one's lines and adds its counts.
report() {   # name
    local name=$1 out rc p f s
    out=$(cat "$out_dir/$name.out"); rc=$(cat "$out_dir/$name.rc")
    echo "# $name: $(cat "$out_dir/$name.s")"   # where the suite's time goes: wall, and user + system
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) ' || true
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^skip ')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited $rc without reporting a failure; last lines:"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
        f=1
    fi
    if [ "$rc" -eq 0 ] && [ "$f" -ne 0 ]; then
        echo "FAIL $name: reported failures but exited 0"
        f=$((f + 1))
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

# Reports every running one that has ended; keeps the rest.
reap() {
    local still=() name
    for name in "${running[@]}"; do
        if [ -e "$out_dir/$name.rc" ]; then report "$name"; else still+=("$name"); fi
    done
    running=("${still[@]}")
}

# Waits until fewer than `1` (all ended) or `jobs` are running.
drain_to() {   # how many may stay running
    while [ ${#running[@]} -ge "$1" ] && [ ${#running[@]} -gt 0 ]; do
        wait -n 2>/dev/null || true
        reap
    done
}

start() {   # name, command...
    drain_to "$jobs"
    run_one "$@" &
    running+=("$1")
}

for t in build/test_*; do
    [ -x "$t" ] && start "$(basename "$t")" "$t"
done
# The scripts whose header has "# run_all: first" (the longest) start first, so that short ones fill the
# end; those that run alone go last, one after another: each would otherwise first wait, with a core idle,
# for the job beside it to end.
marked() { sed -n '1,/^source /p' "$2" | grep -q "^# run_all: $1\$"; }   # marker, script
alone=() rest=()
for s in tests/system/t_*.sh; do
    [ -f "$s" ] || continue
    if marked alone "$s"; then alone+=("$s")
    elif marked first "$s"; then start "$(basename "$s")" bash "$s"
    else rest+=("$s")
    fi
done
for s in "${rest[@]}"; do start "$(basename "$s")" bash "$s"; done
drain_to 1
for s in "${alone[@]}"; do
    run_one "$(basename "$s")" bash "$s"
    report "$(basename "$s")"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
