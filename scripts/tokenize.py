#!/usr/bin/python3
"""Text -> GPT-2 token shards in llm.c's format.

  tokenize.py INPUT... -o OUTDIR [--name NAME] [--shard-size N] [--val-fraction F] [-j N] [--quiet]
  tokenize.py --raw FILE -o OUT.bin

INPUT: text files (one document each), directories (every non-hidden file below, in sorted path order) or
JSONL files (*.jsonl: one document per line, from its "text" field). Every document is preceded by the
end-of-text token 50256. The token stream is cut into shards of --shard-size tokens:
  default          llm.c's convention: the first shard is the validation split (NAME_val_000000.bin),
                   the rest are NAME_train_000001.bin, NAME_train_000002.bin, ...
  --val-fraction F the first round(F * total) tokens are the validation split (cut into shards of
                   --shard-size too), the rest is train; shard numbers continue across both.
A shard: 256 x int32 header [20240520, 1, ntok], then ntok x uint16. OUTDIR also gets gpt2_tokenizer.bin
(the trainer's decoding table: [20240328, 2, 50257, 50256] header, then each token as uint8 length +
bytes) and gpt2_merges.bin (the merges in gpt2tok's compact form, with which the trainer encodes -prompt). The output does not depend on -j.

--raw writes the ids of FILE's bytes as one shard-format file: no end-of-text token, no split.
The text "<|endoftext|>" inside a document is ordinary text; only the separator is 50256.

The encoding itself runs in build/gpt2tok (tokenizer/gpt2tok.c; built here with make when missing or
stale). GPT-2's encoder.json and vocab.bpe come from data/tokenizer/ and are checked against their
sha256 before use.
"""
import os
import sys

# This file's name shadows the standard library's tokenize module (which inspect and linecache import), so
# its directory must not be on the import path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import glob
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from array import array  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKDIR = os.environ.get('GPT2_TOKENIZER_DIR') or os.path.join(ROOT, 'data', 'tokenizer')   # override: tests
HELPER = os.path.join(ROOT, 'build', 'gpt2tok')
SHA256 = {
    'encoder.json': '196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783',
    'vocab.bpe': '1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5',
}
EOT = 50256
VOCAB = 50257
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
MODEL_MAGIC = 20240601   # gpt2tok's compact merges file


class Fail(Exception):
    """A user-facing error: printed as one 'error: ...' line."""


# ---------- GPT-2 vocabulary ----------

def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map that encoder.json's keys are written in."""
    keep = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_checked(name):
    path = os.path.join(TOKDIR, name)
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise Fail(f'{path}: {e.strerror} (the GPT-2 tokenizer files belong in data/tokenizer/)')
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[name]:
        raise Fail(f'{path}: sha256 {digest} does not match the expected {SHA256[name]}')
    return data


def load_vocab():
    """Returns (token bytes by id, merges as (a, b, merged) id triples in rank order)."""
    encoder = json.loads(read_checked('encoder.json').decode('utf-8'))
    lines = read_checked('vocab.bpe').decode('utf-8').split('\n')
    to_latin1 = {ord(c): b for b, c in bytes_to_unicode().items()}   # then latin-1 is the identity on bytes
    tokens = [None] * len(encoder)
    for s, i in encoder.items():
        tokens[i] = s.translate(to_latin1).encode('latin-1') if i != EOT else b'<|endoftext|>'
    merges = []
    for line in lines[1:]:
        if line:
            a, b = line.split(' ')
            merges.append((encoder[a], encoder[b], encoder[a + b]))
    if len(tokens) != VOCAB or any(t is None for t in tokens):
        raise Fail('encoder.json: unexpected vocabulary')
    return tokens, merges


def model_bytes(tokens, merges):
    byte_id = {t[0]: i for i, t in enumerate(tokens[:256])}
    head = struct.pack('<4i', MODEL_MAGIC, 1, len(merges), 0)
    return head + struct.pack('<256I', *(byte_id[b] for b in range(256))) + \
        array('I', (x for m in merges for x in m)).tobytes()


