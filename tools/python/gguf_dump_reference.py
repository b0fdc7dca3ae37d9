#!/usr/bin/env python3
"""Dumps a GGUF file's metadata and tensor table with the `gguf` package (llama.cpp's own Python
reader), in the JSON layout of engine/gguf/gguf_dump.cc, so the two can be compared.

  gguf_dump_reference.py FILE.gguf
"""
import json
import struct
import sys

import xxhash
from gguf import GGUFReader, GGUFValueType


def scalar(vtype, part):
    if vtype == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    value = part.tolist()[0]
    if vtype == GGUFValueType.BOOL:
        return bool(value)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(value)
    return int(value)


def element_bytes(vtype, part):
    if vtype == GGUFValueType.STRING:
        raw = bytes(part)
        return struct.pack("<Q", len(raw)) + raw
    value = part.tolist()[0]
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return struct.pack("<d", float(value))
    return struct.pack("<q", int(value))


def main(path):
    reader = GGUFReader(path)
    metadata = {}
    version = None
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            if key == "GGUF.version":
                version = int(field.parts[field.data[0]][0])
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            etype = field.types[1]
            parts = [field.parts[i] for i in field.data]
            data = b"".join(element_bytes(etype, p) for p in parts)
            metadata[key] = {
                "element_type": etype.name.lower(),
                "count": len(parts),
                "first": [scalar(etype, p) for p in parts[:3]],
                "xxh3_64": "%016x" % xxhash.xxh3_64_intdigest(data),
            }
        else:
            metadata[key] = scalar(vtype, field.parts[field.data[0]])
    tensors = [{"name": t.name, "dims": [int(d) for d in t.shape], "type": int(t.tensor_type),
                "offset": int(t.data_offset - reader.data_offset), "size_bytes": int(t.n_bytes)}
               for t in reader.tensors]
    print(json.dumps({"version": version, "metadata": metadata, "tensors": tensors}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
