"""The checksums of a trainer checkpoint directory (OUT/ckpt_<step>/), checked before its files are read:
manifest.json's "crc32" holds each file's CRC-32 (zlib's), and DONE the manifest's own. Checkpoints written
before checksums (no "crc32", an empty DONE) pass with a note. Standard library only.
"""
import json
import os
import sys
import zlib


def file_crc32(path):
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _load_json(path, what, die):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data, json.loads(data)
    except (OSError, ValueError) as e:
        die("%s: cannot read %s: %s" % (path, what, getattr(e, "strerror", None) or e))


def verify(ckpt, names, die):
    """Dies unless DONE's CRC-32 matches manifest.json and each file in names matches the manifest's."""
    done_path, manifest_path = os.path.join(ckpt, "DONE"), os.path.join(ckpt, "manifest.json")
    if not os.path.isfile(done_path):
        die("%s is not a complete checkpoint (no DONE)" % ckpt)
    text, manifest = _load_json(manifest_path, "its manifest", die)
    if os.path.getsize(done_path) > 0:
        _, done = _load_json(done_path, "DONE", die)
        want = done.get("manifest.json") if isinstance(done, dict) else None
        if not isinstance(want, str) or int(want, 16) != zlib.crc32(text):
            die("%s is damaged: its CRC-32 is %08x, DONE's %s" % (manifest_path, zlib.crc32(text), want))
    sums = manifest.get("crc32") if isinstance(manifest, dict) else None
    if sums is None:
        sys.stderr.write("note: %s records no checksums (written before they were): its files are not verified\n" % ckpt)
        return
    for name in names:
        path = os.path.join(ckpt, name)
        if not isinstance(sums.get(name), str):
            die("%s: manifest.json has no CRC-32 for %s" % (ckpt, name))
        try:
            got = file_crc32(path)
        except OSError as e:
            die("cannot read %s: %s" % (path, e.strerror))
        if got != int(sums[name], 16):
            die("%s is damaged: its CRC-32 is %08x, the manifest's %s" % (path, got, sums[name]))
