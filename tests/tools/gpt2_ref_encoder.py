#!/usr/bin/python3
"""A third opinion for tests/tools/gen_tokenizer_expected.sh: GPT-2's original algorithm (the pattern run by
the `regex` module, as in OpenAI's encoder.py, then merge-all-occurrences BPE), written from its
description. Needs Debian's python3-regex; only the regeneration script uses it.
usage: gpt2_ref_encoder.py EXPECTED.json  -> prints the cases where it disagrees with the stored ids."""
import json
import os
import sys

import regex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_chars():
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    extra = iter(range(256, 512))
    return {b: chr(b if b in printable else next(extra)) for b in range(256)}


def bpe(word, ranks):
    parts = list(word)
    while len(parts) > 1:
        pairs = {(a, b) for a, b in zip(parts, parts[1:])}
        best = min(pairs, key=lambda p: ranks.get(p, float('inf')))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def main():
    tokdir = os.path.join(ROOT, 'data', 'tokenizer')
    with open(os.path.join(tokdir, 'encoder.json'), encoding='utf-8') as f:
        encoder = json.load(f)
    with open(os.path.join(tokdir, 'vocab.bpe'), encoding='utf-8') as f:
        merges = [tuple(line.split(' ')) for line in f.read().split('\n')[1:] if line]
    ranks = {m: i for i, m in enumerate(merges)}
    bc = byte_chars()
    with open(sys.argv[1], encoding='utf-8') as f:
        cases = json.load(f)
    bad = 0
    for c in cases:
        ids = [encoder[t] for piece in PAT.findall(c['text'])
               for t in bpe(''.join(bc[b] for b in piece.encode('utf-8')), ranks)]
        if ids != c['ids']:
            bad += 1
            print(f'python regex reference disagrees on {c["name"]}')
    print(f'python regex reference: {len(cases) - bad}/{len(cases)} cases agree')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
