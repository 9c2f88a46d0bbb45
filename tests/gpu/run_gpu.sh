#!/usr/bin/env bash
# `make test-gpu`: everything a GPU must check, in one command. Sections:
#   1. every kernel (forward and backward) against its CPU twin, fp32/bf16/fp16 (check_kernels.sh)
#   2. full training steps of a small model: train_gpt vs train_gpt_cpu from the same model file and data
#      (fp32: losses, grad norms and step-0 gradients per tensor; bf16: losses and grad norms within 1e-2, which
#      an optimizer at half the learning rate misses by 30x on the CPU build), and
#      -offload 1 against the device-side optimizer, -offload 2 on one rank (fp32, bf16, -dpu; repeated for bits),
#      -nvme against -offload 2 bit for bit (fp32, bf16, -dpu),
#      and a Llama-family model (GQA, head size 128, q/k norms) likewise in fp32 and bf16, and LoRA with
#      -lora-dropout in fp32
#   3. 2 and 4 ranks on the one GPU through the MPI backend under -z 0..3 (and -z 2, 3 poisoned, see
#      comm.h's GPT_COMM_POISON), 1F1B pipelines (-pp 2 and 4, with data parallelism, ZeRO and recompute;
#      bf16 with the tied-copy check; -ps zb against 1f1b, bit for bit; -ps interleaved against one rank), -offload 2 under -z 2 and 3, -tp 2 under -z 0 and 3 and with -sp 1, a Llama with its one kv head copied on -tp 2, and -r 1..3,
#      against one rank;
#      then NCCL (-comm nccl): the comm tests on device memory, one rank against -comm mpi, and with 2+
#      GPUs 2 ranks under -z 0..3 against one rank
#   4. determinism (two bf16 runs, identical bits) and bit-exact resume on the GPU
#   5. a pass/fail table, written with the device, date and commit to $REPORT (default build/gpu_report.md)
# With --dry-run the fenced CPU build (build/train_gpt_fenced: device memory the host cannot touch, copies
# with a GPU's windows; tests/system/t_fence.sh) stands in for train_gpt, proving the script end to end against a
# backend other than train_gpt_cpu's; with --emu (make test-emu) train_gpt's own host code and kernels run on
# the kernel emulator (build/train_gpt_emu, smaller test models: lib.sh), every row but NCCL's; without a GPU
# and without either it is an error (scripts/gpu_mode.sh).
set -u
cd "$(dirname "$0")/../.."
REPORT=${REPORT:-build/gpu_report.md}
source tests/gpu/lib.sh
gpu_test_setup tests/gpu/run_gpu.sh "${1:-}"

# 1. kernels vs CPU twins
bash tests/gpu/check_kernels.sh $DRY > "$W/kernels.log" 2>&1
krc=$?
cat "$W/kernels.log"
ksum=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$W/kernels.log" | tail -1)
[ $krc -eq 0 ] && record kernels_vs_cpu_twins ok "$ksum" || record kernels_vs_cpu_twins FAIL "${ksum:-no summary} (see kernel table above)"

