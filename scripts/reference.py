#!/usr/bin/env python3
"""Independent PyTorch reference for the trainer, written from the spec in docs/ARCHITECTURE.md, README.md and
docs/formats.md: GPT-2, and Llama-style decoders with Hugging Face LlamaForCausalLM semantics (grouped-query
attention, RoPE with 'linear' or 'llama3' scaling, SwiGLU MLP, RMSNorm, Qwen3's optional q/k norms, Qwen2's
q/k/v biases). Each family's forward, spec and file fields are its module's in scripts/families/; this file
holds what they share: attention, loss, AdamW, the schedule, the command line; the data (token shards, the
mask files beside them, documents packed into rows) is scripts/reference_data.py's.

Documents (a dataset with mask files, or -docmask 1): each token has a position in its document (RoPE's
angle; GPT-2's row of wpe) and attends only to its own document's earlier tokens; a target of -1 is no
label. A step's loss is the sum of its labels' losses over the step's number of labels, every micro-step
together; -ga m on one rank reads the windows of n replicas of -ga m/n and so computes their loss.

It reads and writes llm.c model files and token shards, reads Hugging Face Llama, Qwen2 and Qwen3 folders,
follows the design's data order, LR schedule, AdamW and clipping exactly, and computes in float64 by
default so that it is more accurate than the C code it checks. The same flags as train_gpt_cpu where they overlap.

  reference.py -e MODEL.bin -i 'shards*.bin' -b 4 -t 64 -ga 2 -x 10 -l 1e-3 -u 3 -q 0.1 -k cosine \
               -c 0.1 -gc 0.5 -o OUT -dump DUMP
  reference.py -e L2C64H4V500T64 --seed 1 --save model.bin          # random model, for tests
  reference.py -e llama:L2,C64,H4,K2,F160,V512,T64,tied --save llama.bin
  reference.py -e HF_FOLDER -i 'shards*.bin' -x 1 -dump DUMP             # a Hugging Face Llama/Qwen folder
  reference.py -e MODEL.bin -i 'chat_train_*.bin' -b 4 -t 64 -pack 1 -long truncate -x 8 -o OUT   # .mask beside
  reference.py -e MODEL.bin -i 'shards*.bin' -docmask 1 --doc-start 50256 -x 8 -o OUT
  reference.py -e MODEL.bin -t 64 --hellaswag data/hellaswag/hellaswag_val.bin   # the trainer's -hs, in float64
  reference.py -e MODEL.bin -i 'shards*.bin' -lora 4 -lora-alpha 8 -lora-init ADAPTER.bin -x 8 -o OUT   # LoRA
  reference.py -e d12 --bench --device cuda --dtype bfloat16 --compile -b 16 -t 1024 -x 30 --bench-out f.jsonl

LoRA (-lora R): the family's targets (-lora-targets) each add scale * (x A^T) B^T to their linear layer's
output, scale = -lora-alpha / R (/ sqrt(R) with -lora-rslora 1); the base model is frozen and only A and B
train, with AdamW and weight decay as every decayed matrix. A starts as -lora-init's adapter file, else
uniform in +-1/sqrt(in features) from --seed (not the trainer's draw), B at zero, so step 0 is the base
model. -lora-dropout P drops elements of each adapter's input in training with the trainer's mask (a hash of
--seed, the micro-batch's place in the data, the layer and the target: lora_dropout_keep) and scales the rest
by 1/(1-P). -o writes the adapters as lora_final.bin (an adapter file), -dump their gradients (each target's A
then B, stacked over layers, in target order).

Runs on Debian's PyTorch 1.13 (CPU) and on PyTorch 2.x (CUDA): newer APIs (torch.compile,
scaled_dot_product_attention, fused AdamW) are used only when asked for and present.
"""
import os
import sys

# Run as a script, Python puts scripts/ first on sys.path, where scripts/tokenize.py would shadow the
# standard library's tokenize (which torch imports): scripts/ goes last, for model_file and families alone.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

# The model file's format and the families, shared with the Hugging Face scripts (which run without
# PyTorch); tests/tools/compare.py reads some of these as reference.NAME.
import families
import lora_file
from families import load_model, read_model_header  # noqa: F401
from model_file import (HEADER_INTS, INIT_NORMAL, INIT_ONES, INIT_RESIDUAL, bf16_bits_to_f32, die,  # noqa: F401
                        save_model, split_payload)
from reference_data import Batches, Stream, read_shard  # noqa: F401


def load_tokens(pattern, V):
    return Stream(pattern, V).tokens


# ------------------------------------------------------------------------------------------------------
# Hugging Face folders, read with code of their own (not scripts/hf_format.py's, which they check): the
# family's reference_hf_config and reference_hf_params, and model.safetensors or the shards that
# model.safetensors.index.json lists.

