"""Shared by import_hf.py and export_hf.py: safetensors files (one, or shards and their index), and the map
between a model file and a Hugging Face checkpoint of GPT2LMHeadModel or, for the Llama family,
LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (names, transposes, the padded vocabulary,
config.json and what of it the trainer does not implement).

Written from the published formats. safetensors: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}} (space-padded so
the data starts 8-byte aligned), then the raw little-endian tensors, offsets relative to the data start.
Model files are read by scripts/model_file.py's load_model and written in its format by save_model here.
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

# Per-layer tensors: llm.c name, Hugging Face name under h.{l}., and whether HF stores it transposed
# (GPT-2's Conv1D keeps weights as (in, out) and computes x @ W + b; llm.c keeps (out, in)).
LAYER = [("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
         ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
         ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
         ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
         ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
         ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False)]
# Buffers some HF versions store, not parameters: the causal mask and its fill value.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
TIED_HEAD = "lm_head.weight"
# Bits per element of every safetensors dtype, as the safetensors library knows them: each tensor's byte count
# is checked, whatever its dtype. Decoded to float32: FLOAT_DTYPES; a parameter in any other is refused.
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_HEADER_BYTES = 100_000_000   # the safetensors library's limit
INT32_MAX = 2 ** 31 - 1          # the model file's header holds its sizes as int32
GPT2_TOKEN = 50256   # <|endoftext|>: GPT-2's bos and eos


die = mf.die   # one convention for every script: "error: ..." on stderr, exit 1
load_model = mf.load_model   # the model-file reader, with its header and size checks
read_model_header = mf.read_model_header


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
# llm.c <-> Hugging Face GPT-2

def _gpt2_names(cfg):
    """[(HF name, HF shape)] of every stored parameter, in GPT-2's state-dict order (no tied lm_head)."""
    C = cfg.C
    shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
              "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
              "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C),
              "mlp.c_proj.bias": (C,)}
    out = [("wte.weight", (cfg.V, C)), ("wpe.weight", (cfg.maxT, C))]
    out += [("h.%d.%s" % (l, hf), shapes[hf]) for l in range(cfg.L) for _, hf, _ in LAYER]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def _gpt2_to_hf(cfg, params):
    """llm.c tensors -> [(HF name, array)]: layers unstacked, Conv1D weights transposed, wte cut to V rows
    (llm.c's padding rows are never looked up, and HF's vocabulary is the real one)."""
    out = [("wte.weight", params["wte"][:cfg.V]), ("wpe.weight", params["wpe"])]
    for l in range(cfg.L):
        out += [("h.%d.%s" % (l, hf), params[name][l].T if transposed else params[name][l])
                for name, hf, transposed in LAYER]
    return out + [("ln_f.weight", params["lnfw"]), ("ln_f.bias", params["lnfb"])]


def _gpt2_from_hf(cfg, get):
    """get(HF name) -> float32 array of its HF shape. Returns llm.c's tensors: stacked, transposed back,
    wte padded to Vp with zero rows (inert: the trainer never looks them up and masks their logits)."""
    params = {"wte": padded_vocab(cfg, get("wte.weight")), "wpe": get("wpe.weight"), "lnfw": get("ln_f.weight"),
              "lnfb": get("ln_f.bias")}
    shapes = dict(zip(mf.NAMES, cfg.shapes()))
    for name, hf, transposed in LAYER:
        params[name] = np.empty(shapes[name], np.float32)   # filled layer by layer: one copy in memory
        for l in range(cfg.L):
            a = get("h.%d.%s" % (l, hf))
            params[name][l] = a.T if transposed else a
    return params


def padded_vocab(cfg, a):
    """A (V, C) vocabulary matrix with zero rows up to Vp (inert: the trainer never looks them up and masks
    their logits)."""
    out = np.zeros((cfg.Vp, cfg.C), np.float32)
    out[:cfg.V] = a
    return out


# ------------------------------------------------------------------------------------------------------
# llm.c <-> Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
#
# HF's Linear weights are (out, in) as the model file's are, and its RoPE is the rotate-half the trainer
# computes, so every HF tensor is a block of rows of one model-file tensor, copied as it is.

