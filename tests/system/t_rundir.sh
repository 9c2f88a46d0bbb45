#!/usr/bin/env bash
# The run directory (-o): created with its parents; one run at a time (a lock); a fresh run never mixes
# with an earlier one; the hyperparameters that define a run are recorded and a resume that changes them
# says so or refuses; checkpoint writing and cleanup never follow symlinks out of -o and never leave the
# newest complete checkpoint missing; resume skips a damaged checkpoint for an older complete one; the
# loader checks what the manifest claims (step, state files, spans) and refuses non-regular files.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 512 --seed 11 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -s 0 -l 1e-3 -k constant)
run() { timeout 120 ./train_gpt_cpu "${base[@]}" "$@"; }
# A manifest edited by a test gets the DONE that matches it (DONE holds the manifest's CRC-32).
reseal() { $PYTHON -c "import sys, zlib; print('{\"manifest.json\": \"%08x\"}' % zlib.crc32(open(sys.argv[1] + '/manifest.json', 'rb').read()), file=open(sys.argv[1] + '/DONE', 'w'))" "$1"; }
# Files changed on purpose get their CRC-32s in the manifest too, to reach the checks behind the checksums.
reseal_files() {
    $PYTHON - "$1" <<'PY'
import re, sys, zlib
d = sys.argv[1]
crc = lambda name: "%08x" % zlib.crc32(open(d + "/" + name, "rb").read())
text = open(d + "/manifest.json").read()
text = re.sub(r'"((?:model|state_rank[0-9]+)\.bin)": "[0-9a-f]{8}"', lambda m: '"%s": "%s"' % (m[1], crc(m[1])), text)
open(d + "/manifest.json", "w").write(text)
PY
    reseal "$1"
}
one_error() {   # name, regex, stderr file, rc: exit 1 and exactly one line "error: ...regex"
    if [ "$4" -eq 1 ] && [ "$(wc -l < "$3")" -eq 1 ] && grep -Eq "^error: .*$2" "$3"; then t_ok "$1"
    else t_fail "$1" "rc=$4, stderr: $(head -c 300 "$3")"; fi
}

# -o with missing parents; the end of a run says where things are.
run -x 4 -n 2 -o "$TMP/deep/er/run" > "$TMP/deep.txt" 2>&1
t_check o_created_with_parents "[ -f $TMP/deep/er/run/ckpt_000004/DONE ] && [ -f $TMP/deep/er/run/log.jsonl ]"
t_check checkpoint_announced "grep -q '^step 2 | checkpoint .*ckpt_000002 written' $TMP/deep.txt && grep -q '^step 4 | checkpoint .*ckpt_000004 written' $TMP/deep.txt"
t_check run_end_announced "grep -q '^trained 4 steps in .* now at step 4 of 4' $TMP/deep.txt"
t_check console_step_is_log_step "grep -q '^step  *0/4 | loss' $TMP/deep.txt && grep -q '\"step\": 0, \"loss\"' $TMP/deep/er/run/log.jsonl && ! grep -q '^step  *4/4 | loss' $TMP/deep.txt"

# A second run on a directory in use is refused while the first goes on unharmed.
timeout 120 ./train_gpt_cpu "${base[@]}" -x 100000 -o "$TMP/busy" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"loss"' "$TMP/busy/log.jsonl" 2>/dev/null && break; sleep 0.1; done
run -x 4 -o "$TMP/busy" -y 1 > /dev/null 2> "$TMP/busy.err"
one_error second_run_refused "in use by another run \(process [0-9]+ holds" "$TMP/busy.err" $?
t_check first_run_unharmed "kill -0 $pid"
kill -TERM "$(pgrep -P $pid)"; wait $pid   # the trainer's own pid: timeout would pass the signal on twice
t_check first_run_stops_cleanly "[ -f \$(ls -d $TMP/busy/ckpt_* | tail -1)/DONE ]"

