"""The model file (llm.c's format, extended with the Llama family): its header, its tensors' names and shapes
per family, fp32 (version 3) and bf16 (version 5) payloads, read and written with numpy alone. Shared by
scripts/reference.py and the Hugging Face scripts (scripts/hf_format.py), which must run without PyTorch.
The format is specified in docs/formats.md."""
import math
import os
import sys

import numpy as np

MODEL_MAGIC = 20240326
HEADER_INTS = 256
NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# Decoupled weight decay touches only the matrices; biases and LayerNorm parameters are exempt (llm.c rule).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
# Header slot 8. llm.c's own GPT-2 files leave it 0.
FAMILY_GPT2, FAMILY_LLAMA = 0, 1
# bq and bkv exist only with the q/k/v bias flag (Qwen2), q_norm / k_norm only with qk_norm, lm_head only
# when the head is not tied to wte. wq and wkv (k rows, then v rows) are stored apart, each stacked over
# layers; a layer's q|k|v projection is their rows concatenated, and bq, bkv (k, then v) are its bias.
LLAMA_NAMES = ["wte", "attn_norm", "wq", "wkv", "bq", "bkv", "q_norm", "k_norm", "attn_proj", "mlp_norm", "gate_up",
               "down", "final_norm", "lm_head"]
LLAMA_DECAYED = {"wte", "wq", "wkv", "attn_proj", "gate_up", "down", "lm_head"}
ROPE_NONE, ROPE_LINEAR, ROPE_LLAMA3 = 0, 1, 2


