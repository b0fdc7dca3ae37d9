// Properties of the forward pass that services rely on, on small synthetic models of each family
// feature (GQA, q/k/v biases, q/k norm with head_dim != hidden/heads, tied embeddings), fp32 and
// bf16 weights, fp32 and bf16 KV: a row's logits are bit-identical whether the prompt runs in one
// step or in chunks of 1, 7 or 64 tokens, alone or beside another sequence, on any CPU kernel
// variant and thread count, and after its KV moved to another pool; also with block-format
// (native Q4_1 / Q6_K / Q8_0) weights. Exactness against transformers is checked by
// forward_reference_test, native weights against llama.cpp by llamacpp_reference_test.

#include "engine/model/transformer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/step_graph_book.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "engine/model/dequantize.h"
#include "engine/model/generate.h"
#include "engine/model/synthetic_model.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using Variant = SyntheticVariant;

std::vector<Variant> Variants() {
  return {
      {"llama_gqa_f32"},
      {"llama_gqa_bf16_weights_bf16_kv", false, false, false, 8, WeightDType::kBF16, "bf16"},
      {"qwen2_bias_bf16_kv", true, false, false, 8, WeightDType::kF32, "bf16"},
      {"qwen3_qknorm_head_dim_16", false, true, false, 16, WeightDType::kF32, "f32"},
      {"tied_bf16_weights", false, false, true, 8, WeightDType::kBF16, "f32"},
      {"moe_8x2_f32", false, false, false, 8, WeightDType::kF32, "f32", 8, 2, false},
      {"moe_8x2_shared_bf16", false, false, false, 8, WeightDType::kBF16, "bf16", 8, 2, true},
      {"hybrid_window_5_f32", false, false, false, 8, WeightDType::kF32, "f32", 0, 2, false, 5},
      {"hybrid_window_37_bf16_kv", true, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false,
       37},
      {"llama_tied_q4_1_q6_k_q8_0_native", false, false, true, 8, WeightDType::kNative, "bf16", 0,
       2, false, 0, 2, true},
  };
}

std::vector<TokenId> Prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(n);
  for (TokenId& id : t) id = rng() % 97;
  return t;
}

// A model with its own backend and pool.
struct Fixture {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<KvBlockPool> pool;
};

Fixture Make(const Variant& v, int threads = 2, std::optional<CpuIsa> isa = std::nullopt,
             int32_t block_tokens = 16) {
  Fixture f;
  CpuBackendOptions options;
  options.threads = threads;
  options.isa = isa;
  f.backend = *CpuBackend::Create(options);
  f.allocator = std::make_unique<BackendKvAllocator>(f.backend.get());
  auto model = Transformer::Create(SyntheticModel(v), f.backend.get());
  CHECK_OK(model.status());
  f.model = std::move(*model);
  f.pool = *KvBlockPool::Create(f.model->KvLayoutFor(block_tokens), 64, f.allocator.get(),
                                f.backend.get());
  return f;
}

// Logits of every prompt position, the prompt run in steps of `chunk` tokens (0: one step).
std::vector<float> PromptLogits(Fixture& f, const std::vector<TokenId>& prompt, int64_t chunk) {
  const int64_t n = prompt.size();
  auto blocks = *f.pool->Allocate(f.pool->layout().BlocksFor(n));
  std::vector<float> logits;
  const int64_t step = chunk > 0 ? chunk : n;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t len = std::min(step, n - b);
    const ForwardSequence seq{absl::MakeConstSpan(prompt).subspan(b, len), b, blocks, true};
    CHECK_OK(f.model->Forward({seq}, *f.pool, &logits));
  }
  CHECK_OK(f.pool->Release(blocks));
  return logits;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class TransformerTest : public ::testing::TestWithParam<Variant> {};

TEST_P(TransformerTest, ChunkedPrefillIsBitIdentical) {
  Fixture f = Make(GetParam());
  const auto prompt = Prompt(150, 1);
  const auto whole = PromptLogits(f, prompt, 0);
  ASSERT_EQ(whole.size(), 150u * 97);
  for (float x : whole) ASSERT_TRUE(std::isfinite(x));
  for (int64_t chunk : {1, 7, 64}) {
    EXPECT_TRUE(SameBits(PromptLogits(f, prompt, chunk), whole)) << "chunk " << chunk;
  }
  EXPECT_EQ(f.pool->num_free(), 64);
}

TEST_P(TransformerTest, SameBitsOnEveryKernelVariantAndThreadCount) {
  const auto prompt = Prompt(70, 2);
  Fixture reference = Make(GetParam(), 1, CpuIsa::kScalar);
  const auto want = PromptLogits(reference, prompt, 0);
  for (CpuIsa isa : SupportedCpuIsas()) {
    for (int threads : {1, 2, 3}) {
      Fixture f = Make(GetParam(), threads, isa);
      EXPECT_TRUE(SameBits(PromptLogits(f, prompt, 0), want))
          << CpuIsaName(isa) << " threads " << threads;
    }
  }
}

