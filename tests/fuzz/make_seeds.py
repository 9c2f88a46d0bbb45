#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora and dictionaries: OUT/seeds/<reader>/{valid,bad}_*, OUT/<reader>.dict.

Generated rather than committed so they follow the formats in docs/formats.md and stay reviewable. A "valid_"
seed must load (exit 0); a "bad_" one must end in one "error:" line (exit 1): t_fuzz.sh checks both, so
the harnesses are known to reach the deep paths before any fuzzing. Usage: make_seeds.py OUT_DIR
"""
import json
import os
import random
import struct
import sys

SHARD_MAGIC, MODEL_MAGIC, TOK_MAGIC, STATE_MAGIC = 20240520, 20240326, 20240328, 20261122
EVAL_MAGIC = 20240522   # evaluation files (-hs)
SHARD32_MAGIC, SHARD32_VERSION = 20240801, 7   # uint32 tokens
KINDS = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
BLOCK = set(KINDS[2:14])
FIXED = dict(L=1, C=8, NH=1, V=128, Vp=128, maxT=4)   # the shape fuzz_checkpoint.c / fuzz_model.c fix


def header(words):
    return struct.pack("<256i", *(list(words) + [0] * (256 - len(words))))


def kind_elems(s, k):
    C = s["C"]
    return {"wte": s["Vp"] * C, "wpe": s["maxT"] * C, "qkvw": 3 * C * C, "qkvb": 3 * C, "attprojw": C * C,
            "fcw": 4 * C * C, "fcprojw": 4 * C * C, "fcb": 4 * C}.get(k, C)


def canonical_tensors(s):
    """(offset, size) of every tensor in llm.c's file order."""
    out, off = [], 0
    for k in KINDS:
        for _ in range(s["L"] if k in BLOCK else 1):
            n = kind_elems(s, k)
            out.append((off, n))
            off += n
    return out, off


def values(rng, n):
    return [rng.uniform(-1, 1) for _ in range(n)]


def bf16(xs):
    return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", x))[0] >> 16) for x in xs)


def model_file(s, rng, version=3, pick=0):
    _, n = canonical_tensors(s)
    # Word 8 names the family (0: GPT-2); fuzz_model.c reads its layout pick from word 64.
    h = header([MODEL_MAGIC, version, s["maxT"], s["V"], s["L"], s["NH"], s["C"], s["Vp"]] + [0] * 56 + [pick])
    vals = values(rng, n)
    return h + (struct.pack("<%df" % n, *vals) if version == 3 else bf16(vals))


def state_file(s, rng, dt, rank, dp, stage):
    """Rank `rank` of `dp`: the rank-th contiguous part of every tensor, as one span per tensor."""
    tensors, total = canonical_tensors(s)
    spans = []
    for off, n in tensors:
        a, b = n * rank // dp, n * (rank + 1) // dp
        if b > a:
            spans.append((off + a, b - a))
    out = struct.pack("<8q", STATE_MAGIC, 2, total, len(spans), dt, rank, dp, stage)
    for off, n in spans:
        out += struct.pack("<2q", off, n)
        master = values(rng, n)
        for vals in (master, values(rng, n), [abs(x) for x in values(rng, n)]):
            out += struct.pack("<%df" % n, *vals)
        if dt == 1:
            out += bf16(master)
        elif dt == 2:
            out += struct.pack("<%de" % n, *master)
    return out


def manifest(s, dp, stage, dt):
    return ('{"step": 7, "tokens_per_step": 64, "seed": 1337, "state_files": %d,\n'
            ' "loss_scale": 65536, "clean_steps": 3, "overflows_left": 2,\n'
            ' "model": {"L": %d, "C": %d, "NH": %d, "V": %d, "Vp": %d, "maxT": %d},\n'
            ' "batch": {"B": 2, "T": 4, "ga": 1}, "precision": "%s",\n'
            ' "topology": {"world": %d, "dp": %d, "pp": 1, "zero": %d},\n'
            ' "data": {"train": "x_*.bin", "shuffle": 0, "next_step": 7}}\n'
            % (dp, s["L"], s["C"], s["NH"], s["V"], s["Vp"], s["maxT"], ["fp32", "bf16", "fp16"][dt], dp,
               dp, stage)).encode()


def shard(rng, ntok, vocab, wide=False):
    magic, version, fmt = (SHARD32_MAGIC, SHARD32_VERSION, "I") if wide else (SHARD_MAGIC, 1, "H")
    return header([magic, version, ntok]) + struct.pack("<%d%s" % (ntok, fmt), *[rng.randrange(vocab) for _ in range(ntok)])


def loader_params(B, T, world, rank, shuffle, vocab, ga):
    return bytes([B - 1, T - 1, world - 1, rank, shuffle, (vocab - 1) & 255, (vocab - 1) >> 8, ga - 1])


