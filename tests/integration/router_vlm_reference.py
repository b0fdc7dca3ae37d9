#!/usr/bin/env python3
"""The reference half of router_vlm_test: transformers 4.47.1 (LlavaProcessor and
LlavaForConditionalGeneration, float32, eager, CPU) on the tiny VLM, for the conversations the
test sends through ferry-router.

  router_vlm_reference.py LLAVA_REFERENCE_DIR MODEL OUT_DIR [--max-new-tokens N]

Writes test images made by PIL (OUT_DIR/a.png: RGB 40x30; OUT_DIR/b.jpg: JPEG 64x48), then, for
each case (one image and a question; two images and a question), renders the chat with the
processor's chat template (apply_chat_template, add_generation_prompt: HF's convention of
{"type": "image"} and {"type": "text"} content parts), runs the processor on the rendered text and
the images (load_image), and decodes greedily with the model (llava_reference.py's generate:
the KV cache, no stop on end of sequence). OUT_DIR/reference.json: {"cases": [{"text", "images",
"prompt", "ids", "tokens", "margins"}], "extra": [...]}. With --extra-images N, "extra" has N more
one-image cases on distinct PNGs (OUT_DIR/c0.png ...: RGB 40x30, another pattern each), for tests
that need several images in flight at once.
"""
import argparse
import json
import os
import sys

CASES = [
    {"text": "What is in this picture?", "images": ["a.png"]},
    {"text": "Compare the two images.", "images": ["a.png", "b.jpg"]},
]


def make_images(out_dir):
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:30, 0:40]
    a = np.stack([x * 6, y * 8, (x * y) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(a, "RGB").save(os.path.join(out_dir, "a.png"), "PNG")
    y, x = np.mgrid[0:48, 0:64]
    b = np.stack([(x * 4) % 256, 255 - y * 5, (x + y) * 2 % 256], axis=-1).astype(np.uint8)
    Image.fromarray(b, "RGB").save(os.path.join(out_dir, "b.jpg"), "JPEG", quality=90)


def make_extra_images(out_dir, n):
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:30, 0:40]
    names = []
    for i in range(n):
        c = np.stack([(x * (7 + i) + 31 * i) % 256, (y * (5 + 2 * i)) % 256,
                      (x + y + 53 * i) % 256], axis=-1).astype(np.uint8)
        names.append(f"c{i}.png")
        Image.fromarray(c, "RGB").save(os.path.join(out_dir, names[-1]), "PNG")
    return [{"text": "What is in this picture?", "images": [name]} for name in names]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("llava_reference_dir")
    parser.add_argument("model")
    parser.add_argument("out_dir")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--extra-images", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, args.llava_reference_dir)
    import llava_reference as ref
    import torch
    from transformers import DynamicCache
    from transformers.image_utils import load_image

    os.makedirs(args.out_dir, exist_ok=True)
    make_images(args.out_dir)
    extra = make_extra_images(args.out_dir, args.extra_images)
    processor, model = ref.load(args.model)
    out = []
    for case in CASES + extra:
        content = [{"type": "image"} for _ in case["images"]]
        content.append({"type": "text", "text": case["text"]})
        prompt = processor.apply_chat_template([{"role": "user", "content": content}],
                                               add_generation_prompt=True)
        images = [load_image(os.path.join(args.out_dir, p)) for p in case["images"]]
        inputs = processor(text=prompt, images=images, return_tensors="pt")
        logits = model(**inputs, past_key_values=DynamicCache(), use_cache=True)
        tokens, margins = [], []
        for step in range(args.max_new_tokens):
            token, margin = ref.pick(logits.logits[0, -1].float())
            tokens.append(token)
            margins.append(margin)
            if step + 1 < args.max_new_tokens:
                logits = model.language_model(input_ids=torch.tensor([[token]]),
                                              past_key_values=logits.past_key_values,
                                              use_cache=True)
        out.append(dict(case, prompt=prompt, ids=inputs["input_ids"][0].tolist(), tokens=tokens,
                        margins=margins))
    with open(os.path.join(args.out_dir, "reference.json"), "w") as f:
        json.dump({"cases": out[:len(CASES)], "extra": out[len(CASES):]}, f, indent=1)


if __name__ == "__main__":
    main()
