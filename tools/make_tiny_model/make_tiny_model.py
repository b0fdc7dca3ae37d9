#!/usr/bin/env python3
"""Makes small models and tokenizers for tests, with the reference libraries (HF `tokenizers`).

  make_tiny_model.py tokenizers OUTDIR [--vocab-size N]
  make_tiny_model.py models OUTDIR

writes OUTDIR/<name>/tokenizer.json for each tokenizer family Ferry must handle, trained with
HF `tokenizers`' BpeTrainer on text found on this machine (license texts, Python's standard
library sources), and OUTDIR/<name>/tokenizer_config.json with BOS/EOS and the family's chat
template (chat_templates/: ChatML with tools, Llama-3.1, Mistral v0.3):

  gpt2_bytelevel        ByteLevel pre-tokenizer with its GPT-2 regex, ByteLevel decoder
  llama3_bytelevel      Split(Llama-3 regex) + ByteLevel(use_regex=false), ignore_merges
  qwen2_nfc             NFC normalizer + Split(Qwen2 regex) + ByteLevel
  llama2_sentencepiece  Prepend/Replace normalizer (Llama-2 legacy), byte_fallback, fuse_unk,
                        Replace/ByteFallback/Fuse/Strip decoder
  mistral_metaspace     Metaspace pre-tokenizer (prepend_scheme=first, split=false), byte_fallback,
                        Metaspace decoder chain
"""
import argparse
import glob
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, Regex, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SP_SPECIALS = ["<unk>", "<s>", "</s>"]


