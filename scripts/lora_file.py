"""LoRA adapters for the scripts: the trainer's adapter file (docs/formats.md), the targets of a model's family
(its module's lora_targets), the merge W += scale * B A, and the map to and from Hugging Face PEFT's adapter
folder (adapter_config.json, adapter_model.safetensors). numpy only, as the Hugging Face scripts.

The adapter file: 256 x int32 header [20261130, 1, R, num_targets, L, target_bits, alpha_x1000, rslora]
(num_targets: how many targets the file holds, the bits set in target_bits; bit i selects target i of the
family's list), then for each layer and each selected target in the family's order A (R, IC) and B (OC, R),
fp32 row-major. The target's linear is out = x W^T with W (OC, IC); the adapter adds scale * (x A^T) B^T,
scale = alpha / R, or alpha / sqrt(R) with rsLoRA.
"""
import json
import math
import os
from collections import namedtuple

import numpy as np

import families
import hf_format as hf
import model_file as mf

MAGIC, VERSION = 20261130, 1
die = mf.die

# One targetable linear layer of a model: our name, the module under the family's LORA_LAYER, PEFT's
# target_modules entry, in and out features, the model file tensor holding W's rows from row0, and the
# reference forward's matmul (group) whose output columns col0 .. col0 + OC it adds into.
Target = namedtuple("Target", "name module peft_name IC OC tensor row0 group col0")


def targets(cfg):
    """Every target of cfg's family, in the family's order."""
    return [Target(*t) for t in families.of(cfg).lora_targets(cfg)]


def target_bits(cfg, names):
    """A -lora-targets list (names) -> the bits of the family's targets it names; an unknown name is an error
    naming the family's targets."""
    order = [t.name for t in targets(cfg)]
    bits = 0
    for name in names:
        if name not in order:
            die("LoRA target %r: %s has the targets %s" % (name, families.of(cfg).TITLE, ",".join(order)))
        bits |= 1 << order.index(name)
    if not bits:
        die("no LoRA target selected; %s has %s" % (families.of(cfg).TITLE, ",".join(order)))
    return bits


class Adapter:
    """R, alpha (in thousandths, as the file holds it), rslora, the selected targets (Target rows, in the
    family's order) and for each target name (A (L, R, IC), B (L, OC, R)) float32 arrays."""

    def __init__(self, cfg, R, alpha_x1000, rslora, bits, weights):
        self.cfg, self.R, self.alpha_x1000, self.rslora, self.bits = cfg, R, alpha_x1000, bool(rslora), bits
        self.targets = [t for i, t in enumerate(targets(cfg)) if bits >> i & 1]
        self.weights = weights

    @property
    def alpha(self):
        return self.alpha_x1000 / 1000

    @property
    def scale(self):
        return self.alpha / (math.sqrt(self.R) if self.rslora else self.R)

    def header(self):
        h = np.zeros(mf.HEADER_INTS, np.int32)
        h[:8] = [MAGIC, VERSION, self.R, len(self.targets), self.cfg.L, self.bits, self.alpha_x1000,
                 int(self.rslora)]
        return h


def alpha_x1000(where, alpha):
    """An alpha in the file's thousandths; one that is not a whole number of them is an error."""
    if type(alpha) not in (int, float) or not math.isfinite(alpha) or alpha <= 0:
        die("%s: lora_alpha %r is not a positive number" % (where, alpha))
    x = round(alpha * 1000)
    if x > hf.INT32_MAX or abs(x - alpha * 1000) > 1e-6 * max(1.0, abs(x)):
        die("%s: lora_alpha %r is not a multiple of 0.001 up to 2^31/1000, as the adapter file holds it"
            % (where, alpha))
    return x


def check_rank(where, cfg, R, chosen):
    """A rank from 1 to the smallest in or out features of the targets."""
    smallest = min(min(t.IC, t.OC) for t in chosen)
    if not 1 <= R <= smallest:
        die("%s: rank %d; the targets %s take 1 to %d" % (where, R, ",".join(t.name for t in chosen), smallest))


def zero_adapter(cfg, R, alpha_x1000_, rslora, bits, rng=None):
    """A fresh adapter: B zero, A PEFT's kaiming_uniform_(a=sqrt(5)), uniform in +-1/sqrt(IC), from rng
    (None: A zero too)."""
    chosen = [t for i, t in enumerate(targets(cfg)) if bits >> i & 1]
    check_rank("-lora", cfg, R, chosen)
    weights = {}
    for t in chosen:
        bound = 1 / math.sqrt(t.IC)
        A = (rng.uniform(-bound, bound, (cfg.L, R, t.IC)) if rng is not None
             else np.zeros((cfg.L, R, t.IC))).astype(np.float32)
        weights[t.name] = (A, np.zeros((cfg.L, t.OC, R), np.float32))
    return Adapter(cfg, R, alpha_x1000_, rslora, bits, weights)