TEST_P(TransformerTest, ASequenceGetsTheSameLogitsBesideAnother) {
  Fixture f = Make(GetParam());
  const auto a = Prompt(40, 3), b = Prompt(23, 4);
  const auto alone = PromptLogits(f, a, 0);
  // a's second half in one step with b's whole prompt (different block tables and positions).
  auto blocks_a = *f.pool->Allocate(f.pool->layout().BlocksFor(40));
  auto blocks_b = *f.pool->Allocate(f.pool->layout().BlocksFor(23));
  std::vector<float> first, both;
  ASSERT_TRUE(
      f.model
          ->Forward({{absl::MakeConstSpan(a).subspan(0, 20), 0, blocks_a, true}}, *f.pool, &first)
          .ok());
  ASSERT_TRUE(f.model
                  ->Forward({{absl::MakeConstSpan(b), 0, blocks_b, false},
                             {absl::MakeConstSpan(a).subspan(20), 20, blocks_a, true}},
                            *f.pool, &both)
                  .ok());
  ASSERT_EQ(both.size(), (1u + 20) * 97);
  first.insert(first.end(), both.begin() + 97, both.end());
  EXPECT_TRUE(SameBits(first, alone));
  const auto b_alone = PromptLogits(f, b, 0);
  EXPECT_EQ(0, std::memcmp(both.data(), b_alone.data() + 22 * 97, 97 * 4));
}

TEST_P(TransformerTest, DecodeContinuesIdenticallyAfterTheKvMovesToAnotherPool) {
  Fixture f = Make(GetParam());
  Fixture g = Make(GetParam());
  const auto prompt = Prompt(37, 5);
  const int64_t nblocks = f.pool->layout().BlocksFor(38);
  auto src = *f.pool->Allocate(nblocks);
  std::vector<float> logits;
  ASSERT_TRUE(f.model->Forward({{prompt, 0, src, false}}, *f.pool, &logits).ok());
  // Export in place, import into other block ids of another pool.
  (void)*g.pool->Allocate(5);
  auto dst = *g.pool->Allocate(nblocks);
  ASSERT_NE(dst, src);
  auto spans = *f.pool->Spans(src);
  std::vector<char> wire;
  for (const MemorySpan& s : spans) {
    wire.insert(wire.end(), static_cast<char*>(s.address),
                static_cast<char*>(s.address) + s.length);
  }
  ASSERT_TRUE(g.pool->Import(dst, wire.data(), wire.size()).ok());
  const TokenId next = 42;
  std::vector<float> here, there;
  ASSERT_TRUE(
      f.model->Forward({{absl::MakeConstSpan(&next, 1), 37, src, false}}, *f.pool, &here).ok());
  ASSERT_TRUE(
      g.model->Forward({{absl::MakeConstSpan(&next, 1), 37, dst, false}}, *g.pool, &there).ok());
  EXPECT_TRUE(SameBits(here, there));
}

