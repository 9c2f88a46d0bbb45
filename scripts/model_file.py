"""The model file (llm.c's format, extended with other families' header fields): the header's common slots,
fp32 (version 3) and bf16 (version 5) payloads, read and written with numpy alone. Each family's tensors and
header fields are its module's (scripts/families/); families.read_model_header and families.load_model pick
the family from header slot 8. Shared by scripts/reference.py and the Hugging Face scripts
(scripts/hf_format.py), which must run without PyTorch. The format is specified in docs/formats.md."""
import os
import sys

import numpy as np

MODEL_MAGIC = 20240326
HEADER_INTS = 256
# How a random model's tensor starts (the trainer's init kinds): N(0, 0.02); N(0, 0.02 / sqrt(2L)) for the
# projections into the residual stream; all ones; all zeros.
INIT_NORMAL, INIT_RESIDUAL, INIT_ONES, INIT_ZEROS = "normal", "residual", "ones", "zeros"


def die(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


def f32(x):
    return float(np.float32(x))


def padded_vocab(V):
    """The trainer's vocabulary rows: V rounded up to a multiple of 128."""
    return (V + 127) // 128 * 128


def numel(cfg):
    return sum(int(np.prod(s)) for s in cfg.shapes())


def header(cfg, version):
    """The slots every family writes: magic, version, maxT, V, L, NH, C, Vp and the family's id (slot 8);
    the family's Config.header fills its own slots after them."""
    h = np.zeros(HEADER_INTS, dtype=np.int32)
    h[:9] = [MODEL_MAGIC, version, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp, cfg.file_id]
    return h


# ------------------------------------------------------------------------------------------------------
# Files

def read_header(path):
    """Returns (the header's ints, version, the file's size). Checks that it is long enough, the magic and
    the version; the family's reader checks the rest."""
    size = os.path.getsize(path) if os.path.isfile(path) else -1
    if size < HEADER_INTS * 4:
        die("%s: not a model file (missing or shorter than the 1024-byte header)" % path)
    h = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if h[0] != MODEL_MAGIC:
        die("%s: bad model magic %d (want %d)" % (path, h[0], MODEL_MAGIC))
    version = int(h[1])
    if version not in (3, 5):
        die("%s: unsupported model version %d (3 = fp32, 5 = bf16)" % (path, version))
    return h, version, size


def check_size(path, cfg, version, size):
    want = HEADER_INTS * 4 + cfg.numel() * (4 if version == 3 else 2)
    if size != want:
        die("%s: size %d bytes, header says %d (%s, version %d)" % (path, size, want, cfg, version))


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


def read_params(path, cfg, version):
    """The payload of a model file whose header read_header and the family's reader checked:
    {name: float32 numpy array}."""
    raw = np.fromfile(path, dtype=np.float32 if version == 3 else np.uint16, offset=HEADER_INTS * 4)
    flat = raw if version == 3 else bf16_bits_to_f32(raw)
    return split_payload(flat, cfg)


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