def tokenizer_file(rng, vocab, version=2, eot=None, random_tokens=None):
    """The first random_tokens (default: all) tokens random bytes, the rest empty (version 1's 50257 stay small)."""
    words = [TOK_MAGIC, version, vocab] + ([vocab - 1 if eot is None else eot] if version == 2 else [])
    body = b""
    for i in range(vocab):
        tok = bytes(rng.randrange(256) for _ in range(rng.randrange(6))) if i < (random_tokens or vocab) else b""
        body += bytes([len(tok)]) + tok
    return header(words) + body


def tokenizer_json(**changes):
    """A byte-level BPE tokenizer.json: 256 byte tokens, two merges, <|endoftext|>; changes replace top-level keys."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = [chr(b) if b in keep else chr(256 + sum(1 for c in range(b) if c not in keep)) for b in range(256)]
    vocab = {c: b for b, c in enumerate(chars)}
    vocab.update({"\u0120t": 256, "\u0120th": 257})
    doc = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
           "added_tokens": [{"id": 258, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": True, "special": True}],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": True, "vocab": vocab,
                     "merges": ["\u0120 t", ["\u0120t", "h"]]}}
    doc.update(changes)
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def eval_file(rng, examples, vocab, max_len, version=1, token_vocab=None):
    """An evaluation file of random examples (1..4 tokens per part, below token_vocab, default vocab); header words
    64 and 65 carry fuzz_evalfile.c's vocabulary and length limit."""
    width, fmt = (2, "H") if version == 1 else (4, "I")
    top, streams, longest = (1 << 8 * width) - 1, [], 0
    rand_part = lambda: [rng.randrange(token_vocab or vocab) for _ in range(1 + rng.randrange(4))]
    for i in range(examples):
        parts = [rand_part() for _ in range(5)]
        el = [top, 0, i, rng.randrange(4), 4] + [x for p in parts for x in [len(p)] + p]
        el[1] = width * len(el)
        longest = max(longest, el[1])
        streams.append(struct.pack("<%d%s" % (len(el), fmt), *el))
    return header([EVAL_MAGIC, version, examples, longest] + [0] * 60 + [vocab - 1, max_len - 1]) + b"".join(streams)


def le32(x):
    return "".join("\\x%02x" % b for b in struct.pack("<i", x))