TEST_P(TransformerTest, GenerateIsDeterministicAndFreesItsBlocks) {
  Fixture f = Make(GetParam());
  const auto prompt = Prompt(30, 6);
  GenerateOptions greedy;
  greedy.max_new_tokens = 12;
  greedy.keep_logits = true;
  auto a = Generate(*f.model, *f.pool, prompt, greedy);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tokens.size(), 12u);
  greedy.prefill_chunk = 7;
  auto b = Generate(*f.model, *f.pool, prompt, greedy);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  ASSERT_EQ(a->logits.size(), b->logits.size());
  for (size_t i = 0; i < a->logits.size(); ++i) EXPECT_TRUE(SameBits(a->logits[i], b->logits[i]));
  // Decode logits equal the prompt logits of the extended prompt: decode is prefill of one row.
  std::vector<TokenId> extended = prompt;
  extended.insert(extended.end(), a->tokens.begin(), a->tokens.end() - 1);
  const auto all = PromptLogits(f, extended, 0);
  for (size_t i = 0; i < a->logits.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(a->logits[i].data(), all.data() + (29 + i) * 97, 97 * 4)) << i;
  }

  GenerateOptions sampled;
  sampled.max_new_tokens = 20;
  sampled.temperature = 1.5f;
  sampled.seed = 7;
  auto s1 = *Generate(*f.model, *f.pool, prompt, sampled);
  auto s2 = *Generate(*f.model, *f.pool, prompt, sampled);
  EXPECT_EQ(s1.tokens, s2.tokens);
  sampled.seed = 8;
  auto s3 = *Generate(*f.model, *f.pool, prompt, sampled);
  EXPECT_NE(s1.tokens, s3.tokens);

  GenerateOptions stop = greedy;
  stop.stop_token_ids = {a->tokens[3]};
  auto st = *Generate(*f.model, *f.pool, prompt, stop);
  EXPECT_TRUE(st.stopped);
  EXPECT_LE(st.tokens.size(), 4u);
  EXPECT_EQ(st.tokens.back(), a->tokens[3]);
  EXPECT_EQ(f.pool->num_free(), f.pool->num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

TEST(TransformerErrorsTest, BadInputIsAnErrorAndChangesNothing) {
  Fixture f = Make(Variants()[0]);
  auto blocks = *f.pool->Allocate(2);
  std::vector<float> logits;
  const std::vector<TokenId> ok = {1, 2, 3}, bad = {1, 97};
  EXPECT_EQ(f.model->Forward({{bad, 0, blocks, false}}, *f.pool, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.model->Forward({{ok, 30, blocks, false}}, *f.pool, &logits).code(),
            absl::StatusCode::kInvalidArgument);  // 2 blocks of 16 cannot hold 33 positions
  EXPECT_EQ(f.model->Forward({{ok, 510, blocks, false}}, *f.pool, &logits).code(),
            absl::StatusCode::kInvalidArgument);  // past max_position_embeddings
  EXPECT_EQ(f.model->Forward({{{}, 0, blocks, false}}, *f.pool, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(logits.empty());
  // A pool of another layout.
  Fixture other = Make(Variants()[3]);
  EXPECT_EQ(f.model->Forward({{ok, 0, blocks, false}}, *other.pool, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  GenerateOptions options;
  options.max_new_tokens = 600;
  EXPECT_EQ(Generate(*f.model, *f.pool, ok, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.max_new_tokens = 0;
  EXPECT_FALSE(Generate(*f.model, *f.pool, ok, options).ok());
  EXPECT_FALSE(Generate(*f.model, *f.pool, {}, GenerateOptions{}).ok());
  HostWeights w = SyntheticModel(Variants()[0]);
  w.tensors.erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_FALSE(Transformer::Create(w, f.backend.get()).ok());
  w = SyntheticModel(Variants()[0]);
  w.kv_dtype = "f16";
  EXPECT_FALSE(Transformer::Create(w, f.backend.get()).ok());
}

// A stacked matrix whose parts a file stored in different block formats (q, k, v of one layer) is
// computed part by part, each in its own format. Seen through a Q8_0 block that holds a Q4_1
// block's scale and quants (0..15) when the Q4_1 block's minimum is +0: the two formats' products
// are then the same fp32 operations (the Q4_1 minimum term adds 0 * sx), so the model with k_proj
// in that Q8_0 form gives the same bits as the model with k_proj in Q4_1, and other bits than with
// q, k and v in bf16 (what a stacked matrix of mixed formats used to become).
TEST(TransformerNativeTest, StackedPartsOfDifferentFormatsKeepTheirFormats) {
  SyntheticVariant v;
  v.native = true;
  v.tied = true;
  HostWeights all_q4_1 = SyntheticModel(v);
  HostTensor& k = all_q4_1.tensors.at("model.layers.0.self_attn.k_proj.weight");
  ASSERT_EQ(k.quant, WeightQuant::kQ4_1);
  HostTensor k8;
  k8.shape = k.shape;
  k8.quant = WeightQuant::kQ8_0;
  for (size_t b = 0; b < k.blocks.size(); b += 20) {
    k.blocks[b + 2] = k.blocks[b + 3] = 0;  // minimum +0
    k8.blocks.push_back(k.blocks[b]);       // the same fp16 scale
    k8.blocks.push_back(k.blocks[b + 1]);
    for (int j = 0; j < 32; ++j) {
      const uint8_t byte = k.blocks[b + 4 + j % 16];
      k8.blocks.push_back(j < 16 ? byte & 15 : byte >> 4);
    }
  }
  HostWeights mixed = all_q4_1;
  mixed.tensors.at("model.layers.0.self_attn.k_proj.weight") = k8;
  HostWeights as_bf16 = mixed;
  for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
    HostTensor& t = as_bf16.tensors.at(std::string("model.layers.0.self_attn.") + part + ".weight");
    t.bf16.resize(t.elements());
    ASSERT_TRUE(DequantizeToBf16(GgmlTypeOfWeightQuant(t.quant), t.blocks.data(), t.blocks.size(),
                                 t.elements(), t.bf16.data())
                    .ok());
    t.dtype = WeightDType::kBF16;
    t.quant = WeightQuant::kNone;
    t.blocks.clear();
  }
  const auto prompt = Prompt(40, 5);
  std::vector<float> logits[3];
  int i = 0;
  for (const HostWeights* w : {&all_q4_1, &mixed, &as_bf16}) {
    Fixture f;
    f.backend = *CpuBackend::Create({2, std::nullopt});
    f.allocator = std::make_unique<BackendKvAllocator>(f.backend.get());
    auto model = Transformer::Create(*w, f.backend.get());
    ASSERT_TRUE(model.ok()) << model.status();
    f.model = std::move(*model);
    f.pool = *KvBlockPool::Create(f.model->KvLayoutFor(16), 64, f.allocator.get(), f.backend.get());
    logits[i++] = PromptLogits(f, prompt, 0);
  }
  EXPECT_TRUE(SameBits(logits[0], logits[1]));
  EXPECT_FALSE(SameBits(logits[1], logits[2]));
}

TEST(RopeTest, Llama3ScalingKeepsHighFrequenciesAndScalesLowOnes) {
  ModelConfig c;
  c.head_dim = 64;
  c.rope_theta = 500000;
  const std::vector<float> plain = RopeInverseFrequencies(c);
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> scaled = RopeInverseFrequencies(c);
  EXPECT_EQ(scaled.front(), plain.front());             // wavelength 2*pi: untouched
  EXPECT_FLOAT_EQ(scaled.back(), plain.back() / 8.0f);  // longest wavelength: divided by factor
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 2;
  EXPECT_EQ(RopeInverseFrequencies(c)[5], plain[5] / 2.0f);
}

// A hybrid model whose window layers keep their KV in a pool of their own: the same logits
// and tokens as with one pool, while the window pool holds only what the window still covers.
TEST(TransformerWindowPoolTest, SameResultsWithTheWindowLayersInABoundedPool) {
  for (int32_t window : {5, 37}) {
    Variant v{"hybrid", false, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false, window};
    Fixture f = Make(v);
    const auto full = f.model->FullKvLayoutFor(16), win = f.model->WindowKvLayoutFor(16);
    ASSERT_EQ(full.num_layers, 1);
    ASSERT_EQ(win.num_layers, 1);
    auto full_pool = *KvBlockPool::Create(full, 64, f.allocator.get(), f.backend.get());
    auto window_pool = *KvBlockPool::Create(win, 64, f.allocator.get(), f.backend.get());
    const auto prompt = Prompt(150, 4);
    for (int64_t chunk : {0, 1, 7, 64}) {
      GenerateOptions options;
      options.max_new_tokens = 40;
      options.prefill_chunk = chunk;
      options.keep_logits = true;
      auto one = Generate(*f.model, *f.pool, prompt, options);
      auto split = Generate(*f.model, *full_pool, prompt, options, window_pool.get());
      ASSERT_TRUE(one.ok()) << one.status();
      ASSERT_TRUE(split.ok()) << split.status();
      EXPECT_EQ(split->tokens, one->tokens) << "window " << window << " chunk " << chunk;
      ASSERT_EQ(split->logits.size(), one->logits.size());
      for (size_t i = 0; i < one->logits.size(); ++i) {
        ASSERT_TRUE(SameBits(split->logits[i], one->logits[i])) << "token " << i;
      }
      const int64_t step = chunk > 0 ? chunk : 150;
      EXPECT_LE(split->window_blocks_peak, (window + step + 15) / 16 + 1)
          << "window " << window << " chunk " << chunk;
      EXPECT_EQ(window_pool->num_free(), 64);
      EXPECT_EQ(full_pool->num_free(), 64);
    }
    // Wrong pools are refused.
    GenerateOptions options;
    EXPECT_FALSE(Generate(*f.model, *f.pool, prompt, options, window_pool.get()).ok());
  }
}

// A backend of its own (its name, its fingerprint) whose memory and weights are the CPU
// backend's: what the test backends below build on.
class OnCpuBackend : public Backend {
 public:
  explicit OnCpuBackend(CpuBackend* cpu) : cpu_(cpu) {}
  bool deterministic() const override { return true; }
  bool host_memory() const override { return true; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    ASSIGN_OR_RETURN(DeviceBuffer inner, cpu_->Allocate(bytes));
    void* data = inner.data();
    held_.push_back(std::move(inner));
    return DeviceBuffer(this, data, bytes);
  }
  absl::StatusOr<DeviceWeight> UploadWeight(const void* host, DType dtype, int64_t rows,
                                            int64_t cols) override {
    return cpu_->UploadWeight(host, dtype, rows, cols);
  }
  absl::StatusOr<DeviceWeight> UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                     WeightQuant quant, int64_t rows,
                                                     int64_t cols) override {
    return cpu_->UploadQuantizedWeight(host, bytes, quant, rows, cols);
  }
  void Synchronize() override {}

 protected:
  void Free(void* data, size_t) override {
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->data() == data) {
        held_.erase(it);
        return;
      }
    }
  }

  CpuBackend* const cpu_;

 private:
  std::vector<DeviceBuffer> held_;
};

// A backend that computes as the CPU backend but has no kernels for some block formats and names
// itself in fingerprints, as a GPU backend does: what the model does with such a backend.
class PartialBackend : public OnCpuBackend {
 public:
  explicit PartialBackend(CpuBackend* cpu) : OnCpuBackend(cpu) {}
  std::string name() const override { return "partial"; }
  std::string fingerprint_tag() const override { return "partial:test"; }
  void CopyToDevice(void* d, const void* h, size_t n) override { cpu_->CopyToDevice(d, h, n); }
  void CopyToHost(void* h, const void* d, size_t n) override { cpu_->CopyToHost(h, d, n); }
  void CopyOnDevice(void* d, const void* s, size_t n) override { cpu_->CopyOnDevice(d, s, n); }
  absl::StatusOr<DeviceWeight> UploadQuantizedWeight(const uint8_t* host, size_t bytes,
                                                     WeightQuant quant, int64_t rows,
                                                     int64_t cols) override {
    ++quant_uploads_;
    if (quant != WeightQuant::kQ8_0) return absl::UnimplementedError("only q8_0 here");
    return cpu_->UploadQuantizedWeight(host, bytes, quant, rows, cols);
  }
  void Embed(const DeviceWeight& t, const std::vector<int32_t>& ids,
             const DeviceMatrix& out) override {
    cpu_->Embed(t, ids, out);
  }
  void RmsNorm(const DeviceMatrix& x, const DeviceMatrix& w, float eps,
               const DeviceMatrix& out) override {
    cpu_->RmsNorm(x, w, eps, out);
  }
  void AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& d, const DeviceMatrix& w, float eps,
                  const DeviceMatrix& out) override {
    cpu_->AddRmsNorm(x, d, w, eps, out);
  }
  void MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
              const DeviceMatrix& out) override {
    cpu_->MatMul(x, w, bias, out);
  }
  void Add(const DeviceMatrix& acc, const DeviceMatrix& x) override { cpu_->Add(acc, x); }
  void GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                  const DeviceMatrix& out) override {
    cpu_->GatherRows(x, rows, out);
  }
  void AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                     const std::vector<float>& scales, const DeviceMatrix& acc) override {
    cpu_->AddScaledRows(x, rows, scales, acc);
  }
  void SwiGlu(const DeviceMatrix& g, const DeviceMatrix& u, const DeviceMatrix& out) override {
    cpu_->SwiGlu(g, u, out);
  }
  void Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
            const RopeTable& rope) override {
    cpu_->Rope(x, heads, positions, rope);
  }
  void WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
               const StepLayout& layout) override {
    cpu_->WriteKv(k, v, kv, layout);
  }
  void Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                 float scale, int32_t window, const DeviceMatrix& out) override {
    cpu_->Attention(q, kv, layout, scale, window, out);
  }
  int quant_uploads() const { return quant_uploads_; }

 private:
  int quant_uploads_ = 0;
};