# 2. full steps against the CPU build (the models, the data and the CPU build's runs: lib.sh)
cpu_reference_runs
$GPU "${flags[@]}" -p fp32 -o "$W/gpu32" -dump "$W/gpu32" > "$W/gpu32.txt" 2>&1 || record step_gpu_fp32_run FAIL "$(tail -1 "$W/gpu32.txt")"
$GPU "${flags[@]}" -p bf16 -o "$W/gpu16" > "$W/gpu16.txt" 2>&1 || record step_gpu_bf16_run FAIL "$(tail -1 "$W/gpu16.txt")"
check step_fp32_losses_vs_cpu log fp32_loss "$W/gpu32/log.jsonl" "$W/cpu/log.jsonl" --steps 6 --tol 1e-4
check step_fp32_norms_vs_cpu log fp32_norm "$W/gpu32/log.jsonl" "$W/cpu/log.jsonl" --steps 6 --tol 1e-3 --key grad_norm
check step_fp32_grads_vs_cpu grads fp32_grads "$W/gpu32/grads0.f32" "$W/cpu/grads0.f32" "$MODEL" --tol 1e-4
check step_bf16_vs_cpu log bf16_loss "$W/gpu16/log.jsonl" "$W/cpu/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
# The Llama family: RMSNorm, RoPE, SwiGLU, q/k norms and grouped-query attention with head size 128 (2 kv
# heads of 4), one rank against the CPU build from the same model file.
$GPU "${lflags[@]}" -p fp32 -o "$W/lgpu32" -dump "$W/lgpu32" > "$W/lgpu32.txt" 2>&1 || record llama_gpu_fp32_run FAIL "$(grep -m1 error "$W/lgpu32.txt")"
$GPU "${lflags[@]}" -p bf16 -o "$W/lgpu16" > "$W/lgpu16.txt" 2>&1 || record llama_gpu_bf16_run FAIL "$(grep -m1 error "$W/lgpu16.txt")"
check llama_fp32_losses_vs_cpu log llama_fp32_loss "$W/lgpu32/log.jsonl" "$W/lcpu/log.jsonl" --steps 6 --tol 1e-4
check llama_fp32_grads_vs_cpu grads llama_fp32_grads "$W/lgpu32/grads0.f32" "$W/lcpu/grads0.f32" "$LMODEL" --tol 1e-4
check llama_bf16_vs_cpu log llama_bf16_loss "$W/lgpu16/log.jsonl" "$W/lcpu/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
# LoRA with dropout: the adapters' input and its gradient through kernels/lora_dropout.cuh (a hash per element,
# the CPU twin's mask), one rank against the CPU build from the same model file, fp32.
lora=(-lora 4 -lora-alpha 8 -lora-dropout 0.1)
./train_gpt_cpu "${flags[@]}" "${lora[@]}" -p fp32 -o "$W/lora_cpu" > "$W/lora_cpu.txt" 2>&1 || record lora_dropout_cpu_run FAIL "$(grep -m1 error "$W/lora_cpu.txt")"
$GPU "${flags[@]}" "${lora[@]}" -p fp32 -o "$W/lora_gpu" > "$W/lora_gpu.txt" 2>&1 || record lora_dropout_gpu_run FAIL "$(grep -m1 error "$W/lora_gpu.txt")"
check lora_dropout_fp32_vs_cpu log lora_dropout "$W/lora_gpu/log.jsonl" "$W/lora_cpu/log.jsonl" --steps 6 --tol 1e-4 --key loss --key grad_norm
# ZeRO-Offload (-offload 1): master and Adam state in pinned host memory, AdamW on the host (adamw_host) instead
# of the CUDA kernel, gradients down and parameters up through the staging buffer. Same math, so the losses
# follow the device-side runs to rounding (the CUDA kernel and the host loop may contract differently).
$GPU "${flags[@]}" -p fp32 -offload 1 -o "$W/off32" > "$W/off32.txt" 2>&1 || record offload_fp32_run FAIL "$(grep -m1 error "$W/off32.txt")"
$GPU "${flags[@]}" -p bf16 -offload 1 -o "$W/off16" > "$W/off16.txt" 2>&1 || record offload_bf16_run FAIL "$(grep -m1 error "$W/off16.txt")"
check offload_fp32_vs_device log off32 "$W/off32/log.jsonl" "$W/gpu32/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
check offload_bf16_vs_device log off16 "$W/off16/log.jsonl" "$W/gpu16/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
# -offload 2 on one rank (-z 3): gradient pieces come down on the download stream and a worker thread adds
# them into the host accumulator (core/zero/grad_landing.h); parameter pieces go up on the upload stream, each
# overlapping the block before it (zero.c). The norm is summed on the host (another order than the
# device's), hence a tolerance against the device-side run. A missing wait would be a race, so the same run
# again, with -lb's synchronized timing on top, must give the same bits. bf16 moves 2-byte pieces; -dpu
# adds the delayed update's thread beside the worker, against the CPU build's -dpu run.
$GPU "${flags[@]}" -p fp32 -z 3 -offload 2 -o "$W/off2" > "$W/off2.txt" 2>&1 || record offload2_fp32_run FAIL "$(grep -m1 error "$W/off2.txt")"
check offload2_fp32_vs_device log off2 "$W/off2/log.jsonl" "$W/gpu32/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
$GPU "${flags[@]}" -p fp32 -z 3 -offload 2 -lb 1 -o "$W/off2b" > "$W/off2b.txt" 2>&1
if [ -n "$(steplog "$W/off2b/log.jsonl")" ] && diff <(steplog "$W/off2b/log.jsonl") <(steplog "$W/off2/log.jsonl") >/dev/null; then
    record offload2_repeatable ok "identical losses and norms; $(grep -m1 -o 'host copies [0-9.]* ms' "$W/off2b.txt")"
