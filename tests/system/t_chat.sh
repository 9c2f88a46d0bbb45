#!/usr/bin/env bash
# -chat and -chat-file: a conversation rendered with chat_format.json's pieces (ChatML's, on a byte-level
# tokenizer.json with <|im_start|> and <|im_end|> added), answered by a Llama whose blocks add nothing and
# whose head maps each token of "\n", "p", "o", "n", "g", <|im_end|>, <|endoftext|> to the next one, so that
# greedy decoding after the generation prompt's "\n" says "pong" and then ends the turn.
#   - the rendered ids, for one message, for a file with a system message, blank and CRLF lines followed by
#     -chat's message, and for a file alone, equal the ids of the text the template renders, written out here;
#   - the reply stops at <|im_end|>, unprinted, and only the reply is printed; -prompt from the same ids draws
#     the same tokens and goes on past it; a format whose end of turn never comes stops at the tokenizer's
#     document start instead; a pipeline of 2 stages answers as one rank does;
#   - bad input is one line: no chat_format.json, a malformed one, an end_of_turn that is not one token, a bad
#     line of the file, -chat with -prompt.
# test_chat.c checks the renderer against Llama 3.1's and Qwen2.5's templates, and every refusal.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
make -s build/tokenizer || { t_fail tokenizer_tool_builds "make build/tokenizer failed"; t_finish; }
FILES="$PYTHON tests/tools/hf_tokenizer_files.py"
special() { echo "added_tokens.+={\"id\": $1, \"content\": \"$2\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}"; }
mkdir -p "$TMP/tok" "$TMP/nostop"
$FILES tiny "$TMP/tiny.json"
$FILES edit "$TMP/tiny.json" "$TMP/tok/tokenizer.json" "$(special 260 '<|im_start|>')" "$(special 261 '<|im_end|>')"
DOC_START=$($FILES id "$TMP/tok/tokenizer.json" '<|endoftext|>')
# ChatML's pieces, with a short default system message.
format() {   # end_of_turn
    cat <<EOF
{"version": 1, "template_sha256": "0",
 "prefix": "<|im_start|>system\\nBe brief.<|im_end|>\\n", "prefix_with_system": "<|im_start|>system\\n",
 "roles": {"system": ["<|im_start|>system\\n", "<|im_end|>\\n"], "user": ["<|im_start|>user\\n", "<|im_end|>\\n"],
           "assistant": ["<|im_start|>assistant\\n", "<|im_end|>\\n"]},
 "generation_prompt": "<|im_start|>assistant\\n", "end_of_turn": "$1"}
EOF
}
format '<|im_end|>' > "$TMP/tok/chat_format.json"
MODEL=$TMP/pong.bin
$PYTHON - "$MODEL" "$DOC_START" <<'PY'
import os, sys
import numpy as np
sys.path.append(os.path.abspath("scripts"))
import families, model_file
cfg = families.from_spec("llama:L2,C64,H8,F64,V262,T64")
p = {n: np.zeros(s, np.float32) for n, s in zip(cfg.names, cfg.shapes())}
for n in ("attn_norm", "mlp_norm", "final_norm"):
    p[n][...] = 1
# The blocks' output projections are 0, so the last position's logits are lm_head @ RMSNorm(wte[token]).
chain = [10, ord("p"), ord("o"), ord("n"), ord("g"), 261, int(sys.argv[2])]
for i, (a, b) in enumerate(zip(chain, chain[1:])):
    p["wte"][a, i] = p["lm_head"][b, i] = 1