TEST(TransformerBackendTest, FormatsTheBackendLacksRunInBf16AndTheFingerprintNamesIt) {
  // SmolLM2's GGUF mix: a Q8_0 embedding, Q4_1 matrices, a Q6_K down projection.
  Variant v = Variants()[0];
  v.native = true;
  v.weights = WeightDType::kNative;
  v.tied = true;
  const HostWeights weights = SyntheticModel(v);
  std::unique_ptr<CpuBackend> cpu = *CpuBackend::Create({});
  PartialBackend partial(cpu.get());
  auto native = Transformer::Create(weights, cpu.get());
  auto mixed = Transformer::Create(weights, &partial);
  ASSERT_TRUE(native.ok()) << native.status();
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_GT(partial.quant_uploads(), 1);
  // The CPU backend keeps the loader's fingerprint; another backend's differs.
  EXPECT_EQ((*native)->fingerprint(), weights.fingerprint);
  EXPECT_NE((*mixed)->fingerprint(), weights.fingerprint);

  // The Q4_1 and Q6_K matrices are computed in bf16: the same bits as a model whose file held
  // them dequantized to bf16 (the Q8_0 embedding stays in blocks in both).
  HostWeights converted = weights;
  for (auto& [name, t] : converted.tensors) {
    if (t.quant == WeightQuant::kNone || t.quant == WeightQuant::kQ8_0) continue;
    t.bf16.resize(t.elements());
    CHECK_OK(DequantizeToBf16(GgmlTypeOfWeightQuant(t.quant), t.blocks.data(), t.blocks.size(),
                              t.bf16.size(), t.bf16.data()));
    t.quant = WeightQuant::kNone;
    t.dtype = WeightDType::kBF16;
    t.blocks.clear();
  }
  auto reference = Transformer::Create(converted, cpu.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto logits_of = [&](Transformer& model, Backend* b) {
    BackendKvAllocator alloc(b);
    auto pool = *KvBlockPool::Create(model.KvLayoutFor(16), 16, &alloc, b);
    const auto prompt = Prompt(40, 9);
    auto blocks = *pool->Allocate(pool->layout().BlocksFor(40));
    std::vector<float> logits;
    CHECK_OK(model.Forward({{prompt, 0, blocks, true}}, *pool, &logits));
    CHECK_OK(pool->Release(blocks));
    return logits;
  };
  const std::vector<float> got = logits_of(**mixed, &partial);
  EXPECT_TRUE(SameBits(got, logits_of(**reference, cpu.get())));
  EXPECT_FALSE(SameBits(got, logits_of(**native, cpu.get())));  // not the block products
}

// A backend that records and replays steps as a CUDA graph does, on the CPU backend: a recorded
// step's kernels are kept with their arguments as they were (matrices, weights, pools: the
// addresses a graph holds) and are not run while recorded; the step inputs are copied into
// buffers of this backend at every BeginStep, and a recorded kernel reads them from there, as a
// graph's kernels read the device copies. A kernel given a host vector that is not a step input,
// or a copy from or to the host, while recording makes the recording fail (it could not be
// captured on a GPU).
class GraphBackend : public OnCpuBackend {
 public:
  explicit GraphBackend(CpuBackend* cpu) : OnCpuBackend(cpu) {}
  std::string name() const override { return "graphs"; }
  void CopyToDevice(void* d, const void* h, size_t n) override {
    if (!Host()) cpu_->CopyToDevice(d, h, n);
  }
  void CopyToHost(void* h, const void* d, size_t n) override {
    if (!Host()) cpu_->CopyToHost(h, d, n);
  }
  void CopyOnDevice(void* d, const void* s, size_t n) override {
    Op([=] { cpu_->CopyOnDevice(d, s, n); });
  }
  void Embed(const DeviceWeight& t, const std::vector<int32_t>& ids,
             const DeviceMatrix& out) override {
    const std::vector<int32_t>* in = Input(ids, ids_);
    Op([=, &t] { cpu_->Embed(t, *in, out); });
  }
  void RmsNorm(const DeviceMatrix& x, const DeviceMatrix& w, float eps,
               const DeviceMatrix& out) override {
    Op([=] { cpu_->RmsNorm(x, w, eps, out); });
  }
  void AddRmsNorm(const DeviceMatrix& x, const DeviceMatrix& d, const DeviceMatrix& w, float eps,
                  const DeviceMatrix& out) override {
    Op([=] { cpu_->AddRmsNorm(x, d, w, eps, out); });
  }
  void MatMul(const DeviceMatrix& x, const DeviceWeight& w, const DeviceMatrix* bias,
              const DeviceMatrix& out) override {
    const std::optional<DeviceMatrix> b =
        bias != nullptr ? std::optional<DeviceMatrix>(*bias) : std::nullopt;
    Op([=, &w] { cpu_->MatMul(x, w, b.has_value() ? &*b : nullptr, out); });
  }
  void Add(const DeviceMatrix& acc, const DeviceMatrix& x) override {
    Op([=] { cpu_->Add(acc, x); });
  }
  void GatherRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                  const DeviceMatrix& out) override {
    if (!Host()) cpu_->GatherRows(x, rows, out);
  }
  void AddScaledRows(const DeviceMatrix& x, const std::vector<int32_t>& rows,
                     const std::vector<float>& scales, const DeviceMatrix& acc) override {
    if (!Host()) cpu_->AddScaledRows(x, rows, scales, acc);
  }
  void SwiGlu(const DeviceMatrix& g, const DeviceMatrix& u, const DeviceMatrix& out) override {
    Op([=] { cpu_->SwiGlu(g, u, out); });
  }
  void Rope(const DeviceMatrix& x, int32_t heads, const std::vector<int32_t>& positions,
            const RopeTable& rope) override {
    const std::vector<int32_t>* in = Input(positions, positions_);
    Op([=] { cpu_->Rope(x, heads, *in, rope); });
  }
  void WriteKv(const DeviceMatrix& k, const DeviceMatrix& v, const KvLayerView& kv,
               const StepLayout& layout) override {
    const StepLayout* in = LayoutInput(layout);
    Op([=] { cpu_->WriteKv(k, v, kv, *in); });
  }
  void Attention(const DeviceMatrix& q, const KvLayerView& kv, const StepLayout& layout,
                 float scale, int32_t window, const DeviceMatrix& out) override {
    const StepLayout* in = LayoutInput(layout);
    Op([=] { cpu_->Attention(q, kv, *in, scale, window, out); });
  }

  int64_t max_recorded_rows() const override { return 16; }
  StepMode BeginStep(const StepInputs& inputs) override {
    // The upload: the same buffers every step.
    ids_ = *inputs.ids;
    positions_ = *inputs.positions;
    layout_count_ = inputs.layouts.size();
    for (size_t i = 0; i < layout_count_; ++i) layouts_[i] = *inputs.layouts[i];
    EXPECT_GE(inputs.max_position, *std::max_element(positions_.begin(), positions_.end()));
    key_ = inputs.key;
    void* recording = nullptr;
    std::vector<void*> drop;
    action_ = book_.Next(key_, 0, &recording, &drop);
    EXPECT_TRUE(drop.empty());
    broken_ = false;
    if (action_ == StepGraphBook::Action::kRun) return StepMode::kEager;
    if (action_ == StepGraphBook::Action::kRecord) {
      ops_.clear();
      return StepMode::kRecording;
    }
    replay_ = recordings_[reinterpret_cast<uintptr_t>(recording)];
    return StepMode::kReplayed;
  }
  absl::StatusOr<bool> EndStep(bool complete) override {
    EXPECT_TRUE(complete);
    const StepGraphBook::Action action = action_;
    action_ = StepGraphBook::Action::kRun;  // what a re-issue runs as
    if (action == StepGraphBook::Action::kRecord) {
      if (broken_) {
        book_.NotRecorded(key_, /*failed=*/true);
        return false;
      }
      recordings_.push_back(std::move(ops_));
      book_.Recorded(key_, reinterpret_cast<void*>(recordings_.size() - 1));
      replay_ = recordings_.back();
    }
    if (action != StepGraphBook::Action::kRun) {
      for (const auto& op : replay_) op();  // the launch
    }
    return true;
  }
  const StepGraphBook::Stats& stats() const { return book_.stats(); }

 private:
  bool recording() const { return action_ == StepGraphBook::Action::kRecord; }
  // A host transfer or host vector: not capturable.
  bool Host() {
    if (recording()) broken_ = true;
    return recording();
  }
  void Op(std::function<void()> op) {
    if (recording()) {
      ops_.push_back(std::move(op));
    } else {
      op();
    }
  }
  const std::vector<int32_t>* Input(const std::vector<int32_t>& given,
                                    const std::vector<int32_t>& copy) {
    if (given == copy) return &copy;
    if (recording()) broken_ = true;
    return &given;  // (run as it comes: read now)
  }
  const StepLayout* LayoutInput(const StepLayout& given) {
    for (size_t i = 0; i < layout_count_; ++i) {
      const StepLayout& l = layouts_[i];
      if (l.positions == given.positions && l.row_sequence == given.row_sequence &&
          l.block_tables == given.block_tables && l.first_keys == given.first_keys &&
          l.no_write == given.no_write) {
        return &l;
      }
    }
    if (recording()) broken_ = true;
    return &given;
  }

  StepGraphBook book_{8};
  StepGraphBook::Action action_ = StepGraphBook::Action::kRun;
  uint64_t key_ = 0;
  bool broken_ = false;
  std::vector<int32_t> ids_, positions_;
  std::array<StepLayout, 2> layouts_;
  size_t layout_count_ = 0;
  std::vector<std::function<void()>> ops_, replay_;
  std::vector<std::vector<std::function<void()>>> recordings_;
};

