"""GPT-2 for the scripts (core/models/gpt2/family.c is the trainer's): the model file's tensors and header,
the -e spec, the map to and from Hugging Face's GPT2LMHeadModel and its config.json, and the reference
forward that scripts/reference.py runs. Registered in families/__init__.py."""
import math
import re
import sys

import numpy as np

import hf_format as hf
import model_file as mf

NAME, TITLE, FILE_ID = "gpt2", "GPT-2", 0   # FILE_ID: header slot 8, which llm.c's own files leave 0
HF_MODEL_TYPES = ("gpt2",)
die = mf.die

# ------------------------------------------------------------------------------------------------------
# The model file

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# Decoupled weight decay touches only the matrices; biases and LayerNorm parameters are exempt (llm.c rule).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
# A random model's values, as the trainer's kinds have them: N(0, 0.02), the residual projections'
# N(0, 0.02 / sqrt(2L)), LayerNorm weights 1, biases 0.
INIT = {"wte": mf.INIT_NORMAL, "wpe": mf.INIT_NORMAL, "qkvw": mf.INIT_NORMAL, "fcw": mf.INIT_NORMAL,
        "attprojw": mf.INIT_RESIDUAL, "fcprojw": mf.INIT_RESIDUAL,
        "ln1w": mf.INIT_ONES, "ln2w": mf.INIT_ONES, "lnfw": mf.INIT_ONES}


class Config:
    family, file_id, names, decayed = NAME, FILE_ID, NAMES, DECAYED
    vocab_tensors = ("wte",)   # Vp rows, of which the trainer looks up and scores only the first V

    def __init__(self, maxT, V, L, NH, C, Vp):
        self.maxT, self.V, self.L, self.NH, self.C, self.Vp = maxT, V, L, NH, C, Vp

    @property
    def head_size(self):
        return self.C // self.NH

    def init(self, name):
        return INIT.get(name, mf.INIT_ZEROS)

    def shapes(self):
        maxT, L, C, Vp = self.maxT, self.L, self.C, self.Vp
        return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
                (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]

    def numel(self):
        return mf.numel(self)

    def header(self, version):
        return mf.header(self, version)   # llm.c's: slot 8 (FILE_ID) and every later slot 0

    def error(self):
        """What makes this an impossible model, or None."""
        if min(self.maxT, self.V, self.L, self.NH, self.C, self.Vp) <= 0 or self.Vp < self.V or self.C % self.NH:
            return "sizes must be positive, Vp >= V and C divisible by NH"
        return None

    def trainer_error(self):
        """The trainer's rule for this family beyond hf_format.trainer_shape_error's, or None."""
        return None

    def __repr__(self):
        return "L%d C%d NH%d V%d Vp%d maxT%d" % (self.L, self.C, self.NH, self.V, self.Vp, self.maxT)


def config_from_header(path, h):
    cfg = Config(*(int(x) for x in h[2:8]))
    if cfg.error():
        die("%s: inconsistent model header maxT=%d V=%d L=%d NH=%d C=%d Vp=%d"
            % (path, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp))
    return cfg


# ------------------------------------------------------------------------------------------------------
# -e: the trainer's grammar (core/models/gpt2/family.c's parse_spec)

PRESETS = {"d12": (12, 768, 12), "d24": (24, 1024, 16), "d36": (36, 1280, 20), "d48": (48, 1600, 25)}
SPEC_KEYS = "LCHVT"
SPEC_DEFAULTS = {"V": 50257, "T": 1024}


def parse_spec(spec):
    """'d12' | 'd24' | 'd36' | 'd48' (GPT-2 124M to 1558M, maxT 1024, V 50257), or L<n>C<n>H<n>[V<n>][T<n>] in
    any order, each once, such as L2C64H4V512T64 -> Config (V padded to a multiple of 128); None when spec is
    not GPT-2's (it does not start L and a digit). A GPT-2 spec that does not parse is refused here."""
    if spec in PRESETS:
        L, C, NH = PRESETS[spec]
        return Config(1024, 50257, L, NH, C, mf.padded_vocab(50257))
    if not re.match(r"L[0-9]", spec):
        return None
    got = {}
    for key, digits in re.findall(r"(.)([0-9]*)", spec, re.S):
        if not digits or not 0 < int(digits) <= 1 << 30:
            die("-e %r: expected L<n>C<n>H<n>[V<n>][T<n>] with every n from 1 to 2^30" % spec)
        if key in got:
            die("-e %r: '%s' is given twice" % (spec, key))
        if key not in SPEC_KEYS:
            die("-e %r: unknown field '%s' (expected L<n>C<n>H<n>[V<n>][T<n>])" % (spec, key))
        got[key] = int(digits)
    if "C" not in got or "H" not in got:
        die("-e %r: L, C and H are required" % spec)
    n = dict(SPEC_DEFAULTS, **got)
    cfg = Config(n["T"], n["V"], n["L"], n["H"], n["C"], mf.padded_vocab(n["V"]))
    if cfg.error():
        die("-e %r: need C divisible by H" % spec)
    return cfg


