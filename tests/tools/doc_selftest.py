#!/usr/bin/env python3
"""Checks the reference's documents (scripts/reference_data.py and the document paths of scripts/reference.py)
before they judge the trainer: mask files and their refusals, best fit, the slots of packed rows and of
stream windows worked out by hand, block-diagonal attention against loops, a packed row giving each
conversation the logits and loss it has alone (GPT-2 and Llama), the first assistant token's label, and the
loss over a step's labels. Prints "ok NAME" / "FAIL NAME: why"; exit 1 on any FAIL.
Usage: doc_selftest.py TMPDIR
"""
import importlib.util
import math
import os
import sys
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")


def load(name, path):
    """A module by path: putting scripts/ on sys.path would let scripts/tokenize.py shadow the stdlib's."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ref = load("reference", os.path.join(SCRIPTS, "reference.py"))
rd = sys.modules["reference_data"]   # as reference.py imported it
dd = load("doc_dataset", os.path.join(HERE, "doc_dataset.py"))
families = ref.families
sys.path.insert(0, HERE)
from refusals import assert_refused  # noqa: E402

TMP = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
CHECKS, FAILED = [], []
T_, D_ = rd.TRAINED, rd.DOC_START


def check(fn):
    CHECKS.append(fn)
    return fn


class StreamOf:
    """A Stream made in memory."""

    def __init__(self, tokens, mask):
        self.tokens = np.asarray(tokens, np.int64)
        self.mask = None if mask is None else np.asarray(mask, np.uint8)


def random_model(spec, seed=0, scale=0.3):
    """A model of the spec with every tensor random and O(1): no term is trivially 0."""
    cfg = families.from_spec(spec)
    g = np.random.default_rng(seed)
    p = {n: (g.standard_normal(s) * scale).astype(np.float32) for n, s in zip(cfg.names, cfg.shapes())}
    return cfg, p


MODELS = {"gpt2": "L2C16H2V64T64", "llama": "llama:L2,C16,H4,K2,F24,V64,T64,qknorm"}


def expect_error(args, needle):
    """reference.main(args) exits 1 with one line naming the problem."""
    assert_refused(ref.main, args, needle, needle)


# ------------------------------------------------------------------------------------------------------

@check
def doc_mask_files():
    """doc_dataset.py's shards read as a document dataset: one DOC_START per conversation, masks in step with
    the tokens across two shards; each broken rule of the format is a one-line error naming the file."""
    d = os.path.join(TMP, "maskfiles")
    rng = np.random.default_rng(4)
    convs = [dd.conversation(rng, 64, 20) for _ in range(6)]
    dd.write_dataset(d, "c", convs, 2, 0, 4)
    s = rd.Stream(os.path.join(d, "c_train_*.bin"), 64)
    assert s.tokens.tolist() == [t for c in convs for t in c[0]] and s.mask.tolist() == [m for c in convs for m in c[1]]
    assert len(rd.documents(s.mask)) == 6
    shard, mask = os.path.join(d, "c_train_000002.bin"), os.path.join(d, "c_train_000002.mask")
    good = open(mask, "rb").read()
    run = ["-e", "L1C8H2V64T8", "-i", os.path.join(d, "c_train_*.bin"), "-x", "1", "-t", "4", "-b", "1"]
    cases = [(good[:-1], "shard has"), (good[:1024] + bytes([D_ | T_]) + good[1025:], "has mask 3"),
             (good[:1024] + bytes([0]) + good[1025:], "does not start a document"),
             (good[:1024] + bytes([D_, 4]) + good[1026:], "has mask 4"),
             (good[:12] + b"\x07" + good[13:], "of set")]
    for blob, needle in cases:
        open(mask, "wb").write(blob)
        expect_error(run, needle)
    os.remove(mask)
    expect_error(run, "1 of 2 shards have a mask file, %s has none" % shard)
    open(mask, "wb").write(good)


@check
def doc_best_fit():
    """Worked by hand: the least free room that holds a document, the lowest row among equals, a new row
    when none holds it; where first fit would differ."""
    assert rd.best_fit([5, 3, 4, 2, 6, 1], 8) == [[0, 1], [2, 3, 5], [4]]
    assert rd.best_fit([4, 6, 2], 8) == [[0], [1, 2]]          # first fit would put 2 into row 0
    assert rd.best_fit([3, 3, 2, 2, 2], 5) == [[0, 2], [1, 3], [4]]   # ties: the lowest row
    assert rd.best_fit([8, 8], 8) == [[0], [1]]


@check
def doc_packed_slots():
    """-pack 1's rows, worked by hand: tokens, positions, document starts and targets (a label only where the
    next token of the same document is trained), padding as a document of its own; -long drop and truncate."""
    #            doc A (5)           doc B (3)     doc C (7, longer than T=6)
    tokens = [1, 10, 11, 12, 13, 1, 20, 21, 1, 30, 31, 32, 33, 34, 35]
    mask = [D_, 0, T_, T_, 0, D_, T_, T_, D_, 0, T_, T_, T_, T_, T_]
    s = StreamOf(tokens, mask)
    rows, longer, ndocs = rd.pack(s, 6, "drop")
    assert (longer, ndocs) == (1, 3)
    assert rows.tokens.tolist() == [[1, 10, 11, 12, 13, 0], [1, 20, 21, 0, 0, 0]]
    assert rows.pos.tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 0, 1, 2]]
    assert rows.doc.tolist() == [[0, 0, 0, 0, 0, 5], [0, 0, 0, 3, 3, 3]]
    assert rows.target.tolist() == [[-1, 11, 12, -1, -1, -1], [20, 21, -1, -1, -1, -1]]
    rows, longer, _ = rd.pack(s, 6, "truncate")
    assert longer == 1 and rows.tokens.tolist()[2] == [1, 30, 31, 32, 33, 34]
    assert rows.target.tolist()[2] == [-1, 31, 32, 33, 34, -1]   # the cut document's last token: no label
    # At T=8, B fills A's row exactly and C (7 tokens) opens a second one.
    rows, longer, _ = rd.pack(s, 8, "drop")
    assert longer == 0 and rows.tokens.tolist()[0] == [1, 10, 11, 12, 13, 1, 20, 21] and rows.tokens.shape[0] == 2
    assert rows.doc.tolist()[0] == [0] * 5 + [5] * 3 and rows.pos.tolist()[0] == [0, 1, 2, 3, 4, 0, 1, 2]


@check
def doc_stream_windows():
    """-pack 0 and -docmask 1, worked by hand: a row that opens inside a document starts a document at 0;
    with masks the next token is a label only when trained and not a document's start; -docmask 1 on plain
    shards trains every next token."""
    tokens = [1, 10, 11, 1, 20, 21, 22, 1, 30]
    mask = [D_, 0, T_, D_, 0, T_, T_, D_, T_]
    b = rd.Batches(StreamOf(tokens, mask), 2, 4, 1, pack_rows=0, quiet=True)
    x, tgt, pos, doc = b.batch(0, 0)
    assert x.tolist() == [[1, 10, 11, 1], [20, 21, 22, 1]]
    assert doc.tolist() == [[0, 0, 0, 3], [0, 0, 0, 3]] and pos.tolist() == [[0, 1, 2, 0], [0, 1, 2, 0]]
    assert tgt.tolist() == [[-1, 11, -1, -1], [21, 22, -1, 30]]
    plain = rd.Batches(StreamOf(tokens, None), 2, 4, 1, docmask=1, doc_start=1, quiet=True)
    x, tgt, pos, doc = plain.batch(0, 0)
    assert doc.tolist() == [[0, 0, 0, 3], [0, 0, 0, 3]] and tgt.tolist() == [[10, 11, 1, 20], [21, 22, 1, 30]]
    x, tgt, pos, doc = rd.Batches(StreamOf(tokens, None), 2, 4, 1, quiet=True).batch(0, 0)
    assert pos is None and doc is None and tgt.tolist() == [[10, 11, 1, 20], [21, 22, 1, 30]]


@check
def doc_attention_vs_loops():
    """Block-diagonal causal attention against its definition written as loops (and PyTorch's sdpa where
    present)."""
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 7, 4
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    doc = torch.tensor([[0, 0, 0, 3, 3, 5, 5], [0, 1, 1, 1, 1, 1, 6]])
    want = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                keys = range(int(doc[b, t]), t + 1)
                s = torch.stack([q[b, h, t] @ k[b, h, j] for j in keys]) / math.sqrt(D)
                want[b, h, t] = sum(a * v[b, h, j] for a, j in zip(torch.softmax(s, 0), keys))
    for sdpa in (False, True) if hasattr(torch.nn.functional, "scaled_dot_product_attention") else (False,):
        err = (ref.causal_attention(q, k, v, sdpa, doc) - want).abs().max().item()
        assert err < 1e-12, "sdpa=%s: %.1e" % (sdpa, err)


def three_conversations(V, seed):
    rng = np.random.default_rng(seed)
    return [dd.conversation(rng, V, 16) for _ in range(3)]


def alone_vs_packed(model, convs, pos_reset=True, doc_mask=True):
    """The largest difference between each conversation's logits (and loss) in one packed row and alone."""
    s = StreamOf([t for c in convs for t in c[0]], [m for c in convs for m in c[1]])
    rows, _, _ = rd.pack(s, 48, "drop")
    assert rows.tokens.shape[0] == 1, "the three conversations fill more than one row"
    x, tgt, pos, doc = ref.as_tensors(rows.tokens, rows.target, rows.pos, rows.doc)
    if not pos_reset:
        pos = torch.arange(48)[None]
    logits, _ = model(x, None, pos, doc if doc_mask else None)
    worst, at = 0.0, 0
    for tokens, mask in convs:
        n = len(tokens)
        alone, _ = model(x[:, at:at + n])
        got = logits[:, at:at + n]
        loss_packed = ref.lm_loss(got, tgt[:, at:at + n], model.cfg.V)
        want_tgt = torch.tensor([[t if m & T_ else -1 for t, m in zip(tokens[1:], mask[1:])] + [-1]])
        loss_alone = ref.lm_loss(alone, want_tgt, model.cfg.V)
        worst = max(worst, (got - alone).abs().max().item(), abs(loss_packed.item() - loss_alone.item()))
        at += n
    return worst