// Decode steps of several sequences, the batch shrinking and growing, on a model of `v`: every
// step's logits with `backend` (recording) and on the CPU backend alone.
void DecodeBesideReference(const Variant& v, GraphBackend* graphs, CpuBackend* cpu) {
  const HostWeights weights = SyntheticModel(v);
  auto plain = *Transformer::Create(weights, cpu);
  auto recorded = *Transformer::Create(weights, graphs);
  BackendKvAllocator plain_alloc(cpu), recorded_alloc(graphs);
  const bool hybrid = v.window > 0;
  auto layout_of = [&](Transformer& m) {
    return hybrid ? m.FullKvLayoutFor(16) : m.KvLayoutFor(16);
  };
  auto pool_a = *KvBlockPool::Create(layout_of(*plain), 96, &plain_alloc, cpu);
  auto pool_b = *KvBlockPool::Create(layout_of(*recorded), 96, &recorded_alloc, graphs);
  std::unique_ptr<KvBlockPool> window_a, window_b;
  if (hybrid) {
    window_a = *KvBlockPool::Create(plain->WindowKvLayoutFor(16), 96, &plain_alloc, cpu);
    window_b = *KvBlockPool::Create(recorded->WindowKvLayoutFor(16), 96, &recorded_alloc, graphs);
  }
  const int kSequences = 6;
  std::vector<std::vector<TokenId>> tokens;
  std::vector<std::vector<BlockId>> blocks, window_blocks;
  for (int s = 0; s < kSequences; ++s) {
    tokens.push_back(Prompt(5 + 11 * s, 20 + s));  // the longest crosses 64 positions
    // Both pools hand out the same blocks: the same tables drive both models.
    blocks.push_back(*pool_a->Allocate(8));
    EXPECT_EQ(*pool_b->Allocate(8), blocks.back());
    if (hybrid) {
      window_blocks.push_back(*window_a->Allocate(8));
      EXPECT_EQ(*window_b->Allocate(8), window_blocks.back());
    }
  }
  auto step = [&](const std::vector<int>& members, bool prefill) {
    std::vector<ForwardSequence> batch;
    for (int s : members) {
      ForwardSequence f;
      const int64_t n = static_cast<int64_t>(tokens[s].size());
      f.tokens = prefill ? absl::MakeConstSpan(tokens[s]) : absl::MakeConstSpan(tokens[s]).last(1);
      f.start_position = prefill ? 0 : n - 1;
      f.blocks = blocks[s];
      if (hybrid) f.window_blocks = window_blocks[s];
      batch.push_back(f);
    }
    std::vector<float> a, b;
    CHECK_OK(plain->Forward(batch, *pool_a, &a, window_a.get()));
    CHECK_OK(recorded->Forward(batch, *pool_b, &b, window_b.get()));
    EXPECT_TRUE(SameBits(a, b)) << "members " << members.size() << " prefill " << prefill;
    for (size_t i = 0; i < members.size(); ++i) {
      const int64_t vocab = plain->config().vocab_size;
      const float* row = a.data() + i * vocab;
      tokens[members[i]].push_back(static_cast<TokenId>(std::max_element(row, row + vocab) - row));
    }
  };
  // Pools of the same bytes (never-written slots included), to compare them at the end.
  for (KvBlockPool* p : {pool_a.get(), pool_b.get(), window_a.get(), window_b.get()}) {
    if (p != nullptr) std::memset(p->region().address, 0, p->region().length);
  }
  step({0, 1, 2, 3, 4, 5}, /*prefill=*/true);
  // 6 rows (padded to 8), 3 (to 4), 5 (to 8), then 6 again: each shape runs, is recorded, then
  // replayed; the longest table grows from 4 blocks to 5 meanwhile (a capacity of 8: other
  // keys).
  const std::vector<std::vector<int>> shapes = {
      {0, 1, 2, 3, 4, 5}, {1, 3, 5}, {0, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}};
  for (int round = 0; round < 6; ++round) {
    for (const auto& members : shapes) step(members, false);
  }
  // The KV both wrote is the same bytes: the padding rows wrote nothing.
  auto same_pool = [](KvBlockPool& x, KvBlockPool& y) {
    return x.region().length == y.region().length &&
           std::memcmp(x.region().address, y.region().address, x.region().length) == 0;
  };
  EXPECT_TRUE(same_pool(*pool_a, *pool_b));
  if (hybrid) EXPECT_TRUE(same_pool(*window_a, *window_b));
  EXPECT_EQ(recorded->recorded_steps(), 24);
  EXPECT_EQ(plain->recorded_steps(), 0);
  for (int s = 0; s < kSequences; ++s) {
    CHECK_OK(pool_a->Release(blocks[s]));
    CHECK_OK(pool_b->Release(blocks[s]));
    if (hybrid) {
      CHECK_OK(window_a->Release(window_blocks[s]));
      CHECK_OK(window_b->Release(window_blocks[s]));
    }
  }
}

