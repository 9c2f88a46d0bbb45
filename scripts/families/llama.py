"""The Llama family for the scripts (core/models/llama/family.c is the trainer's): Llama 3.x and SmolLM2,
Qwen3 (q/k norms) and Qwen2 (q/k/v biases). The model file's tensors and header fields, the -e spec, the map
to and from Hugging Face's LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM and their config.json,
and the reference forward that scripts/reference.py runs. Registered in families/__init__.py."""
import math
import re

import numpy as np

import hf_format as hf
import model_file as mf

NAME, TITLE, FILE_ID = "llama", "llama", 1   # FILE_ID: header slot 8
HF_MODEL_TYPES = ("llama", "qwen2", "qwen3")
die = mf.die

# ------------------------------------------------------------------------------------------------------
# The model file

# bq and bkv exist only with the q/k/v bias flag (Qwen2), q_norm / k_norm only with qk_norm, lm_head only
# when the head is not tied to wte. wq and wkv (k rows, then v rows) are stored apart, each stacked over
# layers; a layer's q|k|v projection is their rows concatenated, and bq, bkv (k, then v) are its bias.
NAMES = ["wte", "attn_norm", "wq", "wkv", "bq", "bkv", "q_norm", "k_norm", "attn_proj", "mlp_norm", "gate_up",
         "down", "final_norm", "lm_head"]
DECAYED = {"wte", "wq", "wkv", "attn_proj", "gate_up", "down", "lm_head"}
# A random model's values, as the trainer's kinds have them: the matrices N(0, 0.02), the residual
# projections N(0, 0.02 / sqrt(2L)), the norms 1, the q/k/v biases 0.
INIT = {"wte": mf.INIT_NORMAL, "wq": mf.INIT_NORMAL, "wkv": mf.INIT_NORMAL, "gate_up": mf.INIT_NORMAL,
        "lm_head": mf.INIT_NORMAL, "attn_proj": mf.INIT_RESIDUAL, "down": mf.INIT_RESIDUAL,
        "bq": mf.INIT_ZEROS, "bkv": mf.INIT_ZEROS}
ROPE_NONE, ROPE_LINEAR, ROPE_LLAMA3 = 0, 1, 2