model_file.save_model(sys.argv[1], cfg, p)
PY
run() {   # out file, flags...: the model with the tokenizer and chat_format.json in $TMP/tok
    local out=$1; shift
    ./train_gpt_cpu -e "$MODEL" -tk "$TMP/tok/tokenizer.json" -b 1 -t 64 -g 24 -temp 0 "$@" > "$out" 2> "$out.err"
}
ids() { sed -n 's/^ids: \[\(.*\)\]$/\1/p' "$1"; }
prompt_ids() { sed -n 's/^prompt: [0-9]* tokens\? \[\(.*\)\]$/\1/p' "$1"; }
# The texts' ids from build/tokenizer (tokenize.py's encoder), one line each.
encode() {   # texts...
    $PYTHON - "$TMP/tok/tokenizer.json" "$@" <<'PY'
import struct, subprocess, sys
docs = [t.encode() for t in sys.argv[2:]]
out = subprocess.run(["build/tokenizer", sys.argv[1], "-w", "4"], check=True, capture_output=True,
                     input=b"".join(b"T" + struct.pack("<I", 1) + b"x" + struct.pack("<Q", len(d)) + d for d in docs)).stdout
at = 0
for _ in docs:
    n, = struct.unpack_from("<Q", out, at)
    print(", ".join(map(str, struct.unpack_from("<%dI" % n, out, at + 8))))
    at += 8 + 4 * n
PY
}
USER_PING=$'<|im_start|>user\nping<|im_end|>\n'
ASSISTANT=$'<|im_start|>assistant\n'
CAT_TURN=$'pong<|im_end|>\n<|im_start|>user\ncat<|im_end|>\n'
RENDERED=$'<|im_start|>system\nBe brief.<|im_end|>\n'"$USER_PING$ASSISTANT"
mapfile -t want < <(encode "$RENDERED" $'<|im_start|>system\nBe kind.<|im_end|>\n'"$USER_PING$ASSISTANT$CAT_TURN$ASSISTANT" \
    $'<|im_start|>system\nBe brief.<|im_end|>\n'"$USER_PING$ASSISTANT$CAT_TURN$ASSISTANT" pong $'pong<|im_end|>')