def _hf_safetensors(path):
    """{name: float32 array} of one safetensors file (F32, BF16 or F16 tensors)."""
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), "<u8")[0])
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        raw = np.frombuffer(body[e["data_offsets"][0]:e["data_offsets"][1]], np.uint8)
        if e["dtype"] == "F32":
            a = raw.view("<f4").astype(np.float32)
        elif e["dtype"] == "F16":
            a = raw.view("<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            a = bf16_bits_to_f32(raw.view("<u2"))
        else:
            die("%s: tensor %s is %s; the reference reads F32, BF16 and F16" % (path, name, e["dtype"]))
        out[name] = a.reshape(e["shape"])
    return out


def load_hf_folder(folder):
    """A Hugging Face folder of a family the reference reads -> (Config, params in the model file's layout,
    vocabulary padded with zero rows)."""
    conf = json.load(open(os.path.join(folder, "config.json")))
    kind = conf.get("model_type")
    family = families.by_model_type(kind) if isinstance(kind, str) else None
    if family is None or family.reference_hf_config is None:
        readable = [t for f in families.FAMILIES.values() if f.reference_hf_config for t in f.HF_MODEL_TYPES]
        die("%s: model_type %r; the reference reads Hugging Face folders of %s"
            % (folder, kind, ", ".join(readable[:-1]) + " and " + readable[-1]))
    cfg = family.reference_hf_config(folder, conf)
    index = os.path.join(folder, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    w = {}
    for name in files:
        w.update(_hf_safetensors(os.path.join(folder, name)))
    p = family.reference_hf_params(cfg, w)
    err = cfg.error()
    if err:
        die("%s: %s" % (folder, err))
    for name, shape in zip(cfg.names, cfg.shapes()):
        if p[name].shape != shape:
            die("%s: %s has shape %s, config.json makes it %s" % (folder, name, p[name].shape, shape))
    return cfg, p


# ------------------------------------------------------------------------------------------------------
# Model

def parse_spec(spec):
    """A -e spec of any family (the trainer's grammar: families.from_spec) -> Config."""
    cfg = families.from_spec(spec)
    if cfg is None:
        die("-e %r: neither a model file nor a spec like d12, L2C64H4V512T64, smollm2-135m or llama:L2,C64,H4,F160"
            % spec)
    return cfg


def random_params(cfg, seed):
    """Each tensor as its family's init says: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2L)),
    ones or zeros, drawn in the file's order; the padded vocabulary rows 0."""
    g = np.random.default_rng(seed)
    p = {}
    for name, shape in zip(cfg.names, cfg.shapes()):
        init = cfg.init(name)
        if init in (INIT_NORMAL, INIT_RESIDUAL):
            std = 0.02 / math.sqrt(2 * cfg.L) if init == INIT_RESIDUAL else 0.02
            p[name] = (g.standard_normal(shape) * std).astype(np.float32)
        else:
            p[name] = (np.ones if init == INIT_ONES else np.zeros)(shape, np.float32)
    for name in cfg.vocab_tensors:
        p[name][cfg.V:] = 0   # padded rows are never looked up; keep them inert
    return p


def causal_attention(q, k, v, sdpa, doc=None):
    """q, k, v: (B, heads, T, head size) -> the same shape, scaled by 1/sqrt(head size). doc (B, T): query t
    attends the keys doc[b, t] .. t (documents packed in a row see only themselves); None: keys 0 .. t."""
    T = q.shape[-2]
    t = torch.arange(T, device=q.device)
    mask = t[None, :] <= t[:, None]
    if doc is not None:
        mask = (mask & (t[None, None, :] >= doc[:, :, None].to(q.device)))[:, None]
    if sdpa:
        if doc is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


def lm_loss(logits, targets, V, reduction="mean"):
    """Cross-entropy over the labels; a target of -1 is no label."""
    return F.cross_entropy(logits.reshape(-1, V).float() if logits.dtype in (torch.bfloat16, torch.float16)
                           else logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1, reduction=reduction)


class Model(torch.nn.Module):
    """A family's reference forward (its module's reference_logits) over the model file's tensors as
    parameters, kept layer-stacked as in the file, so that gradients come out in the file's layout."""

    def __init__(self, cfg, params, dtype, device, sdpa=False, fast=False, adapter=None):
        super().__init__()
        # fast (bench only): PyTorch's fused norms and activations instead of the spelled-out math, which in
        # eager mode costs a kernel per elementwise op.
        self.cfg, self.family, self.sdpa, self.fast = cfg, families.of(cfg), sdpa, fast
        self.p = torch.nn.ParameterDict({n: torch.nn.Parameter(torch.as_tensor(np.asarray(params[n]))
                                                               .to(device=device, dtype=dtype))
                                         for n in cfg.names})
        self.adapter, self.lora = adapter, torch.nn.ParameterDict()
        # LoRA's dropout: its rate and seed, and the training micro-batch's place in the data (None: no dropout).
        self.dropout, self.dropout_seed, self.dropout_at = 0.0, 0, None
        if adapter is not None:   # the base is frozen: autograd computes no gradient for it
            for p in self.p.values():
                p.requires_grad_(False)
            for t in adapter.targets:
                for which, a in zip("AB", adapter.weights[t.name]):
                    self.lora["lora_%s_%s" % (which, t.name)] = torch.nn.Parameter(
                        torch.as_tensor(a).to(device=device, dtype=dtype))

    def trainable(self):
        """[(name, parameter)] that training updates: the adapters' A and B of each target in order (the
        trainer's lora_A.<t>, lora_B.<t> kinds) with LoRA, else every tensor of the model file."""
        if self.adapter is None:
            return [(n, self.p[n]) for n in self.cfg.names]
        return [("lora_%s.%s" % (w, t.name), self.lora["lora_%s_%s" % (w, t.name)])
                for t in self.adapter.targets for w in "AB"]

    def params(self):
        return [p for _, p in self.trainable()]

    def adapt(self, l, group, x, out):
        """out (x's product with a fused weight, the group) with each adapter of that group added into its
        columns: scale * (x A^T) B^T."""
        chosen = [] if self.adapter is None else [t for t in self.adapter.targets if t.group == group]
        if not chosen:
            return out
        out = out.clone()
        for t in chosen:
            A, B = self.lora["lora_A_" + t.name][l], self.lora["lora_B_" + t.name][l]
            out[..., t.col0:t.col0 + t.OC] += self.adapter.scale * ((self.dropped(l, t, x) @ A.t()) @ B.t())
        return out

    def dropped(self, l, t, x):
        """Target t's input x in layer l, in a training forward with dropout through the trainer's mask."""
        if self.dropout_at is None or not self.dropout:
            return x
        target = [u.name for u in lora_file.targets(self.cfg)].index(t.name)
        keep = lora_dropout_keep(self.dropout_seed, self.dropout_at, l, target, self.dropout, x[..., 0].numel(),
                                 x.shape[-1])
        return x * torch.as_tensor(keep.reshape(x.shape), dtype=x.dtype, device=x.device) / (1 - self.dropout)

    def adapter_now(self):
        """The adapter with the current A and B, as float32."""
        weights = {t.name: tuple(self.lora["lora_%s_%s" % (w, t.name)].detach().float().cpu().numpy()
                                 for w in "AB") for t in self.adapter.targets}
        a = self.adapter
        return lora_file.Adapter(a.cfg, a.R, a.alpha_x1000, a.rslora, a.bits, weights)

    def attention(self, q, k, v, doc=None):
        return causal_attention(q, k, v, self.sdpa, doc)

    def forward(self, idx, targets=None, pos=None, doc=None):
        """Returns (logits over the real V columns, the mean loss over the labels or None). pos, doc (B, T):
        each token's position in its document and the row index of its document's first token (None: the
        row is one document)."""
        cfg = self.cfg
        T = idx.shape[1]
        if T > cfg.maxT:
            raise ValueError("T=%d exceeds the model's maxT=%d" % (T, cfg.maxT))
        # The head covers all Vp rows; only the real vocabulary enters the softmax (padding is inert).
        logits = self.family.reference_logits(self, idx, pos, doc)[..., :cfg.V]
        return logits, None if targets is None else lm_loss(logits, targets, cfg.V)


def build_model(cfg, params, dtype, device, sdpa=False, fast=False, adapter=None):
    return Model(cfg, params, dtype, device, sdpa=sdpa, fast=fast, adapter=adapter)


# ------------------------------------------------------------------------------------------------------
# Optimization

def lr_at(step, args):
    """The design's schedule; step is 0-based."""
    lr, u, X = args.l, args.u, args.x
    if step < u:
        return lr * (step + 1) / u
    frac = (step - u) / max(1, X - u)
    lr_min = args.q * lr
    if args.k == "cosine":
        return lr_min + 0.5 * (1.0 + math.cos(math.pi * frac)) * (lr - lr_min)
    if args.k == "linear":
        return lr - frac * (lr - lr_min)
    return lr


class AdamW:
    """AdamW written out, so the update is exactly the spec's (and checked against torch.optim.AdamW in tests)."""

    def __init__(self, named_params, wd, decayed, b1=0.9, b2=0.95, eps=1e-8):
        self.named, self.decayed = named_params, decayed
        self.wd, self.b1, self.b2, self.eps, self.t = wd, b1, b2, eps, 0
        self.m = {n: torch.zeros_like(p) for n, p in named_params}
        self.v = {n: torch.zeros_like(p) for n, p in named_params}

    @torch.no_grad()
    def step(self, lr, grad_scale=1.0, t=None):
        """t: the bias corrections' step count, the 1-based index of the training step (the trainer's), which
        exceeds the count of updates when a step had no label to learn from; None: one more than the last."""
        self.t = self.t + 1 if t is None else t
        bc1, bc2 = 1.0 - self.b1 ** self.t, 1.0 - self.b2 ** self.t
        for n, p in self.named:
            g = p.grad * grad_scale
            self.m[n].mul_(self.b1).add_(g, alpha=1.0 - self.b1)
            self.v[n].mul_(self.b2).add_(g * g, alpha=1.0 - self.b2)
            update = (self.m[n] / bc1) / ((self.v[n] / bc2).sqrt() + self.eps)
            if n in self.decayed:
                update = update + self.wd * p
            p.sub_(lr * update)


def grad_norm(params):
    return math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))


