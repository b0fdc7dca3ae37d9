#!/usr/bin/env python3
"""Makes a random-weight LLaVA-style vision-language model as an HF directory, with transformers
(the reference virtualenv): LlavaForConditionalGeneration = a CLIP vision tower, the MLP
projector (linear_1 -> gelu -> linear_2) and a Llama (or Mistral, or Qwen2) text model.

  make_tiny_vlm.py OUTDIR [--size tiny|bench] [--image_size N]
                          [--text llama|sliding_window|hybrid] [--text_shape smollm2] [--check]

writes OUTDIR/config.json, model.safetensors, tokenizer.json + tokenizer_config.json (a byte-level
BPE trained as make_tiny_model's llama3_bytelevel, plus the added special token <image>, the
model's image_token_index), the LLaVA-1.5 chat template (llava.jinja: one <image> per image part),
preprocessor_config.json (CLIPImageProcessor: shortest-edge bicubic resize to the tower's image
size, center crop, rescale 1/255, CLIP mean/std) and processor_config.json (LlavaProcessor:
patch_size, vision_feature_select_strategy "default", num_additional_image_tokens 1), so that
LlavaProcessor expands one <image> into (image_size / patch)^2 placeholders (CLS dropped), which
is also config.json's image_seq_length.

  --size tiny   CI: tower 56 px, patch 14 (16 patches), hidden 64, 3 layers, 4 heads, quick_gelu;
                text Llama hidden 64, 2 layers, 4 heads (2 KV). vision_feature_layer -2.
  --size bench  about 100M parameters: tower 224 px, patch 14 (256 patches), hidden 768,
                10 layers, 12 heads; text Llama hidden 512, 8 layers. --image_size 448 makes the
                448 px tower (1024 patches) of `ferry bench vision`.
  --text_shape smollm2  (with --size bench) the text model in SmolLM2-135M's shape: hidden 576,
                intermediate 1536, 30 layers, 9 heads (3 KV), rope_theta 100000 (the vocabulary
                stays the small tokenizer's): 107M text parameters next to the tower's and
                projector's 72M, a VLM whose prefill costs what SmolLM2's does (`ferry bench
                epd`).
  --text sliding_window  the text model is a Mistral with sliding_window 8 on every layer.
  --text hybrid  the text model is a Qwen2 (q/k/v biases) with use_sliding_window, sliding_window
                8 and max_window_layers half the layers (tiny: layer 0 full attention, layer 1 a
                window of 8): a model with both kinds of layers, whose windowed layers the worker
                keeps in a pool of their own, so that a cached prefix is replayed (SWA replay
                tests). transformers' eager Qwen2 applies the window to every layer;
                tools/python/llava_reference.py gives each layer its own mask.
  --check       loads the written directory with transformers (AutoProcessor and the model),
                renders a chat with an image, runs a forward with the processor's pixels and
                checks the placeholder count and that the logits are finite.

Weights are deterministic (torch.manual_seed of --seed, 0 by default: another seed makes another
tower, whose digest differs). The tower's and projector's matrices are drawn N(0, 1/fan_in) and their 1-d parameters (norms, biases, the class embedding) perturbed by
N(0, 0.1^2), so that attention is far from uniform and every term shows in the outputs; the text
model keeps transformers' initialisation with norms perturbed, as make_tiny_model's.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "make_tiny_model"))

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
IMAGE_TOKEN = "<image>"


def make_tokenizer(tmp_dir):
    """The llama3_bytelevel tokenizer of make_tiny_model (512 entries) with <image> added."""
    import make_tiny_model as mtm
    from tokenizers import AddedToken, Tokenizer, Regex, pre_tokenizers
    mtm.bytelevel("llama3_bytelevel", tmp_dir, 512, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(mtm.LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=True)
    tok = Tokenizer.from_file(os.path.join(tmp_dir, "llama3_bytelevel", "tokenizer.json"))
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    return tok


def configs(size, image_size, text, text_shape=""):
    if size == "tiny":
        vision = dict(image_size=image_size or 56, patch_size=14, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
        text_common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2)
    else:
        vision = dict(image_size=image_size or 224, patch_size=14, hidden_size=768,
                      intermediate_size=3072, num_hidden_layers=10, num_attention_heads=12)
        text_common = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                           num_attention_heads=8, num_key_value_heads=4)
    if text_shape == "smollm2":
        if size != "bench":
            raise SystemExit("--text_shape smollm2 needs --size bench")
        text_common = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                           num_attention_heads=9, num_key_value_heads=3)
    vision.update(hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=vision["hidden_size"],
                  num_channels=3, model_type="clip_vision_model")
    text_common.update(max_position_embeddings=2048, rms_norm_eps=1e-5,
                       rope_theta=100000.0 if text_shape == "smollm2" else 10000.0)
    if text == "sliding_window":
        text_common.update(model_type="mistral", sliding_window=8)
    elif text == "hybrid":
        text_common.update(model_type="qwen2", use_sliding_window=True, sliding_window=8,
                           max_window_layers=text_common["num_hidden_layers"] // 2)
    else:
        text_common.update(model_type="llama")
    return vision, text_common


def make(out_dir, size, image_size, text, seed=0, text_shape=""):
    import shutil
    import tempfile
    import torch
    from transformers import (CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, PreTrainedTokenizerFast)
    vision, text_cfg = configs(size, image_size, text, text_shape)
    if vision["image_size"] % vision["patch_size"] != 0:
        raise SystemExit("--image_size must be a multiple of the patch size (%d)" %
                         vision["patch_size"])
    tmp = tempfile.mkdtemp()
    try:
        tok = make_tokenizer(tmp)
    finally:
        shutil.rmtree(tmp)
    vocab = tok.get_vocab_size()
    image_id = tok.token_to_id(IMAGE_TOKEN)
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    text_cfg.update(vocab_size=vocab, bos_token_id=tok.token_to_id("<|endoftext|>"),
                    eos_token_id=tok.token_to_id("<|im_end|>"))
    config = LlavaConfig(vision_config=vision, text_config=text_cfg, image_token_index=image_id,
                         projector_hidden_act="gelu", vision_feature_select_strategy="default",
                         vision_feature_layer=-2, image_seq_length=patches,
                         pad_token_id=tok.token_to_id("<|endoftext|>"))
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            tower = name.startswith("vision_tower.") or name.startswith("multi_modal_projector.")
            if tower and p.dim() >= 2:
                fan_in = p[0].numel()
                if "position_embedding" in name:
                    fan_in = 1  # the positions are added, not multiplied: O(1) like the patches
                p.normal_(0.0, fan_in ** -0.5)
            elif tower:
                base = 1.0 if "norm" in name and name.endswith(".weight") else 0.0
                p.copy_(base + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)

    with open(os.path.join(HERE, "llava.jinja"), encoding="utf-8") as f:
        template = f.read()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=2048,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = template
    image_processor = CLIPImageProcessor(
        do_resize=True, size={"shortest_edge": vision["image_size"]}, resample=3,
        do_center_crop=True, crop_size={"height": vision["image_size"],
                                        "width": vision["image_size"]},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=CLIP_MEAN,
        image_std=CLIP_STD, do_convert_rgb=True)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=fast,
                               patch_size=vision["patch_size"],
                               vision_feature_select_strategy="default", chat_template=template,
                               image_token=IMAGE_TOKEN, num_additional_image_tokens=1)
    processor.save_pretrained(out_dir)
    # Plain tokenizer_config.json: the class and add_bos_token as Ferry and AutoTokenizer read it.
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        tc = json.load(f)
    tc.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=False,
              chat_template=template, model_input_names=["input_ids", "attention_mask"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)
    n = sum(p.numel() for p in model.parameters())
    print("wrote %s: %d parameters, %d image tokens, image token id %d" %
          (out_dir, n, patches, image_id))


def check(out_dir):
    """Loads OUTDIR with transformers and runs a chat with one image through it."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    processor = AutoProcessor.from_pretrained(out_dir)
    model = LlavaForConditionalGeneration.from_pretrained(out_dir, torch_dtype=torch.float32).eval()
    cfg = model.config
    size = cfg.vision_config.image_size
    want = (size // cfg.vision_config.patch_size) ** 2
    if cfg.image_seq_length != want:
        raise SystemExit("image_seq_length %d != %d" % (cfg.image_seq_length, want))
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size + 20, size * 2, 3), dtype=np.uint8))
    chat = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "What is in the picture?"}]}]
    prompt = processor.apply_chat_template(chat, add_generation_prompt=True)
    if prompt.count("<image>") != 1 or not prompt.endswith("ASSISTANT:"):
        raise SystemExit("unexpected rendering: %r" % prompt)
    inputs = processor(images=image, text=prompt, return_tensors="pt")
    if tuple(inputs["pixel_values"].shape) != (1, 3, size, size):
        raise SystemExit("pixel_values %s" % (tuple(inputs["pixel_values"].shape),))
    placeholders = int((inputs["input_ids"] == cfg.image_token_index).sum())
    if placeholders != want:
        raise SystemExit("%d placeholders, want %d" % (placeholders, want))
    with torch.no_grad():
        out = model(**inputs)
    if not torch.isfinite(out.logits).all():
        raise SystemExit("non-finite logits")
    print("check: %s: %d placeholders, logits %s, finite" %
          (out_dir, placeholders, tuple(out.logits.shape)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=["tiny", "bench"], default="tiny")
    parser.add_argument("--image_size", type=int, default=0,
                        help="the tower's image size (default: 56 tiny, 224 bench)")
    parser.add_argument("--text", choices=["llama", "sliding_window", "hybrid"], default="llama")
    parser.add_argument("--text_shape", choices=["", "smollm2"], default="",
                        help="the text model's shape (--size bench): smollm2 = SmolLM2-135M's")
    parser.add_argument("--seed", type=int, default=0,
                        help="the weights' torch seed (another seed: another tower and digest)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    make(args.out_dir, args.size, args.image_size, args.text, args.seed, args.text_shape)
    if args.check:
        check(args.out_dir)


if __name__ == "__main__":
    main()
