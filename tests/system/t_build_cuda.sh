#!/usr/bin/env bash
# The GPU build compiles and links on every CI run (CI has no GPU: only its start-up runs, to its one-line
# "no usable CUDA GPU"), with machine code for each architecture the Makefile names (sm_80, sm_90 by default)
# and warnings as errors.
# run_all: first
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
if ! command -v nvcc >/dev/null 2>&1; then
    t_skip build_cuda "nvcc not found (install the CUDA toolkit to build train_gpt)"
    t_finish
fi
# The GPU build's C objects (build/cuda/*.o) are, but for comm_mpi.o (-DGPT_NCCL), the CPU build's: the
# same sources compiled by the same command, only the path differs. Where `make -n` shows the two commands
# equal, the CPU build's object (brought up to date first; make test has just built it) and its dependency
# list are copied instead of compiled a second time; make then rebuilds a copy like any stale object.
cpu_objs="build/cpu/train_gpt.o $(make -s -p -n train_gpt 2>/dev/null | sed -n 's/^CORE_CPU_OBJ := //p')"
reused=0
if make -s -j2 $cpu_objs > "$TMP/cpu.log" 2>&1; then
    make -s -n -B $cpu_objs 2>/dev/null | grep -- ' -o build/cpu/' | sort > "$TMP/cpu.cmds"
    make -s -n -B ${cpu_objs//build\/cpu\//build/cuda/} 2>/dev/null | grep -- ' -o build/cuda/' | sed 's#build/cuda/#build/cpu/#g' |
        sort | comm -12 - "$TMP/cpu.cmds" | sed 's/.* -o build\/cpu\///' > "$TMP/same"
    while read -r o; do
        [ -f "build/cpu/$o" ] && [ -f "build/cpu/${o%.o}.d" ] || continue
        if [ ! -f "build/cuda/$o" ] || [ "build/cpu/$o" -nt "build/cuda/$o" ]; then
            mkdir -p "$(dirname "build/cuda/$o")"
            sed 's#build/cpu/#build/cuda/#g' "build/cpu/${o%.o}.d" > "build/cuda/${o%.o}.d"
            cp -p "build/cpu/$o" "build/cuda/$o"
            reused=$((reused + 1))
        fi
    done < "$TMP/same"
fi
echo "# build_cuda: $reused C objects taken from the CPU build"
# The remaining C objects two at a time; then nvcc, its two architectures on two threads, and the links.
nvthreads=""
nvcc --help 2>/dev/null | grep -q -- '--threads' && nvthreads="--threads 2"
cuda_c_objs=$(make -s -p -n train_gpt 2>/dev/null | sed -n 's/^CORE_CUDA_OBJ := //p')
if make -s -j2 build/cuda/train_gpt.o $cuda_c_objs build/cuda/tests/gpu/kernel_check.o build/cuda/tests/unit/test_comm.o > "$TMP/build.log" 2>&1 &&
    NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} $nvthreads" make -s train_gpt build/kernel_check_gpu build/comm_check_gpu >> "$TMP/build.log" 2>&1