def write_f32(path, arrays):
    with open(path, "wb") as f:
        for a in arrays:
            f.write(np.ascontiguousarray(a.detach().cpu().float().numpy()).tobytes())


def land(model, opt, pending):
    """Applies an update in flight (the gradients it saved, its LR, gradient scale and step); returns None."""
    if pending:
        grads, lr, scale, step = pending
        for p, g in zip(model.params(), grads):
            p.grad = g
        opt.step(lr, scale, step + 1)
    return None


def delayed_step(model, opt, step, lr, scale, pending, args, learns=True):
    """The optimizer's part of a step, with -dpu W: the update in flight (the last step's gradients) lands
    first; from step W on this step's update is only saved, to land a step later, except that every update
    lands after each -n-th step (the trainer's checkpoints), before a validation and at the end. A step that
    learns nothing (no label) makes no update of its own. Returns the update in flight."""
    current = ([p.grad.clone() for p in model.params()], lr, scale, step) if learns else None
    pending = land(model, opt, pending)
    if args.dpu and step >= args.dpu:
        pending = current
    else:
        pending = land(model, opt, current)
    if step + 1 == args.x or (args.n > 0 and (step + 1) % args.n == 0) or validating(args, step + 1):
        pending = land(model, opt, pending)
    return pending


def open_batches(args, cfg, pattern=None, ga=None):
    return Batches(Stream(pattern or args.i, cfg.V), args.b, args.t, ga or args.ga, args.pack, args.long, args.docmask,
                   args.doc_start, args.quiet)


