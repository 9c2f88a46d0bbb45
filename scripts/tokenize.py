#!/usr/bin/python3
"""Text -> token shards in llm.c's format, with GPT-2's tokenizer or a Hugging Face tokenizer.json.

  tokenize.py INPUT... -o OUTDIR [--tokenizer FILE] [--name NAME] [--shard-size N] [--val-fraction F]
              [--token-bits B] [-j N] [--quiet]
  tokenize.py --raw FILE -o OUT.bin [--tokenizer FILE] [--token-bits B]
  tokenize.py --chat FILE.jsonl --tokenizer FILE -o OUTDIR [--chat-template FILE]
              [--train-on assistant|last-assistant|all] [--train-empty-think] [--val-fraction F] [...]

INPUT: text files (one document each), directories (every non-hidden file below, in sorted path order) or
JSONL files (*.jsonl: one document per line, from its "text" field). Every document is preceded by the
tokenizer's document-start token: GPT-2's end-of-text token 50256, or with --tokenizer the token its file
names (the BOS its post_processor puts before a text, such as Llama 3's <|begin_of_text|>; else an added
<|begin_of_text|>; else an added <|endoftext|>, as GPT-2 and Qwen2 separate documents; build/tokenizer FILE
--info prints it). The token stream is cut into shards of --shard-size tokens:
  default          llm.c's convention: the first shard is the validation split (NAME_val_000000.bin),
                   the rest are NAME_train_000001.bin, NAME_train_000002.bin, ...
  --val-fraction F the first round(F * total) tokens are the validation split (cut into shards of
                   --shard-size too), the rest is train; shard numbers continue across both.
A shard: 256 x int32 header [20240520, 1, ntok, set_lo, set_hi], then ntok x uint16; with --token-bits 32
(the default only for a vocabulary past 65,536 tokens, such as Llama 3's) llm.c's 32-bit format [20240801,
7, ntok, set_lo, set_hi], then ntok x uint32; both little-endian. (set_hi << 32 | set_lo) is the shard's set
id, 64 random bits shared by the shards of one run and by no other run; llm.c's readers ignore those slots,
and 0 there marks a shard of no known set (llm.c's own). OUTDIR also gets what the trainer decodes samples
and encodes -prompt with: for GPT-2, gpt2_tokenizer.bin (the decoding table: [20240328, 2, 50257, 50256]
header, then each token as uint8 length + bytes) and gpt2_merges.bin (the merges in the compact merges form);
with --tokenizer, a copy of FILE (a regular file, as every input is) as tokenizer.json. An OUTDIR that holds
the other kind, or another tokenizer.json, is refused: its shards were encoded with that one. The output does
not depend on -j, but for the set id.

One run at a time per OUTDIR: a run holds OUTDIR/.tokenize.lock, and another run into OUTDIR stops at once.
The new shards (and masks) are written into a private directory OUTDIR/.tokenize-PID, then renamed over the
old set of NAME, whose other shards and mask files are then deleted. SIGINT, SIGTERM, SIGHUP and SIGQUIT wait
until that switch is done, so a run they stop leaves the old set or the new one. A SIGKILL or a power loss
can stop it all the same, so before its first rename the run writes (and fsyncs) OUTDIR/.tokenize-PID/SWITCHING, whose one
line is NAME, and it removes that marker only once the switch is complete and OUTDIR synced. The trainer
refuses every glob of shards in a directory that holds such a marker (and, by the set ids, a mix of two
sets under one NAME): run tokenize.py again. The next run into OUTDIR removes the private directories that
killed runs left, but for their markers: a marker stays until a run of its NAME (any run, for a marker that
names none) has switched in a whole set. A private directory without a marker (a run stopped before its
switch) does not keep the trainer off the old set.

--chat reads conversations, one {"messages": [{"role": ..., "content": ...}, ...]} per line, and renders each
with the tokenizer's chat template (the tokenizer_config.json beside --tokenizer, or --chat-template FILE) as
Hugging Face's apply_chat_template does, into one document with no document-start token added (the template
writes any BOS). Beside each shard X.bin goes X.mask: a 256 x int32 header [20261129, 1, ntok, set_lo, set_hi],
then one byte per token, bit 0 TRAINED (its prediction is trained: by default the assistant turns' tokens and
the special token that closes each, not their headers; --train-on last-assistant or all), bit 1 DOC_START (it
begins a conversation). Qwen3's empty think block is not trained unless --train-empty-think. A conversation
without a trained token is left out, with a line naming it. --val-fraction F: the first round(F * n)
conversations are the validation split (default 0: none); a shard holds whole conversations. OUTDIR also gets
chat_format.json, the template as plain pieces for the trainer's -chat (when the pieces reproduce it).
docs/formats.md says it all (scripts/chat_template.py renders, scripts/chat_data.py masks, scripts/chat_format.py
derives the pieces).

--raw writes the ids of FILE's bytes as one shard-format file (a set of its own: several in one directory
train together): no document-start token, no split.
With GPT-2's tokenizer the text "<|endoftext|>" inside a document is ordinary text; only the separator is
50256. A tokenizer.json's added tokens (Llama 3's <|begin_of_text|>, ...) inside a document become their ids,
as Hugging Face tokenizers encodes them.

The encoding itself runs in build/tokenizer (core/tokenizer/tokenizer_tool.c; built here with make when missing or
stale), which also reads the tokenizer.json and refuses, in one line, one it would not encode as Hugging
Face tokenizers does (core/tokenizer/tokenizer_json.c). GPT-2's encoder.json and vocab.bpe come from
data/tokenizer/ and are checked against their sha256 before use.
"""
import os
import sys

