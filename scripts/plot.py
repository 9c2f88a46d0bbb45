#!/usr/bin/python3
"""Plots training runs from their log.jsonl files: loss (train and validation) above, tokens/s below, and
between them the HellaSwag accuracy when a log has it (-hs). With --lr-range, -lr-range runs: loss against the
learning rate, each run's suggested peak marked.

    scripts/plot.py out/run1/log.jsonl [out/run2/log.jsonl ...] -o loss.png
    scripts/plot.py out/range/log.jsonl --lr-range -o range.png

Each run is named after the directory holding its log. Records with "loss" are training steps, with
"val_loss" evaluations, with "hellaswag_acc" HellaSwag accuracies; everything else (memory, layout,
comm_bytes) is ignored. A step logged twice
(a resumed run redoing steps) keeps its last record. Needs Debian's python3-matplotlib; writes a PNG
without a display (Agg). Errors: one line on stderr, exit 1.
"""
import os
import sys

# scripts/tokenize.py would shadow the standard library's tokenize (matplotlib reaches it through
# linecache), because Python puts this script's directory first on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402

# The C logger prints non-finite floats with %g ("nan", "-inf"), which JSON lacks; a diverging run is
# exactly the one worth plotting, so map them to the spellings Python's json accepts.
NONFINITE = re.compile(r'(?<=[:\[,]) *(-?)(nan|inf)\b', re.IGNORECASE)


def die(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


def run_name(path, taken):
    d = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(d) or d
    parent = os.path.dirname(d)
    while name in taken and parent not in ("", "/"):   # two runs called "run1": prefix their parents
        name = os.path.basename(parent) + "/" + name
        parent = os.path.dirname(parent)
    return name if name not in taken else path


def log_records(path):
    """(line number, record) of each JSON object with a "step" in one log."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        die("cannot read %s: %s" % (path, e.strerror if isinstance(e, OSError) and e.strerror else e))
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text = NONFINITE.sub(lambda m: " " + ("-Infinity" if m.group(2).lower() == "inf" and m.group(1) else
                                                 "Infinity" if m.group(2).lower() == "inf" else "NaN"), line)
        try:
            rec = json.loads(text)
        except ValueError:
            if i == len(lines):   # a last line without its newline: the run is still writing it
                continue
            die("%s:%d is not a JSON object: %.60s" % (path, i, line))
        if isinstance(rec, dict) and "step" in rec:
            yield i, rec


def read_log(path):
    """{step: (loss, tok_s)}, {step: val_loss}, {step: hellaswag_acc} from one log."""
    train, val, hs = {}, {}, {}
    for i, rec in log_records(path):
        try:
            step = int(rec["step"])
            if "loss" in rec:
                tok_s = rec.get("tok_s")
                train[step] = (float(rec["loss"]), float(tok_s) if tok_s is not None else math.nan)
            elif "val_loss" in rec:
                val[step] = float(rec["val_loss"])
            elif "hellaswag_acc" in rec:
                hs[step] = float(rec["hellaswag_acc"])
        except (TypeError, ValueError):
            die("%s:%d has a non-numeric step, loss, tok_s or accuracy" % (path, i))
    if not train:
        die("%s has no training steps (no record with \"loss\")" % path)
    return train, val, hs


def read_lr_range(path):
    """[(lr, loss)] of each step and the suggested lr of an -lr-range run's log."""
    points, suggested = {}, None
    for _, rec in log_records(path):
        if "loss" in rec and "lr" in rec:
            points[int(rec["step"])] = (float(rec["lr"]), math.nan if rec["loss"] is None else float(rec["loss"]))
        elif isinstance(rec.get("lr_range"), dict):
            suggested = float(rec["lr_range"]["suggested_lr"])
    if suggested is None:
        die("%s is not an -lr-range run's log (no lr_range record)" % path)
    return [points[s] for s in sorted(points)], suggested


def plot_lr_range(plt, paths, taken, output, title):
    fig, ax = plt.subplots(figsize=(10, 6))
    for i, path in enumerate(paths):
        name = run_name(path, taken)
        taken.add(name)
        points, suggested = read_lr_range(path)
        color = "C%d" % (i % 10)
        ax.plot([p[0] for p in points], [p[1] for p in points], color=color, marker="o", ms=3, lw=1.2, label=name)
        ax.axvline(suggested, color=color, ls="--", lw=1.0, label="%s suggested %.3g" % (name, suggested))
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title or "learning-rate range test")
    fig.tight_layout()
    return fig


def plot_hellaswag(ax, runs):
    for i, (name, _, _, hs) in enumerate(runs):
        if hs:
            steps = sorted(hs)
            ax.plot(steps, [hs[s] for s in steps], color="C%d" % (i % 10), marker="o", ms=3, lw=1.2, label=name)
    ax.set_ylabel("HellaSwag acc")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main():
    ap = argparse.ArgumentParser(description="Plot train/validation loss and tokens/s of runs' log.jsonl files.")
    ap.add_argument("logs", nargs="+", metavar="LOG", help="a run's log.jsonl (the run is named after its directory)")
    ap.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--title", default=None, help="figure title")
    ap.add_argument("--lr-range", action="store_true",
                    help="-lr-range runs: loss against the learning rate (log scale), the suggested peak marked")
    args = ap.parse_args()

    runs, taken = [], set()
    for path in args.logs if not args.lr_range else []:
        name = run_name(path, taken)
        taken.add(name)
        runs.append((name,) + read_log(path))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        die("matplotlib is missing (Debian package python3-matplotlib): %s" % e)
    if args.lr_range:
        save(plot_lr_range(plt, args.logs, taken, args.output, args.title), args.output)
        return

    with_hs = any(r[3] for r in runs)
    if with_hs:
        fig, (ax_loss, ax_hs, ax_tok) = plt.subplots(3, 1, figsize=(10, 9), sharex=True,
                                                     gridspec_kw={"height_ratios": [3, 1.5, 1]})
        plot_hellaswag(ax_hs, runs)
    else:
        fig, (ax_loss, ax_tok) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for i, (name, train, val, _) in enumerate(runs):
        color = "C%d" % (i % 10)
        steps = sorted(train)
        ax_loss.plot(steps, [train[s][0] for s in steps], color=color, lw=1.2, label=name + " train")
        if val:
            vs = sorted(val)
            ax_loss.plot(vs, [val[s] for s in vs], color=color, ls="--", marker="o", ms=3, lw=1.2,
                         label=name + " val")
        ax_tok.plot(steps, [train[s][1] for s in steps], color=color, lw=1.0, label=name)
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_tok.set_ylabel("tokens/s")
    ax_tok.set_xlabel("step")
    ax_tok.grid(alpha=0.3)
    ax_tok.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    fig.suptitle(args.title or ", ".join(r[0] for r in runs))
    fig.tight_layout()
    save(fig, args.output)


def save(fig, output):
    try:
        fig.savefig(output, dpi=100)
    except OSError as e:
        die("cannot write %s: %s" % (output, e.strerror or e))
    except ValueError as e:   # matplotlib: an extension it cannot write
        die("cannot write %s: %s" % (output, str(e).splitlines()[0]))


if __name__ == "__main__":
    main()
