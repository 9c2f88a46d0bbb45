#!/usr/bin/python3
"""HellaSwag's validation set -> one evaluation file for the trainer's -hs (llm.c's eval file format).

  prepare_hellaswag.py [--jsonl FILE | --url URL] [-o DIR] [--tokenizer tokenizer.json] [--token-bits B]

Without --jsonl it downloads the official validation set (10,042 examples) from
  https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
--jsonl FILE reads a local file in the same format instead: one JSON object per line with "ctx" (the
context), "endings" (four strings) and "label" (0..3, the right ending); other keys are ignored.
Each example becomes its context's tokens (no document start before them) and four endings, each ending
encoded with a space before it, as llm.c renders them (scripts/tokenize.py's encoder: GPT-2's tokenizer, or
with --tokenizer a Hugging Face tokenizer.json). The file DIR/hellaswag_val.bin (DIR: data/hellaswag by
default) is
  256 x int32 header [20240522, version, examples, longest example in bytes], then per example the elements
  <0xFFFF><its bytes><index><label><4><n><n context tokens>, then 4 x <n><n ending tokens>
with uint16 elements (version 1, llm.c's) or, with --token-bits 32 (the default for a vocabulary past
65,535 tokens), uint32 elements and the delimiter 0xFFFFFFFF (version 2); little-endian.
  ./train_gpt -hs data/hellaswag/hellaswag_val.bin -v 250 ...
Errors (a missing key, a label outside 0..3, not four endings, a failed download) are one line on stderr and
exit 1; the output file is then left as it was.
"""
import os
import sys

# Python puts this script's directory first on the path, where scripts/tokenize.py would shadow the standard
# library's tokenize module; tokenize.py is loaded by its path below.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import struct  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
MAGIC = 20240522
ENDINGS = 4


def load_tokenize():
    spec = importlib.util.spec_from_file_location("gpt_zero_tokenize", os.path.join(_HERE, "tokenize.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tok = load_tokenize()
Fail = tok.Fail


def download(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise Fail(f"cannot download {url}: {reason}")


def read_local(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Fail(f"{path}: {e.strerror}")


def utf8(text, where, what):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Fail(f"{where}: the {what} holds a lone surrogate U+{ord(e.object[e.start]):04X}, which is not valid Unicode")


def parse_example(line, where):
    """(context bytes, [4 ending bytes, each after a space], label) of one JSON line."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise Fail(f"{where}: not a JSON object")
    if not isinstance(obj, dict):
        raise Fail(f"{where}: not a JSON object")
    for key in ("ctx", "endings", "label"):
        if key not in obj:
            raise Fail(f'{where}: missing key "{key}"')
    ctx, endings, label = obj["ctx"], obj["endings"], obj["label"]
    if not isinstance(ctx, str) or not ctx:
        raise Fail(f'{where}: "ctx" must be a non-empty string')
    if not isinstance(endings, list) or len(endings) != ENDINGS:
        n = len(endings) if isinstance(endings, list) else "no list of"
        raise Fail(f'{where}: "endings" has {n} endings, not {ENDINGS}')
    if not all(isinstance(e, str) for e in endings):
        raise Fail(f'{where}: every ending must be a string')
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < ENDINGS:
        raise Fail(f'{where}: "label" {json.dumps(label)} is outside 0..{ENDINGS - 1}')
    return utf8(ctx, where, "context"), [utf8(" " + e, where, "ending") for e in endings], label


def parse_jsonl(data, name):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Fail(f"{name}: not valid UTF-8 at byte {e.start}")
    examples = [parse_example(line, f"{name}:{i}") for i, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not examples:
        raise Fail(f"{name}: no examples")
    return examples


def encode(examples, tokenizer):
    """[(context ids, [4 ending ids], label)] and the vocabulary size."""
    texts = [t for ctx, ends, _ in examples for t in [ctx] + ends]
    ids, vocab = tok.encode_texts(texts, tokenizer)
    per = 1 + ENDINGS
    return [(ids[per * i], ids[per * i + 1:per * (i + 1)], ex[2]) for i, ex in enumerate(examples)], vocab


def example_elements(index, ctx, endings, label, delimiter):
    body = [index, label, ENDINGS, len(ctx)] + ctx
    for e in endings:
        body += [len(e)] + e
    return [delimiter, 0] + body   # the byte count goes in slot 1 once the width is known


def file_bytes(encoded, bits):
    """The evaluation file; a Fail when an example does not fit version 1's 16-bit fields."""
    width, top = bits // 8, (1 << bits) - 1
    streams, longest = [], 0
    for i, (ctx, endings, label) in enumerate(encoded):
        el = example_elements(i, ctx, endings, label, top)
        el[1] = width * len(el)
        if el[1] > top or max(el[2:]) >= top:
            raise Fail(f"example {i + 1} does not fit {bits}-bit fields (its size, its index or a token id "
                       f"reaches {top}): use --token-bits 32")
        streams.append(struct.pack(f"<{len(el)}{'H' if bits == 16 else 'I'}", *el))
        longest = max(longest, el[1])
    header = struct.pack("<4i", MAGIC, 1 if bits == 16 else 2, len(encoded), longest) + bytes(1024 - 16)
    return [header] + streams


def write_atomic(path, chunks):
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    except OSError as e:
        raise Fail(f"cannot create {os.path.dirname(path)}: {e.strerror}")
    tok.write_atomic(path, chunks)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--jsonl", metavar="FILE", help="a local copy of the validation set (or any file in its format)")
    src.add_argument("--url", default=URL, help="where to download it from (default: the official location)")
    p.add_argument("-o", "--out", default=os.path.join("data", "hellaswag"), help="output directory (default data/hellaswag)")
    p.add_argument("--tokenizer", metavar="FILE", help="a Hugging Face tokenizer.json (default: GPT-2's)")
    p.add_argument("--token-bits", type=int, metavar="{16,32}", help="element width (default: 16 when the vocabulary fits)")
    a = p.parse_args(argv)
    if a.token_bits not in (None, 16, 32):
        raise Fail(f"--token-bits must be 16 or 32 (got {a.token_bits})")
    return a


def main(argv):
    try:
        if sys.byteorder != "little":
            raise Fail("only little-endian machines are supported")
        args = parse_args(argv)
        data, name = (read_local(args.jsonl), args.jsonl) if args.jsonl else (download(args.url), args.url)
        examples = parse_jsonl(data, name)
        encoded, vocab = encode(examples, args.tokenizer)
        bits = args.token_bits or (16 if vocab <= 0xFFFF else 32)
        if bits == 16 and vocab > 0xFFFF:
            raise Fail(f"--token-bits 16 cannot hold the {vocab}-token vocabulary (ids up to 65,534): use 32")
        path = os.path.join(args.out, "hellaswag_val.bin")
        write_atomic(path, file_bytes(encoded, bits))
    except Fail as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    print(f"{len(encoded)} examples, {bits}-bit, in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