# This file's name shadows the standard library's tokenize module (which inspect and linecache import), so
# its directory must not be on the import path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import collections  # noqa: E402
import errno  # noqa: E402
import fcntl  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from array import array  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKDIR = os.environ.get('GPT2_TOKENIZER_DIR') or os.path.join(ROOT, 'data', 'tokenizer')   # override: tests
HELPER = os.path.join(ROOT, 'build', 'tokenizer')
SHA256 = {
    'encoder.json': '196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783',
    'vocab.bpe': '1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5',
}
EOT = 50256
VOCAB = 50257
SHARD_FORMATS = {16: (20240520, 1), 32: (20240801, 7)}   # token bits: (magic, version)
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
MODEL_MAGIC = 20240601   # the tokenizer tool's compact merges file
LOCK = '.tokenize.lock'
STAGING = re.compile(r'\.tokenize-[0-9]+(-[0-9]+)?')   # a run's private directory, .tokenize-PID[-N]
MARKER = 'SWITCHING'   # in it while its switch is under way: the trainer refuses OUTDIR then
HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}   # they wait for the switch


class Fail(Exception):
    """A user-facing error: printed as one 'error: ...' line."""


class Interrupted(BaseException):
    """A HELD signal arrived. A BaseException, like KeyboardInterrupt, so `except Exception` lets it pass."""
    def __init__(self, signum):
        super().__init__(signum)
        self.signum, self.note = signum, ''


def on_signal(signum, frame):
    raise Interrupted(signum)


def catch_signals():
    """Every HELD signal unwinds the stack (so cleanup runs) instead of ending the process where it is."""
    for s in HELD:
        if signal.getsignal(s) != signal.SIG_IGN:   # one ignored at launch (nohup) stays ignored
            signal.signal(s, on_signal)


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


class Tokenizer:
    """What a run encodes with: `model`, the file build/tokenizer reads; the vocabulary size; the token before
    each document; the bytes per id the helper writes (2 while they fit); the files the trainer needs beside
    the shards ({name: bytes}) and those of the other kind, which must not be there."""
    def __init__(self, model, vocab, doc_start, files, others):
        self.model, self.vocab, self.doc_start, self.files, self.others = model, vocab, doc_start, files, others
        self.width = 2 if vocab <= 1 << 16 else 4


GPT2_FILES = ('gpt2_tokenizer.bin', 'gpt2_merges.bin')


def gpt2_tokenizer(model_file):
    tokens, merges = load_vocab()
    model = model_bytes(tokens, merges)
    model_file.write(model)
    model_file.flush()
    files = {'gpt2_tokenizer.bin': tokenizer_file_bytes(tokens), 'gpt2_merges.bin': model}
    return Tokenizer(model_file.name, VOCAB, EOT, files, ('tokenizer.json',))