def training_text():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/lib/python3*/json/*.py"))[:20]
    files += sorted(glob.glob("/usr/lib/python3*/email/*.py"))[:20]
    texts = []
    for path in files:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    # A little of other scripts, so that the vocabularies are not ASCII-only.
    texts.append("日本語のテキスト 中文分词 한국어 Привет мир Γειά σου مرحبا שלום नमस्ते 😀👍 café naïve"
                 * 20)
    if not texts:
        raise SystemExit("no training text found on this machine")
    return texts


def bytelevel(name, out_dir, vocab_size, pre, normalizer=None, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    save(tok.to_str(), name, out_dir)


def sentencepiece(name, out_dir, vocab_size, metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SP_SPECIALS,
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    doc = json.loads(tok.to_str())
    # SentencePiece vocabularies hold the 256 byte tokens <0x00>..<0xFF> as ordinary entries.
    vocab = doc["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    save(json.dumps(doc, ensure_ascii=False), name, out_dir)


# name -> (chat template file, bos, eos)
CONFIGS = {
    "gpt2_bytelevel": ("chatml_tools.jinja", "<|endoftext|>", "<|im_end|>"),
    "qwen2_nfc": ("qwen3_reasoning.jinja", "<|endoftext|>", "<|im_end|>"),
    "llama3_bytelevel": ("llama3.jinja", "<|endoftext|>", "<|im_end|>"),
    "llama2_sentencepiece": ("mistral.jinja", "<s>", "</s>"),
    "mistral_metaspace": ("mistral.jinja", "<s>", "</s>"),
}


def save(text, name, out_dir):
    os.makedirs(os.path.join(out_dir, name), exist_ok=True)
    # Round-trip through HF to be sure the file is one it accepts.
    Tokenizer.from_str(text)
    with open(os.path.join(out_dir, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    template_file, bos, eos = CONFIGS[name]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "chat_templates", template_file), encoding="utf-8") as f:
        template = f.read()
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": False,
              "chat_template": template, "model_max_length": 2048}
    with open(os.path.join(out_dir, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


def tiny_models(out_dir):
    """Tiny HF-format dense models with deterministic pseudo-random weights (transformers'
    initialisation under a fixed seed, norms perturbed away from 1), each with a tokenizer trained
    above. A few MB each:

      llama_gqa_f32, llama_gqa_bf16  GQA Llama (4 heads, 2 KV heads) in fp32 and in bf16
      llama3_rope_tied               Llama with llama3 RoPE scaling and tied embeddings
      qwen2_bias                     Qwen2 with q/k/v biases
      mistral_gqa                    GQA Mistral, no sliding window
      llama_linear_rope              Llama with linear RoPE scaling (factor 2)
      qwen3_qknorm                   Qwen3: q_norm/k_norm per head, head_dim 32 != hidden/heads.
                                     transformers 4.47 has no Qwen3, so it is a Llama's weights
                                     plus q_norm/k_norm, with a config.json written here.
      mistral_swa                    Mistral with a sliding window of 8 on every layer
      qwen3_hybrid                   Qwen3 (as qwen3_qknorm) whose layer 0 slides over 8 positions
                                     and layer 1 attends to all (layer_types, as newer Qwen3
                                     configs spell it); the functional reference checks it
      mixtral_moe                    Mixtral: 8 experts, top-2 renormalised, every layer sparse
      qwen2_moe                      Qwen2-MoE: 8 experts of width 32, top-2 (not renormalised),
                                     a sigmoid-gated shared expert, layer 0 dense (mlp_only_layers)
      qwen3_moe                      Qwen3-MoE: q/k norm, no q/k/v biases, 8 experts top-2
                                     renormalised, no shared expert; made from a Qwen2-MoE's
                                     weights (4.47 has no Qwen3-MoE) with a config.json written
                                     here, checked against the functional reference
    The MoE routers' weights are scaled up (x20) so that routing is decisive: a choice between
    two nearly equal experts would flip on rounding and no tolerance could compare the outputs.
    """
    import shutil
    import torch
    from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, MixtralConfig,
                              Qwen2Config, Qwen2MoeConfig)
    tok_dir = os.path.join(out_dir, "_tokenizers")
    bytelevel("llama3_bytelevel", tok_dir, 512, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=True)
    bytelevel("qwen2_nfc", tok_dir, 512, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizer=normalizers.NFC())
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5)
    specs = [
        ("llama_gqa_f32", "llama3_bytelevel", LlamaConfig, dict(rope_theta=10000.0), torch.float32),
        ("llama_gqa_bf16", "llama3_bytelevel", LlamaConfig, dict(rope_theta=10000.0), torch.bfloat16),
        ("llama3_rope_tied", "llama3_bytelevel", LlamaConfig,
         dict(rope_theta=500000.0, tie_word_embeddings=True,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
         torch.float32),
        ("qwen2_bias", "qwen2_nfc", Qwen2Config, dict(rope_theta=1000000.0), torch.float32),
        ("mistral_gqa", "llama3_bytelevel", MistralConfig,
         dict(rope_theta=10000.0, sliding_window=None), torch.float32),
        ("llama_linear_rope", "llama3_bytelevel", LlamaConfig,
         dict(rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
         torch.float32),
        # Made as a Llama with head_dim 32 (hidden 64 / 4 heads would be 16); see save_qwen3.
        ("qwen3_qknorm", "qwen2_nfc", LlamaConfig,
         dict(rope_theta=1000000.0, head_dim=32, attention_bias=False, tie_word_embeddings=False),
         torch.float32),
        ("mistral_swa", "llama3_bytelevel", MistralConfig,
         dict(rope_theta=10000.0, sliding_window=8), torch.float32),
        ("qwen3_hybrid", "qwen2_nfc", LlamaConfig,
         dict(rope_theta=1000000.0, head_dim=32, attention_bias=False, tie_word_embeddings=False),
         torch.float32),
        ("mixtral_moe", "llama3_bytelevel", MixtralConfig,
         dict(rope_theta=1000000.0, num_local_experts=8, num_experts_per_tok=2,
              sliding_window=None), torch.float32),
        ("qwen2_moe", "qwen2_nfc", Qwen2MoeConfig,
         dict(rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=64, norm_topk_prob=False, decoder_sparse_step=1,
              mlp_only_layers=[0], use_sliding_window=False), torch.float32),
        ("qwen3_moe", "qwen2_nfc", Qwen2MoeConfig,
         dict(rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=8, norm_topk_prob=True, decoder_sparse_step=1,
              mlp_only_layers=[], use_sliding_window=False), torch.float32),
    ]
    for name, tok, config_class, extra, dtype in specs:
        target = os.path.join(out_dir, name)
        os.makedirs(target, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, tok, f), os.path.join(target, f))
        tokenizer = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
        vocab = tokenizer.get_vocab_size()
        torch.manual_seed(0)
        config = config_class(vocab_size=vocab, **common, **extra)
        model = AutoModelForCausalLM.from_config(config).to(dtype)
        with torch.no_grad():  # norms away from 1, so that tests see them
            for pname, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
                if pname.endswith("block_sparse_moe.gate.weight") or pname.endswith("mlp.gate.weight"):
                    p.mul_(20.0)  # decisive routing (see above)
        if name == "qwen3_moe":
            save_qwen3_moe(model, config, tokenizer, target)
        elif name.startswith("qwen3"):
            hybrid = name == "qwen3_hybrid"
            save_qwen3(model, config, tokenizer, target,
                       layer_types=["sliding_attention", "full_attention"] if hybrid else None)
        else:
            model.save_pretrained(target, safe_serialization=True)


def save_qwen3_family(tensors, config, tokenizer, target, head_dim, **fields):
    """Writes a Qwen3-family checkpoint: `tensors` plus per-layer q_norm/k_norm weights of shape
    [head_dim] (1 + 0.1 * randn, from torch's global RNG, seeded by the caller), and a config.json
    with the fields of a real Qwen3 config, updated with `fields` (model type, MoE fields...)."""
    import torch
    from safetensors.torch import save_file
    for i in range(config.num_hidden_layers):
        for norm in ("q_norm", "k_norm"):
            tensors["model.layers.%d.self_attn.%s.weight" % (i, norm)] = (
                1.0 + 0.1 * torch.randn(head_dim, dtype=torch.float32))
    save_file(tensors, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
    qwen3 = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tokenizer.token_to_id("<|endoftext|>"),
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": config.initializer_range,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "max_window_layers": config.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": config.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": config.vocab_size,
    }
    qwen3.update(fields)
    with open(os.path.join(target, "config.json"), "w", encoding="utf-8") as f:
        json.dump(qwen3, f, indent=2)
        f.write("\n")


def save_qwen3(model, config, tokenizer, target, layer_types=None):
    """Saves a Llama model (made with the config's head_dim) as a Qwen3 one (save_qwen3_family);
    with layer_types, a hybrid whose "sliding_attention" layers have a window of 8."""
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    fields = dict(use_sliding_window=True, sliding_window=8, layer_types=layer_types) \
        if layer_types else {}
    save_qwen3_family(tensors, config, tokenizer, target, config.head_dim, **fields)


def save_qwen3_moe(model, config, tokenizer, target):
    """Saves a Qwen2-MoE model as a Qwen3-MoE one: without the q/k/v biases and the shared
    expert (Qwen3-MoE has neither), with q/k norms and the config fields of a real Qwen3-MoE."""
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
               if not (k.endswith("_proj.bias") or ".shared_expert" in k)}
    save_qwen3_family(
        tensors, config, tokenizer, target, config.hidden_size // config.num_attention_heads,
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", decoder_sparse_step=1,
        mlp_only_layers=[], moe_intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=True, num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["tokenizers", "models"])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab-size", type=int, default=3000)
    args = parser.parse_args()
    if args.what == "models":
        tiny_models(args.out_dir)
        return
    v = args.vocab_size
    bytelevel("gpt2_bytelevel", args.out_dir, v, pre_tokenizers.ByteLevel(add_prefix_space=False))
    bytelevel("llama3_bytelevel", args.out_dir, v, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=True)
    bytelevel("qwen2_nfc", args.out_dir, v, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizer=normalizers.NFC())
    sentencepiece("llama2_sentencepiece", args.out_dir, v, metaspace=False)
    sentencepiece("mistral_metaspace", args.out_dir, v, metaspace=True)


if __name__ == "__main__":
    main()
