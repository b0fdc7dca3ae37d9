#include "engine/model/synthetic_model.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/common/float_math.h"
#include "engine/common/log.h"

namespace ferry {
namespace {

void PutHalf(std::vector<uint8_t>* out, float f) {
  const uint16_t h = FloatToHalf(f);
  out->push_back(static_cast<uint8_t>(h & 0xff));
  out->push_back(static_cast<uint8_t>(h >> 8));
}

// GGML's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_1_ref), block by block.
std::vector<uint8_t> QuantizeQ8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    PutHalf(&out, d);
    for (int j = 0; j < 32; ++j) {
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::round(x[b + j] * id))));
    }
  }
  return out;
}

std::vector<uint8_t> QuantizeQ4_1(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 32) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[b + j]), hi = std::max(hi, x[b + j]);
    const float d = (hi - lo) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    PutHalf(&out, d);
    PutHalf(&out, lo);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[b + j] - lo) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[b + 16 + j] - lo) * id + 0.5f));
      out.push_back(static_cast<uint8_t>(q0 | q1 << 4));
    }
  }
  return out;
}

// Q6_K blocks of 256 (a simple valid encoding, not GGML's search for the best scales): each
// 16-value group's int8 scale is 127 * its max|x| / the block's, d = block max / (127 * 31).
std::vector<uint8_t> QuantizeQ6_K(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 256) {
    float group_max[16] = {}, amax = 0;
    for (int e = 0; e < 256; ++e) {
      group_max[e / 16] = std::max(group_max[e / 16], std::fabs(x[b + e]));
      amax = std::max(amax, std::fabs(x[b + e]));
    }
    const float d = HalfToFloat(FloatToHalf(amax / (127.0f * 31.0f)));
    int8_t scales[16];
    for (int g = 0; g < 16; ++g) {
      scales[g] = amax == 0 ? 0 : static_cast<int8_t>(std::lround(127.0f * group_max[g] / amax));
    }
    uint8_t block[210] = {};
    for (int e = 0; e < 256; ++e) {
      const float step = d * scales[e / 16];
      const int q = step == 0 ? 0 : std::clamp<int>(std::lround(x[b + e] / step), -32, 31);
      const int u = q + 32, h = e / 128, s = e % 128 / 32, l = e % 32;
      block[64 * h + 32 * (s % 2) + l] |= static_cast<uint8_t>((u & 15) << (s >= 2 ? 4 : 0));
      block[128 + 32 * h + l] |= static_cast<uint8_t>((u >> 4) << (2 * s));
    }
    std::memcpy(block + 192, scales, 16);
    const uint16_t dh = FloatToHalf(d);
    std::memcpy(block + 208, &dh, 2);
    out.insert(out.end(), block, block + 210);
  }
  return out;
}

// Q4_K super-blocks of 256 (a simple valid encoding, not GGML's search): each 32-value
// sub-block j gets min m_j and scale sc_j (6 bits) against the block's d and dmin, values
// u = round((x + dmin * m_j) / (d * sc_j)) in 0..15.
std::vector<uint8_t> QuantizeQ4_K(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 256) {
    float lo[8], range[8], max_lo = 0, max_range = 0;
    for (int j = 0; j < 8; ++j) {
      float mn = FLT_MAX, mx = -FLT_MAX;
      for (int l = 0; l < 32; ++l)
        mn = std::min(mn, x[b + 32 * j + l]), mx = std::max(mx, x[b + 32 * j + l]);
      lo[j] = std::min(mn, 0.0f);
      range[j] = mx - lo[j];
      max_lo = std::max(max_lo, -lo[j]);
      max_range = std::max(max_range, range[j]);
    }
    const float d = max_range / (15.0f * 63.0f), dmin = max_lo / 63.0f;
    const float dh = HalfToFloat(FloatToHalf(d)), dminh = HalfToFloat(FloatToHalf(dmin));
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = dh > 0 ? std::min(63, static_cast<int>(std::ceil(range[j] / (15.0f * dh)))) : 0;
      m[j] = dminh > 0 ? std::min(63, static_cast<int>(std::lround(-lo[j] / dminh))) : 0;
    }
    PutHalf(&out, d);
    PutHalf(&out, dmin);
    uint8_t scales[12] = {};
    for (int j = 0; j < 4; ++j) {
      scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
      scales[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
      scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    out.insert(out.end(), scales, scales + 12);
    uint8_t qs[128] = {};
    for (int j = 0; j < 8; ++j) {
      const float step = dh * static_cast<float>(sc[j]), base = dminh * static_cast<float>(m[j]);
      for (int l = 0; l < 32; ++l) {
        const int u =
            step > 0 ? std::clamp(static_cast<int>(std::lround((x[b + 32 * j + l] + base) / step)),
                                  0, 15)
                     : 0;
        qs[32 * (j / 2) + l] |= static_cast<uint8_t>(u << (j % 2 ? 4 : 0));
      }
    }
    out.insert(out.end(), qs, qs + 128);
  }
  return out;
}

}  // namespace