@check
def doc_packed_row_equals_alone():
    """A packed row gives each of three conversations the logits and the loss it has alone (GPT-2: wpe[pos];
    Llama: RoPE at pos), to float64's rounding; without the attention mask it does not (the check can fail),
    nor for GPT-2 without the position reset. (RoPE's scores depend on positions' differences only: within
    a document, positions that keep counting give Llama the same numbers up to rounding.)"""
    for family, spec in MODELS.items():
        cfg, p = random_model(spec)
        model = ref.Model(cfg, p, torch.float64, "cpu")
        convs = three_conversations(cfg.V, 5)
        with torch.no_grad():
            err = alone_vs_packed(model, convs)
            assert err < 1e-12, "%s: packed differs from alone by %.2e" % (family, err)
            for what in ({"pos_reset": False}, {"doc_mask": False})[family == "llama":]:
                err = alone_vs_packed(model, convs, **what)
                assert err > 1e-3, "%s with %s: still equal (%.2e): the check cannot fail" % (family, what, err)


@check
def doc_first_assistant_label():
    """In a rendered conversation the label at the assistant header's last token is the first assistant token
    (trained), the one before it (the header's own) is not, the closing END_OF_TURN is a label and the
    conversation's last token has none: in -pack 1's rows and -pack 0's windows alike."""
    rng = np.random.default_rng(7)
    tokens, mask = dd.conversation(rng, 64, 30)
    first = mask.index(T_)
    assert tokens[first - 3:first] == [dd.HEADER_START, dd.ROLES["assistant"], dd.HEADER_END]
    s = StreamOf(tokens + tokens, mask + mask)
    rows, _, _ = rd.pack(s, len(tokens), "drop")
    n = len(tokens)
    win = rd.Batches(s, 1, 2 * n - 1, 1, pack_rows=0, quiet=True).batch(0, 0)[1][0]
    for tgt in (rows.target[0], win[:n]):
        assert tgt[first - 1] == tokens[first], "the first assistant token is not the label of the header's end"
        assert tgt[first - 2] == -1, "the header's end is a label"
        eot = first + tokens[first:].index(dd.END_OF_TURN)
        assert tgt[eot - 1] == dd.END_OF_TURN and tgt[n - 1] == -1
        assert sorted(np.flatnonzero(tgt != -1) + 1) == [i for i in range(n) if mask[i] & T_]