def validating(args, step):
    """The trainer's rule: validation before step s when s is a multiple of -v, and after the last step."""
    return bool(args.j) and args.v > 0 and (step % args.v == 0 or step == args.x)


@torch.no_grad()
def validate(model, batches, count):
    """The trainer's validation: its first `count` windows (batch i reads window i), the sum of their labels'
    losses over their number."""
    total, labels = 0.0, 0
    for i in range(count):
        idx, tgt, pos, doc = as_tensors(*batches.batch(i, 0))
        logits, _ = model(idx, None, pos, doc)
        total += float(lm_loss(logits, tgt, model.cfg.V, reduction="sum"))
        labels += int((tgt != -1).sum())
    if not labels:
        die("the first %d validation batches hold no trained token" % count)
    return total / labels


def as_tensors(*arrays):
    return [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def accumulate(model, batches, step, dump=None):
    """The step's forward and backward passes over its -ga micro-batches: each parameter's gradient of
    (the sum of the labels' losses) / (the step's number of labels), the loss so divided, and that number.
    A step without a label has a NaN loss and zero gradients (and makes no update: delayed_step)."""
    cfg = model.cfg
    micro = [as_tensors(*batches.batch(step, m)) for m in range(batches.ga)]
    count = sum(int((tgt != -1).sum()) for _, tgt, _, _ in micro)
    for p in model.params():
        p.grad = torch.zeros_like(p)
    loss_sum = 0.0
    for m, (idx, tgt, pos, doc) in enumerate(micro):
        model.dropout_at = step * batches.ga + m   # the trainer's dataloader_position on one rank
        logits, _ = model(idx, None, pos, doc)
        model.dropout_at = None
        loss = lm_loss(logits, tgt, cfg.V, reduction="sum")
        if count:
            (loss / count).backward()
        loss_sum += float(loss.detach())
        if dump and m == 0:
            write_f32(os.path.join(dump, "logits0.f32"), [logits.reshape(-1, cfg.V)])
    return (loss_sum / count if count else float("nan")), count


def _hash_u32(x):
    """kernels/dtype.h's hash_u32 on a uint32 array (its products wrap as C's do)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7feb352d)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846ca68b)
    return x ^ (x >> np.uint32(16))


def _element_noise(seed, index):
    """kernels/dtype.h's element_noise: uint32 noise of each uint64 index under a uint32 seed."""
    index = np.asarray(index, np.uint64)
    lo, hi = (index & np.uint64(0xffffffff)).astype(np.uint32), (index >> np.uint64(32)).astype(np.uint32)
    return _hash_u32(np.uint32(seed) ^ _hash_u32(lo ^ _hash_u32(hi + np.uint32(0x9e3779b9))))


def lora_dropout_keep(seed, position, layer, target, P, rows, cols):
    """The trainer's dropout mask on an adapter's (rows, cols) input, True where kept: its key is
    core/model/lora.c's lora_dropout_key (LORA_MAX_TARGETS = 8 targets a layer), its test kernels/dtype.h's
    dropout_keeps."""
    run = _element_noise(seed & 0xffffffff, [seed >> 32])[0]
    key = _element_noise(_element_noise(run, [position])[0], [layer * 8 + target])[0]
    noise = _element_noise(key, np.arange(rows * cols, dtype=np.uint64))
    return ((noise >> np.uint32(8)).astype(np.float64) * 2.0 ** -24 >= np.float32(P)).reshape(rows, cols)


def lora_adapter(args, cfg):
    """The adapter -lora and its flags ask for (None without -lora): -lora-init's file, which must agree
    with the flags, or a fresh one."""
    if not args.lora:
        for flag in ("lora_init", "lora_targets", "lora_dropout"):
            if getattr(args, flag):
                die("-%s needs -lora R" % flag.replace("_", "-"))
        return None
    if not 0 <= args.lora_dropout < 1:
        die("-lora-dropout %g: must be in [0, 1)" % args.lora_dropout)
    order = [t.name for t in lora_file.targets(cfg)]
    bits = lora_file.target_bits(cfg, args.lora_targets.split(",") if args.lora_targets else order)
    ax = lora_file.alpha_x1000("-lora-alpha", args.lora if args.lora_alpha is None else args.lora_alpha)
    if not args.lora_init:
        return lora_file.zero_adapter(cfg, args.lora, ax, args.lora_rslora, bits, np.random.default_rng(args.seed))
    adapter = lora_file.read(args.lora_init, cfg)
    for what, file_has, flag in (("rank", adapter.R, args.lora), ("targets", adapter.bits, bits),
                                 ("alpha x1000", adapter.alpha_x1000, ax), ("rslora", int(adapter.rslora),
                                                                            args.lora_rslora)):
        if file_has != flag:
            die("-lora-init %s: its %s %s differs from the flags' %s" % (args.lora_init, what, file_has, flag))
    return adapter


def train(args, cfg, params, adapter=None):
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    model = build_model(cfg, params, dtype, "cpu", sdpa=args.sdpa, adapter=adapter)
    model.dropout, model.dropout_seed = args.lora_dropout, args.seed
    named = model.trainable()
    opt = AdamW(named, args.c, cfg.decayed if adapter is None else {n for n, _ in named})
    batches = open_batches(args, cfg)
    val = open_batches(args, cfg, args.j, 1) if validating(args, 0) else None
    log = open(os.path.join(args.o, "log.jsonl"), "w") if args.o else None
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)

    def log_line(rec):
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
    pending = None
    for step in range(args.x + 1):
        if validating(args, step):
            log_line({"step": step, "val_loss": validate(model, val, min(args.m, val.W))})
        if step == args.x:
            break
        t0 = time.time()
        loss_mean, labels = accumulate(model, batches, step, args.dump if step == 0 else None)
        norm = grad_norm(model.params())
        if step == 0 and args.dump:
            write_f32(os.path.join(args.dump, "grads0.f32"), [p.grad for p in model.params()])
            with open(os.path.join(args.dump, "loss0.txt"), "w") as f:
                f.write("%.9g\n" % loss_mean)
        scale = args.gc / norm if args.gc > 0 and norm > args.gc else 1.0
        lr = lr_at(step, args)
        pending = delayed_step(model, opt, step, lr, scale, pending, args, labels > 0)
        # A step without labels: its loss null, as the trainer logs it.
        log_line({"step": step, "loss": loss_mean if labels else None, "lr": lr, "grad_norm": norm, "trained": labels,
                  "dt_ms": (time.time() - t0) * 1e3})
        if not args.quiet:
            print("step %d loss %.6f lr %.3e grad_norm %.4f" % (step, loss_mean, lr, norm))
    if log:
        log.close()
    if args.o and adapter is not None:
        lora_file.write(os.path.join(args.o, "lora_final.bin"), model.adapter_now())
    elif args.o:
        save_model(os.path.join(args.o, "model_final.bin"), cfg,
                   {n: model.p[n].detach().float().numpy() for n in cfg.names})
    return model


