"""A second, deliberately plain float64 Llama: the model-file format read and written from docs/formats.md,
and the forward pass written position by position and head by head (RoPE as explicit rotation matrices,
the kv heads repeated by an explicit list, attention as sums of weighted values, softmax from exp), so that
it shares no code and no vectorized shortcut with scripts/reference.py, which it checks. Slow; for models of
a few thousand parameters.
"""
import math

import numpy as np
import torch

MODEL_MAGIC, SHARD_MAGIC = 20240326, 20240520


def f32_bits(x):
    return int(np.array([x], dtype=np.float32).view(np.int32)[0])


def bits_f32(i):
    return float(np.array([i], dtype=np.int32).view(np.float32)[0])


def make_fields(maxT, V, L, NH, C, KV, D, F, tied=0, qk_norm=0, theta=10000.0, eps=1e-5, rope=0, factor=0.0,
                low=0.0, high=0.0, orig=0, qkv_bias=0):
    """The header's fields, the floats rounded to float32 as the file holds them."""
    r = lambda x: bits_f32(f32_bits(x))
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=(V + 127) // 128 * 128, family=1, KV=KV, D=D, F=F,
                tied=tied, qk_norm=qk_norm, rope=rope, theta=r(theta), eps=r(eps), factor=r(factor), low=r(low),
                high=r(high), orig=orig, qkv_bias=qkv_bias)


def header_ints(f, version):
    h = [0] * 256
    h[0:8] = [MODEL_MAGIC, version, f["maxT"], f["V"], f["L"], f["NH"], f["C"], f["Vp"]]
    h[8:15] = [f["family"], f["KV"], f["D"], f["F"], f["tied"], f["qk_norm"], f["rope"]]
    h[15:20] = [f32_bits(f[k]) for k in ("theta", "eps", "factor", "low", "high")]
    h[20], h[21] = f["orig"], f["qkv_bias"]
    return h


def fields_of(h):
    names = ["magic", "version", "maxT", "V", "L", "NH", "C", "Vp", "family", "KV", "D", "F", "tied", "qk_norm",
             "rope"]
    f = {n: int(h[i]) for i, n in enumerate(names)}
    for i, n in enumerate(("theta", "eps", "factor", "low", "high")):
        f[n] = bits_f32(int(h[15 + i]))
    f["orig"], f["qkv_bias"] = int(h[20]), int(h[21])
    return f


def tensors(f):
    """[(name, shape)] in file order, from the format's table."""
    Vp, L, NH, C, KV, D, F = f["Vp"], f["L"], f["NH"], f["C"], f["KV"], f["D"], f["F"]
    t = [("wte", (Vp, C)), ("attn_norm", (L, C)), ("wq", (L, NH * D, C)), ("wkv", (L, 2 * KV * D, C))]
    if f["qkv_bias"]:
        t += [("bq", (L, NH * D)), ("bkv", (L, 2 * KV * D))]
    if f["qk_norm"]:
        t += [("q_norm", (L, D)), ("k_norm", (L, D))]
    t += [("attn_proj", (L, C, NH * D)), ("mlp_norm", (L, C)), ("gate_up", (L, 2 * F, C)), ("down", (L, C, F)),
          ("final_norm", (C,))]
    if not f["tied"]:
        t.append(("lm_head", (Vp, C)))
    return t


def numel(f):
    return sum(int(np.prod(s)) for _, s in tensors(f))


def split(flat, f):
    out, off = {}, 0
    for name, shape in tensors(f):
        n = int(np.prod(shape))
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    assert off == flat.size, "payload of %d values, the tensors take %d" % (flat.size, off)
    return out