then t_ok build_cuda_links
else t_fail build_cuda_links "$(grep -m3 -E 'error|Error' "$TMP/build.log")"; fi
if command -v cuobjdump >/dev/null 2>&1 && [ -x train_gpt ]; then
    archs=$(cuobjdump --list-elf train_gpt 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')
    t_check build_cuda_has_sm80_sm90 "[[ '$archs' == *sm_80* && '$archs' == *sm_90* ]]" "machine code for: $archs"
else   # no cuobjdump (CUDA's minimal install): what nvcc is asked for
    targets=$(make -s -n -B train_gpt 2>/dev/null | grep -o 'code=[a-z_0-9]*' | sort -u | tr '\n' ' ')
    t_check build_cuda_targets_sm80_sm90_ptx "[[ '$targets' == *code=sm_80* && '$targets' == *code=sm_90* && '$targets' == *code=compute_90* ]]" "nvcc targets: $targets"
fi
# Without a GPU (as in CI), train_gpt says so in one line instead of CUDA's "driver version is insufficient".
if [ -x train_gpt ] && ! nvidia-smi -L >/dev/null 2>&1; then
    $PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 5000 -V 512 --seed 1 >/dev/null
    timeout -k 5 60 ./train_gpt -e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 >/dev/null 2>"$TMP/nogpu.err"
    rc=$?
    t_check build_cuda_says_no_gpu "[ $rc -eq 1 ] && [ \$(wc -l < '$TMP/nogpu.err') -eq 1 ] && grep -q '^error: no usable CUDA GPU' '$TMP/nogpu.err'" \
        "exit $rc: $(head -c 300 "$TMP/nogpu.err")"
fi
# NCCL, where the Makefile found it: linked (not run: no GPU here), and only into the GPU build.
if [ -x train_gpt ] && make -s -p -n train_gpt 2>/dev/null | grep -q '^NCCL_OBJ := .*comm_nccl.o'; then
    t_check build_cuda_links_nccl "ldd train_gpt | grep -q libnccl" "train_gpt does not link libnccl"
    t_check build_cpu_has_no_nccl "! ldd train_gpt_cpu 2>/dev/null | grep -q libnccl" "train_gpt_cpu links libnccl"
fi
# A machine whose only NCCL and cuDNN are PyTorch's pip wheels (site-packages/nvidia/{nccl,cudnn}: headers, and
# the libraries without their .so links): the Makefile finds both there, here in a wheel-shaped folder made of
# this machine's own files, with the system's folders ruled out.
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
wheel="$TMP/site/nvidia"
for pkg in nccl:nccl.h:libnccl.so.2 cudnn:cudnn_graph.h:libcudnn.so.9; do
    IFS=: read -r name header lib <<< "$pkg"
    real_lib=$(ls "$cuda_home"/lib64/$lib /usr/lib/x86_64-linux-gnu/$lib 2>/dev/null | head -1)
    [ -f "$cuda_home/include/$header" ] && [ -n "$real_lib" ] || continue
    mkdir -p "$wheel/$name/include" "$wheel/$name/lib"
    touch "$wheel/$name/__init__.py"
    for h in "$cuda_home"/include/$name*.h; do ln -s "$h" "$wheel/$name/include/"; done
    ln -s "$real_lib" "$wheel/$name/lib/$lib"
done
if [ -d "$wheel/cudnn" ] && [ -d "$wheel/nccl" ]; then
    found=$(PYTHONPATH="$TMP/site" make -s -p -n train_gpt NCCL_DIRS=/nonexistent CUDNN_DIRS=/nonexistent 2>/dev/null |
        grep -E '^(NCCL|CUDNN)_(INC|LIB) := ' | sort | tr '\n' ' ')
    t_check build_cuda_finds_wheels "[[ '$found' == *'CUDNN_INC := $wheel/cudnn/include'* && '$found' == *'CUDNN_LIB := $wheel/cudnn/lib'* && \
        '$found' == *'NCCL_INC := $wheel/nccl/include'* && '$found' == *'NCCL_LIB := $wheel/nccl/lib'* ]]" "found: $found"
fi
# cuDNN, where the Makefile found it: linked into the GPU build only, and the cudnn_attention variant's graphs
# (kernels/attention_cudnn_graphs.cuh) built descriptor by descriptor, each finalized by cuDNN, which needs no GPU.
if [ -x train_gpt ] && make -s -n -B build/cuda/kernels/backend_cuda.o 2>/dev/null | grep -q -- -DGPT_CUDNN; then
    t_check build_cuda_links_cudnn "ldd train_gpt | grep -q libcudnn" "train_gpt does not link libcudnn"
    t_check build_cpu_has_no_cudnn "! ldd train_gpt_cpu 2>/dev/null | grep -q libcudnn" "train_gpt_cpu links libcudnn"
    if make -s build/cudnn_graph_check > "$TMP/cgc_build.log" 2>&1; then
        build/cudnn_graph_check > "$TMP/cgc.txt" 2>&1
        rc=$?
        t_check cudnn_attention_graph_descriptors "[ $rc -eq 0 ] && grep -q '^20 passed, 0 failed$' '$TMP/cgc.txt'" \
            "exit $rc: $(grep -m2 -E '^FAIL|error' "$TMP/cgc.txt")"
    else
        t_fail cudnn_attention_graph_descriptors "build/cudnn_graph_check: $(grep -m2 -E 'error' "$TMP/cgc_build.log")"
    fi
fi
t_finish