LLAMA_PREFIX = "model."


def _llama_layer(cfg):
    """A layer's HF tensors in HF's state-dict order: (name under model.layers.{l}., model-file tensor, first
    row, rows) -- the HF tensor is rows [first, first + rows) of the file tensor's layer slice."""
    C, D, F, q, kv = cfg.C, cfg.D, cfg.F, cfg.NH * cfg.D, cfg.KV * cfg.D
    bias = cfg.qkv_bias
    out = [("self_attn.q_proj.weight", "wq", 0, q)] + [("self_attn.q_proj.bias", "bq", 0, q)] * bias
    out += [("self_attn.k_proj.weight", "wkv", 0, kv)] + [("self_attn.k_proj.bias", "bkv", 0, kv)] * bias
    out += [("self_attn.v_proj.weight", "wkv", kv, kv)] + [("self_attn.v_proj.bias", "bkv", kv, kv)] * bias
    out += [("self_attn.o_proj.weight", "attn_proj", 0, C)]
    if cfg.qk_norm:
        out += [("self_attn.q_norm.weight", "q_norm", 0, D), ("self_attn.k_norm.weight", "k_norm", 0, D)]
    return out + [("mlp.gate_proj.weight", "gate_up", 0, F), ("mlp.up_proj.weight", "gate_up", F, F),
                  ("mlp.down_proj.weight", "down", 0, C), ("input_layernorm.weight", "attn_norm", 0, C),
                  ("post_attention_layernorm.weight", "mlp_norm", 0, C)]


def _llama_names(cfg):
    shapes = dict(zip(cfg.names, cfg.shapes()))
    out = [("model.embed_tokens.weight", (cfg.V, cfg.C))]
    out += [("model.layers.%d.%s" % (l, hf), (rows,) + shapes[name][2:])
            for l in range(cfg.L) for hf, name, _, rows in _llama_layer(cfg)]
    out.append(("model.norm.weight", (cfg.C,)))
    return out + [(TIED_HEAD, (cfg.V, cfg.C))] * (not cfg.tied)


def _llama_to_hf(cfg, params):
    out = [("model.embed_tokens.weight", params["wte"][:cfg.V])]
    out += [("model.layers.%d.%s" % (l, hf), params[name][l][first:first + rows])
            for l in range(cfg.L) for hf, name, first, rows in _llama_layer(cfg)]
    out.append(("model.norm.weight", params["final_norm"]))
    return out if cfg.tied else out + [(TIED_HEAD, params["lm_head"][:cfg.V])]


def _llama_from_hf(cfg, get):
    params = {name: np.empty(shape, np.float32) for name, shape in zip(cfg.names, cfg.shapes())}
    params["wte"] = padded_vocab(cfg, get("model.embed_tokens.weight"))
    params["final_norm"] = get("model.norm.weight")
    if not cfg.tied:
        params["lm_head"] = padded_vocab(cfg, get(TIED_HEAD))
    for l in range(cfg.L):
        for hf, name, first, rows in _llama_layer(cfg):
            params[name][l][first:first + rows] = get("model.layers.%d.%s" % (l, hf))
    return params


# ------------------------------------------------------------------------------------------------------
# Either family

def is_llama(cfg):
    return cfg.family == mf.FAMILY_LLAMA


def hf_names(cfg):
    """[(HF name, HF shape)] of every stored parameter in HF's state-dict order; a tied lm_head is not one."""
    return _llama_names(cfg) if is_llama(cfg) else _gpt2_names(cfg)


def to_hf(cfg, params):
    """Model-file tensors -> [(HF name, array)], the names and order of hf_names, vocabularies cut to V rows."""
    return _llama_to_hf(cfg, params) if is_llama(cfg) else _gpt2_to_hf(cfg, params)


def from_hf(cfg, get):
    """get(HF name) -> float32 array of its hf_names shape. Returns the model file's tensors, vocabularies
    padded to Vp with zero rows."""
    return _llama_from_hf(cfg, get) if is_llama(cfg) else _gpt2_from_hf(cfg, get)


