"""Shared by import_hf.py, export_hf.py and the family modules (scripts/families/): safetensors files (one,
or shards and their index), config.json's JSON and the checks every family's config.json reader makes, the
padded vocabulary, and the shapes the trainer runs. What differs by family (names, transposes, config.json's
keys and what of them the trainer does not implement) is the family module's.

Written from the published formats. safetensors: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}} (space-padded so
the data starts 8-byte aligned), then the raw little-endian tensors, offsets relative to the data start.
Model files are read by families.load_model and written in scripts/model_file.py's format by save_model here.
numpy is all this needs: PyTorch only reads pytorch_model.bin, in import_hf.py. The scripts that import this
module first move scripts/ to the end of sys.path, because scripts/tokenize.py would otherwise shadow the
standard library's tokenize, which torch imports.
"""
import contextlib
import json
import math
import os
import signal
import struct
from collections import namedtuple

import numpy as np

import model_file as mf

# Hugging Face's name of the head of a *ForCausalLM, stored when it is not tied to the embedding (and by some
# versions even then).
TIED_HEAD = "lm_head.weight"
# Bits per element of every safetensors dtype, as the safetensors library knows them: each tensor's byte count
# is checked, whatever its dtype. Decoded to float32: FLOAT_DTYPES; a parameter in any other is refused.
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_HEADER_BYTES = 100_000_000   # the safetensors library's limit
INT32_MAX = 2 ** 31 - 1          # the model file's header holds its sizes as int32


die = mf.die   # one convention for every script: "error: ..." on stderr, exit 1


def run(main):
    """main(), with SIGTERM raising KeyboardInterrupt as Ctrl-C does: either one then unwinds through the
    removal of partial output (atomic_file, export_hf.py's temporary folder) and ends in one `error:` line."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        main()
    except KeyboardInterrupt:
        die("interrupted; no partial output is left")


def load_json(path, raw):
    """raw (UTF-8 bytes) -> the JSON value, or one `error:` line. Stricter than json.loads in the ways that
    matter for a file that says where to read: a repeated key (json.loads keeps the last, silently), NaN and
    Infinity (not JSON), and nesting deeper than Python's recursion (a RecursionError) are refused."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_not_json)
    except RecursionError:
        die("%s: JSON nested too deeply to read" % path)
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError and the two hooks' errors
        die("%s: not valid JSON (%s)" % (path, e))