else
    record offload2_repeatable FAIL "$(grep -m1 error "$W/off2b.txt" || echo 'losses or norms differ between two runs')"
fi
$GPU "${flags[@]}" -p bf16 -z 3 -offload 2 -o "$W/off2bf16" > "$W/off2bf16.txt" 2>&1 || record offload2_bf16_run FAIL "$(grep -m1 error "$W/off2bf16.txt")"
check offload2_bf16_vs_device log off2bf16 "$W/off2bf16/log.jsonl" "$W/gpu16/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
./train_gpt_cpu "${flags[@]}" -p fp32 -z 3 -offload 2 -dpu 2 -o "$W/dpucpu" > "$W/dpucpu.txt" 2>&1 || record offload2_dpu_cpu_run FAIL "$(tail -1 "$W/dpucpu.txt")"
$GPU "${flags[@]}" -p fp32 -z 3 -offload 2 -dpu 2 -o "$W/dpugpu" > "$W/dpugpu.txt" 2>&1 || record offload2_dpu_run FAIL "$(grep -m1 error "$W/dpugpu.txt")"
check offload2_dpu_vs_cpu log off2dpu "$W/dpugpu/log.jsonl" "$W/dpucpu/log.jsonl" --steps 6 --tol 1e-4
# -nvme (state and parameter pieces on disk, core/zero/nvme_store.h): O_DIRECT reads and writes into pinned
# pool buffers on worker threads, each gather's piece read into pinned memory and uploaded from there. Only
# where the bytes live changes, so the same bits as -offload 2 on this GPU (fp32 and bf16, and with -dpu,
# whose pass runs on the update thread), with the disk under $W (its filesystem as the machine has it).
$GPU "${flags[@]}" -p fp32 -z 3 -offload 2 -nvme "$W/nvme" -o "$W/nvme32" > "$W/nvme32.txt" 2>&1 || record nvme_fp32_run FAIL "$(grep -m1 error "$W/nvme32.txt")"
same_steps nvme_fp32_vs_offload2 "$W/nvme32/log.jsonl" "$W/off2/log.jsonl"
$GPU "${flags[@]}" -p bf16 -z 3 -offload 2 -nvme "$W/nvme" -lb 1 -o "$W/nvme16" > "$W/nvme16.txt" 2>&1 || record nvme_bf16_run FAIL "$(grep -m1 error "$W/nvme16.txt")"
same_steps nvme_bf16_vs_offload2 "$W/nvme16/log.jsonl" "$W/off2bf16/log.jsonl"
$GPU "${flags[@]}" -p fp32 -z 3 -offload 2 -dpu 2 -nvme "$W/nvme" -o "$W/nvmedpu" > "$W/nvmedpu.txt" 2>&1 || record nvme_dpu_run FAIL "$(grep -m1 error "$W/nvmedpu.txt")"
same_steps nvme_dpu_vs_offload2_dpu "$W/nvmedpu/log.jsonl" "$W/dpugpu/log.jsonl"