@check
def doc_loss_over_step_labels():
    """accumulate(): -ga 2 micro-batches of different label counts give the loss and the gradients of one
    batch of both (the sum over the step's labels / their number), not the mean of the two means."""
    cfg, p = random_model(MODELS["llama"], seed=2)
    rng = np.random.default_rng(3)
    convs = [dd.conversation(rng, cfg.V, 16) for _ in range(12)]
    s = StreamOf([t for c in convs for t in c[0]], [m for c in convs for m in c[1]])
    m2 = ref.Model(cfg, p, torch.float64, "cpu")
    loss2, count = ref.accumulate(m2, rd.Batches(s, 1, 16, 2, quiet=True), 0)
    b1 = rd.Batches(s, 2, 16, 1, quiet=True)
    x, tgt, pos, doc = ref.as_tensors(*b1.batch(0, 0))
    assert count == int((tgt != -1).sum()) and int((tgt[0] != -1).sum()) != int((tgt[1] != -1).sum())
    m1 = ref.Model(cfg, p, torch.float64, "cpu")
    loss1 = m1(x, tgt, pos, doc)[1]
    loss1.backward()
    assert abs(loss1.item() - loss2) < 1e-13, "%r vs %r" % (loss1.item(), loss2)
    for n in cfg.names:
        e = (m1.p[n].grad - m2.p[n].grad).abs().max().item()
        assert e < 1e-13, "%s gradient differs by %.2e" % (n, e)
    with torch.no_grad():
        means = [m1(x[i:i + 1], tgt[i:i + 1], pos[i:i + 1], doc[i:i + 1])[1].item() for i in range(2)]
    assert abs(sum(means) / 2 - loss2) > 1e-4, "the mean of means equals the loss: the check cannot fail"


def main():
    os.makedirs(TMP, exist_ok=True)
    for fn in CHECKS:
        try:
            fn()
            print("ok " + fn.__name__)
        except Exception as e:  # one failing check must not hide the others
            msg = str(e) or traceback.format_exc().strip().splitlines()[-1]
            print("FAIL %s: %s" % (fn.__name__, msg.replace("\n", " ")[:400]))
            FAILED.append(fn.__name__)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
