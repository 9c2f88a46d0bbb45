#!/usr/bin/python3
"""Reads back what scripts/tokenize.py wrote, checking the formats on the way (for tests/t_tokenizer*.sh).
  ids SHARD...          the shards' tokens (uint16 or uint32 shards), concatenated, one line of space-separated ids
  sets SHARD...         each shard's set id (header int32 slots 3 and 4, low half first), in hex, one per line
  decode TOKFILE SHARD  the shard's text, decoded with the tokenizer file, raw bytes to stdout"""
import sys

import numpy as np


FORMATS = {20240520: (1, '<u2'), 20240801: (7, '<u4')}   # magic: (version, token type)


def shard_ids(path):
    with open(path, 'rb') as f:
        data = f.read()
    head = np.frombuffer(data[:1024], dtype='<i4')
    version, dtype = FORMATS.get(int(head[0]), (None, None)) if len(head) == 256 else (None, None)
    if version is None or head[1] != version:
        sys.exit(f'{path}: bad shard header {head[:3].tolist()}')
    width = np.dtype(dtype).itemsize
    if len(data) != 1024 + width * int(head[2]):
        sys.exit(f'{path}: header says {head[2]} tokens of {width} bytes, file holds {len(data) - 1024} bytes')
    return np.frombuffer(data[1024:], dtype=dtype)


def decode_table(path):
    with open(path, 'rb') as f:
        data = f.read()
    head = np.frombuffer(data[:1024], dtype='<i4')
    if head[:4].tolist() != [20240328, 2, 50257, 50256]:
        sys.exit(f'{path}: bad tokenizer header {head[:4].tolist()}')
    table, pos = [], 1024
    for _ in range(50257):
        n = data[pos]
        table.append(data[pos + 1:pos + 1 + n])
        pos += 1 + n
    if pos != len(data):
        sys.exit(f'{path}: {len(data) - pos} trailing bytes')
    return table


def main(argv):
    if argv[0] == 'ids':
        print(' '.join(str(i) for p in argv[1:] for i in shard_ids(p).tolist()))
    elif argv[0] == 'sets':
        for p in argv[1:]:
            shard_ids(p)
            with open(p, 'rb') as f:
                print(f'{int.from_bytes(f.read(20)[12:], "little"):016x}')
    elif argv[0] == 'decode':
        table = decode_table(argv[1])
        sys.stdout.buffer.write(b''.join(table[i] for i in shard_ids(argv[2]).tolist()))
    else:
        sys.exit('usage: tokenizer_shards.py ids SHARD... | sets SHARD... | decode TOKFILE SHARD')


if __name__ == '__main__':
    main(sys.argv[1:])