TEST(TransformerRecordedStepsTest, ReplayedDecodeStepsAreTheCpuBackendsBits) {
  for (const Variant& v :
       {Variants()[0], Variants()[3],
        Variant{"hybrid", false, false, false, 8, WeightDType::kF32, "bf16", 0, 2, false, 5}}) {
    std::unique_ptr<CpuBackend> cpu = *CpuBackend::Create({});
    GraphBackend graphs(cpu.get());
    DecodeBesideReference(v, &graphs, cpu.get());
    EXPECT_GE(graphs.stats().recorded, 3) << v.name;  // 8 and 4 rows, tables of 4 then 8
    EXPECT_GT(graphs.stats().replayed, 10) << v.name;
    EXPECT_EQ(graphs.stats().failed, 0) << v.name;  // nothing uncapturable was issued
  }
}

TEST(TransformerRecordedStepsTest, StepsNotRecordableRunAsTheyCome) {
  // Mixture-of-experts layers route on the host: never recorded, the same bits.
  std::unique_ptr<CpuBackend> cpu = *CpuBackend::Create({});
  GraphBackend graphs(cpu.get());
  const Variant moe = Variants()[5];
  ASSERT_GT(moe.experts, 0);
  const HostWeights weights = SyntheticModel(moe);
  auto model = *Transformer::Create(weights, &graphs);
  BackendKvAllocator alloc(&graphs);
  auto pool = *KvBlockPool::Create(model->KvLayoutFor(16), 16, &alloc, &graphs);
  const auto prompt = Prompt(20, 3);
  auto blocks = *pool->Allocate(2);
  std::vector<float> logits;
  CHECK_OK(model->Forward({{prompt, 0, blocks}}, *pool, &logits));
  CHECK_OK(model->Forward({{absl::MakeConstSpan(prompt).last(1), 19, blocks}}, *pool, &logits));
  EXPECT_EQ(model->recorded_steps(), 0);
  EXPECT_EQ(graphs.stats().run + graphs.stats().replayed + graphs.stats().recorded, 0);
  CHECK_OK(pool->Release(blocks));
}

}  // namespace
}  // namespace ferry
