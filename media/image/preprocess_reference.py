#!/usr/bin/env python3
"""media/image against PIL and transformers 4.47.1 (run with $FERRY_REF_PYTHON: the reference venv,
which sees Debian's python3-pil, the same libjpeg-turbo media/image links).

Usage: preprocess_reference.py IMAGE_TOOL WORKDIR

On a corpus written here with PIL (synthetic patterns, noise, smooth "photo-like" scenes drawn
with ImageDraw; sizes from 1x1 and 1xN to 2400x1600, aspect ratios up to 1:300; modes RGB, L, 1,
RGBA, LA, P with transparency, tRNS on grey/RGB/16-bit grey, 16-bit grey, grey+alpha and RGB,
Adam7-interlaced; PNG, baseline and progressive JPEG,
4:2:0/4:2:2/4:4:4, grey JPEG, CMYK JPEG), checks:
  decode      image_tool's RGB bytes == PIL's Image.open(f).convert("RGB"), exactly;
  orientation JPEGs (APP1) and PNGs (eXIf) with EXIF orientation 1..8: ApplyOrientation == ImageOps.exif_transpose, exactly;
  preprocess  pixel values against CLIPImageProcessor and SiglipImageProcessor (LLaVA-1.5's and
              SigLIP's shipped configs, plus bilinear and a crop larger than the resize) on the
              same RGB image: bit-identical (max |ferry - transformers| == 0: the same integer
              resize, the same float32 operations; measured 0 on all 180 pairs); the observed
              maximum and the exact fraction are printed.
Exits non-zero on any mismatch.
"""
import io
import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageOps
from transformers import CLIPImageProcessor, SiglipImageProcessor

TOLERANCE = 0.0  # bit-identical: same integer resize, same float32 operations

CONFIGS = {
    "llava15_clip336": {
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
        "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}},
    "clip224_bilinear_bigcrop": {
        "crop_size": 240, "image_processor_type": "CLIPImageProcessor", "resample": 2,
        "size": 224},
    "siglip384": {
        "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessor",
        "image_std": [0.5, 0.5, 0.5], "processor_class": "SiglipProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"height": 384, "width": 384}},
    "siglip224_bilinear": {
        "image_processor_type": "SiglipImageProcessor", "resample": 2,
        "size": {"height": 224, "width": 224}},
}


def chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body +
            struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))


def raw_png(w, h, depth, colour, rows, extra=b"", interlace=0):
    """A PNG PIL cannot write (16-bit, Adam7): rows are the filter-0 scanlines, in pass order
    when interlaced; extra is chunks before IDAT."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace)
    idat = zlib.compress(b"".join(b"\0" + r for r in rows))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", idat) +
            chunk(b"IEND", b""))


def adam7_rows(pixels):
    """The scanlines of an 8-bit RGB image (H, W, 3) in Adam7's seven passes."""
    rows = []
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                           (1, 0, 2, 2), (0, 1, 1, 2)):
        sub = pixels[y0::dy, x0::dx]
        if sub.shape[0] and sub.shape[1]:
            rows.extend(r.tobytes() for r in sub)
    return rows