# ------------------------------------------------------------------------------------------------------
# Hugging Face GPT2LMHeadModel

# Per-layer tensors: llm.c name, Hugging Face name under h.{l}., and whether HF stores it transposed
# (GPT-2's Conv1D keeps weights as (in, out) and computes x @ W + b; llm.c keeps (out, in)).
LAYER = [("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
         ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
         ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
         ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
         ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
         ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False)]
HF_PREFIX = "transformer."
# Buffers some HF versions store, not parameters: the causal mask and its fill value.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
GPT2_TOKEN = 50256   # <|endoftext|>: GPT-2's bos and eos


def hf_names(cfg):
    """[(HF name, HF shape)] of every stored parameter, in GPT-2's state-dict order (no tied lm_head)."""
    C = cfg.C
    shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
              "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
              "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C),
              "mlp.c_proj.bias": (C,)}
    out = [("wte.weight", (cfg.V, C)), ("wpe.weight", (cfg.maxT, C))]
    out += [("h.%d.%s" % (l, hf_name), shapes[hf_name]) for l in range(cfg.L) for _, hf_name, _ in LAYER]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def to_hf(cfg, params):
    """llm.c tensors -> [(HF name, array)]: layers unstacked, Conv1D weights transposed, wte cut to V rows
    (llm.c's padding rows are never looked up, and HF's vocabulary is the real one)."""
    out = [("wte.weight", params["wte"][:cfg.V]), ("wpe.weight", params["wpe"])]
    for l in range(cfg.L):
        out += [("h.%d.%s" % (l, hf_name), params[name][l].T if transposed else params[name][l])
                for name, hf_name, transposed in LAYER]
    return out + [("ln_f.weight", params["lnfw"]), ("ln_f.bias", params["lnfb"])]


def from_hf(cfg, get):
    """get(HF name) -> float32 array of its HF shape. Returns llm.c's tensors: stacked, transposed back,
    wte padded to Vp with zero rows (inert: the trainer never looks them up and masks their logits)."""
    params = {"wte": hf.padded_vocab(cfg, get("wte.weight")), "wpe": get("wpe.weight"), "lnfw": get("ln_f.weight"),
              "lnfb": get("ln_f.bias")}
    shapes = dict(zip(NAMES, cfg.shapes()))
    for name, hf_name, transposed in LAYER:
        params[name] = np.empty(shapes[name], np.float32)   # filled layer by layer: one copy in memory
        for l in range(cfg.L):
            a = get("h.%d.%s" % (l, hf_name))
            params[name][l] = a.T if transposed else a
    return params


def canonical_name(name):
    """The name hf_names uses for a stored tensor: GPT2LMHeadModel's `transformer.` prefix dropped."""
    return name[len(HF_PREFIX):] if name.startswith(HF_PREFIX) else name


def ignored(name):
    return name.endswith(IGNORED_SUFFIXES)


def hf_numel(cfg):
    """Parameters a Hugging Face checkpoint of cfg stores (wte has V rows there, not Vp), in Python integers:
    config.json's sizes are unchecked, and numpy's int64 products would wrap."""
    C, L = cfg.C, cfg.L
    return (cfg.V + cfg.maxT + 2) * C + L * (12 * C * C + 13 * C)


def _fixed_settings(C):
    """config.json settings the trainer's forward has no choice in: key -> accepted values (HF's default
    first). gelu_pytorch_tanh is the same tanh approximation as gelu_new."""
    return {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
            "n_inner": (None, 4 * C), "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
            "add_cross_attention": (False,), "tie_word_embeddings": (True,)}


