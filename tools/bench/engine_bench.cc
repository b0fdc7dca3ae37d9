// engine_bench: Ferry's engine on the default model (bf16 weights, bf16 KV, the CPU backend on
// all cores) and the machine baselines the ratios are taken against, measured in the same run.
// Prints one JSON object; tools/bench/engine_bench.sh adds the llama.cpp peer and the table.
//
//   engine_bench MODEL.gguf PROMPT.json [--threads N] [--decode-tokens 64] [--repeats 3]
//                [--model smollm2|moe]
//
// --model moe measures a synthetic mixture of experts instead (SyntheticMoe below; the model
// file and prompt are not used).
//
// PROMPT.json: {"prompt": [ids]} — the prefill prompt (the peer gets the same ids).
//
// Baselines, defined so they cannot flatter the ratios:
//   read_bw_bytes_s   best of at least 6 vectorised reads of a buffer of max(8 x LLC, 512 MiB),
//                     split over all engine threads, one before each decode run and one after;
//   peak_flops        register-only loops on all threads (12 independent accumulators per
//                     thread): AVX2 FMA, AVX-512 FMA and, where the CPU has it, the AVX512-BF16
//                     dot product that Ferry's bf16 products use; the best of them. FLOPs = 2 x
//                     multiply-adds;
//   weight_bytes      the bytes of every matrix read once per decode step (a tied embedding
//                     once, as the LM head).
// Prefill FLOPs count every multiply-add of the 1024-token step: the projections and MLP of every
// token, attention scores and value sums over each token's causal prefix, and the LM head of the
// last token.

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/float_math.h"
#include "engine/common/mutex_mode.h"
#include "engine/engine.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/generate.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "nlohmann/json.hpp"
#include "tools/bench/peak_flops.h"
#include "tools/bench/timing.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry {
namespace {

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::cerr << what << ": " << v.status() << "\n";
    std::exit(1);
  }
  return std::move(*v);
}

size_t LastLevelCacheBytes() {
  for (int index = 4; index >= 0; --index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string size;
    if (!(in >> size) || size.empty()) continue;
    size_t n = std::stoul(size);
    if (size.back() == 'K') n <<= 10;
    if (size.back() == 'M') n <<= 20;
    return n;
  }
  return 32u << 20;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) double ReadSlice(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0] + out[7];
}

#endif

volatile double g_sink = 0;

// Memory read bandwidth: a vectorised read over a buffer of at least 8x the last-level cache on
// all engine threads. Runs are interleaved with the decode runs, so the baseline sees the same
// machine state (this VM's bandwidth drifts by half over minutes); the best run counts.
class ReadBandwidth {
 public:
  explicit ReadBandwidth(int threads)
      : threads_(threads), bytes_(std::max<size_t>(8 * LastLevelCacheBytes(), size_t{512} << 20)) {
    const size_t n = bytes_ / sizeof(float);
    buffer_ = static_cast<float*>(std::aligned_alloc(size_t{2} << 20, bytes_));
#ifdef MADV_HUGEPAGE
    // As the CPU backend asks for its weights: the baseline gets every advantage the engine has.
    madvise(buffer_, bytes_, MADV_HUGEPAGE);
#endif
    // Touch every page on its reading thread's side of the buffer.
    bench::TimedOnThreads(threads_, [&](int t) {
      const size_t first = n / threads_ * t, last = t + 1 == threads_ ? n : n / threads_ * (t + 1);
      for (size_t i = first; i < last; ++i) buffer_[i] = static_cast<float>(i & 7);
    });
  }
  ~ReadBandwidth() { std::free(buffer_); }

  // One timed read of the whole buffer; returns bytes/s and keeps the best.
  double Run() {
    const size_t n = bytes_ / sizeof(float);
    const double seconds = bench::TimedOnThreads(threads_, [&](int t) {
#if defined(__x86_64__)
      const size_t per = n / threads_ / 32 * 32;
      g_sink = g_sink + ReadSlice(buffer_ + per * t, per);
#endif
    });
    best_ = std::max(best_, bytes_ / seconds);
    return bytes_ / seconds;
  }
  double best() const { return best_; }
  size_t bytes() const { return bytes_; }