HostWeights SyntheticModel(const SyntheticVariant& v) {
  HostWeights w;
  ModelConfig& c = w.config;
  c.architecture = v.experts > 0 ? "qwen2_moe" : v.qk_norm ? "qwen3" : (v.bias ? "qwen2" : "llama");
  c.num_layers = v.experts > 0 ? 2 : v.layers;
  if (v.window > 0) {
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.sliding_windows.push_back(l % 2 == 0 ? v.window : 0);
  }
  if (v.experts > 0) {
    c.moe.num_experts = v.experts;
    c.moe.experts_per_token = v.experts_per_token;
    c.moe.expert_intermediate_size = 24;
    c.moe.shared_intermediate_size = v.shared_expert ? 40 : 0;
    c.moe.shared_expert_gate = v.shared_expert;
    c.moe.dense_layers = {true, false};
  }
  c.vocab_size = v.vocab > 0 ? v.vocab : 97;
  c.hidden_size = v.hidden > 0 ? v.hidden : 32;
  // native: down_proj rows of one Q6_K block
  c.intermediate_size = v.intermediate > 0 ? v.intermediate : v.native ? 256 : 48;
  c.num_heads = v.heads > 0 ? v.heads : 4;
  c.num_kv_heads = v.kv_heads > 0 ? v.kv_heads : 2;
  c.head_dim = v.head_dim;
  c.max_position_embeddings = v.max_positions > 0 ? v.max_positions : 512;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = v.tied;
  c.qk_norm = v.qk_norm;
  c.attention_bias = v.bias;
  w.kv_dtype = v.kv;
  std::mt19937 rng(v.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float shrink = static_cast<float>(std::sqrt(32.0 / static_cast<double>(c.hidden_size)));
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float mean) {
    HostTensor t;
    t.shape = shape;
    t.dtype = v.weights;
    std::vector<float> values(t.elements());
    if (shape.size() == 2 && name != "model.embed_tokens.weight") scale *= shrink;
    for (float& f : values) f = mean + scale * normal(rng);
    if (v.all_blocks != WeightQuant::kNone && shape.size() == 2) {
      const int64_t block = v.all_blocks == WeightQuant::kQ4_K ? 256 : 32;
      CHECK(v.all_blocks == WeightQuant::kQ8_0 || v.all_blocks == WeightQuant::kQ4_K)
          << "SyntheticVariant::all_blocks: Q8_0 or Q4_K";
      CHECK_EQ(shape[1] % block, 0) << name << ": rows of whole " << block << "-value blocks";
      t.quant = v.all_blocks;
      t.blocks = v.all_blocks == WeightQuant::kQ4_K ? QuantizeQ4_K(values) : QuantizeQ8_0(values);
    } else if (v.all_blocks != WeightQuant::kNone) {
      t.dtype = WeightDType::kF32;
      t.f32 = values;
    } else if (v.native && shape.size() == 2) {
      if (name == "model.embed_tokens.weight") {
        t.quant = WeightQuant::kQ8_0;
        t.blocks = QuantizeQ8_0(values);
      } else if (shape[1] % 256 == 0) {
        t.quant = WeightQuant::kQ6_K;
        t.blocks = QuantizeQ6_K(values);
      } else {
        t.quant = WeightQuant::kQ4_1;
        t.blocks = QuantizeQ4_1(values);
      }
    } else if (v.native) {
      t.dtype = WeightDType::kF32;
      t.f32 = values;
    } else if (v.weights == WeightDType::kF32) {
      t.f32 = values;
    } else {
      for (float f : values) t.bf16.push_back(FloatToBf16(f));
    }
    w.tensors[name] = std::move(t);
  };
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab_size, h}, 1.0f, 0);
  add("model.norm.weight", {h}, 0.1f, 1);
  if (!v.tied) add("lm_head.weight", {c.vocab_size, h}, 0.2f, 0);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, 0.1f, 1);
    add(p + "post_attention_layernorm.weight", {h}, 0.1f, 1);
    add(p + "self_attn.q_proj.weight", {q, h}, 0.3f, 0);
    add(p + "self_attn.k_proj.weight", {kv, h}, 0.3f, 0);
    add(p + "self_attn.v_proj.weight", {kv, h}, 0.3f, 0);
    add(p + "self_attn.o_proj.weight", {h, q}, 0.2f, 0);
    if (v.bias) {
      add(p + "self_attn.q_proj.bias", {q}, 0.1f, 0);
      add(p + "self_attn.k_proj.bias", {kv}, 0.1f, 0);
      add(p + "self_attn.v_proj.bias", {kv}, 0.1f, 0);
    }
    if (v.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim}, 0.1f, 1);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, 0.1f, 1);
    }
    if (c.moe.sparse(i)) {
      const int64_t f = c.moe.expert_intermediate_size;
      add(p + "mlp.gate.weight", {c.moe.num_experts, h}, 1.0f, 0);
      for (int64_t e = 0; e < c.moe.num_experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {f, h}, 0.2f, 0);
        add(x + "up_proj.weight", {f, h}, 0.2f, 0);
        add(x + "down_proj.weight", {h, f}, 0.2f, 0);
      }
      if (v.shared_expert) {
        const int64_t s = c.moe.shared_intermediate_size;
        add(p + "mlp.shared_expert.gate_proj.weight", {s, h}, 0.2f, 0);
        add(p + "mlp.shared_expert.up_proj.weight", {s, h}, 0.2f, 0);
        add(p + "mlp.shared_expert.down_proj.weight", {h, s}, 0.2f, 0);
        add(p + "mlp.shared_expert_gate.weight", {1, h}, 0.3f, 0);
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, 0.2f, 0);
    add(p + "mlp.up_proj.weight", {c.intermediate_size, h}, 0.2f, 0);
    add(p + "mlp.down_proj.weight", {h, c.intermediate_size}, 0.2f, 0);
  }
  return w;
}

}  // namespace ferry
