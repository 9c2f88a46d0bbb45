#!/usr/bin/env bash
# plant.sh [NAME...]: the emulator catches what it claims. Each plant is one bug put into a copy of kernels/
# (never the tree itself); the copy is built into its own kernel_check_emu, run on the shape and dtype that
# reach the bug, and the bug must be reported: by the emulator (an "emulator: ..." fault line) or by the
# comparison with the CPU twin (compare_kernels.py FAILs the kernel). One "ok plant_NAME" / "FAIL" each.
set -u
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-/usr/bin/python3}
# name | file | text | replacement | kernel_check shape | dtype | what must report it (fault text or FAIL kernel)
PLANTS=(
  "missing_barrier|cuda_common.cuh|    if (lane == 0) shared[warp] = x;\n    __syncthreads();|    if (lane == 0) shared[warp] = x;|odd|fp32|race on shared memory"
  "tail_off_by_one|gelu.cuh|j < i + P \&\& j < n; j++) out[j] = from_f<T>(to_f(a[j]) + to_f(b[j]))|j < i + P \&\& j <= n; j++) out[j] = from_f<T>(to_f(a[j]) + to_f(b[j]))|odd|bf16|past the end"
  "mma_fragment|attention_mha.cuh|pa[n / 2][(n \& 1) * 2 + 0] = pack2<T>(p0, p1);|pa[n / 2][(n \& 1) * 2 + 1] = pack2<T>(p0, p1);|hs64tail|bf16|FAIL bf16_hs64tail_attention_forward"
  "shuffle_width|cuda_common.cuh|x += __shfl_xor_sync(0xffffffffu, x, o);|x += __shfl_xor_sync(0xffffffffu, x, o, 16);|odd|fp32|FAIL fp32_odd_layernorm_forward"
  "dropout_index32|lora_dropout.cuh|(uint64_t)n * (uint64_t)width|(uint64_t)(uint32_t)(n * width)|odd|bf16|FAIL bf16_odd_lora_dropout_columns"
  "int4_high_nibble|quantize.cuh|i + 1 < hi ? quant_nibble(quant_level(to_f(x[i + 1])|i + 1 < hi ? quant_nibble(quant_level(to_f(x[i])|odd|bf16|FAIL bf16_odd_quantize_int4_block64"
)
want=("$@")
work=$(mktemp -d /tmp/emu-plant.XXXXXX)
[ "${PLANT_KEEP:-0}" = 1 ] && echo "# plant.sh: keeping $work" || trap 'rm -rf "$work"' EXIT
failed=0
for p in "${PLANTS[@]}"; do
    IFS='|' read -r name file text repl shape dt expect <<< "$p"
    if [ ${#want[@]} -gt 0 ] && [[ " ${want[*]} " != *" $name "* ]]; then continue; fi
    dir=$work/$name
    mkdir -p "$dir"
    cp -r kernels "$dir/kernels"
    if ! "$PYTHON" - "$dir/kernels/$file" "$text" "$repl" <<'EOF'
import sys
path, text, repl = sys.argv[1], sys.argv[2].replace("\\n", "\n").replace("\\&", "&"), sys.argv[3].replace("\\n", "\n").replace("\\&", "&")
src = open(path).read()
if src.count(text) < 1:
    sys.exit("the text to replace is not in %s" % path)
open(path, "w").write(src.replace(text, repl, 1))
EOF
    then echo "FAIL plant_$name: cannot plant it (kernels/$file changed?)"; failed=1; continue; fi
    bin=$dir/kernel_check_emu
    if ! make -s EMU_KERNELS="$dir/kernels" EMU_KDIR="$dir/build" EMU_KOPT=-O1 EMU_CHECK_BIN="$bin" "$bin" > "$dir/build.log" 2>&1; then
        echo "FAIL plant_$name: the planted copy does not build:"; tail -5 "$dir/build.log" | sed 's/^/    /'; failed=1; continue
    fi
    KERNEL_CHECK_SHAPES=$shape timeout 600 "$bin" "$dir/emu" 1 "$dt" > "$dir/run.log" 2>&1
    KERNEL_CHECK_SHAPES=$shape build/kernel_check_cpu "$dir/cpu" 1 "$dt" > "$dir/cpu.log" 2>&1
    [ -f "$dir/emu/index.txt" ] && "$PYTHON" tests/gpu/compare_kernels.py "$dir/cpu" "$dir/emu" "$dt" >> "$dir/run.log" 2>&1
    if grep -q -- "$expect" "$dir/run.log"; then
        echo "ok plant_$name: $(grep -m1 -- "$expect" "$dir/run.log" | cut -c1-200)"
    else
        echo "FAIL plant_$name: nothing reported '$expect'; last lines:"; tail -3 "$dir/run.log" | sed 's/^/    /'; failed=1
    fi
done
exit $failed