# 3. ranks on one GPU (MPI backend, staging through the host) and recompute levels, fp32, against the
#    single-rank GPU run of the same global batch
if command -v mpirun >/dev/null 2>&1 && ldd "$GPU" | grep -q libmpi; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    for layout in "2 0" "2 1" "2 2" "2 3" "4 3"; do
        set -- $layout
        np=$1 z=$2
        mpirun --oversubscribe --bind-to none -np "$np" $GPU "${flags[@]}" -ga $((4 / np)) -p fp32 -z "$z" -comm mpi -o "$W/np${np}z$z" \
            > "$W/np${np}z$z.txt" 2>&1 || record "ranks_np${np}_z$z" FAIL "$(grep -m1 error "$W/np${np}z$z.txt")"
    done
    $GPU "${flags[@]}" -ga 4 -p fp32 -o "$W/ga4" > /dev/null 2>&1
    for d in np2z0 np2z1 np2z2 np2z3 np4z3; do
        check "ranks_${d}_vs_single" log "$d" "$W/$d/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    done
    # Overlap on device memory: GPT_COMM_POISON=1 (comm.h) poisons every buffer of a collective in flight
    # until its wait, so a missing or late wait in zero.c changes the bits of the runs above.
    for z in 2 3; do
        mpirun --oversubscribe --bind-to none -x GPT_COMM_POISON=1 -np 2 $GPU "${flags[@]}" -ga 2 -p fp32 -z "$z" -comm mpi \
            -o "$W/np2z${z}p" > "$W/np2z${z}p.txt" 2>&1
        if [ -n "$(steplog "$W/np2z${z}p/log.jsonl")" ] && diff <(steplog "$W/np2z${z}p/log.jsonl") <(steplog "$W/np2z$z/log.jsonl") >/dev/null; then
            record "ranks_np2z${z}_poisoned_same_bits" ok "GPT_COMM_POISON=1: identical losses and norms"
        else
            record "ranks_np2z${z}_poisoned_same_bits" FAIL "$(grep -m1 error "$W/np2z${z}p.txt" || echo 'losses or norms differ')"
        fi
    done
    # -offload 2 over ranks: each unit's reduced gradient piece comes down as its reduce-scatter ends; with
    # -z 3 each rank's parameter pieces are uploaded for each gather.
    for z in 2 3; do
        mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -ga 2 -p fp32 -z "$z" -offload 2 -comm mpi \
            -o "$W/off2np2z$z" > "$W/off2np2z$z.txt" 2>&1 || record "offload2_np2_z${z}_run" FAIL "$(grep -m1 error "$W/off2np2z$z.txt")"
    done
    # -tp 2: two tensor ranks on the one GPU; the walk's all-reduces run over -comm mpi on device buffers.
    for z in 0 3; do
        mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -ga 4 -p fp32 -tp 2 -z "$z" -comm mpi \
            -o "$W/tp2z$z" > "$W/tp2z$z.txt" 2>&1 || record "tp2_z${z}_run" FAIL "$(grep -m1 error "$W/tp2z$z.txt")"
    done
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -ga 4 -p fp32 -tp 2 -sp 1 -comm mpi \
        -o "$W/tp2sp" > "$W/tp2sp.txt" 2>&1 || record "tp2_sp_run" FAIL "$(grep -m1 error "$W/tp2sp.txt")"
    for d in off2np2z2 off2np2z3 tp2z0 tp2z3 tp2sp; do
        check "${d}_vs_single" log "$d" "$W/$d/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    done
    # A Llama of one kv head (with q/k/v biases) under -tp 2: each rank holds a copy of the kv head and the
    # copies' gradients are summed through be_copy_rows' packed columns; against the same model on one rank.
    kspec=$KSPEC
    $GPU "${flags[@]}" -e "$kspec" -ga 4 -p fp32 -o "$W/kv1" > "$W/kv1.txt" 2>&1 || record llama_kv_copies_single_run FAIL "$(grep -m1 error "$W/kv1.txt")"
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -e "$kspec" -ga 4 -p fp32 -tp 2 -comm mpi -o "$W/kvtp2" \
        > "$W/kvtp2.txt" 2>&1 || record llama_kv_copies_tp2_run FAIL "$(grep -m1 error "$W/kvtp2.txt")"
    check llama_kv_copies_tp2_vs_single log kvtp2 "$W/kvtp2/log.jsonl" "$W/kv1/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    # -cp 2 -cpm ring: the Llama of 2 kv heads (RoPE at each rank's two chunks' positions) with its k|v passed
    # between two ranks' device buffers, the chunk kernels on the GPU; against the single-rank run of the same batch.
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${lflags[@]}" -p fp32 -cp 2 -cpm ring -comm mpi -o "$W/lring2" \
        > "$W/lring2.txt" 2>&1 || record llama_cp2_ring_run FAIL "$(grep -m1 error "$W/lring2.txt")"
    check llama_cp2_ring_vs_single log lring2 "$W/lring2/log.jsonl" "$W/lgpu32/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    # The same ring on packed conversations: the chunk kernels with the queries' document starts (rows whose
    # document starts after a passing key chunk have no key there); against the CPU build's one rank.
    $PY tests/tools/doc_dataset.py "$W/docs" -V 500 --seed 5 --conversations 600 --longest 30 > /dev/null
    dflags=("${lflags[@]}" -i "$W/docs/chat_train_*.bin" -pack 1 -p fp32)
    ./train_gpt_cpu "${dflags[@]}" -o "$W/ldocs_cpu" > "$W/ldocs_cpu.txt" 2>&1 || record llama_docs_cpu_run FAIL "$(grep -m1 error "$W/ldocs_cpu.txt")"
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${dflags[@]}" -cp 2 -cpm ring -comm mpi -o "$W/ldocs_ring2" \
        > "$W/ldocs_ring2.txt" 2>&1 || record llama_cp2_ring_docs_run FAIL "$(grep -m1 error "$W/ldocs_ring2.txt")"
    check llama_cp2_ring_docs_vs_cpu log ldocs_ring2 "$W/ldocs_ring2/log.jsonl" "$W/ldocs_cpu/log.jsonl" --steps 6 --tol 1e-3 --key loss --key grad_norm