 private:
  const int threads_;
  const size_t bytes_;
  float* buffer_;
  double best_ = 0;
};

// Decode tokens/s at batch `b` through the engine (scheduler, sampling and all): b requests, each
// with its own 16-token prompt (the prompt rotated by its index), greedy; the steps after every
// request has its first token are timed: tokens/s = b * steps / seconds.
double BatchedDecode(Transformer& model, KvBlockPool& pool, const std::vector<TokenId>& prompt,
                     int64_t b, int64_t steps) {
  EngineOptions options;
  options.max_running = b;
  options.max_batch_tokens = std::max<int64_t>(512, 17 * b);
  options.prefix_cache_bytes = 0;
  auto engine = OrDie(Engine::Create(&model, &pool, nullptr, options), "engine");
  int64_t first_tokens = 0;
  std::vector<bool> started(b, false);
  for (int64_t i = 0; i < b; ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    for (int64_t j = 0; j < 16; ++j) r.prompt.push_back(prompt[(i + j) % prompt.size()]);
    r.sampling.temperature = 0;
    r.max_tokens = steps + 1;
    r.ignore_eos = true;  // every sequence decodes all its steps
    r.on_event = [&, i](const TokenEvent& e) {
      if (e.has_token && !started[i]) {
        started[i] = true;
        ++first_tokens;
      }
    };
    if (absl::Status s = engine->Submit(std::move(r)); !s.ok()) {
      std::cerr << s << "\n";
      std::exit(1);
    }
  }
  auto step = [&] {
    auto worked = engine->Step();
    if (!worked.ok()) {
      std::cerr << worked.status() << "\n";
      std::exit(1);
    }
    return *worked;
  };
  while (first_tokens < b) step();
  const auto start = std::chrono::steady_clock::now();
  int64_t decode_steps = 0;
  while (step()) ++decode_steps;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (decode_steps != steps) {
    std::cerr << "batched decode took " << decode_steps << " steps, not " << steps << "\n";
    std::exit(1);
  }
  return static_cast<double>(b * steps) / seconds;
}

// --model moe: a synthetic mixture of experts too big for any cache (Qwen2-MoE-style: 8 layers,
// hidden 1024, 64 experts of width 512 with 4 routed per token, a gated shared expert; random
// bf16 weights, so routing spreads over all experts), about 1.3 GB of weights.
HostWeights SyntheticMoe() {
  HostWeights w;
  ModelConfig& c = w.config;
  c.architecture = "qwen2_moe";
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_layers = 8;
  c.num_heads = 16;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.attention_bias = true;
  c.moe.num_experts = 64;
  c.moe.experts_per_token = 4;
  c.moe.expert_intermediate_size = 512;
  c.moe.shared_intermediate_size = 1024;
  c.moe.shared_expert_gate = true;
  w.kv_dtype = "bf16";
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float mean) {
    HostTensor t;
    t.shape = std::move(shape);
    t.dtype = WeightDType::kBF16;
    t.bf16.resize(t.elements());
    for (uint16_t& v : t.bf16) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
      const float u = static_cast<float>(state >> 40) * 0x1.0p-24f - 0.5f;
      v = FloatToBf16(mean + 2.0f * scale * u);
    }
    w.tensors[name] = std::move(t);
  };
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab_size, h}, 1.0f, 0);
  add("lm_head.weight", {c.vocab_size, h}, 0.05f, 0);
  add("model.norm.weight", {h}, 0.1f, 1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, 0.1f, 1);
    add(p + "post_attention_layernorm.weight", {h}, 0.1f, 1);
    add(p + "self_attn.q_proj.weight", {q, h}, 0.05f, 0);
    add(p + "self_attn.k_proj.weight", {kv, h}, 0.05f, 0);
    add(p + "self_attn.v_proj.weight", {kv, h}, 0.05f, 0);
    add(p + "self_attn.q_proj.bias", {q}, 0.05f, 0);
    add(p + "self_attn.k_proj.bias", {kv}, 0.05f, 0);
    add(p + "self_attn.v_proj.bias", {kv}, 0.05f, 0);
    add(p + "self_attn.o_proj.weight", {h, q}, 0.05f, 0);
    add(p + "mlp.gate.weight", {c.moe.num_experts, h}, 0.5f, 0);
    const int64_t f = c.moe.expert_intermediate_size, sf = c.moe.shared_intermediate_size;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(x + "gate_proj.weight", {f, h}, 0.05f, 0);
      add(x + "up_proj.weight", {f, h}, 0.05f, 0);
      add(x + "down_proj.weight", {h, f}, 0.05f, 0);
    }
    add(p + "mlp.shared_expert.gate_proj.weight", {sf, h}, 0.05f, 0);
    add(p + "mlp.shared_expert.up_proj.weight", {sf, h}, 0.05f, 0);
    add(p + "mlp.shared_expert.down_proj.weight", {h, sf}, 0.05f, 0);
    add(p + "mlp.shared_expert_gate.weight", {1, h}, 0.05f, 0);
  }
  return w;
}