def canonical_name(cfg, name):
    """The name hf_names uses for a stored tensor: GPT2LMHeadModel's `transformer.` prefix dropped; a Llama
    base model's names (LlamaModel's, without `model.`) given it, as from_pretrained does."""
    if not is_llama(cfg):
        return name[len("transformer."):] if name.startswith("transformer.") else name
    return name if name.startswith(LLAMA_PREFIX) or name == TIED_HEAD else LLAMA_PREFIX + name


def prefix(cfg):
    return LLAMA_PREFIX if is_llama(cfg) else "transformer."


def ignored(cfg, name):
    """Buffers some HF versions store that are not parameters: GPT-2's causal mask and its fill value,
    Llama's RoPE frequencies (recomputed from config.json by HF too)."""
    return name.endswith(".rotary_emb.inv_freq" if is_llama(cfg) else IGNORED_SUFFIXES)


def hf_numel(cfg):
    """Parameters a Hugging Face checkpoint of cfg stores (wte has V rows there, not Vp), in Python integers:
    config.json's sizes are unchecked, and numpy's int64 products would wrap."""
    C, L = cfg.C, cfg.L
    if not is_llama(cfg):
        return (cfg.V + cfg.maxT + 2) * C + L * (12 * C * C + 13 * C)
    q, kv = cfg.NH * cfg.D, cfg.KV * cfg.D
    block = 2 * C + (q + 2 * kv) * C + q * C + 3 * cfg.F * C + (q + 2 * kv) * cfg.qkv_bias + 2 * cfg.D * cfg.qk_norm
    return cfg.V * C * (1 if cfg.tied else 2) + L * block + C


# ------------------------------------------------------------------------------------------------------
# config.json

def read_config(path):
    """config.json -> (model_file.Config or LlamaConfig, the JSON object); dies, naming the key, unless it
    describes a model the trainer computes as Hugging Face does."""
    conf = read_json(path)
    kind = conf.get("model_type") if isinstance(conf, dict) else conf
    if kind == "gpt2":
        return _gpt2_config(path, conf), conf
    if kind in LLAMA_ARCHS:
        return _llama_config(path, conf), conf
    die("%s: model_type %r is not one of gpt2, %s" % (path, kind, ", ".join(LLAMA_ARCHS)))


def config_from_hf(path):
    return read_config(path)[0]


def _fixed_settings(C):
    """config.json settings the trainer's forward has no choice in: key -> accepted values (HF's default
    first). gelu_pytorch_tanh is the same tanh approximation as gelu_new."""
    return {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
            "n_inner": (None, 4 * C), "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
            "add_cross_attention": (False,), "tie_word_embeddings": (True,)}


def _positive_int(path, key, x):
    """A config.json size: a positive integer that fits the model file's int32 header."""
    if type(x) is not int or x <= 0:
        die("%s: %s is %r, not a positive integer" % (path, key, x))
    if x > INT32_MAX:
        die("%s: %s is %d, more than the model file's int32 header holds" % (path, key, x))
    return x


# The shapes the trainer runs (core/model/model.c's shape_validate, and each family's validate in
# core/models/): a model beyond them is refused on import, not by the trainer afterwards. t_hf.sh asks
# train_gpt_cpu about shapes on either side of each bound, so that this and the C cannot drift apart.
MAX_LAYERS, MAX_VOCAB, MAX_HEAD_SIZE = 256, 1 << 24, 128


def trainer_shape_error(cfg):
    """Why the trainer cannot run cfg's shape, or None. The head size rule is the CUDA attention kernels'
    (kernels/attention.cuh); shape_validate applies it to every build, so a model runs on both or neither."""
    D = cfg.D if is_llama(cfg) else cfg.C // cfg.NH
    if D % 8 or not 8 <= D <= MAX_HEAD_SIZE:
        return "head size %d must be a multiple of 8 and at most %d" % (D, MAX_HEAD_SIZE)
    if is_llama(cfg) and cfg.C % 8:
        return "hidden_size %d must be a multiple of 8" % cfg.C
    if cfg.L > MAX_LAYERS:
        return "%d layers; the trainer runs 1 to %d" % (cfg.L, MAX_LAYERS)
    if not 2 <= cfg.V <= MAX_VOCAB:
        return "vocabulary size %d is outside 2..%d" % (cfg.V, MAX_VOCAB)
    return None


