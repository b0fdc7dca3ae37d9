#!/usr/bin/env python3
"""Reference outputs of a LLaVA-style model's vision tower and projector, with HF transformers
4.47 (LlavaForConditionalGeneration, float32, eager attention, CPU), for tests of Ferry's vision
tower (engine/model/vision).

  vision_reference.py MODEL_DIR OUT_DIR [--random N]

For N pixel tensors drawn from N(0, 1) (seeded: numpy default_rng(1234)), and one synthetic RGB
image (a gradient with noise, wider than tall) run through the directory's own image processor
(AutoProcessor), writes raw little-endian float32 files to OUT_DIR:

  pixels_<name>.f32     [3, S, S] the pixel values fed to the tower
  hidden_<name>.f32     [positions, hidden] vision_tower(..., output_hidden_states=True)
                        .hidden_states[vision_feature_layer] (CLS first)
  projected_<name>.f32  [image tokens, text hidden] get_image_features (CLS dropped for the
                        "default" strategy, then the multimodal projector)

and OUT_DIR/cases.json listing them.
"""
import argparse
import json
import os

import numpy as np
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--random", type=int, default=2)
    args = parser.parse_args()
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    torch.set_grad_enabled(False)
    model = LlavaForConditionalGeneration.from_pretrained(
        args.model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    size = cfg.vision_config.image_size
    rng = np.random.default_rng(1234)
    images = [("random%d" % i, rng.standard_normal((3, size, size)).astype(np.float32))
              for i in range(args.random)]
    processor = AutoProcessor.from_pretrained(args.model_dir)
    h, w = size + 9, size * 2 - 3
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (h + w)], -1)
    rgb = np.clip(rgb + rng.integers(-30, 31, rgb.shape), 0, 255).astype(np.uint8)
    pixels = processor.image_processor(Image.fromarray(rgb), return_tensors="np")["pixel_values"]
    images.append(("processed", pixels[0].astype(np.float32)))
    os.makedirs(args.out_dir, exist_ok=True)
    cases = []
    for name, px in images:
        t = torch.from_numpy(px).unsqueeze(0)
        hidden = model.vision_tower(t, output_hidden_states=True).hidden_states[
            cfg.vision_feature_layer]
        projected = model.get_image_features(t, cfg.vision_feature_layer,
                                             cfg.vision_feature_select_strategy)
        files = {"name": name}
        for kind, arr in (("pixels", px), ("hidden", hidden[0].numpy()),
                          ("projected", projected[0].numpy())):
            files[kind] = "%s_%s.f32" % (kind, name)
            np.ascontiguousarray(arr, dtype="<f4").tofile(os.path.join(args.out_dir, files[kind]))
        cases.append(files)
    with open(os.path.join(args.out_dir, "cases.json"), "w") as f:
        json.dump({"vision_feature_layer": cfg.vision_feature_layer, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