def read_regular(path):
    """The bytes of the regular file at path. Opened without waiting, so that a FIFO is refused rather than waited
    on; a device such as /dev/zero, read to its end, would never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise Fail(f'{path}: not a regular file ({kind_of(mode)})')
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, 'rb') as f:
            return f.read()
    except OSError as e:
        raise Fail(f'{path}: {e.strerror}')


def hf_tokenizer(path):
    """A tokenizer.json, as build/tokenizer reads it: it refuses what it would not encode as Hugging Face does."""
    data = read_regular(path)
    ensure_helper()
    r = subprocess.run([HELPER, path, '--info'], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    info = dict(line.split(' ', 1) for line in r.stdout.decode().splitlines() if ' ' in line)
    if r.returncode != 0 or not {'vocab_size', 'doc_start'} <= info.keys():
        err = r.stderr.decode(errors='replace').strip()
        raise Fail(err[len('error: '):] if err.startswith('error: ') else f'build/tokenizer {path} --info failed: {err}')
    return Tokenizer(path, int(info['vocab_size']), int(info['doc_start']), {'tokenizer.json': data}, GPT2_FILES)


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


def shard_header(ntok, set_id, bits):
    """The set id goes in int32 slots 3 and 4, low half first: as one little-endian uint64 at byte 12."""
    return struct.pack('<3iQ', *SHARD_FORMATS[bits], ntok, set_id) + bytes(4 * 256 - 20)


def shard_body(ids, bits, width):
    """The shard bytes of `ids`, little-endian ids of `width` bytes as the helper writes them: as they are, or
    uint16s widened to uint32s by two zero bytes (slice copies, no per-token Python work)."""
    if bits == 8 * width:
        return ids
    wide = bytearray(2 * len(ids))
    wide[0::4] = ids[0::2]
    wide[1::4] = ids[1::2]
    return wide


def new_set_id():
    """64 random bits, never 0 (which marks a shard of no known set)."""
    while True:
        n = int.from_bytes(os.urandom(8), 'little')
        if n:
            return n


def spool_range(spool, start, end, width, block=1 << 24):
    """Tokens [start, end) of the spool file, `width` bytes each, as a stream of byte blocks (a shard can be
    200 MB)."""
    spool.seek(width * start)
    left = width * (end - start)
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
            # The two Unicode errors first: they are ValueErrors too. JSON's "\ud800" escape decodes to a lone
            # surrogate, which no UTF-8 text can hold.
            except UnicodeEncodeError as e:
                raise Fail(f'{path}:{lineno}: the text holds a lone surrogate U+{ord(e.object[e.start]):04X} '
                           f'(character {e.start}), which is not valid Unicode')
            except UnicodeDecodeError as e:
                raise Fail(f'{path}:{lineno}: not valid UTF-8 at byte {e.start} of the line')
            except (ValueError, KeyError, TypeError):
                raise Fail(f'{path}:{lineno}: not a JSON object with a string "text" field')
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


NOT_REGULAR = ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a FIFO'), (stat.S_ISCHR, 'a character device'),
               (stat.S_ISBLK, 'a block device'), (stat.S_ISSOCK, 'a socket'))


def kind_of(mode):
    return next((kind for test, kind in NOT_REGULAR if test(mode)), 'of an unknown kind')


def check_regular(path):
    """A FIFO or a device has no size to plan with, and reading one can block or never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise Fail(f'{path}: no such file or directory')
    except OSError as e:
        raise Fail(f'{path}: {e.strerror}')
    if not stat.S_ISREG(mode):
        raise Fail(f'{path}: not a regular file ({kind_of(mode)})')
    if not os.access(path, os.R_OK):
        raise Fail(f'{path}: not readable')


def input_files(paths):
    files = []
    for p in paths:
        if not os.path.exists(p):
            raise Fail(f'{p}: no such file or directory')
        files += walk(p)
    for f in files:
        check_regular(f)
    return files


# ---------- the helper ----------

