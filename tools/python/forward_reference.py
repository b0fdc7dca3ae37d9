#!/usr/bin/env python3
"""Reference forward passes of dense decoder-only models (Llama, Mistral, Qwen2, Qwen3), all
compute in float32 on the CPU, for tests of Ferry's forward pass.

  forward_reference.py logits MODEL CASES.json OUT_DIR [--impl transformers|functional]
                       [--weights f32|bf16]
  forward_reference.py generate MODEL CASES.json --max-new-tokens N [--impl ...] [--weights ...]
  forward_reference.py selfcheck HF_DIR...

MODEL is an HF model directory (config.json + model.safetensors or shards) or a .gguf file
(which transformers dequantizes to float32). CASES.json is {"prompts": [[token id, ...], ...]}.

logits: one forward pass per prompt (batch 1, no padding, positions 0..n-1); writes
  OUT_DIR/logits_{i}.f32 for prompt i: raw little-endian float32 [n, vocab], the logits of every
  position.
generate: greedy decoding of exactly N new tokens per prompt (no stop at EOS, no logits
  processors, ties to the lowest id); prints {"results": [{"tokens": [N ids], "margins": [N
  floats]}]}, a margin being top-1 minus top-2 logit where that token was chosen.
selfcheck: both implementations, with f32 and with bf16-rounded weights, on fixed pseudo-random
  prompts; max |functional - transformers| / max |transformers| per logits row must be <= 1e-5,
  and greedy decoding (transformers with its KV cache) must give the same tokens. Qwen3, which
  transformers 4.47 lacks, is compared with transformers' Llama modules plus per-head
  LlamaRMSNorm after q_proj/k_proj. Prints a line per model and weights; exits 1 on a failure.

--impl transformers: HF transformers' own model classes (eager attention, model.float()).
--impl functional: a plain-PyTorch forward pass written here from the HF model definitions,
  reading config.json and safetensors directly; HF directories only. The only one for Qwen3,
  which transformers 4.47 lacks; the default is transformers for every other family.
--weights bf16: every weight rounded to bfloat16 (nearest even) first; compute stays float32.
--activations bf16: the input of every linear layer (projections, MLP, LM head) rounded to
  bfloat16 too, as Ferry's bf16-weight products take it (engine/backends/cpu/cpu_kernels.h); the
  products and sums stay float32. Attention, norms and everything else stay float32.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")
NO_TRANSFORMERS = ("qwen3", "qwen3_moe")  # families transformers 4.47.1 cannot load
SELFCHECK_TOLERANCE = 1e-5


def is_gguf(path):
    return os.path.isfile(path) and path.endswith(".gguf")


def read_config(path):
    """config.json of an HF directory; None for a GGUF file."""
    if is_gguf(path):
        return None
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def choose_impl(path, requested):
    config = read_config(path)
    model_type = config.get("model_type") if config else None
    if requested is None:
        return "functional" if model_type in NO_TRANSFORMERS else "transformers"
    if requested == "transformers" and model_type in NO_TRANSFORMERS:
        raise SystemExit("%s: transformers cannot load model_type %s; use --impl functional"
                         % (path, model_type))
    if requested == "functional" and config is None:
        raise SystemExit("%s: --impl functional reads HF directories only, not GGUF" % path)
    return requested


def round_bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


# ---- transformers ----------------------------------------------------------------------------

def load_transformers(path):
    from transformers import AutoModelForCausalLM
    kwargs = dict(torch_dtype=torch.float32, attn_implementation="eager")
    if is_gguf(path):
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".",
                                                    gguf_file=os.path.basename(path), **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


class TransformersModel:
    def __init__(self, model, weights):
        self.model = model.float().eval()
        if weights == "bf16":
            with torch.no_grad():  # parameters() yields tied weights once
                for p in self.model.parameters():
                    p.copy_(round_bf16(p))
        self.vocab_size = self.model.config.vocab_size

    @torch.no_grad()
    def logits(self, ids):
        return self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()

    @torch.no_grad()
    def generate(self, ids, n):
        """Greedy decoding with the KV cache: [(token, margin)] * n."""
        from transformers import DynamicCache
        out = self.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache(),
                         use_cache=True)
        result = []
        for step in range(n):
            token, margin = pick(out.logits[0, -1].float())
            result.append((token, margin))
            if step + 1 < n:
                out = self.model(input_ids=torch.tensor([[token]]),
                                 past_key_values=out.past_key_values, use_cache=True)
        return result


# ---- functional ------------------------------------------------------------------------------

def load_safetensors(path):
    from safetensors import safe_open
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key).to(torch.float32)
    return tensors


def mixtral_name(name):
    """Mixtral's block_sparse_moe.{gate, experts.E.w1/w3/w2} as mlp.{gate, experts.E.gate/up/down}."""
    if ".block_sparse_moe." not in name:
        return name
    name = name.replace(".block_sparse_moe.", ".mlp.")
    for w, proj in ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")):
        name = name.replace(w, proj)
    return name


