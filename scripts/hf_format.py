"""Shared by import_hf.py and export_hf.py: safetensors files, and the map between an llm.c model file and
a Hugging Face GPT-2 checkpoint (names, transposes, the padded vocabulary, config.json).

Written from the published formats. safetensors: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}} (space-padded so
the data starts 8-byte aligned), then the raw little-endian tensors, offsets relative to the data start.
Model files are read by scripts/reference.py's load_model and written in its format by save_model here.
The scripts that import this module first move scripts/ to the end of sys.path, because
scripts/tokenize.py would otherwise shadow the standard library's tokenize, which torch imports.
"""
import contextlib
import json
import os
import signal
import struct
from collections import namedtuple

import numpy as np

import reference as ref

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


die = ref.die   # one convention for every script: "error: ..." on stderr, exit 1
load_model = ref.load_model   # the model-file reader, with its header and size checks


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
        out = ref.bf16_bits_to_f32(entry.data.view("<u2"))
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


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, array)] written as F32 in that order, each converted (transposed views made contiguous)
    only as it is written, so a large model is not held twice."""
    header, offset = {"__metadata__": metadata}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + 4 * a.size]}
        offset += 4 * a.size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)   # 8 + len(text) is then a multiple of 8: the data starts aligned
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype="<f4").data)


def save_model(path, cfg, params, version):
    """reference.save_model's file (its header, its bf16 rounding), written a tensor at a time: for gpt2-xl
    that one concatenates and copies 6 GB twice more."""
    with atomic_file(path) as f:
        f.write(cfg.header(version).tobytes())
        for name in ref.NAMES:
            a = np.ascontiguousarray(params[name], dtype=np.float32)
            f.write((a if version == 3 else ref.f32_to_bf16_bits(a)).data)


# ------------------------------------------------------------------------------------------------------
# llm.c <-> Hugging Face GPT-2

def hf_names(cfg):
    """[(HF name, HF shape)] of every stored parameter, in GPT-2's state-dict order (no tied lm_head)."""
    C = cfg.C
    shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
              "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
              "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C),
              "mlp.c_proj.bias": (C,)}
    out = [("wte.weight", (cfg.V, C)), ("wpe.weight", (cfg.maxT, C))]
    out += [("h.%d.%s" % (l, hf), shapes[hf]) for l in range(cfg.L) for _, hf, _ in LAYER]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def to_hf(cfg, params):
    """llm.c tensors -> [(HF name, array)]: layers unstacked, Conv1D weights transposed, wte cut to V rows
    (llm.c's padding rows are never looked up, and HF's vocabulary is the real one)."""
    out = [("wte.weight", params["wte"][:cfg.V]), ("wpe.weight", params["wpe"])]
    for l in range(cfg.L):
        out += [("h.%d.%s" % (l, hf), params[name][l].T if transposed else params[name][l])
                for name, hf, transposed in LAYER]
    return out + [("ln_f.weight", params["lnfw"]), ("ln_f.bias", params["lnfb"])]


def from_hf(cfg, get):
    """get(HF name) -> float32 array of its HF shape. Returns llm.c's tensors: stacked, transposed back,
    wte padded to Vp with zero rows (inert: the trainer never looks them up and masks their logits)."""
    wte = np.zeros((cfg.Vp, cfg.C), np.float32)
    wte[:cfg.V] = get("wte.weight")
    params = {"wte": wte, "wpe": get("wpe.weight"), "lnfw": get("ln_f.weight"), "lnfb": get("ln_f.bias")}
    shapes = dict(zip(ref.NAMES, cfg.shapes()))
    for name, hf, transposed in LAYER:
        params[name] = np.empty(shapes[name], np.float32)   # filled layer by layer: one copy in memory
        for l in range(cfg.L):
            a = get("h.%d.%s" % (l, hf))
            params[name][l] = a.T if transposed else a
    return params


# ------------------------------------------------------------------------------------------------------
# config.json

def _fixed_settings(C):
    """config.json settings the trainer's forward has no choice in: key -> accepted values (HF's default
    first). gelu_pytorch_tanh is the same tanh approximation as gelu_new."""
    return {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
            "n_inner": (None, 4 * C), "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
            "add_cross_attention": (False,), "tie_word_embeddings": (True,)}


def config_from_hf(path):
    """config.json -> reference.Config; dies if it is not a GPT-2 config this trainer computes the same way."""
    try:
        with open(path, "rb") as f:
            conf = load_json(path, f.read())
    except OSError as e:
        die("%s: cannot read (%s)" % (path, e.strerror))
    if not isinstance(conf, dict) or conf.get("model_type") != "gpt2":
        die("%s: model_type %r is not gpt2" % (path, conf.get("model_type") if isinstance(conf, dict) else conf))
    sizes = {}
    for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd"):
        if type(conf.get(key)) is not int or conf[key] <= 0:
            die("%s: %s is %r, not a positive integer" % (path, key, conf.get(key)))
        if conf[key] > INT32_MAX:
            die("%s: %s is %d, more than the model file's int32 header holds" % (path, key, conf[key]))
        sizes[key] = conf[key]
    C, NH = sizes["n_embd"], sizes["n_head"]
    if C % NH:
        die("%s: n_embd %d is not a multiple of n_head %d" % (path, C, NH))
    for key, accepted in _fixed_settings(C).items():
        if conf.get(key, accepted[0]) not in accepted:
            die("%s: %s is %r; the trainer computes GPT-2 with %r" % (path, key, conf[key], accepted[0]))
    V = sizes["vocab_size"]
    Vp = (V + 127) // 128 * 128
    if Vp > INT32_MAX:
        die("%s: vocab_size %d pads to %d, more than the model file's int32 header holds" % (path, V, Vp))
    return ref.Config(sizes["n_positions"], V, sizes["n_layer"], NH, C, Vp)


def hf_numel(cfg):
    """Parameters a Hugging Face checkpoint of cfg stores (wte has V rows there, not Vp), in Python integers:
    config.json's sizes are unchecked, and numpy's int64 products would wrap."""
    C = cfg.C
    return (cfg.V + cfg.maxT + 2) * C + cfg.L * (12 * C * C + 13 * C)


def config_to_hf(cfg):
    """The config.json of GPT2LMHeadModel for cfg, with GPT-2's usual keys (dropouts as in OpenAI's models)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": cfg.V, "n_positions": cfg.maxT, "n_ctx": cfg.maxT, "n_embd": cfg.C,
            "n_layer": cfg.L, "n_head": cfg.NH, "n_inner": None, "activation_function": "gelu_new",
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": True,
            "summary_activation": None, "summary_proj_to_labels": True, "summary_first_dropout": 0.1,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "use_cache": True, "bos_token_id": GPT2_TOKEN,
            "eos_token_id": GPT2_TOKEN, "tie_word_embeddings": True, "torch_dtype": "float32"}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