def read_json(path):
    """A JSON file by load_json's rules, or one `error:` line if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return load_json(path, f.read())
    except OSError as e:
        die("%s: cannot read (%s)" % (path, e.strerror))


def _unique_keys(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        raise ValueError("key %r appears twice" % next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _not_json(constant):
    raise ValueError("%s is not a JSON value" % constant)


# ------------------------------------------------------------------------------------------------------
# safetensors

Entry = namedtuple("Entry", "dtype shape data")   # data: the tensor's raw bytes (a uint8 array view)


def _parse_header(path, size, f):
    """Returns (header dict, data offset); refuses a header that does not fit the file."""
    if size < 8:
        die("%s: not a safetensors file (%d bytes)" % (path, size))
    (n,) = struct.unpack("<Q", f.read(8))
    if n > size - 8:
        die("%s: header length %d exceeds the file (%d bytes)" % (path, n, size))
    if n > MAX_HEADER_BYTES:
        die("%s: header length %d exceeds the safetensors limit of %d bytes" % (path, n, MAX_HEADER_BYTES))
    header = load_json(path, f.read(n))
    if not isinstance(header, dict):
        die("%s: header is not a JSON object" % path)
    return header, 8 + n


def _is_index(x):
    return type(x) is int and x >= 0   # not isinstance: True and False are ints to Python, not to JSON


def _entry(path, name, e):
    """One header entry -> (dtype, shape, begin, end); dies unless it is well-formed."""
    def bad(what):
        die("%s: tensor %s has %s: %.200s" % (path, name, what, json.dumps(e)))
    if not isinstance(e, dict):
        bad("a header entry that is not an object")
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        bad("no safetensors dtype")
    if not isinstance(shape, list) or not all(map(_is_index, shape)):
        bad("a shape that is not a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_index, offsets)):
        bad("data_offsets that are not two integers >= 0")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _nbytes(path, name, dtype, shape):
    """dtype size x product(shape), refused past 2^64 bytes as the library's overflow check does: a shape
    with many huge dimensions must not become a huge Python integer."""
    bits = DTYPE_BITS[dtype]
    for d in shape:
        bits *= d
        if bits >= 8 << 64:
            die("%s: tensor %s's shape %.200s is over 2^64 bytes" % (path, name, list(shape)))
    if bits % 8:
        die("%s: tensor %s (%s, shape %s) is not a whole number of bytes" % (path, name, dtype, list(shape)))
    return bits // 8


def validate_header(path, header, data_len):
    """The safetensors library's rules, checked before any tensor is read: __metadata__ maps strings to
    strings; every entry has a known dtype, integer shape and offsets; sorted by offset, the tensors tile the
    data section exactly (the first at 0, each starting where the previous ends: no gap, no overlap, no
    trailing byte), each holding dtype size x product(shape) bytes. Returns {name: (dtype, shape, begin, end)}."""
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        die("%s: __metadata__ is not an object of strings" % path)
    entries = {name: _entry(path, name, e) for name, e in header.items() if name != "__metadata__"}
    pos, prev = 0, None
    for name, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != pos:
            where = "%s ends at %d" % (prev, pos) if prev is not None else "the data starts at 0"
            what = "an overlap" if begin < pos else "a gap of %d bytes" % (begin - pos)
            die("%s: tensor %s starts at data byte %d, but %s (%s)" % (path, name, begin, where, what))
        if end < begin:
            die("%s: tensor %s has offsets [%d, %d) that end before they begin" % (path, name, begin, end))
        nbytes = _nbytes(path, name, dtype, shape)
        if end - begin != nbytes:
            die("%s: tensor %s has offsets [%d, %d): %d bytes, but %s shape %s is %d bytes"
                % (path, name, begin, end, end - begin, dtype, list(shape), nbytes))
        pos, prev = end, name
    if pos < data_len:
        die("%s: %d trailing bytes after the last tensor (%s)" % (path, data_len - pos, prev))
    if pos > data_len:
        die("%s: the tensors need %d data bytes; the file holds %d (truncated?)" % (path, pos, data_len))
    return entries


def read_safetensors(path):
    """Returns {name: Entry}. The data is memory-mapped and decoded only on demand (decode), so a
    checkpoint may hold buffers in dtypes no parameter uses (the boolean attention masks) and a large model is
    not read twice."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, start = _parse_header(path, size, f)
    entries = validate_header(path, header, size - start)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start) if size > start else np.zeros(0, np.uint8)
    return {name: Entry(dtype, shape, data[begin:end]) for name, (dtype, shape, begin, end) in entries.items()}


def decode(path, name, entry):
    """One tensor as float32 (F16 and BF16 widen exactly); dies naming it if its dtype is not a float we read."""
    if entry.dtype == "F32":
        out = entry.data.view("<f4").astype(np.float32)
    elif entry.dtype == "F16":
        out = entry.data.view("<f2").astype(np.float32)
    elif entry.dtype == "BF16":
        out = mf.bf16_bits_to_f32(entry.data.view("<u2"))
    else:
        die("%s: tensor %s has dtype %s; supported: %s" % (path, name, entry.dtype, ", ".join(FLOAT_DTYPES)))
    return out.reshape(entry.shape)


