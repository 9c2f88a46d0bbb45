"""Shared by import_hf.py and export_hf.py: safetensors files, and the map between an llm.c model file and
a Hugging Face GPT-2 checkpoint (names, transposes, the padded vocabulary, config.json).

Written from the published formats. safetensors: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}} (space-padded so
the data starts 8-byte aligned), then the raw little-endian tensors, offsets relative to the data start.
Model files are read by scripts/reference.py's load_model and written in its format by save_model here.
The scripts that import this module first move scripts/ to the end of sys.path, because
scripts/tokenize.py would otherwise shadow the standard library's tokenize, which torch imports.
"""
import json
import math
import os
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
# Byte size of each safetensors dtype we decode; anything else is refused when a parameter needs it.
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
GPT2_TOKEN = 50256   # <|endoftext|>: GPT-2's bos and eos


die = ref.die   # one convention for every script: "error: ..." on stderr, exit 1
load_model = ref.load_model   # the model-file reader, with its header and size checks


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
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        die("%s: header is not JSON (%s)" % (path, e))
    if not isinstance(header, dict):
        die("%s: header is not a JSON object" % path)
    return header, 8 + n


def _check_entry(path, name, e, data_size):
    """Offsets inside the data and, for a dtype we know, a byte count that matches the shape."""
    try:
        dtype, shape = str(e["dtype"]), [int(d) for d in e["shape"]]
        begin, end = (int(o) for o in e["data_offsets"])
    except (KeyError, TypeError, ValueError):
        die("%s: tensor %s has a malformed header entry %r" % (path, name, e))
    if not 0 <= begin <= end <= data_size or min(shape, default=0) < 0:
        die("%s: tensor %s has offsets [%d, %d) outside the %d data bytes" % (path, name, begin, end, data_size))
    if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        die("%s: tensor %s has %d bytes for %s shape %s" % (path, name, end - begin, dtype, shape))
    return dtype, tuple(shape), begin, end


def read_safetensors(path):
    """Returns {name: Entry}. The data is memory-mapped and decoded only on demand (decode), so a
    checkpoint may hold buffers in dtypes no parameter uses (the boolean attention masks) and a large model is
    not read twice."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header, start = _parse_header(path, size, f)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start) if size > start else np.zeros(0, np.uint8)
    entries = {}
    for name, e in header.items():
        if name != "__metadata__":
            dtype, shape, begin, end = _check_entry(path, name, e, data.size)
            entries[name] = Entry(dtype, shape, data[begin:end])
    return entries


def decode(path, name, entry):
    """One tensor as float32 (F16 and BF16 widen exactly); dies naming it if its dtype is not a float we read."""
    if entry.dtype == "F32":
        out = entry.data.view("<f4").astype(np.float32)
    elif entry.dtype == "F16":
        out = entry.data.view("<f2").astype(np.float32)
    elif entry.dtype == "BF16":
        out = ref.bf16_bits_to_f32(entry.data.view("<u2"))
    else:
        die("%s: tensor %s has dtype %s; supported: F32, F16, BF16" % (path, name, entry.dtype))
    return out.reshape(entry.shape)


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, array)] written as F32 in that order, each converted (transposed views made contiguous)
    only as it is written, so a large model is not held twice. Atomic (tmp + rename), like save_model."""
    header, offset = {"__metadata__": metadata}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + 4 * a.size]}
        offset += 4 * a.size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)   # 8 + len(text) is then a multiple of 8: the data starts aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, a in tensors:
            np.ascontiguousarray(a, dtype="<f4").tofile(f)
    os.replace(tmp, path)


def save_model(path, cfg, params, version):
    """reference.save_model's file (its header, its bf16 rounding), written a tensor at a time: for gpt2-xl
    that one concatenates and copies 6 GB twice more. Atomic (tmp + rename)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(cfg.header(version).tobytes())
        for name in ref.NAMES:
            a = np.ascontiguousarray(params[name], dtype=np.float32)
            (a if version == 3 else ref.f32_to_bf16_bits(a)).tofile(f)
    os.replace(tmp, path)


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
        with open(path) as f:
            conf = json.load(f)
    except (OSError, ValueError) as e:
        die("%s: cannot read (%s)" % (path, e))
    if not isinstance(conf, dict) or conf.get("model_type") != "gpt2":
        die("%s: model_type %r is not gpt2" % (path, conf.get("model_type") if isinstance(conf, dict) else conf))
    sizes = {}
    for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd"):
        if type(conf.get(key)) is not int or conf[key] <= 0:
            die("%s: %s is %r, not a positive integer" % (path, key, conf.get(key)))
        sizes[key] = conf[key]
    C, NH = sizes["n_embd"], sizes["n_head"]
    if C % NH:
        die("%s: n_embd %d is not a multiple of n_head %d" % (path, C, NH))
    for key, accepted in _fixed_settings(C).items():
        if conf.get(key, accepted[0]) not in accepted:
            die("%s: %s is %r; the trainer computes GPT-2 with %r" % (path, key, conf[key], accepted[0]))
    V = sizes["vocab_size"]
    return ref.Config(sizes["n_positions"], V, sizes["n_layer"], NH, C, (V + 127) // 128 * 128)


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
