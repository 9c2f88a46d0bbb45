#!/usr/bin/env bash
# same_bits.sh BASE: whether the kernels of the working tree give, under the emulator, the very bits commit
# BASE's give, on every kernel_check shape in fp32, bf16 and fp16 -- the test a refactor of a default-path
# kernel or launcher passes before it lands (tests/emu/README.md). BASE must have the emulator (tests/emu).
# SHAPES (a KERNEL_CHECK_SHAPES list) narrows it; the default is every shape. Outputs of checks BASE does not
# have are counted, not compared. One "ok" / "FAIL" line per dtype, and one FAIL per output file that differs.
set -u
cd "$(dirname "$0")/../.."
base=${1:?usage: same_bits.sh BASE}
work=$(mktemp -d /tmp/same_bits.XXXXXX)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add --detach -q "$work/base" "$base" || { echo "FAIL same_bits: cannot check out $base"; exit 1; }
[ -f "$work/base/tests/emu/emu.mk" ] || { echo "FAIL same_bits: $base has no kernel emulator"; exit 1; }
make -s build/kernel_check_emu > "$work/head_build.log" 2>&1 || { echo "FAIL same_bits: the working tree does not build"; exit 1; }
(cd "$work/base" && make -s build/kernel_check_emu) > "$work/base_build.log" 2>&1 || { echo "FAIL same_bits: $base does not build"; exit 1; }
failed=0
for dt in fp32 bf16 fp16; do
    for side in base head; do
        bin=build/kernel_check_emu
        [ $side = base ] && bin=$work/base/build/kernel_check_emu
        env ${SHAPES:+KERNEL_CHECK_SHAPES=$SHAPES} "$bin" "$work/$side-$dt" 3 "$dt" > "$work/$side-$dt.log" 2>&1 ||
            { echo "FAIL same_bits_$dt: the $side kernels fail under the emulator: $(grep -m1 '^emulator:\|FAIL' "$work/$side-$dt.log")"; failed=1; continue 2; }
    done
    # Every output BASE lists, listed alike here; outputs of checks added since are counted, not compared.
    missing=$(sort "$work/base-$dt/index.txt" | comm -23 - <(sort "$work/head-$dt/index.txt"))
    if [ -n "$missing" ]; then
        echo "FAIL same_bits_$dt: outputs $base lists are missing or differ in size: $(head -3 <<< "$missing" | tr '\n' ' ')"
        failed=1; continue
    fi
    new=$(($(wc -l < "$work/head-$dt/index.txt") - $(wc -l < "$work/base-$dt/index.txt")))
    n=0 bad=0
    while read -r kernel tensor _; do
        f=$kernel.$tensor.f32
        n=$((n + 1))
        cmp -s "$work/base-$dt/$f" "$work/head-$dt/$f" || { echo "FAIL same_bits_${dt}_$kernel.$tensor: the bits differ from $base's"; bad=1; }
    done < "$work/base-$dt/index.txt"
    if [ $bad = 0 ]; then echo "ok same_bits_$dt: $n outputs bit-identical to $base's ($new new)"; else failed=1; fi
done
exit $failed