def die(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


class Config:
    family, names, decayed = FAMILY_GPT2, NAMES, DECAYED

    def __init__(self, maxT, V, L, NH, C, Vp):
        self.maxT, self.V, self.L, self.NH, self.C, self.Vp = maxT, V, L, NH, C, Vp

    def shapes(self):
        maxT, L, C, Vp = self.maxT, self.L, self.C, self.Vp
        return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
                (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]

    def numel(self):
        return sum(int(np.prod(s)) for s in self.shapes())

    def header(self, version):
        h = np.zeros(HEADER_INTS, dtype=np.int32)
        h[:8] = [MODEL_MAGIC, version, self.maxT, self.V, self.L, self.NH, self.C, self.Vp]
        return h

    def __repr__(self):
        return "L%d C%d NH%d V%d Vp%d maxT%d" % (self.L, self.C, self.NH, self.V, self.Vp, self.maxT)


def f32(x):
    return float(np.float32(x))


class LlamaConfig:
    family, decayed = FAMILY_LLAMA, LLAMA_DECAYED

    def __init__(self, maxT, V, L, NH, C, Vp, KV, D, F, tied=False, qk_norm=False, theta=10000.0, eps=1e-5,
                 rope_kind=ROPE_NONE, rope_factor=1.0, rope_low=0.0, rope_high=0.0, rope_orig=0, qkv_bias=False):
        self.maxT, self.V, self.L, self.NH, self.C, self.Vp = maxT, V, L, NH, C, Vp
        self.KV, self.D, self.F, self.tied, self.qk_norm = KV, D, F, int(tied), int(qk_norm)
        self.qkv_bias = int(qkv_bias)
        self.rope_kind, self.rope_orig = rope_kind, rope_orig
        # The file holds these as float32: a model made from a spec must compute what its saved file will.
        # rope_factor is 1 without scaling, as the trainer writes it, so that both write the same header.
        self.theta, self.eps = f32(theta), f32(eps)
        self.rope_factor, self.rope_low, self.rope_high = f32(rope_factor), f32(rope_low), f32(rope_high)

    @property
    def names(self):
        return [n for n in LLAMA_NAMES if (self.qk_norm or n not in ("q_norm", "k_norm"))
                and (not self.tied or n != "lm_head") and (self.qkv_bias or n not in ("bq", "bkv"))]

    def shapes(self):
        Vp, L, NH, C, KV, D, F_ = self.Vp, self.L, self.NH, self.C, self.KV, self.D, self.F
        every = {"wte": (Vp, C), "attn_norm": (L, C), "wq": (L, NH * D, C), "wkv": (L, 2 * KV * D, C),
                 "bq": (L, NH * D), "bkv": (L, 2 * KV * D), "q_norm": (L, D),
                 "k_norm": (L, D), "attn_proj": (L, C, NH * D), "mlp_norm": (L, C), "gate_up": (L, 2 * F_, C),
                 "down": (L, C, F_), "final_norm": (C,), "lm_head": (Vp, C)}
        return [every[n] for n in self.names]

    def numel(self):
        return sum(int(np.prod(s)) for s in self.shapes())

    def header(self, version):
        h = np.zeros(HEADER_INTS, dtype=np.int32)
        h[:15] = [MODEL_MAGIC, version, self.maxT, self.V, self.L, self.NH, self.C, self.Vp, self.family,
                  self.KV, self.D, self.F, self.tied, self.qk_norm, self.rope_kind]
        h[15:20] = np.array([self.theta, self.eps, self.rope_factor, self.rope_low, self.rope_high],
                            dtype=np.float32).view(np.int32)
        h[20], h[21] = self.rope_orig, self.qkv_bias
        return h

    @staticmethod
    def from_header(h):
        fl = [float(x) for x in h[15:20].copy().view(np.float32)]
        return LlamaConfig(*(int(x) for x in h[2:8]), KV=int(h[9]), D=int(h[10]), F=int(h[11]), tied=int(h[12]),
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
# Files

def read_model_header(path):
    """Returns (Config, version). Checks magic, version, positive shapes, and that the size is exact."""
    size = os.path.getsize(path) if os.path.isfile(path) else -1
    if size < HEADER_INTS * 4:
        die("%s: not a model file (missing or shorter than the 1024-byte header)" % path)
    h = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if h[0] != MODEL_MAGIC:
        die("%s: bad model magic %d (want %d)" % (path, h[0], MODEL_MAGIC))
    version = int(h[1])
    if version not in (3, 5):
        die("%s: unsupported model version %d (3 = fp32, 5 = bf16)" % (path, version))
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    family = int(h[8])
    if family == FAMILY_LLAMA:
        cfg = LlamaConfig.from_header(h)
        err = cfg.error()
        if err:
            die("%s: inconsistent llama model header (%s): %s" % (path, cfg, err))
    elif family != FAMILY_GPT2:
        die("%s: unknown model family %d in header slot 8 (0 = GPT-2, 1 = llama)" % (path, family))
    else:
        if min(maxT, V, L, NH, C, Vp) <= 0 or Vp < V or C % NH:
            die("%s: inconsistent model header maxT=%d V=%d L=%d NH=%d C=%d Vp=%d" % (path, maxT, V, L, NH, C, Vp))
        cfg = Config(maxT, V, L, NH, C, Vp)
    want = HEADER_INTS * 4 + cfg.numel() * (4 if version == 3 else 2)
    if size != want:
        die("%s: size %d bytes, header says %d (%s, version %d)" % (path, size, want, cfg, version))
    return cfg, version


def split_payload(flat, cfg):
    """Splits a flat array (a model file's payload) into the family's tensors, by the config's shapes."""
    out, off = {}, 0
    for name, shape in zip(cfg.names, cfg.shapes()):
        n = int(np.prod(shape))
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    assert off == flat.size
    return out


def bf16_bits_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    # Round to nearest even on the upper 16 bits; NaN stays NaN (quiet bit set).
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def load_model(path):
    """Returns (Config, {name: float32 numpy array})."""
    cfg, version = read_model_header(path)
    raw = np.fromfile(path, dtype=np.float32 if version == 3 else np.uint16, offset=HEADER_INTS * 4)
    flat = raw if version == 3 else bf16_bits_to_f32(raw)
    return cfg, split_payload(flat, cfg)


def save_model(path, cfg, params, version=3):
    """params: {name: array-like}. Writes atomically (tmp + rename) so a reader never sees half a file."""
    flat = np.concatenate([np.asarray(params[n], dtype=np.float32).reshape(-1) for n in cfg.names])
    assert flat.size == cfg.numel()
    payload = flat if version == 3 else f32_to_bf16_bits(flat)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(cfg.header(version).tobytes())
            f.write(payload.tobytes())
        os.replace(tmp, path)
    except OSError as e:
        die("cannot write %s: %s" % (path, e.strerror))