def _runnable(path, cfg):
    err = trainer_shape_error(cfg)
    if err:
        die("%s: %s: the trainer cannot run this model" % (path, err))
    return cfg


def _padded(path, V):
    Vp = (V + 127) // 128 * 128
    if Vp > INT32_MAX:
        die("%s: vocab_size %d pads to %d, more than the model file's int32 header holds" % (path, V, Vp))
    return Vp


def _gpt2_config(path, conf):
    sizes = {k: _positive_int(path, k, conf.get(k))
             for k in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd")}
    C, NH = sizes["n_embd"], sizes["n_head"]
    if C % NH:
        die("%s: n_embd %d is not a multiple of n_head %d" % (path, C, NH))
    for key, accepted in _fixed_settings(C).items():
        if conf.get(key, accepted[0]) not in accepted:
            die("%s: %s is %r; the trainer computes GPT-2 with %r" % (path, key, conf[key], accepted[0]))
    V = sizes["vocab_size"]
    return _runnable(path, mf.Config(sizes["n_positions"], V, sizes["n_layer"], NH, C, _padded(path, V)))


LLAMA_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# What a config.json may leave out, as each class fills it in (transformers' LlamaConfig, Qwen2Config,
# Qwen3Config). head_dim None: hidden_size / num_attention_heads.
LLAMA_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "head_dim": None},
    "qwen2": {"max_position_embeddings": 32768, "head_dim": None, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "head_dim": 128, "sliding_window": 4096, "max_window_layers": 28},
}
COMMON_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                   "hidden_act": "silu", "num_key_value_heads": None}
# Keys that make a model mixture-of-experts (Mixtral's, Qwen2-MoE's and Qwen3-MoE's, DeepSeek's): a value
# other than null, 0 or false.
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "n_routed_experts", "n_shared_experts")
ROPE_KEYS = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _number(path, key, x):
    if type(x) not in (int, float) or not (math.isfinite(x) and x > 0):
        die("%s: %s is %r, not a positive number" % (path, key, x))
    return float(x)


def _rope(path, key, rs):
    """rope_scaling (or transformers 5's rope_parameters) -> LlamaConfig's rope keywords. Any kind but
    default, linear and llama3, and any key those do not read, is refused: it would change the frequencies."""
    if rs is None:
        return {}
    if not isinstance(rs, dict):
        die("%s: %s is %r, not an object" % (path, key, rs))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in ROPE_KEYS:
        die("%s: %s kind %r is not implemented (the trainer has default, linear and llama3)" % (path, key, kind))
    extra = [k for k in rs if k not in ROPE_KEYS[kind] + ("rope_type", "type", "rope_theta")]
    if extra:
        die("%s: %s.%s is not read by %s RoPE scaling, which the trainer implements" % (path, key, extra[0], kind))
    for k in ROPE_KEYS[kind]:
        if k not in rs:
            die("%s: %s.%s is missing (%s RoPE scaling needs it)" % (path, key, k, kind))
        _number(path, "%s.%s" % (key, k), rs[k])
    if kind == "linear":
        return {"rope_kind": mf.ROPE_LINEAR, "rope_factor": rs["factor"]}
    if kind == "llama3":
        if type(rs["original_max_position_embeddings"]) is not int:
            die("%s: %s.original_max_position_embeddings is %r, not an integer"
                % (path, key, rs["original_max_position_embeddings"]))
        return {"rope_kind": mf.ROPE_LLAMA3, "rope_factor": rs["factor"], "rope_low": rs["low_freq_factor"],
                "rope_high": rs["high_freq_factor"], "rope_orig": rs["original_max_position_embeddings"]}
    return {}