def tokenizer_file_bytes(tokens):
    body = b''.join(bytes([len(t)]) + t for t in tokens)
    return header(TOKENIZER_MAGIC, TOKENIZER_VERSION, VOCAB, EOT) + body


# ---------- safe output ----------

def write_atomic(path, chunks):
    """Writes to a temporary name in the same directory, then renames: never a half file under `path`."""
    tmp = f'{path}.tmp{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException as e:
        remove_quietly(tmp)
        if isinstance(e, OSError):
            raise Fail(f'cannot write {path}: {e.strerror}')
        raise


def remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def header(*fields):
    """llm.c's 256 x int32 file header."""
    return struct.pack('<256i', *fields, *[0] * (256 - len(fields)))


def spool_range(spool, start, end, block=1 << 24):
    """Tokens [start, end) of the spool file as a stream of byte blocks (a shard can be 200 MB)."""
    spool.seek(2 * start)
    left = 2 * (end - start)
    while left:
        data = spool.read(min(block, left))
        if not data:
            raise Fail(f'{spool.name}: spool file shorter than expected')
        left -= len(data)
        yield data


# ---------- inputs ----------

def file_docs(path):
    """Yields ('F', label, path, size) or ('T', label, bytes, size) records for one input path."""
    if path.endswith('.jsonl'):
        yield from jsonl_docs(path)
        return
    size = os.path.getsize(path)
    if size == 0:
        raise Fail(f'{path}: empty file')
    yield 'F', path, path, size


def jsonl_docs(path):
    try:
        f = open(path, 'rb')
    except OSError as e:
        raise Fail(f'{path}: {e.strerror}')
    with f:
        n = 0
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                text = obj['text']
                if not isinstance(text, str):
                    raise TypeError
                data = text.encode('utf-8')
            except (ValueError, KeyError, TypeError):
                raise Fail(f'{path}:{lineno}: not a JSON object with a string "text" field')
            except UnicodeEncodeError:
                raise Fail(f'{path}:{lineno}: text is not valid Unicode (lone surrogate)')
            n += 1
            if data:
                yield 'T', f'{path}:{lineno}', data, len(data)
        if n == 0:
            raise Fail(f'{path}: no documents')


def walk(path):
    if not os.path.isdir(path):
        return [path]
    found = []
    for d, subdirs, files in os.walk(path):
        subdirs[:] = [s for s in subdirs if not s.startswith('.')]
        found += [os.path.join(d, f) for f in files if not f.startswith('.')]
    if not found:
        raise Fail(f'{path}: no files in directory')
    return sorted(found)


def input_files(paths):
    files = []
    for p in paths:
        if not os.path.exists(p):
            raise Fail(f'{p}: no such file or directory')
        files += walk(p)
    for f in files:
        if not os.access(f, os.R_OK):
            raise Fail(f'{f}: not readable')
    return files


# ---------- the helper ----------