else
    echo "skip ranks_on_one_gpu: this build has no MPI (mpirun/libmpi not found)"
    ROWS+=("| ranks_on_one_gpu | skip | no MPI on this machine: built with comm_single.c |")
fi

# NCCL. One rank moves no gradients in training (the trainer skips collectives on one rank), so there the
# comm tests (build/comm_check_gpu: every collective, fp32/bf16/fp16, world and split groups, in place and
# not, byte counters) exercise each NCCL call on device memory, and the training run proves NCCL's setup and
# teardown in the trainer with bit-identical logs. 2+ GPUs: real multi-rank NCCL traffic.
comm_test() {   # name, command...: test_comm's summary line becomes one row
    local name=$1 out sum rc; shift
    out=$("$@" 2>&1)
    rc=$?
    sum=$(echo "$out" | grep -m1 '^# test_comm:' | sed 's/^# //')
    if [ $rc -eq 0 ] && echo "$sum" | grep -q ' 0 failed'; then record "$name" ok "$sum"
    else record "$name" FAIL "${sum:-$(echo "$out" | grep -m1 -i error)} $(echo "$out" | grep -m2 '^FAIL' | tr '\n' ' ' | cut -c1-200)"; fi
}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ -n "$DRY" ]; then
    echo "skip nccl: no GPU ($DRY: NCCL needs a GPU per rank)"
    ROWS+=("| nccl | skip | no GPU ($DRY): NCCL needs a GPU per rank |")