class Config:
    family, file_id, decayed = NAME, FILE_ID, DECAYED

    def __init__(self, maxT, V, L, NH, C, Vp, KV, D, F, tied=False, qk_norm=False, theta=10000.0, eps=1e-5,
                 rope_kind=ROPE_NONE, rope_factor=1.0, rope_low=0.0, rope_high=0.0, rope_orig=0, qkv_bias=False):
        self.maxT, self.V, self.L, self.NH, self.C, self.Vp = maxT, V, L, NH, C, Vp
        self.KV, self.D, self.F, self.tied, self.qk_norm = KV, D, F, int(tied), int(qk_norm)
        self.qkv_bias = int(qkv_bias)
        self.rope_kind, self.rope_orig = rope_kind, rope_orig
        # The file holds these as float32: a model made from a spec must compute what its saved file will.
        # rope_factor is 1 without scaling, as the trainer writes it, so that both write the same header.
        self.theta, self.eps = mf.f32(theta), mf.f32(eps)
        self.rope_factor, self.rope_low, self.rope_high = mf.f32(rope_factor), mf.f32(rope_low), mf.f32(rope_high)

    @property
    def names(self):
        return [n for n in NAMES if (self.qk_norm or n not in ("q_norm", "k_norm"))
                and (not self.tied or n != "lm_head") and (self.qkv_bias or n not in ("bq", "bkv"))]

    @property
    def vocab_tensors(self):   # Vp rows, of which the trainer looks up and scores only the first V
        return ("wte",) if self.tied else ("wte", "lm_head")

    @property
    def head_size(self):
        return self.D

    def init(self, name):
        return INIT.get(name, mf.INIT_ONES)

    def shapes(self):
        Vp, L, NH, C, KV, D, F_ = self.Vp, self.L, self.NH, self.C, self.KV, self.D, self.F
        every = {"wte": (Vp, C), "attn_norm": (L, C), "wq": (L, NH * D, C), "wkv": (L, 2 * KV * D, C),
                 "bq": (L, NH * D), "bkv": (L, 2 * KV * D), "q_norm": (L, D),
                 "k_norm": (L, D), "attn_proj": (L, C, NH * D), "mlp_norm": (L, C), "gate_up": (L, 2 * F_, C),
                 "down": (L, C, F_), "final_norm": (C,), "lm_head": (Vp, C)}
        return [every[n] for n in self.names]

    def numel(self):
        return mf.numel(self)

    def header(self, version):
        """Slots 9..21: KV, D, F, tied, qk_norm, the RoPE scaling kind, then theta, eps and the scaling's
        factor, low and high frequency factors as float32 bits, its original context length, and qkv_bias."""
        h = mf.header(self, version)
        h[9:15] = [self.KV, self.D, self.F, self.tied, self.qk_norm, self.rope_kind]
        h[15:20] = np.array([self.theta, self.eps, self.rope_factor, self.rope_low, self.rope_high],
                            dtype=np.float32).view(np.int32)
        h[20], h[21] = self.rope_orig, self.qkv_bias
        return h

    @staticmethod
    def from_header(h):
        fl = [float(x) for x in h[15:20].copy().view(np.float32)]
        return Config(*(int(x) for x in h[2:8]), KV=int(h[9]), D=int(h[10]), F=int(h[11]), tied=int(h[12]),
                      qk_norm=int(h[13]), theta=fl[0], eps=fl[1], rope_kind=int(h[14]), rope_factor=fl[2],
                      rope_low=fl[3], rope_high=fl[4], rope_orig=int(h[20]), qkv_bias=int(h[21]))

    def error(self):
        """What makes this an impossible model, or None."""
        if min(self.maxT, self.V, self.L, self.NH, self.C, self.Vp, self.KV, self.D, self.F) <= 0 or self.Vp < self.V:
            return "sizes must be positive and Vp >= V"
        if self.NH % self.KV:
            return "kv heads %d do not divide query heads %d" % (self.KV, self.NH)
        if self.D % 2:
            return "head_dim %d is odd (RoPE rotates pairs)" % self.D
        if self.tied not in (0, 1) or self.qk_norm not in (0, 1) or self.qkv_bias not in (0, 1):
            return "tied head, qk_norm and the attention bias flag are 0 or 1"
        if not (math.isfinite(self.theta) and self.theta > 0 and math.isfinite(self.eps) and self.eps > 0):
            return "rope_theta %g and RMSNorm eps %g must be positive and finite" % (self.theta, self.eps)
        if self.rope_kind not in (ROPE_NONE, ROPE_LINEAR, ROPE_LLAMA3):
            return "rope scaling kind %d (0 none, 1 linear, 2 llama3)" % self.rope_kind
        if self.rope_kind != ROPE_NONE and not (math.isfinite(self.rope_factor) and self.rope_factor > 0):
            return "rope factor %g must be positive" % self.rope_factor
        if self.rope_kind == ROPE_LLAMA3 and not (0 < self.rope_low < self.rope_high and math.isfinite(self.rope_high)
                                                 and self.rope_orig > 0):
            return ("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                    "original_max_position_embeddings > 0 (got %g, %g, %d)"
                    % (self.rope_low, self.rope_high, self.rope_orig))
        return None

    def trainer_error(self):
        """The trainer's rule for this family beyond hf_format.trainer_shape_error's, or None."""
        return "hidden_size %d must be a multiple of 8" % self.C if self.C % 8 else None

    def inv_freq(self):
        return rope_inv_freq(self.D, self.theta, self.rope_kind, self.rope_factor, self.rope_low, self.rope_high,
                             self.rope_orig)

    def __repr__(self):
        if self.rope_kind == ROPE_NONE:
            rope = ""
        elif self.rope_kind == ROPE_LINEAR:
            rope = " rope-linear%g" % self.rope_factor
        elif self.rope_kind == ROPE_LLAMA3:
            rope = " rope-llama3%g/%g/%g/%d" % (self.rope_factor, self.rope_low, self.rope_high, self.rope_orig)
        else:
            rope = " rope-kind%d" % self.rope_kind
        return ("llama L%d C%d NH%d KV%d D%d F%d V%d Vp%d maxT%d theta%g eps%g%s%s%s%s"
                % (self.L, self.C, self.NH, self.KV, self.D, self.F, self.V, self.Vp, self.maxT, self.theta,
                   self.eps, " tied" if self.tied else "", " qknorm" if self.qk_norm else "",
                   " qkvbias" if self.qkv_bias else "", rope))


def config_from_header(path, h):
    cfg = Config.from_header(h)
    err = cfg.error()
    if err:
        die("%s: inconsistent llama model header (%s): %s" % (path, cfg, err))
    return cfg


def rope_inv_freq(D, theta, kind=ROPE_NONE, factor=1.0, low=1.0, high=4.0, orig=8192):
    """RoPE's D/2 inverse frequencies in float64: Hugging Face's default table, then its 'linear' or 'llama3'
    rescaling (_compute_llama3_parameters: long wavelengths slowed by the factor, short ones kept, a linear
    blend between)."""
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if kind == ROPE_LINEAR:
        return inv / factor
    if kind == ROPE_LLAMA3:
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - low) / (high - low)
        blend = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wavelen > orig / low, inv / factor, np.where(wavelen < orig / high, inv, blend))
    return inv


