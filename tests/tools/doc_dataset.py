#!/usr/bin/env python3
"""A tiny document dataset for tests: made-up conversations rendered with a made-up template into token shards
and the mask files beside them (docs/formats.md), without a tokenizer.

  doc_dataset.py OUTDIR --name chat -V 512 --seed 1 --conversations 40 [--shards 2] [--longest 48] [--val 4]
  doc_dataset.py OUTDIR --name solo --only 0,3 ...    the same dataset's conversations 0 and 3 alone
  doc_dataset.py OUTDIR --alone ...    also each conversation alone, as the dataset NAME_alone<I>

A conversation is BOS, then turns; a turn is HEADER_START, its role's token, HEADER_END, its content (random
tokens from FIRST_CONTENT up), END_OF_TURN. The trained tokens are the assistant turns' content and their
END_OF_TURN: the role header is not. So in a row the label of HEADER_END's position (the first assistant
token) is trained and the one before it (HEADER_END itself) is not. Conversations go to shards in order,
never split; --val N sends the last N to NAME_val_000000.bin. Prints one line per conversation
(`conversation I: N tokens, first assistant token at K`) for the tests.
"""
import argparse
import os

import numpy as np

BOS, HEADER_START, HEADER_END, END_OF_TURN = 1, 2, 3, 4
ROLES = {"system": 5, "user": 6, "assistant": 7}
FIRST_CONTENT = 10
SHARD_MAGIC, MASK_MAGIC = 20240520, 20261129
TRAINED, DOC_START = 1, 2


def conversation(rng, V, longest):
    """(tokens, mask bytes) of one conversation of at most `longest` (>= 11) tokens, with an assistant turn:
    drawn again until one fits."""
    while True:
        tokens, trained = [BOS], [False]
        for role in ["system"] * int(rng.integers(0, 2)) + ["user", "assistant"] * int(rng.integers(1, 3)):
            content = rng.integers(FIRST_CONTENT, V, size=int(rng.integers(1, 6))).tolist()
            tokens += [HEADER_START, ROLES[role], HEADER_END] + content + [END_OF_TURN]
            trained += [False] * 3 + [role == "assistant"] * (len(content) + 1)
        if len(tokens) <= longest:
            mask = [TRAINED if t else 0 for t in trained]
            mask[0] = DOC_START
            return tokens, mask


def write_pair(path, tokens, mask, set_id):
    """X.bin and X.mask with the same token count and set id."""
    h = np.zeros(256, np.int32)
    h[:5] = [SHARD_MAGIC, 1, len(tokens), set_id, 0]
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(tokens, np.uint16).tobytes())
    h[0] = MASK_MAGIC
    with open(path[:-4] + ".mask", "wb") as f:
        f.write(h.tobytes() + np.asarray(mask, np.uint8).tobytes())


def write_dataset(outdir, name, convs, shards, val, seed):
    """Writes the conversations [(tokens, mask)]: the last `val` to NAME_val_000000.bin, the others over
    `shards` train shards, whole."""
    os.makedirs(outdir, exist_ok=True)
    set_id = 1000 + seed   # small: the header's low word holds it whole
    train = convs[:len(convs) - val]
    bounds = np.linspace(0, len(train), shards + 1).astype(int)
    parts = [(os.path.join(outdir, "%s_train_%06d.bin" % (name, k + 1)), train[bounds[k]:bounds[k + 1]])
             for k in range(shards)]
    if val:
        parts.append((os.path.join(outdir, "%s_val_000000.bin" % name), convs[len(convs) - val:]))
    for path, group in parts:
        write_pair(path, [t for c in group for t in c[0]], [m for c in group for m in c[1]], set_id)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--name", default="chat")
    ap.add_argument("-V", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conversations", type=int, default=40)
    ap.add_argument("--longest", type=int, default=40, help="tokens of the longest conversation")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--val", type=int, default=0, help="conversations for the validation shard")
    ap.add_argument("--only", help="comma-separated indices: write just these conversations, in this order")
    ap.add_argument("--alone", action="store_true", help="also each conversation alone: NAME_alone<I>_train_000001.bin")
    ap.add_argument("--plain", action="store_true", help="no mask files (plain shards with BOS between documents)")
    a = ap.parse_args()
    if a.longest < 11:
        ap.error("--longest %d: the shortest conversation (BOS, a user turn, an assistant turn) has 11 tokens"
                 % a.longest)
    rng = np.random.default_rng(a.seed)
    convs = [conversation(rng, a.V, a.longest) for _ in range(a.conversations)]
    if a.only:
        convs = [convs[int(i)] for i in a.only.split(",")]
    write_dataset(a.outdir, a.name, convs, min(a.shards, len(convs) - a.val), a.val, a.seed)
    for i in range(len(convs)) if a.alone else []:
        write_dataset(a.outdir, "%s_alone%d" % (a.name, i), convs[i:i + 1], 1, 0, a.seed)
    if a.plain:
        for f in os.listdir(a.outdir):
            if f.startswith(a.name + "_") and f.endswith(".mask"):
                os.remove(os.path.join(a.outdir, f))
    for i, (tokens, mask) in enumerate(convs):
        print("conversation %d: %d tokens, first assistant token at %d" % (i, len(tokens), mask.index(TRAINED)))


if __name__ == "__main__":
    main()
