#!/usr/bin/python3
"""A small synthetic set in HellaSwag's format, and a text to train on, for tests/system/t_hellaswag.sh.

  hellaswag_synth.py OUTDIR      writes OUTDIR/corpus.txt and OUTDIR/synth.jsonl

Each example's context is a subject ("The team") and its endings are four actions of different lengths,
one of them the subject's own. The corpus repeats the sentences of the first 15 subjects only, so a model
trained on it briefly knows some of those pairs; for the last 5 its choice is a guess. Two more examples
have a context far longer than the tests' -t, for the trainer to leave out. Deterministic: a fixed seed.
Every word is one of GPT-2's first 4,096 tokens, so a model of that vocabulary reads the GPT-2 encoding.
"""
import json
import os
import random
import sys

PAIRS = [
    ("The man", "goes back home."),
    ("The team", "won the game again."),
    ("The child", "can see the light of the fire from the house."),
    ("The police", "found the car near the school."),
    ("The family", "made a big plan for the next year."),
    ("The city", "has many people."),
    ("The president", "said that the law is good for the country and the world."),
    ("The company", "makes money."),
    ("The school", "is open every day."),
    ("The women", "read a book about love and life."),
    ("The country", "went to war."),
    ("The players", "left the game early in the second half."),
    ("The children", "play in the water."),
    ("The author", "told a story about his own life."),
    ("The group", "will meet each week."),
    ("The government", "must pay the money back to the people of the state."),
    ("The friend", "came to see her at night."),
    ("The market", "is open until night."),
    ("The world", "needs more love."),
    ("The business", "had a very good year."),
]
TRAINED = 15
EXAMPLES = 40
SENTENCES = 600


def corpus(rng):
    lines = [f"{s} {a}" for s, a in PAIRS[:TRAINED]]
    return " ".join(rng.choice(lines) for _ in range(SENTENCES)) + "\n"


def example(i, rng):
    subject, action = PAIRS[i % len(PAIRS)]
    others = rng.sample([a for _, a in PAIRS if a != action], 3)
    label = rng.randrange(4)
    endings = others[:label] + [action] + others[label:]
    return {"ind": i, "ctx": subject, "endings": endings, "label": label}


def long_example(i, rng):
    ctx = " ".join(f"{s} {a}" for s, a in PAIRS[:6])
    return {"ind": i, "ctx": ctx, "endings": rng.sample([a for _, a in PAIRS], 4), "label": rng.randrange(4)}


def main(out):
    rng = random.Random(20240522)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "corpus.txt"), "w") as f:
        f.write(corpus(rng))
    rows = [example(i, rng) for i in range(EXAMPLES)]
    rows[7:7] = [long_example(EXAMPLES, rng)]
    rows.append(long_example(EXAMPLES + 1, rng))
    with open(os.path.join(out, "synth.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: hellaswag_synth.py OUTDIR")
    main(sys.argv[1])