def rms_norm(x, weight, eps):
    """As transformers' LlamaRMSNorm in float32: weight * (x * rsqrt(mean(x^2) + eps))."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_inv_freq(config, head_dim):
    """transformers' ROPE_INIT_FUNCTIONS for rope_type default, linear and llama3."""
    base = float(config.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                               / head_dim))
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv_freq
    if config["model_type"] == "mistral":
        # transformers 4.47's MistralRotaryEmbedding ignores rope_scaling; refuse to guess.
        raise SystemExit("rope_scaling on a mistral model is not supported")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":  # _compute_llama3_parameters
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = ((old_context_len / wavelen - low_freq_factor)
                         / (high_freq_factor - low_freq_factor))
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    raise SystemExit("rope_type %s is not supported (default, linear, llama3)" % rope_type)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FunctionalModel:
    """Llama / Mistral / Qwen2 / Qwen3 / Mixtral / Qwen2-MoE / Qwen3-MoE ForCausalLM, from their HF
    definitions."""

    def __init__(self, path, weights):
        c = read_config(path)
        self.c = c
        self.family = c.get("model_type")
        if self.family not in FAMILIES:
            raise SystemExit("%s: model_type %s is not supported (%s)"
                             % (path, self.family, ", ".join(FAMILIES)))
        if c.get("hidden_act", "silu") != "silu":
            raise SystemExit("%s: hidden_act %s is not supported" % (path, c["hidden_act"]))
        self.vocab_size = c["vocab_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.qk_norm = self.family in ("qwen3", "qwen3_moe")
        # Qwen2's q/k/v always have biases (transformers 4.47 has no attention_bias for it).
        self.qkv_bias = bool(c.get("attention_bias", self.family in ("qwen2", "qwen2_moe")))
        # Mixture of experts: which layers are sparse, the router's top-k and its normalisation.
        if self.family == "mixtral":
            self.experts, self.top_k = c["num_local_experts"], c["num_experts_per_tok"]
            self.norm_topk, sparse = True, [True] * self.layers
        elif self.family in ("qwen2_moe", "qwen3_moe"):
            self.experts, self.top_k = c["num_experts"], c["num_experts_per_tok"]
            self.norm_topk = bool(c.get("norm_topk_prob", False))
            step, dense = c.get("decoder_sparse_step", 1), c.get("mlp_only_layers", [])
            sparse = [i not in dense and (i + 1) % step == 0 for i in range(self.layers)]
        else:
            self.experts, sparse = 0, [False] * self.layers
        self.sparse = sparse
        # Each layer's sliding window (None: full attention), as the model definitions have it:
        # layer_types where the config lists them; Mistral's window on every layer; Qwen2/Qwen3
        # with use_sliding_window on the layers from max_window_layers on.
        window = c.get("sliding_window")
        if c.get("layer_types"):
            self.windows = [window if t == "sliding_attention" else None for t in c["layer_types"]]
        elif window and self.family == "mistral":
            self.windows = [window] * self.layers
        elif window and c.get("use_sliding_window"):
            start = c.get("max_window_layers", self.layers)
            self.windows = [window if i >= start else None for i in range(self.layers)]
        else:
            self.windows = [None] * self.layers
        self.inv_freq = rope_inv_freq(c, self.head_dim)
        self.round_activations = False  # set by load() for --activations bf16

        w = load_safetensors(path)
        if self.family == "mixtral":  # Mixtral's names -> Qwen-MoE's (mlp.gate, experts.E.*_proj)
            w = {mixtral_name(k): v for k, v in w.items()}
        if weights == "bf16":
            w = {k: round_bf16(v) for k, v in w.items()}
        if c.get("tie_word_embeddings", False):
            w["lm_head.weight"] = w["model.embed_tokens.weight"]
        self.w = w
        # Fail early on a checkpoint that lacks what the config calls for (other names fail in
        # the forward pass with a KeyError naming the tensor).
        need = ["lm_head.weight"]
        for i in range(self.layers):
            p = "model.layers.%d.self_attn." % i
            if self.qkv_bias:
                need += [p + n + "_proj.bias" for n in "qkv"]
            if self.qk_norm:
                need += [p + "q_norm.weight", p + "k_norm.weight"]
        missing = [n for n in need if n not in w]
        if missing:
            raise SystemExit("%s: missing tensors %s" % (path, ", ".join(missing)))

    def linear(self, x, name):
        """nn.Linear with the checkpoint's weight, and its bias where it has one."""
        if self.round_activations:
            x = round_bf16(x)
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def attention(self, x, i, cos, sin, mask):
        p = "model.layers.%d.self_attn." % i
        n = x.shape[1]
        q = self.linear(x, p + "q_proj").view(1, n, self.heads, self.head_dim)
        k = self.linear(x, p + "k_proj").view(1, n, self.kv_heads, self.head_dim)
        v = self.linear(x, p + "v_proj").view(1, n, self.kv_heads, self.head_dim)
        if self.qk_norm:  # Qwen3: RMSNorm over head_dim per head, before RoPE
            q = rms_norm(q, self.w[p + "q_norm.weight"], self.eps)
            k = rms_norm(k, self.w[p + "k_norm.weight"], self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, n, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads  # GQA: each KV head serves `groups` query heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(1, n, self.heads * self.head_dim)
        return self.linear(out, p + "o_proj")

    def swiglu(self, x, p):
        return self.linear(F.silu(self.linear(x, p + "gate_proj")) * self.linear(x, p + "up_proj"),
                           p + "down_proj")

    def mlp(self, x, i):
        p = "model.layers.%d.mlp." % i
        if not self.sparse[i]:
            return self.swiglu(x, p)
        # As the HF MoE blocks compute it: softmax router in float32, top-k (renormalised when
        # norm_topk_prob), each expert over its tokens, its output times the weight added with
        # index_add_ in expert order; Qwen2-MoE's shared expert scaled by sigmoid(gate) last.
        h = x[0]
        probs = F.softmax(self.linear(h, p + "gate"), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            y = self.swiglu(h[token], p + "experts.%d." % e) * weights[token, slot, None]
            out.index_add_(0, token, y)
        if p + "shared_expert.gate_proj.weight" in self.w:
            shared = self.swiglu(h, p + "shared_expert.")
            if p + "shared_expert_gate.weight" in self.w:
                shared = torch.sigmoid(self.linear(h, p + "shared_expert_gate")) * shared
            out = out + shared
        return out[None]

    @torch.no_grad()
    def logits(self, ids):
        n = len(ids)
        x = F.embedding(torch.tensor([ids]), self.w["model.embed_tokens.weight"])
        # RoPE tables as transformers makes them: freqs = inv_freq (x) positions, in float32.
        positions = torch.arange(n, dtype=torch.int64)[None, None, :].float()
        freqs = (self.inv_freq[None, :, None] @ positions).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [1, 1, n, head_dim]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True above the diagonal: masked
        for i in range(self.layers):
            p = "model.layers.%d." % i
            mask = causal
            if self.windows[i] is not None:  # key j is masked when j <= position - window
                mask = causal | torch.ones(n, n, dtype=torch.bool).tril(-self.windows[i])
            x = x + self.attention(rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps),
                                   i, cos, sin, mask)
            x = x + self.mlp(rms_norm(x, self.w[p + "post_attention_layernorm.weight"],
                                      self.eps), i)
        x = rms_norm(x, self.w["model.norm.weight"], self.eps)
        if self.round_activations:
            x = round_bf16(x)
        return F.linear(x, self.w["lm_head.weight"])[0]

    def generate(self, ids, n):
        """Greedy decoding without a KV cache (the whole sequence again at each step)."""
        ids, result = list(ids), []
        for _ in range(n):
            token, margin = pick(self.logits(ids)[-1])
            result.append((token, margin))
            ids.append(token)
        return result


# ---- commands --------------------------------------------------------------------------------

def pick(logits):
    """Greedy choice (torch.argmax: the first of equal maxima) and its top-1 - top-2 margin."""
    token = int(torch.argmax(logits))
    top2 = torch.topk(logits, 2).values if logits.numel() > 1 else None
    margin = float(top2[0] - top2[1]) if top2 is not None else float("inf")
    return token, margin


def load(path, impl, weights, activations="f32"):
    if impl == "functional":
        model = FunctionalModel(path, weights)
        model.round_activations = activations == "bf16"
        return model
    model = TransformersModel(load_transformers(path), weights)
    if activations == "bf16":
        for module in model.model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(
                    lambda mod, args: (round_bf16(args[0]),) + tuple(args[1:]))
    return model


def read_prompts(path, vocab_size):
    with open(path, encoding="utf-8") as f:
        prompts = json.load(f)["prompts"]
    for i, p in enumerate(prompts):
        if not p or any(not 0 <= t < vocab_size for t in p):
            raise SystemExit("prompt %d: empty, or ids outside [0, %d)" % (i, vocab_size))
    return prompts


def cmd_logits(args):
    impl = choose_impl(args.model, args.impl)
    model = load(args.model, impl, args.weights, args.activations)
    prompts = read_prompts(args.cases, model.vocab_size)
    os.makedirs(args.out_dir, exist_ok=True)
    for i, ids in enumerate(prompts):
        logits = model.logits(ids)
        assert logits.shape == (len(ids), model.vocab_size), logits.shape
        logits.numpy().astype("<f4").tofile(os.path.join(args.out_dir, "logits_%d.f32" % i))
        print("prompt %d: %d tokens, %s/%s, last argmax %d, max|logit| %.4g"
              % (i, len(ids), impl, args.weights, int(logits[-1].argmax()),
                 float(logits.abs().max())), file=sys.stderr)


def cmd_generate(args):
    impl = choose_impl(args.model, args.impl)
    model = load(args.model, impl, args.weights, args.activations)
    results = []
    for ids in read_prompts(args.cases, model.vocab_size):
        steps = model.generate(ids, args.max_new_tokens)
        results.append({"tokens": [t for t, _ in steps], "margins": [m for _, m in steps]})
    json.dump({"results": results}, sys.stdout)
    sys.stdout.write("\n")


def selfcheck_prompts(vocab_size):
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in (1, 2, 7, 19, 40)]


def qwen3_from_llama_modules(path):
    """Qwen3 made of transformers' own modules, for selfcheck only (transformers 4.47 has no
    Qwen3): a LlamaForCausalLM with the config's head_dim whose q_proj/k_proj are each followed by
    a LlamaRMSNorm over every head, which is where Qwen3Attention applies q_norm/k_norm."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class PerHead(torch.nn.Module):
        def __init__(self, proj, weight, eps):
            super().__init__()
            self.proj = proj
            self.norm = LlamaRMSNorm(weight.numel(), eps=eps)
            self.norm.weight.data.copy_(weight)

        def forward(self, x):
            y = self.proj(x)
            return self.norm(y.view(*y.shape[:-1], -1, self.norm.weight.numel())).view(y.shape)

    c = dict(read_config(path), model_type="llama", architectures=["LlamaForCausalLM"])
    config = LlamaConfig(**c)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    w = load_safetensors(path)
    norms = {k: w.pop(k) for k in list(w) if k.endswith(("q_norm.weight", "k_norm.weight"))}
    missing, unexpected = model.load_state_dict(w, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if config.tie_word_embeddings else set()):
        raise SystemExit("%s: as a Llama, missing %s, unexpected %s" % (path, missing, unexpected))
    model.tie_weights()
    for i, layer in enumerate(model.model.layers):
        a, p = layer.self_attn, "model.layers.%d.self_attn." % i
        a.q_proj = PerHead(a.q_proj, norms[p + "q_norm.weight"], config.rms_norm_eps)
        a.k_proj = PerHead(a.k_proj, norms[p + "k_norm.weight"], config.rms_norm_eps)
    return model


def cmd_selfcheck(args):
    failed = False
    for path in args.dirs:
        name = os.path.basename(os.path.normpath(path))
        if not os.path.isdir(path):
            raise SystemExit("%s: selfcheck takes HF model directories" % path)
        family = read_config(path).get("model_type")
        if family not in FAMILIES:
            print("%s: skipped (model_type %s)" % (name, family))
            continue
        for weights in ("f32", "bf16"):
            hf = qwen3_from_llama_modules(path) if family == "qwen3" else load_transformers(path)
            reference = TransformersModel(hf, weights)
            functional = FunctionalModel(path, weights)
            worst, rows = 0.0, 0
            for ids in selfcheck_prompts(functional.vocab_size):
                t = reference.logits(ids)
                f = functional.logits(ids)
                err = (f - t).abs().amax(-1) / t.abs().amax(-1)
                worst, rows = max(worst, float(err.max())), rows + len(ids)
            logits_ok = worst <= SELFCHECK_TOLERANCE
            # Greedy decoding: transformers with its KV cache against functional without one,
            # the same tokens up to any near-tie (margin < 1e-3), where either may be chosen.
            compared, generate_ok = 0, True
            for ids in selfcheck_prompts(functional.vocab_size)[1:4:2]:
                for (a, margin), (b, _) in zip(reference.generate(ids, 8),
                                               functional.generate(ids, 8)):
                    if margin < 1e-3:
                        break
                    compared, generate_ok = compared + 1, generate_ok and a == b
            failed |= not (logits_ok and generate_ok)
            print("%s %s%s: logits max rel err %.3g over %d rows %s; generate %d tokens %s"
                  % (name, weights, " (as Llama modules + q/k norm)" if family == "qwen3" else "",
                     worst, rows, "ok" if logits_ok else "FAIL", compared,
                     "ok" if generate_ok else "FAIL"))
    sys.exit(1 if failed else 0)


def main():
    torch.set_num_threads(2)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("logits", "generate"):
        p = sub.add_parser(command)
        p.add_argument("model", help="HF model directory or .gguf file")
        p.add_argument("cases", help='JSON {"prompts": [[token ids], ...]}')
        if command == "logits":
            p.add_argument("out_dir")
        else:
            p.add_argument("--max-new-tokens", type=int, required=True)
        p.add_argument("--impl", choices=["transformers", "functional"])
        p.add_argument("--weights", choices=["f32", "bf16"], default="f32")
        p.add_argument("--activations", choices=["f32", "bf16"], default="f32")
    p = sub.add_parser("selfcheck")
    p.add_argument("dirs", nargs="+", metavar="HF_DIR")
    args = parser.parse_args()
    {"logits": cmd_logits, "generate": cmd_generate, "selfcheck": cmd_selfcheck}[args.command](
        args)


if __name__ == "__main__":
    main()