def main():
    out = sys.argv[1]
    rng = random.Random(1)
    seeds = {}
    # Token shards.
    p = loader_params(2, 4, 1, 0, 0, 1000, 1)
    seeds["dataloader"] = {
        "valid_one_shard": p + shard(rng, 40, 1000),
        "valid_three_shards_one_empty": loader_params(3, 5, 2, 1, 0, 1000, 2) + shard(rng, 20, 1000) + b"SHRD" +
        shard(rng, 0, 1000) + b"SHRD" + shard(rng, 30, 1000),
        "valid_shuffle": loader_params(1, 3, 4, 3, 1, 65536, 3) + shard(rng, 50, 65536) + b"SHRD" + shard(rng, 9, 65536),
        "bad_token_over_vocab": loader_params(2, 4, 1, 0, 0, 10, 1) + header([SHARD_MAGIC, 1, 9]) + struct.pack("<9H", *[11] * 9),
        "bad_truncated": p + shard(rng, 40, 1000)[:-3],
        "bad_magic": p + header([SHARD_MAGIC + 1, 1, 0]),
        "valid_u32_beside_u16": loader_params(2, 3, 1, 0, 1, 65536, 2) + shard(rng, 30, 65536, True) + b"SHRD" +
        shard(rng, 20, 65536),
        "bad_u32_token_over_vocab": loader_params(2, 4, 1, 0, 0, 65536, 1) + header([SHARD32_MAGIC, SHARD32_VERSION, 9]) +
        struct.pack("<9I", *[65536] * 9),
        "bad_u32_version": p + header([SHARD32_MAGIC, 1, 0]),
    }
    # Model files.
    small = dict(L=1, C=8, NH=1, V=100, Vp=128, maxT=4)
    two = dict(L=2, C=16, NH=2, V=128, Vp=128, maxT=2)
    seeds["model"] = {
        "valid_fp32": model_file(small, rng),
        "valid_bf16": model_file(small, rng, version=5),
        "valid_two_layers_pad128": model_file(two, rng, pick=2),
        "valid_fixed_layout": model_file(FIXED, rng, pick=1),
        "bad_other_shape": model_file(small, rng, pick=1),
        "bad_trailing": model_file(small, rng) + b"\0",
        "bad_head_size": header([MODEL_MAGIC, 3, 4, 100, 1, 3, 8, 128]),
        # Regression: this shape's element count overflows size_t (and used to overflow the byte count).
        "bad_huge_shape": header([MODEL_MAGIC, 3, 2**31 - 1, 65536, 256, 2**23, 2**30, 2**31 - 128]),
    }
    # Tokenizers.
    seeds["tokenizer"] = {
        "valid_v2": tokenizer_file(rng, 60),
        "valid_v1": tokenizer_file(rng, 50257, version=1, random_tokens=30),   # version 1: GPT-2's vocabulary and eot
        "bad_v1_without_eot": tokenizer_file(rng, 30, version=1),
        "bad_truncated": tokenizer_file(rng, 20)[:-1],
        "bad_eot": tokenizer_file(rng, 20, eot=20),
        "valid_json": tokenizer_json(),
        "valid_json_nfc": tokenizer_json(normalizer={"type": "NFC"}, added_tokens=[
            {"id": 258, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True},
            {"id": 259, "content": "e\u0301\u212b", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False}]),
        "bad_json_normalizer": tokenizer_json(normalizer={"type": "NFKC"}),
    }
    # Checkpoints: a parameter byte (stage | dtype << 2 | offload << 7), then the files separated by "FILE".
    s = FIXED
    _, total = canonical_tensors(s)
    ck = {}
    for name, stage, dt, dp, offload in [("fp32_z0", 0, 0, 1, 0), ("bf16_z2", 2, 1, 1, 0), ("fp32_z3_from_two_ranks", 3, 0, 2, 0),
                                         ("fp16_z1", 1, 2, 1, 0), ("fp32_z1_offload", 1, 0, 2, 1), ("bf16_z3_offload", 3, 1, 1, 1)]:
        files = [manifest(s, dp, stage, dt), model_file(s, rng)] + [state_file(s, rng, dt, r, dp, stage) for r in range(dp)]
        ck["valid_" + name] = bytes([stage | dt << 2 | offload << 7]) + b"FILE".join(files)
    good = [manifest(s, 1, 0, 0), model_file(s, rng), state_file(s, rng, 0, 0, 1, 0)]
    ck["bad_missing_rank"] = bytes([0]) + b"FILE".join([manifest(s, 2, 0, 0)] + good[1:])
    ck["bad_dtype"] = bytes([1 << 2]) + b"FILE".join(good)
    # Regression: offset + count of this span overflowed a long long.
    overflow = struct.pack("<8q", STATE_MAGIC, 2, total, 1, 0, 0, 1, 0) + struct.pack("<2q", 1024, 2**63 - 1)
    ck["bad_span_overflow"] = bytes([0]) + b"FILE".join(good[:2] + [overflow])
    ck["bad_no_manifest_key"] = bytes([0]) + b"FILE".join([b'{"step": 1}'] + good[1:])
    seeds["checkpoint"] = ck
    # Evaluation files: a limit of 6 tokens keeps some examples and drops others.
    ev = eval_file(rng, 6, 1000, 6)
    seeds["evalfile"] = {
        "valid_v1": ev,
        "valid_v2": eval_file(rng, 5, 70000, 6, version=2),
        "bad_token_over_vocab": eval_file(rng, 3, 10, 8, token_vocab=1000),
        "bad_truncated": ev[:-2],
        "bad_trailing": ev + b"\0\0",
        "bad_label": ev[:1030] + b"\x04\x00" + ev[1032:],
        "bad_magic": header([EVAL_MAGIC + 1, 1, 1, 30]),
    }

    dicts = {
        "dataloader": ['"SHRD"', '"%s"' % le32(SHARD_MAGIC), '"\\x01\\x00\\x00\\x00"', '"%s"' % le32(SHARD32_MAGIC),
                       '"%s"' % le32(SHARD32_VERSION)],
        "model": ['"%s"' % le32(MODEL_MAGIC), '"\\x03\\x00\\x00\\x00"', '"\\x05\\x00\\x00\\x00"',
                  '"\\x80\\x00\\x00\\x00"', '"\\x00\\x01\\x00\\x00"'],
        "tokenizer": ['"%s"' % le32(TOK_MAGIC), '"\\x02\\x00\\x00\\x00"', '"\\x01\\x00\\x00\\x00"'] +
        ['"\\"%s\\""' % k for k in ("model", "vocab", "merges", "added_tokens", "pre_tokenizer", "post_processor",
                                    "Sequence", "Split", "TemplateProcessing", "SpecialToken", "ignore_merges",
                                    "normalizer", "normalizers", "NFC", "normalized")],
        "checkpoint": ['"FILE"', '"%s"' % le32(STATE_MAGIC), '"%s"' % le32(MODEL_MAGIC)] +
        ['"\\"%s\\": "' % k for k in ("step", "tokens_per_step", "seed", "dp", "loss_scale", "clean_steps", "overflows_left")] +
        ['"%s"' % "".join("\\x%02x" % b for b in struct.pack("<q", total))],
        "evalfile": ['"%s"' % le32(EVAL_MAGIC), '"\\x01\\x00\\x00\\x00"', '"\\x02\\x00\\x00\\x00"', '"\\xff\\xff"',
                     '"\\xff\\xff\\xff\\xff"', '"\\x04\\x00"'],
    }
    for reader, files in seeds.items():
        d = os.path.join(out, "seeds", reader)
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        with open(os.path.join(out, reader + ".dict"), "w") as f:
            f.write("".join("k%d=%s\n" % (i, w) for i, w in enumerate(dicts[reader])))


if __name__ == "__main__":
    main()
