#!/usr/bin/env python3
"""A LLaVA-style model end to end with HF transformers 4.47.1 (LlavaProcessor and
LlavaForConditionalGeneration, float32, eager attention, CPU): the reference half of
engine/llava_reference_test.sh (the C++ half is engine/llava_check.cc).

  llava_reference.py cases OUT_DIR [--count 20] [--seed S]
      writes test images made by PIL (PNG: RGB, grey, RGBA, palette; JPEG: colour and grey; sizes
      from 9x9 to 300x120, wide and tall, with and without resizing) and OUT_DIR/cases.json:
      {"cases": [{"text": T, "images": [PATH, ...]}]}, prompts with 1 and with 2 images, the
      texts varied.
  llava_reference.py logits MODEL PREPARED.json OUT_DIR
      for each prepared case (llava_check prepare: the rendered prompt, with one <image> per
      image, and Ferry's expanded ids), runs the processor on the rendered text and the images
      (transformers.image_utils.load_image: EXIF orientation applied, converted to RGB), fails
      unless its input_ids equal Ferry's, and writes the logits of every position as
      OUT_DIR/logits_{i}.f32 (little-endian float32, [tokens, vocab]).
  llava_reference.py generate MODEL PREPARED.json --max-new-tokens N
      greedy decoding with the KV cache (the prompt and its images through
      LlavaForConditionalGeneration, then one token at a time through its language_model; no stop
      on end of sequence): prints {"results": [{"tokens": [N ids], "margins": [N floats]}]}, a margin being
      top-1 minus top-2 logit where that token was chosen (torch.argmax: the first of equal
      maxima).

A Qwen2 text model with use_sliding_window (make_tiny_vlm --text hybrid) is patched: transformers
4.47.1's eager Qwen2 builds one attention mask, with config.sliding_window, for every layer (only
its flash-attention path honours max_window_layers), so a wrapper around each decoder layer's
forward (torch 1.13's pre-hooks do not see keyword arguments) below max_window_layers replaces
that mask with the plain causal one (key j visible iff
j <= the query's cache position; batch 1, no padding), in the prompt's forward and in every
1-token step. The windowed layers keep transformers' mask, which the hook checks is "key j visible
iff q - sliding_window < j <= q" (q the query's cache position), the window as Ferry and
forward_reference.py count it (every layer checks it); the run fails unless some layer's mask was
actually replaced.
"""
import argparse
import json
import os
import sys

TEXTS = [
    "What is in this picture?",
    "Describe the image in one sentence.",
    "How many colours do you see?",
    "Is it day or night?",
    "Compare the two images.",
    "Write a haiku about it.",
    "What is the dominant colour, and why might that be?",
    "List three objects.",
    "Which one is brighter?",
    "Tell me a story about this, with a dragon and a small boat named Ferry.",
    "OK",
    "Does the image contain text? Answer yes or no.",
    "Translate the caption into French: 'a grey square'.",
    "Are these the same picture?",
    "What would you change here?",
    "Explain the scene to a child of five.",
    "1 + 1 = ?",
    "Where was this taken?",
    "Rate it from 1 to 10.",
    "Summarise both images, then say which you prefer.",
]

# (name, width, height, PIL mode, format)
IMAGES = [
    ("rgb_56", 56, 56, "RGB", "PNG"),
    ("rgb_wide", 300, 120, "RGB", "PNG"),
    ("grey_tall", 40, 97, "L", "PNG"),
    ("rgba_33", 33, 61, "RGBA", "PNG"),
    ("palette", 64, 48, "P", "PNG"),
    ("jpeg_200", 200, 150, "RGB", "JPEG"),
    ("jpeg_grey", 77, 77, "L", "JPEG"),
    ("jpeg_small", 9, 9, "RGB", "JPEG"),
]


def make_image(name, width, height, mode, seed):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                     ((x + y) * 97) % 256], axis=-1).astype(np.int32)
    noise = rng.integers(-40, 41, size=base.shape)
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb, "RGB")
    if mode == "L":
        image = image.convert("L")
    elif mode == "RGBA":
        alpha = rng.integers(0, 256, size=(height, width), dtype=np.uint8)
        image = image.convert("RGBA")
        image.putalpha(Image.fromarray(alpha, "L"))
    elif mode == "P":
        image = image.convert("P", palette=Image.ADAPTIVE, colors=32)
    return image


def cases(out_dir, count, seed):
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for k, (name, w, h, mode, fmt) in enumerate(IMAGES):
        path = os.path.join(out_dir, "%s.%s" % (name, "png" if fmt == "PNG" else "jpg"))
        image = make_image(name, w, h, mode, seed + k)
        if fmt == "JPEG":
            image.save(path, "JPEG", quality=90)
        else:
            image.save(path, "PNG")
        paths.append(path)
    out = []
    for i in range(count):
        text = TEXTS[i % len(TEXTS)]
        if i % 3 == 1:
            images = [paths[i % len(paths)], paths[(i * 5 + 3) % len(paths)]]
        else:
            images = [paths[i % len(paths)]]
        out.append({"text": text, "images": images})
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump({"cases": out}, f, indent=1)