@torch.no_grad()
def greedy(args, cfg, params):
    """The trainer's -temp 0 written out: N times, the most likely next token (the lowest id among equals)
    given the last -t tokens. Prints the ids and the smallest gap between the two most likely logits, below
    which float32 and float64 may rightly pick differently."""
    model = build_model(cfg, params, {"float64": torch.float64, "float32": torch.float32}[args.dtype], "cpu")
    try:
        ids = [int(x) for x in args.prompt_ids.split(",") if x]
    except ValueError:
        die("--prompt-ids %r: expected comma-separated token ids" % args.prompt_ids)
    if not ids:
        die("--greedy needs --prompt-ids")
    bad = [i for i in ids if not 0 <= i < cfg.V]
    if bad:
        die("--prompt-ids: token %d is outside the model's vocabulary of %d" % (bad[0], cfg.V))
    start, gap = len(ids), float("inf")
    for _ in range(args.greedy):
        window = ids[-args.t:]
        logits, _ = model(torch.tensor([window]))
        row = logits[0, -1, :cfg.V]
        top = torch.topk(row, 2).values
        gap = min(gap, float(top[0] - top[1]))
        best = float(row.max())
        ids.append(int((row == best).nonzero()[0]))
    print("ids: [%s]" % ", ".join(str(i) for i in ids[start:]))
    print("min_gap: %.9g" % gap)


