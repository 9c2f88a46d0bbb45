#!/usr/bin/env python3
"""A small Hugging Face tokenizer.json of the byte-level BPE kind, learned from a text, for tests that need a
Llama-3-style tokenizer whose vocabulary keeps a model tiny.

  make_tiny_tokenizer.py TEXT OUT.json [--merges N] [--special TOKEN]...

Pre-tokenization is Llama 3's Split regex; the vocabulary is the 256 byte tokens (in GPT-2's printable
byte-to-character map), then one token per merge, learned greedily (the most frequent adjacent pair over
the text's pre-tokens, ties to the smaller pair), then the special tokens <|begin_of_text|> and
<|end_of_text|>, which the post-processor puts before each sequence as Llama 3's does, then those given with
--special (a chat template's). The file's keys and layout are those of Llama 3's own tokenizer.json
(ignore_merges, merges as "a b" strings).
"""
import argparse
import collections
import importlib.util
import json
import os
import sys

import regex

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_chars():
    """GPT-2's map of the 256 bytes to printable characters (byte-level BPE's alphabet), from tokenize.py."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "tokenize.py")
    spec = importlib.util.spec_from_file_location("project_tokenize", path)   # not the standard library's
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bytes_to_unicode()


def learn_merges(text, count):
    chars = byte_chars()
    words = collections.Counter(tuple(chars[b] for b in piece.encode("utf-8"))
                                for piece in regex.findall(LLAMA3_PATTERN, text))
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            joined[tuple(out)] += n
        words = joined
    return merges


def tokenizer_json(merges, extra=()):
    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    bos, eos = len(vocab), len(vocab) + 1
    special = [(bos, "<|begin_of_text|>"), (eos, "<|end_of_text|>")]
    special += [(eos + 1 + i, c) for i, c in enumerate(extra)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in special],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                                    "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": ["%s %s" % m for m in merges]},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--merges", type=int, default=200)
    ap.add_argument("--special", action="append", default=[], metavar="TOKEN",
                    help="one more special token after those two (a chat template's), repeatable")
    args = ap.parse_args()
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        doc = tokenizer_json(learn_merges(text, args.merges), args.special)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
    except (OSError, UnicodeDecodeError) as e:
        sys.exit("error: %s" % e)


if __name__ == "__main__":
    main()