elif ! ldd "$GPU" | grep -q libnccl; then
    echo "skip nccl: train_gpt was built without NCCL"
    ROWS+=("| nccl | skip | train_gpt built without NCCL (make NCCL=1 NCCL_HOME=DIR) |")
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    comm_test comm_nccl_np1 build/comm_check_gpu --comm nccl
    comm_test comm_staged_np1_gpu build/comm_check_gpu --comm mpi
    $GPU "${flags[@]}" -p fp32 -z 0 -comm nccl -o "$W/nccl1" > "$W/nccl1.txt" 2>&1
    $GPU "${flags[@]}" -p fp32 -z 0 -comm mpi -o "$W/mpi1" > "$W/mpi1.txt" 2>&1
    if grep -q '1 rank (nccl)' "$W/nccl1.txt" && grep -q '1 rank (mpi)' "$W/mpi1.txt" && [ -n "$(fields "$W/mpi1/log.jsonl")" ] &&
       diff <(fields "$W/nccl1/log.jsonl") <(fields "$W/mpi1/log.jsonl") >/dev/null; then
        record nccl_np1_vs_mpi ok "one rank, -z 0: identical losses and norms, -comm nccl vs -comm mpi"
    else
        record nccl_np1_vs_mpi FAIL "$(grep -m1 error "$W/nccl1.txt" "$W/mpi1.txt" || echo 'logs differ or a banner lacks (nccl)/(mpi)')"
    fi
    $GPU "${flags[@]}" -p fp32 -x 1 -o "$W/auto1" > "$W/auto1.txt" 2>&1
    grep -q '1 rank (nccl)' "$W/auto1.txt" && record nccl_is_default_on_own_gpu ok "no -comm: the banner says nccl" ||
        record nccl_is_default_on_own_gpu FAIL "$(grep -m1 -E 'error|rank' "$W/auto1.txt")"
    if [ "$NGPU" -ge 2 ]; then
        comm_test comm_nccl_np2 mpirun --bind-to none -np 2 build/comm_check_gpu --comm nccl
        [ -f "$W/ga4/log.jsonl" ] || $GPU "${flags[@]}" -ga 4 -p fp32 -o "$W/ga4" > /dev/null 2>&1
        for z in 0 1 2 3; do
            mpirun --bind-to none -np 2 $GPU "${flags[@]}" -ga 2 -p fp32 -z "$z" -comm nccl -o "$W/nccl2z$z" > "$W/nccl2z$z.txt" 2>&1 ||
                record "nccl_np2_z${z}_run" FAIL "$(grep -m1 error "$W/nccl2z$z.txt")"
            check "nccl_np2_z${z}_vs_single" log "nccl2z$z" "$W/nccl2z$z/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
        done
        # The pipeline's exchanges over ncclSend/ncclRecv (nccl_exchange): every schedule, against one rank.
        for ps in "1f1b" "zb" "interleaved -vp 2"; do
            name=nccl_pp2_${ps%% *}
            mpirun --bind-to none -np 2 $GPU "${flags[@]}" -ga 4 -p fp32 -pp 2 -ps $ps -comm nccl -o "$W/$name" > "$W/$name.txt" 2>&1 ||
                record "${name}_run" FAIL "$(grep -m1 error "$W/$name.txt")"
            check "${name}_vs_single" log "$name" "$W/$name/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
        done
    else
        echo "skip nccl_np2: $NGPU GPU on this machine, 2 NCCL ranks need 2"
        ROWS+=("| nccl_np2 | skip | $NGPU GPU: 2 NCCL ranks need 2 GPUs; untested NCCL code: every collective between 2+ ranks and nccl_exchange (pipeline send/recv) |")
        out=$(mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -x 1 -comm nccl -o "$W/shared" 2>&1)
        [ $? -ne 0 ] && echo "$out" | grep -q 'needs one GPU per rank' && record nccl_refuses_shared_gpu ok "2 ranks on 1 GPU: one-line error" ||
            record nccl_refuses_shared_gpu FAIL "$(echo "$out" | grep -m1 -E 'error|rank')"
    fi