def _refuse_unimplemented(path, conf, kind, L, maxT):
    """One `error:` naming the first key that asks for what the trainer does not compute."""
    if conf.get("hidden_act", "silu") not in ("silu", "swish"):   # HF's swish is silu
        die("%s: hidden_act %r is not implemented (the trainer's MLP is SwiGLU with silu)" % (path, conf["hidden_act"]))
    # Qwen2's class always biases q, k and v and reads no attention_bias; Llama's and Qwen3's bias o_proj too.
    keys = ("mlp_bias",) if kind == "qwen2" else ("attention_bias", "mlp_bias")
    for key in keys:
        if conf.get(key) not in (None, False):
            die("%s: %s is %r; the trainer has no %s biases" % (path, key, conf[key],
                                                               "MLP" if key == "mlp_bias" else "o_proj"))
    for key in MOE_KEYS:
        if conf.get(key) not in (None, 0, False):
            die("%s: %s is %r: mixture-of-experts layers are not implemented" % (path, key, conf[key]))
    if conf.get("quantization_config") is not None:
        die("%s: quantization_config is set: quantized weights are not read" % path)
    if conf.get("partial_rotary_factor", 1.0) != 1.0:
        die("%s: partial_rotary_factor %r is not implemented (RoPE turns the whole head)"
            % (path, conf["partial_rotary_factor"]))
    layer_types = conf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != L or any(
            t not in ("full_attention", "sliding_attention") for t in layer_types)):
        die("%s: layer_types is %.200r, not %d entries full_attention or sliding_attention" % (path, layer_types, L))
    if conf.get("use_sliding_window"):
        window = conf.get("sliding_window", LLAMA_DEFAULTS[kind].get("sliding_window"))
        first = conf.get("max_window_layers", LLAMA_DEFAULTS[kind].get("max_window_layers", 0))
        sliding = ([l for l, t in enumerate(layer_types) if t == "sliding_attention"] if layer_types is not None
                   else list(range(first if type(first) is int else 0, L)))
        # A window as long as the model's context excludes no key, at any position the model reads.
        if window is not None and sliding and not (type(window) is int and window >= maxT):
            die("%s: use_sliding_window is true with sliding_window %r < max_position_embeddings %d in layers "
                "%s: sliding-window attention is not implemented" % (path, window, maxT, sliding[:4]))


