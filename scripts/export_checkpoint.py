#!/usr/bin/env python3
"""Consolidate a checkpoint's per-rank ZeRO state into whole-model files, streaming (DeepSpeed's
zero_to_fp32 without holding the model in memory: one span at a time is read and written in place).

  export_checkpoint.py OUT/ckpt_000100 EXPORT_PREFIX

writes EXPORT_PREFIX_model.bin (llm.c model file, fp32 master weights, version 3) and EXPORT_PREFIX_adam.bin
(256 x int32 header [20261123, 1, num_params, 0...], then Adam m and v, fp32, each in llm.c's tensor order).
It checks the files against the checkpoint's CRC-32s first, and that the state files cover every parameter
exactly once. Needs only Python's standard library.
"""
import glob
import os
import struct
import sys

import checkpoint_files

STATE_MAGIC, MODEL_MAGIC, ADAM_MAGIC = 20261122, 20240326, 20261123


def die(msg):
    sys.stderr.write("error: %s\n" % msg)
    sys.exit(1)


def read_exact(f, n, path):
    b = f.read(n)
    if len(b) != n:
        die("%s is truncated" % path)
    return b


def export(ckpt, prefix):
    model_in = os.path.join(ckpt, "model.bin")
    states = sorted(glob.glob(os.path.join(ckpt, "state_rank*.bin")))
    checkpoint_files.verify(ckpt, ["model.bin"] + [os.path.basename(p) for p in states], die)
    try:
        with open(model_in, "rb") as f:
            header = read_exact(f, 1024, model_in)
    except OSError as e:
        die("cannot read %s: %s" % (model_in, e.strerror))
    if struct.unpack_from("<i", header)[0] != MODEL_MAGIC:
        die("%s is not a model file" % model_in)
    maxT, V, L, NH, C, Vp = struct.unpack_from("<6i", header, 8)
    shape_params = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    if not states:
        die("%s has no state_rank*.bin files" % ckpt)
    num_params, spans = None, []
    tmp_model, tmp_adam = prefix + "_model.bin.tmp", prefix + "_adam.bin.tmp"
    try:
        try:
            fm, fa = open(tmp_model, "wb"), open(tmp_adam, "wb")
        except OSError as e:
            die("cannot write %s: %s" % (e.filename, e.strerror))
        with fm, fa:
            for path in states:
                with open(path, "rb") as f:
                    h = struct.unpack("<8q", read_exact(f, 64, path))
                    if h[0] != STATE_MAGIC or h[1] != 2:
                        die("%s is not a state file" % path)
                    if num_params is None:
                        num_params = h[2]
                        if num_params != shape_params:
                            die("%s holds %d parameters; model.bin's shape (L=%d C=%d Vp=%d maxT=%d) has %d"
                                % (path, num_params, L, C, Vp, maxT, shape_params))
                        fm.write(header)
                        fm.truncate(1024 + 4 * num_params)
                        fa.write(struct.pack("<3i", ADAM_MAGIC, 1, num_params) + bytes(1024 - 12))
                        fa.truncate(1024 + 8 * num_params)
                    elif h[2] != num_params:
                        die("%s holds %d parameters, %s %d" % (path, h[2], states[0], num_params))
                    work_bytes = 4 if h[4] == 0 else 2
                    for _ in range(h[3]):
                        start, count = struct.unpack("<2q", read_exact(f, 16, path))
                        if start < 0 or count < 0 or start + count > num_params:
                            die("%s has a span [%d, +%d) outside %d parameters" % (path, start, count, num_params))
                        master, m, v = (read_exact(f, 4 * count, path) for _ in range(3))
                        if h[4] != 0:
                            read_exact(f, work_bytes * count, path)   # the bf16/fp16 working copy: not exported
                        fm.seek(1024 + 4 * start); fm.write(master)
                        fa.seek(1024 + 4 * start); fa.write(m)
                        fa.seek(1024 + 4 * (num_params + start)); fa.write(v)
                        spans.append((start, count, path))
        # Every parameter exactly once: the spans, in order, tile [0, num_params).
        end = 0
        for start, count, path in sorted(spans):
            if start != end:
                die("the state files %s parameters [%d, %d) (%s)" % ("miss" if start > end else "hold twice",
                                                                     min(start, end), max(start, end), path))
            end = start + count
        if end != num_params:
            die("the state files cover [0, %d) of %d parameters" % (end, num_params))
        os.replace(tmp_model, prefix + "_model.bin")
        os.replace(tmp_adam, prefix + "_adam.bin")
    finally:
        for t in (tmp_model, tmp_adam):
            if os.path.exists(t):
                os.remove(t)
    print("exported %d parameters from %d state files to %s_model.bin and %s_adam.bin" % (num_params, len(states), prefix, prefix))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        die("usage: export_checkpoint.py CHECKPOINT_DIR EXPORT_PREFIX")
    export(sys.argv[1], sys.argv[2])