fi

for r in 1 2 3; do
    $GPU "${flags[@]}" -p fp32 -r $r -o "$W/r$r" > /dev/null 2>&1
    check "recompute_r${r}_vs_r0" log "r$r" "$W/r$r/log.jsonl" "$W/gpu32/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
done
# 1F1B pipelines on the one GPU (MPI backend): np pp ga z r, each with the single-rank run's global batch. The
# bf16 run checks the tied embedding's two copies stay bit-identical (the checkpoint at its end fails if not).
if command -v mpirun >/dev/null 2>&1 && ldd "$GPU" | grep -q libmpi; then
    for layout in "2 2 4 0 0" "4 2 2 3 1" "4 4 4 2 3"; do
        set -- $layout
        name=pp$2_np$1_z$4_r$5
        mpirun --oversubscribe --bind-to none -np "$1" $GPU "${flags[@]}" -pp "$2" -ga "$3" -z "$4" -r "$5" -p fp32 -comm mpi -o "$W/$name" \
            > "$W/$name.txt" 2>&1 || record "pipeline_${name}_run" FAIL "$(grep -m1 error "$W/$name.txt")"
        check "pipeline_${name}_vs_single" log "$name" "$W/$name/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    done
    # -ps zb: each backward split into B and W (matmul_backward_input/_weight), W deferred: the same bits as
    # the 1F1B run of the same layout above.
    mpirun --oversubscribe --bind-to none -np 4 $GPU "${flags[@]}" -pp 2 -ga 2 -z 3 -r 1 -p fp32 -ps zb -comm mpi -o "$W/zb" \
        > "$W/zb.txt" 2>&1 || record pipeline_zb_run FAIL "$(grep -m1 error "$W/zb.txt")"
    if cmp -s "$W/zb/ckpt_000006/model.bin" "$W/pp2_np4_z3_r1/ckpt_000006/model.bin" && diff <(fields "$W/zb/log.jsonl") \
        <(fields "$W/pp2_np4_z3_r1/log.jsonl") > /dev/null; then
        record pipeline_zb_bits_equal_1f1b ok "-ps zb -pp 2 x 2 replicas, -z 3 -r 1: model and losses identical to 1f1b"
    else
        record pipeline_zb_bits_equal_1f1b FAIL "-ps zb differs from -ps 1f1b on the same layout"
    fi
    # -ps interleaved: 2 ranks x 2 model chunks each (one Model per chunk), against one rank.
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -pp 2 -ps interleaved -vp 2 -ga 4 -z 2 -p fp32 -comm mpi \
        -o "$W/il" > "$W/il.txt" 2>&1 || record pipeline_interleaved_run FAIL "$(grep -m1 error "$W/il.txt")"
    check pipeline_interleaved_vs_single log il "$W/il/log.jsonl" "$W/ga4/log.jsonl" --steps 6 --tol 1e-5 --key loss --key grad_norm
    mpirun --oversubscribe --bind-to none -np 2 $GPU "${flags[@]}" -pp 2 -p bf16 -z 1 -comm mpi -o "$W/pp2bf16" > "$W/pp2bf16.txt" 2>&1 ||
        record pipeline_pp2_bf16_run FAIL "$(grep -m1 error "$W/pp2bf16.txt")"
    check pipeline_pp2_bf16_vs_single log pp2bf16 "$W/pp2bf16/log.jsonl" "$W/gpu16/log.jsonl" --steps 6 --tol 1e-2 --key loss --key grad_norm
else
    ROWS+=("| pipeline | skip | no MPI on this machine |")
fi

