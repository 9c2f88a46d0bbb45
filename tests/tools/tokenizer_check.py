#!/usr/bin/python3
"""Checks build/tokenizer's ids against tests/data/tokenizer_expected.json (made by tiktoken, see
tests/tools/gen_tokenizer_expected.sh), all cases through one helper run. Prints "ok NAME" / "FAIL NAME: why".

  tokenizer_check.py                  with GPT-2's files in data/tokenizer/, as scripts/tokenize.py uses them
  tokenizer_check.py TOKENIZER.json   with GPT-2's tokenizer.json: the cases whose text holds <|endoftext|> are
                                      left out, since a tokenizer.json's added token is split out of the text"""
import importlib.util
from array import array
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tokenize():
    """scripts/tokenize.py under another name: as "tokenize" it would replace the standard module."""
    spec = importlib.util.spec_from_file_location('gpt2_tokenize', os.path.join(ROOT, 'scripts', 'tokenize.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tok = load_tokenize()


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    with open(os.path.join(ROOT, 'tests', 'data', 'tokenizer_expected.json'), encoding='utf-8') as f:
        cases = json.load(f)
    json_file = sys.argv[1] if len(sys.argv) > 1 else None
    if json_file:
        cases = [c for c in cases if '<|endoftext|>' not in c['text']]
    records = [('T', c['name'], c['text'].encode('utf-8'), 0) for c in cases]
    with tempfile.NamedTemporaryFile(prefix='tokenizer-model-') as model_file:
        gpt2 = tok.hf_tokenizer(json_file) if json_file else tok.gpt2_tokenizer(model_file)
        got = [array('H', ids).tolist() for ids, _ in tok.encode_docs(iter(records), gpt2, 2)]
    failed = 0
    for c, ids in zip(cases, got):
        name = ('tokenizer_json_ids_' if json_file else 'tokenizer_ids_') + c['name']
        if ids == c['ids']:
            print('ok', name)
            continue
        failed = 1
        i = first_diff(ids, c['ids'])
        print(f'FAIL {name}: differs at token {i}: got {ids[i:i + 5]} expected {c["ids"][i:i + 5]}')
    if len(got) != len(cases):
        print(f'FAIL tokenizer_ids: {len(got)} results for {len(cases)} cases')
        failed = 1
    return failed


if __name__ == '__main__':
    sys.exit(main())