// The MoE benchmark: decode at batch 1 against the bytes it actually reads per token (the
// attention, router and shared-expert matrices, the top-k experts of every layer, the LM head)
// and at batch 64, with the per-expert token counts.
int MoeMain(int threads, int repeats, int64_t decode_tokens) {
  HostWeights host = SyntheticMoe();
  const ModelConfig c = host.config;
  double total_bytes = 0;
  for (const auto& [name, t] : host.tensors) total_bytes += 2.0 * t.elements();
  CpuBackendOptions options;
  options.threads = threads;
  auto backend = OrDie(CpuBackend::Create(options), "backend");
  auto model = OrDie(Transformer::Create(host, backend.get()), "model");
  host = HostWeights();
  BackendKvAllocator allocator(backend.get());
  const KvBlockLayout layout = model->KvLayoutFor(64);
  auto pool = OrDie(KvBlockPool::Create(layout, 256, &allocator, backend.get()), "KV pool");
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const int64_t f = c.moe.expert_intermediate_size, sf = c.moe.shared_intermediate_size;
  const double expert_bytes = 2.0 * 3 * f * h;
  const double per_layer =
      2.0 * (h * (q + 2 * kv) + q * h + c.moe.num_experts * h + 3 * sf * h + h) +
      c.moe.experts_per_token * expert_bytes;
  const double bytes_per_token = c.num_layers * per_layer + 2.0 * c.vocab_size * h;

  std::vector<TokenId> prompt(16);
  for (int64_t i = 0; i < 16; ++i) prompt[i] = static_cast<TokenId>((i * 7919) % c.vocab_size);
  ReadBandwidth bandwidth(threads);
  GenerateOptions gen;
  gen.max_new_tokens = decode_tokens + 1;
  double decode_seconds = 1e30;
  for (int r = 0; r < std::max(repeats, 5); ++r) {
    bandwidth.Run();
    auto result = OrDie(Generate(*model, *pool, prompt, gen), "generate");
    decode_seconds = std::min(decode_seconds, result.decode_seconds);
  }
  bandwidth.Run();
  const double b1 = decode_tokens / decode_seconds;
  double b64 = 0;
  for (int r = 0; r < 2; ++r) b64 = std::max(b64, BatchedDecode(*model, *pool, prompt, 64, 16));

  nlohmann::json out;
  out["engine"] = backend->name();
  out["model"] = "moe";
  out["total_weight_bytes"] = total_bytes;
  out["experts"] = c.moe.num_experts;
  out["experts_per_token"] = c.moe.experts_per_token;
  out["decode_tok_s_b1"] = b1;
  out["decode_tok_s_b64"] = b64;
  out["weight_bytes"] = bytes_per_token;
  out["read_bw_bytes_s"] = bandwidth.best();
  out["read_buffer_bytes"] = bandwidth.bytes();
  out["decode_bw_ratio"] = b1 * bytes_per_token / bandwidth.best();
  // Tokens per expert over the whole run, summed over the sparse layers.
  std::vector<int64_t> per_expert(c.moe.num_experts, 0);
  for (const auto& layer : model->expert_token_counts()) {
    for (size_t e = 0; e < layer.size(); ++e) per_expert[e] += layer[e];
  }
  out["expert_token_counts"] = per_expert;
  std::cout << out.dump() << std::endl;
  return 0;
}