def read(path, cfg):
    """The adapter file at path for a model of cfg; every header field and the size are checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die("%s: cannot read (%s)" % (path, e.strerror))
    if len(data) < 4 * mf.HEADER_INTS:
        die("%s: %d bytes, shorter than the adapter file's header" % (path, len(data)))
    h = np.frombuffer(data[:4 * mf.HEADER_INTS], "<i4").astype(np.int64)
    magic, version, R, count, L, bits, ax, rslora = (int(x) for x in h[:8])
    if magic != MAGIC or version != VERSION:
        die("%s: magic %d version %d; an adapter file has %d version %d" % (path, magic, version, MAGIC, VERSION))
    family = targets(cfg)
    if L != cfg.L:
        die("%s: adapter for %d layers; the model has %d" % (path, L, cfg.L))
    if bits <= 0 or bits >> len(family) or bin(bits).count("1") != count:
        die("%s: target_bits %d with %d targets; %s has the targets %s"
            % (path, bits, count, families.of(cfg).TITLE, ",".join(t.name for t in family)))
    if ax <= 0 or rslora not in (0, 1):
        die("%s: alpha x1000 %d and rslora %d: want alpha > 0 and rslora 0 or 1" % (path, ax, rslora))
    chosen = [t for i, t in enumerate(family) if bits >> i & 1]
    check_rank(path, cfg, R, chosen)
    want = 4 * mf.HEADER_INTS + 4 * L * R * sum(t.IC + t.OC for t in chosen)
    if len(data) != want:
        die("%s: %d bytes; rank %d, %d layers and the targets %s of this model make %d"
            % (path, len(data), R, L, ",".join(t.name for t in chosen), want))
    flat, pos = np.frombuffer(data, "<f4", offset=4 * mf.HEADER_INTS), 0
    weights = {t.name: (np.empty((L, R, t.IC), np.float32), np.empty((L, t.OC, R), np.float32)) for t in chosen}
    for l in range(L):
        for t in chosen:
            for a in weights[t.name]:
                n = a[l].size
                a[l] = flat[pos:pos + n].reshape(a[l].shape)
                pos += n
    return Adapter(cfg, R, ax, rslora, bits, weights)


def write(path, adapter):
    """The adapter file, written whole or not at all (hf_format.atomic_file)."""
    with hf.atomic_file(path) as f:
        f.write(adapter.header().tobytes())
        for l in range(adapter.cfg.L):
            for t in adapter.targets:
                for a in adapter.weights[t.name]:
                    f.write(np.ascontiguousarray(a[l], dtype="<f4").data)


def merged(cfg, params, adapter):
    """The model file's tensors with W += scale * B A folded into every target's rows, computed in float64
    from the float32 values and returned in float64 (the caller rounds once, if it stores float32)."""
    out = {n: np.asarray(a, np.float64) for n, a in params.items()}
    for t in adapter.targets:
        A, B = (a.astype(np.float64) for a in adapter.weights[t.name])
        W = out[t.tensor]
        for l in range(cfg.L):
            W[l, t.row0:t.row0 + t.OC] += adapter.scale * (B[l] @ A[l])
    return out


# ------------------------------------------------------------------------------------------------------
# PEFT's adapter folder

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# adapter_config.json keys that change what the adapter computes beyond plain LoRA: refused when they are set.
PEFT_UNSUPPORTED = ("use_dora", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
                    "modules_to_save", "layer_replication", "target_parameters", "trainable_token_indices",
                    "exclude_modules")


def peft_key(cfg, t, l, which):
    return "%s%s%s.lora_%s.weight" % (PEFT_PREFIX, families.of(cfg).LORA_LAYER % l, t.module, which)


def peft_tensors(adapter):
    """[(PEFT's name, array)]: lora_A.weight (R, in) and lora_B.weight (out, R) of every layer's target.
    GPT-2's Conv1D stores W as (in, out), but PEFT's A and B are nn.Linear weights either way
    (fan_in_fan_out transposes only the merged B A), so no family transposes them."""
    cfg = adapter.cfg
    return [(peft_key(cfg, t, l, which), a[l]) for l in range(cfg.L) for t in adapter.targets
            for which, a in zip("AB", adapter.weights[t.name])]


def peft_config(adapter, base_name, dropout=0.0):
    alpha = adapter.alpha_x1000 // 1000 if adapter.alpha_x1000 % 1000 == 0 else adapter.alpha
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": adapter.R, "lora_alpha": alpha,
            "use_rslora": adapter.rslora, "lora_dropout": dropout,
            "target_modules": [t.peft_name for t in adapter.targets], "bias": "none",
            "fan_in_fan_out": families.of(adapter.cfg).LORA_FAN_IN_FAN_OUT, "init_lora_weights": True, "base_model_name_or_path": base_name,
            "inference_mode": True}


def recorded_dropout(adapter_path):
    """The -lora-dropout the run recorded in the manifest of the checkpoint holding adapter_path, or 0 (an
    adapter file outside a checkpoint, or a run without dropout: the manifest leaves the default out)."""
    manifest = os.path.join(os.path.dirname(os.path.abspath(adapter_path)), "manifest.json")
    if not os.path.isfile(manifest):
        return 0.0
    try:
        with open(manifest) as f:
            return float(json.load(f).get("run", {}).get("lora_dropout", 0.0))
    except (OSError, ValueError) as e:
        die("%s: cannot read the run's -lora-dropout (%s)" % (manifest, e))


def write_peft(folder, adapter, base_name, dropout=0.0):
    hf.write_safetensors(os.path.join(folder, WEIGHTS_FILE), peft_tensors(adapter), {"format": "pt"})
    hf.write_json(os.path.join(folder, CONFIG_FILE), peft_config(adapter, base_name, dropout))


def peft_matches(module_path, target_modules):
    """PEFT's rule for a list of target_modules: the module's full name is one of them or ends with '.' + one."""
    return any(module_path == m or module_path.endswith("." + m) for m in target_modules)


def _peft_settings(where, conf):
    """(R, alpha x1000, rslora, target_modules) of adapter_config.json, or one error naming the key."""
    if not isinstance(conf, dict) or conf.get("peft_type") != "LORA":
        die("%s: peft_type is %r; LORA adapters only" % (where, conf.get("peft_type") if isinstance(conf, dict)
                                                          else conf))
    for key in PEFT_UNSUPPORTED:
        if conf.get(key):
            die("%s: %s is %.100r; the trainer's adapters are plain LoRA" % (where, key, conf[key]))
    if conf.get("bias", "none") != "none":
        die("%s: bias is %r; the trainer's adapters have no bias" % (where, conf["bias"]))
    R = conf.get("r")
    if type(R) is not int or R <= 0:
        die("%s: r is %r, not a positive integer" % (where, R))
    rslora = conf.get("use_rslora", False)
    if type(rslora) is not bool:
        die("%s: use_rslora is %r, not true or false" % (where, rslora))
    modules = conf.get("target_modules")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
        die("%s: target_modules is %.100r; want a list of module names (a regular expression is not read)"
            % (where, modules))
    return R, alpha_x1000(where, conf.get("lora_alpha", 8)), rslora, modules


def read_peft(folder, cfg):
    """A PEFT adapter folder -> Adapter for the model cfg. Its target_modules must select, in the model's
    modules, exactly the targets whose tensors it stores, with the shapes of this model and its rank r."""
    config, weights = os.path.join(folder, CONFIG_FILE), os.path.join(folder, WEIGHTS_FILE)
    for path in (config, weights):
        if not os.path.isfile(path):
            die("%s: is missing (a PEFT adapter folder holds %s and %s)" % (path, CONFIG_FILE, WEIGHTS_FILE))
    R, ax, rslora, modules = _peft_settings(config, hf.read_json(config))
    layer = families.of(cfg).LORA_LAYER
    family = targets(cfg)
    chosen = [t for t in family if any(peft_matches(layer % l + t.module, modules) for l in range(cfg.L))]
    if not chosen:
        die("%s: target_modules %s name no linear layer of this %s model (its targets: %s)"
            % (config, modules, families.of(cfg).TITLE, ", ".join(t.peft_name for t in family)))
    check_rank(config, cfg, R, chosen)
    stored = hf.read_safetensors(weights)
    expected = {}
    for l in range(cfg.L):
        for t in chosen:
            if not peft_matches(layer % l + t.module, modules):
                die("%s: target_modules %s select %s in some layers, not in layer %d; the trainer adapts every "
                    "layer" % (config, modules, t.peft_name, l))
            expected[peft_key(cfg, t, l, "A")] = (R, t.IC)
            expected[peft_key(cfg, t, l, "B")] = (t.OC, R)
    for name, entry in stored.items():
        if name not in expected:
            die("%s: tensor %s is not a LoRA weight of this model's targets %s (another base model?)"
                % (weights, name, ",".join(t.name for t in chosen)))
    for name, shape in expected.items():
        if name not in stored:
            die("%s: tensor %s is missing" % (weights, name))
        if tuple(stored[name].shape) != shape:
            die("%s: tensor %s has shape %s; r %d and this base model make it %s (another rank or base?)"
                % (weights, name, list(stored[name].shape), R, list(shape)))
    out = {t.name: (np.empty((cfg.L, R, t.IC), np.float32), np.empty((cfg.L, t.OC, R), np.float32))
           for t in chosen}
    for l in range(cfg.L):
        for t in chosen:
            for which, a in zip("AB", out[t.name]):
                name = peft_key(cfg, t, l, which)
                a[l] = hf.decode(weights, name, stored[name])
    bits = sum(1 << family.index(t) for t in chosen)
    return Adapter(cfg, R, ax, rslora, bits, out)