# A fresh run in a used directory is refused and changes nothing; -ow 1 starts over.
sum_before=$(cd "$TMP/deep/er/run" && cat log.jsonl ckpt_*/* | md5sum)
run -x 4 -o "$TMP/deep/er/run" > /dev/null 2> "$TMP/fresh.err"
one_error fresh_run_refuses_used_dir "holds an earlier run \(2 checkpoints, the newest ckpt_000004\)" "$TMP/fresh.err" $?
t_check refused_run_changed_nothing "[ \"\$(cd $TMP/deep/er/run && cat log.jsonl ckpt_*/* | md5sum)\" = '$sum_before' ]"
run -x 3 -o "$TMP/deep/er/run" -ow 1 > /dev/null 2>&1
t_check start_over_replaces_run "[ -f $TMP/deep/er/run/ckpt_000003/DONE ] && [ ! -e $TMP/deep/er/run/ckpt_000002 ] && [ ! -e $TMP/deep/er/run/ckpt_000004 ] && [ \$(grep -c '\"loss\"' $TMP/deep/er/run/log.jsonl) -eq 3 ]"
run -x 3 -o "$TMP/x" -ow 1 -y 1 > /dev/null 2> "$TMP/owy.err"
one_error start_over_contradicts_resume "contradict" "$TMP/owy.err" $?

