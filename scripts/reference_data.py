"""The data side of scripts/reference.py, written from the specification (docs/formats.md: token shards and
the mask files beside them; docs/flags.md's -pack, -long and -docmask and docs/ARCHITECTURE.md's data order: how
a document dataset becomes rows), with numpy alone.

A split is its shards' tokens concatenated in name order (the stream). A shard X.bin may have a mask file
X.mask beside it, one byte per token: TRAINED (the prediction of this token is a label) and DOC_START (a
document, a conversation, starts here). A dataset whose shards have them is a document dataset, and its
batches carry, besides the tokens, per token:
  pos     the token's position in its document (RoPE's angle; GPT-2's row of wpe);
  doc     the row index of its document's first token (a query attends the keys doc..itself);
  target  the next token of the same document when that one is trained, else -1 (no label).
How the rows are cut from the stream:
  -pack 1  (a document dataset's default) documents go whole into rows of T tokens, best fit, once at open;
           one longer than T is left out, or cut to its first T tokens with -long truncate; the rest of a row
           is padding (token 0, a document of its own, no label). Window j is rows j*B .. j*B+B-1.
  -pack 0  the stream's windows of B*T+1 tokens as for plain shards, documents split at row edges.
  -docmask 1 (plain shards) -pack 0's rows with the documents starting at the tokenizer's document-start
           token, and every next token a label as in pretraining.
Plain shards without -docmask: today's rows, no pos, doc or -1 (Batches.plain).
"""
import glob
import os

import numpy as np

from model_file import HEADER_INTS, die

SHARD_FORMATS = {20240520: (1, "<u2"), 20240801: (7, "<u4")}   # magic: (version, token dtype)
MASK_MAGIC, MASK_VERSION = 20261129, 1
TRAINED, DOC_START = 1, 2
HEADER_BYTES = HEADER_INTS * 4


# ------------------------------------------------------------------------------------------------------
# Files

def shard_header(path):
    """(token dtype, token count, set id) of a token shard, its header and size checked."""
    size = os.path.getsize(path) if os.path.isfile(path) else -1
    if size < HEADER_BYTES:
        die("%s: not a token shard (missing or shorter than the 1024-byte header)" % path)
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    version, dtype = SHARD_FORMATS.get(int(h[0]), (None, None))
    if dtype is None or h[1] != version:
        die("%s: bad shard header magic=%d version=%d (want 20240520, 1 or 20240801, 7)" % (path, h[0], h[1]))
    ntok, width = int(h[2]), np.dtype(dtype).itemsize
    if ntok < 0 or size != HEADER_BYTES + width * ntok:
        die("%s: size %d bytes, header says %d tokens (%d bytes)" % (path, size, ntok, HEADER_BYTES + width * ntok))
    return dtype, ntok, int(h[3]) & 0xFFFFFFFF | (int(h[4]) & 0xFFFFFFFF) << 32


def read_shard(path):
    dtype, _, _ = shard_header(path)
    return np.fromfile(path, dtype=dtype, offset=HEADER_BYTES).astype(np.int64)


def mask_path(shard):
    """X.mask beside X.bin."""
    return (shard[:-4] if shard.endswith(".bin") else shard) + ".mask"


def read_mask(path, ntok, set_id):
    """The mask bytes of the shard of ntok tokens and set id set_id; every rule of the format checked."""
    size = os.path.getsize(path)
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS) if size >= HEADER_BYTES else None
    if h is None or h[0] != MASK_MAGIC or h[1] != MASK_VERSION:
        die("%s: not a mask file (want the header %d, %d)" % (path, MASK_MAGIC, MASK_VERSION))
    got_set = int(h[3]) & 0xFFFFFFFF | (int(h[4]) & 0xFFFFFFFF) << 32
    if h[2] != ntok or got_set != set_id or size != HEADER_BYTES + ntok:
        die("%s: %d tokens of set %016x in %d bytes; its shard has %d tokens of set %016x"
            % (path, h[2], got_set, size, ntok, set_id))
    m = np.fromfile(path, dtype=np.uint8, offset=HEADER_BYTES)
    bad = np.flatnonzero((m & ~(TRAINED | DOC_START)) | ((m & TRAINED) * (m & DOC_START)))
    if bad.size:
        die("%s: token %d has mask %d (bits: 1 trained, 2 document start; a start is never trained)"
            % (path, bad[0], m[bad[0]]))
    if ntok and not m[0] & DOC_START:
        die("%s: the shard's first token does not start a document" % path)
    return m


class Stream:
    """A split's tokens (int64) and, for a document dataset, their mask bytes (else None)."""

    def __init__(self, pattern, V):
        files = sorted(glob.glob(pattern))
        if not files:
            die("no token shards match %r" % pattern)
        masked = [f for f in files if os.path.exists(mask_path(f))]
        if masked and len(masked) != len(files):
            missing = next(f for f in files if f not in masked)
            die("%s: %d of %d shards have a mask file, %s has none: a dataset's shards have one each or none"
                % (pattern, len(masked), len(files), missing))
        parts, masks = [], []
        for f in files:
            _, ntok, set_id = shard_header(f)
            parts.append(read_shard(f))
            if masked:
                masks.append(read_mask(mask_path(f), ntok, set_id))
        self.tokens = np.concatenate(parts)
        self.mask = np.concatenate(masks) if masked else None
        if self.tokens.size and self.tokens.max() >= V:
            die("%s: token %d out of range for vocabulary %d" % (pattern, self.tokens.max(), V))


# ------------------------------------------------------------------------------------------------------
# Rows