// --gemv: one-row products (decode's matrix-vector shape) over about 512 MiB of packed weights
// (Q4_1 and bf16 with 576 columns as SmolLM2's projections, and the K-quants Q4_K and Q6_K with
// 1536, SmolLM2's FFN width, through CpuBackend::MatMul on all threads), each round measured
// right after a read of the bandwidth buffer, so that every ratio compares the product with the
// machine's read bandwidth of the same moment (the VM's bandwidth drifts between phases).
// Reports the median and the worst round of each.
int GemvMain(int threads, int rounds) {
  auto backend = OrDie(CpuBackend::Create({threads, std::nullopt}), "backend");
  ReadBandwidth bandwidth(threads);
  const size_t target = bandwidth.bytes();
  struct Case {
    std::string key;  // JSON prefix
    WeightQuant quant;
    int64_t cols;
    std::vector<int> scale_offsets;  // fp16 scales and minimums inside a GGML block
    DeviceWeight weight;
    double bytes = 0;
    std::vector<double> ratios;
  };
  std::vector<Case> cases;
  cases.push_back({"gemv", WeightQuant::kQ4_1, 576, {0, 2}});
  cases.push_back({"bf16_gemv", WeightQuant::kNone, 576, {}});
  cases.push_back({"q4_k_gemv", WeightQuant::kQ4_K, 1536, {0, 2}});
  cases.push_back({"q6_k_gemv", WeightQuant::kQ6_K, 1536, {208}});
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (Case& c : cases) {
    if (c.quant == WeightQuant::kNone) {
      const int64_t rows = static_cast<int64_t>(target / (c.cols * 2)) / kPanel * kPanel;
      std::vector<uint16_t> values(rows * c.cols);
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = FloatToBf16(((i * 2654435761u) >> 20) * 1e-4f);
      c.weight = OrDie(backend->UploadWeight(values.data(), DType::kBF16, rows, c.cols), "bf16");
      c.bytes = static_cast<double>(rows) * c.cols * 2;
      continue;
    }
    // Random quants and integer scales; small fp16 scales, a negative minimum.
    const int64_t block = GgmlQuantBlockElements(c.quant),
                  block_bytes = GgmlQuantBlockBytes(c.quant);
    const int64_t row_bytes = c.cols / block * block_bytes;
    const int64_t rows = static_cast<int64_t>(target / row_bytes) / kPanel * kPanel;
    std::vector<uint8_t> blocks(rows * row_bytes);
    for (size_t i = 0; i < blocks.size(); ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      blocks[i] = static_cast<uint8_t>(state >> 29);
    }
    for (size_t i = 0; i < blocks.size(); i += block_bytes) {
      for (size_t o = 0; o < c.scale_offsets.size(); ++o) {
        const uint16_t h = o == 0 ? 0x2000 : 0xA400;
        std::memcpy(&blocks[i + c.scale_offsets[o]], &h, 2);
      }
    }
    c.weight =
        OrDie(backend->UploadQuantizedWeight(blocks.data(), blocks.size(), c.quant, rows, c.cols),
              c.key.c_str());
    c.bytes = static_cast<double>(blocks.size());
  }
  std::vector<float> x(1536, 0.5f), out;
  auto gemv = [&](const DeviceWeight& w) {
    out.resize(w.rows);
    const auto start = std::chrono::steady_clock::now();
    backend->MatMul(DeviceMatrix::Dense(x.data(), DType::kF32, 1, w.cols), w, nullptr,
                    DeviceMatrix::Dense(out.data(), DType::kF32, 1, w.rows));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (Case& c : cases) gemv(c.weight);  // warm: pages, the activation buffers
  std::vector<double> read_bw;
  for (int r = 0; r < rounds; ++r) {
    double best = 0;
    for (Case& c : cases) {
      const double bw = bandwidth.Run();
      c.ratios.push_back(c.bytes / gemv(c.weight) / bw);
      best = std::max(best, bw);
    }
    read_bw.push_back(best);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json j;
  j["engine"] = backend->name();
  j["threads"] = threads;
  j["rounds"] = rounds;
  j["read_bw_bytes_s"] = read_bw;
  for (const Case& c : cases) {
    j[c.key == "gemv" ? "q4_1_bytes" : c.key.substr(0, c.key.size() - 5) + "_bytes"] = c.bytes;
    j[c.key + "_bw_ratio"] = median(c.ratios);
    j[c.key + "_bw_ratio_worst"] = *std::min_element(c.ratios.begin(), c.ratios.end());
    j[c.key + "_rounds"] = c.ratios;
  }
  std::cout << j.dump() << std::endl;
  return 0;
}

int Main(int argc, char** argv) {
  UseProgramMutexMode();
  if (argc < 3) {
    std::cerr << "usage: engine_bench MODEL.gguf PROMPT.json [--threads N] [--decode-tokens N]"
                 " [--repeats N]\n";
    return 2;
  }
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int64_t decode_tokens = 64;
  int repeats = 3;
  std::string model_name = "smollm2";
  WeightDType weights = WeightDType::kBF16;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    bool ok = true;
    if (flag == "--threads")
      ok = absl::SimpleAtoi(argv[i + 1], &threads);
    else if (flag == "--decode-tokens")
      ok = absl::SimpleAtoi(argv[i + 1], &decode_tokens);
    else if (flag == "--repeats")
      ok = absl::SimpleAtoi(argv[i + 1], &repeats);
    else if (flag == "--model")
      ok = (model_name = argv[i + 1]) == "smollm2" || model_name == "moe" || model_name == "gemv";
    else if (flag == "--weights")
      ok = ParseWeightDType(argv[i + 1]).ok() && (weights = *ParseWeightDType(argv[i + 1]), true);
    else
      ok = false;
    if (!ok) {
      std::cerr << "bad flag " << flag << "\n";
      return 2;
    }
  }
  if (model_name == "moe") return MoeMain(threads, repeats, decode_tokens);
  if (model_name == "gemv") return GemvMain(threads, std::max(repeats, 6));
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  const auto prompt = nlohmann::json::parse(text.str())["prompt"].get<std::vector<TokenId>>();

  // The model, bf16 KV and --weights (bf16 or the file's own blocks), as it serves.
  auto gguf = OrDie(GgufFile::Open(argv[1]), "open");
  HostWeights host = OrDie(LoadGgufModel(*gguf, weights, "bf16"), "load");
  // Bytes of every matrix a decode step reads once: the layers' and the LM head (the embedding
  // table when tied), as stored.
  double weight_bytes = 0;
  for (const auto& [name, t] : host.tensors) {
    const bool head = name == (host.tensors.count("lm_head.weight") ? "lm_head.weight"
                                                                    : "model.embed_tokens.weight");
    if (t.shape.size() != 2 || !(head || name.rfind("model.layers.", 0) == 0)) continue;
    weight_bytes += t.quant != WeightQuant::kNone  ? static_cast<double>(t.blocks.size())
                    : t.dtype == WeightDType::kF32 ? 4.0 * t.elements()
                                                   : 2.0 * t.elements();
  }
  const std::string weight_dtype = host.weight_dtype;
  CpuBackendOptions options;
  options.threads = threads;
  auto backend = OrDie(CpuBackend::Create(options), "backend");
  auto model = OrDie(Transformer::Create(host, backend.get()), "model");
  const double load_seconds = host.load_seconds;
  const uint64_t source_bytes = host.source_bytes;
  host = HostWeights();
  BackendKvAllocator allocator(backend.get());
  const KvBlockLayout layout = model->KvLayoutFor(64);
  auto pool = OrDie(KvBlockPool::Create(layout, layout.BlocksFor(model->max_positions()),
                                        &allocator, backend.get()),
                    "KV pool");
  const ModelConfig& c = model->config();
  const int64_t h = c.hidden_size, qd = c.num_heads * c.head_dim;
  const int64_t kvd = c.num_kv_heads * c.head_dim, f = c.intermediate_size;
  const int64_t layer_macs = h * (qd + 2 * kvd) + qd * h + 3 * f * h;

  // Decode at batch 1 after a 16-token prompt; a read-bandwidth run before each decode run.
  ReadBandwidth bandwidth(threads);
  const std::vector<TokenId> short_prompt(prompt.begin(), prompt.begin() + 16);
  GenerateOptions gen;
  gen.max_new_tokens = decode_tokens + 1;
  double decode_seconds = 1e30;
  for (int r = 0; r < std::max(repeats, 5); ++r) {
    bandwidth.Run();
    auto result = OrDie(Generate(*model, *pool, short_prompt, gen), "generate");
    decode_seconds = std::min(decode_seconds, result.decode_seconds);
  }
  bandwidth.Run();
  const double decode_tok_s = decode_tokens / decode_seconds;

  // Decode throughput against the batch size (the best of `repeats` runs each).
  const int64_t batch_steps = 32;
  nlohmann::json curve = nlohmann::json::object();
  for (int64_t b : {1, 2, 4, 8, 16, 32, 64}) {
    double best = 0;
    for (int r = 0; r < std::max(repeats, 2); ++r) {
      best = std::max(best, BatchedDecode(*model, *pool, prompt, b, batch_steps));
    }
    curve[std::to_string(b)] = best;
  }

  // Prefill of the whole prompt in one step.
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto blocks = OrDie(pool->Allocate(layout.BlocksFor(n)), "blocks");
  std::vector<float> logits;
  const double prefill_seconds = bench::BestSeconds(repeats, [&] {
    logits.clear();
    const ForwardSequence seq{prompt, 0, blocks, false};
    if (absl::Status s = model->Forward({seq}, *pool, &logits); !s.ok()) {
      std::cerr << s << "\n";
      std::exit(1);
    }
  });
  (void)pool->Release(blocks);
  const double prefill_tok_s = n / prefill_seconds;
  double attention_macs = 0;
  for (int64_t p = 0; p < n; ++p) attention_macs += 2.0 * c.num_heads * c.head_dim * (p + 1);
  const double prefill_flops =
      2.0 * (n * static_cast<double>(c.num_layers * layer_macs) + c.num_layers * attention_macs +
             static_cast<double>(c.vocab_size) * h);

  const double read_bw = bandwidth.best();
  const size_t buffer_bytes = bandwidth.bytes();
  // The best of every arithmetic loop the engine's kernels may use here.
  const double peak = bench::BestPeakFlops(threads).flops;

  nlohmann::json out;
  out["engine"] = backend->name();
  out["weights"] = weight_dtype;
  out["threads"] = threads;
  out["load_seconds"] = load_seconds;
  out["load_gib_s"] = source_bytes / load_seconds / (1 << 30);
  out["decode_tok_s_b1"] = decode_tok_s;
  out["prefill_tok_s"] = prefill_tok_s;
  out["prompt_tokens"] = n;
  out["decode_tokens"] = decode_tokens;
  out["weight_bytes"] = weight_bytes;
  out["read_bw_bytes_s"] = read_bw;
  out["read_buffer_bytes"] = buffer_bytes;
  out["peak_flops"] = peak;
  out["prefill_flops"] = prefill_flops;
  out["decode_bw_ratio"] = decode_tok_s * weight_bytes / read_bw;
  // Batched decode: every token costs the per-token multiply-adds of every matrix (the LM head
  // included) plus attention over a context of 16..48 positions (taken at its mean, 32).
  const double decode_token_flops =
      2.0 * (c.num_layers * (layer_macs + 2.0 * c.num_heads * c.head_dim * (16 + batch_steps / 2)) +
             static_cast<double>(c.vocab_size) * h);
  out["decode_curve_tok_s"] = curve;
  out["decode_batch_steps"] = batch_steps;
  out["decode_tok_s_b16"] = curve["16"];
  out["decode_tok_s_b64"] = curve["64"];
  out["decode_b64_flops_ratio"] = curve["64"].get<double>() * decode_token_flops / peak;
  out["prefill_flops_ratio"] = prefill_flops / prefill_seconds / peak;
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