@contextlib.contextmanager
def atomic_file(path):
    """A binary file written as path.tmp and renamed to path when the block ends, removed if it does not end
    (an error, a full disk, Ctrl-C): path is the old file or the whole new one, and no part is left behind.
    Arrays go in with f.write(array.data), not tofile: no copy either way, and a failed write's OSError
    says why (tofile's has no errno)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


# The storage dtypes an export may choose: the safetensors name, config.json's torch_dtype, bytes per value.
STORAGE = {"fp32": ("F32", "float32", 4), "bf16": ("BF16", "bfloat16", 2), "fp16": ("F16", "float16", 2)}


def encode(name, a, dtype):
    """A float32 array as dtype's little-endian values. BF16 rounds to nearest even (the model file's rule);
    F16 too, and a finite value past float16's range, which would become infinite, is refused naming the
    tensor."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4", copy=False)
    if dtype == "BF16":
        return mf.f32_to_bf16_bits(a).astype("<u2", copy=False)
    with np.errstate(over="ignore"):
        out = a.astype("<f2")
    overflow = np.count_nonzero(np.isinf(out)) - np.count_nonzero(np.isinf(a))
    if overflow:
        die("tensor %s has %d values beyond float16's range (largest magnitude %.6g, float16 holds 65504); "
            "export it as bf16 or fp32" % (name, overflow, float(np.nanmax(np.abs(a)))))
    return out


def write_safetensors(path, tensors, metadata, dtype="F32"):
    """tensors: [(name, array)] written as dtype (F32, BF16 or F16) in that order, each converted (transposed
    views made contiguous) only as it is written, so a large model is not held twice."""
    width = DTYPE_BITS[dtype] // 8
    header, offset = {"__metadata__": metadata}, 0
    for name, a in tensors:
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + width * a.size]}
        offset += width * a.size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)   # 8 + len(text) is then a multiple of 8: the data starts aligned
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, a in tensors:
            f.write(encode(name, a, dtype).data)


SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


def write_weights(folder, tensors, metadata, dtype, max_shard_bytes=0):
    """The weights as Hugging Face saves them: one model.safetensors, or, when max_shard_bytes (> 0) does not
    hold them all, model-0000i-of-0000n.safetensors shards filled in order (a tensor larger than the limit
    alone in its shard) and model.safetensors.index.json mapping each name to its shard."""
    width = DTYPE_BITS[dtype] // 8
    shards, size = [[]], 0
    for name, a in tensors:
        if shards[-1] and max_shard_bytes and size + width * a.size > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, a))
        size += width * a.size
    if len(shards) == 1:
        write_safetensors(os.path.join(folder, SINGLE_FILE), tensors, metadata, dtype)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        file = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_safetensors(os.path.join(folder, file), shard, metadata, dtype)
        weight_map.update((name, file) for name, _ in shard)
    write_json(os.path.join(folder, INDEX_FILE),
               {"metadata": {"total_size": sum(width * a.size for _, a in tensors)}, "weight_map": weight_map})