def read_model(path):
    """(fields, version, {name: float64 array}); fp32 (3) and bf16 (5) payloads."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], dtype=np.int32)
    f = fields_of(h)
    body = raw[1024:]
    if f["version"] == 3:
        flat = np.frombuffer(body, dtype=np.float32).astype(np.float64)
    else:
        u = np.frombuffer(body, dtype=np.uint16).astype(np.uint32) << 16
        flat = u.view(np.float32).astype(np.float64)
    return f, f["version"], split(flat, f)


def write_model(path, f, params, version=3):
    flat = np.concatenate([np.asarray(params[n], dtype=np.float32).reshape(-1) for n, _ in tensors(f)])
    if version == 5:
        # Truncation, not rounding: the values written are the values meant, so no rounding rule matters.
        body = (flat.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        body = flat.tobytes()
    with open(path, "wb") as fh:
        fh.write(np.array(header_ints(f, version), dtype=np.int32).tobytes())
        fh.write(body)


def random_params(f, seed, version=3):
    """Every value random and O(1) in effect (norm weights around 1, not 1), padded vocabulary rows zero.
    For version 5 the values are made exactly representable in bf16."""
    g = np.random.default_rng(seed)
    p = {}
    for name, shape in tensors(f):
        if name.endswith("norm"):
            p[name] = 1.0 + 0.3 * g.standard_normal(shape)
        elif name in ("wte", "bq", "bkv"):
            p[name] = g.standard_normal(shape)
        else:
            p[name] = g.standard_normal(shape) / math.sqrt(shape[-1])
        p[name] = p[name].astype(np.float32)
        if version == 5:
            p[name] = ((p[name].view(np.uint32) >> 16) << 16).view(np.float32)
    p["wte"][f["V"]:] = 0
    if "lm_head" in p:
        p["lm_head"][f["V"]:] = 0
    return p


def write_shard(path, tokens):
    h = np.zeros(256, dtype=np.int32)
    h[:3] = [SHARD_MAGIC, 1, len(tokens)]
    with open(path, "wb") as fh:
        fh.write(h.tobytes())
        fh.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def inv_freq(f):
    """One frequency at a time, each case of the rope-scaling rule spelled out."""
    D, out = f["D"], []
    for i in range(D // 2):
        w = 1.0 / (f["theta"] ** (2.0 * i / D))
        if f["rope"] == 1:
            w = w / f["factor"]
        elif f["rope"] == 2:
            wavelen = 2.0 * math.pi / w
            if wavelen > f["orig"] / f["low"]:
                w = w / f["factor"]
            elif wavelen < f["orig"] / f["high"]:
                pass
            else:
                s = (f["orig"] / wavelen - f["low"]) / (f["high"] - f["low"])
                w = (1.0 - s) * (w / f["factor"]) + s * w
        out.append(w)
    return out


def rotation(f, pos):
    """The D x D matrix that turns each pair (i, i + D/2) by pos * inv_freq[i]."""
    D = f["D"]
    half = D // 2
    R = np.zeros((D, D))
    for i, w in enumerate(inv_freq(f)):
        c, s = math.cos(pos * w), math.sin(pos * w)
        R[i, i], R[i, i + half] = c, -s
        R[i + half, i], R[i + half, i + half] = s, c
    return torch.tensor(R, dtype=torch.float64)


def rms(v, w, eps):
    return v / torch.sqrt((v * v).sum() / v.shape[0] + eps) * w


def forward(f, P, idx):
    """P: {name: float64 tensor}; idx: list of B lists of T token ids. Returns logits, B x T x V."""
    L, NH, KV, D, F, V, eps = f["L"], f["NH"], f["KV"], f["D"], f["F"], f["V"], f["eps"]
    kv_of = [j for j in range(KV) for _ in range(NH // KV)]
    T = len(idx[0])
    rots = [rotation(f, t) for t in range(T)]
    head = P["wte"] if f["tied"] else P["lm_head"]
    rows = []
    for seq in idx:
        xs = [P["wte"][tok] for tok in seq]
        for l in range(L):
            qs, ks, vs = [], [], []
            for t in range(T):
                n1 = rms(xs[t], P["attn_norm"][l], eps)
                z = torch.cat([P["wq"][l] @ n1, P["wkv"][l] @ n1])
                if f["qkv_bias"]:
                    z = z + torch.cat([P["bq"][l], P["bkv"][l]])
                q = [z[h * D:(h + 1) * D] for h in range(NH)]
                k = [z[(NH + j) * D:(NH + j + 1) * D] for j in range(KV)]
                v = [z[(NH + KV + j) * D:(NH + KV + j + 1) * D] for j in range(KV)]
                if f["qk_norm"]:
                    q = [rms(a, P["q_norm"][l], eps) for a in q]
                    k = [rms(a, P["k_norm"][l], eps) for a in k]
                qs.append([rots[t] @ a for a in q])
                ks.append([rots[t] @ a for a in k])
                vs.append(v)
            new = []
            for t in range(T):
                heads = []
                for h in range(NH):
                    j = kv_of[h]
                    scores = torch.stack([(qs[t][h] * ks[s][j]).sum() / math.sqrt(D) for s in range(t + 1)])
                    e = torch.exp(scores - scores.max())
                    wts = e / e.sum()
                    heads.append(sum(wts[s] * vs[s][j] for s in range(t + 1)))
                hx = xs[t] + P["attn_proj"][l] @ torch.cat(heads)
                gu = P["gate_up"][l] @ rms(hx, P["mlp_norm"][l], eps)
                g, u = gu[:F], gu[F:]
                new.append(hx + P["down"][l] @ (g / (1.0 + torch.exp(-g)) * u))
            xs = new
        rows.append(torch.stack([head[:V] @ rms(x, P["final_norm"], eps) for x in xs]))
    return torch.stack(rows)


def loss_of(logits, targets):
    """Mean over positions of -log softmax(logits)[target]."""
    total, n = 0.0, 0
    for b, seq in enumerate(targets):
        for t, y in enumerate(seq):
            row = logits[b, t]
            m = row.max()
            total = total + (torch.log(torch.exp(row - m).sum()) + m - row[y])
            n += 1
    return total / n


def batch(tokens, B, T, ga, step, micro):
    """The trainer's single-rank data order: B*T+1 tokens at ((step*ga + micro) mod W) * B*T."""
    W = (len(tokens) - 1) // (B * T)
    start = ((step * ga + micro) % W) * B * T
    buf = [int(x) for x in tokens[start:start + B * T + 1]]
    return ([buf[b * T:(b + 1) * T] for b in range(B)], [buf[b * T + 1:(b + 1) * T + 1] for b in range(B)])


