#!/usr/bin/env python3
"""Reference implementation of Ferry's block hash and model fingerprint, written from the
specifications in engine/common/block_hash.h and engine/common/model_fingerprint.h (not from the
C++ code), on top of the `xxhash` package from PyPI.

  block_hash_reference.py golden            prints the golden vectors used by the C++ unit tests
  block_hash_reference.py cases N SEED      writes N random cases with expected hashes (JSON)

Runs in the reference virtualenv (`./ferry setup` makes it; the hash reference test runs it).
"""
import json
import random
import struct
import sys

import xxhash

BLOCK_HASH_VERSION = 1
FINGERPRINT_VERSION = 2
KV_FORMAT_VERSION = 2


def h128(data: bytes) -> int:
    """XXH3-128, seed 0, as a Python int (high 64 bits in the top)."""
    return xxhash.xxh3_128_intdigest(data, seed=0)


def enc_hash(value: int) -> bytes:
    lo = value & 0xFFFFFFFFFFFFFFFF
    hi = value >> 64
    return struct.pack("<QQ", lo, hi)


def enc_bytes(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def hex128(value: int) -> str:
    return "%032x" % value


def root_hash(model_fingerprint: int, cache_salt: bytes, lora_id: bytes) -> int:
    data = b"FERRYBH\x00" + struct.pack("<I", BLOCK_HASH_VERSION) + enc_hash(model_fingerprint)
    data += enc_bytes(cache_salt) + enc_bytes(lora_id)
    return h128(data)


def next_hash(parent: int, tokens, images) -> int:
    data = enc_hash(parent) + struct.pack("<I", len(tokens))
    data += b"".join(struct.pack("<I", t) for t in tokens)
    data += struct.pack("<I", len(images))
    for content_hash, offset in images:
        data += enc_hash(content_hash) + struct.pack("<i", offset)
    return h128(data)


def block_hashes(model_fingerprint, cache_salt, lora_id, tokens, block_tokens, images):
    """images: list of (content_hash, start, length) in absolute prompt positions."""
    parent = root_hash(model_fingerprint, cache_salt, lora_id)
    out = []
    for b in range(len(tokens) // block_tokens):
        begin, end = b * block_tokens, (b + 1) * block_tokens
        overlapping = [(h, start - begin) for (h, start, length) in images
                       if start < end and start + length > begin]
        parent = next_hash(parent, tokens[begin:end], overlapping)
        out.append(parent)
    return out


def model_fingerprint(files, tokenizer_digest, kv_dtype, layers, kv_heads, head_dim,
                      weight_dtype, kv_format_version=KV_FORMAT_VERSION):
    """files: dict name(str) -> digest(int)."""
    data = b"FERRYFP\x00" + struct.pack("<I", FINGERPRINT_VERSION)
    data += struct.pack("<I", len(files))
    for name in sorted(files, key=lambda n: n.encode()):
        data += enc_bytes(name.encode()) + enc_hash(files[name])
    data += enc_hash(tokenizer_digest) + enc_bytes(kv_dtype.encode())
    data += struct.pack("<IIII", layers, kv_heads, head_dim, kv_format_version)
    data += enc_bytes(weight_dtype.encode())
    return h128(data)


def golden():
    fp = h128(b"example model")
    print("XXH3-128('')            ", hex128(h128(b"")))
    print("XXH3-128('ferry')       ", hex128(h128(b"ferry")))
    print("fp = XXH3-128('example model')", hex128(fp))
    print("root(fp, '', '')        ", hex128(root_hash(fp, b"", b"")))
    print("root(fp, 'tenant-a', '')", hex128(root_hash(fp, b"tenant-a", b"")))
    print("root(fp, '', 'adapter-1')", hex128(root_hash(fp, b"", b"adapter-1")))
    tokens = list(range(10))
    for i, h in enumerate(block_hashes(fp, b"", b"", tokens, 4, [])):
        print("blocks(0..9, B=4)[%d]   " % i, hex128(h))
    big = [0xFFFFFFFF, 0x80000000, 1, 0] * 2
    for i, h in enumerate(block_hashes(fp, b"", b"", big, 4, [])):
        print("blocks(big, B=4)[%d]    " % i, hex128(h))
    img = h128(b"image bytes")
    for i, h in enumerate(block_hashes(fp, b"", b"", list(range(100, 112)), 4, [(img, 2, 5)])):
        print("blocks(image@2+5, B=4)[%d]" % i, hex128(h))
    print("fingerprint             ", hex128(model_fingerprint(
        {"model.safetensors": h128(b"weights"), "config.json": h128(b"config")},
        h128(b"tokenizer"), "bf16", 30, 3, 64, "f32")))


def cases(count, seed):
    rng = random.Random(seed)
    out = {"block_hash_cases": [], "fingerprint_cases": []}
    for _ in range(count):
        fp = rng.getrandbits(128)
        salt = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 0, 3, 16])))
        lora = "".join(rng.choice("abcxyz-_0123") for _ in range(rng.choice([0, 0, 5])))
        block_tokens = rng.choice([1, 2, 16, 64])
        n = rng.randint(0, 300)
        tokens = [rng.choice([rng.getrandbits(32), rng.randint(0, 50000)]) for _ in range(n)]
        images = []
        pos = 0
        while rng.random() < 0.3 and pos < n:
            start = rng.randint(pos, max(pos, n - 1))
            length = rng.randint(1, 80)
            images.append((rng.getrandbits(128), start, length))
            pos = start + length
        hashes = block_hashes(fp, salt, lora.encode(), tokens, block_tokens, images)
        out["block_hash_cases"].append({
            "model_fingerprint": hex128(fp), "cache_salt_hex": salt.hex(), "lora_id": lora,
            "block_tokens": block_tokens, "tokens": tokens,
            "images": [{"content_hash": hex128(h), "start": s, "length": l}
                       for (h, s, l) in images],
            "expected": [hex128(h) for h in hashes],
        })
    for _ in range(max(1, count // 4)):
        files = {("shard-%d.safetensors" % i if rng.random() < 0.8 else "config.json"):
                 rng.getrandbits(128) for i in range(rng.randint(1, 4))}
        tok = rng.getrandbits(128)
        dtype = rng.choice(["f32", "f16", "bf16", "fp8_e4m3"])
        layers, heads, dim = rng.randint(1, 96), rng.randint(1, 16), rng.choice([64, 128])
        weight_dtype = rng.choice(["f32", "bf16"])
        out["fingerprint_cases"].append({
            "files": {k: hex128(v) for k, v in files.items()}, "tokenizer_digest": hex128(tok),
            "kv_dtype": dtype, "cached_layers": layers, "kv_heads": heads, "head_dim": dim,
            "weight_dtype": weight_dtype,
            "expected": hex128(model_fingerprint(files, tok, dtype, layers, heads, dim,
                                                 weight_dtype)),
        })
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "golden":
        golden()
    elif len(sys.argv) == 4 and sys.argv[1] == "cases":
        cases(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(__doc__)
