#!/usr/bin/python3
"""tokenizer.json files for tests/system/t_tokenizer_hf.sh, and an independent decoder to check ours with.

  hf_tokenizer_files.py gpt2 DIR OUT [--pairs]   GPT-2's tokenizer.json, as Hugging Face publishes it, from
                                                 DIR/encoder.json and DIR/vocab.bpe (--pairs: merges as
                                                 ["a", "b"] pairs, not "a b" strings)
  hf_tokenizer_files.py tiny OUT                 a byte-level BPE of 256 bytes, three merges and <|endoftext|>
  hf_tokenizer_files.py edit IN OUT [--pairs] [--regex NAME] [KEY.PATH=JSON | KEY.PATH=DELETE ...]
                                                 IN with changes: merges as pairs; the Split regex replaced by
                                                 gpt2's, llama3's or qwen2's; values set (a path's numbers
                                                 index lists; "+" appends) or removed
  hf_tokenizer_files.py id FILE CONTENT          the id FILE gives CONTENT: an added token's, else the vocab's
  hf_tokenizer_files.py decode FILE IDS.u32      the bytes of uint32 ids, on stdout
"""
import json
import struct
import sys

REGEX = {
    'gpt2': r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    'llama3': r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    'qwen2': r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
BYTE_LEVEL = {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': True}


def bytes_to_unicode():
    """GPT-2's map from bytes to the printable characters its vocabulary is written in."""
    keep = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        table[b] = chr(b) if b in keep else chr(256 + extra)
        extra += b not in keep
    return table


def added(i, content):
    return {'id': i, 'content': content, 'single_word': False, 'lstrip': False, 'rstrip': False,
            'normalized': True, 'special': True}


def tokenizer(vocab, merges, added_tokens):
    return {'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added_tokens, 'normalizer': None,
            'pre_tokenizer': dict(BYTE_LEVEL), 'post_processor': dict(BYTE_LEVEL, trim_offsets=False),
            'decoder': dict(BYTE_LEVEL), 'model': {
                'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': '',
                'end_of_word_suffix': '', 'fuse_unk': False, 'byte_fallback': False, 'vocab': vocab, 'merges': merges}}


def gpt2(src):
    vocab = json.load(open(f'{src}/encoder.json', encoding='utf-8'))
    merges = [m for m in open(f'{src}/vocab.bpe', encoding='utf-8').read().split('\n')[1:] if m]
    return tokenizer(vocab, merges, [added(vocab['<|endoftext|>'], '<|endoftext|>')])


def tiny():
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    merges = ['Ġ t', 'h e', 'Ġt he']
    for m in merges:
        vocab[m.replace(' ', '')] = len(vocab)
    return tokenizer(vocab, merges, [added(len(vocab), '<|endoftext|>')])


def set_path(doc, path, value):
    keys = path.split('.')
    for k in keys[:-1]:
        doc = doc[int(k)] if isinstance(doc, list) else doc[k]
    last = keys[-1]
    if isinstance(doc, list):
        if last == '+':
            doc.append(value)
        elif value is DELETE:
            del doc[int(last)]
        else:
            doc[int(last)] = value
    elif value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()


def edit(doc, args):
    while args:
        a = args.pop(0)
        if a == '--pairs':
            doc['model']['merges'] = [m.split(' ') for m in doc['model']['merges']]
        elif a == '--regex':
            name = args.pop(0)
            if doc['pre_tokenizer']['type'] == 'ByteLevel':
                doc['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
                    {'type': 'Split', 'pattern': {'Regex': ''}, 'behavior': 'Isolated', 'invert': False},
                    dict(BYTE_LEVEL, use_regex=False)]}
            doc['pre_tokenizer']['pretokenizers'][0]['pattern']['Regex'] = REGEX[name]
        else:
            path, value = a.split('=', 1)
            set_path(doc, path, DELETE if value == 'DELETE' else json.loads(value))
    return doc


def token_bytes(doc):
    """id -> bytes, read here from the JSON: the vocab's keys mapped back to bytes, added tokens as they are."""
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    table = {i: bytes(to_byte[c] for c in t) for t, i in doc['model']['vocab'].items()}
    table.update({a['id']: a['content'].encode('utf-8') for a in doc['added_tokens']})
    return table


def main(argv):
    cmd = argv[0]
    if cmd == 'gpt2':
        doc = edit(gpt2(argv[1]), argv[3:])
    elif cmd == 'tiny':
        doc = tiny()
    elif cmd == 'edit':
        doc = edit(json.load(open(argv[1], encoding='utf-8')), argv[3:])
    elif cmd == 'id':
        doc = json.load(open(argv[1], encoding='utf-8'))
        ids = [a['id'] for a in doc['added_tokens'] if a['content'] == argv[2]]
        print(ids[0] if ids else doc['model']['vocab'][argv[2]])
        return
    elif cmd == 'decode':
        table = token_bytes(json.load(open(argv[1], encoding='utf-8')))
        data = open(argv[2], 'rb').read()
        sys.stdout.buffer.write(b''.join(table[i] for i in struct.unpack(f'<{len(data) // 4}I', data)))
        return
    else:
        sys.exit(__doc__)
    out = argv[2] if cmd != 'tiny' else argv[1]
    with open(out, 'w', encoding='utf-8') as f:   # GPT-2's with \u escapes, the others in raw UTF-8: both kinds
        json.dump(doc, f, ensure_ascii=cmd == 'gpt2', indent=1)


if __name__ == '__main__':
    main(sys.argv[1:])
