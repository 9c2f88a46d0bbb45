"""The model families of the scripts, one module each, in the one table below (FAMILIES); the rest of scripts/
reaches a family only through it. core/models/catalog.c is the trainer's table.

A family module has
  for the model file: NAME, TITLE, FILE_ID (header slot 8), a Config class (its header fields and
    Config.header, its tensors' names, shapes, initialization (init) and weight decay (decayed), the rows
    padded to Vp (vocab_tensors), head_size, error: what makes it impossible, trainer_error: what the trainer
    refuses beyond the common rules) and config_from_header(path, header ints);
  for -e: parse_spec(spec) -> Config, or None for another family's spec;
  for Hugging Face: HF_MODEL_TYPES (config.json's model_type), HF_PREFIX, hf_names, to_hf, from_hf,
    canonical_name, ignored, hf_numel, config_from_hf(path, dict), architecture, hf_config; import_hf.py's
    TIED_WHY and extra_tensors, export_hf.py's TOKEN_IDS, TOKENIZER_FILES and tokenizer_note;
  for LoRA (scripts/lora_file.py): LORA_LAYER (a layer's module path, %d its index), LORA_FAN_IN_FAN_OUT (PEFT's
    fan_in_fan_out) and lora_targets(cfg);
  for scripts/reference.py: reference_logits(model, idx, pos, doc), calling model.adapt(l, group, x, out)
    on each targetable matmul's output, and reference_hf_config and reference_hf_params
    where the reference reads the family's Hugging Face folders with code of its own (else None).
A third family is one more module with these names and one more row in FAMILIES.
"""
import hf_format as hf
import model_file as mf

from families import gpt2, llama

FAMILIES = {gpt2.NAME: gpt2, llama.NAME: llama}   # in the order -e tries their specs


def of(cfg):
    """The module of a Config."""
    return FAMILIES[cfg.family]


def by_file_id(file_id):
    return next((f for f in FAMILIES.values() if f.FILE_ID == file_id), None)


def by_model_type(model_type):
    return next((f for f in FAMILIES.values() if model_type in f.HF_MODEL_TYPES), None)


def model_types():
    return [t for f in FAMILIES.values() for t in f.HF_MODEL_TYPES]


def from_spec(spec):
    """A -e spec -> Config of the first family whose grammar it is, or None; a family's spec that does not
    parse dies there."""
    for family in FAMILIES.values():
        cfg = family.parse_spec(spec)
        if cfg is not None:
            return cfg
    return None


def read_model_header(path):
    """Returns (Config, version). Checks magic, version, the family's header fields, and that the size is
    exact."""
    h, version, size = mf.read_header(path)
    family = by_file_id(int(h[8]))
    if family is None:
        ids = ", ".join("%d = %s" % (f.FILE_ID, f.TITLE) for f in FAMILIES.values())
        mf.die("%s: unknown model family %d in header slot 8 (%s)" % (path, h[8], ids))
    cfg = family.config_from_header(path, h)
    mf.check_size(path, cfg, version, size)
    return cfg, version


def load_model(path):
    """Returns (Config, {name: float32 numpy array})."""
    cfg, version = read_model_header(path)
    return cfg, mf.read_params(path, cfg, version)


def config_from_hf(path):
    """A Hugging Face config.json -> Config of the family its model_type names; dies, naming the key, unless it
    describes a model the trainer computes as Hugging Face does."""
    conf = hf.read_json(path)
    kind = conf.get("model_type") if isinstance(conf, dict) else conf
    family = by_model_type(kind) if isinstance(kind, str) else None
    if family is None:
        mf.die("%s: model_type %r is not one of %s" % (path, kind, ", ".join(model_types())))
    return family.config_from_hf(path, conf)