# ------------------------------------------------------------------------------------------------------
# -e: the trainer's grammar (core/models/llama/family.c's parse_spec), its numbers read as C's strtod and
# sscanf read them

# The published configurations (their config.json files on the Hugging Face hub): L, C, heads, kv heads, head
# size, MLP width, V, maxT, rope_theta, RMSNorm eps, tied, q/k norms, and the llama3 RoPE factor (low 1, high
# 4, original 8192) or 0.
NAMED = {
    "smollm2-135m": (30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0, 1e-5, 1, 0, 0),
    "smollm2-360m": (32, 960, 15, 5, 64, 2560, 49152, 8192, 100000.0, 1e-5, 1, 0, 0),
    "smollm2-1.7b": (24, 2048, 32, 32, 64, 8192, 49152, 8192, 130000.0, 1e-5, 1, 0, 0),
    "llama3.2-1b": (16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0, 1e-5, 1, 0, 32.0),
    "llama3.2-3b": (28, 3072, 24, 8, 128, 8192, 128256, 131072, 500000.0, 1e-5, 1, 0, 32.0),
    "llama3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0, 1e-5, 0, 0, 8.0),
    "qwen3-0.6b": (28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 1e-6, 1, 1, 0),
    "qwen3-1.7b": (28, 2048, 16, 8, 128, 6144, 151936, 40960, 1000000.0, 1e-6, 1, 1, 0),
}
SPEC_SYNTAX = ("llama: then comma-separated L<n> C<n> H<n> K<n> D<n> F<n> V<n> T<n> theta<x> eps<x> tied qknorm "
               "qkvbias rope-linear<f> rope-llama3<f>/<low>/<high>/<orig>")
SPEC_MAX = 511   # characters after llama:, as the trainer's buffer holds them
INT, NUMBER, FLAG, SCALING = range(4)
# Each field: its name (an integer's letter, digits following; a number's or a scaling's prefix; a flag
# whole), its kind, and what it sets: a thing set twice, by one field or two, is refused.
SPEC_FIELDS = [("L", INT, "L"), ("C", INT, "C"), ("H", INT, "H"), ("F", INT, "F"), ("K", INT, "K"),
               ("D", INT, "D"), ("V", INT, "V"), ("T", INT, "T"), ("theta", NUMBER, "theta"),
               ("eps", NUMBER, "eps"), ("tied", FLAG, "tied"), ("qknorm", FLAG, "qknorm"),
               ("qkvbias", FLAG, "qkvbias"), ("rope-linear", SCALING, "rope"), ("rope-llama3", SCALING, "rope")]
NUMBER_NAMES = {"theta": "rope_theta", "eps": "RMSNorm eps", "rope-linear": "the rope-linear factor"}
# strtod's numbers (strtof's are the same text): hexadecimal, decimal, infinity, NaN, after white space.
C_HEX = r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
C_DECIMAL = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity)"
C_NAN = r"[+-]?(?i:nan)(?:\([0-9A-Za-z_]*\))?"
C_FLOAT = "(?:%s|%s|%s)" % (C_HEX, C_DECIMAL, C_NAN)
C_NUMBER = re.compile(r"[ \t\n\v\f\r]*(?:(%s)|(%s)|(%s))" % (C_HEX, C_DECIMAL, C_NAN))
LLAMA3_ARGS = re.compile("/".join([r"[ \t\n\v\f\r]*(%s)" % C_FLOAT] * 3) + r"/[ \t\n\v\f\r]*([+-]?[0-9]+)")


def c_float(text):
    """text as C's strtod reads it, or None unless it reads all of it."""
    m = C_NUMBER.fullmatch(text)
    if not m:
        return None
    hexadecimal, decimal, _ = m.groups()
    return float.fromhex(hexadecimal) if hexadecimal else float(decimal) if decimal else float("nan")


def _named(spec):
    L, C, NH, KV, D, F, V, maxT, theta, eps, tied, qk_norm, factor = NAMED[spec]
    rope = {}
    if factor:
        rope = dict(rope_kind=ROPE_LLAMA3, rope_factor=factor, rope_low=1.0, rope_high=4.0, rope_orig=8192)
    return Config(maxT, V, L, NH, C, mf.padded_vocab(V), KV, D, F, tied=tied, qk_norm=qk_norm, theta=theta, eps=eps,
                  **rope)