# Recorded hyperparameters: a resume says what changed, and refuses where the run would differ.
run -x 4 -n 2 -u 1 -o "$TMP/hp" > /dev/null 2>&1
t_check manifest_records_run "grep -q '\"run\": {.*\"lr\": \"0.001\".*\"schedule\": \"constant\"' $TMP/hp/ckpt_000004/manifest.json"
rm -rf "$TMP/hp/ckpt_000004"
run -x 4 -u 1 -l 2e-3 -o "$TMP/hp" -y 1 > /dev/null 2> "$TMP/hp1.err"
one_error resume_refuses_changed_lr "would change -l 0.001 -> 0.002" "$TMP/hp1.err" $?
run -x 4 -u 1 -c 0.1 -gc 0.5 -o "$TMP/hp" -y 1 > /dev/null 2> "$TMP/hp2.err"
one_error resume_lists_every_change "would change -c 0 -> 0.1, -gc 1 -> 0.5" "$TMP/hp2.err" $?
run -x 4 -u 1 -t 16 -b 4 -o "$TMP/hp" -y 1 > /dev/null 2> "$TMP/hp3.err"
one_error resume_refuses_fixed_change "would change -t 32 -> 16, which a resume cannot change" "$TMP/hp3.err" $?
run -x 4 -u 4 -o "$TMP/hp" -y 1 > /dev/null 2> "$TMP/hp4.err"
one_error resume_refuses_changed_past_lr "would change -u 1 -> 4" "$TMP/hp4.err" $?
# The AdamW constants are recorded like -c, but a manifest holds them only off their defaults (a run with the
# defaults writes the manifest it wrote before they were flags), so a manifest without them means the defaults.
t_check manifest_leaves_out_default_adam "[ -f $TMP/hp/ckpt_000002/manifest.json ] && ! grep -q adam_ $TMP/hp/ckpt_000002/manifest.json"
run -x 4 -u 1 -beta1 0.8 -o "$TMP/hp" -y 1 > /dev/null 2> "$TMP/beta1.err"
one_error resume_refuses_changed_beta1 "would change -beta1 0.9 -> 0.8" "$TMP/beta1.err" $?
cp -r "$TMP/hp" "$TMP/beta"
run -x 4 -u 1 -beta1 0.8 -o "$TMP/beta" -y 2 > "$TMP/beta.txt" 2>&1
t_check resume_y2_lists_beta1 "grep -q 'with changed hyperparameters (-y 2): -beta1 0.9 -> 0.8' $TMP/beta.txt && grep -q '\"adam_beta1\": \"0.8\"' $TMP/beta/ckpt_000004/manifest.json" "$(tail -2 "$TMP/beta.txt")"
sed -i -E 's/, "adam_beta1": "[^"]*"//' "$TMP/beta/ckpt_000004/manifest.json" && reseal "$TMP/beta/ckpt_000004"
run -x 6 -u 1 -beta1 0.8 -o "$TMP/beta" -y 1 > /dev/null 2> "$TMP/beta2.err"
one_error manifest_without_beta1_means_default "would change -beta1 0.9 -> 0.8" "$TMP/beta2.err" $?
run -x 6 -u 1 -o "$TMP/beta" -y 1 > "$TMP/beta3.txt" 2>&1
t_check manifest_without_adam_resumes "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt_000004 at step 4' $TMP/beta3.txt && ! grep -q 'does not record' $TMP/beta3.txt" "$(tail -2 "$TMP/beta3.txt")"
run -x 4 -u 1 -l 2e-3 -o "$TMP/hp" -y 2 > "$TMP/hp5.txt" 2>&1
t_check resume_y2_accepts_and_says "grep -q 'with changed hyperparameters (-y 2): -l 0.001 -> 0.002' $TMP/hp5.txt && [ -f $TMP/hp/ckpt_000004/DONE ]"
# A manifest from before the run record: what may never change is still checked, from its batch and precision.
run -x 2 -u 1 -o "$TMP/norec" > /dev/null 2>&1
$PYTHON - "$TMP/norec/ckpt_000002/manifest.json" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
old = re.sub(r',\s*"run": \{[^}]*\}', "", text)
assert old != text and '"run"' not in old, "no run record to strip"
open(sys.argv[1], "w").write(old)
PY
reseal "$TMP/norec/ckpt_000002"
run -x 4 -u 1 -t 16 -b 4 -o "$TMP/norec" -y 1 > /dev/null 2> "$TMP/norec1.err"
one_error old_manifest_refuses_changed_t "was written with -t 32; this run has 16" "$TMP/norec1.err" $?
run -x 4 -u 1 -o "$TMP/norec" -y 1 -dump "$TMP/dump" > /dev/null 2> "$TMP/norec4.err"
one_error resume_refuses_dump "-dump writes step 0's tensors: this run resumes at step 2" "$TMP/norec4.err" $?
run -x 4 -u 1 -p bf16 -o "$TMP/norec" -y 1 > /dev/null 2> "$TMP/norec2.err"
one_error old_manifest_refuses_changed_precision "was written with -p fp32; this run has bf16" "$TMP/norec2.err" $?
run -x 4 -u 1 -o "$TMP/norec" -y 1 > "$TMP/norec3.txt" 2>&1
t_check old_manifest_resumes "grep -q 'resumed from .*ckpt_000002 at step 2' $TMP/norec3.txt && [ -f $TMP/norec/ckpt_000004/DONE ]" "$(tail -1 "$TMP/norec3.txt")"
# Every recorded setting, changed on a resume: refused under -y 1 naming it. The table must cover every key
# the manifest records, so a setting recorded later cannot go untested. -dpu's run records -v, -s and -n
# (each lands the delayed update early); -j "" turns validation, and so its landings, off.
$PYTHON scripts/make_shard.py -o "$TMP/val.bin" -n 4000 -V 512 --seed 12 >/dev/null
$PYTHON scripts/make_shard.py -o "$TMP/other.bin" -n 20000 -V 512 --seed 13 >/dev/null
# The AdamW constants off their defaults, so that the manifest records their keys too.
dpu=(-j "$TMP/val.bin" -m 2 -k cosine -q 0.1 -offload 1 -dpu 1 -v 2 -n 2 -beta1 0.85 -beta2 0.99 -eps 1e-7)
run -x 4 "${dpu[@]}" -o "$TMP/rec" > /dev/null 2>&1 && rm -rf "$TMP/rec/ckpt_000004"
changes=(tokens_per_step "-b 4" seq_len "-t 16 -b 4" seed "-seed 7" precision "-p bf16" train "-i $TMP/other.bin"
         shuffle "-sh 1" steps "-x 6" lr "-l 2e-3" warmup "-u 1" final_lr_frac "-q 0.2" schedule "-k linear"
         weight_decay "-c 0.1" grad_clip "-gc 0.5" delayed_update "-dpu 2" dpu_val_every "-v 3" dpu_sample_every "-s 3"
         dpu_ckpt_every "-n 3" adam_beta1 "-beta1 0.8" adam_beta2 "-beta2 0.9" adam_eps "-eps 1e-6")
