"""safetensors for the tests, read and written with code of their own rather than scripts/hf_format.py's,
which they check: an 8-byte little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
"data_offsets"}}, space-padded so the data starts 8-byte aligned, then the tensors' bytes."""
import json
import struct

import numpy as np


def read_st(path):
    """(header dict, N, the data bytes)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), n, raw[8 + n:]


def write_st(path, tensors, metadata=None):
    """tensors: [(name, safetensors dtype, array already holding that dtype's bits)], stored in reverse
    order: a writer may order them freely, and no reader may depend on the order."""
    header, blobs, off = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, dtype, a in reversed(tensors):
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