def _spec_field(tok):
    """The first field tok can be: (name, kind, what it sets, the text after the name), or None."""
    for name, kind, sets in SPEC_FIELDS:
        rest = tok[len(name):]
        if tok.startswith(name) and (kind != FLAG or rest == "") and (kind != INT or re.match("[0-9]", rest)):
            return name, kind, sets, rest
    return None


def _spec_value(spec, tok, name, kind, rest):
    """A field's value: an int, a float, True, or the RoPE keywords."""
    if kind == INT:
        v = c_float(rest)
        if v is None or not 0 < v <= 1 << 30 or v != math.floor(v):
            die("-e %r: %r: %s needs an integer from 1 to 2^30" % (spec, tok, name))
        return int(v)
    if kind == FLAG:
        return True
    rest = rest[1:] if kind == SCALING and rest.startswith(":") else rest
    if name == "rope-llama3":
        m = LLAMA3_ARGS.fullmatch(rest)
        f, low, high = (mf.f32(c_float(m.group(i))) for i in (1, 2, 3)) if m else (0.0, 0.0, 0.0)
        if not m or not (f > 0 and low > 0 and high > low and 1 <= int(m.group(4)) <= hf.INT32_MAX):
            die("-e %r: rope-llama3 needs <factor>/<low>/<high>/<original_max_position_embeddings> with factor > 0, "
                "0 < low_freq_factor < high_freq_factor and original_max_position_embeddings >= 1" % spec)
        return dict(rope_kind=ROPE_LLAMA3, rope_factor=f, rope_low=low, rope_high=high, rope_orig=int(m.group(4)))
    v = c_float(rest)
    if v is None or not 0 < v <= 1e12:
        die("-e %r: %s %s is not a positive number of at most 1e12" % (spec, NUMBER_NAMES[name], rest))
    return dict(rope_kind=ROPE_LINEAR, rope_factor=v) if name == "rope-linear" else v


