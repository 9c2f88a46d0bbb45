#!/usr/bin/env python3
"""The trainer's documents judged from its step-0 dumps (-dump DIR: logits0.f32 of the first micro-batch,
loss0.txt), for tests/system/t_sft_reference.sh. Prints "ok NAME" / "FAIL NAME: why"; exit 1 on a FAIL.
Reads the data with scripts/reference_data.py (numpy alone: no PyTorch to import).

  doc_trainer_check.py model OUT.bin SPEC [OUT.bin SPEC ...]
      a model file of SPEC with every tensor N(0, 0.3^2) (norm weights 1 + that): logits of O(1), so that
      tokens' losses differ by O(1) and a misplaced label moves the mean far beyond rounding
  doc_trainer_check.py check PREFIX 'GLOB' T ROW_DUMP ALONE_DUMP...
      -b 1 -ga 1 one-rank runs. PREFIX_packed_row_as_alone: the data's first row holds the conversations
      whose alone runs follow, in row order; each one's logits and loss in the row equal its alone run's
      (1e-5), and each alone run's loss0 is that conversation's loss. PREFIX_first_assistant_token_trained:
      the row's loss0 is the mean loss of exactly the positions whose next token is trained in the same
      document, computed from the trainer's own logits; the mean with the labels shifted by one either way,
      without each turn's first assistant token's label, or with each role header's last label, is not
"""
import os
import sys

import numpy as np

# scripts/ last on the path: first, its tokenize.py would shadow the standard library's.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import families  # noqa: E402
import model_file  # noqa: E402
import reference_data as rd  # noqa: E402

FAILED = []


def report(name, bad):
    print("ok %s" % name if not bad else "FAIL %s: %s" % (name, bad))
    if bad:
        FAILED.append(name)


def make_model(out, spec, scale=0.3):
    cfg = families.from_spec(spec)
    g = np.random.default_rng(11)
    p = {n: (g.standard_normal(s) * scale).astype(np.float32) for n, s in zip(cfg.names, cfg.shapes())}
    for n in cfg.names:
        if cfg.init(n) == model_file.INIT_ONES:
            p[n] += 1.0
    for n in cfg.vocab_tensors:
        p[n][cfg.V:] = 0
    model_file.save_model(out, cfg, p)


def dump(d, T):
    """(the logits of the dump's first row, (T, V) float64; loss0)."""
    logits = np.fromfile(os.path.join(d, "logits0.f32"), np.float32).astype(np.float64)
    return logits.reshape(-1, T, logits.size // T)[0] if logits.size % T == 0 else None, \
        float(open(os.path.join(d, "loss0.txt")).read())


def token_losses(logits, tokens):
    """loss[t] of predicting tokens[t + 1] from the logits at t (the last position: nan)."""
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    out = np.full(len(tokens), np.nan)
    out[:-1] = lse[:-1] - logits[np.arange(len(tokens) - 1), tokens[1:]]
    return out


def first_row(glob_pattern, V, T):
    """The rows -pack 1 makes of the data, and the (start, end) of each document of the first row (not its
    padding)."""
    rows, _, _ = rd.pack(rd.Stream(glob_pattern, V), T, "drop")
    starts = sorted(set(rows.doc[0].tolist()))
    spans = zip(starts, starts[1:] + [T])
    return rows, [(s, e) for s, e in spans if s < rows.used[0]]


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def alone(name, pattern, T, packed, singles):
    logits, loss0 = dump(packed, T)
    if logits is None:
        return report(name, "%s/logits0.f32 is not a multiple of -t %d" % (packed, T))
    rows, docs = first_row(pattern, logits.shape[1], T)
    if len(docs) != len(singles):
        return report(name, "the first row holds %d conversations, %d alone runs given" % (len(docs), len(singles)))
    bad, worst = [], 0.0
    for k, ((s, e), d) in enumerate(zip(docs, singles)):
        one, one_loss = dump(d, T)
        tokens, target = rows.tokens[0, s:e], rows.target[0, s:e]
        labels = target != -1
        loss_packed = token_losses(logits[s:e], tokens)[labels].mean()
        loss_alone = token_losses(one[:e - s], tokens)[labels].mean()
        err = rel(logits[s:e], one[:e - s])
        worst = max(worst, err)
        if err > 1e-5:
            bad.append("conversation %d's logits in the row differ from alone by %.2e" % (k, err))
        if abs(loss_packed - loss_alone) > 1e-5 * loss_alone or abs(one_loss - loss_alone) > 1e-5 * loss_alone:
            bad.append("conversation %d: loss %.7g in the row, %.7g alone, the alone run's loss0 %.7g"
                       % (k, loss_packed, loss_alone, one_loss))
    print("#   %s: %d conversations, logits within %.1e of alone" % (name, len(docs), worst))
    report(name, "; ".join(bad))


def labels(name, pattern, T, d):
    logits, loss0 = dump(d, T)
    rows, docs = first_row(pattern, logits.shape[1], T)
    trained = np.zeros(T, bool)   # position t's label, tokens[t + 1] of the same document, is trained
    first = np.zeros(T, bool)     # a turn's first assistant token's label, at the header's last position
    header = np.zeros(T, bool)    # the label one before: the header's last token, predicted from the role
    ce = np.full(T, np.nan)
    for s, e in docs:
        tokens, target = rows.tokens[0, s:e], rows.target[0, s:e]
        ce[s:e] = token_losses(logits[s:e], tokens)
        trained[s:e] = target != -1
        starts = np.flatnonzero((target[1:] != -1) & (target[:-1] == -1)) + 1   # a trained run's first label
        first[s + starts] = True
        header[s + starts - 1] = True
    if not first.any():
        return report(name, "no assistant turn in the first row")
    labelled = ~np.isnan(ce)
    sets = {"the trained labels": trained, "shifted one later": np.roll(trained, 1) & labelled,
            "shifted one earlier": np.roll(trained, -1) & labelled, "without first assistant tokens": trained & ~first,
            "with the headers' labels": trained | header}
    means = {k: ce[v].mean() for k, v in sets.items()}
    right = means.pop("the trained labels")
    bad = []
    if abs(loss0 - right) > 2e-6 * right:
        bad.append("loss0 %.7g, the trained labels' mean %.7g" % (loss0, right))
    for k, v in means.items():
        if abs(v - right) < 1e-3 * right:
            bad.append("the mean %s (%.7g) is within 1e-3 of the right one: the check cannot tell them apart" % (k, v))
        if abs(loss0 - v) < 2e-6 * right:
            bad.append("loss0 %.7g is the mean %s" % (loss0, k))
    print("#   %s: loss0 %.7g, labels' mean %.7g; %s" % (name, loss0, right,
                                                       ", ".join("%s %.5g" % kv for kv in means.items())))
    report(name, "; ".join(bad))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "model":
        for out, spec in zip(args[::2], args[1::2]):
            make_model(out, spec)
    elif cmd == "check":
        prefix, pattern, T = args[0], args[1], int(args[2])
        alone(prefix + "_packed_row_as_alone", pattern, T, args[3], args[4:])
        labels(prefix + "_first_assistant_token_trained", pattern, T, args[3])
    else:
        sys.exit("doc_trainer_check.py: unknown command %r (model, check)" % cmd)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
