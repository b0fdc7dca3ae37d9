#!/usr/bin/env python3
"""Writes the first N transformer blocks of a llama-family GGUF as a GGUF of its own.

The GPU check (tools/gpu/check.sh) carries a model of real weights to the GPU machine, whose
limit on what travels (64 MiB) SmolLM2-135M's whole GGUF exceeds: its first blocks, the
embedding and the output norm, with every metadata key as the file has it except the block
count. Tensors keep their own types (the Q4_1 file's mix of Q4_1, Q6_K and Q8_0), bytes copied.
It uses the `gguf` package (the reference virtualenv's; never part of Ferry's runtime).

Usage: slice_gguf.py IN.gguf OUT.gguf BLOCKS
"""

import re
import sys

import gguf


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    have = reader.fields[count_key].contents()
    if not 0 < blocks <= have:
        print(f"slice_gguf: {src} has {have} blocks; asked for {blocks}", file=sys.stderr)
        return 2
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = blocks if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    kept = []
    for tensor in reader.tensors:
        m = re.match(r"blk\.(\d+)\.", tensor.name)
        if m and int(m.group(1)) >= blocks:
            continue
        kept.append(tensor)
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    print(f"slice_gguf: {dst}: {blocks} of {have} blocks, {len(kept)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