# Decoder layer masks the per-layer windows replaced (full-attention layers of a Qwen2 hybrid).
REPLACED = [0]


def expected_mask(mask, cache_position, window):
    """mask's shape, 0 where key j is visible from query q, dtype min elsewhere."""
    import torch
    keys = torch.arange(mask.shape[-1])[None, :]
    q = cache_position[:, None]
    hidden = keys > q
    if window is not None:
        hidden |= keys <= q - window
    out = torch.zeros(mask.shape[-2:], dtype=mask.dtype)
    out.masked_fill_(hidden, torch.finfo(mask.dtype).min)
    return out[None, None]


def per_layer_windows(model):
    """Gives a Qwen2 hybrid's layers their own masks (see the module docstring)."""
    import torch
    text = model.config.text_config
    if text.model_type != "qwen2" or not text.use_sliding_window or not text.sliding_window:
        return

    def wrap(forward, window):
        def layer_forward(*args, **kwargs):
            mask = kwargs["attention_mask"]
            if mask is None or mask.dim() != 4 or mask.shape[0] != 1:
                sys.exit("unexpected attention mask %s" % (None if mask is None else mask.shape,))
            sliding = expected_mask(mask, kwargs["cache_position"], text.sliding_window)
            if not torch.equal(mask, sliding):
                sys.exit("transformers' sliding mask is not q - window < j <= q")
            if window is None:
                causal = expected_mask(mask, kwargs["cache_position"], None)
                REPLACED[0] += int(not torch.equal(causal, mask))
                kwargs["attention_mask"] = causal
            return forward(*args, **kwargs)
        return layer_forward

    for i, layer in enumerate(model.language_model.model.layers):
        window = text.sliding_window if i >= text.max_window_layers else None
        layer.forward = wrap(layer.forward, window)
    REPLACED[0] = 0


def check_replaced(model):
    text = model.config.text_config
    if text.model_type == "qwen2" and text.use_sliding_window and REPLACED[0] == 0:
        sys.exit("no full-attention layer's mask was replaced (prompts within the window?)")


def load(model_dir):
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    torch.set_grad_enabled(False)
    model = LlavaForConditionalGeneration.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    per_layer_windows(model)
    return AutoProcessor.from_pretrained(model_dir), model


def inputs_of(processor, case, index):
    from transformers.image_utils import load_image
    images = [load_image(p) for p in case["images"]] or None
    inputs = processor(text=case["prompt"], images=images, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    if ids != case["ids"]:
        sys.exit("case %d: the processor's input_ids differ from Ferry's expanded ids:\n%s\n%s"
                 % (index, ids, case["ids"]))
    return inputs


def logits(model_dir, prepared, out_dir):
    processor, model = load(model_dir)
    os.makedirs(out_dir, exist_ok=True)
    with open(prepared) as f:
        all_cases = json.load(f)["cases"]
    for i, case in enumerate(all_cases):
        inputs = inputs_of(processor, case, i)
        out = model(**inputs, use_cache=False).logits[0].float().contiguous()
        out.numpy().astype("<f4").tofile(os.path.join(out_dir, "logits_%d.f32" % i))
    check_replaced(model)


def pick(row):
    import torch
    token = int(torch.argmax(row))
    top2 = torch.topk(row, 2).values
    return token, float(top2[0] - top2[1])


def generate(model_dir, prepared, n):
    import torch
    from transformers import DynamicCache
    processor, model = load(model_dir)
    with open(prepared) as f:
        all_cases = json.load(f)["cases"]
    results = []
    for i, case in enumerate(all_cases):
        inputs = inputs_of(processor, case, i)
        out = model(**inputs, past_key_values=DynamicCache(), use_cache=True)
        tokens, margins = [], []
        for step in range(n):
            token, margin = pick(out.logits[0, -1].float())
            tokens.append(token)
            margins.append(margin)
            if step + 1 < n:
                # The text model alone: LlavaForConditionalGeneration.forward takes a 1-token
                # step without pixels for its legacy (unexpanded) path, which needs an
                # attention mask and masks cache positions whose first-layer keys sum to 0.
                out = model.language_model(input_ids=torch.tensor([[token]]),
                                           past_key_values=out.past_key_values, use_cache=True)
        results.append({"tokens": tokens, "margins": margins})
    check_replaced(model)
    json.dump({"results": results}, sys.stdout)
    sys.stdout.write("\n")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("cases")
    c.add_argument("out_dir")
    c.add_argument("--count", type=int, default=20)
    c.add_argument("--seed", type=int, default=47)
    lg = sub.add_parser("logits")
    lg.add_argument("model")
    lg.add_argument("prepared")
    lg.add_argument("out_dir")
    g = sub.add_parser("generate")
    g.add_argument("model")
    g.add_argument("prepared")
    g.add_argument("--max-new-tokens", type=int, default=20)
    args = parser.parse_args()
    if args.mode == "cases":
        cases(args.out_dir, args.count, args.seed)
    elif args.mode == "logits":
        logits(args.model, args.prepared, args.out_dir)
    else:
        generate(args.model, args.prepared, args.max_new_tokens)


if __name__ == "__main__":
    main()