def _llama_config(path, conf):
    kind = conf["model_type"]
    archs = conf.get("architectures")
    if archs is not None and archs != [LLAMA_ARCHS[kind]]:
        die("%s: architectures %.200r; a model_type %s model the trainer reads is %s"
            % (path, archs, kind, LLAMA_ARCHS[kind]))
    get = lambda key: conf.get(key, LLAMA_DEFAULTS[kind].get(key, COMMON_DEFAULTS.get(key)))
    V, C, F, L, NH = (_positive_int(path, k, conf.get(k)) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"))
    maxT = _positive_int(path, "max_position_embeddings", get("max_position_embeddings"))
    KV = NH if get("num_key_value_heads") is None else _positive_int(path, "num_key_value_heads",
                                                                     get("num_key_value_heads"))
    D = C // NH if get("head_dim") is None else _positive_int(path, "head_dim", get("head_dim"))
    if NH % KV:
        die("%s: num_key_value_heads %d does not divide num_attention_heads %d" % (path, KV, NH))
    if get("head_dim") is None and C % NH:
        die("%s: hidden_size %d is not a multiple of num_attention_heads %d, and there is no head_dim" % (path, C, NH))
    if kind == "qwen2" and D != C // NH:
        die("%s: head_dim %d is not hidden_size / num_attention_heads %d: transformers versions differ on which "
            "one Qwen2 uses" % (path, D, C // NH))
    if max(NH, KV) * D > INT32_MAX:
        die("%s: head_dim %d times %d heads is more than the model file's int32 sizes hold" % (path, D, NH))
    if type(get("tie_word_embeddings")) is not bool:
        die("%s: tie_word_embeddings is %r, not true or false" % (path, conf["tie_word_embeddings"]))
    _refuse_unimplemented(path, conf, kind, L, maxT)
    params = conf.get("rope_parameters")
    rope = _rope(path, "rope_parameters", params) if params is not None else _rope(path, "rope_scaling",
                                                                                       conf.get("rope_scaling"))
    if params is not None and conf.get("rope_scaling") is not None and _rope(path, "rope_scaling",
                                                                              conf["rope_scaling"]) != rope:
        die("%s: rope_scaling and rope_parameters disagree" % path)
    theta = (params or {}).get("rope_theta", get("rope_theta"))
    cfg = _runnable(path, mf.LlamaConfig(maxT, V, L, NH, C, _padded(path, V), KV, D, F,
                                         tied=get("tie_word_embeddings"), qk_norm=kind == "qwen3",
                                         qkv_bias=kind == "qwen2", theta=_number(path, "rope_theta", theta),
                                         eps=_number(path, "rms_norm_eps", get("rms_norm_eps")), **rope))
    err = cfg.error()
    if err:
        die("%s: %s" % (path, err))
    return cfg


def architecture(cfg):
    """(model_type, architecture) of cfg's Hugging Face class; dies if none computes it."""
    if not is_llama(cfg):
        return "gpt2", "GPT2LMHeadModel"
    if cfg.qk_norm and cfg.qkv_bias:
        die("%s: no Hugging Face class has both q/k norms (Qwen3) and q/k/v biases (Qwen2)" % cfg)
    if cfg.qkv_bias and cfg.D * cfg.NH != cfg.C:
        die("%s: a Qwen2 model's head_dim must be hidden_size / num_attention_heads (transformers versions "
            "differ on which one it uses)" % cfg)
    kind = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
    return kind, LLAMA_ARCHS[kind]


def f32_json(x):
    """A float32 header value as the shortest decimal that reads back as the same float32 (1e-05, not
    9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def config_to_hf(cfg, storage="fp32", bos=None, eos=None):
    """The config.json of cfg's Hugging Face class, its weights stored as storage (a STORAGE key); bos and
    eos token ids where known (GPT-2's are its end-of-text)."""
    torch_dtype = STORAGE[storage][1]
    if not is_llama(cfg):
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": cfg.V, "n_positions": cfg.maxT, "n_ctx": cfg.maxT, "n_embd": cfg.C,
                "n_layer": cfg.L, "n_head": cfg.NH, "n_inner": None, "activation_function": "gelu_new",
                "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
                "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": True,
                "summary_activation": None, "summary_proj_to_labels": True, "summary_first_dropout": 0.1,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "use_cache": True, "bos_token_id": GPT2_TOKEN,
                "eos_token_id": GPT2_TOKEN, "tie_word_embeddings": True, "torch_dtype": torch_dtype}
    kind, arch = architecture(cfg)
    rope = None
    if cfg.rope_kind == mf.ROPE_LINEAR:
        rope = {"rope_type": "linear", "factor": f32_json(cfg.rope_factor)}
    elif cfg.rope_kind == mf.ROPE_LLAMA3:
        rope = {"rope_type": "llama3", "factor": f32_json(cfg.rope_factor), "low_freq_factor": f32_json(cfg.rope_low),
                "high_freq_factor": f32_json(cfg.rope_high), "original_max_position_embeddings": cfg.rope_orig}
    conf = {"architectures": [arch], "model_type": kind, "vocab_size": cfg.V, "hidden_size": cfg.C,
            "intermediate_size": cfg.F, "num_hidden_layers": cfg.L, "num_attention_heads": cfg.NH,
            "num_key_value_heads": cfg.KV, "head_dim": cfg.D, "hidden_act": "silu",
            "max_position_embeddings": cfg.maxT, "rms_norm_eps": f32_json(cfg.eps),
            "rope_theta": f32_json(cfg.theta), "rope_scaling": rope, "tie_word_embeddings": bool(cfg.tied),
            "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True, "torch_dtype": torch_dtype,
            "bos_token_id": bos, "eos_token_id": eos}
    if kind == "llama":
        conf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:   # Qwen2's q/k/v biases come with its class: it has no attention_bias to set
        conf.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.L)
        if kind == "qwen3":
            conf["attention_bias"] = False
    return conf


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
