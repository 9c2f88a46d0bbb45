#!/usr/bin/env bash
# Flags of the flag table at work (the table against docs/flags.md and -h is build/test_flags): -h exits 0 with
# every flag the page names; AdamW's -beta1, -beta2 and -eps reach the update and the start-up's optimizer line,
# and given at their defaults they train bit for bit as without them.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON scripts/make_shard.py -o "$TMP/d.bin" -n 5000 -V 512 --seed 3 >/dev/null
base=(-e L2C64H4V512T64 -i "$TMP/d.bin" -j "" -b 2 -t 32 -x 2 -s 0 -l 1e-2)

./train_gpt_cpu -h > "$TMP/h.txt" 2>&1
rc=$?
documented=$(sed '/^## /,$d' docs/flags.md | grep '^| `-' | cut -d'|' -f2 | grep -o '`--\?[a-z][a-z0-9-]*' | tr -d '`' | sort -u)
unlisted=$(for f in $documented; do grep -q -- "^  $f\( \|$\)\|(also $f)" "$TMP/h.txt" || echo "$f"; done)
t_check help_lists_documented_flags "[ $rc -eq 0 ] && [ -n '$documented' ] && [ -z '$unlisted' ]" "rc $rc; not in -h: $unlisted"

train() {   # name, flags...: a run into $TMP/NAME
    local name=$1; shift
    timeout 60 ./train_gpt_cpu "${base[@]}" "$@" -o "$TMP/$name" > "$TMP/$name.txt" 2>&1 || echo "exit $? in $name" >> "$TMP/errors"
}
model() { echo "$TMP/$1/ckpt_000002/model.bin"; }
train default
train explicit -beta1 0.9 -beta2 0.95 -eps 1e-8
train beta1 -beta1 0.5
train beta2 -beta2 0.5
train eps -eps 1e-2
t_check adam_runs_finish "[ ! -s $TMP/errors ] && [ -f $(model default) ]" "$(cat "$TMP/errors" 2>/dev/null)"
t_check adam_defaults_given_same_bits "cmp -s $(model default) $(model explicit)"
for f in beta1 beta2 eps; do
    t_check "adam_${f}_changes_the_update" "[ -f $(model $f) ] && ! cmp -s $(model default) $(model $f)"
done
t_check adam_banner_default "grep -qx 'optimizer: AdamW beta1 0.9, beta2 0.95, eps 1e-08, weight decay 0 on 2-D tensors | gradient clip 1' $TMP/default.txt" \
    "$(grep '^optimizer' "$TMP/default.txt")"
t_check adam_banner_given "grep -q '^optimizer: AdamW beta1 0.5, beta2 0.95, eps 1e-08,' $TMP/beta1.txt" "$(grep '^optimizer' "$TMP/beta1.txt")"
t_finish
