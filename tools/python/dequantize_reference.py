#!/usr/bin/env python3
"""Digests of every tensor of a GGUF file dequantized by the `gguf` package (llama.cpp's own NumPy
implementation), as float32 and as bfloat16 rounded to nearest even (written here from the
definition of the format: the high 16 bits of the float32 after adding 0x7FFF plus the lowest kept
bit; NaNs stay quiet NaNs).

  dequantize_reference.py GGUF > reference.json     {"name": {"f32": hex, "bf16": hex}, ...}
"""
import json
import sys

import numpy as np
import xxhash
from gguf import GGUFReader
from gguf.quants import dequantize


def to_bf16(f32):
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def main(path):
    reader = GGUFReader(path)
    out = {}
    for t in reader.tensors:
        values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        out[t.name] = {"f32": "%016x" % xxhash.xxh3_64_intdigest(values.tobytes()),
                       "bf16": "%016x" % xxhash.xxh3_64_intdigest(to_bf16(values).tobytes())}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