def parse_spec(spec):
    """A named shape (NAMED), or 'llama:' and comma-separated fields (SPEC_SYNTAX; L C H F required, K default
    H, D C/H, V 50257, T 1024, theta 10000, eps 1e-5; the colon after rope-linear and rope-llama3 optional)
    -> Config; None when spec is not this family's. A Llama spec that does not parse, or an impossible model,
    is refused here."""
    if spec in NAMED:
        return _named(spec)
    if not spec.startswith("llama:"):
        return None
    if len(spec) - len("llama:") > SPEC_MAX:
        die("-e %r: longer than %d characters after llama:" % (spec, SPEC_MAX))
    got, by = {}, {}
    for tok in filter(None, spec[len("llama:"):].split(",")):   # as strtok: empty fields are skipped
        field = _spec_field(tok)
        if field is None:
            die("-e %r: unknown field %r (%s)" % (spec, tok, SPEC_SYNTAX))
        name, kind, sets, rest = field
        if sets in got:
            die("-e %r: %r and %r both set %s; give one"
                % (spec, by[sets], tok, "the RoPE scaling" if sets == "rope" else sets))
        got[sets], by[sets] = _spec_value(spec, tok, name, kind, rest), tok
    missing = [k for k in "LCHF" if k not in got]
    if missing:
        die("-e %r: needs %s" % (spec, ", ".join(missing)))
    L, C, NH, F_ = got["L"], got["C"], got["H"], got["F"]
    if "D" not in got and C % NH:
        die("-e %r: without D, C must be divisible by H" % spec)
    V = got.get("V", 50257)
    cfg = Config(got.get("T", 1024), V, L, NH, C, mf.padded_vocab(V), KV=got.get("K", NH), D=got.get("D", C // NH),
                 F=F_, tied="tied" in got, qk_norm="qknorm" in got, qkv_bias="qkvbias" in got,
                 theta=got.get("theta", 10000.0), eps=got.get("eps", 1e-5), **got.get("rope", {}))
    err = cfg.error()
    if err:
        die("-e %r: %s" % (spec, err))
    return cfg


# ------------------------------------------------------------------------------------------------------
# Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
#
# HF's Linear weights are (out, in) as the model file's are, and its RoPE is the rotate-half the trainer
# computes, so every HF tensor is a block of rows of one model-file tensor, copied as it is.

HF_PREFIX = "model."


def _layer(cfg):
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


def hf_names(cfg):
    """[(HF name, HF shape)] of every stored parameter in HF's state-dict order; a tied lm_head is not one."""
    shapes = dict(zip(cfg.names, cfg.shapes()))
    out = [("model.embed_tokens.weight", (cfg.V, cfg.C))]
    out += [("model.layers.%d.%s" % (l, hf_name), (rows,) + shapes[name][2:])
            for l in range(cfg.L) for hf_name, name, _, rows in _layer(cfg)]
    out.append(("model.norm.weight", (cfg.C,)))
    return out + [(hf.TIED_HEAD, (cfg.V, cfg.C))] * (not cfg.tied)


def to_hf(cfg, params):
    """Model-file tensors -> [(HF name, array)], the names and order of hf_names, vocabularies cut to V rows."""
    out = [("model.embed_tokens.weight", params["wte"][:cfg.V])]
    out += [("model.layers.%d.%s" % (l, hf_name), params[name][l][first:first + rows])
            for l in range(cfg.L) for hf_name, name, first, rows in _layer(cfg)]
    out.append(("model.norm.weight", params["final_norm"]))
    return out if cfg.tied else out + [(hf.TIED_HEAD, params["lm_head"][:cfg.V])]


def from_hf(cfg, get):
    """get(HF name) -> float32 array of its hf_names shape. Returns the model file's tensors, vocabularies
    padded to Vp with zero rows."""
    params = {name: np.empty(shape, np.float32) for name, shape in zip(cfg.names, cfg.shapes())}
    params["wte"] = hf.padded_vocab(cfg, get("model.embed_tokens.weight"))
    params["final_norm"] = get("model.norm.weight")
    if not cfg.tied:
        params["lm_head"] = hf.padded_vocab(cfg, get(hf.TIED_HEAD))
    for l in range(cfg.L):
        for hf_name, name, first, rows in _layer(cfg):
            params[name][l][first:first + rows] = get("model.layers.%d.%s" % (l, hf_name))
    return params


def canonical_name(name):
    """The name hf_names uses for a stored tensor: a base model's names (LlamaModel's, without `model.`) given
    it, as from_pretrained does."""
    return name if name.startswith(HF_PREFIX) or name == hf.TIED_HEAD else HF_PREFIX + name


def ignored(name):
    """RoPE's frequencies, which some HF versions store (recomputed from config.json by HF too)."""
    return name.endswith(".rotary_emb.inv_freq")


def hf_numel(cfg):
    """Parameters a Hugging Face checkpoint of cfg stores (the vocabularies have V rows there, not Vp), in
    Python integers: config.json's sizes are unchecked, and numpy's int64 products would wrap."""
    C, L = cfg.C, cfg.L
    q, kv = cfg.NH * cfg.D, cfg.KV * cfg.D
    block = 2 * C + (q + 2 * kv) * C + q * C + 3 * cfg.F * C + (q + 2 * kv) * cfg.qkv_bias + 2 * cfg.D * cfg.qk_norm
    return cfg.V * C * (1 if cfg.tied else 2) + L * block + C


ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# What a config.json may leave out, as each class fills it in (transformers' LlamaConfig, Qwen2Config,
# Qwen3Config). head_dim None: hidden_size / num_attention_heads.
DEFAULTS = {
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


def _rope(path, key, rs):
    """rope_scaling (or transformers 5's rope_parameters) -> Config's rope keywords. Any kind but default,
    linear and llama3, and any key those do not read, is refused: it would change the frequencies."""
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
        hf.positive_number(path, "%s.%s" % (key, k), rs[k])
    if kind == "linear":
        return {"rope_kind": ROPE_LINEAR, "rope_factor": rs["factor"]}
    if kind == "llama3":
        if type(rs["original_max_position_embeddings"]) is not int:
            die("%s: %s.original_max_position_embeddings is %r, not an integer"
                % (path, key, rs["original_max_position_embeddings"]))
        return {"rope_kind": ROPE_LLAMA3, "rope_factor": rs["factor"], "rope_low": rs["low_freq_factor"],
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
        window = conf.get("sliding_window", DEFAULTS[kind].get("sliding_window"))
        first = conf.get("max_window_layers", DEFAULTS[kind].get("max_window_layers", 0))
        sliding = ([l for l, t in enumerate(layer_types) if t == "sliding_attention"] if layer_types is not None
                   else list(range(first if type(first) is int else 0, L)))
        # A window as long as the model's context excludes no key, at any position the model reads.
        if window is not None and sliding and not (type(window) is int and window >= maxT):
            die("%s: use_sliding_window is true with sliding_window %r < max_position_embeddings %d in layers "
                "%s: sliding-window attention is not implemented" % (path, window, maxT, sliding[:4]))


def config_from_hf(path, conf):
    """config.json (a dict of model_type llama, qwen2 or qwen3) -> Config; dies, naming the key, unless it
    describes a model the trainer computes as Hugging Face does."""
    kind = conf["model_type"]
    archs = conf.get("architectures")
    if archs is not None and archs != [ARCHS[kind]]:
        die("%s: architectures %.200r; a model_type %s model the trainer reads is %s"
            % (path, archs, kind, ARCHS[kind]))
    get = lambda key: conf.get(key, DEFAULTS[kind].get(key, COMMON_DEFAULTS.get(key)))
    V, C, F, L, NH = (hf.positive_int(path, k, conf.get(k)) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"))
    maxT = hf.positive_int(path, "max_position_embeddings", get("max_position_embeddings"))
    KV = NH if get("num_key_value_heads") is None else hf.positive_int(path, "num_key_value_heads",
                                                                       get("num_key_value_heads"))
    D = C // NH if get("head_dim") is None else hf.positive_int(path, "head_dim", get("head_dim"))
    if NH % KV:
        die("%s: num_key_value_heads %d does not divide num_attention_heads %d" % (path, KV, NH))
    if get("head_dim") is None and C % NH:
        die("%s: hidden_size %d is not a multiple of num_attention_heads %d, and there is no head_dim" % (path, C, NH))
    if kind == "qwen2" and D != C // NH:
        die("%s: head_dim %d is not hidden_size / num_attention_heads %d: transformers versions differ on which "
            "one Qwen2 uses" % (path, D, C // NH))
    if max(NH, KV) * D > hf.INT32_MAX:
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
    cfg = hf.runnable(path, Config(maxT, V, L, NH, C, hf.padded(path, V), KV, D, F,
                                   tied=get("tie_word_embeddings"), qk_norm=kind == "qwen3",
                                   qkv_bias=kind == "qwen2", theta=hf.positive_number(path, "rope_theta", theta),
                                   eps=hf.positive_number(path, "rms_norm_eps", get("rms_norm_eps")), **rope))
    err = cfg.error()
    if err:
        die("%s: %s" % (path, err))
    return cfg


def architecture(cfg):
    """(model_type, architecture) of cfg's Hugging Face class; dies if none computes it."""
    if cfg.qk_norm and cfg.qkv_bias:
        die("%s: no Hugging Face class has both q/k norms (Qwen3) and q/k/v biases (Qwen2)" % cfg)
    if cfg.qkv_bias and cfg.D * cfg.NH != cfg.C:
        die("%s: a Qwen2 model's head_dim must be hidden_size / num_attention_heads (transformers versions "
            "differ on which one it uses)" % cfg)
    kind = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
    return kind, ARCHS[kind]


def hf_config(cfg, torch_dtype, bos=None, eos=None):
    """The config.json of cfg's Hugging Face class; bos and eos token ids where known."""
    kind, arch = architecture(cfg)
    rope = None
    if cfg.rope_kind == ROPE_LINEAR:
        rope = {"rope_type": "linear", "factor": hf.f32_json(cfg.rope_factor)}
    elif cfg.rope_kind == ROPE_LLAMA3:
        rope = {"rope_type": "llama3", "factor": hf.f32_json(cfg.rope_factor),
                "low_freq_factor": hf.f32_json(cfg.rope_low), "high_freq_factor": hf.f32_json(cfg.rope_high),
                "original_max_position_embeddings": cfg.rope_orig}
    conf = {"architectures": [arch], "model_type": kind, "vocab_size": cfg.V, "hidden_size": cfg.C,
            "intermediate_size": cfg.F, "num_hidden_layers": cfg.L, "num_attention_heads": cfg.NH,
            "num_key_value_heads": cfg.KV, "head_dim": cfg.D, "hidden_act": "silu",
            "max_position_embeddings": cfg.maxT, "rms_norm_eps": hf.f32_json(cfg.eps),
            "rope_theta": hf.f32_json(cfg.theta), "rope_scaling": rope, "tie_word_embeddings": bool(cfg.tied),
            "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True, "torch_dtype": torch_dtype,
            "bos_token_id": bos, "eos_token_id": eos}
    if kind == "llama":
        conf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:   # Qwen2's q/k/v biases come with its class: it has no attention_bias to set
        conf.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.L)
        if kind == "qwen3":
            conf["attention_bias"] = False
    return conf


# import_hf.py: why a stored lm_head.weight of a tied model must equal the embedding; a tensor beyond the
# model's is refused, since the names also tell which architecture (o_proj's bias) it is.
TIED_WHY = "config.json's tie_word_embeddings is true"


def extra_tensors(cfg, path, names):
    die("%s: tensor %s is not in a %s of config.json's shape" % (path, names[0], architecture(cfg)[1]))


# export_hf.py: bos and eos come from the flags or --tokenizer's folder; the family has no tokenizer files here.
TOKEN_IDS = None
TOKENIZER_FILES = []


def tokenizer_note(cfg):
    return "note: no tokenizer files written; --tokenizer FOLDER copies a Hugging Face folder's"


# ------------------------------------------------------------------------------------------------------
# LoRA: the linear layers an adapter may target, in the trainer's order (-lora-targets; bit i of the adapter
# file's target_bits is target i). q, k and v (gate and up) are targets of their own, each adding into its
# column block of the fused matmul. Each: our name, the module under LORA_LAYER, PEFT's target_modules entry,
# in and out features, and where the weight's rows are: the model file tensor and first row, the reference
# forward's matmul (the group) and its first output column.

LORA_FAN_IN_FAN_OUT = False
LORA_LAYER = "model.layers.%d."


def lora_targets(cfg):
    C, Q, KV, F_ = cfg.C, cfg.NH * cfg.D, cfg.KV * cfg.D, cfg.F
    return [("q", "self_attn.q_proj", "q_proj", C, Q, "wq", 0, "qkv", 0),
            ("k", "self_attn.k_proj", "k_proj", C, KV, "wkv", 0, "qkv", Q),
            ("v", "self_attn.v_proj", "v_proj", C, KV, "wkv", KV, "qkv", Q + KV),
            ("o", "self_attn.o_proj", "o_proj", Q, C, "attn_proj", 0, "o", 0),
            ("gate", "mlp.gate_proj", "gate_proj", C, F_, "gate_up", 0, "gate_up", 0),
            ("up", "mlp.up_proj", "up_proj", C, F_, "gate_up", F_, "gate_up", F_),
            ("down", "mlp.down_proj", "down_proj", F_, C, "down", 0, "down", 0)]


# ------------------------------------------------------------------------------------------------------
# The reference forward, which scripts/reference.py's Model runs on its parameters (model.p, the file's
# tensors): LlamaForCausalLM (Qwen3 with qk_norm, Qwen2 with q/k/v biases). PyTorch is imported by the
# functions that need it: the Hugging Face scripts read this module without it.

def rotate_half(x):
    import torch
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv_freq, T, dtype, device, pos=None):
    """Tables for apply_rope: channel i and i + D/2 turn by the angle pos * inv_freq[i]. (T, D) for the
    positions 0..T-1; with pos (B, T), each token's position in its document, (B, 1, T, D)."""
    import torch
    at = torch.arange(T, dtype=torch.float64) if pos is None else pos.to(torch.float64)
    ang = at[..., None] * torch.as_tensor(inv_freq, dtype=torch.float64)
    ang = torch.cat((ang, ang), dim=-1)
    if pos is not None:
        ang = ang[:, None]
    return ang.cos().to(device=device, dtype=dtype), ang.sin().to(device=device, dtype=dtype)


def apply_rope(x, cos, sin):
    """Hugging Face's apply_rotary_pos_emb (rotate-half pairing) on x (..., T, D)."""
    return x * cos + rotate_half(x) * sin


def rmsnorm(x, w, eps):
    return w * (x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt())


def reference_attention(model, qkv, l, cos, sin, doc=None):
    cfg, p = model.cfg, model.p
    B, T = qkv.shape[:2]
    NH, KV, D = cfg.NH, cfg.KV, cfg.D
    q, k, v = qkv.split([NH * D, KV * D, KV * D], dim=-1)
    q, k, v = q.view(B, T, NH, D), k.view(B, T, KV, D), v.view(B, T, KV, D)
    if cfg.qk_norm:
        q, k = rmsnorm(q, p["q_norm"][l], cfg.eps), rmsnorm(k, p["k_norm"][l], cfg.eps)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # Query head h reads kv head h // (NH/KV): each kv head serves a run of consecutive query heads.
    k, v = k.repeat_interleave(NH // KV, dim=1), v.repeat_interleave(NH // KV, dim=1)
    return model.attention(q, k, v, doc).transpose(1, 2).reshape(B, T, NH * D)


def reference_logits(model, idx, pos=None, doc=None):
    """Logits over all Vp rows of the head (the embedding when tied); pos, doc (B, T): each token's position
    in its document (RoPE's angle) and the row index of its document's first token (None: the row is one
    document). model.fast (bench only): PyTorch's fused silu instead of the spelled-out one."""
    import torch
    import torch.nn.functional as F
    p, cfg = model.p, model.cfg
    silu = F.silu if model.fast else (lambda x: x * x.sigmoid())
    B, T = idx.shape
    x = p["wte"][idx]
    cos, sin = rope_cos_sin(cfg.inv_freq(), T, x.dtype, x.device, pos)
    for l in range(cfg.L):
        h = rmsnorm(x, p["attn_norm"][l], cfg.eps)
        qkv = h @ torch.cat([p["wq"][l], p["wkv"][l]]).t()
        if cfg.qkv_bias:
            qkv = qkv + torch.cat([p["bq"][l], p["bkv"][l]])
        y = reference_attention(model, model.adapt(l, "qkv", h, qkv), l, cos, sin, doc)
        x = x + model.adapt(l, "o", y, y @ p["attn_proj"][l].t())
        h = rmsnorm(x, p["mlp_norm"][l], cfg.eps)
        gate, up = model.adapt(l, "gate_up", h, h @ p["gate_up"][l].t()).split(cfg.F, dim=-1)
        y = silu(gate) * up
        x = x + model.adapt(l, "down", y, y @ p["down"][l].t())
    x = rmsnorm(x, p["final_norm"], cfg.eps)
    return x @ (p["wte"] if cfg.tied else p["lm_head"]).t()


# The reference's own reading of a Hugging Face folder (config.json with each class's defaults; the tensors
# by their names), written apart from the map above, which it checks.

HF_HEAD_DIM_128 = "qwen3"   # Qwen3Config's head_dim defaults to 128; the others' to hidden_size / heads


def _reference_hf_rope(conf):
    """(kind, factor, low, high, orig) from rope_scaling; a kind the reference does not compute is an error."""
    rs = conf.get("rope_parameters") or conf.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return ROPE_NONE, 1.0, 0.0, 0.0, 0
    if kind == "linear":
        return ROPE_LINEAR, rs["factor"], 0.0, 0.0, 0
    if kind == "llama3":
        return (ROPE_LLAMA3, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                rs["original_max_position_embeddings"])
    die("rope_scaling %r: the reference computes default, linear and llama3 RoPE" % kind)


def reference_hf_config(folder, conf):
    """config.json's dict -> Config, refusing what the reference does not compute."""
    kind = conf["model_type"]
    if conf.get("hidden_act", "silu") not in ("silu", "swish"):
        die("%s: hidden_act %r; the reference computes silu" % (folder, conf["hidden_act"]))
    for key in ("attention_bias", "mlp_bias", "use_sliding_window", "quantization_config"):
        # Qwen2's class fixes its q/k/v biases and reads no attention_bias.
        if conf.get(key) and not (kind == "qwen2" and key == "attention_bias"):
            die("%s: config.json's %s is not computed by the reference" % (folder, key))
    C, NH = conf["hidden_size"], conf["num_attention_heads"]
    D = conf.get("head_dim") or (128 if kind == HF_HEAD_DIM_128 else C // NH)
    V, L, KV = conf["vocab_size"], conf["num_hidden_layers"], conf.get("num_key_value_heads") or NH
    rope, factor, low, high, orig = _reference_hf_rope(conf)
    return Config(conf.get("max_position_embeddings", 2048), V, L, NH, C, mf.padded_vocab(V), KV, D,
                  conf["intermediate_size"], tied=conf.get("tie_word_embeddings", False),
                  qk_norm=kind == "qwen3", theta=(conf.get("rope_parameters") or conf).get("rope_theta", 10000.0),
                  eps=conf.get("rms_norm_eps", 1e-6), rope_kind=rope, rope_factor=factor, rope_low=low,
                  rope_high=high, rope_orig=orig, qkv_bias=kind == "qwen2")


def reference_hf_params(cfg, w):
    """{HF name: float32 array} -> the model file's tensors, vocabularies padded with zero rows."""
    def layers(*suffixes):   # each layer's tensors, concatenated along rows, stacked over layers
        return np.stack([np.concatenate([w["model.layers.%d.%s" % (l, s)] for s in suffixes]) for l in range(cfg.L)])

    def vocab(a):
        out = np.zeros((cfg.Vp, cfg.C), np.float32)
        out[:cfg.V] = a
        return out
    p = {"wte": vocab(w["model.embed_tokens.weight"]), "attn_norm": layers("input_layernorm.weight"),
         "wq": layers("self_attn.q_proj.weight"), "wkv": layers("self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "attn_proj": layers("self_attn.o_proj.weight"), "mlp_norm": layers("post_attention_layernorm.weight"),
         "gate_up": layers("mlp.gate_proj.weight", "mlp.up_proj.weight"), "down": layers("mlp.down_proj.weight"),
         "final_norm": w["model.norm.weight"]}
    if cfg.qkv_bias:
        p["bq"], p["bkv"] = layers("self_attn.q_proj.bias"), layers("self_attn.k_proj.bias", "self_attn.v_proj.bias")
    if cfg.qk_norm:
        p["q_norm"], p["k_norm"] = layers("self_attn.q_norm.weight"), layers("self_attn.k_norm.weight")
    if not cfg.tied:
        p["lm_head"] = vocab(w["lm_head.weight"])
    return p
