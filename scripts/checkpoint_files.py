"""The checksums of a trainer checkpoint directory (OUT/ckpt_<step>/), checked before its files are read:
manifest.json's "crc32" holds each file's CRC-32 (zlib's), and DONE the manifest's own. Only a checkpoint
written before checksums (manifest format 1: neither "format" nor "crc32", and an empty DONE) passes
unverified, with a note; an empty DONE beside any other manifest is damage (docs/formats.md). Standard
library only.
"""
import json
import os
import sys
import zlib

MANIFEST_FORMAT = 3  # the newest manifest format this reads (core/checkpoint/manifest.h)


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
    sealed = os.path.getsize(done_path) > 0
    if sealed:
        _, done = _load_json(done_path, "DONE", die)
        want = done.get("manifest.json") if isinstance(done, dict) else None
        well_formed = isinstance(want, str) and len(want) == 8 and all(c in "0123456789abcdef" for c in want)
        if not well_formed or int(want, 16) != zlib.crc32(text):
            die("%s is damaged: its CRC-32 is %08x, DONE's %s" % (manifest_path, zlib.crc32(text), want))
    if not isinstance(manifest, dict):
        die("%s is not a JSON object" % manifest_path)
    fmt = manifest.get("format")
    if "format" in manifest and (type(fmt) is not int or not 3 <= fmt <= MANIFEST_FORMAT):
        die("%s has an unknown \"format\" (this reads formats up to %d)" % (manifest_path, MANIFEST_FORMAT))
    checksums = "crc32" in manifest
    if not checksums and "format" in manifest:
        die("%s (format %d) lacks \"crc32\"" % (manifest_path, fmt))
    if not sealed and checksums:
        die("%s: DONE is empty, but manifest.json records checksums (only a checkpoint from before them has an "
            "empty DONE)" % ckpt)
    if sealed and not checksums:
        die("%s lacks \"crc32\", though DONE holds its CRC-32" % manifest_path)
    if not checksums:
        sys.stderr.write("note: %s records no checksums (written before they were): its files are not verified\n" % ckpt)
        return
    sums = manifest["crc32"]
    if not isinstance(sums, dict):
        die("%s has a malformed \"crc32\"" % manifest_path)
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