def ensure_helper():
    try:
        r = subprocess.run(['make', '-s', '-C', ROOT, 'build/tokenizer'], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    except FileNotFoundError:   # no make: a helper built earlier will do
        if os.access(HELPER, os.X_OK):
            return
        raise Fail('build/tokenizer is missing and make is not installed')
    if r.returncode != 0 or not os.access(HELPER, os.X_OK):
        last = r.stdout.decode(errors='replace').strip().splitlines()[-1:] or ['']
        raise Fail(f'could not build build/tokenizer with make: {last[0]}')


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
    except BrokenPipeError:
        pass   # the helper stopped early; its own error is reported
    except Exception as e:   # raised again in the main thread: a thread's exception would only end the input early
        errors.append(e)
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


def encode_docs(records, tok, threads):
    """Yields (token ids as bytes, tok.width each; document bytes) per document, in order."""
    ensure_helper()
    cmd = [HELPER, tok.model, '-w', str(tok.width)] + (['-t', str(threads)] if threads else [])
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
            ids = read_exact(proc.stdout, tok.width * n)   # little-endian like every target we build for
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
        raise Fail(err[len('error: '):] if err.startswith('error: ') else f'build/tokenizer failed ({rc}): {err}')


def encode_texts(texts, tokenizer=None, threads=0):
    """Each of `texts` (UTF-8 bytes) as a list of token ids, encoded as a document of the shards is (without the
    document start before it), and the vocabulary size: GPT-2's tokenizer, or `tokenizer`, a tokenizer.json path."""
    with tempfile.NamedTemporaryFile(prefix='tokenizer-model-') as model_file:
        tok = hf_tokenizer(tokenizer) if tokenizer else gpt2_tokenizer(model_file)
        records = (('T', f'text {i}', t, len(t)) for i, t in enumerate(texts))
        code = 'H' if tok.width == 2 else 'I'
        if array(code).itemsize != tok.width:
            raise Fail(f'this Python\'s array type {code!r} is not {tok.width} bytes wide')
        return [list(array(code, ids)) for ids, _ in encode_docs(records, tok, threads)], tok.vocab


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

def cmd_raw(args, tok):
    check_regular(args.raw)
    size = os.path.getsize(args.raw)
    if size == 0:
        raise Fail(f'{args.raw}: empty file')
    recs = [('F', args.raw, args.raw, size)]   # a .jsonl name is plain text here: raw means bytes as they are
    ids = b''.join(t for t, _ in encode_docs(iter(recs), tok, args.threads))
    bits = args.token_bits
    write_atomic(args.out, [shard_header(len(ids) // tok.width, new_set_id(), bits), shard_body(ids, bits, tok.width)])


def spool_tokens(files, tok, args, spool):
    records = (r for f in files for r in file_docs(f))
    prog = Progress(sum(os.path.getsize(f) for f in files), args.quiet)
    start = struct.pack('<H' if tok.width == 2 else '<I', tok.doc_start)
    for ids, nbytes in encode_docs(records, tok, args.threads):
        spool.write(start)
        spool.write(ids)
        prog.update(nbytes, len(ids) // tok.width + 1)
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


def write_shards(spool, plan, staging, args, set_id, width):
    """Writes the new set into the run's private directory; returns the shards' names in stream order."""
    names = []
    for i, (split, s, e) in enumerate(plan):
        names.append(f'{args.name}_{split}_{i:06d}.bin')
        with open(os.path.join(staging, names[-1]), 'wb') as f:
            f.write(shard_header(e - s, set_id, args.token_bits))
            for block in spool_range(spool, s, e, width):
                f.write(shard_body(block, args.token_bits, width))
    return names


def shard_names(outdir, name):
    """The names of NAME's shards and mask files in OUTDIR. Only NAME_{val,train}_<digits>.{bin,mask}: a dataset
    named NAME_train beside it has its own shards."""
    ours = re.compile(re.escape(name) + r'_(val|train)_[0-9]{6,}\.(bin|mask)')
    return {e.name for e in os.scandir(outdir) if ours.fullmatch(e.name)}


def move_in(staging, outdir, name, names):
    """Renames the new shards in, then deletes the old ones left over. The marker says that this is under way;
    the order makes a mix of both sets show by its set ids as well: first the names the old set lacks, then
    those it has (each replacing an old shard), then the deletions. (A first run into OUTDIR, or a new val
    split beside the old train split, shows by the marker alone.)"""
    old = shard_names(outdir, name)
    try:
        for n in sorted(names, key=lambda n: n in old):   # stable: stream order within each part
            os.replace(os.path.join(staging, n), os.path.join(outdir, n))
        for n in sorted(old - set(names)):
            os.unlink(os.path.join(outdir, n))
    except OSError as e:
        raise Fail(f'cannot replace the shards in {outdir}: {e.filename}: {e.strerror}; the directory may now '
                   f'hold a part of the new set, which the trainer refuses while {os.path.join(staging, MARKER)} '
                   'is there: run tokenize.py again')


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_switch(staging, outdir, name):
    """Writes the marker, with NAME in it, and makes it durable before the first rename: a run that a SIGKILL
    or a power loss stops during the switch leaves it behind, and the trainer refuses OUTDIR while it is there."""
    path = os.path.join(staging, MARKER)
    try:
        with open(path, 'wb') as f:
            f.write(os.fsencode(name) + b'\n')
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(staging)
        fsync_dir(outdir)   # the staging directory's own entry
    except OSError as e:
        remove_quietly(path)
        raise Fail(f'cannot write {path}: {e.strerror}; the shards in {outdir} were left as they were')


def unmark_switch(staging, outdir, name, kept):
    """The switch is complete: once the renames and deletions are durable, the marker goes, and so do the markers
    of earlier runs of NAME (or of none) that a SIGKILL stopped during their switch: this set replaced what
    they left."""
    marker = os.path.join(staging, MARKER)
    try:
        fsync_dir(outdir)
        os.unlink(marker)
    except OSError as e:
        raise Fail(f'cannot finish the switch in {outdir}: {e.filename}: {e.strerror}; it holds the new set, but '
                   f'the trainer refuses it while {marker} is there: run tokenize.py again')
    for path, marked in kept.items():
        if marked in (name, ''):
            shutil.rmtree(path, ignore_errors=True)


def switch(staging, outdir, name, names, kept):
    """Puts the new set in place of NAME's old one with the HELD signals blocked, so that none of them can
    stop it halfway: one that comes meanwhile is acted on once the new set is complete. The marker is there
    from before the first change until after the last one; a failure in between leaves it."""
    restore = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    moved = False
    try:
        # Python runs the handlers of signals caught so far inside this call: one raises here, before any change.
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        mark_switch(staging, outdir, name)
        move_in(staging, outdir, name, names)
        unmark_switch(staging, outdir, name, kept)
        moved = True
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, restore)   # runs the handlers of the signals held
        except Interrupted as e:
            if moved:
                e.note = f' during the switch, which was completed: {outdir} holds the new set of {len(names)} shards'
            raise


def lock_outdir(outdir):
    """Takes OUTDIR's lock, or stops: two runs would rename and delete each other's shards. fcntl, not flock, so
    the lock holds on NFS too; the kernel drops it when the process ends, however it ends. The returned file
    must stay open for as long as the lock is needed (closing it drops the lock)."""
    path = os.path.join(outdir, LOCK)
    try:
        f = open(path, 'a+')
    except OSError as e:
        raise Fail(f'cannot open {path}: {e.strerror}')
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise Fail(f'cannot lock {path}: {e.strerror}')
        by = f'process {holder} holds {path}' if holder.isdigit() else f'it holds {path}'
        raise Fail(f'{outdir} is in use by another tokenize.py ({by}); wait for it to finish or give this run '
                   'another -o')
    f.truncate(0)
    f.write(f'{os.getpid()}\n')
    f.flush()
    return f


def marked_name(staging):
    """The NAME in a staging directory's marker; None: no marker; '': one that names none (a power loss cut
    its writing, which comes before any change) or cannot be read."""
    try:
        with open(os.path.join(staging, MARKER), 'rb') as f:
            return os.fsdecode(f.read(4096).split(b'\n')[0])
    except FileNotFoundError:
        return None
    except OSError:
        return ''


def empty_but_marker(staging):
    """Frees what a stopped switch left in its staging directory (the spool, shards not moved in), keeping
    the marker."""
    for e in os.scandir(staging):
        if e.name == MARKER:
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            remove_quietly(e.path)


def clear_stale(outdir):
    """The private directories of runs that a SIGKILL ended (only the lock's holder makes one, and that is us).
    One stopped before its switch goes. One stopped during its switch is emptied but for its marker, which
    keeps the trainer off OUTDIR until a run of the same NAME has switched in a whole set (a run that fails
    before that leaves it). Returns those kept, {path: the NAME in the marker}."""
    kept = {}
    for e in os.scandir(outdir):
        if STAGING.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
            name = marked_name(e.path)
            if name is None:
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                empty_but_marker(e.path)
                kept[e.path] = name
    return kept


def make_staging(outdir):
    """The run's private directory, .tokenize-PID; .tokenize-PID-N when a killed run of the same PID (a
    container's PIDs repeat) left its marker under that name."""
    base = os.path.join(outdir, f'.tokenize-{os.getpid()}')
    for n in range(1, 1 << 20):
        path = base if n == 1 else f'{base}-{n}'
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise Fail(f'cannot create {path}: {e.strerror}')
    raise Fail(f'cannot create {base}: too many of its names are taken')


def make_outdir(outdir):
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as e:
        raise Fail(f'cannot create {outdir}: {e.strerror}')
    if not os.access(outdir, os.W_OK):
        raise Fail(f'cannot write to {outdir}: permission denied')


def cmd_shards(args, tok):
    files = input_files(args.inputs)
    make_outdir(args.out)
    lock = lock_outdir(args.out)
    try:
        plan, names = tokenize_into(args, tok, lambda staging: stage(files, args, tok, staging))
    finally:
        lock.close()
    if not args.quiet:
        nval = sum(e - s for split, s, e in plan if split == 'val')
        total = plan[-1][2]
        sys.stderr.write(f'{total} tokens: {nval} val, {total - nval} train, {len(names)} shards in {args.out}\n')


def check_tokenizer_files(outdir, tok):
    """OUTDIR's shards of other datasets were encoded with the tokenizer files there: a tokenizer of the other
    kind, or another tokenizer.json, would leave the trainer decoding them with the wrong one."""
    for name in tok.others:
        if os.path.lexists(os.path.join(outdir, name)):
            raise Fail(f'{outdir} holds {name}, another tokenizer\'s file (its shards were encoded with it): '
                       'give this run another -o, or remove the old shards and tokenizer files')
    path = os.path.join(outdir, 'tokenizer.json')
    if 'tokenizer.json' in tok.files and os.path.lexists(path):
        try:
            with open(path, 'rb') as f:
                same = f.read() == tok.files['tokenizer.json']
        except OSError as e:
            raise Fail(f'{path}: {e.strerror}')
        if not same:
            raise Fail(f'{path} is another tokenizer (its shards were encoded with it): give this run another -o, '
                       'or remove the old shards and tokenizer.json')


def tokenize_into(args, tok, stage_in):
    """The work under OUTDIR's lock; stage_in(staging) writes the new set there and returns its plan and the
    names of its files, which this returns."""
    kept = clear_stale(args.out)
    check_tokenizer_files(args.out, tok)
    for name, data in tok.files.items():   # the trainer decodes samples and encodes -prompt with them
        write_atomic(os.path.join(args.out, name), [data])
    staging = make_staging(args.out)
    try:
        plan, names = stage_in(staging)
        switch(staging, args.out, args.name, names, kept)
    finally:
        if os.path.lexists(os.path.join(staging, MARKER)):   # a switch that began and failed: the marker stays
            empty_but_marker(staging)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    return plan, names


def stage(files, args, tok, staging):
    """Tokenizes into the run's private directory (the spool, then the new shards), touching no shard of OUTDIR."""
    try:
        with open(os.path.join(staging, 'spool'), 'w+b') as spool:
            prog = spool_tokens(files, tok, args, spool)
            plan = plan_shards(prog.tokens, args.shard_size, args.val_fraction)
            prog.finish()
            return plan, write_shards(spool, plan, staging, args, new_set_id(), tok.width)
    except OSError as e:   # the spool or a shard: a full disk, a file-size limit
        raise Fail(f'cannot write in {args.out}: {e.strerror}')
    except Interrupted as e:
        e.note = f'; the shards in {args.out} were left as they were'
        raise


# ---------- conversations (--chat) ----------

MASK_MAGIC, MASK_VERSION = 20261129, 1


def chat_modules():
    """The --chat modules beside this file, imported from the end of the path: before the standard library's
    directories this file's name would shadow its tokenize module."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    import chat_data
    import chat_format
    import chat_template
    return chat_data, chat_format, chat_template


class Chat:
    """What a --chat run renders and masks with."""
    def __init__(self, args, tok):
        self.data, self.format, template = chat_modules()
        self.problems = (self.data.ChatError, template.TemplateProblem)
        try:
            self.template = template.load(args.tokenizer, args.chat_template)
            self.table = self.data.TokenTable(tok.files['tokenizer.json'], args.tokenizer)
            self.masker = self.data.Masker(self.template, self.table, args.train_on, args.train_empty_think)
        except self.problems as e:
            raise Fail(str(e))

    def records(self, path, pending):
        """Renders each conversation into a build/tokenizer record; (its Conversation, the input bytes it took)
        goes to `pending`."""
        try:
            for lineno, messages, size in self.data.read_conversations(path):
                conv = self.masker.render(messages, f'{path}:{lineno}')
                pending.append((conv, size))
                yield 'T', conv.where, conv.data, len(conv.data)
        except self.problems as e:
            raise Fail(str(e))

    def mask(self, conv, ids, width):
        try:
            return self.masker.mask(conv, ids, width)
        except self.problems as e:
            raise Fail(str(e))


def mask_header(ntok, set_id):
    return struct.pack('<3iQ', MASK_MAGIC, MASK_VERSION, ntok, set_id) + bytes(4 * 256 - 20)


def spool_chat(args, tok, chat, spool, masks):
    """Encodes the conversations into the spools (ids, mask bytes); returns the kept ones' token counts, where the
    left-out ones are and the number of trained tokens."""
    pending, lengths, left_out, trained = collections.deque(), [], [], 0
    prog = Progress(os.path.getsize(args.chat), args.quiet)
    for ids, _ in encode_docs(chat.records(args.chat, pending), tok, args.threads):
        conv, size = pending.popleft()
        mask = chat.mask(conv, ids, tok.width)
        prog.update(size, len(ids) // tok.width)
        if mask is None:
            left_out.append(conv.where)
            continue
        spool.write(ids)
        masks.write(mask.tobytes())
        lengths.append(len(mask))
        trained += int((mask & 1).sum())
    spool.flush()
    masks.flush()
    prog.finish()
    return lengths, left_out, trained


def plan_documents(lengths, shard_size, nval):
    """[(split, start, end)]: the first nval documents are the validation split; a shard holds whole documents
    and ends before the one that would take it past shard_size tokens."""
    plan, pos = [], 0
    for split, docs in (('val', lengths[:nval]), ('train', lengths[nval:])):
        start = pos
        for n in docs:
            if pos > start and pos + n - start > shard_size:
                plan.append((split, start, pos))
                start = pos
            pos += n
        if pos > start:
            plan.append((split, start, pos))
    return plan


def write_masks(masks, plan, staging, name, set_id):
    names = []
    for i, (split, s, e) in enumerate(plan):
        names.append(f'{name}_{split}_{i:06d}.mask')
        with open(os.path.join(staging, names[-1]), 'wb') as f:
            f.write(mask_header(e - s, set_id))
            for block in spool_range(masks, s, e, 1):
                f.write(block)
    return names


def report_left_out(left_out, n):
    """Printed even under --quiet: training on fewer conversations than given must not go unnoticed."""
    if left_out:
        shown = ', '.join(left_out[:5]) + (', ...' if len(left_out) > 5 else '')
        sys.stderr.write(f'{len(left_out)} of {n} conversations have no trained token and were left out: {shown}\n')


def validation_count(fraction, n):
    nval = round(fraction * n)
    if fraction and nval < 1:
        raise Fail(f'--val-fraction {fraction} of {n} conversations is none; give a larger fraction, or 0')
    if nval >= n:
        raise Fail(f'--val-fraction {fraction} of {n} conversations leaves none for training')
    return nval


def stage_chat(args, tok, chat, staging):
    """Tokenizes the conversations into the run's private directory: shards and masks, then chat_format.json."""
    try:
        with open(os.path.join(staging, 'spool'), 'w+b') as spool, open(os.path.join(staging, 'masks'), 'w+b') as masks:
            lengths, left_out, trained = spool_chat(args, tok, chat, spool, masks)
            if not lengths:
                raise Fail(f'{args.chat}: none of its {len(left_out)} conversations has a trained token '
                           f'(--train-on {args.train_on})')
            report_left_out(left_out, len(lengths) + len(left_out))
            plan = plan_documents(lengths, args.shard_size, validation_count(args.val_fraction or 0, len(lengths)))
            set_id = new_set_id()
            names = write_shards(spool, plan, staging, args, set_id, tok.width)
            names += write_masks(masks, plan, staging, args.name, set_id)
    except OSError as e:
        raise Fail(f'cannot write in {args.out}: {e.strerror}')
    except Interrupted as e:
        e.note = f'; the shards in {args.out} were left as they were'
        raise
    write_chat_format(args.out, chat)
    return (plan, len(lengths), trained), names


def write_chat_format(outdir, chat):
    """chat_format.json for the trainer's -chat; a template that cannot be written as its pieces gets none (and
    one it replaces goes), with a note printed even under --quiet."""
    fmt, why = chat.format.chat_format(chat.template, chat.table.special)
    path = os.path.join(outdir, 'chat_format.json')
    if fmt is None:
        remove_quietly(path)
        sys.stderr.write(f'note: no chat_format.json: the chat template cannot be written as plain pieces ({why}); '
                         'the trainer\'s -chat will not work with it\n')
        return
    write_atomic(path, [json.dumps(fmt, ensure_ascii=False, indent=1).encode('utf-8') + b'\n'])


def cmd_chat(args, tok):
    check_regular(args.chat)
    chat = Chat(args, tok)
    make_outdir(args.out)
    lock = lock_outdir(args.out)
    try:
        (plan, ndocs, trained), names = tokenize_into(args, tok, lambda staging: stage_chat(args, tok, chat, staging))
    finally:
        lock.close()
    if not args.quiet:
        nval = sum(1 for split, _, _ in plan if split == 'val')
        total = plan[-1][2]
        sys.stderr.write(f'{ndocs} conversations, {total} tokens ({trained} trained): {nval} val and '
                         f'{len(plan) - nval} train shards (with masks) in {args.out}\n')


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument('inputs', nargs='*', help='text files, directories or .jsonl files')
    p.add_argument('--raw', metavar='FILE', help='exact mode: ids of FILE as one document, no document start, no split')
    p.add_argument('--chat', metavar='FILE',
                   help='conversations, one JSON object per line: shards and masks (needs --tokenizer)')
    p.add_argument('--chat-template', metavar='FILE',
                   help='with --chat: the Jinja chat template (default: the tokenizer_config.json beside --tokenizer)')
    p.add_argument('--train-on', choices=('assistant', 'last-assistant', 'all'), default='assistant',
                   help='with --chat: the tokens trained (default: every assistant turn)')
    p.add_argument('--train-empty-think', action='store_true',
                   help='with --chat: train the empty reasoning block a template inserts too')
    p.add_argument('--tokenizer', metavar='FILE', help="a Hugging Face tokenizer.json (default: GPT-2's, data/tokenizer/)")
    p.add_argument('-o', '--out', required=True, help='output directory (or file with --raw)')
    p.add_argument('--name', default='data', help='shard name prefix (default: data)')
    p.add_argument('--shard-size', type=int, default=100_000_000, help='tokens per shard (default 1e8)')
    p.add_argument('--val-fraction', type=float,
                   help='fraction of tokens (with --chat: of conversations) for validation (default: the first shard; '
                        'with --chat: 0, none)')
    p.add_argument('--token-bits', type=int, metavar='{16,32}',
                   help='bits per token in the shards (default: 16 when the vocabulary fits, else 32)')
    p.add_argument('-j', '--threads', type=int, default=0, help='threads (default: all cores)')
    p.add_argument('-q', '--quiet', action='store_true')
    a = p.parse_args(argv)
    if sum(map(bool, (a.raw, a.inputs, a.chat))) != 1:
        raise Fail('give one of INPUT..., --raw FILE or --chat FILE')
    if a.chat and not a.tokenizer:
        raise Fail('--chat needs --tokenizer FILE, a tokenizer.json (its chat template is in the tokenizer_config.json '
                   'beside it, or give --chat-template FILE)')
    if not a.chat and (a.chat_template or a.train_empty_think or a.train_on != 'assistant'):
        raise Fail('--chat-template, --train-on and --train-empty-think go with --chat')
    if not 0 < a.shard_size < 2 ** 31:
        raise Fail('--shard-size must be between 1 and 2^31-1')
    lowest = 0 if a.chat else 1e-300   # conversations may all be for training; a token stream needs a val split
    if a.val_fraction is not None and not lowest <= a.val_fraction < 1:
        raise Fail('--val-fraction must be between 0 and 1' + (' (0: no validation split)' if a.chat else ''))
    if not a.name or '/' in a.name or a.name.startswith('.'):
        raise Fail(f'--name {a.name!r} must be a plain file-name prefix (no "/", not hidden)')
    if not 0 <= a.threads <= 1024:
        raise Fail('-j must be between 0 (all cores) and 1024')
    if a.token_bits is not None and a.token_bits not in SHARD_FORMATS:
        raise Fail(f'--token-bits must be 16 or 32 (got {a.token_bits})')
    return a


def check_token_bits(args, tok):
    needed = 16 if tok.vocab <= 1 << 16 else 32
    if args.token_bits is None:
        args.token_bits = needed
    elif args.token_bits < needed:
        raise Fail(f'--token-bits {args.token_bits} cannot hold the {tok.vocab}-token vocabulary; use 32')


def run(args, tok):
    check_token_bits(args, tok)
    if args.raw:
        cmd_raw(args, tok)
    elif args.chat:
        cmd_chat(args, tok)
    else:
        cmd_shards(args, tok)


def main(argv):
    catch_signals()
    try:
        if sys.byteorder != 'little':
            raise Fail('only little-endian machines are supported (shards are little-endian)')
        args = parse_args(argv)
        if args.tokenizer:
            run(args, hf_tokenizer(args.tokenizer))
        else:
            with tempfile.NamedTemporaryFile(prefix='tokenizer-model-') as model_file:
                run(args, gpt2_tokenizer(model_file))
    except Fail as e:
        sys.stderr.write(f'error: {e}\n')
        return 1
    except Interrupted as e:
        sys.stderr.write(f'error: interrupted by {signal.Signals(e.signum).name}{e.note}\n')
        return 128 + e.signum
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