def scene(w, h, seed):
    """A photo-like image: gradient sky, shapes, blur and sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)),
                     ((x + y) * 127 // max(w + h - 2, 1)) + 64], axis=-1).astype(np.uint8)
    im = Image.fromarray(base, "RGB")
    d = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, w // 2 + 2)), y0 + int(rng.integers(1, h // 2 + 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
    im = im.filter(ImageFilter.GaussianBlur(1.5))
    noisy = np.asarray(im).astype(np.int16) + rng.integers(-12, 13, (h, w, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def noise(w, h, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def corpus(d):
    files = []

    def save(name, im, **kw):
        path = os.path.join(d, name)
        im.save(path, **kw)
        files.append(path)

    sizes = [(1, 1), (1, 9), (9, 1), (3, 300), (300, 3), (7, 5), (224, 224), (336, 336),
             (640, 480), (480, 640), (1000, 50), (333, 517), (2400, 1600)]
    for i, (w, h) in enumerate(sizes):
        im = scene(w, h, i) if w * h > 100 else noise(w, h, i)
        save(f"scene_{w}x{h}.png", im)
        save(f"scene_{w}x{h}.jpg", im, quality=90)
    big = scene(800, 600, 99)
    save("noise_257x129.png", noise(257, 129, 5))
    save("progressive.jpg", big, quality=85, progressive=True)
    save("s444.jpg", big, quality=95, subsampling=0)
    save("s422.jpg", big, quality=75, subsampling=1)
    save("grey.jpg", big.convert("L"))
    # CMYK (PIL writes Adobe's inverted samples): from RGB, and with every ink and black level.
    save("cmyk.jpg", big.convert("CMYK"), quality=90)
    inks = np.random.default_rng(4).integers(0, 256, (61, 83, 4), dtype=np.uint8)
    save("cmyk_inks.jpg", Image.fromarray(inks, "CMYK"), quality=100, subsampling=0)
    save("grey.png", big.convert("L"))
    save("bilevel.png", big.convert("1"))
    rgba = big.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(big.size))
    save("rgba.png", rgba)
    save("la.png", rgba.convert("LA"))
    save("palette_trns.png", big.convert("P", palette=Image.ADAPTIVE, colors=64), transparency=3)
    save("palette_web.png", scene(97, 61, 7).convert("P"))
    g16 = (np.arange(64 * 48, dtype=np.uint32).reshape(48, 64) * 23 % 65536).astype(">u2")
    with open(os.path.join(d, "grey16.png"), "wb") as f:
        f.write(raw_png(64, 48, 16, 0, [r.tobytes() for r in g16]))
    files.append(os.path.join(d, "grey16.png"))
    rgb16 = (np.random.default_rng(3).integers(0, 65536, (40, 30, 3))).astype(">u2")
    with open(os.path.join(d, "rgb16.png"), "wb") as f:
        f.write(raw_png(30, 40, 16, 2, [r.tobytes() for r in rgb16]))
    files.append(os.path.join(d, "rgb16.png"))
    trns16 = chunk(b"tRNS", struct.pack(">H", 23))
    with open(os.path.join(d, "grey16_trns.png"), "wb") as f:
        f.write(raw_png(64, 48, 16, 0, [r.tobytes() for r in g16], extra=trns16))
    files.append(os.path.join(d, "grey16_trns.png"))
    ga16 = np.stack([g16, g16[::-1]], axis=-1).astype(">u2")
    with open(os.path.join(d, "ga16.png"), "wb") as f:
        f.write(raw_png(64, 48, 16, 4, [r.tobytes() for r in ga16]))
    files.append(os.path.join(d, "ga16.png"))
    inter = np.asarray(scene(45, 29, 21))
    with open(os.path.join(d, "adam7.png"), "wb") as f:
        f.write(raw_png(45, 29, 8, 2, adam7_rows(inter), interlace=1))
    files.append(os.path.join(d, "adam7.png"))
    save("grey_trns.png", big.convert("L"), transparency=10)
    save("rgb_trns.png", big, transparency=(1, 2, 3))
    save("grey4_trns.png", big.convert("L").quantize(16).convert("L"), bits=4, transparency=0)
    return files


def read_rgb(path):
    data = open(path, "rb").read()
    w, h = struct.unpack("<ii", data[:8])
    return np.frombuffer(data[8:], np.uint8).reshape(h, w, 3)


def tool(*args):
    run = subprocess.run([TOOL, *args], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"image_tool {' '.join(args)} failed: {run.stderr}")


def main():
    global TOOL
    TOOL, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = 0
    files = corpus(work)
    out = os.path.join(work, "out.bin")

    for path in files:
        tool("decode", path, out)
        ours = read_rgb(out)
        ref = np.asarray(Image.open(path).convert("RGB"))
        if ours.shape != ref.shape or not np.array_equal(ours, ref):
            diff = "shape" if ours.shape != ref.shape else int(np.abs(ours.astype(int) - ref).max())
            print(f"DECODE MISMATCH {os.path.basename(path)}: {diff}")
            failures += 1
    print(f"decode: {len(files)} files, {len(files) - failures} identical to PIL")

    orient_fail = 0
    src = scene(37, 23, 11)
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        for ext, kw in (("jpg", {"quality": 90}), ("png", {})):
            path = os.path.join(work, f"orient{o}.{ext}")
            src.save(path, exif=exif.tobytes(), **kw)
            tool("orient", path, out)
            ref = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
            ours = read_rgb(out)
            if ours.shape != ref.shape or not np.array_equal(ours, ref):
                print(f"ORIENTATION MISMATCH {ext} {o}")
                orient_fail += 1
    print(f"orientation: 8 JPEGs and 8 PNGs (eXIf), {16 - orient_fail} identical to "
          "ImageOps.exif_transpose")
    failures += orient_fail

    worst = 0.0
    exact = total = 0
    for name, cfg in CONFIGS.items():
        cfg_path = os.path.join(work, name + ".json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        kwargs = {k: v for k, v in cfg.items() if k not in ("image_processor_type", "processor_class")}
        cls = CLIPImageProcessor if cfg["image_processor_type"] == "CLIPImageProcessor" \
            else SiglipImageProcessor
        processor = cls(**kwargs)
        cfg_worst = 0.0
        for path in files:
            rgb = Image.open(path).convert("RGB")
            # channels_last: transformers guesses the layout of a tiny (1x1, 1x3) image wrongly.
            ref = processor(images=rgb, return_tensors="np",
                            input_data_format="channels_last")["pixel_values"][0]
            tool("preprocess", path, cfg_path, out)
            data = open(out, "rb").read()
            h, w = struct.unpack("<ii", data[:8])
            ours = np.frombuffer(data[8:], np.float32).reshape(3, h, w)
            total += 1
            if ours.shape != ref.shape:
                print(f"PREPROCESS SHAPE {name} {os.path.basename(path)}: {ours.shape} vs {ref.shape}")
                failures += 1
                continue
            d = float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max())
            exact += int(np.array_equal(ours, ref))
            cfg_worst = max(cfg_worst, d)
            if d > TOLERANCE:
                print(f"PREPROCESS MISMATCH {name} {os.path.basename(path)}: max abs diff {d:.3g}")
                failures += 1
        print(f"preprocess {name}: {len(files)} images, max abs diff {cfg_worst:.3g}")
        worst = max(worst, cfg_worst)
    print(f"preprocess: {total} (image, config) pairs, {exact} bit-identical, "
          f"max abs diff {worst:.3g} (tolerance {TOLERANCE})")
    if failures:
        sys.exit(f"{failures} mismatches")
    print("OK")


if __name__ == "__main__":
    main()
