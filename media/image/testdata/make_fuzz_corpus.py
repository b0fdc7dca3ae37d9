#!/usr/bin/env python3
"""Writes the seed corpus of //media/image:image_fuzz with PIL (python3-pil): small PNGs of
every colour type (grey 1/2/4/8/16-bit, RGB, RGBA, grey+alpha, palette with tRNS, 16-bit RGB,
not interlaced: PIL cannot write it) and JPEGs (baseline, progressive, grey, 4:2:0, EXIF orientation 6), plus truncated
and corrupted copies. Run from this directory: python3 make_fuzz_corpus.py"""
import io
import os
import struct
import zlib

from PIL import Image

out = "fuzz_corpus"
os.makedirs(out, exist_ok=True)


def pattern(mode, w, h):
    im = Image.new("RGB", (w, h))
    im.putdata([((x * 37) % 256, (y * 53) % 256, ((x + y) * 11) % 256)
                for y in range(h) for x in range(w)])
    return im.convert(mode)


def save(name, im, **kw):
    b = io.BytesIO()
    im.save(b, **kw)
    data = b.getvalue()
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    return data


files = {}
files["rgb.png"] = save("rgb.png", pattern("RGB", 7, 5), format="PNG")
save("rgba.png", pattern("RGBA", 6, 4), format="PNG")
save("grey.png", pattern("L", 5, 5), format="PNG")
save("grey_alpha.png", pattern("LA", 4, 3), format="PNG")
save("bilevel.png", pattern("1", 9, 3), format="PNG")
p = pattern("P", 6, 6)
save("palette_trns.png", p, format="PNG", transparency=0)
save("grey16.png", Image.frombytes("I;16", (4, 2), bytes(range(16))).convert("I"), format="PNG")


def chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body +
            struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))


def raw_png(w, h, depth, colour, rows):
    """A PNG PIL cannot write (16-bit RGB), one filter-0 row of bytes each."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    idat = zlib.compress(b"".join(b"\0" + r for r in rows))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


with open(os.path.join(out, "rgb16.png"), "wb") as f:
    f.write(raw_png(3, 2, 16, 2, [bytes((x * 7 + y) % 256 for x in range(18)) for y in range(2)]))
files["base.jpg"] = save("base.jpg", pattern("RGB", 16, 12), format="JPEG", quality=80)
save("progressive.jpg", pattern("RGB", 17, 9), format="JPEG", progressive=True)
save("grey.jpg", pattern("L", 8, 8), format="JPEG")
save("s444.jpg", pattern("RGB", 8, 8), format="JPEG", subsampling=0)
exif = Image.Exif()
exif[0x0112] = 6
save("orient6.jpg", pattern("RGB", 5, 3), format="JPEG", exif=exif.tobytes())
save("cmyk.jpg", pattern("CMYK", 8, 8), format="JPEG")
# Bombs: a zTXt chunk that inflates to 64 MiB (over libpng's chunk limit), and an IHDR that claims
# 20000 x 20000 over a few bytes of IDAT (over the pixel limit, refused from the header).
rgb = files["rgb.png"]
ztxt = b"bomb\0\0" + zlib.compress(bytes(64 << 20), 9)
with open(os.path.join(out, "ztxt_bomb.png"), "wb") as f:
    f.write(rgb[:33] + chunk(b"zTXt", ztxt) + rgb[33:])
with open(os.path.join(out, "huge_dims.png"), "wb") as f:
    f.write(raw_png(20000, 20000, 8, 0, [b"\0" * 20000] * 4)[:100])
for name, data in files.items():
    with open(os.path.join(out, "truncated_" + name), "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x55
    with open(os.path.join(out, "flipped_" + name), "wb") as f:
        f.write(bytes(bad))