[ ${#want[@]} -eq 5 ] || { t_fail encode "build/tokenizer gave ${#want[@]} lines"; t_finish; }

# One message: the default system prefix, the user's turn, the generation prompt.
run "$TMP/one" -chat ping -chat-ids 1
t_check one_message_rendered_ids "[ \"\$(prompt_ids $TMP/one)\" = '${want[0]}' ]" "trainer [$(prompt_ids "$TMP/one")] $(cat "$TMP/one.err"); template [${want[0]}]"
# The reply: "pong" and the end of turn, which ends it unprinted.
t_check reply_stops_at_end_of_turn "[ \"\$(ids $TMP/one)\" = '${want[3]}, 261' ] && [ \"\$(sed -n 2p $TMP/one)\" = pong ]" \
    "ids [$(ids "$TMP/one")], text '$(sed -n 2p "$TMP/one")'"
run "$TMP/plain" -chat ping
t_check only_the_reply_printed "[ \"\$(cat $TMP/plain)\" = pong ] && [ ! -s $TMP/plain.err ]" "stdout '$(cat "$TMP/plain")', stderr '$(cat "$TMP/plain.err")'"
# -prompt from the same text draws the same tokens, and goes on past the end of turn.
./train_gpt_cpu -e "$MODEL" -tk "$TMP/tok/tokenizer.json" -b 1 -t 64 -g 8 -temp 0 -prompt "$RENDERED" > "$TMP/prompt.txt" 2>&1
t_check prompt_goes_past_end_of_turn "[ \"\$(prompt_ids $TMP/prompt.txt)\" = '${want[0]}' ] && [[ \"\$(ids $TMP/prompt.txt)\" == '${want[3]}, 261, '[0-9]* ]]" \
    "-prompt [$(ids "$TMP/prompt.txt")], -chat [$(ids "$TMP/one")]"

# A file: a system message, a blank line, a CRLF line, a finished turn; then -chat's message.
printf '{"role": "system", "content": "Be kind."}\n\n{"role": "user", "content": "ping"}\r\n{"content": "pong", "role": "assistant"}\n' > "$TMP/history.jsonl"
run "$TMP/multi" -chat-file "$TMP/history.jsonl" -chat cat -chat-ids 1
t_check file_and_message_rendered_ids "[ \"\$(prompt_ids $TMP/multi)\" = '${want[1]}' ]" "trainer [$(prompt_ids "$TMP/multi")] $(cat "$TMP/multi.err"); template [${want[1]}]"
# The same turns as a file alone, under the default system message.
printf '{"role": "user", "content": "ping"}\n{"role": "assistant", "content": "pong"}\n{"role": "user", "content": "cat"}\n' > "$TMP/turns.jsonl"
run "$TMP/turns" -chat-file "$TMP/turns.jsonl" -chat-ids 1
t_check file_rendered_ids "[ \"\$(prompt_ids $TMP/turns)\" = '${want[2]}' ]" "trainer [$(prompt_ids "$TMP/turns")] $(cat "$TMP/turns.err"); template [${want[2]}]"

# An end of turn that never comes ("Z", one byte token): the reply runs on to the document start.
cp "$TMP/tok/tokenizer.json" "$TMP/nostop/"
format 'Z' > "$TMP/nostop/chat_format.json"
./train_gpt_cpu -e "$MODEL" -tk "$TMP/nostop/tokenizer.json" -b 1 -t 64 -g 24 -temp 0 -chat ping -chat-ids 1 > "$TMP/doc.txt" 2>&1
t_check reply_stops_at_document_start "[ \"\$(ids $TMP/doc.txt)\" = '${want[4]}, $DOC_START' ] && [ \"\$(sed -n 2p $TMP/doc.txt)\" = 'pong<|im_end|>' ]" \
    "ids [$(ids "$TMP/doc.txt")] $(sed -n 2p "$TMP/doc.txt")"

if mpi_available; then
    "${MPIRUN[@]}" -np 2 ./train_gpt_cpu -e "$MODEL" -tk "$TMP/tok/tokenizer.json" -b 1 -t 64 -g 24 -temp 0 -chat-file "$TMP/turns.jsonl" \
        -chat-ids 1 -pp 2 > "$TMP/pp.txt" 2>&1
    t_check pipeline_answers_as_one_rank "[ -n \"\$(ids $TMP/turns)\" ] && cmp -s $TMP/pp.txt $TMP/turns" "$(diff "$TMP/pp.txt" "$TMP/turns" | head -5)"
else
    t_missing pipeline_answers_as_one_rank MPI
fi

# Bad input: one line each, exit 1.
expect_error() {   # name, pattern, flags...
    local name=$1 pattern=$2; shift 2
    ./train_gpt_cpu -e "$MODEL" -b 1 -t 64 "$@" > /dev/null 2> "$TMP/err"
    local rc=$?
    t_check "$name" "[ $rc -eq 1 ] && [ \$(wc -l < $TMP/err) -eq 1 ] && grep -qF -- \"\$pattern\" $TMP/err" "rc $rc: $(cat "$TMP/err")"
}
mkdir -p "$TMP/noformat" "$TMP/badformat" "$TMP/notoken"
cp "$TMP/tok/tokenizer.json" "$TMP/noformat/"
expect_error refuses_no_chat_format "-chat needs $TMP/noformat/chat_format.json" -tk "$TMP/noformat/tokenizer.json" -chat hi
cp "$TMP/tok/tokenizer.json" "$TMP/badformat/"
format '<|im_end|>' | sed 's/"user": \[/"user": [1, /' > "$TMP/badformat/chat_format.json"
expect_error refuses_bad_chat_format "$TMP/badformat/chat_format.json: \"roles\".\"user\" is not a list of two strings" \
    -tk "$TMP/badformat/tokenizer.json" -chat hi
cp "$TMP/tiny.json" "$TMP/notoken/tokenizer.json"   # no <|im_end|>: the end of turn is ten byte tokens
format '<|im_end|>' > "$TMP/notoken/chat_format.json"
expect_error refuses_end_of_turn_not_one_token "its end_of_turn is 10 tokens of $TMP/notoken/tokenizer.json, not one" \
    -tk "$TMP/notoken/tokenizer.json" -chat hi
printf '{"role": "user", "content": "ping"}\n{"role": "tool", "content": "x"}\n' > "$TMP/bad.jsonl"
expect_error refuses_bad_file_line "-chat-file $TMP/bad.jsonl: line 2: the role \"tool\" is not system, user or assistant" \
    -tk "$TMP/tok/tokenizer.json" -chat-file "$TMP/bad.jsonl"
expect_error refuses_chat_with_prompt "-prompt continues a text, -chat answers a conversation" -chat hi -prompt hi
t_finish