def lr_at(step, lr, warmup, steps, final_frac):
    if step < warmup:
        return lr * (step + 1) / warmup
    lo = final_frac * lr
    return lo + 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) * (lr - lo)


def train(f, params, tokens, B, T, ga, steps, lr, warmup, final_frac, wd, clip):
    """AdamW (0.9, 0.95, 1e-8) with decoupled decay on the 2-D tensors only, global-norm clipping, cosine
    schedule. Returns ([{step, loss, lr, grad_norm}], final {name: float64 array})."""
    P = {n: torch.tensor(params[n], dtype=torch.float64, requires_grad=True) for n, _ in tensors(f)}
    m = {n: np.zeros(p.shape) for n, p in P.items()}
    v = {n: np.zeros(p.shape) for n, p in P.items()}
    two_d = [n for n, s in tensors(f) if n in ("wte", "wq", "wkv", "attn_proj", "gate_up", "down", "lm_head")]
    log = []
    for step in range(steps):
        for p in P.values():
            p.grad = None
        losses = []
        for micro in range(ga):
            x, y = batch(tokens, B, T, ga, step, micro)
            loss = loss_of(forward(f, P, x), y)
            (loss / ga).backward()
            losses.append(float(loss))
        grads = {n: P[n].grad.numpy().copy() for n in P}
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        scale = clip / norm if clip > 0 and norm > clip else 1.0
        rate = lr_at(step, lr, warmup, steps, final_frac)
        t = step + 1
        with torch.no_grad():
            for n, p in P.items():
                g = grads[n] * scale
                m[n] = 0.9 * m[n] + 0.1 * g
                v[n] = 0.95 * v[n] + 0.05 * g * g
                upd = (m[n] / (1 - 0.9 ** t)) / (np.sqrt(v[n] / (1 - 0.95 ** t)) + 1e-8)
                if n in two_d:
                    upd = upd + wd * p.numpy()
                p -= torch.tensor(rate * upd)
        log.append({"step": step, "loss": sum(losses) / ga, "lr": rate, "grad_norm": norm, "clipped": scale < 1})
    return log, {n: p.detach().numpy() for n, p in P.items()}