recorded=$($PYTHON -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['run']))" "$TMP/rec/ckpt_000002/manifest.json")
tested=$(for ((i = 0; i < ${#changes[@]}; i += 2)); do printf '%s ' "${changes[i]}"; done)
t_check resume_change_table_covers_record "[ '$recorded ' = '$tested' ]" "recorded: $recorded; tested: $tested"
refused=0 why=""
for ((i = 0; i < ${#changes[@]}; i += 2)); do
    run -x 4 "${dpu[@]}" ${changes[i + 1]} -o "$TMP/rec" -y 1 > /dev/null 2> "$TMP/rec.err"
    if [ $? -eq 1 ] && [ "$(wc -l < "$TMP/rec.err")" -eq 1 ] && grep -q "^error: resuming .* would change .*->" "$TMP/rec.err"
    then refused=$((refused + 1)); else why+="${changes[i + 1]}: $(head -c 200 "$TMP/rec.err"); "; fi
done
t_check resume_refuses_each_recorded_change "[ $refused -eq $(( ${#changes[@]} / 2 )) ]" "accepted: $why"
run -x 4 "${dpu[@]}" -j "" -o "$TMP/rec" -y 1 > /dev/null 2> "$TMP/rec.err"
one_error resume_refuses_dpu_val_off "would change -v \(with -dpu\) 2 -> 0" "$TMP/rec.err" $?
run -x 4 "${dpu[@]}" -v 3 -o "$TMP/rec" -y 2 > "$TMP/rec.txt" 2>&1
t_check resume_y2_lists_dpu_landing "grep -q 'with changed hyperparameters (-y 2): -v (with -dpu) 2 -> 3' $TMP/rec.txt && [ -f $TMP/rec/ckpt_000004/DONE ]"
# Without -dpu the cadences only observe the run: a change is no change.
run -x 4 -n 2 -o "$TMP/nodpu" > /dev/null 2>&1 && rm -rf "$TMP/nodpu/ckpt_000004"
run -x 4 -n 3 -v 5 -o "$TMP/nodpu" -y 1 > "$TMP/nodpu.txt" 2>&1
t_check resume_observers_free_without_dpu "[ $? -eq 0 ] && grep -q 'resumed from .*ckpt_000002' $TMP/nodpu.txt"
# A manifest written before -dpu was recorded resumes, saying what it does not record.
run -x 4 "${dpu[@]}" -o "$TMP/predpu" > /dev/null 2>&1 && rm -rf "$TMP/predpu/ckpt_000004"
sed -i -E 's/, "(delayed_update|dpu_[a-z]+_every)": "[^"]*"//g' "$TMP/predpu/ckpt_000002/manifest.json" && reseal "$TMP/predpu/ckpt_000002"
run -x 4 "${dpu[@]}" -o "$TMP/predpu" -y 1 > "$TMP/predpu.txt" 2>&1
t_check old_manifest_notes_unrecorded "[ $? -eq 0 ] && grep -q 'does not record -dpu, -v (with -dpu), -s (with -dpu), -n (with -dpu)' $TMP/predpu.txt"

# A longer -x under a constant schedule changes no rate already used: accepted, said, and bit-identical.
run -x 6 -u 1 -o "$TMP/hp_straight" > /dev/null 2>&1
run -x 4 -u 1 -o "$TMP/ext" > /dev/null 2>&1
# Lines longer than any fixed buffer (a many-rank traffic record): the resume keeps or drops each whole.
$PYTHON -c "import json, sys; f = open(sys.argv[1], 'a'); [f.write(json.dumps({'step': s, 'pad': 'x' * 20000}) + '\n') for s in (1, 5)]" "$TMP/ext/log.jsonl"
run -x 6 -u 1 -o "$TMP/ext" -y 1 > "$TMP/ext.txt" 2>&1
t_check resume_log_long_lines_whole "$PYTHON -c \"import json, sys; pads = [json.loads(l)['step'] for l in open(sys.argv[1]) if 'pad' in json.loads(l)]; sys.exit(pads != [1])\" $TMP/ext/log.jsonl"
t_check resume_longer_x_accepted "grep -q 'with -x 4 -> 6: the 4 steps taken keep their learning rates' $TMP/ext.txt"
t_check resume_longer_x_bit_identical "cmp -s $TMP/hp_straight/ckpt_000006/model.bin $TMP/ext/ckpt_000006/model.bin"
run -x 2 -u 1 -o "$TMP/ext" -y 2 > /dev/null 2> "$TMP/past.err"
one_error resume_past_the_end "past this run's last step 2" "$TMP/past.err" $?

# A finished job relaunched (a scheduler's requeue): nothing to train, and its checkpoint is not rewritten.
ino=$(stat -c %i "$TMP/ext/ckpt_000006/model.bin")
run -x 6 -u 1 -o "$TMP/ext" -y 1 > "$TMP/again.txt" 2>&1
t_check finished_run_not_resaved "[ $? -eq 0 ] && grep -q 'already reached step 6 of 6' $TMP/again.txt && [ \$(stat -c %i $TMP/ext/ckpt_000006/model.bin) = $ino ]"

# Symlinks: a checkpoint moved to other storage and linked back, and a ckpt_tmp linked to a directory.
run -x 4 -n 2 -o "$TMP/ln" > /dev/null 2>&1
mkdir -p "$TMP/store" "$TMP/precious"
mv "$TMP/ln/ckpt_000004" "$TMP/store/" && ln -s "$TMP/store/ckpt_000004" "$TMP/ln/ckpt_000004"
echo keep > "$TMP/precious/file" && ln -s "$TMP/precious" "$TMP/ln/ckpt_tmp"
cp -r "$TMP/store/ckpt_000004" "$TMP/store_copy"
run -x 4 -o "$TMP/ln" -y 1 > "$TMP/ln1.txt" 2>&1
t_check symlinked_checkpoint_resumes "grep -q 'resumed from .*ckpt_000004 at step 4' $TMP/ln1.txt"
t_check symlinked_checkpoint_intact "diff -r $TMP/store/ckpt_000004 $TMP/store_copy > /dev/null"
t_check symlinked_tmp_target_intact "[ \"\$(cat $TMP/precious/file)\" = keep ] && [ ! -e $TMP/ln/ckpt_tmp ]"
# A damaged step re-saved through a link: the link is replaced, the files behind it are not touched.
rm "$TMP/store/ckpt_000004/manifest.json" && cp -r "$TMP/store/ckpt_000004" "$TMP/store_copy2"
run -x 4 -o "$TMP/ln" -y 1 > "$TMP/ln2.txt" 2> "$TMP/ln2.err"
t_check damaged_newest_skipped_with_warning "grep -q 'warning: skipping damaged checkpoints: .*ckpt_000004: manifest.json is missing' $TMP/ln2.err && grep -q 'resumed from .*ckpt_000002' $TMP/ln2.txt"
t_check resaved_link_replaced "[ ! -L $TMP/ln/ckpt_000004 ] && [ -f $TMP/ln/ckpt_000004/DONE ] && [ -f $TMP/ln/ckpt_000004/manifest.json ]"
t_check resaved_link_target_intact "diff -r $TMP/store/ckpt_000004 $TMP/store_copy2 > /dev/null"
t_check fallback_resume_bit_identical "cmp -s $TMP/ln/ckpt_000004/model.bin $TMP/store_copy/model.bin"

# What the loader checks. Each case damages the newest of two checkpoints (the older one is resumed, with
# a warning naming the problem) or the only one (one-line error).
run -x 4 -n 2 -o "$TMP/ld" > /dev/null 2>&1
damaged() {   # name, regex of the problem; ckpt_000004 is damaged by the caller
    run -x 4 -o "$TMP/ld" -y 1 > "$TMP/ld.txt" 2> "$TMP/ld.err"
    local rc=$?
    t_check "$1" "[ $rc -eq 0 ] && grep -Eq 'warning: skipping damaged checkpoints: .*ckpt_000004: .*$2' $TMP/ld.err && grep -q 'resumed from .*ckpt_000002' $TMP/ld.txt"
}
# Bytes changed in place: each file's CRC-32 in the manifest (the manifest's own in DONE) names the file.
cp -r "$TMP/ld/ckpt_000004" "$TMP/ld_good"
flip() {   # file, offset: 64 bytes inverted there
    $PYTHON - "$1" "$2" <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(path, "rb").read())
b[at:at + 64] = bytes(x ^ 0xFF for x in b[at:at + 64])
open(path, "r+b").write(b)
PY
}
restore() { rm -rf "$TMP/ld/ckpt_000004" && cp -r "$TMP/ld_good" "$TMP/ld/ckpt_000004"; }
flip "$TMP/ld/ckpt_000004/state_rank0.bin" 4096
$PYTHON scripts/export_checkpoint.py "$TMP/ld/ckpt_000004" "$TMP/exp" > /dev/null 2> "$TMP/exp.err"
one_error export_checkpoint_verifies "ckpt_000004/state_rank0.bin is damaged: its CRC-32 is [0-9a-f]{8}, the manifest.s" "$TMP/exp.err" $?
damaged state_file_checksum "state_rank0.bin is damaged: its CRC-32 is [0-9a-f]{8}, the manifest.s [0-9a-f]{8}"
restore; flip "$TMP/ld/ckpt_000004/model.bin" 2048
$PYTHON scripts/export_hf.py "$TMP/ld/ckpt_000004/model.bin" "$TMP/hfout" > /dev/null 2> "$TMP/exphf.err"
one_error export_hf_verifies "ckpt_000004/model.bin is damaged: its CRC-32 is" "$TMP/exphf.err" $?
$PYTHON scripts/export_checkpoint.py "$TMP/ld_good" "$TMP/exp" > /dev/null 2> "$TMP/exp.err"
t_check export_checkpoint_intact "[ $? -eq 0 ] && cmp -s $TMP/exp_model.bin $TMP/ld_good/model.bin" "$(cat "$TMP/exp.err")"
damaged model_file_checksum "model.bin is damaged: its CRC-32 is"
restore; sed -i 's/"loss_scale": 1,/"loss_scale": 8,/' "$TMP/ld/ckpt_000004/manifest.json"
damaged manifest_checksum_in_done "manifest.json is damaged: its CRC-32 is [0-9a-f]{8}, DONE.s"
t_check checksums_match_zlib "$PYTHON -c \"import json, sys, zlib
d = sys.argv[1]; m = json.load(open(d + '/manifest.json'))
ok = all(int(c, 16) == zlib.crc32(open(d + '/' + f, 'rb').read()) for f, c in m['crc32'].items())
ok = ok and int(json.load(open(d + '/DONE'))['manifest.json'], 16) == zlib.crc32(open(d + '/manifest.json', 'rb').read())
sys.exit(not (ok and sorted(m['crc32']) == ['model.bin', 'state_rank0.bin']))\" $TMP/ld_good"
# The manifest is read as JSON: another key order and spacing (the same values) resumes as before.
restore
$PYTHON -c "import json, random, sys
m = json.load(open(sys.argv[1])); keys = list(m); random.Random(3).shuffle(keys)
json.dump({k: m[k] for k in reversed(keys)}, open(sys.argv[1], 'w'), indent=3)" "$TMP/ld/ckpt_000004/manifest.json" && reseal "$TMP/ld/ckpt_000004"
run -x 4 -o "$TMP/ld" -y 1 > "$TMP/ld.txt" 2>&1
t_check manifest_key_order_free "grep -q 'already reached step 4' $TMP/ld.txt && ! grep -q warning $TMP/ld.txt" "$(tail -2 "$TMP/ld.txt")"
# A checkpoint from before checksums (manifest format 1: neither "format" nor "crc32", an empty DONE) resumes,
# saying it is not verified.
restore; sed -i -E 's/"format": 3, //; s/"crc32": \{[^}]*\},//' "$TMP/ld/ckpt_000004/manifest.json" && : > "$TMP/ld/ckpt_000004/DONE"
run -x 4 -o "$TMP/ld" -y 1 > "$TMP/ld.txt" 2>&1
t_check unchecksummed_checkpoint_noted "grep -q 'ckpt_000004 records no checksums .*not verified' $TMP/ld.txt && grep -q 'already reached step 4' $TMP/ld.txt"
restore
sed -i 's/"step": 4,/"step": 1,/' "$TMP/ld/ckpt_000004/manifest.json" && reseal "$TMP/ld/ckpt_000004"
damaged manifest_step_must_match_dir "manifest.json says step 1, its directory.s name 4"
sed -i 's/"step": 4,/"step": "three",/' "$TMP/ld/ckpt_000004/manifest.json" && reseal "$TMP/ld/ckpt_000004"
damaged manifest_step_must_be_integer "lacks a field or has a malformed one"
rm -f "$TMP/ld/ckpt_000004/state_rank0.bin" && mkfifo "$TMP/ld/ckpt_000004/state_rank0.bin"
damaged fifo_state_file_refused "state_rank0.bin is not a regular file"
rm -rf "$TMP/ld/ckpt_000004"; mkdir "$TMP/ld/ckpt_000004"; touch "$TMP/ld/ckpt_000004/DONE"; mkdir "$TMP/ld/ckpt_000004/manifest.json"
damaged directory_manifest_refused "manifest.json is not a regular file"
rm -rf "$TMP/ld/ckpt_000004"
rm "$TMP/ld/ckpt_000002/model.bin"
run -x 4 -o "$TMP/ld" -y 1 > /dev/null 2> "$TMP/none.err"
one_error all_damaged_is_an_error "no usable checkpoint in .*ckpt_000002: model.bin is missing\)" "$TMP/none.err" $?

# Two ranks' state files: the manifest's count, a rank file copied over another, and the spans.
if mpi_available; then
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -b 1 -z 1 -x 2 -o "$TMP/two" > /dev/null 2>&1
    c="$TMP/two/ckpt_000002"
    cp -r "$c" "$TMP/two_good"
    expect_resume_error() {   # name, regex
        "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -b 1 -z 1 -x 2 -o "$TMP/two" -y 1 > /dev/null 2> "$TMP/two.err"
        local rc=$?
        t_check "$1" "[ $rc -ne 0 ] && [ \$(grep -c '^error: ' $TMP/two.err) -eq 1 ] && grep -Eq '^error: no usable checkpoint.*$2' $TMP/two.err" "rc=$rc: $(head -c 300 "$TMP/two.err")"
        rm -rf "$c" && cp -r "$TMP/two_good" "$c"
    }
    sed -i 's/"state_files": 2/"state_files": 1/' "$c/manifest.json" && reseal "$c"
    expect_resume_error manifest_fewer_state_files "the 1 state files miss parameters"
    cp "$c/state_rank0.bin" "$c/state_rank1.bin" && reseal_files "$c"
    expect_resume_error copied_rank_file "state_rank1.bin was written by rank 0"
    # The copy with its header's rank patched: only the spans can tell.
    $PYTHON - "$c/state_rank0.bin" "$c/state_rank1.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<q", b, 5 * 8, 1)
open(sys.argv[2], "wb").write(b)
PY
    reseal_files "$c"
    expect_resume_error copied_rank_file_spans_overlap "the 2 state files repeat parameters"
    flip "$c/state_rank1.bin" 1000
    expect_resume_error second_rank_state_checksum "state_rank1.bin is damaged: its CRC-32 is"
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu "${base[@]}" -b 1 -z 1 -x 2 -o "$TMP/two" -y 1 > "$TMP/two_ok.txt" 2>&1
    t_check intact_two_rank_checkpoint_resumes "grep -q 'already reached step 2' $TMP/two_ok.txt"
else
    t_missing two_rank_state_files MPI
fi

# Damage is told by the checksums before any header is read: one bit flipped in a header of the newest
# checkpoint (model.bin's layer count, which would name another shape; a state file's parameter count; the
# manifest's model record), or an empty DONE (only a checkpoint from before checksums has one; here beside
# an edited manifest, of today's format and of format 2), skips it with a warning naming the damage, and the
# older one resumes; on 1 rank, and on 2 ranks (rank 0 chooses for both).
flip_bit() {   # file, byte offset: its lowest bit flipped
    $PYTHON -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(int(sys.argv[2])); b = f.read(1)[0] ^ 1; f.seek(int(sys.argv[2])); f.write(bytes([b]))" "$1" "$2"
}
on_ranks() {   # ranks, flags...: the same tokens per step on either
    local np=$1; shift
    if [ "$np" -gt 1 ]; then timeout -k 5 120 "${MPIRUN[@]}" -np "$np" ./train_gpt_cpu "${base[@]}" -b 1 -z 1 "$@"; else run "$@"; fi
}
damaged_header() {   # ranks, name, regex of the warning, command that damages the checkpoint it runs in
    local np=$1 name=$2 want=$3 d=$TMP/hd$1_$2; shift 3
    if ! cp -r "$TMP/hd$np" "$d" || ! (cd "$d/ckpt_000002" && "$@"); then t_fail "damaged_${name}_skipped_np$np" "cannot damage a copy: $*"; return; fi
    on_ranks "$np" -x 2 -o "$d" -y 1 > "$d.txt" 2>&1
    local rc=$?
    t_check "damaged_${name}_skipped_np$np" "[ $rc -eq 0 ] && grep -Eq 'warning: skipping damaged checkpoints: .*ckpt_000002: $want' $d.txt && grep -q 'resumed from .*ckpt_000001 at step 1' $d.txt" \
        "rc=$rc: $(grep -E -m2 'error|warning|resumed' "$d.txt" | head -c 300)"
}
empty_done_edited() { sed -i 's/"loss_scale": 1,/"loss_scale": 8,/' manifest.json && : > DONE; }
empty_done_format2() { sed -i 's/"format": 3, //' manifest.json && ! grep -q '"format"' manifest.json && empty_done_edited; }
nps=1
mpi_available && nps="1 2" || t_missing damaged_headers_np2 MPI
for np in $nps; do
    on_ranks "$np" -x 2 -n 1 -o "$TMP/hd$np" > /dev/null 2>&1
    t_check "damaged_headers_run_np$np" "[ -f $TMP/hd$np/ckpt_000001/DONE ] && [ -f $TMP/hd$np/ckpt_000002/DONE ]"
    last=$((np - 1))
    damaged_header "$np" model_header "model.bin is damaged: its CRC-32" flip_bit model.bin 16
    damaged_header "$np" state_header "state_rank$last.bin is damaged: its CRC-32" flip_bit "state_rank$last.bin" 16
    damaged_header "$np" manifest_model "manifest.json is damaged: its CRC-32 is [0-9a-f]{8}, DONE.s" sed -i 's/"L": 2,/"L": 3,/' manifest.json
    damaged_header "$np" empty_done "DONE is empty, but manifest.json records checksums" empty_done_edited
done
damaged_header 1 empty_done_format2 "DONE is empty, but manifest.json records checksums" empty_done_format2
cp -r "$TMP/hd1/ckpt_000002" "$TMP/hd_export" && : > "$TMP/hd_export/DONE"
$PYTHON scripts/export_checkpoint.py "$TMP/hd_export" "$TMP/hdx" > /dev/null 2> "$TMP/hdx.err"
one_error export_refuses_empty_done "DONE is empty, but manifest.json records checksums" "$TMP/hdx.err" $?

# -y 1 with no checkpoint starts at step 0; it says so only where an earlier run's log is replaced.
run -x 1 -o "$TMP/y1" -y 1 > "$TMP/y1a.txt" 2>&1
rm -rf "$TMP/y1"/ckpt_*
run -x 1 -o "$TMP/y1" -y 1 > "$TMP/y1b.txt" 2>&1
t_check y1_without_checkpoint_says_so_once "! grep -q 'no checkpoint in' $TMP/y1a.txt && grep -q 'no checkpoint in .*: starting at step 0' $TMP/y1b.txt"

# A FIFO in place of the log is refused, not waited on.
run -x 2 -o "$TMP/fifo_log" > /dev/null 2>&1
rm "$TMP/fifo_log/log.jsonl" && mkfifo "$TMP/fifo_log/log.jsonl"
run -x 3 -o "$TMP/fifo_log" -y 1 > /dev/null 2> "$TMP/fifo_log.err"
one_error fifo_log_refused "log.jsonl is not a regular file" "$TMP/fifo_log.err" $?

# A stale ckpt_tmp (a crash or a full disk mid-checkpoint) is removed at start-up, before anything is written.
run -x 2 -o "$TMP/st" > /dev/null 2>&1
mkdir "$TMP/st/ckpt_tmp" && head -c 1000000 /dev/zero > "$TMP/st/ckpt_tmp/state_rank0.bin"
run -x 3 -o "$TMP/st" -y 1 > /dev/null 2>&1
t_check stale_tmp_removed "[ ! -e $TMP/st/ckpt_tmp ] && [ -f $TMP/st/ckpt_000003/DONE ]"
t_finish
