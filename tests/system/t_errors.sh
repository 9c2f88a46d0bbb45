#!/usr/bin/env bash
# Bad input ends with one line "error: ..." on stderr and a non-zero exit, never a crash or a hang.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/ok.bin" -n 5000 -V 512 --seed 1 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/ok.bin" -j "" -b 2 -t 32 -x 1 -s 0)
expect_error() {   # name, regex the error must match, args...
    local name=$1 pattern=$2; shift 2
    timeout -k 5 60 ./train_gpt_cpu "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?   # -k: in case SIGTERM is not enough
    local lines; lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -Eq "^error: .*$pattern" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "rc=$rc, stderr ($lines lines): $(head -c 300 "$TMP/err")"; fi
}
expect_error unknown_flag "unknown flag '-qq'" "${base[@]}" -qq 3
expect_error missing_value "needs a value" "${base[@]}" -b
expect_error bad_integer "expects an integer" "${base[@]}" -b four
expect_error zero_batch "outside" "${base[@]}" -b 0
# Plain decimals only: a sign, a space or a hex float is a typo, not a number (strtod took them all).
expect_error hex_float "-l expects a number, got '0x1p-10'" "${base[@]}" -l 0x1p-10
expect_error plus_float "-l expects a number, got '\+1e-3'" "${base[@]}" -l +1e-3
expect_error space_float "-l expects a number, got ' 1e-3'" "${base[@]}" -l " 1e-3"
expect_error bare_exponent "-l expects a number, got '1e'" "${base[@]}" -l 1e
expect_error plus_integer "-b expects an integer, got '\+2'" "${base[@]}" -b +2
expect_error space_integer "-b expects an integer, got ' 2'" "${base[@]}" -b " 2"
timeout 60 ./train_gpt_cpu "${base[@]}" -l .5e-3 -c 1. -gc 2E0 > "$TMP/dec.txt" 2>&1
t_check decimal_forms_accepted "[ $? -eq 0 ]" "$(tail -1 "$TMP/dec.txt")"
expect_error watchdog_negative "-wd.*outside" "${base[@]}" -wd -1
# AdamW's constants: 0 <= beta < 1, 0 < eps <= 1 (flags.c's table).
expect_error beta1_below_one "-beta1 = 1 is outside \[0, 1\)" "${base[@]}" -beta1 1
expect_error beta2_not_negative "-beta2 = -0.5 is outside \[0, 1\)" "${base[@]}" -beta2 -0.5
expect_error eps_positive "-eps = 0 is outside \(0, 1\]" "${base[@]}" -eps 0
expect_error eps_not_a_number "-eps expects a number, got 'tiny'" "${base[@]}" -eps tiny
expect_error watchdog_not_a_number "-wd.*number.*'soon'" "${base[@]}" -wd soon
# -d sets -ga = d / (b*t*replicas): the quotient gets -ga's range check, so it can neither wrap to 5 nor go negative.
expect_error tokens_per_step_wraps_ga "-d 4294967301 gives -ga 4294967301 .*outside 1\.\.1048576" "${base[@]}" -b 1 -t 1 -d 4294967301
expect_error tokens_per_step_negative_ga "-d 2147483648 gives -ga 2147483648 .*outside" "${base[@]}" -b 1 -t 1 -d 2147483648
expect_error tokens_per_step_above_ga "-d 1048577 gives -ga 1048577 .*outside" "${base[@]}" -b 1 -t 1 -d 1048577
# Flags that mean something only beside others: an error, never ignored or overridden without a word.
expect_error empty_out_dir "-o needs a directory name" "${base[@]}" -o ""
expect_error checkpoints_without_out_dir "-n 2 writes checkpoints into -o DIR" "${base[@]}" -n 2
expect_error d_and_ga "-d and -ga both set the accumulation steps" "${base[@]}" -d 128 -ga 4
expect_error plan_ranks_without_estimate "-w 8 plans a world size with --estimate or --autotune only" "${base[@]}" -w 8
expect_error dump_without_steps "-dump writes step 0's tensors: it needs a step" "${base[@]}" -x 0 -dump "$TMP/dump"
expect_error micro_batch_beyond_int "-b 1048576 x -t 1048576 tokens per micro-batch exceed" "${base[@]}" -b 1048576 -t 1048576
expect_error bad_schedule "cosine\|linear\|constant" "${base[@]}" -k exp
expect_error missing_shard "no token shard matches" "${base[@]}" -i "$TMP/nothing_*.bin"
# Without -x a run is one epoch, which must fit -x's range: 65 names of one 2^24-token shard at -b 1 -t 1 are
# 65 * (2^24 - 1) = 1090519039 steps, past 2^30, which an int step count would wrap.
mkdir -p "$TMP/epoch" && $PYTHON scripts/make_shard.py -o "$TMP/epoch/s0.bin" -n 16777216 -V 512 --seed 1 >/dev/null
for i in $(seq 1 64); do ln -s s0.bin "$TMP/epoch/s$i.bin"; done
expect_error epoch_beyond_steps "one epoch of .* is 1090519039 steps, more than 1073741824; set -x" \
    -e L2C64H4V512T64 -i "$TMP/epoch/s*.bin" -j "" -b 1 -t 1 -s 0