def ensure_helper():
    try:
        r = subprocess.run(['make', '-s', '-C', ROOT, 'build/gpt2tok'], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    except FileNotFoundError:   # no make: a helper built earlier will do
        if os.access(HELPER, os.X_OK):
            return
        raise Fail('build/gpt2tok is missing and make is not installed')
    if r.returncode != 0 or not os.access(HELPER, os.X_OK):
        last = r.stdout.decode(errors='replace').strip().splitlines()[-1:] or ['']
        raise Fail(f'could not build build/gpt2tok with make: {last[0]}')


def encode_record(rec):
    kind, label, payload, _ = rec
    lab = label.encode('utf-8', 'surrogateescape')
    out = kind.encode() + struct.pack('<I', len(lab)) + lab
    return out if kind == 'F' else out + struct.pack('<Q', len(payload)) + payload


def feed(proc, records, sizes, errors):
    """Writer thread: sends documents while the main thread reads ids (a pipe both ways would deadlock)."""
    try:
        for rec in records:
            sizes.append(rec[3])
            proc.stdin.write(encode_record(rec))
    except Fail as e:
        errors.append(e)
    except BrokenPipeError:
        pass   # the helper stopped early; its own error is reported
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass


def read_exact(stream, n):
    buf = stream.read(n)
    if len(buf) != n:
        raise EOFError
    return buf


def encode_docs(records, model, threads):
    """Yields (token array, document bytes) per document, in order."""
    ensure_helper()
    with tempfile.NamedTemporaryFile(prefix='gpt2tok-model-') as mf:
        mf.write(model)
        mf.flush()
        cmd = [HELPER, mf.name] + (['-t', str(threads)] if threads else [])
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sizes, errors = [], []
        writer = threading.Thread(target=feed, args=(proc, records, sizes, errors), daemon=True)
        writer.start()
        k, finished = 0, False
        try:
            while True:
                head = proc.stdout.read(8)
                if not head:
                    break
                n = struct.unpack('<Q', head)[0]
                ids = read_exact(proc.stdout, 2 * n)   # uint16, little-endian like every target we build for
                yield ids, sizes[k]
                k += 1
            finished = True
        except EOFError:
            finished = True
        finally:
            if not finished:
                proc.kill()   # the consumer gave up; don't wait on a helper blocked on a full pipe
            writer.join()
            err = proc.stderr.read().decode(errors='replace').strip()
            rc = proc.wait()
        if errors:
            raise errors[0]
        if rc != 0:
            raise Fail(err[len('error: '):] if err.startswith('error: ') else f'build/gpt2tok failed ({rc}): {err}')


# ---------- progress ----------

class Progress:
    def __init__(self, total_bytes, quiet):
        self.total, self.done, self.tokens = total_bytes, 0, 0
        self.quiet, self.tty = quiet, sys.stderr.isatty()
        self.t0 = self.last = time.time()

    def update(self, nbytes, ntok):
        self.done += nbytes
        self.tokens += ntok
        now = time.time()
        if self.tty and not self.quiet and now - self.last > 0.2:
            self.last = now
            self.draw(now, '\r')

    def draw(self, now, end):
        frac = self.done / self.total if self.total else 1.0
        bar = '#' * int(30 * frac)
        mb, dt = self.done / 1e6, max(now - self.t0, 1e-9)
        sys.stderr.write(f'\rtokenizing [{bar:<30}] {100 * frac:5.1f}% {mb:8.1f} MB {mb / dt:7.1f} MB/s '
                         f'{self.tokens / 1e6:8.2f}M tokens{end}')
        sys.stderr.flush()

    def finish(self):
        if not self.quiet:
            self.draw(time.time(), '\n')


# ---------- modes ----------

def cmd_raw(args, model):
    if not os.path.isfile(args.raw):
        raise Fail(f'{args.raw}: no such file')
    size = os.path.getsize(args.raw)
    if size == 0:
        raise Fail(f'{args.raw}: empty file')
    recs = [('F', args.raw, args.raw, size)]   # a .jsonl name is plain text here: raw means bytes as they are
    ids = b''.join(t for t, _ in encode_docs(iter(recs), model, args.threads))
    write_atomic(args.out, [header(SHARD_MAGIC, SHARD_VERSION, len(ids) // 2), ids])


def spool_tokens(files, model, args, spool):
    records = (r for f in files for r in file_docs(f))
    prog = Progress(sum(os.path.getsize(f) for f in files), args.quiet)
    eot = struct.pack('<H', EOT)
    for ids, nbytes in encode_docs(records, model, args.threads):
        spool.write(eot)
        spool.write(ids)
        prog.update(nbytes, len(ids) // 2 + 1)
    spool.flush()
    return prog


def plan_shards(total, shard_size, val_fraction):
    """[(split, start, end)] over the token stream."""
    nval = round(val_fraction * total) if val_fraction is not None else min(shard_size, total)
    if nval < 1 or nval >= total:
        raise Fail(f'{total} tokens cannot be split into validation ({nval}) and train; '
                   'use a smaller --shard-size or a --val-fraction')
    plan = [('val', s, min(s + shard_size, nval)) for s in range(0, nval, shard_size)]
    return plan + [('train', s, min(s + shard_size, total)) for s in range(nval, total, shard_size)]


def write_shards(spool, plan, outdir, name):
    finals = []
    try:
        for i, (split, s, e) in enumerate(plan):
            path = os.path.join(outdir, f'{name}_{split}_{i:06d}.bin')
            finals.append(path)
            write_atomic(path + '.new', [header(SHARD_MAGIC, SHARD_VERSION, e - s), *spool_range(spool, s, e)])
    except BaseException:
        for p in finals:
            remove_quietly(p + '.new')
        raise
    # Old shards of this name go only once every new one is complete, so a stale set never mixes in.
    # Only NAME_{val,train}_<6 digits>.bin: a dataset named NAME_train beside it has its own shards.
    ours = re.compile(re.escape(name) + r'_(val|train)_[0-9]{6}\.bin')
    for old in glob.glob(os.path.join(outdir, f'{glob.escape(name)}_*.bin')):
        if ours.fullmatch(os.path.basename(old)) and old not in finals:
            os.unlink(old)
    for p in finals:
        os.replace(p + '.new', p)
    return finals


def cmd_shards(args, tokens, model):
    files = input_files(args.inputs)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise Fail(f'cannot create {args.out}: {e.strerror}')
    if not os.access(args.out, os.W_OK):
        raise Fail(f'cannot write to {args.out}: permission denied')
    write_atomic(os.path.join(args.out, 'gpt2_tokenizer.bin'), [tokenizer_file_bytes(tokens)])
    write_atomic(os.path.join(args.out, 'gpt2_merges.bin'), [model])   # the trainer's -prompt encodes with it
    try:
        with tempfile.NamedTemporaryFile(dir=args.out, prefix=f'.{args.name}-spool-') as spool:
            prog = spool_tokens(files, model, args, spool)
            total = prog.tokens
            plan = plan_shards(total, args.shard_size, args.val_fraction)
            prog.finish()
            finals = write_shards(spool, plan, args.out, args.name)
    except OSError as e:   # the spool or a shard (a full disk, a file-size limit): no new shard was renamed in
        raise Fail(f'cannot write in {args.out}: {e.strerror}')
    if not args.quiet:
        nval = sum(e - s for split, s, e in plan if split == 'val')
        sys.stderr.write(f'{total} tokens: {nval} val, {total - nval} train, {len(finals)} shards in {args.out}\n')


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument('inputs', nargs='*', help='text files, directories or .jsonl files')
    p.add_argument('--raw', metavar='FILE', help='exact mode: ids of FILE as one document, no EOT, no split')
    p.add_argument('-o', '--out', required=True, help='output directory (or file with --raw)')
    p.add_argument('--name', default='data', help='shard name prefix (default: data)')
    p.add_argument('--shard-size', type=int, default=100_000_000, help='tokens per shard (default 1e8)')
    p.add_argument('--val-fraction', type=float, help='fraction of tokens for validation (default: first shard)')
    p.add_argument('-j', '--threads', type=int, default=0, help='threads (default: all cores)')
    p.add_argument('-q', '--quiet', action='store_true')
    a = p.parse_args(argv)
    if bool(a.raw) == bool(a.inputs):
        raise Fail('give either INPUT... or --raw FILE')
    if not 0 < a.shard_size < 2 ** 31:
        raise Fail('--shard-size must be between 1 and 2^31-1')
    if a.val_fraction is not None and not 0 < a.val_fraction < 1:
        raise Fail('--val-fraction must be between 0 and 1')
    if not a.name or '/' in a.name or a.name.startswith('.'):
        raise Fail(f'--name {a.name!r} must be a plain file-name prefix (no "/", not hidden)')
    if not 0 <= a.threads <= 1024:
        raise Fail('-j must be between 0 (all cores) and 1024')
    return a


def main(argv):
    try:
        if sys.byteorder != 'little':
            raise Fail('only little-endian machines are supported (shards are little-endian uint16)')
        args = parse_args(argv)
        tokens, merges = load_vocab()
        model = model_bytes(tokens, merges)
        if args.raw:
            cmd_raw(args, model)
        else:
            cmd_shards(args, tokens, model)
    except Fail as e:
        sys.stderr.write(f'error: {e}\n')
        return 1
    except KeyboardInterrupt:
        sys.stderr.write('error: interrupted\n')
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