# ------------------------------------------------------------------------------------------------------
EVAL_MAGIC, EVAL_ENDINGS = 20240522, 4


def read_evalfile(path, V):
    """[(context ids, [4 ending ids], label)] of an evaluation file (docs/formats.md: version 1 uint16
    elements, version 2 uint32), every field checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die("%s: %s" % (path, e.strerror))
    if len(data) < 1024:
        die("%s is shorter than its 1024-byte header" % path)
    magic, version, count, longest = (int(x) for x in np.frombuffer(data[:16], dtype="<i4"))
    if magic != EVAL_MAGIC or version not in (1, 2):
        die("%s: magic %d version %d is not an evaluation file's" % (path, magic, version))
    width = 2 * version
    if (len(data) - 1024) % width:
        die("%s ends in the middle of an element" % path)
    el = np.frombuffer(data[1024:], dtype="<u2" if version == 1 else "<u4").astype(np.int64).tolist()
    examples, pos = [], 0
    for i in range(count):
        head = el[pos:pos + 6]
        if len(head) < 6 or head[0] != (1 << 8 * width) - 1 or head[2] != i or not 0 <= head[3] < 4 or head[4] != 4:
            die("%s: example %d has a bad header %s" % (path, i, head))
        end, p = pos + head[1] // width, pos + 5
        parts = []
        for _ in range(1 + EVAL_ENDINGS):
            n = el[p] if p < end else 0
            parts.append(el[p + 1:p + 1 + n])
            p += 1 + n
            if n < 1 or p > end:
                die("%s: example %d has an empty or overlong part" % (path, i))
        if p != end or end > len(el) or head[1] > longest:
            die("%s: example %d's size does not match its fields or the header" % (path, i))
        if max(max(x) for x in parts) >= V:
            die("%s: example %d has a token outside the model's vocabulary of %d" % (path, i, V))
        examples.append((parts[0], parts[1:], head[3]))
        pos = end
    if pos != len(el):
        die("%s has bytes after its last example" % path)
    return examples


def ending_scores(model, ctx, endings):
    """Each ending's mean cross-entropy over its own tokens, each given everything before it."""
    scores = []
    for e in endings:
        row = ctx + e
        logits, _ = model(torch.tensor([row[:-1]]))
        nll = -torch.log_softmax(logits[0], dim=-1)[torch.arange(len(row) - 1), torch.tensor(row[1:])]
        scores.append(float(nll[len(ctx) - 1:].mean()))
    return scores


def hellaswag(args, cfg, params):
    """The trainer's -hs written out: an example whose context and longest ending exceed -t tokens is left
    out; the prediction is the ending of lowest mean loss, the first among equals (llm.c's acc_norm). Prints
    the count, the count by the summed loss instead (llm.c's acc), and the smallest gap between an example's
    two lowest scores, below which float32 and float64 may rightly pick differently."""
    model = build_model(cfg, params, {"float64": torch.float64, "float32": torch.float32}[args.dtype], "cpu")
    correct = by_sum = total = dropped = 0
    gap = float("inf")
    with torch.no_grad():
        for ctx, endings, label in read_evalfile(args.hellaswag, cfg.V):
            if len(ctx) + max(len(e) for e in endings) > args.t:
                dropped += 1
                continue
            scores = ending_scores(model, ctx, endings)
            sums = [s * len(e) for s, e in zip(scores, endings)]
            correct += min(range(EVAL_ENDINGS), key=lambda k: (scores[k], k)) == label
            by_sum += min(range(EVAL_ENDINGS), key=lambda k: (sums[k], k)) == label
            total += 1
            low = sorted(scores)
            gap = min(gap, low[1] - low[0])
    print("hellaswag: %d/%d correct, %d dropped, %d by the summed loss" % (correct, total, dropped, by_sum))
    print("min_gap: %.9g" % gap)


# ------------------------------------------------------------------------------------------------------
# Benchmark (GPU, PyTorch's fast paths); not a correctness reference.