def config_from_hf(path, conf):
    """config.json (a dict of model_type gpt2) -> Config; dies, naming the key, unless the trainer computes it."""
    sizes = {k: hf.positive_int(path, k, conf.get(k))
             for k in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd")}
    C, NH = sizes["n_embd"], sizes["n_head"]
    if C % NH:
        die("%s: n_embd %d is not a multiple of n_head %d" % (path, C, NH))
    for key, accepted in _fixed_settings(C).items():
        if conf.get(key, accepted[0]) not in accepted:
            die("%s: %s is %r; the trainer computes GPT-2 with %r" % (path, key, conf[key], accepted[0]))
    V = sizes["vocab_size"]
    return hf.runnable(path, Config(sizes["n_positions"], V, sizes["n_layer"], NH, C, hf.padded(path, V)))


def architecture(cfg):
    """(model_type, architecture) of cfg's Hugging Face class."""
    return "gpt2", "GPT2LMHeadModel"


def hf_config(cfg, torch_dtype, bos=None, eos=None):
    """GPT2LMHeadModel's config.json; bos and eos are always GPT-2's end-of-text (TOKEN_IDS)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": cfg.V, "n_positions": cfg.maxT, "n_ctx": cfg.maxT, "n_embd": cfg.C,
            "n_layer": cfg.L, "n_head": cfg.NH, "n_inner": None, "activation_function": "gelu_new",
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": True,
            "summary_activation": None, "summary_proj_to_labels": True, "summary_first_dropout": 0.1,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "use_cache": True, "bos_token_id": GPT2_TOKEN,
            "eos_token_id": GPT2_TOKEN, "tie_word_embeddings": True, "torch_dtype": torch_dtype}


# import_hf.py: why a stored lm_head.weight must equal wte.weight; tensors beyond GPT-2's are reported and
# skipped (HF versions store buffers of their own).
TIED_WHY = "only tied heads are supported"


def extra_tensors(cfg, path, names):
    print("warning: %s: ignored %d tensors not in GPT-2: %s" % (path, len(names), ", ".join(names[:3])),
          file=sys.stderr)


# export_hf.py: the bos and eos ids (GPT-2's end-of-text, whatever the flags say), the tokenizer files it
# writes from data/tokenizer/ without --tokenizer (ours -> Hugging Face's name), and what it says of them.
TOKEN_IDS = (GPT2_TOKEN, GPT2_TOKEN)
TOKENIZER_FILES = [("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")]


def tokenizer_note(cfg):
    if cfg.V != GPT2_TOKEN + 1:
        return ("warning: vocabulary %d is not GPT-2's %d; vocab.json and merges.txt are GPT-2's tokenizer"
                % (cfg.V, GPT2_TOKEN + 1))
    return None


# ------------------------------------------------------------------------------------------------------
# LoRA: the linear layers an adapter may target, in the trainer's order (-lora-targets; bit i of the adapter
# file's target_bits is target i). GPT-2's c_attn is one target, as PEFT makes it. Each: our name, the module
# under LORA_LAYER, PEFT's target_modules entry (the suffix that matches this module alone: c_proj names two),
# in and out features, and where the weight's rows are: the model file tensor and first row, the reference
# forward's matmul (the group) and its first output column.

# PEFT's flag for a Conv1D base layer (W stored (in, out)); A and B keep nn.Linear's shapes either way.
LORA_FAN_IN_FAN_OUT = True
LORA_LAYER = "transformer.h.%d."


def lora_targets(cfg):
    C = cfg.C
    return [("qkv", "attn.c_attn", "c_attn", C, 3 * C, "qkvw", 0, "qkv", 0),
            ("proj", "attn.c_proj", "attn.c_proj", C, C, "attprojw", 0, "proj", 0),
            ("fc", "mlp.c_fc", "c_fc", C, 4 * C, "fcw", 0, "fc", 0),
            ("fcproj", "mlp.c_proj", "mlp.c_proj", 4 * C, C, "fcprojw", 0, "fcproj", 0)]


# ------------------------------------------------------------------------------------------------------
# The reference forward, which scripts/reference.py's Model runs on its parameters (model.p, the file's
# tensors). PyTorch is imported by the functions that need it: the Hugging Face scripts read this module
# without it.

def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)   # biased variance, as GPT-2 / llm.c
    return (x - mean) * (var + 1e-5).rsqrt() * w + b


def gelu(x):
    return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)).tanh())


def reference_attention(model, qkv, B, T, doc=None):
    C, NH = model.cfg.C, model.cfg.NH
    hs = C // NH
    # Packed [q | k | v]; head h owns channels h*hs .. (h+1)*hs of each.
    q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
    return model.attention(q, k, v, doc).transpose(1, 2).reshape(B, T, C)


def reference_logits(model, idx, pos=None, doc=None):
    """Logits over all Vp rows of the tied head; pos, doc (B, T): each token's position in its document
    (its row of wpe) and the row index of its document's first token (None: the row is one document).
    model.fast (bench only): PyTorch's fused LayerNorm and GELU instead of the spelled-out math, which in
    eager mode costs a kernel per elementwise op."""
    import torch.nn.functional as F
    p, cfg = model.p, model.cfg
    ln = (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)) if model.fast else layernorm
    act = (lambda x: F.gelu(x, approximate="tanh")) if model.fast else gelu
    B, T = idx.shape
    x = p["wte"][idx] + (p["wpe"][:T] if pos is None else p["wpe"][pos])
    for l in range(cfg.L):
        h = ln(x, p["ln1w"][l], p["ln1b"][l])
        qkv = model.adapt(l, "qkv", h, h @ p["qkvw"][l].t() + p["qkvb"][l])
        y = reference_attention(model, qkv, B, T, doc)
        x = x + model.adapt(l, "proj", y, y @ p["attprojw"][l].t() + p["attprojb"][l])
        h = ln(x, p["ln2w"][l], p["ln2b"][l])
        h = act(model.adapt(l, "fc", h, h @ p["fcw"][l].t() + p["fcb"][l]))
        x = x + model.adapt(l, "fcproj", h, h @ p["fcprojw"][l].t() + p["fcprojb"][l])
    x = ln(x, p["lnfw"], p["lnfb"])
    return x @ p["wte"].t()


# The reference reads no GPT-2 Hugging Face folder itself (its checks go through model files).
reference_hf_config = reference_hf_params = None