def read_index(folder):
    """model.safetensors.index.json -> {tensor name: shard path}; dies unless its weight_map maps names to
    file names in folder (a path elsewhere is refused: the index says where to read)."""
    path = os.path.join(folder, INDEX_FILE)
    index = read_json(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        die("%s: has no weight_map object naming the shards" % path)
    out = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or file in ("", ".", "..") or "/" in file or "\\" in file:
            die("%s: weight_map sends %s to %.200r, not a file name in the folder" % (path, name, file))
        if not os.path.isfile(os.path.join(folder, file)):
            die("%s: weight_map sends %s to %s, which is not in the folder" % (path, name, file))
        out[name] = os.path.join(folder, file)
    return out


def read_sharded(folder):
    """The tensors of every shard the index names, as {name: (shard path, Entry)}. The index and the shards
    must agree: each tensor in the shard the index names, in no other shard, and every tensor of a shard in
    the index (a loader reading either the index or the files would otherwise see another model)."""
    where = read_index(folder)
    index, out = os.path.join(folder, INDEX_FILE), {}
    for shard in sorted(set(where.values())):
        for name, entry in read_safetensors(shard).items():
            if name in out:
                die("%s: tensor %s is stored in %s and in %s" % (index, name, os.path.basename(out[name][0]),
                                                                  os.path.basename(shard)))
            if where.get(name) != shard:
                die("%s: tensor %s is in %s, but the weight_map %s" % (
                    index, name, os.path.basename(shard), "sends it to %s" % os.path.basename(where[name])
                    if name in where else "does not list it"))
            out[name] = (shard, entry)
    missing = [name for name in where if name not in out]
    if missing:
        die("%s: tensor %s is not in %s, where the weight_map sends it"
            % (index, missing[0], os.path.basename(where[missing[0]])))
    return out


def save_model(path, cfg, params, version):
    """model_file.save_model's file (its header, its bf16 rounding), written a tensor at a time: for gpt2-xl
    that one concatenates and copies 6 GB twice more."""
    with atomic_file(path) as f:
        f.write(cfg.header(version).tobytes())
        for name in cfg.names:
            a = np.ascontiguousarray(params[name], dtype=np.float32)
            f.write((a if version == 3 else mf.f32_to_bf16_bits(a)).data)


# ------------------------------------------------------------------------------------------------------
# What every family's map and config.json reader use

def padded_vocab(cfg, a):
    """A (V, C) vocabulary matrix with zero rows up to Vp (inert: the trainer never looks them up and masks
    their logits)."""
    out = np.zeros((cfg.Vp, cfg.C), np.float32)
    out[:cfg.V] = a
    return out


def positive_int(path, key, x):
    """A config.json size: a positive integer that fits the model file's int32 header."""
    if type(x) is not int or x <= 0:
        die("%s: %s is %r, not a positive integer" % (path, key, x))
    if x > INT32_MAX:
        die("%s: %s is %d, more than the model file's int32 header holds" % (path, key, x))
    return x


# The shapes the trainer runs (core/model/model.c's shape_validate, and each family's validate in
# core/models/, here its Config.trainer_error): a model beyond them is refused on import, not by the trainer
# afterwards. t_hf.sh asks train_gpt_cpu about shapes on either side of each bound, so that this and the C
# cannot drift apart.
MAX_LAYERS, MAX_VOCAB, MAX_HEAD_SIZE = 256, 1 << 24, 128


def trainer_shape_error(cfg):
    """Why the trainer cannot run cfg's shape, or None. The head size rule is the CUDA attention kernels'
    (kernels/attention.cuh); shape_validate applies it to every build, so a model runs on both or neither."""
    D = cfg.head_size
    if D % 8 or not 8 <= D <= MAX_HEAD_SIZE:
        return "head size %d must be a multiple of 8 and at most %d" % (D, MAX_HEAD_SIZE)
    family_rule = cfg.trainer_error()
    if family_rule:
        return family_rule
    if cfg.L > MAX_LAYERS:
        return "%d layers; the trainer runs 1 to %d" % (cfg.L, MAX_LAYERS)
    if not 2 <= cfg.V <= MAX_VOCAB:
        return "vocabulary size %d is outside 2..%d" % (cfg.V, MAX_VOCAB)
    return None


def runnable(path, cfg):
    """cfg, or one `error:` saying why the trainer cannot run it."""
    err = trainer_shape_error(cfg)
    if err:
        die("%s: %s: the trainer cannot run this model" % (path, err))
    return cfg


def padded(path, V):
    """config.json's vocabulary size padded as the trainer pads it, refused past the header's int32."""
    Vp = mf.padded_vocab(V)
    if Vp > INT32_MAX:
        die("%s: vocab_size %d pads to %d, more than the model file's int32 header holds" % (path, V, Vp))
    return Vp


def positive_number(path, key, x):
    if type(x) not in (int, float) or not (math.isfinite(x) and x > 0):
        die("%s: %s is %r, not a positive number" % (path, key, x))
    return float(x)


def f32_json(x):
    """A float32 header value as the shortest decimal that reads back as the same float32 (1e-05, not
    9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