def bench(args, cfg, params):
    try:
        dev = torch.device(args.device)
    except RuntimeError as e:
        die("--device %s: %s" % (args.device, str(e).splitlines()[0]))
    if dev.type == "cuda" and not torch.cuda.is_available():
        die("--device cuda but torch.cuda.is_available() is False")
    amp = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.dtype)
    master = torch.float32 if amp is not None else {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    sdpa = args.sdpa or hasattr(F, "scaled_dot_product_attention")
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        die("--sdpa needs PyTorch >= 2.0")
    if dev.type == "cuda" and args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(cfg, params, master, dev, sdpa=sdpa, fast=True)
    fwd = model
    if args.compile:
        if not hasattr(torch, "compile"):
            die("--compile needs PyTorch >= 2.0")
        fwd = torch.compile(model)
    groups = [{"params": [model.p[n] for n in cfg.names if n in cfg.decayed], "weight_decay": args.c},
              {"params": [model.p[n] for n in cfg.names if n not in cfg.decayed], "weight_decay": 0.0}]
    kw = {}
    import inspect
    if dev.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        kw["fused"] = True
    opt = torch.optim.AdamW(groups, lr=args.l, betas=(0.9, 0.95), eps=1e-8, **kw)
    if args.i:
        batches = open_batches(args, cfg)
        batch = lambda s, m: as_tensors(*batches.batch(s, m))
    else:
        g = torch.Generator().manual_seed(args.seed)
        fixed = torch.randint(0, cfg.V, (args.b, args.t + 1), generator=g)
        batch = lambda s, m: (fixed[:, :-1], fixed[:, 1:], None, None)

    def autocast():
        if amp is None:
            return torch.autocast(device_type=dev.type, enabled=False)
        return torch.autocast(device_type=dev.type, dtype=amp)

    timed = []
    for step in range(args.x):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=dev)
        for micro in range(args.ga):
            idx, tgt, pos, doc = (t if t is None else t.to(dev, non_blocking=True) for t in batch(step, micro))
            with autocast():
                _, loss = fwd(idx, tgt, pos, doc)
            (loss / args.ga).backward()
            loss_sum += loss.detach().float()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.gc if args.gc > 0 else float("inf"))
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, args)
        opt.step()
        if dev.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if step >= args.bench_warmup:
            timed.append(ms)
        if not args.quiet:
            print("step %d loss %.4f norm %.3f %.2f ms" % (step, float(loss_sum) / args.ga, float(norm), ms))
    if not timed:
        die("-x %d leaves no steps after --bench-warmup %d" % (args.x, args.bench_warmup))
    ms = float(np.median(timed))
    tok_s = args.b * args.t * args.ga / (ms / 1e3)
    rec = {"bench": "pytorch", "torch": torch.__version__, "device": args.device,
           "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "dtype": args.dtype, "compile": bool(args.compile), "sdpa": sdpa, "fused_adamw": bool(kw),
           "model": repr(cfg), "B": args.b, "T": args.t, "ga": args.ga, "steps_timed": len(timed),
           "ms_per_step_median": ms, "ms_per_step_mean": float(np.mean(timed)), "tok_s": tok_s}
    if dev.type == "cuda":
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2 ** 30
    print("bench: %.2f ms/step (median of %d), %.0f tokens/s" % (ms, len(timed), tok_s))
    if args.bench_out:
        with open(args.bench_out, "a") as f:
            f.write(json.dumps(rec) + "\n")


# ------------------------------------------------------------------------------------------------------

