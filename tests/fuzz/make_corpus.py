#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (committed; rerun only to change it):
tests/fuzz/corpus/safetensors/* and tests/fuzz/corpus/idx/* -- small valid files and files
with one kind of damage each. Standard library only."""
import gzip, json, os, struct

here = os.path.dirname(os.path.abspath(__file__))


def write(kind, name, data):
    d = os.path.join(here, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st(header, data, pad=True):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


f4 = lambda *v: struct.pack("<%df" % len(v), *v)
t = lambda shape, b, e: {"dtype": "F32", "shape": shape, "data_offsets": [b, e]}
meta = {"format": "pt"}
write("safetensors", "valid_two", st({"__metadata__": meta, "0.bias": t([2], 0, 8),
                                      "0.weight": t([2, 1], 8, 16)}, f4(1, 2, 3, 4)))
write("safetensors", "valid_empty_tensor", st({"e": t([0, 3], 0, 0), "s": t([], 0, 4)}, f4(7)))
write("safetensors", "valid_no_tensors", st({}, b""))
write("safetensors", "overlap", st({"a": t([2], 0, 8), "b": t([2], 4, 12)}, f4(1, 2, 3)))
write("safetensors", "hole", st({"a": t([1], 0, 4), "b": t([1], 8, 12)}, f4(1, 2, 3)))
write("safetensors", "huge_shape", st({"a": t([2**62 + 1], 0, 4)}, f4(1)))
write("safetensors", "string_offsets",
      st({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, f4(1)))
write("safetensors", "array_header", st([1, 2], b""))
write("safetensors", "f16", st({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}},
                               b"\0" * 4))
write("safetensors", "truncated", st({"a": t([4], 0, 16)}, f4(1, 2))[:-3])


def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def gz(b):
    return gzip.compress(b, mtime=0)


labels = idx([4], bytes([1, 2, 3, 9]))
images = idx([2, 2, 3], bytes(range(12)))
# First byte: bit 0 selects the expected dimensions (0: 1, labels; 1: 3, images).
write("idx", "labels", b"\0" + gz(labels))
write("idx", "images", b"\1" + gz(images))
write("idx", "two_members", b"\1" + gz(images[:7]) + gz(images[7:]))
bad_crc = bytearray(gz(images))
bad_crc[-8] ^= 0xFF
write("idx", "bad_crc", b"\1" + bytes(bad_crc))
write("idx", "truncated_gz", b"\1" + gz(images)[:-10])
write("idx", "huge_dims", b"\1" + gz(idx([60000, 60000, 60000], b"\0" * 8)))
write("idx", "trailing", b"\0" + gz(labels + b"\0"))
write("idx", "bad_magic", b"\0" + gz(b"\0\0\x09\x01" + labels[4:]))