# Generation (-prompt, -temp 0) from the model trained above: the GPU build continues with the CPU build's
# tokens, unless two logits come within 1e-3 somewhere (then fp32 rounding may rightly pick either; the
# reference's float64 gap decides whether the comparison means anything).
mkdir -p "$W/gtext" "$W/gtok"
for i in $(seq 1 40); do echo "The cat sat on the mat, and the dog lay by the door. Line $i."; done > "$W/gtext/a.txt"
$PY scripts/tokenize.py "$W/gtext" -o "$W/gtok" --name g --val-fraction 0.1 --quiet > /dev/null 2>&1
GMODEL="$W/gpu32/ckpt_000006/model.bin"
for prog in ./train_gpt_cpu $GPU; do
    $prog -e "$GMODEL" -tk "$W/gtok/gpt2_tokenizer.bin" -b 1 -t 64 -g 32 -p fp32 -temp 0 -prompt "The dog lay by the" \
        > "$W/gen_$(basename $prog).txt" 2>&1
done
gen_ids() { grep '^ids: ' "$W/gen_$1.txt"; }
pids=$(grep '^prompt' "$W/gen_train_gpt_cpu.txt" | sed 's/.*\[\(.*\)\]/\1/; s/ //g')
ggap=$($PY scripts/reference.py -e "$GMODEL" --greedy 32 --prompt-ids "$pids" -t 64 2>/dev/null | sed -n 's/^min_gap: //p')
if [ -z "$(gen_ids "$(basename $GPU)")" ]; then record generate_greedy_vs_cpu FAIL "$(grep -m1 error "$W/gen_$(basename $GPU).txt")"
elif [ "$(gen_ids "$(basename $GPU)")" = "$(gen_ids train_gpt_cpu)" ]; then record generate_greedy_vs_cpu ok "32 tokens identical (min gap $ggap)"
elif [ -z "$ggap" ]; then record generate_greedy_vs_cpu FAIL "tokens differ, and scripts/reference.py gave no logit gap to judge them by"
elif $PY -c "import sys; sys.exit(0 if float('$ggap') < 1e-3 else 1)"; then
    ROWS+=("| generate_greedy_vs_cpu | skip | logits within $ggap of a tie: either pick is right |")
else record generate_greedy_vs_cpu FAIL "tokens differ with a gap of $ggap: $(gen_ids "$(basename $GPU)" | cut -c1-120)"; fi

# 4. determinism and resume
$GPU "${flags[@]}" -p bf16 -o "$W/gpu16b" > "$W/gpu16b.txt" 2>&1
if [ -n "$(fields "$W/gpu16/log.jsonl")" ] && diff <(fields "$W/gpu16/log.jsonl") <(fields "$W/gpu16b/log.jsonl") >/dev/null &&
   cmp -s "$W/gpu16/ckpt_000006/model.bin" "$W/gpu16b/ckpt_000006/model.bin"; then
    record determinism_bf16 ok "two runs: identical losses, norms and final model bits"
else
    record determinism_bf16 FAIL "two identical runs differ"
fi
$GPU "${flags[@]}" -p bf16 -n 3 -o "$W/split" > /dev/null 2>&1
rm -rf "$W/split/ckpt_000006"
$GPU "${flags[@]}" -p bf16 -o "$W/split" -y 1 > "$W/resumed.txt" 2>&1
if grep -q "resumed from .*ckpt_000003" "$W/resumed.txt" && diff <(fields "$W/gpu16/log.jsonl") <(fields "$W/split/log.jsonl") >/dev/null &&
   cmp -s "$W/gpu16/ckpt_000006/state_rank0.bin" "$W/split/ckpt_000006/state_rank0.bin"; then
    record resume_bf16 ok "checkpoint at 3, resume to 6: identical log and optimizer state"
else
    record resume_bf16 FAIL "resumed run differs from the uninterrupted one"
fi

# 5. report
write_report "bash tests/gpu/run_gpu.sh $DRY"