rm -rf "$TMP/epoch"
head -c 3000 "$TMP/ok.bin" > "$TMP/trunc.bin"
expect_error truncated_shard "truncated" "${base[@]}" -i "$TMP/trunc.bin"
head -c 500 "$TMP/ok.bin" > "$TMP/tiny.bin"
expect_error shard_shorter_than_header "header|truncated" "${base[@]}" -i "$TMP/tiny.bin"
{ printf '\x01\x02\x03\x04'; tail -c +5 "$TMP/ok.bin"; } > "$TMP/magic.bin"
expect_error wrong_magic_shard "magic" "${base[@]}" -i "$TMP/magic.bin"
expect_error batch_larger_than_data "tokens" "${base[@]}" -e L2C64H4V512T128 -b 64 -t 128
expect_error t_beyond_model "maximum sequence length" "${base[@]}" -t 128
expect_error token_out_of_vocab "vocab" "${base[@]}" -e L2C64H4V100T64
expect_error model_spec "bad model spec" "${base[@]}" -e L2C64Q4
expect_error heads_divide "divisible" "${base[@]}" -e L2C64H5
# A custom spec must name L, C and H (none has a default), each field >= 1; the head-size error gives its numbers.
expect_error model_spec_needs_heads "L, C and H are required" "${base[@]}" -e L2C64
expect_error model_spec_needs_channels "L, C and H are required" "${base[@]}" -e L2H4
expect_error model_spec_zero_layers "bad model spec 'L0C64H4'" "${base[@]}" -e L0C64H4
expect_error model_spec_repeated_key "bad model spec 'L2C64H4L3': 'L' is given twice" "${base[@]}" -e L2C64H4L3
# A Llama spec sets each thing once: a repeated field of each kind (integer, number, flag, RoPE scaling), or
# two scalings, is refused naming both fields, never the last one winning (one table holds every field).
llama=llama:L2,C64,H4,F96,V512,T64
while read -r name first second; do
    expect_error "model_spec_twice_$name" "bad model spec '$llama,$first,$second': '$first' and '$second' both set the " \
        "${base[@]}" -e "$llama,$first,$second" < /dev/null
done <<'FIELDS'
kv_heads K2 K4
theta theta5e5 theta1e6
tied tied tied
qk_norm qknorm qknorm
rope_linear rope-linear:2 rope-linear:4
rope_linear_and_llama3 rope-linear:2 rope-llama3:8/1/4/32
FIELDS
expect_error model_spec_signed_field "bad model spec 'L2C\+64H4'" "${base[@]}" -e L2C+64H4
expect_error head_size "head size 12 \(channels 48 / heads 4\) must be a multiple of 8" "${base[@]}" -e L2C48H4
expect_error missing_model_file "nor an existing file" "${base[@]}" -e "$TMP/none.bin"
# Samples start from the tokenizer's end-of-text token: a model without it is told so (rather than reading
# outside its embedding), and with -s 0 nothing starts from it.
$PYTHON -c "import struct, sys; open(sys.argv[1], 'wb').write(struct.pack('<4i', 20240328, 2, 50257, 50256).ljust(1024, b'\0') + b'\0' * 50257)" "$TMP/gpt2_tok.bin"
expect_error eot_outside_vocab "end-of-text token 50256 is outside the model's vocabulary of 512" "${base[@]}" -tk "$TMP/gpt2_tok.bin" -s 1
timeout 60 ./train_gpt_cpu "${base[@]}" -tk "$TMP/gpt2_tok.bin" -s 0 > "$TMP/eot.txt" 2>&1
t_check eot_unused_without_samples "[ $? -eq 0 ]" "$(tail -1 "$TMP/eot.txt")"
# A validation set smaller than -m batches is used whole, and the start says so.
$PYTHON scripts/make_shard.py -o "$TMP/val.bin" -n 200 -V 512 --seed 2 >/dev/null
timeout 60 ./train_gpt_cpu "${base[@]}" -j "$TMP/val.bin" -v 1 -m 100 > "$TMP/val.txt" 2>&1
t_check val_batches_capped_said "grep -q '^validation: 3 batches per evaluation, all that .*val.bin holds (-m 100)' $TMP/val.txt" "$(head -3 "$TMP/val.txt")"
# Files read must be regular: opening a FIFO for reading waits for a writer, forever.
mkfifo "$TMP/fifo" && mkdir -p "$TMP/shard_dir.bin"
expect_error fifo_model "$TMP/fifo is not a regular file" "${base[@]}" -e "$TMP/fifo"
expect_error fifo_shard "$TMP/fifo is not a regular file" "${base[@]}" -i "$TMP/fifo"
expect_error fifo_val_shard "$TMP/fifo is not a regular file" "${base[@]}" -j "$TMP/fifo" -v 1
expect_error fifo_tokenizer "$TMP/fifo is not a regular file" "${base[@]}" -tk "$TMP/fifo"
expect_error directory_shard "shard_dir.bin is not a regular file" "${base[@]}" -i "$TMP/shard_*.bin"
./train_gpt_cpu "${base[@]}" -x 0 -o "$TMP/m" >/dev/null 2>&1
model="$TMP/m/ckpt_000000/model.bin"
t_check model_written "[ -s '$model' ]"
{ printf 'XXXX'; tail -c +5 "$model"; } > "$TMP/badmagic_model.bin"
expect_error wrong_magic_model "not a model file" "${base[@]}" -e "$TMP/badmagic_model.bin"
head -c 10000 "$model" > "$TMP/trunc_model.bin"
expect_error truncated_model "truncated" "${base[@]}" -e "$TMP/trunc_model.bin"
./train_gpt_cpu -e L3C64H4V512T64 -i "$TMP/ok.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/m3" >/dev/null 2>&1
mkdir -p "$TMP/other" && cp -r "$TMP/m3/ckpt_000000" "$TMP/other/"
expect_error resume_other_shape "another shape" "${base[@]}" -o "$TMP/other" -y 1
for f in model.bin state_rank0.bin; do
    rm -rf "$TMP/fifo_ckpt" && cp -r "$TMP/m" "$TMP/fifo_ckpt" && rm "$TMP/fifo_ckpt/ckpt_000000/$f" && mkfifo "$TMP/fifo_ckpt/ckpt_000000/$f"
    expect_error "fifo_checkpoint_${f%.bin}" "$f is not a regular file" "${base[@]}" -o "$TMP/fifo_ckpt" -y 1