class Rows:
    """n rows of T tokens: tokens, pos, doc, target, each an (n, T) int64 array; used (n,): how many of a
    row's tokens are documents' (-pack 1; the rest is padding)."""

    def __init__(self, n, T):
        self.used = np.full(n, T, np.int64)
        self.tokens = np.zeros((n, T), np.int64)
        self.pos = np.zeros((n, T), np.int64)
        self.doc = np.zeros((n, T), np.int64)
        self.target = np.full((n, T), -1, np.int64)


def documents(mask):
    """[(start, end)] of every document of a stream: from one DOC_START up to the next, or the end."""
    starts = np.flatnonzero(mask & DOC_START)
    return list(zip(starts.tolist(), starts[1:].tolist() + [mask.size]))


def best_fit(lengths, T):
    """-pack 1's placement: each length in turn goes into the open row with the least free room that holds
    it (the lowest row among equals), else into a new row. Returns [[item index, ...] per row]."""
    rows, free = [], []
    for i, n in enumerate(lengths):
        fits = [r for r in range(len(rows)) if free[r] >= n]
        if fits:
            r = min(fits, key=lambda r: (free[r], r))
        else:
            rows.append([])
            free.append(T)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= n
    return rows


def pack(stream, T, long_docs):
    """-pack 1: (Rows, the number of documents longer than T, how many documents there were). long_docs:
    'drop' leaves those out, 'truncate' keeps their first T tokens (mask bits kept, so their last kept
    token has no label)."""
    tokens, mask = stream.tokens, stream.mask
    docs = documents(mask)
    kept = [(s, min(e - s, T)) for s, e in docs if e - s <= T or long_docs == "truncate"]
    placement = best_fit([n for _, n in kept], T)
    rows = Rows(len(placement), T)
    for r, items in enumerate(placement):
        at = 0
        for start, n in (kept[i] for i in items):
            tok = tokens[start:start + n]
            rows.tokens[r, at:at + n] = tok
            rows.pos[r, at:at + n] = np.arange(n)
            rows.doc[r, at:at + n] = at
            rows.target[r, at:at + n - 1] = np.where(mask[start + 1:start + n] & TRAINED, tok[1:], -1)
            at += n
        rows.used[r] = at
        rows.pos[r, at:] = np.arange(T - at)   # padding: a document of its own, no labels
        rows.doc[r, at:] = at
    return rows, sum(e - s > T for s, e in docs), len(docs)


def stream_rows(tokens, starts, trained, B, T):
    """-pack 0 and -docmask 1: the B rows of one window of B*T+1 stream tokens. starts[i]: token i starts a
    document; trained: None (plain shards: every next token is a label), else whether token i is a label."""
    rows = Rows(B, T)
    t = np.arange(T)
    for b in range(B):
        cut = slice(b * T, b * T + T)
        after = slice(b * T + 1, b * T + T + 1)
        rows.tokens[b] = tokens[cut]
        rows.doc[b] = np.maximum.accumulate(np.where(starts[cut], t, 0))   # the last start at or before t
        rows.pos[b] = t - rows.doc[b]
        label = tokens[after] if trained is None else np.where(trained[after] & ~starts[after], tokens[after], -1)
        rows.target[b] = label
    return rows


class Batches:
    """The batches of one rank, -sh 0: step s, micro-step m reads window w = s*ga + m, j = w mod W (n
    replicas of -ga m/n read the same windows per step: (s*(m/n) + i)*n + r covers the same range).
    batch() -> (tokens, targets, pos, doc) as (B, T) int64 arrays; pos and doc None for plain shards."""

    def __init__(self, stream, B, T, ga, pack_rows=1, long_docs="drop", docmask=0, doc_start=None, quiet=False):
        self.B, self.T, self.ga, self.stream = B, T, ga, stream
        self.documented = stream.mask is not None or docmask
        self.packed = stream.mask is not None and pack_rows == 1   # plain shards are always read as windows
        if self.packed:
            self.rows, longer, ndocs = pack(stream, T, long_docs)
            self.W = self.rows.tokens.shape[0] // B
            if not quiet:
                print("data: %d of %d documents longer than -t %d %s; %d rows, %d windows, %d rows unused"
                      % (longer, ndocs, T, "truncated" if long_docs == "truncate" else "left out",
                         self.rows.tokens.shape[0], self.W, self.rows.tokens.shape[0] - self.W * B))
            if self.W < 1:
                die("%d rows of -t %d are too few for one micro-batch of -b %d" % (self.rows.tokens.shape[0], T, B))
            return
        self.W = (stream.tokens.size - 1) // (B * T)
        if self.W < 1:
            die("%d tokens are too few for one micro-batch of B*T+1 = %d" % (stream.tokens.size, B * T + 1))
        if stream.mask is not None:
            self.starts, self.trained = (stream.mask & DOC_START) != 0, (stream.mask & TRAINED) != 0
        elif docmask:
            self.starts, self.trained = stream.tokens == doc_start, None

    def window(self, step, micro):
        return (step * self.ga + micro) % self.W

    def batch(self, step, micro):
        j, B, T = self.window(step, micro), self.B, self.T
        if self.packed:
            take = slice(j * B, j * B + B)
            r = self.rows
            return r.tokens[take], r.target[take], r.pos[take], r.doc[take]
        at = j * B * T
        buf = self.stream.tokens[at:at + B * T + 1]
        if not self.documented:
            return buf[:-1].reshape(B, T), buf[1:].reshape(B, T), None, None
        trained = None if self.trained is None else self.trained[at:at + B * T + 1]
        r = stream_rows(buf, self.starts[at:at + B * T + 1], trained, B, T)
        return r.tokens, r.target, r.pos, r.doc
