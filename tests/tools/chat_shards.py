"""The documents of a tokenize.py --chat output, checked against the formats (docs/formats.md), as JSON lines.

  chat_shards.py OUTDIR [NAME]    one line per document, in shard number order (val's shards, then train's):
                                  {"split": "val"|"train", "ids": [...], "mask": [...]}
  chat_shards.py --runs TOKENIZER.json OUTDIR [NAME]
                                  one line per document: its runs of TRAINED tokens as text, each with the
                                  token before it: [["before", "run"], ...], decoded here from TOKENIZER.json
Exits 1 with one line naming the file on a format error: a header that is not a shard's or a mask's, a mask
whose ntok or set id differs from its shard's, set ids that differ across the set, a shard without its mask, a
shard not starting with DOC_START, a document whose first token is TRAINED, a mask byte with other bits set.
"""
import glob
import json
import os
import re
import struct
import sys

SHARD = {(20240520, 1): 2, (20240801, 7): 4}
MASK = (20261129, 1)
TRAINED, DOC_START = 1, 2


def fail(msg):
    sys.stderr.write(f'error: {msg}\n')
    sys.exit(1)


def read(path):
    with open(path, 'rb') as f:
        data = f.read()
    magic, version, ntok, set_id = struct.unpack_from('<3iQ', data)
    return (magic, version), ntok, set_id, data[1024:]


def documents(shard):
    head, ntok, set_id, body = read(shard)
    width = SHARD.get(head) or fail(f'{shard}: not a shard header {head}')
    ids = list(struct.unpack(f'<{ntok}{"H" if width == 2 else "I"}', body))
    mhead, mntok, mset, mask = read(shard[:-len('.bin')] + '.mask')
    if mhead != MASK or mntok != ntok or mset != set_id or len(mask) != ntok:
        fail(f'{shard}: its mask has header {mhead}, ntok {mntok}, set id {mset}, {len(mask)} bytes; '
             f'the shard: ntok {ntok}, set id {set_id}')
    if any(b & ~(TRAINED | DOC_START) for b in mask) or not mask[0] & DOC_START:
        fail(f'{shard}: a mask byte with other bits, or no DOC_START on the first token')
    starts = [i for i, b in enumerate(mask) if b & DOC_START] + [ntok]
    for a, b in zip(starts, starts[1:]):
        if mask[a] & TRAINED:
            fail(f'{shard}: the document at token {a} has its first token TRAINED')
        yield set_id, ids[a:b], list(mask[a:b])


def decoder(path):
    """id -> bytes, from a byte-level tokenizer.json (its own reading, not scripts/chat_data.py's)."""
    with open(path, encoding='utf-8') as f:
        tok = json.load(f)
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    byte_of = {chr(b): b for b in printable}
    byte_of.update({chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in printable)})
    table = {i: bytes(byte_of[c] for c in s) for s, i in tok['model']['vocab'].items()}
    table.update({t['id']: t['content'].encode() for t in tok['added_tokens']})
    return lambda ids: b''.join(table[i] for i in ids).decode('utf-8', errors='replace')


def runs(decode, ids, mask):
    found, k = [], 0
    while k < len(ids):
        if mask[k] & TRAINED:
            end = k
            while end < len(ids) and mask[end] & TRAINED:
                end += 1
            found.append([decode(ids[k - 1:k]), decode(ids[k:end])])
            k = end
        k += 1
    return found


def main(outdir, name='data', decode=None):
    number = lambda path: int(re.search(r'_([0-9]+)\.bin$', path).group(1))   # noqa: E731
    shards = sorted(glob.glob(os.path.join(outdir, f'{name}_*.bin')), key=number)   # val's numbers come first
    if not shards:
        fail(f'{outdir}: no shards of {name}')
    sets = set()
    for shard in shards:
        split = re.search(r'_(val|train)_[0-9]+\.bin$', shard).group(1)
        for set_id, ids, mask in documents(shard):
            sets.add(set_id)
            line = {'split': split, 'ids': ids, 'mask': mask} if decode is None else runs(decode, ids, mask)
            print(json.dumps(line, ensure_ascii=False))
    if len(sets) != 1 or 0 in sets:
        fail(f'{outdir}: set ids {sorted(sets)}: not one set')


if __name__ == '__main__':
    if sys.argv[1:2] == ['--runs']:
        main(*sys.argv[3:], decode=decoder(sys.argv[2]))
    else:
        main(*sys.argv[1:])