def main(argv=None):
    # Single-dash long flags (-ga, -gc, -dump) follow the trainer's CLI.
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-e", required=True, help="model file, a Hugging Face Llama, Qwen2 or Qwen3 folder, or a spec "
                    "as the trainer's -e takes it (d12, L2C64H4V512T64, smollm2-135m, "
                    "llama:L2,C64,H4,K2,F160,V512,T64,tied) for a random model")
    ap.add_argument("-i", help="token shard glob (sorted, concatenated); with a .mask file beside each shard, a "
                    "document dataset (scripts/reference_data.py)")
    ap.add_argument("-j", help="validation token shard glob (a document dataset if -i is one)")
    ap.add_argument("-v", type=int, default=20, help="with -j: validation loss every N steps and after the last")
    ap.add_argument("-m", type=int, default=20, help="validation batches")
    ap.add_argument("-pack", type=int, default=1, choices=[0, 1], help="a document dataset's rows: 1 packs whole "
                    "documents, best fit; 0 cuts the stream's windows (plain shards: always windows)")
    ap.add_argument("-long", default="drop", choices=["drop", "truncate"],
                    help="-pack 1: a document longer than -t is left out, or cut to its first -t tokens")
    ap.add_argument("-docmask", type=int, default=0, choices=[0, 1],
                    help="plain shards: documents start at the token --doc-start (own positions, own attention)")
    ap.add_argument("--doc-start", type=int, default=50256, help="-docmask 1's document-start token (GPT-2's 50256)")
    ap.add_argument("-b", type=int, default=4)
    ap.add_argument("-t", type=int, default=64)
    ap.add_argument("-ga", type=int, default=1)
    ap.add_argument("-x", type=int, default=10, help="steps")
    ap.add_argument("-l", type=float, default=3e-4, help="peak learning rate")
    ap.add_argument("-u", type=int, default=0, help="warm-up steps")
    ap.add_argument("-q", type=float, default=1.0, help="final LR as a fraction of -l")
    ap.add_argument("-k", default="cosine", choices=["cosine", "linear", "constant"])
    ap.add_argument("-c", type=float, default=0.0, help="weight decay (2-D tensors only)")
    ap.add_argument("-gc", type=float, default=1.0, help="clip the global grad norm to this (<= 0: off)")
    ap.add_argument("-o", help="output dir: log.jsonl, model_final.bin")
    ap.add_argument("-dpu", type=int, default=0, help="delay each update by one step from this step on (0: off)")
    ap.add_argument("--greedy", type=int, default=0, help="continue --prompt-ids by N most likely tokens")
    ap.add_argument("--prompt-ids", default="", help="comma-separated token ids for --greedy")
    ap.add_argument("--hellaswag", metavar="FILE", help="score an evaluation file as the trainer's -hs does, at -t")
    ap.add_argument("-n", type=int, default=0, help="with -dpu: every update lands after each N-th step")
    ap.add_argument("-dump", help="dir for logits0.f32, grads0.f32, loss0.txt (step 0)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=1337, help="random model init / bench tokens")
    ap.add_argument("--save", help="write the model (after loading or creating it, before training) here")
    ap.add_argument("--save-version", type=int, default=3, choices=[3, 5], help="3 = fp32, 5 = bf16")
    ap.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention (PyTorch >= 2.0)")
    ap.add_argument("--bench", action="store_true", help="time training steps (PyTorch fast paths)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (bench, PyTorch >= 2.0)")
    ap.add_argument("--tf32", action="store_true", help="bench: allow TF32 matmuls for float32")
    ap.add_argument("--bench-warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--bench-out", help="append the bench result as one JSON line")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("-lora", type=int, default=0, help="LoRA rank: train adapters of this rank, the base frozen")
    ap.add_argument("-lora-alpha", type=float, help="LoRA alpha (default: the rank, a scale of 1)")
    ap.add_argument("-lora-rslora", type=int, default=0, choices=[0, 1], help="scale alpha / sqrt(R), not alpha / R")
    ap.add_argument("-lora-dropout", type=float, default=0.0,
                    help="dropout on the adapters' input in training, the trainer's mask (seeded by --seed)")
    ap.add_argument("-lora-targets", help="comma-separated targets (default: every linear layer of the family)")
    ap.add_argument("-lora-init", metavar="FILE", help="start from this adapter file")
    args = ap.parse_args(argv)
    for flag in ("b", "t", "ga"):
        if getattr(args, flag) <= 0:
            die("-%s must be positive" % flag)
    if args.x < 0 or args.u < 0:
        die("-x and -u must be >= 0")

    if os.path.isdir(args.e):
        cfg, params = load_hf_folder(args.e)
    elif os.path.exists(args.e) or args.e.endswith(".bin"):
        cfg, params = load_model(args.e)
    else:
        cfg = parse_spec(args.e)
        params = random_params(cfg, args.seed)
    if args.save:
        save_model(args.save, cfg, params, args.save_version)
    if (args.x > 0 or args.greedy or args.hellaswag) and args.t > cfg.maxT:
        die("-t %d exceeds the model's maxT %d" % (args.t, cfg.maxT))
    if args.o:
        if os.path.exists(args.o) and not os.path.isdir(args.o):
            die("-o %s exists and is not a directory" % args.o)
        os.makedirs(args.o, exist_ok=True)
    adapter = lora_adapter(args, cfg)
    if adapter is not None and (args.bench or args.greedy or args.hellaswag):
        die("-lora trains; --bench, --greedy and --hellaswag run the base model")
    if args.bench:
        bench(args, cfg, params)
        return
    if args.dtype not in ("float64", "float32"):
        die("--dtype %s is for --bench; the reference computes in float64 or float32" % args.dtype)
    if args.device != "cpu":
        die("the reference runs on the CPU; --device is for --bench")
    if args.greedy:
        greedy(args, cfg, params)
        return
    if args.hellaswag:
        hellaswag(args, cfg, params)
        return
    if args.x > 0:
        if not args.i:
            die("-i SHARDS is needed to train")
        torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
        train(args, cfg, params, adapter)


if __name__ == "__main__":
    main()
