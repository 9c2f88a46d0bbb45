# tokenizer_json_lib.sh: sourced by the tokenizer.json tests (t_tokenizer_hf.sh, t_tokenizer_nfc.sh) after
# lib.sh, with FILES (tests/tools/hf_tokenizer_files.py), GT (build/tokenizer) and $TMP/tiny.json set up.
expect_error() {   # name, pattern, command...: exit 1 with one line on stderr that holds the pattern
    local name=$1 pat=$2; shift 2
    "$@" > /dev/null 2> "$TMP/err" < /dev/null; local rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -qF -- "$pat" "$TMP/err"; then t_ok "$name"
    else t_fail "$name" "exit $rc, stderr: $(head -3 "$TMP/err" | tr '\n' '|')"; fi
}
refuses() {   # name, message part, edits...: $TMP/tiny.json with the edits, as $TMP/NAME.json, is refused
    local name=$1 pat=$2; shift 2
    $FILES edit "$TMP/tiny.json" "$TMP/$name.json" "$@"
    expect_error "refuses_$name" "error: $TMP/$name.json: $pat" "$GT" "$TMP/$name.json" --info
}