done
expect_error resume_needs_dir "needs -o" "${base[@]}" -y 1
expect_error pp_needs_ranks "-pp 2 does not divide the 1 ranks" "${base[@]}" -pp 2
expect_error hpz_needs_z3 "-hpz 2 keeps a secondary copy .* needs -z 3, not -z 2" "${base[@]}" -z 2 -hpz 2
expect_error hpz_below_one "-hpz = 0 is outside 1\.\.1024" "${base[@]}" -z 3 -hpz 0
expect_error hpz_not_dividing_dp "-hpz 3 does not divide the data-parallel group of 4 ranks" "${base[@]}" -z 3 -hpz 3 --estimate -w 4
expect_error hpz_host_needs_z3 "-hpz host keeps a secondary copy .* needs -z 3, not -z 2" "${base[@]}" -z 2 -hpz host
expect_error hpz_host_estimate "-hpz host takes the launched ranks' hosts: --estimate needs -hpz N" "${base[@]}" -z 3 -hpz host --estimate -w 4
expect_error qw_needs_z3 "-qw 1 quantizes ZeRO-3's parameter gathers: it needs -z 3, not -z 2" "${base[@]}" -z 2 -qw 1
expect_error qw_needs_two_ranks "-qw 1 quantizes ZeRO-3's parameter gathers: with one data-parallel rank there are none" "${base[@]}" -z 3 -qw 1
expect_error qw_needs_two_ranks_estimate "with one data-parallel rank there are none" "${base[@]}" -z 3 -qw 1 --estimate -w 2 -pp 2
expect_error qg_needs_z2 "-qg 1 quantizes ZeRO's reduce-scatter of the gradients: it needs -z 2 or 3, not -z 1" "${base[@]}" -z 1 -qg 1
expect_error qg_needs_two_ranks "-qg 1 quantizes the gradient reduction: with one data-parallel rank there is none" "${base[@]}" -z 2 -qg 1
expect_error qg_needs_two_ranks_estimate "with one data-parallel rank there is none" "${base[@]}" -z 2 -qg 1 --estimate -w 1
expect_error qg_with_tp "-qg 1 with -pp, -tp or -cp: not yet built" "${base[@]}" -z 2 -qg 1 -tp 2 --estimate -w 4
expect_error qg_with_adam1bit "-opt adam1bit with -qg: not yet built" "${base[@]}" -z 2 -qg 1 -opt adam1bit -freeze 1
expect_error hpz_not_dividing_one_rank "-hpz 2 does not divide the data-parallel group of 1 ranks" "${base[@]}" -z 3 -hpz 2
expect_error offload2_needs_sharded_grads "-offload 2 .* needs -z 2 or 3, not -z 1" "${base[@]}" -z 1 -offload 2
expect_error offload_level_range "outside" "${base[@]}" -offload 3
expect_error dpu_needs_offload "-dpu 2 delays .* needs -offload 1 or 2" "${base[@]}" -dpu 2
expect_error dpu_negative "outside" "${base[@]}" -dpu -1 -offload 1
mkdir -p "$TMP/ro" && chmod 500 "$TMP/ro"
if [ "$(id -u)" != 0 ]; then expect_error unwritable_output "cannot" "${base[@]}" -o "$TMP/ro/x"
else t_skip unwritable_output "root writes anywhere"; fi
t_finish
